"""GELU (tanh form), SiLU and SwiGLU on the device, forward and backward;
mirrors ``refreplay.ops.activations`` ([act.gelu.fwd.c1], [act.gelu.bwd.c1],
[act.silu.fwd.c1], [act.silu.bwd.c1], [act.swiglu.fwd.c1], [act.swiglu.bwd.c1]).

Elementwise: all arrays of a call are 1-D of length N (the caller flattens
any shape), one thread per element, grid ``blocks(N)``, outputs overwritten.
The constants are the reference's (bit patterns written in the spec).
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from refreplay.ops.activations import GELU_CUBE, GELU_CUBE3, GELU_SCALE

from .. import shim
from .._jit import kernel
from ..transcendental import sigmoid, tanh

HALF = np.float32(0.5)
ONE = np.float32(1.0)
_V = "float32[::1]"


@kernel(f"void({_V}, {_V})")
def gelu_forward_k(out, x):
    """[act.gelu.fwd.c1] out[i] = 0.5*x*(1 + tanh(S*(x + K*x*x*x))), steps 1-4."""
    i = cuda.grid(1)
    if i < x.size:
        x_i = x[i]
        cube = shim.mul(shim.mul(shim.mul(GELU_CUBE, x_i), x_i), x_i)
        th = tanh(shim.mul(GELU_SCALE, shim.add(x_i, cube)))
        out[i] = shim.mul(shim.mul(HALF, x_i), shim.add(ONE, th))


@kernel(f"void({_V}, {_V}, {_V})")
def gelu_backward_k(dx, dout, x):
    """[act.gelu.bwd.c1] dx[i] = dout[i] * gelu'(x[i]): forward steps 1-3 recomputed, then 5-8."""
    i = cuda.grid(1)
    if i < x.size:
        x_i = x[i]
        cube = shim.mul(shim.mul(shim.mul(GELU_CUBE, x_i), x_i), x_i)  # forward: cube
        th = tanh(shim.mul(GELU_SCALE, shim.add(x_i, cube)))  # forward: th
        sech2 = shim.sub(ONE, shim.mul(th, th))
        dinner = shim.mul(GELU_SCALE, shim.add(ONE, shim.mul(shim.mul(GELU_CUBE3, x_i), x_i)))
        local = shim.add(shim.mul(HALF, shim.add(ONE, th)), shim.mul(shim.mul(shim.mul(HALF, x_i), sech2), dinner))
        dx[i] = shim.mul(dout[i], local)


@kernel(f"void({_V}, {_V})")
def silu_forward_k(out, x):
    """[act.silu.fwd.c1] out[i] = mul(x, sigmoid(x))."""
    i = cuda.grid(1)
    if i < x.size:
        out[i] = shim.mul(x[i], sigmoid(x[i]))


@kernel(f"void({_V}, {_V}, {_V})")
def silu_backward_k(dx, dout, x):
    """[act.silu.bwd.c1] dx[i] = dout * s*(1 + x*(1 - s)), s = sigmoid(x)."""
    i = cuda.grid(1)
    if i < x.size:
        x_i = x[i]
        s = sigmoid(x_i)  # forward step 1
        local = shim.mul(s, shim.add(ONE, shim.mul(x_i, shim.sub(ONE, s))))
        dx[i] = shim.mul(dout[i], local)


@kernel(f"void({_V}, {_V}, {_V})")
def swiglu_forward_k(out, a, b):
    """[act.swiglu.fwd.c1] out[i] = mul(mul(a, sigmoid(a)), b)."""
    i = cuda.grid(1)
    if i < a.size:
        a_i = a[i]
        out[i] = shim.mul(shim.mul(a_i, sigmoid(a_i)), b[i])


@kernel(f"void({_V}, {_V}, {_V}, {_V}, {_V})")
def swiglu_backward_k(da, db, dout, a, b):
    """[act.swiglu.bwd.c1] da[i] = (dout*b)*silu'(a), db[i] = dout*silu(a)."""
    i = cuda.grid(1)
    if i < a.size:
        a_i = a[i]
        s = sigmoid(a_i)
        silu_a = shim.mul(a_i, s)  # forward step 2
        dsilu = shim.mul(s, shim.add(ONE, shim.mul(a_i, shim.sub(ONE, s))))
        da[i] = shim.mul(shim.mul(dout[i], b[i]), dsilu)
        db[i] = shim.mul(dout[i], silu_a)
