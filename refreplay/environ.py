"""Environment variables refreplay and Numba read, checked before any of them
is used, so that a bad value is a clear refusal (exit 2) and never a
traceback from deep inside Numba's start-up.

Bits never depend on these values; a wrong one only stops the program.
"""
from __future__ import annotations

import os
import re

from .errors import InputError

MAX_THREADS = 4096
_DECIMAL = re.compile(r"[0-9]{1,6}")


def _threads(name: str, value: str) -> None:
    v = value.strip()
    if not _DECIMAL.fullmatch(v) or not 1 <= int(v) <= MAX_THREADS:
        raise InputError(f"environment variable {name}={value!r} must be a whole number of threads "
                         f"from 1 to {MAX_THREADS} (unset it to use every core)")


def _flag(name: str, value: str) -> None:
    if value.strip() not in ("", "0", "1"):
        raise InputError(f"environment variable {name}={value!r} must be 0 or 1")


# Numba's threading layers: the names it knows, and the ones that need Intel
# TBB (the ``tbb`` package): "safe" is thread- and fork-safe, which only TBB is.
THREADING_LAYERS = ("default", "workqueue", "omp", "tbb", "forksafe", "threadsafe", "safe")
_NEED_TBB = ("tbb", "safe")


def _threading_layer(name: str, value: str) -> None:
    v = value.strip().lower()
    if v not in THREADING_LAYERS:
        raise InputError(f"environment variable {name}={value!r} is not a Numba threading layer; use one of "
                         f"{', '.join(THREADING_LAYERS)} (or unset it)")
    if v in _NEED_TBB:
        import importlib.util

        if importlib.util.find_spec("tbb") is None:
            raise InputError(f"environment variable {name}={value!r} needs Intel TBB, which is not installed "
                             "(pip install tbb), or unset it to use the default layer")


CHECKS = {
    "NUMBA_NUM_THREADS": _threads,  # 0 or less: Numba raises ValueError from deep in its start-up
    "NUMBA_ENABLE_CUDASIM": _flag,  # decides whether --device cuda is the simulator
    "NUMBA_THREADING_LAYER": _threading_layer,  # unknown or absent: ValueError at the first parallel kernel
}


def check(environ=None) -> None:
    """Refuse (``InputError``) the first set variable of ``CHECKS`` whose value
    is unusable."""
    env = os.environ if environ is None else environ
    for name, check_one in CHECKS.items():
        if name in env:
            check_one(name, env[name])
