"""Scratch buffers of the reference trainer, reused across micro-batches and
steps (issue #32: a fresh 154 MB gradient array per micro-batch costs its
page faults every time; the reused one costs them once).

A buffer holds only a value of one micro-batch's pass (``Model.loss_and_grads``,
forward then backward) that is consumed before the pass returns: a
temporary of the backward (the loss gradient [N, V], the head's activation
gradient, the two halves of a tied weight's gradient before their sum) or
an activation the forward keeps for that backward (the logits, each
layer's attention probabilities [B, NH, T, T]).  Nothing that escapes a
pass (a parameter gradient handed to the TreeFold, the loss) is ever a
workspace buffer, and passes on one model never overlap.
Every op that writes one overwrites all of its elements, so no bit depends
on what it held before ([emb.bwd.c1] sets each row to its sum's start
itself, where a new array was never zeroed either).
"""

from __future__ import annotations

import numpy as np


class Workspace:
    """Buffers by name: ``get(name, shape)`` returns the same C-contiguous
    float32 array for the same name and shape; a new shape for a name
    replaces that name's buffer (so memory is bounded by one buffer a name)."""

    def __init__(self):
        self._bufs: dict[str, np.ndarray] = {}
        self.allocations = 0  # buffers made so far (tests count them)

    def get(self, name: str, shape: tuple, dtype=np.float32) -> np.ndarray:
        shape = tuple(int(s) for s in shape)
        dtype = np.dtype(dtype)
        buf = self._bufs.get(name)
        if buf is None or buf.shape != shape or buf.dtype != dtype:
            buf = np.empty(shape, dtype=dtype)
            self._bufs[name] = buf
            self.allocations += 1
        return buf

    def nbytes(self) -> int:
        return sum(b.nbytes for b in self._bufs.values())

    def clear(self) -> None:
        self._bufs.clear()
