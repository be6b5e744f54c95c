"""Causal attention (spec chapter 13), as ``refreplay.ops.attention``."""

from __future__ import annotations

import functools

import numpy as np
from numba import cuda

from ...ops import attention as AT
from .._common import _dev, _each, _f32, _ret, device_aware
from ..numerics import recip, sqrt


@functools.lru_cache(maxsize=None)  # one device computation per head size, not one per call
def attention_scale(HS):
    """[attn.scores.c1] recip(sqrt(f32(HS)))."""
    return recip(sqrt(np.float32(HS)))


def _heads(shape=None, **arrays):
    for name, a in arrays.items():
        _f32(name, a, 4)
        shape = shape or a.shape
        if a.shape != shape:
            raise ValueError(f"{name} has shape {a.shape}, expected {shape}")
    if min(shape) < 1:
        raise ValueError(f"empty attention shape {shape}")
    return shape


@device_aware
def attention_forward(q, k, v):
    """[attn.scores.c1] [attn.mask.c1] [attn.out.c1] q, k, v [B, NH, T, HS] -> (out, att [B, NH, T, T])."""
    B, NH, T, HS = _heads(q=q, k=k, v=v)
    out = cuda.device_array(q.shape, np.float32)
    att = cuda.device_array((B, NH, T, T), np.float32)
    _each(AT.attention_forward_k, B * NH * T, _dev(q), _dev(k), _dev(v), attention_scale(HS), out, att)
    return _ret(out), _ret(att)


@device_aware
def attention_backward(dout, q, k, v, att):
    """[attn.bwd.c1] -> (dq, dk, dv), each [B, NH, T, HS]."""
    B, NH, T, HS = _heads(dout=dout, q=q, k=k, v=v)
    _heads((B, NH, T, T), att=att)
    d_dout, d_q, d_att = _dev(dout), _dev(q), _dev(att)
    dz = cuda.device_array((B, NH, T, T), np.float32)
    dq, dk, dv = (cuda.device_array(q.shape, np.float32) for _ in range(3))
    _each(AT.attention_backward_rows_k, B * NH * T, d_dout, d_q, _dev(k), _dev(v), d_att, attention_scale(HS), dz, dq)
    _each(AT.attention_backward_keys_k, q.size, d_dout, d_q, d_att, dz, dk, dv)
    return _ret(dq), _ret(dk), _ret(dv)
