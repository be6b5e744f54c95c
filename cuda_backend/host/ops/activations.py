"""GELU, SiLU, SwiGLU (spec chapter 12), as ``refreplay.ops.activations``."""

from __future__ import annotations

import numpy as np
from numba import cuda

from ...ops import activations as ACT
from .._common import THREADS, _dev, _ret, _same_shape, blocks, device_aware


def _map(kernel_name, n_out, **inputs):
    """Run an elementwise op kernel over flattened same-shape inputs -> n_out arrays."""
    shape = _same_shape(**inputs)
    n = int(np.prod(shape, dtype=np.int64))
    outs = [cuda.device_array(n, np.float32) for _ in range(n_out)]
    if n:
        getattr(ACT, kernel_name)[blocks(n), THREADS](*outs, *(_dev(a.reshape(-1)) for a in inputs.values()))
    res = tuple(_ret(o).reshape(shape) for o in outs)
    return res if n_out > 1 else res[0]


@device_aware
def gelu_forward(x):
    """[act.gelu.fwd.c1] x (any shape) -> out."""
    return _map("gelu_forward_k", 1, x=x)


@device_aware
def gelu_backward(dout, x):
    """[act.gelu.bwd.c1] (dout, x) -> dx."""
    return _map("gelu_backward_k", 1, dout=dout, x=x)


@device_aware
def silu_forward(x):
    """[act.silu.fwd.c1] x -> out."""
    return _map("silu_forward_k", 1, x=x)


@device_aware
def silu_backward(dout, x):
    """[act.silu.bwd.c1] (dout, x) -> dx."""
    return _map("silu_backward_k", 1, dout=dout, x=x)


@device_aware
def swiglu_forward(a, b):
    """[act.swiglu.fwd.c1] gate a, value b -> out."""
    return _map("swiglu_forward_k", 1, a=a, b=b)


@device_aware
def swiglu_backward(dout, a, b):
    """[act.swiglu.bwd.c1] (dout, a, b) -> (da, db)."""
    return _map("swiglu_backward_k", 2, dout=dout, a=a, b=b)
