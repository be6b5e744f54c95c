"""The one way cuda_backend compiles device code.

``device`` and ``kernel`` are ``numba.cuda.jit`` with nothing that could change
bits: never ``fastmath`` (on numba-cuda it switches on flush-to-zero, fused
multiply-add and approximate division and square root).  Kernels are compiled
lazily, at their first launch, so importing this package needs no GPU.

``kernel(*signatures)`` also records the kernel and the argument types it is
launched with in ``KERNELS``: the static PTX audit (``ptx_audit.py``) compiles
every recorded signature for several compute capabilities and rejects any
fused, flushed or approximate instruction.

``SIMULATOR`` is true under ``NUMBA_ENABLE_CUDASIM=1`` (read by numba-cuda
when ``numba.cuda`` is first imported); the shim then swaps the libdevice
intrinsics, which the simulator leaves as stubs returning None, for plain
float32 arithmetic.
"""

from __future__ import annotations

from typing import NamedTuple

from numba import cuda
from numba.cuda.core import config
from numba.cuda.extending import register_jitable

SIMULATOR = bool(config.ENABLE_CUDASIM)

THREADS = 128  # threads per block of the 1-D elementwise and row kernels


class Kernel(NamedTuple):
    name: str  # module.function, as the audit reports it
    pyfunc: object  # the undecorated Python function
    signatures: tuple  # numba signature strings the kernel is launched with


KERNELS: list[Kernel] = []


def _check(kw):
    if "fastmath" in kw:
        raise ValueError("cuda_backend never uses fastmath")


def device(fn):
    """A device function, compiled into each kernel that calls it.

    ``register_jitable`` rather than ``cuda.jit(device=True)``: the latter
    asks the driver for the current device's compute capability when first
    called, so no kernel calling it could be compiled without a GPU (the PTX
    audit), and it is compiled once for whatever device that is.  A jitable is
    compiled with its caller, for the caller's compute capability; in the
    simulator it stays a plain Python function.
    """
    return register_jitable(fn)


def kernel(*signatures):
    """A kernel, lazily compiled, whose launch signatures the PTX audit checks."""
    if not signatures:
        raise ValueError("a kernel declares the signatures the PTX audit compiles")

    def deco(fn):
        KERNELS.append(Kernel(f"{fn.__module__}.{fn.__name__}", fn, tuple(signatures)))
        return cuda.jit(fn)

    return deco


def blocks(n, threads=THREADS):
    """Blocks of ``threads`` needed to give each of n outputs one thread (at least one block)."""
    return max(1, (n + threads - 1) // threads)
