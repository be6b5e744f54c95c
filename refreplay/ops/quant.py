"""int8 quantization-aware linear layer (``spec/16-quant.txt``).

LSQ-style fake quantization with step sizes that are *not* learned: every
forward re-pins them from the tensor itself ([quant.step.c1]), the OPEN-1B cure
for step-size drift.  Weights are quantized per output channel (one step per
row of ``w``), activations per sequence (one step per ``b``; a sequence's
activations are its own tensor, which keeps the layer batch invariant,
[quant.granularity.c1]).

The forward product is int8 x int8 -> int32, exact ([quant.linear.fwd.c1]);
the backward runs entirely in float32 on the dequantized operands with the
straight-through estimator ([quant.linear.bwd.c1]).  Gradients are never
quantized, so an exact zero gradient stays an exact zero ([quant.zerograd.c1]).

Shapes (spec letters): x [B, T, C], w [OC, C], b [OC], y [B, T, OC];
inside kernels N = B*T rows and K = C.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .._jit import kernel, parallel_kernel
from ..linalg import I8_MAX_K, col_sum, matmul, matmul_i8, matmul_tn
from ..numerics.core import F32, ZERO, FLT_MIN, fmax, mul, recip, rint, saturate_i8, add

QMAX = F32(127.0)
QMIN = F32(-128.0)
# [quant.step.c1] recip(127) = f32(0x3C010204), computed once, here.
RECIP_QMAX = F32(recip(QMAX))
# [quant.step.c1] the floor that keeps a step size non-zero: 2^-126.
STEP_FLOOR = FLT_MIN
# [quant.linear.fwd.c1] the int32 accumulator bound of [mm.i8.c2].
MAX_K = I8_MAX_K


# ---- step sizes ---------------------------------------------------------------


@kernel
def absmax(x):
    """[quant.step.c1] max |x[i]| over a 1-D float32 array: a = +0, then
    a = fmax(a, |x[i]|) for i = 0, 1, ... (NaN propagates)."""
    a = ZERO
    for i in range(x.size):
        a = fmax(a, abs(x[i]))
    return a


@kernel
def step_from_absmax(a):
    """[quant.step.c1] s = a * recip(127); a zero result (all-zero tensor, or
    a product that flushed) becomes STEP_FLOOR.  NaN and +inf pass."""
    s = mul(a, RECIP_QMAX)
    return STEP_FLOOR if s == ZERO else s


@parallel_kernel
def step_rows_kernel(x, s):
    """x [R, K] -> s [R] (overwritten): one re-pinned step per row."""
    for r in prange(x.shape[0]):
        s[r] = step_from_absmax(absmax(x[r]))


# ---- quantize / dequantize ----------------------------------------------------


@kernel
def quantize_value(x, r):
    """[quant.quantize.c1] saturate_i8(rint(x * r)), r = recip(s)."""
    return saturate_i8(rint(mul(x, r)))


@parallel_kernel
def quantize_rows_kernel(x, s, q):
    """x [R, K] float32, s [R] -> q [R, K] int8 (overwritten).  recip(s[r]) is
    computed once per row."""
    for row in prange(x.shape[0]):
        r = recip(s[row])
        for k in range(x.shape[1]):
            q[row, k] = quantize_value(x[row, k], r)


@parallel_kernel
def dequantize_rows_kernel(q, s, out):
    """[quant.dequantize.c1] q [R, K] int8, s [R] -> out [R, K] = f32(q) * s[r]
    (overwritten; the int8 -> float32 conversion is exact)."""
    for row in prange(q.shape[0]):
        for k in range(q.shape[1]):
            out[row, k] = mul(F32(q[row, k]), s[row])


@parallel_kernel
def ste_mask_rows_kernel(x, s, g):
    """[quant.ste.c1] g [R, K] (modified in place): g[r, k] becomes +0 where
    the code of x[r, k] saturates, i.e. rint(x[r, k] * recip(s[r])) lies
    outside [-128, 127] or is NaN; elsewhere g passes unchanged."""
    for row in prange(x.shape[0]):
        r = recip(s[row])
        for k in range(x.shape[1]):
            v = rint(mul(x[row, k], r))
            if not (v >= QMIN and v <= QMAX):
                g[row, k] = ZERO


# ---- int8 linear ---------------------------------------------------------------


@parallel_kernel
def rescale_kernel(acc, sx, sw, bias, has_bias, T, y):
    """[quant.linear.fwd.c1] acc [N, OC] int32 (N = B*T), sx [B], sw [OC],
    bias [OC] -> y [N, OC] (overwritten), for row n of sequence b = n // T:
        y[n, o] = f32(acc[n, o]) * (sx[b] * sw[o])   (+ bias[o] when has_bias)
    f32() of an int32 rounds to nearest-even (exact for |acc| <= 2^24)."""
    for n in prange(acc.shape[0]):
        b = n // T
        for o in range(acc.shape[1]):
            v = mul(F32(acc[n, o]), mul(sx[b], sw[o]))
            y[n, o] = add(v, bias[o]) if has_bias else v


# ---- public API ------------------------------------------------------------------


def _f32(name, a, ndim=None):
    if not isinstance(a, np.ndarray) or a.dtype != np.float32:
        raise TypeError(f"{name} must be a float32 ndarray")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous")
    if ndim is not None and a.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {a.shape}")
    return a


def step_size(x) -> np.float32:
    """[quant.step.c1] The re-pinned step size of a whole tensor (any shape)."""
    _f32("x", x)
    return F32(step_from_absmax(F32(absmax(x.reshape(-1)))))  # binary32 in, as the kernels do


def step_size_rows(x) -> np.ndarray:
    """[quant.step.c1] One re-pinned step per row: x [R, K] -> s [R]."""
    _f32("x", x, 2)
    s = np.empty(x.shape[0], np.float32)
    step_rows_kernel(x, s)
    return s


def _rows_and_steps(x, s):
    s = np.asarray(s)
    if s.dtype != np.float32:
        raise TypeError("s must be float32")
    if s.ndim == 0:
        return x.reshape(1, -1), np.ascontiguousarray(s.reshape(1))
    if s.ndim != 1 or x.ndim < 1 or x.shape[0] != s.shape[0]:
        raise ValueError(f"s of shape {s.shape} does not match x of shape {x.shape}")
    return x.reshape(x.shape[0], -1), np.ascontiguousarray(s)


def quantize(x, s) -> np.ndarray:
    """[quant.quantize.c1] int8 codes of x with step s: a scalar (per tensor)
    or s [R] with one step per index of x's first axis."""
    _f32("x", x)
    x2, s1 = _rows_and_steps(x, s)
    q = np.empty(x2.shape, np.int8)
    quantize_rows_kernel(x2, s1, q)
    return q.reshape(x.shape)


