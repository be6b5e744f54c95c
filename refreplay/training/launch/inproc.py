"""R simulated ranks in one process ([fold.ranks.c1]).

Rank q evaluates its micro-batches [floor(qM/R), floor((q+1)M/R)) in order and
keeps only its aligned blocks; the root then pushes every rank's blocks in
rank order.  The arithmetic is exactly that of R real processes, so a test
with R = 1, 2, 3, 4, 8 here proves the bits do not depend on the rank count.
"""

from __future__ import annotations

from ...errors import InputError
from ..treefold import fold_blocks, fold_local, rank_ranges


class InProcess:
    rank = 0
    is_root = True

    def __init__(self, ranks: int):
        if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
            raise InputError(f"--ranks must be a positive integer, got {ranks!r}")
        self.size = ranks

    def fold(self, leaf, m: int, merge=None):
        """[fold.ranks.c1] Every rank's blocks (rank 0 first), then the root's fold."""
        if self.size > m:
            raise InputError(f"{self.size} ranks but only {m} micro-batches per step: every rank needs at least one")
        blocks = []
        for a, b in rank_ranges(m, self.size):
            blocks += fold_local(a, (leaf(i) for i in range(a, b)), merge)
        return fold_blocks(blocks, merge)

    def share(self, obj):
        return obj

    def same_on_all(self, text: str, what: str) -> None:
        return None

    def close(self) -> None:
        return None
