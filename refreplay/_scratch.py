"""Scratch arrays kept between calls, one set per Python thread.

A compiled kernel that allocates its working arrays on every call pays a
page fault per 4 KiB of them wherever the allocator maps them anew (a
fresh process, or after glibc trims its heap): about 2 us each on a KVM
host, which made a 384^3 matmul run at half its speed and cost attention's
backward a quarter of its time (benchmarks/README.md, session 28).  The
Python APIs pass such kernels a scratch from here instead.  No bit depends
on a scratch: every kernel overwrites what it reads of one.

A thread keeps one array per name, starting on a cache line (``aligned``)
and grown to the largest size asked for up to ``MAX_FLOATS``; a larger
request gets an empty array (the kernel then allocates its own).
``release()`` frees the calling thread's arrays.
"""

from __future__ import annotations

import threading

import numpy as np

MAX_FLOATS = 1 << 24  # per name and thread (64 MiB)
ALIGN = 64  # bytes: a cache line, and one 16-lane vector of float32
_local = threading.local()


def get(name: str, n: int) -> np.ndarray:
    """A float32 array of at least ``n`` elements for ``name``, this
    thread's own (what it holds is left from earlier calls); an empty
    array where n exceeds MAX_FLOATS."""
    bufs = _bufs()
    buf = bufs.get(name)
    if buf is None or buf.shape[0] < n:
        if n > MAX_FLOATS:
            return np.empty(0, np.float32)
        buf = bufs[name] = aligned(max(int(n), 1))
    return buf


def aligned(n: int) -> np.ndarray:
    """A new float32 array of n elements that starts on an ALIGN-byte
    boundary.  NumPy's own start 16 bytes past one (malloc's header), so
    every 16-lane vector that a kernel loads from a pack in it straddled
    two cache lines: attention's heads ran 3-6 % slower in such a scratch
    than in the arrays Numba allocates (32- or 64-byte aligned)."""
    raw = np.empty(n + ALIGN // 4, np.float32)
    skip = (-raw.ctypes.data % ALIGN) // 4
    return raw[skip : skip + n]


def held(name: str):
    """The array this thread keeps for ``name`` (None if none)."""
    return _bufs().get(name)


def release() -> None:
    """Free the scratch arrays of the calling thread."""
    _bufs().clear()


def _bufs() -> dict:
    bufs = getattr(_local, "bufs", None)
    if bufs is None:
        bufs = _local.bufs = {}
    return bufs
