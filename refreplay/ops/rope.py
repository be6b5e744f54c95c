"""Rotary position embedding, half-split form (``spec/13-ops-attention.txt``).

Channel i of a head is rotated together with channel i + HS/2 (the GPT-NeoX /
Llama layout), by the angle t * inv_freq[i] at position t.

Shapes (spec letters): x, out [B, NH, T, HS]; tables cos, sin [T, HS/2].
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .._jit import kernel, parallel_kernel
from ..numerics.core import F32, add, mul, recip, sub
from ..numerics.transcendental import cos, exp, log, sin


# [rope.freq.c1] angles t * inv_freq[i] <= t must stay in the domain |x| <= 2^14
# of the spec's sin and cos ([num.sincos.c1]).
MAX_T = 2**14 + 1


@kernel
def inv_freq(i, HS, log_theta):
    """[rope.freq.c1] theta^(-2i/HS) = exp(-((f32(2i) * recip(f32(HS))) * log(theta)))."""
    return exp(-mul(mul(F32(2 * i), recip(F32(HS))), log_theta))


@parallel_kernel
def rope_tables_kernel(theta, HS, cos_t, sin_t):
    """cos_t, sin_t [T, HS/2] (overwritten): angle = f32(t) * inv_freq[i];
    cos_t[t, i] = cos(angle), sin_t[t, i] = sin(angle)."""
    log_theta = log(theta)
    T, H2 = cos_t.shape
    for t in prange(T):
        for i in range(H2):
            angle = mul(F32(t), inv_freq(i, HS, log_theta))
            cos_t[t, i] = cos(angle)
            sin_t[t, i] = sin(angle)


@parallel_kernel
def rope_forward_kernel(x, cos_t, sin_t, out):
    """[rope.fwd.c1] x [B, NH, T, HS] -> out (overwritten; may not alias x):
    out[i]      = x[i]*c - x[i+H2]*s
    out[i + H2] = x[i+H2]*c + x[i]*s        (c, s = cos_t[t, i], sin_t[t, i])
    """
    B, NH, T, HS = x.shape
    H2 = HS // 2
    for bht in prange(B * NH * T):
        b = bht // (NH * T)
        h = (bht // T) % NH
        t = bht % T
        x_t, out_t = x[b, h, t], out[b, h, t]
        for i in range(H2):
            c = cos_t[t, i]
            s = sin_t[t, i]
            x1 = x_t[i]
            x2 = x_t[i + H2]
            out_t[i] = sub(mul(x1, c), mul(x2, s))
            out_t[i + H2] = add(mul(x2, c), mul(x1, s))


@parallel_kernel
def rope_backward_kernel(dout, cos_t, sin_t, dx):
    """[rope.bwd.c1] The transposed (inverse) rotation, dx overwritten:
    dx[i]      = dout[i]*c + dout[i+H2]*s
    dx[i + H2] = dout[i+H2]*c - dout[i]*s
    """
    B, NH, T, HS = dout.shape
    H2 = HS // 2
    for bht in prange(B * NH * T):
        b = bht // (NH * T)
        h = (bht // T) % NH
        t = bht % T
        d_t, dx_t = dout[b, h, t], dx[b, h, t]
        for i in range(H2):
            c = cos_t[t, i]
            s = sin_t[t, i]
            d1 = d_t[i]
            d2 = d_t[i + H2]
            dx_t[i] = add(mul(d1, c), mul(d2, s))
            dx_t[i + H2] = sub(mul(d2, c), mul(d1, s))


# ---- public API ----------------------------------------------------------------


def rope_tables(T: int, HS: int, theta=np.float32(10000.0)):
    """[rope.freq.c1] (cos [T, HS/2], sin [T, HS/2]) for positions 0 .. T-1."""
    if not (isinstance(T, (int, np.integer)) and isinstance(HS, (int, np.integer))):
        raise TypeError("T and HS must be integers")
    if T < 1 or T > MAX_T or HS < 2 or HS % 2:
        raise ValueError(f"need 1 <= T <= {MAX_T} and an even HS >= 2, got T={T}, HS={HS}")
    theta = np.float32(theta)
    if not (theta > 1 and np.isfinite(theta)):
        raise ValueError(f"theta must be a finite float32 > 1, got {theta}")
    cos_t = np.empty((T, HS // 2), np.float32)
    sin_t = np.empty((T, HS // 2), np.float32)
    rope_tables_kernel(theta, int(HS), cos_t, sin_t)
    return cos_t, sin_t


def _check(name, x, cos_t, sin_t):
    if not isinstance(x, np.ndarray) or x.dtype != np.float32:
        raise TypeError(f"{name} must be a float32 ndarray")
    if not x.flags.c_contiguous or x.ndim != 4:
        raise ValueError(f"{name} must be a C-contiguous [B, NH, T, HS] array, got {x.shape}")
    T, HS = x.shape[2], x.shape[3]
    for tname, tab in (("cos", cos_t), ("sin", sin_t)):
        if not isinstance(tab, np.ndarray) or tab.dtype != np.float32 or not tab.flags.c_contiguous:
            raise TypeError(f"{tname} table must be a C-contiguous float32 ndarray")
        if HS % 2 or tab.ndim != 2 or tab.shape[0] < T or tab.shape[1] != HS // 2:
            raise ValueError(f"{tname} table of shape {tab.shape} does not fit {name} of shape {x.shape}")


def rope_forward(x, cos_t, sin_t):
    """[rope.fwd.c1] Rotate x [B, NH, T, HS]; tables from ``rope_tables``
    (at least T rows).  Returns a new array."""
    _check("x", x, cos_t, sin_t)
    out = np.empty_like(x)
    rope_forward_kernel(x, cos_t, sin_t, out)
    return out


def rope_backward(dout, cos_t, sin_t):
    """[rope.bwd.c1] dx from dout [B, NH, T, HS]; a new array."""
    _check("dout", dout, cos_t, sin_t)
    dx = np.empty_like(dout)
    rope_backward_kernel(dout, cos_t, sin_t, dx)
    return dx
