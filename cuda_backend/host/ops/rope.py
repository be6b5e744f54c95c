"""Rotary embedding (spec chapter 13), as ``refreplay.ops.rope``."""

from __future__ import annotations

import numpy as np
from numba import cuda

from ...ops import rope as RO
from .._common import THREADS, _dev, _each, _f32, _ret, blocks, device_aware


MAX_T = 2**14 + 1  # [rope.freq.c1] angles stay in the domain of sin and cos


@device_aware
def rope_tables(T, HS, theta=np.float32(10000.0)):
    """[rope.freq.c1] (cos [T, HS/2], sin [T, HS/2]) for positions 0 .. T-1."""
    if not (isinstance(T, (int, np.integer)) and isinstance(HS, (int, np.integer))):
        raise TypeError("T and HS must be integers")
    if T < 1 or T > MAX_T or HS < 2 or HS % 2:
        raise ValueError(f"need 1 <= T <= {MAX_T} and an even HS >= 2, got T={T}, HS={HS}")
    theta = np.float32(theta)
    if not (theta > 1 and np.isfinite(theta)):
        raise ValueError(f"theta must be a finite float32 > 1, got {theta}")
    cos_t, sin_t = (cuda.device_array((T, HS // 2), np.float32) for _ in range(2))
    RO.rope_tables_k[blocks(T * (HS // 2)), THREADS](theta, int(HS), cos_t, sin_t)
    return _ret(cos_t), _ret(sin_t)


def _rope(kernel_name, name, x, cos_t, sin_t):
    _f32(name, x, 4)
    T, HS = x.shape[2], x.shape[3]
    for tname, tab in (("cos", cos_t), ("sin", sin_t)):
        _f32(f"{tname} table", tab, 2)
        if HS % 2 or tab.shape[0] < T or tab.shape[1] != HS // 2:
            raise ValueError(f"{tname} table of shape {tab.shape} does not fit {name} of shape {x.shape}")
    out = cuda.device_array(x.shape, np.float32)
    _each(getattr(RO, kernel_name), x.size // 2, _dev(x), _dev(cos_t), _dev(sin_t), out)
    return _ret(out)


@device_aware
def rope_forward(x, cos_t, sin_t):
    """[rope.fwd.c1] rotate x [B, NH, T, HS] (half-split pairs)."""
    return _rope("rope_forward_k", "x", x, cos_t, sin_t)


@device_aware
def rope_backward(dout, cos_t, sin_t):
    """[rope.bwd.c1] dx from dout [B, NH, T, HS]."""
    return _rope("rope_backward_k", "dout", dout, cos_t, sin_t)
