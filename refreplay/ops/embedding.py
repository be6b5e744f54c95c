"""Token embedding: forward as a row gather, backward as an ordered
scatter-add ([emb.fwd.c1], [emb.bwd.c1]).

Shapes: wte [V, C], tokens [B, T] int32, out / dout [B, T, C].
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .._jit import parallel_kernel
from ..errors import InputError
from ..linalg.common import NEG_ZERO
from ..numerics.core import ZERO, add
from . import check_array, check_f32, check_out, check_shape

# Channels per parallel task in the backward.  Any width gives the same bits:
# each dwte element is touched by exactly one task, always in token order.
_CHANNEL_BLOCK = 64


@parallel_kernel
def embedding_forward_kernel(out, wte, tokens):
    """[emb.fwd.c1] out[b, t, :] = wte[tokens[b, t], :] (an exact copy).

    out: [N, C] with N = B*T (overwritten); wte: [V, C]; tokens: [N] int32,
    already range-checked.  Parallel over tokens (independent outputs).
    """
    N = tokens.shape[0]
    for i in prange(N):
        out[i, :] = wte[tokens[i], :]


@parallel_kernel
def embedding_backward_kernel(dwte, dout, tokens):
    """[emb.bwd.c1] dwte[v, c] = the sum, in increasing flat index i = b*T + t,
    of dout[i, c] over the tokens with tokens[i] = v ([red.sum.c1]).

    dwte: [V, C], overwritten; dout: [N, C]; tokens: [N] int32.
    Rows of ids that occur start at -0 (the start of a non-empty sum), the
    others are +0 (the empty sum) and stay so; then every element receives
    dwte = add(dwte, dout[i, c]) for i = 0, 1, ..., N-1.  The rows are
    initialised in one parallel pass (at V = 50,304 the [V, C] array is most
    of the work when N is small).  The sums run in parallel over blocks of
    channels: a block owns its columns of dwte and walks all tokens in
    increasing i, so every element's sum keeps the clause's order whatever the
    number of threads.
    """
    N, C = dout.shape
    V = dwte.shape[0]
    seen = np.zeros(V, dtype=np.bool_)
    for i in range(N):
        seen[tokens[i]] = True
    for v in prange(V):
        dwte[v, :] = NEG_ZERO if seen[v] else ZERO
    n_blocks = (C + _CHANNEL_BLOCK - 1) // _CHANNEL_BLOCK
    for blk in prange(n_blocks):
        c0 = blk * _CHANNEL_BLOCK
        c1 = min(c0 + _CHANNEL_BLOCK, C)
        for i in range(N):
            dwte_tok = dwte[tokens[i], c0:c1]  # forward: out[i] = wte[tokens[i]]
            dout_i = dout[i, c0:c1]
            for c in range(dwte_tok.shape[0]):
                dwte_tok[c] = add(dwte_tok[c], dout_i[c])


def _check_tokens(tokens, V: int) -> np.ndarray:
    check_array("tokens", tokens, np.int32, 2)
    if tokens.size and (tokens.min() < 0 or tokens.max() >= V):
        bad = tokens[(tokens < 0) | (tokens >= V)][0]
        raise InputError(f"token id {int(bad)} outside the vocabulary [0, {V})")
    return tokens


def embedding_forward(wte: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """[emb.fwd.c1] wte [V, C], tokens [B, T] int32 -> out [B, T, C] (new)."""
    check_f32("wte", wte, 2)
    V, C = wte.shape
    _check_tokens(tokens, V)
    B, T = tokens.shape
    out = np.empty((B * T, C), dtype=np.float32)
    embedding_forward_kernel(out, wte, tokens.reshape(-1))
    return out.reshape(B, T, C)


def embedding_backward(dout: np.ndarray, tokens: np.ndarray, V: int, out=None) -> np.ndarray:
    """[emb.bwd.c1] dout [B, T, C], tokens [B, T] int32 -> dwte [V, C] (new,
    or ``out``: a float32 [V, C] C-contiguous array that overlaps no input,
    whose old contents never matter: the kernel sets every row to its sum's
    start, -0 or +0, before it accumulates, exactly as into a new array).

    A tied weight's two gradient contributions (embedding and output
    projection) are separate results; the model adds them as its spec says.
    """
    check_f32("dout", dout, 3)
    if isinstance(V, bool) or not isinstance(V, (int, np.integer)) or V < 1:
        raise ValueError(f"V must be a positive integer, got {V!r}")
    V = int(V)
    _check_tokens(tokens, V)
    B, T, C = dout.shape
    check_shape("tokens", tokens, (B, T))
    if out is None:
        dwte = np.empty((V, C), dtype=np.float32)
    else:
        dwte = check_out("out", out, (V, C), (dout, tokens))
    embedding_backward_kernel(dwte, dout.reshape(B * T, C), tokens.reshape(-1))
    return dwte