def dequantize(q, s) -> np.ndarray:
    """[quant.dequantize.c1] float32 values f32(q) * s (s scalar or per first-axis index)."""
    if not isinstance(q, np.ndarray) or q.dtype != np.int8 or not q.flags.c_contiguous:
        raise TypeError("q must be a C-contiguous int8 ndarray")
    q2, s1 = _rows_and_steps(q, s)
    out = np.empty(q2.shape, np.float32)
    dequantize_rows_kernel(q2, s1, out)
    return out.reshape(q.shape)


def fake_quantize(x, s) -> np.ndarray:
    """[quant.quantize.c1] [quant.dequantize.c1] dequantize(quantize(x, s), s)."""
    return dequantize(quantize(x, s), s)


def fake_quantize_backward(dy, x, s) -> np.ndarray:
    """[quant.ste.c1] Straight-through gradient of ``fake_quantize(x, s)``:
    dy where x's code is not saturated, +0 where it is (a new array)."""
    _f32("dy", dy)
    _f32("x", x)
    if dy.shape != x.shape:
        raise ValueError(f"dy has shape {dy.shape}, x has {x.shape}")
    x2, s1 = _rows_and_steps(x, s)
    dx = dy.copy()
    ste_mask_rows_kernel(x2, s1, dx.reshape(x2.shape))
    return dx


def _check_linear(x, w, b):
    _f32("x", x, 3)
    _f32("w", w, 2)
    B, T, C = x.shape
    OC = w.shape[0]
    if w.shape[1] != C:
        raise ValueError(f"w has shape {w.shape}, expected (OC, {C})")
    if C > MAX_K:
        raise ValueError(f"C = {C} exceeds {MAX_K}: the int32 accumulator could overflow")
    if b is not None:
        _f32("b", b, 1)
        if b.shape[0] != OC:
            raise ValueError(f"b has shape {b.shape}, expected ({OC},)")
    return B, T, C, OC


def _quantized_operands(x, w):
    """Re-pinned steps and int8 codes of both operands ([quant.granularity.c1])."""
    B, T, C = x.shape
    x_rows = x.reshape(B, T * C)
    sx = step_size_rows(x_rows)  # one step per sequence
    sw = step_size_rows(w)  # one step per output channel
    qx = quantize(x, sx).reshape(B * T, C)
    qw = quantize(w, sw)
    return sx, sw, qx, qw


def qlinear_forward(x, w, b=None) -> np.ndarray:
    """[quant.linear.fwd.c1] y = dequant(acc) (+ b), acc = qx . qw^T in int32.

    x [B, T, C], w [OC, C], b [OC] or None -> y [B, T, OC] (new array).
    """
    B, T, C, OC = _check_linear(x, w, b)
    sx, sw, qx, qw = _quantized_operands(x, w)
    acc = matmul_i8(qx, np.ascontiguousarray(qw.T))  # [B*T, OC] int32, exact
    y = np.empty((B * T, OC), np.float32)
    bias = b if b is not None else np.zeros(OC, np.float32)
    rescale_kernel(acc, sx, sw, bias, b is not None, T, y)
    return y.reshape(B, T, OC)


def qlinear_backward(dy, x, w, has_bias=True):
    """[quant.linear.bwd.c1] Straight-through estimator, all in float32.

    dy [B, T, OC], x [B, T, C], w [OC, C] -> (dx [B, T, C], dw [OC, C],
    db [OC] or None), all new arrays:
        xd = dequantize(qx, sx), wd = dequantize(qw, sw)   (re-pinned again)
        dx = dy . wd   (linalg.matmul, sum over o increasing), masked by STE on x
        dw = dy^T . xd (linalg.matmul_tn, sum over n = b*T + t increasing), masked on w
        db = col_sum(dy) (sum over n increasing)
    """
    B, T, C, OC = _check_linear(x, w, None)
    _f32("dy", dy, 3)
    if dy.shape != (B, T, OC):
        raise ValueError(f"dy has shape {dy.shape}, expected {(B, T, OC)}")
    sx, sw, qx, qw = _quantized_operands(x, w)
    xd = dequantize(qx.reshape(B, T * C), sx).reshape(B * T, C)
    wd = dequantize(qw, sw)
    dy2 = dy.reshape(B * T, OC)
    dx = matmul(dy2, wd)  # [B*T, C]
    dw = matmul_tn(dy2, xd)  # [OC, C]
    ste_mask_rows_kernel(x.reshape(B, T * C), sx, dx.reshape(B, T * C))
    ste_mask_rows_kernel(w, sw, dw)
    db = col_sum(dy2) if has_bias else None
    return dx.reshape(B, T, C), dw, db
