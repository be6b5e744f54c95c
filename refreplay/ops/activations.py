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
from . import check_array, check_outs

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

# Flushes ([num.flush.c1], left out as [mm.flush.r1] allows): GELU's lanes keep the flush of their result
# (mul_flush before canon) and of tanh_lane's polynomial, and leave out the
# others, which change no result bit on any of the 2^32 inputs: every
# intermediate that can be subnormal (K x x x, (K3 x) x, th*th, 0.5 x, th for
# a subnormal inner) is added to a term at least 2^25 times larger (x, 1) or
# ends in the flushed result, so flushed or not it rounds the same.
# Exhaustion: tests/test_lane_exhaustive.py (test_lane_all_inputs[gelu])
# compares gelu_lane and gelu_local with the clause's steps, every operation
# flushed, on every bit pattern.


@kernel(inline="always")
def _gelu_th(x_i):
    """[act.gelu.fwd.c1] steps 1-3 for one element: th (canonical if NaN)."""
    cube = ((GELU_CUBE * x_i) * x_i) * x_i
    return tanh_lane(GELU_SCALE * (x_i + cube))


@kernel(inline="always")
def gelu_lane(x_i):
    """[act.gelu.fwd.c1] the result for one element."""
    return canon(mul((HALF * x_i), (ONE + _gelu_th(x_i))))


@kernel(inline="always")
def gelu_local(x_i):
    """[act.gelu.bwd.c1] steps 1-3 and 5-7 for one element: local, with the
    bits of the clause's local wherever that is not NaN (a NaN here may carry
    any payload: step 8's canon makes dx the canonical NaN either way)."""
    th = _gelu_th(x_i)
    sech2 = ONE - th * th  # tanh' = 1 - tanh^2
    dinner = GELU_SCALE * (ONE + (GELU_CUBE3 * x_i) * x_i)
    return HALF * (ONE + th) + ((HALF * x_i) * sech2) * dinner


@parallel_kernel
def gelu_forward_kernel(out, x):
    """[act.gelu.fwd.c1] out[i] = 0.5*x*(1 + tanh(sqrt(2/pi)*(x + 0.044715*x^3))).
    out, x: [N]; out overwritten.  Parallel over blocks of elements."""
    N = x.shape[0]
    for blk in prange((N + _BLOCK - 1) // _BLOCK):
        i0 = blk * _BLOCK
        xb = x[i0 : min(i0 + _BLOCK, N)]
        ob = out[i0 : min(i0 + _BLOCK, N)]
        for i in range(xb.shape[0]):
            ob[i] = gelu_lane(xb[i])


@parallel_kernel
def gelu_backward_kernel(dx, dout, x):
    """[act.gelu.bwd.c1] dx[i] = dout[i] * gelu'(x[i]).  dx, dout, x: [N];
    dx overwritten.  Parallel over blocks of elements."""
    N = x.shape[0]
    for blk in prange((N + _BLOCK - 1) // _BLOCK):
        i0 = blk * _BLOCK
        xb = x[i0 : min(i0 + _BLOCK, N)]
        db = dout[i0 : min(i0 + _BLOCK, N)]
        dxb = dx[i0 : min(i0 + _BLOCK, N)]
        for i in range(xb.shape[0]):
            dxb[i] = canon(mul(db[i], gelu_local(xb[i])))  # step 8


# ---- SiLU ----------------------------------------------------------------------


@parallel_kernel
def silu_forward_kernel(out, x):
    """[act.silu.fwd.c1] out[i] = x*sigmoid(x).  out, x: [N]; out overwritten.
    Parallel over blocks of elements; sigmoid in lane form."""
    N = x.shape[0]
    for blk in prange((N + _BLOCK - 1) // _BLOCK):
        i0 = blk * _BLOCK
        xb = x[i0 : min(i0 + _BLOCK, N)]
        ob = out[i0 : min(i0 + _BLOCK, N)]
        for i in range(xb.shape[0]):
            ob[i] = canon(mul(xb[i], sigmoid_lane(xb[i])))


@parallel_kernel
def silu_backward_kernel(dx, dout, x):
    """[act.silu.bwd.c1] dx[i] = dout[i] * s*(1 + x*(1 - s)), s = sigmoid(x).
    dx, dout, x: [N]; dx overwritten."""
    N = x.shape[0]
    for blk in prange((N + _BLOCK - 1) // _BLOCK):
        i0 = blk * _BLOCK
        xb = x[i0 : min(i0 + _BLOCK, N)]
        db = dout[i0 : min(i0 + _BLOCK, N)]
        dxb = dx[i0 : min(i0 + _BLOCK, N)]
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
        ab = a[i0 : min(i0 + _BLOCK, N)]
        bb = b[i0 : min(i0 + _BLOCK, N)]
        ob = out[i0 : min(i0 + _BLOCK, N)]
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


def _apply(kernel, names, out=None, **inputs):
    """Validate that every input has one shape, take one output of that
    shape per name in ``names`` (``out``: None, all new; with one output an
    array, with more a tuple whose entries are arrays or None, as
    ``check_outs``; the kernels overwrite every element), and run the
    element-wise kernel on flat views (outputs first, then the inputs in the
    order given)."""
    shape = _same_shape(**inputs)
    n_out = len(names)
    given = check_outs(None if out is None else (out,) if n_out == 1 else out, names, (shape,) * n_out, inputs.values())
    outs = [np.empty(shape, dtype=np.float32) if o is None else o for o in given]
    kernel(*(o.reshape(-1) for o in outs), *(a.reshape(-1) for a in inputs.values()))
    return outs[0] if n_out == 1 else tuple(outs)


def gelu_forward(x):
    """[act.gelu.fwd.c1] x (any shape) -> out, same shape (new)."""
    return _apply(gelu_forward_kernel, ("out",), x=x)


def gelu_backward(dout, x, out=None):
    """[act.gelu.bwd.c1] (dout, x) -> dx, same shape (new, or ``out``)."""
    return _apply(gelu_backward_kernel, ("dx",), out, dout=dout, x=x)


def silu_forward(x):
    """[act.silu.fwd.c1] x (any shape) -> out, same shape (new)."""
    return _apply(silu_forward_kernel, ("out",), x=x)


def silu_backward(dout, x):
    """[act.silu.bwd.c1] (dout, x) -> dx, same shape (new)."""
    return _apply(silu_backward_kernel, ("dx",), dout=dout, x=x)


def swiglu_forward(a, b):
    """[act.swiglu.fwd.c1] gate a and value b (same shape) -> out (new)."""
    return _apply(swiglu_forward_kernel, ("out",), a=a, b=b)


def swiglu_backward(dout, a, b, out=None):
    """[act.swiglu.bwd.c1] (dout, a, b) -> (da, db), same shape (new, or
    the arrays of the pair ``out``)."""
    return _apply(swiglu_backward_kernel, ("da", "db"), out, dout=dout, a=a, b=b)
