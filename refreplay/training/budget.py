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


def available_memory(meminfo: str = "/proc/meminfo") -> int | None:
    """The machine's available memory in bytes (``MemAvailable`` of
    /proc/meminfo: free memory plus what the kernel can reclaim without
    swapping); None where the system has no such file."""
    try:
        with open(meminfo, "rb") as f:
            text = f.read(1 << 16).decode("ascii", "replace")
    except OSError:
        return None
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "MemAvailable:" and parts[1].isdigit():
            return int(parts[1]) * (1 << 10 if parts[2:3] == ["kB"] else 1)
    return None


def _gib(x: int) -> str:
    return f"{x / GIB:.2f} GiB"


def plan(
    peak_ram: int,
    peak_mapped: int,
    limit: int | None,
    available: int | None,
    what: str = "a step of this recipe",
    override: str = "--no-memory-check",
) -> "Memory":
    """The memory plan of a step, decided from the predicted peaks before
    anything is allocated, or an ``InputError`` naming the figure, the limit
    and the override when the step cannot fit.

    No ``limit`` (no --max-memory): every tensor in RAM, which must fit the
    ``available`` memory.  A ``limit``: in RAM when the step fits it, else
    state and gradients in mapped files; either way the process's own
    memory (``peak_ram`` or ``peak_mapped``) must fit ``available``.
    ``available`` None: no check (the caller's explicit opt-in, or no
    /proc/meminfo)."""
    if limit is None:
        need, mapped = peak_ram, False
        if available is not None and need > available:
            raise InputError(
                f"{what} needs {_gib(need)} of memory with every tensor in RAM, but this machine has "
                f"{_gib(available)} available (MemAvailable); pass --max-memory GIB to keep state and "
                f"gradients in memory-mapped files (about {_gib(peak_mapped)} of memory then, plus disk "
                f"space under $TMPDIR), or {override} to run anyway"
            )
        return Memory(False)
    mapped = peak_ram > limit
    need = peak_mapped if mapped else peak_ram
    if available is not None and need > available:
        how = "with state and gradients in mapped files" if mapped else "with every tensor in RAM"
        raise InputError(
            f"{what} needs {_gib(need)} of memory {how} (--max-memory {_gib(limit)}), but this "
            f"machine has {_gib(available)} available (MemAvailable); "
            + ("a lower --max-memory maps the state to files; " if not mapped else "")
            + f"{override} runs anyway"
        )
    return Memory(mapped)


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
