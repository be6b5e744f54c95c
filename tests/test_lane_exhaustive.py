"""The flush-reduced lane forms equal the scalar clause functions on every
binary32 bit pattern ([num.flush.c1]: a flush that provably never changes a
value may be left out, [mm.flush.r1]; for a function of one argument the
proof is exhaustion).

``elementwise.exp_lane``, ``tanh_lane``, ``sigmoid_lane`` and the GELU lanes
``activations.gelu_lane`` / ``gelu_local`` leave out flushes that change no
result bit.  For a function of one binary32 argument that claim is decided by
exhaustion: the lane form and the scalar reference (every operation rounded,
flushed and canonicalised: ``numerics.transcendental`` and the steps of
[act.gelu.fwd.c1] / [act.gelu.bwd.c1] written with ``numerics.core``) must
give the same bits for all 2^32 inputs, subnormals and every NaN payload
included.  The slow tests run all of them; the default run checks every
sign and exponent class with edge and random mantissas, a strided sweep of
2^23 patterns, and dense windows around the branch points.

The GELU backward is compared through ``local`` (steps 1-7): dx =
mul(dout, local) then canon, so equal local bits (NaN: any NaN, which step
8 canonicalises) give equal dx for every dout.
"""

from __future__ import annotations

import numpy as np
import pytest
from numba import prange

from refreplay._jit import parallel_kernel
from refreplay.numerics import elementwise
from refreplay.numerics import transcendental as tr
from refreplay.numerics._bits import bits_f32, f32_bits
from refreplay.numerics.core import HALF, ONE, add, canon, mul, sub
from refreplay.ops import activations
from refreplay.ops.activations import GELU_CUBE, GELU_CUBE3, GELU_SCALE

CHUNK = 1 << 16  # patterns per parallel task


# ---- counters: (mismatches, first mismatching pattern or -1) per function ----------


@parallel_kernel
def _count(lane, scalar, pats):
    """Patterns where lane(x) and scalar(x) differ in any bit (lane, scalar:
    compiled functions of one binary32 argument)."""
    n_t = (pats.size + CHUNK - 1) // CHUNK
    bad = np.zeros(n_t, np.int64)
    first = np.full(n_t, -1, np.int64)
    for t in prange(n_t):
        for i in range(t * CHUNK, min(t * CHUNK + CHUNK, pats.size)):
            x = bits_f32(pats[i])
            if f32_bits(lane(x)) != f32_bits(scalar(x)):
                bad[t] += 1
                if first[t] < 0:
                    first[t] = pats[i]
    return bad, first


def _count_exp(pats):
    return _count(elementwise.exp_lane, tr.exp, pats)


def _count_tanh(pats):
    return _count(elementwise.tanh_lane, tr.tanh, pats)


def _count_sigmoid(pats):
    return _count(elementwise.sigmoid_lane, tr.sigmoid, pats)


@parallel_kernel
def _count_gelu(pats):
    """The clause's steps, every operation a core primitive, against
    gelu_lane (forward result) and canon(gelu_local) (backward local).
    Step 3 calls tanh_lane, which gives tr.tanh's bits on every input
    (test_lane_all_inputs[tanh]), so this is the clause's GELU; it keeps the
    exhaustion of GELU at minutes (the scalar tanh costs most of the time)."""
    n_t = (pats.size + CHUNK - 1) // CHUNK
    bad = np.zeros(n_t, np.int64)
    first = np.full(n_t, -1, np.int64)
    for t in prange(n_t):
        for i in range(t * CHUNK, min(t * CHUNK + CHUNK, pats.size)):
            x = bits_f32(pats[i])
            cube = mul(mul(mul(GELU_CUBE, x), x), x)  # [act.gelu.fwd.c1] steps 1-4
            th = elementwise.tanh_lane(mul(GELU_SCALE, add(x, cube)))
            out = mul(mul(HALF, x), add(ONE, th))
            sech2 = sub(ONE, mul(th, th))  # [act.gelu.bwd.c1] steps 5-7
            dinner = mul(GELU_SCALE, add(ONE, mul(mul(GELU_CUBE3, x), x)))
            local = add(mul(HALF, add(ONE, th)), mul(mul(mul(HALF, x), sech2), dinner))
            if f32_bits(activations.gelu_lane(x)) != f32_bits(out) or f32_bits(
                canon(activations.gelu_local(x))
            ) != f32_bits(local):
                bad[t] += 1
                if first[t] < 0:
                    first[t] = pats[i]
    return bad, first


COUNTERS = {"exp": _count_exp, "tanh": _count_tanh, "sigmoid": _count_sigmoid, "gelu": _count_gelu}


def check(name, pats):
    bad, first = COUNTERS[name](pats)
    n = int(bad.sum())
    assert n == 0, f"{name}: {n} of {pats.size} patterns differ, first {int(first[first >= 0][0]):#010x}"


# ---- the default run's subset -----------------------------------------------------


def subset_patterns():
    """Every sign and exponent (512 classes) with edge mantissas and 64 random
    ones; every 511th pattern (2^23 of them); and 2^16 consecutive patterns on
    each side of the branch points: +-0, the smallest normal, tanh's 0.75,
    exp's -88 and 88.72, 2^-63 and 2^-42 (where squares and cubes turn
    subnormal), and the infinities."""
    rng = np.random.default_rng(2026)
    mant = np.concatenate(
        [[0, 1, 2, 0x3FFFFF, 0x400000, 0x400001, 0x7FFFFE, 0x7FFFFF], rng.integers(0, 1 << 23, 64)]
    ).astype(np.uint64)
    classes = (np.arange(512, dtype=np.uint64) << np.uint64(23))[:, None] | mant[None, :]
    sweep = np.arange(0, 1 << 32, 511, dtype=np.uint64)
    windows = []
    for centre in (0x00000000, 0x00800000, 0x3F400000, 0xC2B00000, 0x42B17217, 0x20000000, 0x2A800000, 0x7F800000):
        for sign in (0, 0x80000000):
            c = (centre | sign) & 0xFFFFFFFF
            windows.append(np.arange(c - (1 << 16), c + (1 << 16), dtype=np.int64) % (1 << 32))
    return np.concatenate([classes.ravel(), sweep, *[w.astype(np.uint64) for w in windows]]).astype(np.uint32)


@pytest.fixture(scope="module")
def subset():
    return subset_patterns()


@pytest.mark.parametrize("name", sorted(COUNTERS))
def test_lane_equals_scalar_on_subset(name, subset):
    """[num.flush.c1] [num.exp.c1] [num.tanh.c1] [num.sigmoid.c1] [act.gelu.fwd.c1]
    [act.gelu.bwd.c1] lane form == scalar clause on the default subset."""
    check(name, subset)


# ---- exhaustion ----------------------------------------------------------------------


def all_patterns_in_chunks(size=1 << 24):
    for lo in range(0, 1 << 32, size):
        yield np.arange(lo, lo + size, dtype=np.uint64).astype(np.uint32)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(COUNTERS))
def test_lane_all_inputs(name):
    """[num.flush.c1] every one of the 2^32 bit patterns (measured on 2 shared
    cores: see docs/performance-training.md, GELU)."""
    for pats in all_patterns_in_chunks():
        check(name, pats)
