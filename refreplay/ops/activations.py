"""Elementwise activations, forward and backward: GELU in tanh form, SiLU and
SwiGLU ([act.gelu.fwd.c1], [act.gelu.bwd.c1], [act.silu.fwd.c1],
[act.silu.bwd.c1], [act.swiglu.fwd.c1], [act.swiglu.bwd.c1]).

Shapes: every argument of one call has the same shape, any shape (N elements
once flattened; in a model [B, T, F]).  Each element's result depends on that
element alone, so the kernels run over elements in parallel.
"""
from __future__ import annotations

import numpy as np
from numba import prange

from .._jit import kernel, parallel_kernel
from ..numerics.core import HALF, ONE, canon
from ..numerics.elementwise import add_flush as add  # [num.add.c1], canon once per chain
from ..numerics.elementwise import mul_flush as mul  # [num.mul.c1], canon once per chain
from ..numerics.elementwise import sigmoid_lane, tanh_lane  # [num.sigmoid.c1] [num.tanh.c1]
from ..numerics.elementwise import sub_flush as sub  # [num.add.c1], canon once per chain
from . import check_array

GELU_SCALE = np.array([0x3F4C422A], dtype=np.uint32).view(np.float32)[0]  # sqrt(2/pi)
GELU_CUBE = np.array([0x3D372713], dtype=np.uint32).view(np.float32)[0]  # 0.044715
GELU_CUBE3 = np.array([0x3E095D4F], dtype=np.uint32).view(np.float32)[0]  # 3 * 0.044715


# ---- GELU (tanh form) ----------------------------------------------------------


# The element kernels call tanh and sigmoid in their branch-free lane forms
# (``elementwise.tanh_lane``, ``sigmoid_lane``: [num.tanh.c1], [num.sigmoid.c1]),
# so the element loop has no control flow and compiles to SIMD over
# independent elements with the scalar forms' bits (tests/test_fast_paths.py).
# Each element's result is a chain of adds and multiplies of x, dout and the
# lane form's value (itself canonical), so its rounded operations are
# ``add``/``sub``/``mul`` without the NaN test and the result is
# canonicalised once, at the end of the chain, as [num.nan.c1] allows: a NaN
# anywhere in the chain reaches its end.

_BLOCK = 2048  # elements per parallel task; any value gives the same bits

@kernel(inline="always")
def _gelu_lane(x_i):
    """[act.gelu.fwd.c1] steps 1-5 for one element; (th, out)."""
    cube = mul(mul(mul(GELU_CUBE, x_i), x_i), x_i)
    th = tanh_lane(mul(GELU_SCALE, add(x_i, cube)))  # canonical: tanh_lane canonicalises a NaN
    return th, canon(mul(mul(HALF, x_i), add(ONE, th)))


