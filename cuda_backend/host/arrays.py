"""The device twin of ``refreplay.training.arrays``: where the step's tensors live and
the exact copies that rearrange them, on the device.  A device array stays
there; ``to_host`` is the one way a tensor comes back (to be hashed or
published).
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .. import arrays as K
from ._common import THREADS, _array, _dev, _ret, blocks, device_aware, is_device


def to_device(a):
    """A device array: ``a`` itself when it is one, else a copy of the host array."""
    return a if is_device(a) else cuda.to_device(np.ascontiguousarray(a))


def to_host(a):
    """A host array with the bits of ``a`` (``a`` itself when it is one)."""
    return a.copy_to_host() if is_device(a) else a


def copy(a):
    """A new array with the bits of ``a``, where ``a`` lives."""
    if not is_device(a):
        return a.copy()
    out = cuda.device_array(a.shape, a.dtype)
    out.copy_to_device(a)
    return out


def contiguous(a):
    return a if is_device(a) else np.ascontiguousarray(a)


@device_aware
def split_heads(x, j, B, T, NH, HS):
    """[model.forward.c1] Part j of the rows of x [N, W] as heads [B, NH, T, HS]
    (``refreplay.training.arrays.split_heads``), copied by ``split_heads_k``."""
    x = _array("x", x, ndim=2)
    C = NH * HS
    if x.shape[0] != B * T or x.shape[1] < (j + 1) * C:
        raise ValueError(f"split_heads: x of shape {x.shape} has no part {j} of [{B}*{T}, {C}] heads")
    heads = cuda.device_array((B, NH, T, HS), np.float32)
    if heads.size:
        K.split_heads_k[blocks(heads.size), THREADS](_dev(x), j * C, heads)
    return _ret(heads)


@device_aware
def merge_heads(parts, B, T, NH, HS):
    """The heads of each part side by side as rows [N, len(parts)*C]
    (``refreplay.training.arrays.merge_heads``), copied by ``merge_heads_k``."""
    C = NH * HS
    rows = cuda.device_array((B * T, len(parts) * C), np.float32)
    for j, p in enumerate(parts):
        p = _array(f"parts[{j}]", p, ndim=4)
        if tuple(p.shape) != (B, NH, T, HS):
            raise ValueError(f"merge_heads: part {j} has shape {p.shape}, expected {(B, NH, T, HS)}")
        if p.size:
            K.merge_heads_k[blocks(p.size), THREADS](_dev(p), j * C, rows)
    return _ret(rows)
