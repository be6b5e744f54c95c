"""bf16 bits and binary32 ([bf16.round.c1], [bf16.widen.c1], [bf16.load.c1]),
modelled in NumPy for the suite: rounding to bf16 the spec's way and the two
common wrong ways, widening, loading.  Nothing here is on the normative path
(``ops.bf16`` is); the runner compares bf16 outputs through ``widen`` and the
misreadings (``readings/bf16.py``) are built from these roundings.
"""

from __future__ import annotations

import numpy as np

from . import deviant as fp

F32 = np.float32
NAN16 = np.uint16(0x7FC0)


# ---- roundings of binary32 to bf16 ([bf16.round.c1] and its misreadings) ----------------


def _to16(x, step) -> np.ndarray:
    u = fp.bits(np.ascontiguousarray(x, F32)).astype(np.uint64)
    r = (step(u) >> np.uint64(16)).astype(np.uint16)
    return np.where(np.isnan(np.asarray(x, F32)), NAN16, r).astype(np.uint16)


def rne(x) -> np.ndarray:
    """[bf16.round.c1] round to nearest, ties to even (the spec)."""
    return _to16(x, lambda u: u + np.uint64(0x7FFF) + ((u >> np.uint64(16)) & np.uint64(1)))


def truncate(x) -> np.ndarray:
    """The upper 16 bits, the low ones dropped: round toward zero."""
    return _to16(x, lambda u: u)


def ties_away(x) -> np.ndarray:
    """Round to nearest, ties away from zero."""
    return _to16(x, lambda u: u + np.uint64(0x8000))


def widen(h) -> np.ndarray:
    """bf16 bits as binary32, payloads and subnormals kept ([bf16.widen.c1] without [bf16.load.c1])."""
    return (np.ascontiguousarray(h, np.uint16).astype(np.uint32) << np.uint32(16)).view(F32)


def loaded(h) -> np.ndarray:
    """[bf16.load.c1] then [bf16.widen.c1]: subnormals zeroed, NaN canonical."""
    x = fp.flush(widen(h))
    return np.where(np.isnan(x), fp.f32(fp.CANONICAL_NAN), x).astype(F32)


def round_f32(x) -> np.ndarray:
    """x rounded to bf16 and held in binary32."""
    return widen(rne(x))
