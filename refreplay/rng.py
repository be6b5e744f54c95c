"""Philox4x32 counter-based random numbers, as ``spec/05-rng.txt`` defines them.

Everything random in refreplay (parameter initialisation, the order of the
data) is a pure function of the run seed and a counter: no generator state is
carried between calls, so any word of any stream can be recomputed on any
machine, in any order, by any number of threads.

Layers, bottom up:

* ``philox4x32`` -- the Random123 block function [rng.philox.c1];
* the word stream of (seed, stream, sub) [rng.counter.c1], generated block by
  block (``words``);
* mappings of a word to a float in [0, 1) [rng.unit.c1] and to a symmetric
  uniform [rng.symmetric.c1];
* bounded integers without bias [rng.bounded.c1] and Fisher-Yates
  permutations [rng.permutation.c1], which read the word stream sequentially;
* the purposes: parameter initialisation [rng.init.c1] and the data
  permutation [rng.data.c1], each with its stream id [rng.streams.c1].
"""

from __future__ import annotations

import hashlib

import numpy as np
from numba import prange

from . import philox
from ._jit import kernel, parallel_kernel
from .numerics.core import F32, FLT_MIN, mul
from .philox import MASK32, U32  # [rng.philox.c1] the constants and the round live in philox.py

TWO32 = np.uint64(1 << 32)
U0 = np.uint64(0)
U1 = np.uint64(1)
U2 = np.uint64(2)
U3 = np.uint64(3)
U8 = np.uint64(8)
TWO_M24 = F32(2.0**-24)  # 0x33800000
TWO_M23 = F32(2.0**-23)  # 0x34000000
TWO23 = np.int64(1 << 23)

# [rng.streams.c1] counter word 3 of each purpose.
STREAM_INIT = 1
STREAM_DATA = 2

ROUNDS = 10


# ---- the block function -------------------------------------------------------


# [rng.philox.c1] the block function: philox.philox_block, compiled here for the CPU.
philox_block = kernel(philox.philox_block)


def _u32_words(values, n: int, what: str) -> list[int]:
    arr = np.asarray(values)
    if arr.shape != (n,) or arr.dtype.kind not in "iu":
        raise TypeError(f"{what} must be {n} integer words, got shape {arr.shape} dtype {arr.dtype}")
    words = [int(v) for v in arr]
    if any(w < 0 or w > 0xFFFFFFFF for w in words):
        raise ValueError(f"{what} words must lie in [0, 2**32)")
    return words


def philox4x32(counter, key, rounds: int = ROUNDS) -> np.ndarray:
    """[rng.philox.c1] Philox4x32 of a 4-word counter and a 2-word key.

    ``counter`` and ``key`` are sequences of 32-bit unsigned integers;
    returns the four output words as a uint32 array of shape (4,).
    """
    c = _u32_words(counter, 4, "counter")
    k = _u32_words(key, 2, "key")
    if not isinstance(rounds, (int, np.integer)) or not 1 <= rounds <= 16:
        raise ValueError(f"rounds must be an integer in [1, 16], got {rounds!r}")
    out = philox_block(*(np.uint64(w) for w in c + k), int(rounds))
    return np.array(out, dtype=np.uint32)


def philox4x32_10(counter, key) -> np.ndarray:
    """[rng.philox.c1] Philox4x32-10, the generator every refreplay stream uses."""
    return philox4x32(counter, key, ROUNDS)


# ---- the word stream ------------------------------------------------------------


@parallel_kernel
def _words_kernel(k0, k1, sub, stream, start, out):
    """[rng.counter.c1] out[i] = word start+i of the stream; N = out.size >= 1.

    Word index q is word q mod 4 of the block whose counter is
    (q div 4 low, q div 4 high, sub, stream).  Blocks are independent, so the
    loop over them runs in parallel; out is overwritten.
    """
    n = np.uint64(out.size)
    first = start >> U2
    last = (start + n - U1) >> U2
    for bi in prange(np.int64(last - first) + 1):
        b = first + np.uint64(bi)
        x = philox_block(b & MASK32, b >> U32, sub, stream, k0, k1, ROUNDS)
        for j in range(4):
            q = (b << U2) + np.uint64(j)
            if q >= start and q - start < n:
                out[q - start] = x[j]


@kernel
def _next_word(cursor, k0, k1, sub, stream):
    """[rng.counter.c1] The word at cursor[0], advancing cursor[0] by one.

    cursor is a uint64 array of 6: [0] next word index, [1] 1 + index of the
    block held in [2..5] (0: none yet).  Holding the block avoids
    recomputing it for each of its four words.
    """
    q = cursor[0]
    b = q >> U2
    if cursor[1] != b + U1:
        x = philox_block(b & MASK32, b >> U32, sub, stream, k0, k1, ROUNDS)
        cursor[1] = b + U1
        cursor[2] = x[0]
        cursor[3] = x[1]
        cursor[4] = x[2]
        cursor[5] = x[3]
    cursor[0] = q + U1
    return cursor[2 + np.int64(q & U3)]


