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

``Spares`` is the other kind of reuse: a parameter gradient does escape its
pass (into the TreeFold), and the arrays reused are the dead ones the
trainer hands back after the fold has consumed them.
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


class Spares:
    """Dead gradient arrays kept for the next micro-batch's backward to write
    into, by parameter name (issue #32: the tied embedding's gradient was a
    new 154 MB array for every micro-batch, and on a fresh host the first
    touch of new memory cost 0.18 s a call, 1.4 s of a gpt2-124m step).

    The trainer ``give``s a gradient set once no one can read it again: the
    right operand of a TreeFold node written into its left (every value on
    a FoldStack is consumed by exactly one node), and the folded sum once it
    is scaled.  The model ``take``s an array for a gradient it is about to
    compute whole (an op that overwrites every element, so no bit depends on
    what the array held).  Only ``names`` are kept, at most ``cap`` arrays a
    name, and only arrays that own their memory (a view into a received
    buffer would keep all of it alive)."""

    def __init__(self, names, cap: int):
        if cap < 0:
            raise ValueError(f"Spares: cap must be >= 0, got {cap}")
        self.names = tuple(sorted(names))
        self.cap = int(cap)
        self._kept: dict[str, list[np.ndarray]] = {k: [] for k in self.names}
        self.taken = 0  # arrays handed out so far (tests count them)

    def give(self, grads: dict) -> None:
        for name in self.names:
            a = grads.get(name)
            kept = self._kept[name]
            if (
                isinstance(a, np.ndarray)
                and a.dtype == np.float32
                and a.flags.owndata
                and a.flags.c_contiguous
                and a.flags.writeable
                and len(kept) < self.cap
                and all(a is not b for b in kept)
            ):
                kept.append(a)

    def take(self, name: str, shape: tuple) -> np.ndarray | None:
        """A kept array of ``shape`` for ``name``, removed from the pool; None if there is none."""
        kept = self._kept.get(name, [])
        for i, a in enumerate(kept):
            if a.shape == tuple(shape):
                self.taken += 1
                return kept.pop(i)
        return None

    def nbytes(self) -> int:
        return sum(a.nbytes for kept in self._kept.values() for a in kept)

    def clear(self) -> None:
        for kept in self._kept.values():
            kept.clear()
