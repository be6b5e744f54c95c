"""int8 quantization-aware linear layer (spec chapter 16), as ``refreplay.ops.quant``."""

from __future__ import annotations

import numpy as np
from numba import cuda

from ...ops import quant as Q
from ... import arrays as K
from .._common import THREADS, _dev, _each, _f32, _ret, blocks, device_aware, is_device
from ..linalg import I8_MAX_K, col_sum, matmul, matmul_i8, matmul_tn


def _qrows(x, s):
    """x as rows with one step per row: s scalar (one row) or s [R] (R = x.shape[0])."""
    s = s if is_device(s) else np.asarray(s)
    if s.dtype != np.float32:
        raise TypeError("s must be float32")
    if s.ndim == 0:
        return x.reshape(1, -1), s.reshape(1)
    if s.ndim != 1 or x.ndim < 1 or x.shape[0] != s.shape[0]:
        raise ValueError(f"s of shape {s.shape} does not match x of shape {x.shape}")
    return x.reshape(x.shape[0], -1), s if is_device(s) else np.ascontiguousarray(s)


@device_aware
def step_size_rows(x):
    """[quant.step.c1] One re-pinned step per row: x [R, K] -> s [R]."""
    _f32("x", x, 2)
    s = cuda.device_array(x.shape[0], np.float32)
    _each(Q.step_rows_k, x.shape[0], _dev(x), s)
    return _ret(s)


def step_size(x):
    """[quant.step.c1] The re-pinned step size of a whole tensor (any shape), on the host."""
    _f32("x", x)
    s = step_size_rows(x.reshape(1, -1))
    return (s.copy_to_host() if is_device(s) else s)[0]


@device_aware
def quantize(x, s):
    """[quant.quantize.c1] int8 codes of x with step s (scalar, or one per first-axis index)."""
    _f32("x", x)
    x2, s1 = _qrows(x, s)
    q = cuda.device_array(x2.shape, np.int8)
    _each(Q.quantize_rows_k, x2.size, _dev(x2), _dev(s1), q)
    return _ret(q).reshape(x.shape)


@device_aware
def dequantize(q, s):
    """[quant.dequantize.c1] f32(q) * s (s scalar or per first-axis index)."""
    if is_device(q):
        if q.dtype != np.int8 or not q.is_c_contiguous():
            raise TypeError("q must be a C-contiguous int8 ndarray")
    elif not isinstance(q, np.ndarray) or q.dtype != np.int8 or not q.flags.c_contiguous:
        raise TypeError("q must be a C-contiguous int8 ndarray")
    q2, s1 = _qrows(q, s)
    out = cuda.device_array(q2.shape, np.float32)
    _each(Q.dequantize_rows_k, q2.size, _dev(q2), _dev(s1), out)
    return _ret(out).reshape(q.shape)


def fake_quantize(x, s):
    """[quant.quantize.c1] [quant.dequantize.c1] dequantize(quantize(x, s), s)."""
    return dequantize(quantize(x, s), s)


def _ste(x2, s1, g2):
    """[quant.ste.c1] g2 (rows like x2) with saturated codes' gradients set to +0, on the host."""
    if is_device(g2):  # masked in place: a copy, never the caller's array
        d_g = cuda.device_array(g2.shape, np.float32)
        d_g.copy_to_device(g2)
    else:
        d_g = cuda.to_device(g2)
    _each(Q.ste_mask_rows_k, x2.size, _dev(x2), _dev(s1), d_g)
    return _ret(d_g)


@device_aware
def fake_quantize_backward(dy, x, s):
    """[quant.ste.c1] dy where x's code is not saturated, +0 where it is."""
    _f32("dy", dy), _f32("x", x)
    if dy.shape != x.shape:
        raise ValueError(f"dy has shape {dy.shape}, x has {x.shape}")
    x2, s1 = _qrows(x, s)
    return _ste(x2, s1, dy.reshape(x2.shape)).reshape(dy.shape)


def _qlinear_check(x, w, b):
    _f32("x", x, 3), _f32("w", w, 2)
    B, T, C = x.shape
    OC = w.shape[0]
    if w.shape[1] != C:
        raise ValueError(f"w has shape {w.shape}, expected (OC, {C})")
    if C > I8_MAX_K:
        raise ValueError(f"C = {C} exceeds {I8_MAX_K}: the int32 accumulator could overflow")
    if b is not None:
        _f32("b", b, 1)
        if b.shape[0] != OC:
            raise ValueError(f"b has shape {b.shape}, expected ({OC},)")
    return B, T, C, OC


def _qoperands(x, w):
    """[quant.granularity.c1] steps per sequence and per output channel, and the codes."""
    B, T, C = x.shape
    sx = step_size_rows(x.reshape(B, T * C))
    sw = step_size_rows(w)
    return sx, sw, quantize(x, sx).reshape(B * T, C), quantize(w, sw)


def _transposed(q):
    """The int8 codes q [OC, C] as [C, OC] (an exact copy)."""
    if not is_device(q):
        return np.ascontiguousarray(q.T)
    out = cuda.device_array((q.shape[1], q.shape[0]), np.int8)
    if q.size:
        K.transpose_i8_k[blocks(q.size), THREADS](q, out)
    return out


@device_aware
def qlinear_forward(x, w, b=None):
    """[quant.linear.fwd.c1] x [B, T, C], w [OC, C], b [OC] or None -> y [B, T, OC]."""
    B, T, C, OC = _qlinear_check(x, w, b)
    sx, sw, qx, qw = _qoperands(x, w)
    acc = matmul_i8(qx, _transposed(qw))  # [mm.i8.c1], exact
    y = cuda.device_array((B * T, OC), np.float32)
    bias = b if b is not None else sw  # any float32 [OC]: read only when has_bias
    _each(Q.rescale_k, B * T * OC, _dev(acc), _dev(sx), _dev(sw), _dev(bias), b is not None, T, y)
    return _ret(y).reshape(B, T, OC)


@device_aware
def qlinear_backward(dy, x, w, has_bias=True):
    """[quant.linear.bwd.c1] -> (dx [B, T, C], dw [OC, C], db [OC] or None), binary32 with STE."""
    B, T, C, OC = _qlinear_check(x, w, None)
    _f32("dy", dy, 3)
    if dy.shape != (B, T, OC):
        raise ValueError(f"dy has shape {dy.shape}, expected {(B, T, OC)}")
    sx, sw, qx, qw = _qoperands(x, w)
    xd = dequantize(qx.reshape(B, T * C), sx).reshape(B * T, C)
    wd = dequantize(qw, sw)
    dy2 = dy.reshape(B * T, OC)
    dx = _ste(x.reshape(B, T * C), sx, matmul(dy2, wd).reshape(B, T * C))
    dw = _ste(w, sw, matmul_tn(dy2, xd))
    return dx.reshape(B, T, C), dw, col_sum(dy2) if has_bias else None
