"""Cross-entropy from logits with an ignore index, on the device; mirrors
``refreplay.ops.loss`` ([loss.token.c1], [loss.mean.c1], [loss.bwd.c1]).

Shapes: logits, dlogits [N, V]; targets [N] int32; losses [N].  One thread
per row (grid ``blocks(N)``) for the per-token losses and the gradient; the
mean over counted tokens is one sequential sum in increasing n, run by one
thread.  m, s and log(s) are those of the softmax row ([softmax.fwd.c1]).
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .. import shim
from .._jit import kernel
from ..linalg import NEG_INF, NEG_ZERO
from ..transcendental import exp, log

ZERO = np.float32(0.0)
ONE = np.float32(1.0)
_M = "float32[:, ::1]"


@kernel(f"void({_M}, int32[::1], int32, float32[::1])")
def cross_entropy_k(logits, targets, ignore_index, losses):
    """[loss.token.c1] losses[n] = log(s) - (x[y] - m) for a counted row
    (m = max from -inf, s = sum of exp(x[j] - m) from -0, j increasing);
    +0 where targets[n] is the ignore index.  losses overwritten."""
    n = cuda.grid(1)
    N, V = logits.shape
    if n >= N:
        return
    y = targets[n]
    if y == ignore_index:
        losses[n] = ZERO
        return
    m = NEG_INF
    for j in range(V):
        m = shim.fmax(m, logits[n, j])
    s = NEG_ZERO
    for j in range(V):
        s = shim.add(s, exp(shim.sub(logits[n, j], m)))
    losses[n] = shim.sub(log(s), shim.sub(logits[n, y], m))


@kernel("void(float32[::1], int32[::1], int32, float32[::1], int64[::1])")
def masked_mean_k(losses, targets, ignore_index, mean, count):
    """[loss.mean.c1] mean[0] = (sum of losses[n] over counted n, increasing, from
    +0 as the reference) * recip(f32(count)); count[0] = counted tokens;
    mean +0 when none.  One thread (grid 1 x 1)."""
    if cuda.grid(1) != 0:
        return
    total = ZERO
    c = 0
    for n in range(losses.size):
        if targets[n] != ignore_index:
            total = shim.add(total, losses[n])
            c += 1
    mean[0] = shim.mul(total, shim.recip(np.float32(c))) if c > 0 else ZERO
    count[0] = c


@kernel(f"void({_M}, int32[::1], int32, float32, {_M})")
def cross_entropy_backward_k(logits, targets, ignore_index, c, dlogits):
    """[loss.bwd.c1] counted row: g = softmax(logits[n]); g[y] = g[y] - 1;
    dlogits[n, j] = g[j] * c.  Ignored row: +0.  dlogits overwritten."""
    n = cuda.grid(1)
    N, V = logits.shape
    if n >= N:
        return
    y = targets[n]
    if y == ignore_index:
        for j in range(V):
            dlogits[n, j] = ZERO
        return
    m = NEG_INF
    for j in range(V):
        m = shim.fmax(m, logits[n, j])
    s = NEG_ZERO
    for j in range(V):
        e = exp(shim.sub(logits[n, j], m))
        dlogits[n, j] = e
        s = shim.add(s, e)
    r = shim.recip(s)
    for j in range(V):
        dlogits[n, j] = shim.mul(dlogits[n, j], r)
    dlogits[n, y] = shim.sub(dlogits[n, y], ONE)
    for j in range(V):
        dlogits[n, j] = shim.mul(dlogits[n, j], c)
