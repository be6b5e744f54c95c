"""Whole-lane vector arithmetic (``refreplay/_tiles.py``: lanes_add,
lanes_sub, lanes_mul, lanes_key_min), the flush-free row sums of
``ops/norms.py`` are built on, and lanes_copy, the matmul's packs.  Each lane must be one IEEE binary32
operation, rounded to nearest and NOT flushed: checked against NumPy's
float32 arithmetic (an independent IEEE implementation, which keeps
subnormals) on random bit patterns, and against the element-by-element
loop for NaN."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit
from numba.core.errors import TypingError

from refreplay._tiles import lanes_add, lanes_copy, lanes_key_min, lanes_mul, lanes_sub, stack_keys

OPS = {"add": np.add, "sub": np.subtract, "mul": np.multiply}


def patterns(n, seed):
    """Random bit patterns, a third of them in the subnormal range and
    around 2^-126 (where a flush would show), plus every special value."""
    rng = np.random.default_rng(seed)
    u = rng.integers(0, 1 << 32, size=n, dtype=np.uint64).astype(np.uint32)
    low = rng.integers(0, 0x01800000, size=n // 3, dtype=np.uint64).astype(np.uint32)
    u[: n // 3] = low | (rng.integers(0, 2, size=n // 3).astype(np.uint32) << np.uint32(31))
    special = np.array(
        [0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0x00000001, 0x00800000], np.uint32
    )
    u[-special.size :] = special
    rng.shuffle(u)
    return u.view(np.float32)


def _runner(n):
    """One lane operation (0 add, 1 sub, 2 mul) on n lanes, b a row or a scalar."""

    @njit
    def run(op, out, a, b):
        if op == 0:
            lanes_add(out, a, b, n)
        elif op == 1:
            lanes_sub(out, a, b, n)
        else:
            lanes_mul(out, a, b, n)

    return run


_run32, _run7 = _runner(32), _runner(7)


def _check(got, a, b, name):
    with np.errstate(all="ignore"):
        want = OPS[name](a, b).astype(np.float32)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan), name
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32)), name


@pytest.mark.parametrize("name", list(OPS))
def test_lanes_equal_ieee_binary32_without_flush(name):
    op = list(OPS).index(name)
    for seed in range(40):
        a, b = patterns(32, seed), patterns(32, seed + 1000)
        out = np.full(32, np.float32(7.0))
        _run32(op, out, a, b)
        _check(out, a, b, name)
        _run32(op, out, a, b[5])  # one value in every lane
        _check(out, a, np.full(32, b[5]), name)


def test_lanes_keep_subnormal_results():
    """A result below 2^-126 stays as it is: flushing is the caller's job
    (it uses these only where it has proved a flush an identity)."""
    a = np.full(32, np.float32(1.5 * 2.0**-126))
    b = np.full(32, np.float32(2.0**-126))
    out = np.empty(32, np.float32)
    _run32(1, out, a, b)  # sub
    assert np.all(out == np.float32(2.0**-127)) and np.all(out != 0)
    _run32(2, out, a, np.float32(0.5))  # mul
    assert np.all(out == np.float32(0.75 * 2.0**-126))


@pytest.mark.parametrize("name", list(OPS))
def test_lanes_touch_only_n_elements_and_may_alias(name):
    op = list(OPS).index(name)
    a, b = patterns(12, 1), patterns(12, 2)
    out = np.full(12, np.float32(3.0))
    _run7(op, out, a, b)
    _check(out[:7], a[:7], b[:7], name)
    assert np.all(out[7:] == np.float32(3.0))
    c = a.copy()
    _run7(op, c, c, b)  # out is a
    _check(c[:7], a[:7], b[:7], name)
    assert np.array_equal(c[7:].view(np.uint32), a[7:].view(np.uint32))


@njit
def _keys(rows):
    k = stack_keys(32)
    for r in range(32):
        k[r] = np.uint32(0xFFFFFFFF)
    for i in range(rows.shape[0]):
        lanes_key_min(k, rows[i], 32)
    out = np.empty(32, np.uint32)
    for r in range(32):
        out[r] = k[r]
    return out


def test_lanes_key_min_is_the_least_key_of_abs():
    """(bits & 0x7FFFFFFF) - 1, unsigned: ordered as |x| for finite nonzero
    x; +-0 wraps round to the largest key."""
    for seed in range(20):
        rows = patterns(5 * 32, seed).reshape(5, 32)
        keys = (rows.view(np.uint32) & np.uint32(0x7FFFFFFF)) - np.uint32(1)  # numpy wraps uint32 too
        assert np.array_equal(_keys(rows), keys.min(axis=0))
    rows = np.zeros((2, 32), np.float32)
    rows[1] = -0.0
    assert np.all(_keys(rows) == np.uint32(0xFFFFFFFF))


@njit
def _copy(out, o, a, i):
    lanes_copy(out[o:], a[i:], 48)


@njit
def _copy8(out, a):
    lanes_copy(out, a, 8)


def test_lanes_copy_moves_bits_only():
    """Every bit pattern arrives unchanged (NaN payloads, signalling NaNs,
    subnormals, -0), at any element offset, and nothing past n lanes."""
    for seed in range(20):
        a = patterns(64, seed)
        a.view(np.uint32)[::7] = np.uint32(0x7F800001 + seed)  # signalling NaNs with payloads
        for o, i in ((0, 0), (3, 5), (16, 1)):
            out = np.full(70, np.float32(3.0))
            _copy(out, o, a, i)
            assert np.array_equal(out[o : o + 48].view(np.uint32), a[i : i + 48].view(np.uint32))
            assert np.all(out[:o] == 3.0) and np.all(out[o + 48 :] == 3.0)
    out = np.full(12, np.float32(3.0))
    _copy8(out, patterns(12, 3))
    assert np.array_equal(out[:8].view(np.uint32), patterns(12, 3)[:8].view(np.uint32))
    assert np.all(out[8:] == 3.0)


def test_lanes_refuse_what_they_cannot_do():
    """A run-time lane count, float64 rows or a strided view: a typing error."""

    @njit
    def dynamic(out, a, n):
        lanes_add(out, a, a, n)

    @njit
    def fixed(out, a):
        lanes_add(out, a, a, 4)

    with pytest.raises(TypingError):
        dynamic(np.zeros(4, np.float32), np.zeros(4, np.float32), 4)
    with pytest.raises(TypingError):
        fixed(np.zeros(4), np.zeros(4))
    with pytest.raises(TypingError):
        fixed(np.zeros(8, np.float32)[::2], np.zeros(4, np.float32))

    @njit
    def copy_dynamic(out, a, n):
        lanes_copy(out, a, n)

    @njit
    def copy_fixed(out, a):
        lanes_copy(out, a, 4)

    with pytest.raises(TypingError):
        copy_dynamic(np.zeros(4, np.float32), np.zeros(4, np.float32), 4)
    with pytest.raises(TypingError):
        copy_fixed(np.zeros(4, np.float32), np.zeros(4))
    with pytest.raises(TypingError):
        copy_fixed(np.zeros(4, np.float32), np.zeros(8, np.float32)[::2])
