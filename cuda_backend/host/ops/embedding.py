"""Token embedding (spec chapter 10), as ``refreplay.ops.embedding``."""

from __future__ import annotations

import numpy as np
from numba import cuda

from ...ops import embedding as EMB
from .._common import THREADS, _dev, _ret, blocks, device_aware


def _tokens(tokens, V):
    from refreplay.errors import InputError
    from refreplay.ops import check_array  # host only: the ids are checked here

    check_array("tokens", tokens, np.int32, 2)
    if tokens.size and (tokens.min() < 0 or tokens.max() >= V):
        bad = tokens[(tokens < 0) | (tokens >= V)][0]
        raise InputError(f"token id {int(bad)} outside the vocabulary [0, {V})")
    return tokens


@device_aware
def embedding_forward(wte, tokens):
    """[emb.fwd.c1] wte [V, C], tokens [B, T] int32 -> out [B, T, C]."""
    from .._common import check_f32

    check_f32("wte", wte, 2)
    V, C = wte.shape
    B, T = _tokens(tokens, V).shape
    out = cuda.device_array((B * T, C), np.float32)
    if out.size:
        EMB.embedding_forward_k[blocks(out.size), THREADS](out, _dev(wte), _dev(tokens.reshape(-1)))
    return _ret(out).reshape(B, T, C)


@device_aware
def embedding_backward(dout, tokens, V):
    """[emb.bwd.c1] dout [B, T, C], tokens [B, T] int32 -> dwte [V, C] (ordered scatter-add)."""
    from .._common import check_f32, check_shape

    check_f32("dout", dout, 3)
    if isinstance(V, bool) or not isinstance(V, (int, np.integer)) or V < 1:
        raise ValueError(f"V must be a positive integer, got {V!r}")
    V = int(V)
    B, T, C = dout.shape
    _tokens(tokens, V)
    check_shape("tokens", tokens, (B, T))
    dwte = cuda.device_array((V, C), np.float32)
    seen = cuda.device_array(V, np.uint8)
    if dwte.size:
        EMB.embedding_backward_init_k[blocks(dwte.size), THREADS](dwte, seen)
        if B * T:
            EMB.embedding_backward_k[blocks(C), THREADS](
                dwte, _dev(dout.reshape(B * T, C)), _dev(tokens.reshape(-1)), seen
            )
        EMB.embedding_backward_unseen_k[blocks(dwte.size), THREADS](dwte, seen)
    return _ret(dwte)
