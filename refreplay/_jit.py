"""The one way refreplay compiles code.

``kernel`` is ``numba.njit`` with the on-disk cache on and nothing else that
could change bits: never ``fastmath`` (it licenses contraction into fused
multiply-add, reassociation and flush-to-zero).  ``error_model='numpy'`` makes
``1/0`` give IEEE infinity instead of raising.  ``parallel_kernel`` adds
``parallel=True`` for kernels whose ``prange`` runs over independent outputs
only; a ``prange`` never carries a reduction (its order would then depend on
the thread count).
"""
from __future__ import annotations

import numba

_BASE = dict(cache=True, nogil=True, error_model="numpy")


def _check(kw):
    if "fastmath" in kw:
        raise ValueError("refreplay kernels never use fastmath")


def kernel(*args, **kw):
    _check(kw)
    return numba.njit(*args, **_BASE, **kw)


def parallel_kernel(*args, **kw):
    _check(kw)
    return numba.njit(*args, **_BASE, parallel=True, **kw)
