"""Token embedding on the device: forward as a row gather, backward as an
ordered scatter-add; mirrors ``refreplay.ops.embedding`` ([emb.fwd.c1],
[emb.bwd.c1]).

Shapes: wte, dwte [V, C]; tokens [N] int32 (N = B*T, flat order, ids already
range-checked); out, dout [N, C].  No atomics: in the backward each channel
c has one thread that walks the tokens in increasing i, so every element of
dwte receives its additions in the order of the clause.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .. import shim
from .._jit import kernel
from ..linalg import NEG_ZERO

_M = "float32[:, ::1]"


@kernel(f"void({_M}, {_M}, int32[::1])")
def embedding_forward_k(out, wte, tokens):
    """[emb.fwd.c1] out[i, c] = wte[tokens[i], c], an exact copy.  One thread
    per element, grid ``blocks(N*C)``; out overwritten."""
    t = cuda.grid(1)
    N, C = out.shape
    if t < N * C:
        i = t // C
        c = t - i * C
        out[i, c] = wte[tokens[i], c]


@kernel(f"void({_M}, uint8[::1])")
def embedding_backward_init_k(dwte, seen):
    """[emb.bwd.c1] dwte[v, c] = -0 (the start of a non-empty sum); seen[v] = 0.
    One thread per element of dwte, grid ``blocks(V*C)``."""
    t = cuda.grid(1)
    V, C = dwte.shape
    if t < V * C:
        v = t // C
        dwte[v, t - v * C] = NEG_ZERO
        if t - v * C == 0:
            seen[v] = 0


@kernel(f"void({_M}, {_M}, int32[::1], uint8[::1])")
def embedding_backward_k(dwte, dout, tokens, seen):
    """[emb.bwd.c1] for i = 0, 1, ..., N-1: dwte[tokens[i], c] = add(dwte[tokens[i], c], dout[i, c]).

    One thread per channel c (grid ``blocks(C)``), which owns column c of dwte;
    thread 0 also marks seen[tokens[i]] = 1.
    """
    c = cuda.grid(1)
    N, C = dout.shape
    if c < C:
        for i in range(N):
            v = tokens[i]  # forward: out[i] = wte[v]
            dwte[v, c] = shim.add(dwte[v, c], dout[i, c])
            if c == 0:
                seen[v] = 1


@kernel(f"void({_M}, uint8[::1])")
def embedding_backward_unseen_k(dwte, seen):
    """[emb.bwd.c1] rows of ids that never occur become +0 (the empty sum).
    One thread per element of dwte, grid ``blocks(V*C)``."""
    t = cuda.grid(1)
    V, C = dwte.shape
    if t < V * C:
        v = t // C
        if seen[v] == 0:
            dwte[v, t - v * C] = np.float32(0.0)
