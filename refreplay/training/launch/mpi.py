"""One process per rank through mpi4py ([fold.ranks.c1]).

Rank q computes the gradients of its micro-batches and reduces them locally
to its maximal aligned blocks.  Ranks 1..R-1 send their blocks to rank 0 with
point-to-point messages (a header with the blocks' (start, size), then one
float32 buffer per block, tensors in sorted name order); rank 0 receives from
rank 1, 2, ... in that order, pushes the blocks after its own, folds, and
sends the folded sum back to every rank.  No MPI reduction is used: MPI
would choose its order.

``refreplay train --launcher mpi --ranks R`` started outside MPI re-runs
itself as ``mpiexec -n R python -m refreplay train ...``; started under
``mpiexec`` (the world size must equal R) it runs as one rank.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from ...errors import InputError, VerificationFailure
from ..arrays import on_host
from ..treefold import Block, fold_blocks, fold_local, rank_ranges

TAG_HEADER, TAG_BLOCK, TAG_RESULT, TAG_CHECK = 11, 12, 13, 14
# Environment variables that MPI process managers set in every rank.
_MPI_ENV = ("REFREPLAY_MPI_CHILD", "PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE")


def _require_mpi4py():
    try:
        from mpi4py import MPI
    except ImportError:
        raise InputError(
            "the mpi launcher needs mpi4py and an MPI library: "
            "pip install 'mpi4py>=4' 'mpich>=4' (the refreplay[mpi] extra)"
        ) from None
    return MPI


def under_mpi() -> bool:
    """True when this process was started by an MPI process manager."""
    return any(v in os.environ for v in _MPI_ENV)


def mpiexec_path() -> str:
    """mpiexec beside this Python (where the mpich wheel puts it), else on PATH."""
    local = Path(sys.executable).parent / "mpiexec"
    if local.exists():
        return str(local)
    found = shutil.which("mpiexec")
    if not found:
        raise InputError("mpiexec not found: pip install 'mpich>=4' (or install an MPI library)")
    return found


def relaunch(ranks: int, argv: list[str]) -> int:
    """Run ``python -m refreplay ARGV`` as ``ranks`` MPI processes; return the
    exit status of mpiexec."""
    _require_mpi4py()
    cmd = [mpiexec_path(), "-n", str(ranks), sys.executable, "-m", "refreplay", *argv]
    env = dict(os.environ, REFREPLAY_MPI_CHILD="1")
    return subprocess.call(cmd, env=env)


def _pack(value: dict) -> np.ndarray:
    """Tensors in sorted name order, each flattened row-major (exact copies)."""
    return np.concatenate([on_host(value[k]).reshape(-1) for k in sorted(value)])


def _unpack(buf: np.ndarray, template: dict) -> dict:
    out, pos = {}, 0
    for k in sorted(template):
        n = template[k].size
        out[k] = buf[pos : pos + n].reshape(template[k].shape).copy()
        pos += n
    return out


class MPILauncher:
    def __init__(self, comm, ranks: int):
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.is_root = self.rank == 0
        if self.size != ranks:
            raise InputError(f"--ranks {ranks} but the MPI world has {self.size} processes")

    @classmethod
    def from_world(cls, ranks: int) -> "MPILauncher":
        MPI = _require_mpi4py()
        return cls(MPI.COMM_WORLD, ranks)

    def fold(self, leaf, m: int, merge=None):
        """[fold.ranks.c1] Local blocks, point-to-point to rank 0, fold there,
        the result sent back to every rank."""
        if self.size > m:
            raise InputError(f"{self.size} ranks but only {m} micro-batches per step")
        a, b = rank_ranges(m, self.size)[self.rank]
        local = fold_local(a, (leaf(i) for i in range(a, b)), merge)
        template = local[0].value
        if not self.is_root:
            self.comm.send([(blk.start, blk.size) for blk in local], dest=0, tag=TAG_HEADER)
            for blk in local:
                self.comm.Send(_pack(blk.value), dest=0, tag=TAG_BLOCK)
            buf = np.empty_like(_pack(template))
            self.comm.Recv(buf, source=0, tag=TAG_RESULT)
            return _unpack(buf, template)
        blocks = list(local)
        width = _pack(template).size
        for q in range(1, self.size):
            header = self.comm.recv(source=q, tag=TAG_HEADER)
            for start, size in header:
                buf = np.empty(width, dtype=np.float32)
                self.comm.Recv(buf, source=q, tag=TAG_BLOCK)
                blocks.append(Block(start, size, _unpack(buf, template)))
        folded = fold_blocks(blocks, merge)
        flat = _pack(folded)
        for q in range(1, self.size):
            self.comm.Send(flat, dest=q, tag=TAG_RESULT)
        return folded

    def share(self, obj):
        """The root's object on every rank (a copy of bytes, not a reduction)."""
        return self.comm.bcast(obj, root=0)

    def same_on_all(self, text: str, what: str) -> None:
        if not self.is_root:
            self.comm.send(text, dest=0, tag=TAG_CHECK)
            ok = self.comm.bcast(None, root=0)
        else:
            bad = []
            for q in range(1, self.size):
                other = self.comm.recv(source=q, tag=TAG_CHECK)
                if other != text:
                    bad.append(f"rank {q}: {other}")
            ok = self.comm.bcast(bad, root=0)
        if ok:
            raise VerificationFailure(f"ranks disagree on {what}: rank 0: {text}; " + "; ".join(ok))

    def abort(self, code: int) -> None:
        """End every rank with exit status ``code``.  MPI_Abort may return
        before the process manager acts, so this process leaves at once
        (no MPI_Finalize, which would wait for the other ranks)."""
        self.comm.Abort(code)
        os._exit(code)

    def close(self) -> None:
        self.comm.Barrier()
