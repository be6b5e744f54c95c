"""The one way refreplay compiles code.

``kernel`` is ``numba.njit`` with the on-disk cache on and nothing else that
could change bits: never ``fastmath`` (it licenses contraction into fused
multiply-add, reassociation and flush-to-zero).  ``error_model='numpy'`` makes
``1/0`` give IEEE infinity instead of raising.  ``parallel_kernel`` adds
``parallel=True`` for kernels whose ``prange`` runs over independent outputs
only; a ``prange`` never carries a reduction (its order would then depend on
the thread count).

A corrupt entry of Numba's on-disk cache (a truncated or overwritten index or
data file: a full disk, a killed compile) would raise from deep inside
Numba's loader; ``_guard_cache`` turns it into a cache miss instead: the
file is set aside as ``NAME.corrupt-PID`` with a warning on stderr and the
function is compiled again (the cache only ever saves compile time; bits
never depend on it).
"""

from __future__ import annotations

import os
import sys

import numba
from numba.core import caching

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


def _set_aside(path: str, exc: BaseException) -> None:
    """Move a corrupt cache file out of Numba's way, saying so once per file."""
    aside = f"{path}.corrupt-{os.getpid()}"
    try:
        os.replace(path, aside)
    except OSError:
        aside = None  # gone already (another process set it aside) or not movable: a miss all the same
    print(
        f"refreplay: warning: the compile cache file {path} is corrupt ({type(exc).__name__}: {exc}); "
        + (f"set aside as {aside}; " if aside else "")
        + "compiling again",
        file=sys.stderr,
    )


def _guard_cache() -> None:
    """Wrap Numba's cache reads so that a corrupt file is a miss, not a crash."""
    cls = caching.IndexDataCacheFile
    if getattr(cls, "_refreplay_guarded", False):
        return
    load_index, load_data = cls._load_index, cls._load_data

    def _load_index(self):
        try:
            return load_index(self)
        except Exception as exc:  # unpickling garbage raises anything
            _set_aside(self._index_path, exc)
            return {}

    def _load_data(self, name):
        try:
            return load_data(self, name)
        except OSError:
            raise  # Numba's own miss (a data file removed under the index)
        except Exception as exc:
            _set_aside(os.path.join(self._cache_path, name), exc)
            raise OSError(f"corrupt cache data file {name}") from None  # Numba treats it as a miss

    cls._load_index, cls._load_data = _load_index, _load_data
    cls._refreplay_guarded = True


_guard_cache()