# ---- words to numbers -------------------------------------------------------------


@kernel
def unit(w):
    """[rng.unit.c1] A 32-bit word to a binary32 in [0, 1): (w >> 8) * 2^-24.

    The top 24 bits, as an integer below 2^24, convert exactly; scaling by a
    power of two is exact.  Results are 0, 2^-24, ..., 1 - 2^-24.
    """
    return mul(F32(np.uint64(w) >> U8), TWO_M24)


@kernel
def symmetric(w, a):
    """[rng.symmetric.c1] A word to a uniform binary32 in [-a, a), a > 0 normal.

    s = (w >> 8) - 2^23 is an integer in [-2^23, 2^23); s * 2^-23 is exact and
    lies in [-1, 1); the one rounding is the final mul by a.
    """
    s = np.int64(np.uint64(w) >> U8) - TWO23
    return mul(mul(F32(s), TWO_M23), a)


@kernel
def lemire(w, n):
    """[rng.bounded.c1] One bounded-integer attempt: (accepted, value).

    With m = w * n (exact, 64-bit), the candidate is m >> 32; it is accepted
    iff the low half m mod 2^32 is at least t = (2^32 - n) mod n, which leaves
    exactly floor(2^32 / n) accepted words for every value in [0, n).
    """
    n64 = np.uint64(n)
    m = np.uint64(w) * n64
    t = (TWO32 - n64) % n64
    return (m & MASK32) >= t, m >> U32


@kernel
def _bounded_draw(cursor, k0, k1, sub, stream, n):
    """[rng.bounded.c1] A value in [0, n), 1 <= n <= 2^32, from the next words.

    A rejected word is followed by the stream's next word; the draw consumes
    one word plus one per rejection.
    """
    while True:
        ok, v = lemire(_next_word(cursor, k0, k1, sub, stream), n)
        if ok:
            return v


@parallel_kernel
def _unit_kernel(w, out):
    """[rng.unit.c1] out[i] = unit(w[i]); N = w.size = out.size; overwritten."""
    for i in prange(out.size):
        out[i] = unit(w[i])


@parallel_kernel
def _symmetric_kernel(w, a, out):
    """[rng.symmetric.c1] out[i] = symmetric(w[i], a); N = w.size = out.size; overwritten."""
    for i in prange(out.size):
        out[i] = symmetric(w[i], a)


@kernel
def _bounded_kernel(k0, k1, sub, stream, start, bounds, out):
    """[rng.bounded.c1] out[i] in [0, bounds[i]), drawn in order i = 0, 1, ...

    Sequential by nature (a rejection shifts every later draw).  N =
    bounds.size = out.size; out is overwritten.  Returns the index of the
    first word not consumed.
    """
    cursor = np.zeros(6, dtype=np.uint64)
    cursor[0] = start
    for i in range(bounds.size):
        out[i] = _bounded_draw(cursor, k0, k1, sub, stream, bounds[i])
    return cursor[0]


@kernel
def _permutation_kernel(k0, k1, sub, stream, start, out):
    """[rng.permutation.c1] Fisher-Yates: out (N = out.size) overwritten with a
    permutation of 0..N-1.  For i = N-1 down to 1: j = draw in [0, i+1),
    swap out[i] and out[j].  Returns the index of the first word not consumed.
    """
    cursor = np.zeros(6, dtype=np.uint64)
    cursor[0] = start
    for i in range(out.size):
        out[i] = i
    for i in range(out.size - 1, 0, -1):
        j = np.int64(_bounded_draw(cursor, k0, k1, sub, stream, np.uint64(i + 1)))
        tmp = out[i]
        out[i] = out[j]
        out[j] = tmp
    return cursor[0]


# ---- public API: validation and dispatch ---------------------------------------------


def _uint(value, bits: int, what: str) -> np.uint64:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what} must be an integer, got {type(value).__name__}")
    if not 0 <= int(value) < (1 << bits):
        raise ValueError(f"{what} must lie in [0, 2**{bits}), got {int(value)}")
    return np.uint64(int(value))


def seed_key(seed) -> tuple[np.uint64, np.uint64]:
    """[rng.counter.c1] The Philox key of a 64-bit run seed: (low half, high half)."""
    s = int(_uint(seed, 64, "seed"))
    return np.uint64(s & 0xFFFFFFFF), np.uint64(s >> 32)


def _stream_args(seed, stream, sub, start, count):
    k0, k1 = seed_key(seed)
    st = _uint(stream, 32, "stream")
    sb = _uint(sub, 32, "sub")
    s0 = _uint(start, 64, "start")
    c = int(_uint(count, 63, "count"))
    if int(s0) + c > 1 << 64:
        raise ValueError("start + count exceeds the 2**64 words of a stream")
    return k0, k1, sb, st, s0, c


def words(seed, stream, sub, count, start=0) -> np.ndarray:
    """[rng.counter.c1] Words start .. start+count-1 of stream (seed, stream, sub)
    as a uint32 array of shape (count,)."""
    k0, k1, sb, st, s0, c = _stream_args(seed, stream, sub, start, count)
    out = np.empty(c, dtype=np.uint32)
    if c:
        _words_kernel(k0, k1, sb, st, s0, out)
    return out


