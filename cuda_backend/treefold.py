"""TreeFold on the device: the binary-carry tree of ``spec/22-treefold.txt``,
elementwise; mirrors ``refreplay.training.treefold``.

``fold_rows_k`` gives every element n of the M leaves (rows of an M×N array)
its own thread, which runs the stack algorithm of the spec over m with the
stack in registers (at most 32 entries for M < 2^31): each rank's local stack
([fold.ranks.c1]), the root's stack of the ranks' blocks ([fold.tree.c1]),
then the top-down final fold ([fold.final.c1]).  Threads share nothing, so
the order of every element's additions is exactly the spec's.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from . import shim
from ._jit import device, kernel

DEPTH = 33  # floor(log2 M) + 1 entries at most, M < 2**32


@device
def _push(values, starts, sizes, depth, start, size, value):
    """[fold.tree.c1] Push block [start, start+size) and merge while the two top
    blocks have equal size s and the lower starts at a multiple of 2s (the
    lower, earlier block on the left).  Returns the new depth."""
    values[depth] = value
    starts[depth] = start
    sizes[depth] = size
    depth += 1
    while depth >= 2 and sizes[depth - 2] == sizes[depth - 1] and starts[depth - 2] % (2 * sizes[depth - 2]) == 0:
        values[depth - 2] = shim.add(values[depth - 2], values[depth - 1])
        sizes[depth - 2] = 2 * sizes[depth - 2]
        depth -= 1
    return depth


@kernel("void(float32[:, ::1], int64, float32[::1])")
def fold_rows_k(leaves, ranks, out):
    """[fold.ranks.c1] [fold.tree.c1] [fold.final.c1] out[n] = TreeFold over m of
    leaves[m, n], the M leaves split over ``ranks`` ranks (1 <= R <= M).

    leaves: M×N, out: N (overwritten, unscaled).  One thread per n; grid
    ``blocks(N)``.
    """
    n = cuda.grid(1)
    M, N = leaves.shape
    if n >= N:
        return
    root_v = cuda.local.array(DEPTH, np.float32)
    root_s = cuda.local.array(DEPTH, np.int64)
    root_z = cuda.local.array(DEPTH, np.int64)
    rank_v = cuda.local.array(DEPTH, np.float32)
    rank_s = cuda.local.array(DEPTH, np.int64)
    rank_z = cuda.local.array(DEPTH, np.int64)
    root = 0
    for q in range(ranks):
        a = q * M // ranks
        b = (q + 1) * M // ranks
        local = 0
        for m in range(a, b):  # rank q's leaves, on a stack that starts at a
            local = _push(rank_v, rank_s, rank_z, local, m, 1, leaves[m, n])
        for e in range(local):  # its aligned blocks, earliest first, onto the root's stack
            root = _push(root_v, root_s, root_z, root, rank_s[e], rank_z[e], rank_v[e])
    acc = root_v[root - 1]  # [fold.final.c1] top down, each entry on the left
    for e in range(root - 2, -1, -1):
        acc = shim.add(root_v[e], acc)
    out[n] = acc


@kernel("void(float32[::1], int64, float32[::1])")
def scale_k(x, m, out):
    """[fold.scale.c1] out[n] = mul(x[n], recip(f32(M))).  x, out: N; out overwritten.

    Every thread computes the same r = recip(f32(M)): the one value the spec
    computes once per step.
    """
    n = cuda.grid(1)
    if n < out.size:
        out[n] = shim.mul(x[n], shim.recip(np.float32(m)))
