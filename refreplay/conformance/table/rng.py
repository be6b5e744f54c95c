"""Chapter 5 (Philox and the draws built on it) as conformance entries.

Calling conventions use tensors only: a 64-bit seed is its key, the pair
(lo, hi) of [rng.counter.c1]; a stream is the pair (stream id, sub); a word
index or a count is an int64 of shape [1].  Edge cases sit where a misreading
shows: the Random123 known answers, counter words that carry, a key whose
Weyl increment wraps, the word with the low 8 bits set, the tie of
[rng.symmetric.c1], bounds whose rejection zone is almost half of all words,
the bound 2^32, and n = 0, 1, 2 for permutations.
"""

from __future__ import annotations

import numpy as np

from .opdef import OPS, OpDef

U32, I64 = np.uint32, np.int64


def _rng():
    from ... import rng

    return rng


def _seed(key) -> int:
    return int(key[0]) | int(key[1]) << 32


def _u32(rng, shape):
    return rng.integers(0, 1 << 32, shape, dtype=np.uint64).astype(U32)


def _stream(rng):
    return {"key": _u32(rng, 2), "ids": np.array([int(rng.integers(1, 4)), int(rng.integers(0, 1 << 32))], U32)}


def _i64(v):
    return np.array([v], I64)


# ---- the block function ---------------------------------------------------------------


def _philox(counter, key):
    return np.stack([_rng().philox4x32_10(c, k) for c, k in zip(counter, key)]).reshape(-1, 4).astype(U32)


def _philox_build(op, rng):
    out = [("random", {"counter": _u32(rng, (n, 4)), "key": _u32(rng, (n, 2))}, f"N={n}") for n in (1, 7, 256)]
    ones, wrap0, wrap1 = 0xFFFFFFFF, (1 << 32) - 0x9E3779B9, (1 << 32) - 0xBB67AE85
    counters = [
        [0, 0, 0, 0],
        [ones] * 4,
        [0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344],
        [ones, 0, 0, 0],
        [0, ones, 0, 0],
        [0, 0, ones, 0],
        [0, 0, 0, ones],
        [1, 0, 5, 2],
        [0, 1, 5, 2],
    ]
    keys = [
        [0, 0],
        [ones, ones],
        [0xA4093822, 0x299F31D0],
        [wrap0, wrap1],
        [wrap0 - 1, wrap1 + 1],
        [0x89ABCDEF, 0x01234567],
    ]
    c = np.array([x for x in counters for _ in keys], U32)
    k = np.array([y for _ in counters for y in keys], U32)
    out.append(
        ("edge", {"counter": c, "key": k}, "known answers; all-zero and all-one words; Weyl increments that wrap")
    )
    return out


OPS["rng_philox"] = OpDef(
    "rng_philox",
    ("rng.philox.c1",),
    "rng_philox(counter: u32[N, 4], key: u32[N, 2]) -> out: u32[N, 4]  (Philox4x32-10)",
    ("counter", "key"),
    ("out",),
    _philox,
    _philox_build,
)


# ---- the word stream ---------------------------------------------------------------------


def _words(key, ids, start, count):
    return _rng().words(_seed(key), int(ids[0]), int(ids[1]), int(count[0]), int(start[0]))


def _words_build(op, rng):
    out = []
    for start, n in ((0, 1), (0, 16), (2, 6), (3, 257), (int(rng.integers(0, 1 << 40)), 33)):
        out.append(("random", {**_stream(rng), "start": _i64(start), "count": _i64(n)}, f"{n} words from q0={start}"))
    spec_example = {"key": np.array([0x89ABCDEF, 0x01234567], U32), "ids": np.array([2, 5], U32)}
    for start, n, what in (
        (2, 6, "the example of [rng.counter.c1]"),
        ((1 << 34) - 6, 12, "block index crossing 2^32: counter word 1 carries"),
        ((1 << 34) + 1, 7, "block index 2^32 + 0: word 0 is 0, word 1 is 1"),
        (4 * 0xFFFFFFFF - 1, 9, "block index 2^32 - 1 and its successor"),
    ):
        out.append(("edge", {**spec_example, "start": _i64(start), "count": _i64(n)}, what))
    out.append(
        (
            "edge",
            {"key": np.array([0, 0], U32), "ids": np.array([0, 0], U32), "start": _i64(0), "count": _i64(0)},
            "no words",
        )
    )
    return out


OPS["rng_words"] = OpDef(
    "rng_words",
    ("rng.counter.c1", "rng.philox.c1"),
    "rng_words(key: u32[2], ids: u32[2], start: i64[1], count: i64[1]) -> w: u32[count]  "
    "(words start .. start+count-1 of stream (key, ids[0] = stream id, ids[1] = sub))",
    ("key", "ids", "start", "count"),
    ("w",),
    _words,
    _words_build,
)


# ---- words to floats -------------------------------------------------------------------------

EDGE_WORDS = (
    0x00000000,
    0x000000FF,
    0x00000100,
    0x000001FF,
    0x7FFFFF00,
    0x7FFFFFFF,
    0x80000000,
    0x800000FF,
    0x80000100,
    0xFFFFFEFF,
    0xFFFFFF00,
    0xFFFFFFFF,
    0x12345678,
    0x00FFFFFF,
    0xFF000000,
)


