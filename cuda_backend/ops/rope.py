"""Rotary position embedding (half-split pairs) on the device; mirrors
``refreplay.ops.rope`` ([rope.freq.c1], [rope.fwd.c1], [rope.bwd.c1]).

Shapes: x, out, dout, dx [B, NH, T, HS]; tables cos_t, sin_t [T, HS/2].
One thread per table entry (t, i), or per rotated pair (b, h, t, i) with
i < HS/2: grid ``blocks(count)``; outputs overwritten.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .. import shim
from .._jit import kernel
from ..transcendental import cos, exp, log, sin

_T = "float32[:, ::1]"
_X = "float32[:, :, :, ::1]"


@kernel(f"void(float32, int64, {_T}, {_T})")
def rope_tables_k(theta, HS, cos_t, sin_t):
    """[rope.freq.c1] angle = f32(t) * exp(-((f32(2i) * recip(f32(HS))) * log(theta)));
    cos_t[t, i] = cos(angle), sin_t[t, i] = sin(angle).  log(theta) and
    recip(f32(HS)) are the same value in every thread."""
    g = cuda.grid(1)
    T, H2 = cos_t.shape
    if g < T * H2:
        t = g // H2
        i = g - t * H2
        inv_freq = exp(-shim.mul(shim.mul(np.float32(2 * i), shim.recip(np.float32(HS))), log(theta)))
        angle = shim.mul(np.float32(t), inv_freq)
        cos_t[t, i] = cos(angle)
        sin_t[t, i] = sin(angle)


@kernel(f"void({_X}, {_T}, {_T}, {_X})")
def rope_forward_k(x, cos_t, sin_t, out):
    """[rope.fwd.c1] out[i] = x[i]*c - x[i+H2]*s; out[i+H2] = x[i+H2]*c + x[i]*s."""
    g = cuda.grid(1)
    B, NH, T, HS = x.shape
    H2 = HS // 2
    if g < B * NH * T * H2:
        i = g % H2
        t = (g // H2) % T
        h = (g // (H2 * T)) % NH
        b = g // (H2 * T * NH)
        c = cos_t[t, i]
        s = sin_t[t, i]
        x1 = x[b, h, t, i]
        x2 = x[b, h, t, i + H2]
        out[b, h, t, i] = shim.sub(shim.mul(x1, c), shim.mul(x2, s))
        out[b, h, t, i + H2] = shim.add(shim.mul(x2, c), shim.mul(x1, s))


@kernel(f"void({_X}, {_T}, {_T}, {_X})")
def rope_backward_k(dout, cos_t, sin_t, dx):
    """[rope.bwd.c1] dx[i] = dout[i]*c + dout[i+H2]*s; dx[i+H2] = dout[i+H2]*c - dout[i]*s."""
    g = cuda.grid(1)
    B, NH, T, HS = dout.shape
    H2 = HS // 2
    if g < B * NH * T * H2:
        i = g % H2
        t = (g // H2) % T
        h = (g // (H2 * T)) % NH
        b = g // (H2 * T * NH)
        c = cos_t[t, i]
        s = sin_t[t, i]
        d1 = dout[b, h, t, i]
        d2 = dout[b, h, t, i + H2]
        dx[b, h, t, i] = shim.add(shim.mul(d1, c), shim.mul(d2, s))
        dx[b, h, t, i + H2] = shim.sub(shim.mul(d2, c), shim.mul(d1, s))
