"""Array plumbing of a training step on the CPU: exact copies and moves, no
arithmetic.  ``cuda_backend.host.arrays`` is the device twin with the same
names; the model and the step call these through their ``Backend`` so that
one code path serves both devices.  On the CPU ``to_device``/``to_host`` are
the identity: the reference pays nothing for them.
"""

from __future__ import annotations

import numpy as np


def to_device(a: np.ndarray) -> np.ndarray:
    """Where the step's tensors live (the host, here): ``a`` itself."""
    return a


def to_host(a: np.ndarray) -> np.ndarray:
    """A tensor as a host array for hashing and publishing: ``a`` itself."""
    return a


def copy(a: np.ndarray) -> np.ndarray:
    """A new array with the bits of ``a``."""
    return a.copy()


def contiguous(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a)


def split_heads(x: np.ndarray, j: int, B: int, T: int, NH: int, HS: int) -> np.ndarray:
    """[model.forward.c1] Part j of the rows of x [N, W] as heads [B, NH, T, HS]:
    element [b, h, t, d] = x[b*T + t, j*C + h*HS + d], C = NH*HS (an exact copy)."""
    C = NH * HS
    part = x.reshape(B, T, -1)[:, :, j * C : (j + 1) * C].reshape(B, T, NH, HS)
    return np.ascontiguousarray(part.transpose(0, 2, 1, 3))


def merge_heads(parts: list, B: int, T: int, NH: int, HS: int) -> np.ndarray:
    """The heads [B, NH, T, HS] of each part side by side as rows [N, len(parts)*C]:
    element [b*T + t, j*C + h*HS + d] = parts[j][b, h, t, d] (an exact copy)."""
    rows = [np.ascontiguousarray(p.transpose(0, 2, 1, 3)).reshape(B * T, NH * HS) for p in parts]
    return rows[0] if len(rows) == 1 else np.concatenate(rows, axis=1)


def on_host(a):
    """Any step tensor as a host array: a device array (one with ``copy_to_host``,
    from a device-resident backend) is copied back, a host array is itself.
    Where the state is hashed, checkpointed or sent between ranks."""
    return a.copy_to_host() if getattr(a, "__cuda_ndarray__", False) else a
