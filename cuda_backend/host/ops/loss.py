"""Cross-entropy (spec chapter 14), as ``refreplay.ops.loss``.
"""
from __future__ import annotations

import numpy as np
from numba import cuda

from ...ops import loss as LO
from .._common import _each, _one_thread
from ..numerics import mul, recip


def cross_entropy_forward(logits, targets, ignore_index=-1):
    """[loss.token.c1] [loss.mean.c1] -> (losses [N], mean, count)."""
    from refreplay.ops import loss as ref
    ref._check(logits, targets, ignore_index)  # the reference's validation, errors and all
    N = logits.shape[0]
    d_targets = cuda.to_device(targets)
    losses = cuda.device_array(N, np.float32)
    _each(LO.cross_entropy_k, N, cuda.to_device(logits), d_targets, int(ignore_index), losses)
    mean, count = cuda.device_array(1, np.float32), cuda.device_array(1, np.int64)
    _one_thread(LO.masked_mean_k, losses, d_targets, int(ignore_index), mean, count)
    return losses.copy_to_host(), mean.copy_to_host()[0], int(count.copy_to_host()[0])


def cross_entropy_backward(logits, targets, dloss=np.float32(1.0), count=None, ignore_index=-1):
    """[loss.bwd.c1] dlogits [N, V] of dloss * mean-loss over ``count`` tokens."""
    from refreplay.ops import loss as ref
    ref._check(logits, targets, ignore_index)
    counted = int(np.count_nonzero(targets != ignore_index))
    count = counted if count is None else int(count)
    if count < counted or count > ref.MAX_COUNT:
        raise ValueError(f"count {count} must lie in [{counted}, 2^24]")
    c = mul(np.float32(dloss), recip(np.float32(count))) if count else np.float32(0.0)
    dlogits = cuda.device_array(logits.shape, np.float32)
    _each(LO.cross_entropy_backward_k, logits.shape[0], cuda.to_device(logits), cuda.to_device(targets),
          int(ignore_index), np.float32(c), dlogits)
    return dlogits.copy_to_host()