def unit_floats(seed, stream, sub, count, start=0) -> np.ndarray:
    """[rng.unit.c1] float32 array (count,) in [0, 1) from words start.. of the stream."""
    w = words(seed, stream, sub, count, start)
    out = np.empty(w.size, dtype=np.float32)
    _unit_kernel(w, out)
    return out


def unit_of(w) -> np.ndarray:
    """[rng.unit.c1] unit() of every word of a uint32 array: float32, same shape."""
    w = np.ascontiguousarray(w, dtype=np.uint32)
    out = np.empty(w.size, dtype=np.float32)
    _unit_kernel(w.ravel(), out)
    return out.reshape(w.shape)


def symmetric_of(w, a) -> np.ndarray:
    """[rng.symmetric.c1] symmetric(word, a) of every word of a uint32 array."""
    a32 = _check_scale(a)
    w = np.ascontiguousarray(w, dtype=np.uint32)
    out = np.empty(w.size, dtype=np.float32)
    _symmetric_kernel(w.ravel(), a32, out)
    return out.reshape(w.shape)


def _check_scale(a) -> np.float32:
    a32 = np.float32(a)
    # float(): compare as float64, so that a Python float such as 0.1, which
    # is no binary32 value, is refused rather than silently rounded.
    if not (np.isfinite(a32) and a32 >= FLT_MIN) or float(a32) != float(a):
        raise ValueError(f"scale a must be a positive normal binary32 value, got {a!r}")
    return a32


def symmetric_floats(seed, stream, sub, a, count, start=0) -> np.ndarray:
    """[rng.symmetric.c1] float32 array (count,) uniform in [-a, a)."""
    a32 = _check_scale(a)
    w = words(seed, stream, sub, count, start)
    out = np.empty(w.size, dtype=np.float32)
    _symmetric_kernel(w, a32, out)
    return out


def bounded(seed, stream, sub, bounds, start=0) -> tuple[np.ndarray, int]:
    """[rng.bounded.c1] One unbiased draw in [0, bounds[i]) per bound, in order.

    Returns (values as uint64 array, index of the first word not consumed) so
    that a caller can continue the stream.
    """
    b = np.asarray(bounds)
    if b.ndim != 1 or b.dtype.kind not in "iu":
        raise TypeError(f"bounds must be a 1-d integer array, got shape {b.shape} dtype {b.dtype}")
    if b.size and (int(b.min()) < 1 or int(b.max()) > 1 << 32):
        raise ValueError("every bound must lie in [1, 2**32]")
    k0, k1, sb, st, s0, _ = _stream_args(seed, stream, sub, start, 0)
    out = np.empty(b.size, dtype=np.uint64)
    nxt = _bounded_kernel(k0, k1, sb, st, s0, b.astype(np.uint64), out)
    return out, int(nxt)


def permutation(seed, stream, sub, n, start=0) -> np.ndarray:
    """[rng.permutation.c1] A uniformly random permutation of 0..n-1 (int64, shape (n,))."""
    k0, k1, sb, st, s0, _ = _stream_args(seed, stream, sub, start, 0)
    out = np.empty(int(_uint(n, 32, "n")), dtype=np.int64)
    _permutation_kernel(k0, k1, sb, st, s0, out)
    return out


# ---- purposes ----------------------------------------------------------------------


def name_tag(name: str) -> int:
    """[rng.init.c1] Counter word 2 of a parameter tensor's initialisation stream:
    the first four bytes of SHA-256(UTF-8 name), read little-endian."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"a tensor name must be a non-empty str, got {name!r}")
    return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:4], "little")


def init_tags(names) -> dict[str, int]:
    """[rng.init.c1] name -> tag for the parameters of one model; two names with
    the same tag would draw the same numbers, so a collision is refused."""
    tags: dict[str, int] = {}
    seen: dict[int, str] = {}
    for name in names:
        t = name_tag(name)
        if t in seen and seen[t] != name:
            raise ValueError(
                f"tensor names {seen[t]!r} and {name!r} share the initialisation stream tag 0x{t:08X}; rename one"
            )
        seen[t] = name
        tags[name] = t
    return tags


def init_uniform(seed, name: str, shape, a) -> np.ndarray:
    """[rng.init.c1] The initial value of parameter ``name``: element i (row-major)
    is symmetric(word i of stream (seed, STREAM_INIT, name_tag(name)), a)."""
    dims = tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise ValueError(f"shape must be non-negative, got {shape!r}")
    count = int(np.prod(dims, dtype=np.int64)) if dims else 1
    return symmetric_floats(seed, STREAM_INIT, name_tag(name), a, count).reshape(dims)


def data_permutation(seed, epoch, n) -> np.ndarray:
    """[rng.data.c1] The order of the n samples in epoch ``epoch``: the
    permutation of stream (seed, STREAM_DATA, epoch) from word 0."""
    return permutation(seed, STREAM_DATA, epoch, n)