@parallel_kernel
def gelu_forward_kernel(out, x):
    """[act.gelu.fwd.c1] out[i] = 0.5*x*(1 + tanh(sqrt(2/pi)*(x + 0.044715*x^3))).
    out, x: [N]; out overwritten.  Parallel over blocks of elements."""
    N = x.shape[0]
    for blk in prange((N + _BLOCK - 1) // _BLOCK):
        i0 = blk * _BLOCK
        xb = x[i0:min(i0 + _BLOCK, N)]
        ob = out[i0:min(i0 + _BLOCK, N)]
        for i in range(xb.shape[0]):
            ob[i] = _gelu_lane(xb[i])[1]


@parallel_kernel
def gelu_backward_kernel(dx, dout, x):
    """[act.gelu.bwd.c1] dx[i] = dout[i] * gelu'(x[i]).  dx, dout, x: [N];
    dx overwritten.  Parallel over blocks of elements."""
    N = x.shape[0]
    for blk in prange((N + _BLOCK - 1) // _BLOCK):
        i0 = blk * _BLOCK
        xb = x[i0:min(i0 + _BLOCK, N)]
        db = dout[i0:min(i0 + _BLOCK, N)]
        dxb = dx[i0:min(i0 + _BLOCK, N)]
        for i in range(xb.shape[0]):
            x_i = xb[i]
            th = _gelu_lane(x_i)[0]  # forward: th
            sech2 = sub(ONE, mul(th, th))  # tanh' = 1 - tanh^2
            dinner = mul(GELU_SCALE, add(ONE, mul(mul(GELU_CUBE3, x_i), x_i)))
            local = add(mul(HALF, add(ONE, th)), mul(mul(mul(HALF, x_i), sech2), dinner))
            dxb[i] = canon(mul(db[i], local))


# ---- SiLU ----------------------------------------------------------------------


@parallel_kernel
def silu_forward_kernel(out, x):
    """[act.silu.fwd.c1] out[i] = x*sigmoid(x).  out, x: [N]; out overwritten.
    Parallel over blocks of elements; sigmoid in lane form."""
    N = x.shape[0]
    for blk in prange((N + _BLOCK - 1) // _BLOCK):
        i0 = blk * _BLOCK
        xb = x[i0:min(i0 + _BLOCK, N)]
        ob = out[i0:min(i0 + _BLOCK, N)]
        for i in range(xb.shape[0]):
            ob[i] = canon(mul(xb[i], sigmoid_lane(xb[i])))


@parallel_kernel
def silu_backward_kernel(dx, dout, x):
    """[act.silu.bwd.c1] dx[i] = dout[i] * s*(1 + x*(1 - s)), s = sigmoid(x).
    dx, dout, x: [N]; dx overwritten."""
    N = x.shape[0]
    for blk in prange((N + _BLOCK - 1) // _BLOCK):
        i0 = blk * _BLOCK
        xb = x[i0:min(i0 + _BLOCK, N)]
        db = dout[i0:min(i0 + _BLOCK, N)]
        dxb = dx[i0:min(i0 + _BLOCK, N)]
        for i in range(xb.shape[0]):
            x_i = xb[i]
            s = sigmoid_lane(x_i)  # forward: out = x*s
            local = mul(s, add(ONE, mul(x_i, sub(ONE, s))))
            dxb[i] = canon(mul(db[i], local))


# ---- SwiGLU --------------------------------------------------------------------


@parallel_kernel
def swiglu_forward_kernel(out, a, b):
    """[act.swiglu.fwd.c1] out[i] = (a*sigmoid(a))*b.  out, a, b: [N]; out
    overwritten."""
    N = a.shape[0]
    for blk in prange((N + _BLOCK - 1) // _BLOCK):
        i0 = blk * _BLOCK
        ab = a[i0:min(i0 + _BLOCK, N)]
        bb = b[i0:min(i0 + _BLOCK, N)]
        ob = out[i0:min(i0 + _BLOCK, N)]
        for i in range(ab.shape[0]):
            a_i = ab[i]
            ob[i] = canon(mul(mul(a_i, sigmoid_lane(a_i)), bb[i]))


@parallel_kernel
def swiglu_backward_kernel(da, db, dout, a, b):
    """[act.swiglu.bwd.c1] da[i] = (dout*b)*silu'(a), db[i] = dout*silu(a).
    da, db, dout, a, b: [N]; da, db overwritten."""
    N = a.shape[0]
    for blk in prange((N + _BLOCK - 1) // _BLOCK):
        i0 = blk * _BLOCK
        i1 = min(i0 + _BLOCK, N)
        ab, bb, gb = a[i0:i1], b[i0:i1], dout[i0:i1]
        dab, dbb = da[i0:i1], db[i0:i1]
        for i in range(ab.shape[0]):
            a_i = ab[i]
            s = sigmoid_lane(a_i)
            silu_a = mul(a_i, s)  # forward: out = silu_a*b
            dsilu = mul(s, add(ONE, mul(a_i, sub(ONE, s))))
            dab[i] = canon(mul(mul(gb[i], bb[i]), dsilu))
            dbb[i] = canon(mul(gb[i], silu_a))


# ---- Python API: validation and allocation ----------------------------------------


def _same_shape(**arrays):
    shape = None
    for name, a in arrays.items():
        if not isinstance(a, np.ndarray):
            raise TypeError(f"{name} must be a numpy array, got {type(a).__name__}")
        check_array(name, a, np.float32, a.ndim)
        if shape is None:
            shape = a.shape
        elif a.shape != shape:
            raise ValueError(f"{name} has shape {a.shape}, expected {shape}")
    return shape


def _apply(kernel, n_out, **inputs):
    """Validate that every input has one shape, allocate ``n_out`` new
    outputs of that shape, and run the element-wise kernel on flat views
    (outputs first, then the inputs in the order given)."""
    shape = _same_shape(**inputs)
    outs = [np.empty(shape, dtype=np.float32) for _ in range(n_out)]
    kernel(*(o.reshape(-1) for o in outs), *(a.reshape(-1) for a in inputs.values()))
    return outs[0] if n_out == 1 else tuple(outs)


def gelu_forward(x):
    """[act.gelu.fwd.c1] x (any shape) -> out, same shape (new)."""
    return _apply(gelu_forward_kernel, 1, x=x)


def gelu_backward(dout, x):
    """[act.gelu.bwd.c1] (dout, x) -> dx, same shape (new)."""
    return _apply(gelu_backward_kernel, 1, dout=dout, x=x)


def silu_forward(x):
    """[act.silu.fwd.c1] x (any shape) -> out, same shape (new)."""
    return _apply(silu_forward_kernel, 1, x=x)


def silu_backward(dout, x):
    """[act.silu.bwd.c1] (dout, x) -> dx, same shape (new)."""
    return _apply(silu_backward_kernel, 1, dout=dout, x=x)


def swiglu_forward(a, b):
    """[act.swiglu.fwd.c1] gate a and value b (same shape) -> out (new)."""
    return _apply(swiglu_forward_kernel, 1, a=a, b=b)


def swiglu_backward(dout, a, b):
    """[act.swiglu.bwd.c1] (dout, a, b) -> (da, db), same shape (new)."""
    return _apply(swiglu_backward_kernel, 2, dout=dout, a=a, b=b)
