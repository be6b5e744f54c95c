"""TreeFold: the fixed combination tree of a step's micro-batch gradients.

The M micro-batch gradients of a step (leaves, in global sample order) are
combined by the binary-carry tree of ``spec/22-treefold.txt``:

* [fold.tree.c1]   push each leaf; while the two top entries are equal-size
  blocks and the lower one is aligned to twice that size, merge them with the
  earlier block on the left;
* [fold.final.c1]  at the end fold the stack from the top down, each stack
  entry on the left of the running value;
* [fold.ranks.c1]  a rank holding micro-batches [a, b) pushes the maximal
  aligned power-of-two blocks of its range, so any rank count gives the same
  bits;
* [fold.scale.c1]  the folded sum is multiplied by recip(M).

A leaf is either one float32 array or a flat dict of named float32 arrays
(a model's gradients); a merge adds elementwise, name by name.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import prange

from .._jit import kernel, parallel_kernel
from ..numerics import elementwise
from ..numerics.core import F32, finish, recip


# ---- elementwise kernels ------------------------------------------------------


@kernel
def _scale_loop(x, s, out):
    """out[N] = x[N] * s elementwise ([num.mul.c1]); out overwritten."""
    for i in range(out.size):
        out[i] = finish(x[i] * s)


@parallel_kernel
def _scale_blocks(x, s, out):
    """_scale_loop in parallel over the blocks of elementwise.BLOCK elements."""
    for k in prange(elementwise.n_blocks(out.size)):
        i0, i1 = elementwise.block_range(k, out.size)
        _scale_loop(x[i0:i1], s, out[i0:i1])


def _check_f32(a, what):
    if not isinstance(a, np.ndarray) or a.dtype != np.float32:
        raise TypeError(f"{what}: expected a float32 ndarray, got {getattr(a, 'dtype', type(a).__name__)}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{what}: expected a C-contiguous array")


def _add_arrays(left, right, what):
    _check_f32(left, what)
    _check_f32(right, what)
    if left.shape != right.shape:
        raise ValueError(f"{what}: shapes differ, {left.shape} vs {right.shape}")
    return elementwise.add(left, right)  # [num.add.c1], element by element


def merge(left, right):
    """[fold.leaves.c1] [fold.tree.c1] One tree node: ``add(left, right)`` elementwise, the
    earlier block's value as the left operand.  Dicts are merged name by name
    and must have the same names; a new value is returned, inputs are kept."""
    if isinstance(left, dict):
        if not isinstance(right, dict) or sorted(left) != sorted(right):
            raise ValueError("merge: leaves must have the same tensor names")
        return {k: _add_arrays(left[k], right[k], f"merge[{k}]") for k in sorted(left)}
    return _add_arrays(left, right, "merge")


def merge_into(left, right):
    """[fold.leaves.c1] [fold.tree.c1] ``merge`` written into ``left``
    (returned): the same ``add(left, right)`` element by element, the earlier
    block on the left, so the same bits, and no new array.  For a fold whose
    left operand is dead after its node (the trainer's, whose leaves are the
    model's new gradient sets): every value on a FoldStack is consumed by
    exactly one node."""
    if isinstance(left, dict):
        if not isinstance(right, dict) or sorted(left) != sorted(right):
            raise ValueError("merge: leaves must have the same tensor names")
        for k in sorted(left):
            _add_arrays_into(left[k], right[k], f"merge[{k}]")
        return left
    return _add_arrays_into(left, right, "merge")


def _add_arrays_into(left, right, what):
    _check_f32(left, what)
    _check_f32(right, what)
    if left.shape != right.shape:
        raise ValueError(f"{what}: shapes differ, {left.shape} vs {right.shape}")
    return elementwise.add_into(left, right)  # [num.add.c1], element by element


def scale(value, m: int):
    """[fold.scale.c1] The step's mean gradient: every element of the folded
    sum times recip(f32(M)); the reciprocal is computed once per step."""
    if not isinstance(m, (int, np.integer)) or m < 1:
        raise ValueError(f"scale: micro-batch count must be a positive integer, got {m!r}")
    r = np.float32(recip(F32(m)))
    if isinstance(value, dict):
        return {k: scale(value[k], m) for k in sorted(value)}
    _check_f32(value, "scale")
    out = np.empty_like(value)
    elementwise.run_elementwise(_scale_loop, _scale_blocks, out.size, value.reshape(-1), r, out.reshape(-1))
    return out


# ---- the binary-carry stack -----------------------------------------------------


@dataclass
class Block:
    """The combined value of micro-batches [start, start + size)."""

    start: int
    size: int
    value: object


class FoldStack:
    """The binary-carry stack of [fold.tree.c1].

    ``push`` takes the block that begins where the previous one ended (a leaf
    has size 1).  Blocks on the stack are merged while the two top entries
    have equal size s and the lower one starts at a multiple of 2s; the merged
    block keeps the lower start.  ``depth_max`` records the most entries ever
    held at once (the accumulator count of [fold.memory.r1]).
    """

    def __init__(self, start: int = 0, node=None):
        if start < 0:
            raise ValueError("FoldStack: start must be >= 0")
        self.node = node or merge  # a tree node; a device's twin of ``merge`` gives the same bits
        self.start = start
        self.end = start
        self.entries: list[Block] = []
        self.depth_max = 0

    def push(self, value, size: int = 1) -> None:
        if size < 1 or size & (size - 1) or self.end % size:
            raise ValueError(
                f"FoldStack.push: a block of size {size} at {self.end} is not an aligned power-of-two block"
            )
        self.entries.append(Block(self.end, size, value))
        self.end += size
        self.depth_max = max(self.depth_max, len(self.entries))
        while len(self.entries) >= 2:
            lower, upper = self.entries[-2], self.entries[-1]
            if lower.size != upper.size or lower.start % (2 * lower.size):
                break
            self.entries[-2:] = [Block(lower.start, 2 * lower.size, self.node(lower.value, upper.value))]

    def blocks(self) -> list[Block]:
        """The stack, bottom (earliest) first: for a rank, its aligned blocks."""
        return list(self.entries)

    def result(self):
        """[fold.final.c1] Fold the stack from the top down: the running value
        starts as the top entry; each entry below is added on its left."""
        if not self.entries:
            raise ValueError("FoldStack.result: no leaves were pushed")
        acc = self.entries[-1].value
        for block in reversed(self.entries[:-1]):
            acc = self.node(block.value, acc)
        return acc


def treefold(leaves):
    """[fold.tree.c1] [fold.final.c1] Fold a sequence of M leaves (global
    order) on one device; at most floor(log2 M) + 1 entries are held."""
    stack = FoldStack()
    for leaf in leaves:
        stack.push(leaf)
    return stack.result()


# ---- ranks ----------------------------------------------------------------------


def rank_ranges(m: int, r: int) -> list[tuple[int, int]]:
    """[fold.ranks.c1] Rank q of R holds micro-batches [floor(q*M/R), floor((q+1)*M/R))."""
    if not (isinstance(m, (int, np.integer)) and isinstance(r, (int, np.integer))):
        raise TypeError("rank_ranges: M and R must be integers")
    if r < 1 or m < r:
        raise ValueError(f"rank_ranges: need 1 <= R <= M, got R={r}, M={m}")
    return [(q * m // r, (q + 1) * m // r) for q in range(r)]


def aligned_blocks(a: int, b: int) -> list[tuple[int, int]]:
    """[fold.ranks.c1] The maximal aligned power-of-two blocks of [a, b), in
    order, as (start, size): from a, the largest 2**k with a % 2**k == 0 and
    a + 2**k <= b, then repeat from a + 2**k."""
    if not 0 <= a <= b:
        raise ValueError(f"aligned_blocks: bad range [{a}, {b})")
    out = []
    while a < b:
        size = 1
        while a % (2 * size) == 0 and a + 2 * size <= b:
            size *= 2
        out.append((a, size))
        a += size
    return out


def fold_local(start: int, leaves, merge=None) -> list[Block]:
    """[fold.ranks.c1] A rank's share: push its leaves (micro-batches start,
    start+1, ...) and return the stack, which holds exactly the maximal
    aligned blocks of its range.  ``merge`` is the tree node ([fold.tree.c1]):
    this module's ``merge`` unless a device's twin is given."""
    stack = FoldStack(start, merge)
    for leaf in leaves:
        stack.push(leaf)
    return stack.blocks()


def fold_blocks(blocks_in_rank_order, merge=None) -> object:
    """[fold.ranks.c1] The root's share: push every rank's blocks, rank 0
    first, each rank's bottom (earliest) first, then [fold.final.c1]."""
    stack = FoldStack(node=merge)
    for block in blocks_in_rank_order:
        if block.start != stack.end:
            raise ValueError(
                f"fold_blocks: block at {block.start} does not follow the previous one (ending at {stack.end})"
            )
        stack.push(block.value, block.size)
    return stack.result()


def fold_rows(leaves: np.ndarray, ranks: int = 1) -> np.ndarray:
    """TreeFold of the M rows of an (M, N) float32 array split over R ranks
    by [fold.ranks.c1]; returns the (N,) sum (unscaled).  The result does not
    depend on R."""
    _check_f32(leaves, "fold_rows")
    if leaves.ndim != 2:
        raise ValueError(f"fold_rows: expected shape (M, N), got {leaves.shape}")
    blocks = []
    for a, b in rank_ranges(leaves.shape[0], ranks):
        blocks += fold_local(a, [leaves[i].copy() for i in range(a, b)])
    return fold_blocks(blocks)


__all__ = [
    "merge",
    "scale",
    "Block",
    "FoldStack",
    "treefold",
    "rank_ranges",
    "aligned_blocks",
    "fold_local",
    "fold_blocks",
    "fold_rows",
]
