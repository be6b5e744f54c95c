"""Cross-entropy (spec chapter 14), as ``refreplay.ops.loss``."""

from __future__ import annotations

import numpy as np
from numba import cuda

from ...ops import loss as LO
from .._common import _dev, _each, _one_thread, _ret, check_f32, device_aware, is_device
from ..numerics import mul, recip


def _check(logits, targets, ignore_index):
    """The reference's validation, errors and all; device logits are checked by
    type, shape and contiguity here, the (host) targets by value as the reference does."""
    from refreplay.errors import InputError
    from refreplay.ops import loss as ref

    if not is_device(logits):
        return ref._check(logits, targets, ignore_index)
    check_f32("logits", logits, 2)
    N, V = logits.shape
    if V < 1:
        raise ValueError(f"logits must be a C-contiguous [N, V] array with V >= 1, got {logits.shape}")
    if not isinstance(targets, np.ndarray) or targets.dtype != np.int32:
        raise TypeError("targets must be an int32 ndarray")
    if not targets.flags.c_contiguous or targets.shape != (N,):
        raise ValueError(f"targets of shape {targets.shape} do not match logits {logits.shape}")
    if ignore_index >= 0:
        raise ValueError("ignore_index must be negative")
    bad = (targets != ignore_index) & ((targets < 0) | (targets >= V))
    if bad.any():
        n = int(np.flatnonzero(bad)[0])
        raise InputError(
            f"target {int(targets[n])} at token {n} is outside [0, {V}) and is not the ignore index {ignore_index}"
        )
    if N > ref.MAX_COUNT:
        raise ValueError(f"more than 2^24 tokens ({N})")


@device_aware
def cross_entropy_forward(logits, targets, ignore_index=-1):
    """[loss.token.c1] [loss.mean.c1] -> (losses [N], mean, count)."""
    _check(logits, targets, ignore_index)
    N = logits.shape[0]
    d_targets = _dev(targets)
    losses = cuda.device_array(N, np.float32)
    _each(LO.cross_entropy_k, N, _dev(logits), d_targets, int(ignore_index), losses)
    mean, count = cuda.device_array(1, np.float32), cuda.device_array(1, np.int64)
    _one_thread(LO.masked_mean_k, losses, d_targets, int(ignore_index), mean, count)
    return _ret(losses), mean.copy_to_host()[0], int(count.copy_to_host()[0])


@device_aware
def cross_entropy_backward(logits, targets, dloss=np.float32(1.0), count=None, ignore_index=-1):
    """[loss.bwd.c1] dlogits [N, V] of dloss * mean-loss over ``count`` tokens."""
    from refreplay.ops import loss as ref

    _check(logits, targets, ignore_index)
    counted = int(np.count_nonzero(targets != ignore_index))
    count = counted if count is None else int(count)
    if count < counted or count > ref.MAX_COUNT:
        raise ValueError(f"count {count} must lie in [{counted}, 2^24]")
    c = mul(np.float32(dloss), recip(np.float32(count))) if count else np.float32(0.0)
    dlogits = cuda.device_array(logits.shape, np.float32)
    _each(
        LO.cross_entropy_backward_k,
        logits.shape[0],
        _dev(logits),
        _dev(targets),
        int(ignore_index),
        np.float32(c),
        dlogits,
    )
    return _ret(dlogits)
