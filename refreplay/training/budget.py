"""Replay within a memory budget: where a step's large tensors live.

A step of a 1.5 B-parameter model holds the state (parameters and two AdamW
moments, 12 bytes a parameter), its updated copy, and up to floor(log2 M)+2
gradient sets of TreeFold ([fold.memory.r1]) at once: far more than an
ordinary machine's memory.  Under ``--max-memory`` those tensors are kept in
memory-mapped files instead (unlinked temporary files, so nothing is left
behind), the checkpoint is mapped rather than read, and each tensor's pages
are handed back to the kernel once it has been written.  The process's own
(anonymous) memory then holds one micro-batch's activations and a few
tensors; mapped pages are page cache, which the kernel writes back and drops
under pressure.

Only where the bytes live changes: every kernel sees the same values in the
same order, so no bit depends on the budget (tests compare the hashes).
"""
from __future__ import annotations

import mmap
import os
import tempfile

import numpy as np

from ..errors import InputError

GIB = 1 << 30
MIN_MAPPED = 1 << 16  # bytes: smaller tensors stay in RAM (file handles are not free)


def parse_gib(value) -> int:
    """Bytes of a ``--max-memory`` value in GiB (a positive number)."""
    try:
        gib = float(value)
    except (TypeError, ValueError):
        raise InputError(f"--max-memory must be a number of GiB, got {value!r}") from None
    if not 0 < gib < 1 << 20:
        raise InputError(f"--max-memory must be a positive number of GiB below 2^20, got {value!r}")
    return int(gib * GIB)


class Memory:
    """Allocation policy of a step.  ``mapped`` False: plain NumPy arrays
    (the default, no overhead).  True: tensors of at least ``min_bytes`` are
    copied into memory-mapped files under ``directory``."""

    def __init__(self, mapped: bool = False, directory=None, min_bytes: int = MIN_MAPPED):
        self.mapped = mapped
        self.min_bytes = min_bytes
        self.directory = directory
        self.files = 0  # tensors placed in files so far (reported by benchmarks)

    @classmethod
    def for_budget(cls, limit_bytes: int | None, needed_in_ram: int, directory=None) -> "Memory":
        """Map tensors to files when a step held in RAM would need more than
        the budget (``needed_in_ram`` from ``estimate.peak_memory``)."""
        return cls(limit_bytes is not None and needed_in_ram > limit_bytes, directory)

    def keep(self, a: np.ndarray) -> np.ndarray:
        """A copy of ``a`` (same dtype, shape and bytes), in a mapped file when
        the policy says so; its pages are released after the copy."""
        if not self.mapped or a.nbytes < self.min_bytes:
            return a.copy()
        out = self._file_array(a.shape, a.dtype)
        out[...] = a
        release(out)
        return out.view(np.ndarray)  # a plain ndarray over the mapping, as kernels expect

    def zeros(self, shape, dtype) -> np.ndarray:
        """A new array of +0 bits: a mapped file (zero-filled by the kernel,
        no page written) when the policy says so."""
        a = np.zeros(0, dtype)
        if not self.mapped or int(np.prod(shape)) * a.itemsize < self.min_bytes:
            return np.zeros(shape, dtype)
        return self._file_array(tuple(shape), dtype).view(np.ndarray)

    def keep_dict(self, d: dict) -> dict:
        return {k: self.keep(d[k]) for k in sorted(d)}

    def _file_array(self, shape, dtype) -> np.ndarray:
        fd, path = tempfile.mkstemp(prefix="refreplay-", suffix=".tensor", dir=self.directory)
        try:
            os.close(fd)
            arr = np.memmap(path, dtype=dtype, mode="w+", shape=shape)
        finally:
            os.unlink(path)  # the mapping keeps the data; the disk space goes with it
        self.files += 1
        return arr


def release(a) -> None:
    """Hand the resident pages of a mapped array back to the kernel (the data
    stays in its file, so the next read faults it back in); a no-op for
    arrays in RAM."""
    base = a
    while base is not None and not isinstance(base, mmap.mmap):
        base = getattr(base, "base", None)
    if base is not None and hasattr(base, "madvise"):
        base.madvise(mmap.MADV_DONTNEED)


class SpillingDict(dict):
    """A dict whose large array values are moved into mapped files as they are
    stored: the gradients of a micro-batch, written by the backward pass one
    tensor at a time, never all sit in RAM together."""

    def __init__(self, memory: Memory):
        super().__init__()
        self.memory = memory

    def __setitem__(self, key, value):
        super().__setitem__(key, self.memory.keep(value) if isinstance(value, np.ndarray) else value)
