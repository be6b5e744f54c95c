"""Softmax and log-softmax (spec chapter 13), as ``refreplay.ops.softmax``."""

from __future__ import annotations

import numpy as np
from numba import cuda

from ...ops import softmax as SM
from .._common import THREADS, _dev, _ret, _same_shape, blocks, device_aware


def _softmax_rows(kernel_name, **inputs):
    """Row kernel over the last axis of same-shape inputs (leading axes flattened)."""
    shape = _same_shape(**inputs)
    if len(shape) < 1 or shape[-1] < 1:
        raise ValueError(f"needs a non-empty last axis, got shape {shape}")
    rows = [_dev(a.reshape(-1, shape[-1])) for a in inputs.values()]
    out = cuda.device_array(rows[0].shape, np.float32)
    if rows[0].shape[0]:
        getattr(SM, kernel_name)[blocks(rows[0].shape[0]), THREADS](*rows, out)
    return _ret(out).reshape(shape)


@device_aware
def softmax_forward(x):
    """[softmax.fwd.c1] softmax over the last axis."""
    return _softmax_rows("softmax_forward_k", x=x)


@device_aware
def softmax_backward(dy, y):
    """[softmax.bwd.c1] dx from dy and the forward output y."""
    return _softmax_rows("softmax_backward_k", dy=dy, y=y)


@device_aware
def log_softmax_forward(x):
    """[softmax.log.c1] log-softmax over the last axis."""
    return _softmax_rows("log_softmax_forward_k", x=x)


@device_aware
def log_softmax_backward(dy, y):
    """[softmax.log.bwd.c1] dx from dy and the forward output y."""
    return _softmax_rows("log_softmax_backward_k", dy=dy, y=y)
