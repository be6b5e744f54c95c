"""Launchers: how the R ranks of a training step are run.

A launcher owns the ranks' share of a step ([data.batch.c1]) and carries out
the TreeFold between them ([fold.ranks.c1]).  Every launcher offers:

    rank, size, is_root      this process's rank, the rank count, rank == 0
    fold(leaf, M)            evaluate leaf(m) for this process's micro-batches
                             and return the folded sum of all M (every rank
                             receives the same bits)
    share(obj)               the root's Python object, on every rank
    same_on_all(text, what)  refuse to continue unless every rank holds the
                             same text (state roots: a rank that diverged is
                             a bug, never a silent fork)

``inproc`` simulates R ranks in one process (the embedded default);
``mpi`` runs one process per rank through mpi4py, with point-to-point
messages only -- never an MPI reduction, whose order MPI would choose.
"""

from __future__ import annotations

from ...errors import InputError

LAUNCHERS = ("inproc", "mpi")


def get(name: str, ranks: int):
    """The launcher ``name`` for ``ranks`` ranks."""
    if name == "inproc":
        from .inproc import InProcess

        return InProcess(ranks)
    if name == "mpi":
        from .mpi import MPILauncher

        return MPILauncher.from_world(ranks)
    raise InputError(f"unknown launcher {name!r}; choose one of {', '.join(LAUNCHERS)}")
