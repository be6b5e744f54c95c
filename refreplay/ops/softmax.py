"""Softmax and log-softmax over the last axis (``spec/13-ops-attention.txt``).

The row kernels (``softmax_row`` ...) are shared with attention (a causal row
is a prefix of the score row) and cross-entropy, so all three give the same
bits for the same row.  Shapes: x [N, V] (any leading axes are flattened into
N); every row is independent, so results never depend on N.
"""
from __future__ import annotations

import numpy as np
from numba import prange

from .._jit import kernel, parallel_kernel
from ..linalg.common import NEG_INF, NEG_ZERO
from ..numerics.core import add, fmax, mul, recip, sub
from ..numerics.elementwise import exp_lane  # [num.exp.c1]
from ..numerics.transcendental import log


# ---- row kernels (first n entries of a row) --------------------------------------


@kernel
def row_max(x, n):
    """[softmax.fwd.c1] m = -inf, then m = fmax(m, x[j]) for j = 0 .. n-1
    ([red.rowmax.c1]; any order gives the same bits)."""
    m = NEG_INF
    for j in range(n):
        m = fmax(m, x[j])
    return m


@kernel
def softmax_row(x, n, y):
    """[softmax.fwd.c1] y[:n] = softmax(x[:n]) (y overwritten; may alias x).

        m = row_max(x, n)
        e[j] = exp(x[j] - m);  s = ((-0 + e[0]) + e[1]) + ... + e[n-1]
        r = recip(s) (once);   y[j] = e[j] * r
    """
    m = row_max(x, n)
    xr = x[:n]
    yr = y[:n]
    # The exponentials are independent: computed first, in SIMD lanes
    # (exp_lane has exp's bits), then summed in order.
    for j in range(n):
        yr[j] = exp_lane(sub(xr[j], m))
    s = NEG_ZERO
    for j in range(n):
        s = add(s, yr[j])
    r = recip(s)
    for j in range(n):
        yr[j] = mul(yr[j], r)


@kernel
def logsumexp_parts(x, n, e):
    """[softmax.log.c1] (m, log(s)) of the first n entries: m and s exactly as
    in softmax_row.  e [>= n] is scratch (overwritten with the exponentials,
    computed in SIMD lanes before the ordered sum; must not alias x)."""
    m = row_max(x, n)
    xr = x[:n]
    er = e[:n]
    for j in range(n):
        er[j] = exp_lane(sub(xr[j], m))
    s = NEG_ZERO
    for j in range(n):
        s = add(s, er[j])
    return m, log(s)


@kernel
def log_softmax_row(x, n, y):
    """[softmax.log.c1] y[j] = (x[j] - m) - log(s) (y overwritten)."""
    m, ls = logsumexp_parts(x, n, np.empty(n, np.float32))
    for j in range(n):
        y[j] = sub(sub(x[j], m), ls)


@kernel
def softmax_row_backward(dy, y, n, dx):
    """[softmax.bwd.c1] dx[:n] (overwritten) from dy, y = softmax output:
        d = ((-0 + dy[0]*y[0]) + dy[1]*y[1]) + ... + dy[n-1]*y[n-1]
        dx[j] = y[j] * (dy[j] - d)
    """
    d = NEG_ZERO
    for j in range(n):
        d = add(d, mul(dy[j], y[j]))
    for j in range(n):
        dx[j] = mul(y[j], sub(dy[j], d))


@kernel
def log_softmax_row_backward(dy, y, n, dx):
    """[softmax.log.bwd.c1] dx[:n] (overwritten) from dy, y = log-softmax output:
        g = ((-0 + dy[0]) + dy[1]) + ... + dy[n-1]
        dx[j] = dy[j] - exp(y[j]) * g
    """
    g = NEG_ZERO
    for j in range(n):
        g = add(g, dy[j])
    yr, dyr, dxr = y[:n], dy[:n], dx[:n]
    for j in range(n):
        dxr[j] = sub(dyr[j], mul(exp_lane(yr[j]), g))


# ---- whole-tensor kernels ---------------------------------------------------------


@parallel_kernel
def softmax_kernel(x, y):
    """x [N, V] -> y [N, V] (overwritten); one row per prange index."""
    for i in prange(x.shape[0]):
        softmax_row(x[i], x.shape[1], y[i])


@parallel_kernel
def log_softmax_kernel(x, y):
    """x [N, V] -> y [N, V] (overwritten)."""
    for i in prange(x.shape[0]):
        log_softmax_row(x[i], x.shape[1], y[i])


@parallel_kernel
def softmax_backward_kernel(dy, y, dx):
    """dy, y [N, V] -> dx [N, V] (overwritten)."""
    for i in prange(y.shape[0]):
        softmax_row_backward(dy[i], y[i], y.shape[1], dx[i])


@parallel_kernel
def log_softmax_backward_kernel(dy, y, dx):
    """dy, y [N, V] -> dx [N, V] (overwritten)."""
    for i in prange(y.shape[0]):
        log_softmax_row_backward(dy[i], y[i], y.shape[1], dx[i])


# ---- public API ---------------------------------------------------------------------


def _rows(name, a):
    if not isinstance(a, np.ndarray) or a.dtype != np.float32:
        raise TypeError(f"{name} must be a float32 ndarray")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous")
    if a.ndim < 1 or a.shape[-1] < 1:
        raise ValueError(f"{name} needs a non-empty last axis, got shape {a.shape}")
    return a.reshape(-1, a.shape[-1])


def _apply(fn, *arrays):
    names = ("dy", "y") if len(arrays) == 2 else ("x",)
    rows = [_rows(n, a) for n, a in zip(names, arrays)]
    if any(a.shape != arrays[0].shape for a in arrays):
        raise ValueError(f"shapes differ: {[a.shape for a in arrays]}")
    out = np.empty_like(rows[0])
    fn(*rows, out)
    return out.reshape(arrays[0].shape)


def softmax_forward(x):
    """[softmax.fwd.c1] Softmax over the last axis; a new array of x's shape."""
    return _apply(softmax_kernel, x)


def softmax_backward(dy, y):
    """[softmax.bwd.c1] dx from dy and the forward output y."""
    return _apply(softmax_backward_kernel, dy, y)


def log_softmax_forward(x):
    """[softmax.log.c1] Log-softmax over the last axis."""
    return _apply(log_softmax_kernel, x)


def log_softmax_backward(dy, y):
    """[softmax.log.bwd.c1] dx from dy and the forward output y."""
    return _apply(log_softmax_backward_kernel, dy, y)
