"""Host entry points of the Philox random numbers (spec chapter 5), as ``refreplay.rng``."""

from __future__ import annotations

import numpy as np
from numba import cuda

from .. import rng as R
from ._common import THREADS, _dev, _ret, _scalar_or_array, blocks, device_aware
from .numerics import _elementwise


def _uint(value, bits, what):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what} must be an integer, got {type(value).__name__}")
    if not 0 <= int(value) < (1 << bits):
        raise ValueError(f"{what} must lie in [0, 2**{bits}), got {int(value)}")
    return np.uint64(int(value))


def _key(seed):
    from refreplay.rng import seed_key  # [rng.counter.c1] (lo(s), hi(s))

    return seed_key(seed)


def _scale(a):
    a32 = np.float32(a)
    if not (np.isfinite(a32) and a32 >= np.float32(1.1754943508222875e-38)) or float(a32) != float(a):
        raise ValueError(f"scale a must be a positive normal binary32 value, got {a!r}")
    return a32


@device_aware
def philox4x32(counter, key, rounds=R.ROUNDS):
    """[rng.philox.c1] Philox4x32 of counters (4 words, or N×4) under a 2-word key -> uint32."""
    c = np.asarray(counter)
    k = np.asarray(key)
    if c.shape[-1:] != (4,) or c.ndim > 2 or c.dtype.kind not in "iu" or k.shape != (2,) or k.dtype.kind not in "iu":
        raise TypeError("counter must be 4 (or N x 4) integer words and key 2 integer words")
    if not isinstance(rounds, (int, np.integer)) or not 1 <= rounds <= 16:
        raise ValueError(f"rounds must be an integer in [1, 16], got {rounds!r}")
    if (c.size and (c.min() < 0 or c.max() > 0xFFFFFFFF)) or k.min() < 0 or k.max() > 0xFFFFFFFF:
        raise ValueError("words must lie in [0, 2**32)")
    cs = np.ascontiguousarray(c.reshape(-1, 4), dtype=np.uint32)
    out = cuda.device_array(cs.shape, dtype=np.uint32)
    if cs.shape[0]:
        R.philox_k[blocks(cs.shape[0]), THREADS](_dev(cs), _dev(k.astype(np.uint32)), int(rounds), out)
    return _ret(out).reshape(c.shape)


@device_aware
def philox4x32_10(counter, key):
    """[rng.philox.c1] Philox4x32-10."""
    return philox4x32(counter, key, R.ROUNDS)


@device_aware
def words(seed, stream, sub, count, start=0):
    """[rng.counter.c1] Words start .. start+count-1 of stream (seed, stream, sub), uint32 (count,)."""
    k0, k1 = _key(seed)
    st, sb, s0 = _uint(stream, 32, "stream"), _uint(sub, 32, "sub"), _uint(start, 64, "start")
    c = int(_uint(count, 63, "count"))
    if int(s0) + c > 1 << 64:
        raise ValueError("start + count exceeds the 2**64 words of a stream")
    out = cuda.device_array(c, dtype=np.uint32)
    if c:
        nblocks = (int(s0) % 4 + c + 3) // 4
        R.words_k[blocks(nblocks), THREADS](k0, k1, sb, st, s0, out)
    return _ret(out)


@device_aware
def unit(w):
    """[rng.unit.c1] uint32 word(s) -> float32 in [0, 1)."""
    return _elementwise(R.unit_k, np.float32, _scalar_or_array("w", w, np.uint32))


@device_aware
def symmetric(w, a):
    """[rng.symmetric.c1] uint32 word(s) -> float32 uniform in [-a, a)."""
    a32 = _scale(a)
    x = _scalar_or_array("w", w, np.uint32)
    flat = x.reshape(-1)
    out = cuda.device_array(flat.size, dtype=np.float32)
    if flat.size:
        R.symmetric_k[blocks(flat.size), THREADS](_dev(flat), a32, out)
    res = _ret(out).reshape(x.shape)
    return res[()] if res.ndim == 0 else res


@device_aware
def init_uniform(seed, name, shape, a):
    """[rng.init.c1] Initial value of parameter ``name`` (float32 of ``shape``)."""
    from refreplay.rng import name_tag

    k0, k1 = _key(seed)
    tag = np.uint64(name_tag(name))
    dims = tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise ValueError(f"shape must be non-negative, got {shape!r}")
    n = int(np.prod(dims, dtype=np.int64)) if dims else 1
    out = cuda.device_array(n, dtype=np.float32)
    if n:
        R.init_uniform_k[blocks((n + 3) // 4), THREADS](k0, k1, tag, _scale(a), out)
    return _ret(out).reshape(dims)
