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
never depend on it).  ``_process_unique_ids`` starts Numba's per-process
function counter at a random point, so that code cached by two processes
never carries one symbol name for two bodies (a third process loading both
would link one body for both: it happened to the matmul tiles, see
``mm_fp32._proved``).

On an x86-64 CPU with AVX-512, ``_full_width_vectors`` lets LLVM's
vectorisers use 512-bit vectors.  LLVM tunes Intel's AVX-512 cores
(Skylake-SP and later) to prefer 256-bit vectors in the loops it vectorises
(its ``prefer-256-bit`` tuning; AMD's Zen 4 has none), so every
element-wise and row loop (GELU, the norms, softmax, AdamW) ran at half the
width the register tiles (explicit 512-bit vector IR) already use.  Measured
on an Intel Xeon (family 6 model 167, 1 thread): GELU's element loop over
3 M elements 6.7 ms -> 4.7 ms.  The width never changes a bit: a vectorised
loop runs over independent elements only (no ``fastmath``: nothing is
reassociated or contracted), each lane the scalar operations in their order
(tests/test_vector_width.py compares both widths).  A user's own
``NUMBA_CPU_NAME``, ``NUMBA_CPU_FEATURES`` or ``NUMBA_ENABLE_AVX`` is left
as it is.  The setting is the process's Numba configuration, read when
Numba's code generator is made (at the first function Numba is given); a
process whose Numba made it before refreplay was imported keeps its own
features, and its cache entries stay keyed to them.
"""

from __future__ import annotations

import os
import platform
import sys

import numba
from numba.core import caching, config, registry

_BASE = dict(cache=True, nogil=True, error_model="numpy")


def _check(kw):
    if "fastmath" in kw:
        raise ValueError("refreplay kernels never use fastmath")


def kernel(*args, **kw):
    _check(kw)
    return numba.njit(*args, **{**_BASE, **kw})


def parallel_kernel(*args, **kw):
    _check(kw)
    return numba.njit(*args, **{**_BASE, "parallel": True, **kw})


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


def _process_unique_ids() -> None:
    """Start Numba's function-identity counter at a random point in this process.

    Numba gives every function it compiles a number from a counter that
    starts at 1 in each process, and puts it in the compiled code's symbol
    names beside the qualified name and argument types.  A cached function
    carries the code of its callees under those names.  Two processes that
    compile in different orders can then give one name to two different
    bodies (a name of a closure, a parallel loop's generated function), and
    a third process that loads both cached callers links them to one body
    (numba issue #10486).  With each process's counter starting at a random
    62-bit point, two compiles share a number only by a chance of about
    1e-13; the names stay deterministic within a process and no bit of the
    code changes.  Numba versions without the counter are left alone.
    """
    import itertools
    import secrets

    from numba.core import bytecode

    ids = getattr(bytecode.FunctionIdentity, "_unique_ids", None)
    if not isinstance(ids, itertools.count) or getattr(bytecode.FunctionIdentity, "_refreplay_ids", False):
        return
    bytecode.FunctionIdentity._unique_ids = itertools.count(secrets.randbits(62) + 1)
    bytecode.FunctionIdentity._refreplay_ids = True


_process_unique_ids()


_WIDE = "-prefer-256-bit"  # LLVM's x86 tuning flag, off
USER_CPU_VARS = ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES", "NUMBA_ENABLE_AVX")  # the user chose: left alone


def x86_64() -> bool:
    """Whether this process runs on x86-64."""
    return platform.machine().lower() in ("x86_64", "amd64")


def _codegen_made() -> bool:
    """Whether Numba has made its CPU code generator (with its features) already."""
    return "_toplevel_target_context" in vars(registry.cpu_target)


def _full_width_vectors(environ=os.environ) -> str | None:
    """Numba's CPU features with LLVM's 256-bit preference turned off, or
    None to leave Numba's own choice (not x86-64, no AVX-512, or the user
    chose the CPU name, features or AVX)."""
    if not x86_64():
        return None
    if any(k in environ for k in USER_CPU_VARS):
        return None
    if config.CPU_NAME is not None or config.CPU_FEATURES is not None:
        return None
    if _codegen_made():
        return None  # its features are fixed
    try:
        import llvmlite.binding as ll

        features = ll.get_host_cpu_features()
    except (ImportError, RuntimeError):
        return None
    if not features.get("avx512f"):
        return None
    return features.flatten() + "," + _WIDE


config.CPU_FEATURES = _full_width_vectors() or config.CPU_FEATURES
