"""Softmax and log-softmax over the last axis (``spec/13-ops-attention.txt``).

The row kernels (``softmax_row``, ``softmax_row_backward``) serve attention,
whose causal rows are prefixes of the score row.  The whole-tensor kernels
and cross-entropy take blocks of RB rows and run the rows' sums side by side
in SIMD lanes, CB columns at a time (``rowblock.py``); every lane does the row kernel's operations
in the row kernel's order, so all give the same bits for the same row
(``tests/test_fast_paths.py``).  Shapes: x [N, V] (any leading axes are
flattened into N); every row is independent, so results never depend on N.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .._jit import kernel, parallel_kernel
from ..linalg.common import NEG_ZERO
from ..numerics._bits import bits_f32, f32_bits
from ..numerics.core import CANONICAL_NAN_BITS, flush, mul, recip, sub
from ..numerics.elementwise import add_flush, exp_lane, mul_flush  # [num.exp.c1]
from ..numerics.transcendental import log
from .rowblock import CB, RB, lane_dot_into, lane_sum_into, load_chunk, n_blocks, new_tile, store_chunk


# ---- row kernels (first n entries of a row) --------------------------------------


# [red.rowmax.c1] fmax picks the largest element of a total order (NaN above
# everything, -0 below +0) and flushes it; flushing keeps that order (a
# subnormal goes to the zero of its sign, which sits next to it), so the
# flushed maximum of the whole row is every chain's result.  Ordering keys:
# the bits of a float as int32, with the 31 magnitude bits inverted where
# the sign bit is set, follow the order for every non-NaN float (-inf lowest,
# -0 just below +0, +inf highest); the inversion is its own inverse.  A NaN
# is noted apart (a magnitude above +inf's).  Integer maxima vectorise for
# any n, where fmax's branches left a scalar tail: attention's causal rows
# took 1.3 ns an element with fmax, 0.36 with the keys (Intel Xeon, AVX-512);
# long rows are bound by memory either way.
KEY_NEG_INF = np.int32(-2139095041)  # order_key(-inf): 0xFF800000 ^ 0x7FFFFFFF
MAGNITUDE = np.uint32(0x7FFFFFFF)
INF_MAGNITUDE = np.int32(0x7F800000)


@kernel(inline="always")
def order_key(b):
    """int32 ordering key of the float32 bits ``b`` (also key -> bits)."""
    i = np.int32(b)
    return np.int32(i ^ ((i >> np.int32(31)) & np.int32(0x7FFFFFFF)))  # int32 lanes, not Numba's int64


@kernel
def row_max(x, n):
    """[softmax.fwd.c1] m = -inf, then m = fmax(m, x[j]) for j = 0 .. n-1
    ([red.rowmax.c1]).  fmax is associative and commutative there, so every
    order gives the same bits: the largest ordering key, flushed, or the
    canonical NaN if the row has a NaN (the keys above)."""
    key = KEY_NEG_INF
    mag = np.int32(0)  # largest magnitude bits: above +inf's exactly when a NaN is there
    for j in range(n):
        b = f32_bits(x[j])
        key = np.int32(max(key, order_key(b)))
        mag = np.int32(max(mag, np.int32(b & MAGNITUDE)))
    if mag > INF_MAGNITUDE:
        return bits_f32(CANONICAL_NAN_BITS)
    return flush(bits_f32(np.uint32(order_key(np.uint32(key)))))


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
    # The sum leaves out the NaN test (add_flush): recip canonicalises its
    # end ([num.nan.c1]), and each step of the chain is shorter.
    s = NEG_ZERO
    for j in range(n):
        s = add_flush(s, yr[j])
    r = recip(s)
    for j in range(n):
        yr[j] = mul(yr[j], r)


@kernel
def softmax_row_backward(dy, y, n, dx):
    """[softmax.bwd.c1] dx[:n] (overwritten) from dy, y = softmax output:
    d = ((-0 + dy[0]*y[0]) + dy[1]*y[1]) + ... + dy[n-1]*y[n-1]
    dx[j] = y[j] * (dy[j] - d)
    """
    d = NEG_ZERO
    for j in range(n):  # NaN canonicalised by the sub below ([num.nan.c1])
        d = add_flush(d, mul_flush(dy[j], y[j]))
    for j in range(n):
        dx[j] = mul(y[j], sub(dy[j], d))


@kernel
def softmax_rows_causal(x, n0, y):
    """[softmax.fwd.c1] y[r, :n0+r] = softmax(x[r, :n0+r]) for r < y.shape[0]
    <= RB (the causal rows of attention: each one entry longer than the last;
    y overwritten there, x not changed).  Row r gets the bits of
    softmax_row(x[r], n0 + r, y[r]): the same steps, but the rows' sums run
    side by side in the lanes of a chunk tile (rowblock.py) over j < n0,
    then each row adds its last r entries."""
    rows = y.shape[0]
    for r in range(rows):
        n = n0 + r
        xr = x[r, :n]
        yr = y[r, :n]
        m = row_max(xr, n)
        for j in range(n):
            yr[j] = exp_lane(sub(xr[j], m))
    T = new_tile()
    s = np.full(RB, NEG_ZERO, np.float32)  # no NaN test in the sums: see softmax_row
    for c0 in range(0, n0, CB):
        Tc = T[: min(CB, n0 - c0)]
        load_chunk(y, 0, rows, c0, Tc)
        lane_sum_into(Tc, s)
    for r in range(rows):
        yr = y[r]
        sr = s[r]
        for j in range(n0, n0 + r):
            sr = add_flush(sr, yr[j])
        rs = recip(sr)
        for j in range(n0 + r):
            yr[j] = mul(yr[j], rs)


@kernel
def softmax_rows_causal_backward(dy, y, n0, dx):
    """[softmax.bwd.c1] dx[r, :n0+r] (overwritten) from dy and y = softmax
    output, for r < dx.shape[0] <= RB: the bits of softmax_row_backward(dy[r],
    y[r], n0 + r, dx[r]), the rows' sums d side by side in tile lanes over
    j < n0 (the terms dy*y formed in the lanes, rowblock.lane_dot_into)."""
    rows = dx.shape[0]
    T, U = new_tile(), new_tile()
    d = np.full(RB, NEG_ZERO, np.float32)  # NaN canonicalised by the sub below ([num.nan.c1])
    for c0 in range(0, n0, CB):
        w = min(CB, n0 - c0)
        lane_dot_into(dy, y, 0, rows, c0, T[:w], U[:w], d)
    for r in range(rows):
        dyr, yr, dxr = dy[r], y[r], dx[r]
        dr = d[r]
        for j in range(n0, n0 + r):
            dr = add_flush(dr, mul_flush(dyr[j], yr[j]))
        for j in range(n0 + r):
            dxr[j] = mul(yr[j], sub(dyr[j], dr))


# ---- row blocks: RB rows' sums side by side (rowblock.py) -------------------------
# A block's rows are walked in chunks of CB columns through one [CB, RB] tile
# (T, from rowblock.new_tile) that stays in the L1 cache; every lane's sum
# goes on from chunk to chunk, so each row's chain keeps its order.  Row
# maxima need no tile: their order is free ([red.rowmax.c1]).


@kernel
def block_max(x, i0, rows):
    """[softmax.fwd.c1] m [RB]: lane r the row maximum of row i0 + r of x
    [N, V] (row_max along the row), +0 in the lanes r >= rows."""
    m = np.zeros(RB, np.float32)
    for r in range(rows):
        m[r] = row_max(x[i0 + r], x.shape[1])
    return m


@kernel
def exp_sum_block(x, i0, rows, m, T, y, store):
    """[softmax.fwd.c1] s [RB] for rows i0 .. i0+rows-1 of x [N, V], lane r:
    e[j] = exp(x[j] - m[r]) and s = ((-0 + e[0]) + e[1]) + ... + e[V-1], the
    steps of softmax_row on row i0 + r.  With ``store``, y[i0 + r, j] = e[j]
    (y [N, V] overwritten there)."""
    V = x.shape[1]
    s = np.full(RB, NEG_ZERO, np.float32)
    for c0 in range(0, V, CB):
        Tc = T[: min(CB, V - c0)]
        load_chunk(x, i0, rows, c0, Tc)
        for j in range(Tc.shape[0]):
            e = Tc[j]
            for r in range(RB):
                e[r] = exp_lane(sub(e[r], m[r]))
        lane_sum_into(Tc, s)
        if store:
            store_chunk(Tc, y, i0, rows, c0)
    return s


@kernel
def softmax_block(x, i0, rows, y):
    """[softmax.fwd.c1] y[i0 + r] = softmax(x[i0 + r]) for r < rows
    (overwritten): y[j] = e[j] * recip(s), recip once per row."""
    T = new_tile()
    s = exp_sum_block(x, i0, rows, block_max(x, i0, rows), T, y, True)
    for r in range(rows):
        y_r, rs = y[i0 + r], recip(s[r])
        for j in range(y_r.shape[0]):
            y_r[j] = mul(y_r[j], rs)


@kernel
def logsumexp_block(x, i0, rows):
    """[softmax.log.c1] (m, l) [RB] for rows i0 .. i0+rows-1 of x: m and s as
    in exp_sum_block, l = log(s) once per row (lanes r >= rows: unused)."""
    T = new_tile()
    m = block_max(x, i0, rows)
    s = exp_sum_block(x, i0, rows, m, T, x, False)
    ls = np.empty(RB, np.float32)
    for r in range(RB):
        ls[r] = log(s[r])
    return m, ls


# ---- whole-tensor kernels: threads take blocks of RB rows -------------------------


@parallel_kernel
def softmax_kernel(x, y):
    """[softmax.fwd.c1] x [N, V] -> y [N, V] (overwritten)."""
    N = x.shape[0]
    for b in prange(n_blocks(N)):
        i0 = b * RB
        softmax_block(x, i0, min(RB, N - i0), y)


@parallel_kernel
def log_softmax_kernel(x, y):
    """[softmax.log.c1] x [N, V] -> y [N, V] (overwritten): y[j] = (x[j] - m) - l."""
    N, V = x.shape
    for b in prange(n_blocks(N)):
        i0 = b * RB
        rows = min(RB, N - i0)
        m, ls = logsumexp_block(x, i0, rows)
        for r in range(rows):
            x_r, y_r, m_r, l_r = x[i0 + r], y[i0 + r], m[r], ls[r]
            for j in range(V):
                y_r[j] = sub(sub(x_r[j], m_r), l_r)


@parallel_kernel
def softmax_backward_kernel(dy, y, dx):
    """[softmax.bwd.c1] dy, y [N, V] -> dx [N, V] (overwritten):
        d = ((-0 + dy[0]*y[0]) + dy[1]*y[1]) + ... + dy[V-1]*y[V-1]
        dx[j] = y[j] * (dy[j] - d)
    The terms dy[j]*y[j] are formed in the lanes (rowblock.lane_dot_into)."""
    N, V = y.shape
    for b in prange(n_blocks(N)):
        i0 = b * RB
        rows = min(RB, N - i0)
        T, U = new_tile(), new_tile()
        d = np.full(RB, NEG_ZERO, np.float32)  # NaN canonicalised by the sub below ([num.nan.c1])
        for c0 in range(0, V, CB):
            w = min(CB, V - c0)
            lane_dot_into(dy, y, i0, rows, c0, T[:w], U[:w], d)
        for r in range(rows):
            dy_r, y_r, dx_r, d_r = dy[i0 + r], y[i0 + r], dx[i0 + r], d[r]
            for j in range(V):
                dx_r[j] = mul(y_r[j], sub(dy_r[j], d_r))


@parallel_kernel
def log_softmax_backward_kernel(dy, y, dx):
    """[softmax.log.bwd.c1] dy, y [N, V] -> dx [N, V] (overwritten):
    g = ((-0 + dy[0]) + dy[1]) + ... + dy[V-1]
    dx[j] = dy[j] - exp(y[j]) * g          (exp in lanes, exp_lane)
    """
    N, V = y.shape
    for b in prange(n_blocks(N)):
        i0 = b * RB
        rows = min(RB, N - i0)
        T = new_tile()
        g = np.full(RB, NEG_ZERO, np.float32)
        for c0 in range(0, V, CB):
            Tc = T[: min(CB, V - c0)]
            load_chunk(dy, i0, rows, c0, Tc)
            lane_sum_into(Tc, g)
        for r in range(rows):
            dy_r, y_r, dx_r, g_r = dy[i0 + r], y[i0 + r], dx[i0 + r], g[r]
            for j in range(V):
                dx_r[j] = sub(dy_r[j], mul(exp_lane(y_r[j]), g_r))


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
