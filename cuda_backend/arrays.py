"""Exact copies that rearrange the model's activations on the device (no
arithmetic): the attention heads out of and back into the rows of a matrix
([model.forward.c1]), so that q, k, v and their gradients never leave the
device.  Mirrors ``refreplay.training.arrays``.

Element [b, h, t, d] of the heads [B, NH, T, HS] is element
[b*T + t, col0 + h*HS + d] of the matrix [B*T, W]; one thread per element.
"""

from __future__ import annotations

from numba import cuda

from ._jit import kernel

_M = "float32[:, ::1]"
_H = "float32[:, :, :, ::1]"


@kernel(f"void({_M}, int64, {_H})")
def split_heads_k(x, col0, heads):
    """heads[b, h, t, d] = x[b*T + t, col0 + h*HS + d]; grid ``blocks(heads.size)``."""
    i = cuda.grid(1)
    NH, T, HS = heads.shape[1], heads.shape[2], heads.shape[3]
    if i < heads.size:
        d, r = i % HS, i // HS
        t, r = r % T, r // T
        h, b = r % NH, r // NH
        heads[b, h, t, d] = x[b * T + t, col0 + h * HS + d]


@kernel(f"void({_H}, int64, {_M})")
def merge_heads_k(heads, col0, x):
    """x[b*T + t, col0 + h*HS + d] = heads[b, h, t, d]; grid ``blocks(heads.size)``."""
    i = cuda.grid(1)
    NH, T, HS = heads.shape[1], heads.shape[2], heads.shape[3]
    if i < heads.size:
        d, r = i % HS, i // HS
        t, r = r % T, r // T
        h, b = r % NH, r // NH
        x[b * T + t, col0 + h * HS + d] = heads[b, h, t, d]


@kernel("void(int8[:, ::1], int8[:, ::1])")
def transpose_i8_k(a, out):
    """out[j, i] = a[i, j] (the int8 weight codes as B of [mm.i8.c1]); grid ``blocks(a.size)``."""
    t = cuda.grid(1)
    I, J = a.shape
    if t < I * J:
        i = t // J
        j = t - i * J
        out[j, i] = a[i, j]