def _unit_build(op, rng):
    out = [("random", {"w": _u32(rng, n)}, f"N={n}") for n in (1, 7, 1021)]
    out.append(("edge", {"w": np.array(EDGE_WORDS, U32)}, "the low 8 bits set; 0; the largest word; halves"))
    return out


OPS["rng_unit"] = OpDef(
    "rng_unit",
    ("rng.unit.c1",),
    "rng_unit(w: u32[N]) -> out: f32[N]  (unit(w) in [0, 1))",
    ("w",),
    ("out",),
    lambda w: _rng().unit_of(w),
    _unit_build,
)


def _symmetric_build(op, rng):
    from ..base import deviant as fp

    out = [
        ("random", {"w": _u32(rng, n), "a": fp.f32([a])}, f"N={n}, a=0x{a:08X}")
        for n, a in ((1, 0x3F000000), (7, 0x3DCCCCCD), (1021, 0x3CA3D70A))
    ]
    for a, what in (
        (0x3FC00000, "a = 1.5: (1 - 2^-23) a is a tie"),
        (0x3F000000, "a = 0.5"),
        (0x00800000, "a = FLT_MIN: products below it flush"),
        (0x7F7FFFFF, "a = the largest finite"),
        (0x3F7FFFFF, "a just below 1"),
    ):
        out.append(("edge", {"w": np.array(EDGE_WORDS, U32), "a": fp.f32([a])}, what))
    return out


OPS["rng_symmetric"] = OpDef(
    "rng_symmetric",
    ("rng.symmetric.c1",),
    "rng_symmetric(w: u32[N], a: f32[1]) -> out: f32[N]  (uniform in [-a, a))",
    ("w", "a"),
    ("out",),
    lambda w, a: _rng().symmetric_of(w, a[0]),
    _symmetric_build,
)


# ---- bounded integers and permutations ---------------------------------------------------------


def _bounded(key, ids, start, bounds):
    vals, nxt = _rng().bounded(_seed(key), int(ids[0]), int(ids[1]), bounds, int(start[0]))
    return vals.astype(I64), _i64(nxt)


def _bounded_build(op, rng):
    out = []
    for m in (1, 7, 200):
        b = rng.integers(1, 1 << 32, m, dtype=np.int64) >> rng.integers(0, 32, m)
        stream = _stream(rng)  # drawn before the start, as always
        start = _i64(int(rng.integers(0, 1 << 20)))
        out.append(
            ("random", {**stream, "start": start, "bounds": np.maximum(b, 1)}, f"{m} draws, bounds of every size")
        )
    ex = {"key": np.array([1, 0], U32), "ids": np.array([2, 0], U32), "start": _i64(0)}
    half = 0x80000001
    for bounds, what in (
        ([10, 10, half, half, half], "the example of [rng.bounded.c1]: rejections"),
        ([half] * 64, "n = 2^31 + 1: almost half of all words rejected"),
        ([1] * 5 + [2, 3], "n = 1 still consumes a word"),
        ([1 << 32] * 9, "n = 2^32: t = 0, nothing rejected, the word itself"),
        ([(1 << 32) - 1, 0xC0000001, 3, 7, 0x55555556] * 8, "large bounds; rejection zones of every size"),
    ):
        out.append(("edge", {**ex, "bounds": np.array(bounds, I64)}, what))
    out.append(("edge", {**ex, "bounds": np.zeros(0, I64)}, "no draws: the cursor stays"))
    return out


OPS["rng_bounded"] = OpDef(
    "rng_bounded",
    ("rng.bounded.c1", "rng.counter.c1"),
    "rng_bounded(key: u32[2], ids: u32[2], start: i64[1], bounds: i64[M]) -> (values: i64[M], next: i64[1])  "
    "(one draw in [0, bounds[i]) per bound, in order, from word start; next: the first word not consumed)",
    ("key", "ids", "start", "bounds"),
    ("values", "next"),
    _bounded,
    _bounded_build,
)


def _permutation(key, ids, start, n):
    return _rng().permutation(_seed(key), int(ids[0]), int(ids[1]), int(n[0]), int(start[0]))


def _permutation_build(op, rng):
    out = [
        ("random", {**_stream(rng), "start": _i64(int(rng.integers(0, 1 << 20))), "n": _i64(n)}, f"N={n}")
        for n in (3, 10, 1000)
    ]
    ex = {"key": np.array([1, 0], U32), "ids": np.array([2, 0], U32), "start": _i64(0)}
    for n, what in (
        (10, "the example of [rng.permutation.c1]"),
        (0, "N = 0"),
        (1, "N = 1: no draw"),
        (2, "N = 2: one draw"),
    ):
        out.append(("edge", {**ex, "n": _i64(n)}, what))
    return out


OPS["rng_permutation"] = OpDef(
    "rng_permutation",
    ("rng.permutation.c1", "rng.bounded.c1"),
    "rng_permutation(key: u32[2], ids: u32[2], start: i64[1], n: i64[1]) -> p: i64[n]  (Fisher-Yates from word start)",
    ("key", "ids", "start", "n"),
    ("p",),
    _permutation,
    _permutation_build,
)
