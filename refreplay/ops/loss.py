"""Cross-entropy from logits with an ignore index (``spec/14-ops-loss.txt``).

Shapes (spec letters): logits [N, V] (N = B*T tokens), targets [N] int32,
losses [N].  A token whose target equals the ignore index (-1) is not
counted: its loss and its gradient row are +0.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .._jit import kernel, parallel_kernel
from ..errors import InputError
from ..numerics.core import F32, ONE, ZERO, add, mul, recip, sub
from . import check_out
from .rowblock import RB, n_blocks, new_tile
from .softmax import block_max, exp_sum_block, logsumexp_block

IGNORE_INDEX = -1
MAX_COUNT = 2**24  # f32(count) is exact up to here [loss.mean.c1]


@parallel_kernel
def cross_entropy_kernel(logits, targets, ignore_index, losses):
    """[loss.token.c1] logits [N, V], targets [N] -> losses [N] (overwritten):
        losses[n] = log(s) - (logits[n, y] - m)   (m, s as in softmax, y = targets[n])
        losses[n] = +0 where targets[n] == ignore_index
    Threads take blocks of RB rows whose sums run side by side (rowblock.py);
    an ignored row's m and log(s) are computed with the block and not used."""
    N = logits.shape[0]
    for b in prange(n_blocks(N)):
        i0 = b * RB
        rows = min(RB, N - i0)
        m, ls = logsumexp_block(logits, i0, rows)
        for r in range(rows):
            n = i0 + r
            y = targets[n]
            losses[n] = ZERO if y == ignore_index else sub(ls[r], sub(logits[n, y], m[r]))


@kernel
def masked_mean(losses, targets, ignore_index):
    """[loss.mean.c1] (mean, count): sum = -0 ([red.sum.c1]), then
    sum = sum + losses[n] for every counted n in increasing order;
    mean = sum * recip(f32(count)); count = 0 gives mean = +0."""
    total = F32(-0.0)
    count = 0
    for n in range(losses.shape[0]):
        if targets[n] != ignore_index:
            total = add(total, losses[n])
            count += 1
    if count == 0:
        return ZERO, 0
    return mul(total, recip(F32(count))), count


@parallel_kernel
def cross_entropy_backward_kernel(logits, targets, ignore_index, c, dlogits):
    """[loss.bwd.c1] dlogits [N, V] (overwritten), c = dloss * recip(f32(count)):
        counted row n:  g = softmax(logits[n]); g[y] = g[y] - 1;
                        dlogits[n, j] = g[j] * c
        ignored row n:  dlogits[n, :] = +0
    Threads take blocks of RB rows; exp_sum_block writes every row's e[j]
    into dlogits, then one pass per row takes e[j] * recip(s) (softmax's
    step) times c, and the target's entry is redone with its - 1."""
    N, V = logits.shape
    for b in prange(n_blocks(N)):
        i0 = b * RB
        rows = min(RB, N - i0)
        T = new_tile()
        s = exp_sum_block(logits, i0, rows, block_max(logits, i0, rows), T, dlogits, True)
        for r in range(rows):
            d_n = dlogits[i0 + r]
            y = targets[i0 + r]
            if y == ignore_index:
                for j in range(V):
                    d_n[j] = ZERO
            else:
                rs = recip(s[r])
                g_y = sub(mul(d_n[y], rs), ONE)
                for j in range(V):
                    d_n[j] = mul(mul(d_n[j], rs), c)
                d_n[y] = mul(g_y, c)


# ---- public API ------------------------------------------------------------------


def _check(logits, targets, ignore_index):
    if not isinstance(logits, np.ndarray) or logits.dtype != np.float32:
        raise TypeError("logits must be a float32 ndarray")
    if not logits.flags.c_contiguous or logits.ndim != 2 or logits.shape[1] < 1:
        raise ValueError(f"logits must be a C-contiguous [N, V] array with V >= 1, got {logits.shape}")
    if not isinstance(targets, np.ndarray) or targets.dtype != np.int32:
        raise TypeError("targets must be an int32 ndarray")
    if not targets.flags.c_contiguous or targets.shape != logits.shape[:1]:
        raise ValueError(f"targets of shape {targets.shape} do not match logits {logits.shape}")
    if ignore_index >= 0:
        raise ValueError("ignore_index must be negative")
    V = logits.shape[1]
    bad = (targets != ignore_index) & ((targets < 0) | (targets >= V))
    if bad.any():
        n = int(np.flatnonzero(bad)[0])
        raise InputError(
            f"target {int(targets[n])} at token {n} is outside [0, {V}) and is not the ignore index {ignore_index}"
        )
    if logits.shape[0] > MAX_COUNT:
        raise ValueError(f"more than 2^24 tokens ({logits.shape[0]})")


def cross_entropy_forward(logits, targets, ignore_index=IGNORE_INDEX):
    """[loss.token.c1] [loss.mean.c1] -> (losses [N] float32, mean float32, count int)."""
    _check(logits, targets, ignore_index)
    losses = np.empty(logits.shape[0], np.float32)
    cross_entropy_kernel(logits, targets, ignore_index, losses)
    mean, count = masked_mean(losses, targets, ignore_index)
    return losses, np.float32(mean), int(count)


def cross_entropy_backward(logits, targets, dloss=ONE, count=None, ignore_index=IGNORE_INDEX, out=None):
    """[loss.bwd.c1] dlogits [N, V] of dloss * mean-loss (new, or ``out``: a
    float32 [N, V] C-contiguous array that overlaps no input; the kernel
    writes every element of it, so its old contents never matter).

    ``count`` is the denominator of the mean; by default the number of counted
    tokens in this call (what ``cross_entropy_forward`` returned).  Pass a
    larger count when this call is part of a mean taken over more tokens.
    """
    _check(logits, targets, ignore_index)
    counted = int(np.count_nonzero(targets != ignore_index))
    count = counted if count is None else int(count)
    if count < counted or count > MAX_COUNT:
        raise ValueError(f"count {count} must lie in [{counted}, 2^24]")
    dloss = np.float32(dloss)
    c = mul(dloss, F32(recip(F32(count)))) if count else ZERO  # both binary32 (see model.init_scale)
    if out is None:
        dlogits = np.empty_like(logits)
    else:
        dlogits = check_out("out", out, logits.shape, (logits, targets))
    cross_entropy_backward_kernel(logits, targets, ignore_index, F32(c), dlogits)
    return dlogits
