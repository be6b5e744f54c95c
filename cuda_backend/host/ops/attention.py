"""Causal attention (spec chapter 13), as ``refreplay.ops.attention``.
"""
from __future__ import annotations

import numpy as np
from numba import cuda

from ...ops import attention as AT
from .._common import _each, _f32
from ..numerics import recip, sqrt


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


def attention_forward(q, k, v):
    """[attn.scores.c1] [attn.mask.c1] [attn.out.c1] q, k, v [B, NH, T, HS] -> (out, att [B, NH, T, T])."""
    B, NH, T, HS = _heads(q=q, k=k, v=v)
    out = cuda.device_array(q.shape, np.float32)
    att = cuda.device_array((B, NH, T, T), np.float32)
    _each(AT.attention_forward_k, B * NH * T, cuda.to_device(q), cuda.to_device(k), cuda.to_device(v),
          attention_scale(HS), out, att)
    return out.copy_to_host(), att.copy_to_host()


def attention_backward(dout, q, k, v, att):
    """[attn.bwd.c1] -> (dq, dk, dv), each [B, NH, T, HS]."""
    B, NH, T, HS = _heads(dout=dout, q=q, k=k, v=v)
    _heads((B, NH, T, T), att=att)
    d_dout, d_q, d_att = cuda.to_device(dout), cuda.to_device(q), cuda.to_device(att)
    dz = cuda.device_array((B, NH, T, T), np.float32)
    dq, dk, dv = (cuda.device_array(q.shape, np.float32) for _ in range(3))
    _each(AT.attention_backward_rows_k, B * NH * T, d_dout, d_q, cuda.to_device(k), cuda.to_device(v),
          d_att, attention_scale(HS), dz, dq)
    _each(AT.attention_backward_keys_k, q.size, d_dout, d_q, d_att, dz, dk, dv)
    return dq.copy_to_host(), dk.copy_to_host(), dv.copy_to_host()
