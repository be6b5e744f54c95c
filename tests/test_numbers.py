"""Chapter 1 (numbers) against an exact oracle, bit for bit.

The oracle is MPFR through gmpy2 with a binary32 context (precision 24,
subnormals, exponent range of binary32, round to nearest-even): it gives the
correctly rounded IEEE result with gradual underflow.  The test then applies
the spec's own rules -- flush a subnormal result to the zero of its sign
[num.flush.c1], canonical NaN [num.nan.c1] -- and compares every bit with
the reference's array forms (``refreplay.numerics.elementwise``) and, on a
sample, its scalar forms.

Inputs (>= 100,000 per operation): uniformly random bit patterns, random
moderate values (products and sums that neither overflow nor underflow), an
edge grid crossed with itself (+-0, subnormals, FLT_MIN and neighbours, max
finite, +-inf, NaNs with payloads and both signs), pairs whose exact product
lies in [2^-126 (1 - 2^-23), 2^-126), and sums that cancel to a subnormal.
"""

from __future__ import annotations

import math
from fractions import Fraction

import gmpy2
import numpy as np
import pytest

from refreplay import numerics
from refreplay.numerics import elementwise as ew

BINARY32 = gmpy2.context(precision=24, emin=-148, emax=128, subnormalize=True, round=gmpy2.RoundToNearest)
FLT_MIN = 2.0**-126
CANON = 0x7FC00000
N_RANDOM = 50_000

EDGE_BITS = [
    0x00000000,
    0x00000001,
    0x00000002,
    0x003FFFFF,
    0x00400000,
    0x007FFFFE,
    0x007FFFFF,
    0x00800000,
    0x00800001,
    0x00800002,
    0x00FFFFFF,
    0x01000000,
    0x33800000,
    0x33800001,
    0x34000000,
    0x3EFFFFFF,
    0x3F000000,
    0x3F000001,
    0x3F7FFFFE,
    0x3F7FFFFF,
    0x3F800000,
    0x3F800001,
    0x3F800800,
    0x3F801000,
    0x3FC00000,
    0x40000000,
    0x40200000,
    0x40400000,
    0x4AFFFFFF,
    0x4B000000,
    0x4B000001,
    0x4B7FFFFF,
    0x4C000000,
    0x7E7FFFFF,
    0x7E800000,
    0x7E800001,
    0x7F000000,
    0x7F7FFFFE,
    0x7F7FFFFF,
    0x7F800000,
    0x7F800001,
    0x7FBFFFFF,
    0x7FC00000,
    0x7FC12345,
    0x7FFFFFFF,
]
EDGE_BITS += [b | 0x80000000 for b in EDGE_BITS]


def f32_array(bits) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint64).astype(np.uint32).view(np.float32)


def bits_array(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)


def scalar_bits(v) -> int:
    """Bits of a scalar result (Numba returns float32 results as Python floats;
    the conversion back to float32 is exact)."""
    return int(np.float32(v).view(np.uint32))


def spec_rules(value: float) -> int:
    """[num.flush.c1] and [num.nan.c1] applied to a correctly rounded binary32
    value (given as a Python float); returns the result's bit pattern."""
    if math.isnan(value):
        return CANON
    if value != 0 and abs(value) < FLT_MIN:
        value = math.copysign(0.0, value)
    return int(np.array([value], dtype=np.float32).view(np.uint32)[0])


def oracle_binary(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    fn = {"add": BINARY32.add, "sub": BINARY32.sub, "mul": BINARY32.mul}[op]
    out = np.empty(a.size, dtype=np.uint32)
    for i, (x, y) in enumerate(zip(a.tolist(), b.tolist())):
        out[i] = spec_rules(float(fn(gmpy2.mpfr(x), gmpy2.mpfr(y))))
    return out


def oracle_unary(op: str, a: np.ndarray) -> np.ndarray:
    fn = {"recip": lambda x: BINARY32.div(1, x), "sqrt": BINARY32.sqrt, "rint": BINARY32.rint}[op]
    out = np.empty(a.size, dtype=np.uint32)
    for i, x in enumerate(a.tolist()):
        out[i] = spec_rules(float(fn(gmpy2.mpfr(x))))
    return out


def random_bits(rng, n) -> np.ndarray:
    return f32_array(rng.integers(0, 2**32, n, dtype=np.uint64))


def moderate(rng, n) -> np.ndarray:
    """Random sign and mantissa, exponent within 2^-27 .. 2^27."""
    sign = rng.integers(0, 2, n, dtype=np.uint64) << 31
    expo = rng.integers(100, 155, n, dtype=np.uint64) << 23
    mant = rng.integers(0, 2**23, n, dtype=np.uint64)
    return f32_array(sign | expo | mant)


def product_band_pairs(rng, n):
    """Pairs (a, b) whose exact product lies in [2^-126 (1 - 2^-23), 2^-126):
    the products on which tininess before and after rounding disagree."""
    lo, hi = Fraction(FLT_MIN) * (1 - Fraction(1, 2**23)), Fraction(FLT_MIN)
    a = np.abs(moderate(rng, 4 * n))
    a = a[(a > np.float32(2.0**-20)) & (a < np.float32(2.0**20))]
    target = FLT_MIN * (1 - rng.uniform(0, 2.0**-23, a.size))
    b = (target / a.astype(np.float64)).astype(np.float32)
    keep = [i for i in range(a.size) if lo <= Fraction(float(a[i])) * Fraction(float(b[i])) < hi][:n]
    sign = rng.integers(0, 2, len(keep)).astype(bool)
    aa = a[keep].copy()
    aa[sign] = -aa[sign]
    return aa, b[keep]


def cancelling_pairs(rng, n):
    """a + b with b close to -a near FLT_MIN: the exact sum is subnormal."""
    a = f32_array(rng.integers(0x00800000, 0x01800000, n, dtype=np.uint64))
    delta = rng.integers(-(2**22), 2**22, n)
    b = -f32_array((bits_array(a).astype(np.int64) + delta).clip(0x00800000, 0x7F7FFFFF))
    return a, b


def binary_inputs(seed: int):
    rng = np.random.default_rng(seed)
    grid_a, grid_b = np.meshgrid(f32_array(EDGE_BITS), f32_array(EDGE_BITS))
    band_a, band_b = product_band_pairs(rng, 4000)
    can_a, can_b = cancelling_pairs(rng, 4000)
    a = np.concatenate(
        [random_bits(rng, N_RANDOM), moderate(rng, N_RANDOM), grid_a.ravel(), band_a, can_a, moderate(rng, 4000)]
    )
    b = np.concatenate(
        [random_bits(rng, N_RANDOM), moderate(rng, N_RANDOM), grid_b.ravel(), band_b, can_b, random_bits(rng, 4000)]
    )
    return a, b


def unary_inputs(seed: int):
    rng = np.random.default_rng(seed)
    return np.concatenate(
        [
            random_bits(rng, N_RANDOM),
            moderate(rng, N_RANDOM),
            f32_array(EDGE_BITS),
            rng.uniform(-300, 300, 4000).astype(np.float32),
            (rng.integers(-600, 600, 4000) / np.float32(4)).astype(np.float32),
        ]
    )


def assert_same_bits(op, inputs, want, got):
    bad = np.nonzero(want != got)[0]
    if bad.size:
        i = bad[0]
        args = ", ".join(f"0x{int(bits_array(x)[i]):08X}" for x in inputs)
        pytest.fail(f"{op}({args}) = 0x{int(got[i]):08X}, oracle says 0x{int(want[i]):08X} ({bad.size} mismatches)")


@pytest.mark.parametrize("op,seed", [("add", 1), ("sub", 2), ("mul", 3)])
def test_add_sub_mul_match_exact_oracle(op, seed):
    """[num.format.c1] [num.add.c1] [num.mul.c1] [num.flush.c1] [num.nan.c1]:
    IEEE binary32 round-to-nearest-even, then flush, then canonical NaN."""
    a, b = binary_inputs(seed)
    assert a.size >= 100_000
    want = oracle_binary(op, a, b)
    assert_same_bits(op, (a, b), want, bits_array(getattr(ew, op)(a, b)))
    scalar = getattr(numerics, op)
    sample = range(0, a.size, 97)
    got = np.array([scalar_bits(scalar(a[i], b[i])) for i in sample], np.uint32)
    assert_same_bits(op, (a[::97], b[::97]), want[::97], got)


@pytest.mark.parametrize("op,seed", [("recip", 4), ("sqrt", 5), ("rint", 6)])
def test_recip_sqrt_rint_match_exact_oracle(op, seed):
    """[num.recip.c1] [num.sqrt.c1] [num.rint.c1]: correctly rounded 1/x and
    sqrt(x), round-to-integer ties-to-even, each then flushed and NaN-canonical."""
    x = unary_inputs(seed)
    assert x.size >= 100_000
    want = oracle_unary(op, x)
    assert_same_bits(op, (x,), want, bits_array(getattr(ew, op)(x)))
    scalar = getattr(numerics, op)
    got = np.array([scalar_bits(scalar(v)) for v in x[::97]], np.uint32)
    assert_same_bits(op, (x[::97],), want[::97], got)


def minmax_oracle(op: str, a: float, b: float) -> int:
    """[num.minmax.c1] as written: NaN propagates; max(-0, +0) = +0 and
    min(-0, +0) = -0; otherwise the larger (smaller) operand; then flushed."""
    if math.isnan(a) or math.isnan(b):
        return CANON
    if a == b == 0:
        neg_a, neg_b = math.copysign(1, a) < 0, math.copysign(1, b) < 0
        pick_negative = (neg_a and neg_b) if op == "fmax" else (neg_a or neg_b)
        return spec_rules(-0.0 if pick_negative else 0.0)
    return spec_rules(max(a, b) if op == "fmax" else min(a, b))


@pytest.mark.parametrize("op,seed", [("fmax", 7), ("fmin", 8)])
def test_fmax_fmin_match_spec_rules(op, seed):
    """[num.minmax.c1] [num.nan.c1] [num.flush.c1]"""
    a, b = binary_inputs(seed)
    want = np.array([minmax_oracle(op, x, y) for x, y in zip(a.tolist(), b.tolist())], np.uint32)
    assert_same_bits(op, (a, b), want, bits_array(getattr(ew, op)(a, b)))


def test_product_band_flushes_after_rounding():
    """[num.flush.c1] exact products in [2^-126 (1 - 2^-23), 2^-126): those that
    round up to 2^-126 are kept (tininess after rounding), the others flush.
    Both outcomes must occur among the generated pairs, or the test proves
    nothing."""
    a, b = product_band_pairs(np.random.default_rng(9), 4000)
    assert a.size >= 1000
    got = bits_array(ew.mul(a, b)) & 0x7FFFFFFF
    assert set(np.unique(got).tolist()) == {0x00000000, 0x00800000}
    assert (got == 0).sum() > 100 and (got == 0x00800000).sum() > 100
    assert_same_bits("mul", (a, b), oracle_binary("mul", a, b), bits_array(ew.mul(a, b)))


def test_x86_arm_disagreement_example():
    """[num.flush.c1] the brief's probe: 0x00800001 * 0x3F7FFFFE is exactly
    below 2^-126 but rounds to 2^-126, which is kept (ARM's FZ mode gives 0)."""
    a, b = f32_array([0x00800001]), f32_array([0x3F7FFFFE])
    assert Fraction(float(a[0])) * Fraction(float(b[0])) < Fraction(FLT_MIN)
    assert bits_array(ew.mul(a, b))[0] == 0x00800000


def test_multiply_add_is_never_fused():
    """[num.nofma.c1] a = b = 1 + 2^-12, c = -(1 + 2^-11): unfused a*b + c = 0,
    fused (one rounding) it would be 2^-24; checked in scalar and array forms
    and against the oracle's single-rounding value."""
    a, c = f32_array([0x3F800800] * 8), f32_array([0xBF801000] * 8)
    fused = BINARY32.fma(gmpy2.mpfr(float(a[0])), gmpy2.mpfr(float(a[0])), gmpy2.mpfr(float(c[0])))
    assert spec_rules(float(fused)) == 0x33800000
    assert np.all(bits_array(ew.add(ew.mul(a, a), c)) == 0)
    assert scalar_bits(numerics.add(numerics.mul(a[0], a[0]), c[0])) == 0


def test_saturate_i8():
    """[num.sat.c1] integral values clamp to [-128, 127], NaN gives 0, +-inf saturate."""
    rng = np.random.default_rng(10)
    x = np.concatenate([np.arange(-300, 301, dtype=np.float32), ew.rint(moderate(rng, 100_000)), f32_array(EDGE_BITS)])
    with np.errstate(invalid="ignore"):
        x = x[(x == np.floor(x)) | np.isnan(x)]  # integral (incl. +-inf) or NaN
    assert x.size >= 100_000
    got = np.array([numerics.saturate_i8(v) for v in x], dtype=np.int64)
    want = np.array([0 if math.isnan(v) else int(min(127.0, max(-128.0, v))) for v in x.tolist()])
    bad = np.nonzero(got != want)[0]
    assert bad.size == 0, f"saturate_i8({x[bad[0]]!r}) = {got[bad[0]]}, want {want[bad[0]]}"


def test_load_zeroes_subnormals_and_canonicalises_nans():
    """[num.load.c1] every subnormal becomes the zero of its sign, every NaN
    0x7FC00000, everything else is copied bit for bit; shape is kept."""
    rng = np.random.default_rng(11)
    x = np.concatenate(
        [
            random_bits(rng, 100_000),
            f32_array(EDGE_BITS),
            f32_array(rng.integers(0, 0x00800000, 2000, dtype=np.uint64) | (1 << 31)),
        ]
    )
    before = bits_array(x).copy()
    want = np.array([spec_rules(v) for v in x.tolist()], dtype=np.uint32)
    got = numerics.load(x.reshape(1, -1))
    assert got.shape == (1, x.size) and got.dtype == np.float32
    assert_same_bits("load", (x,), want, bits_array(got).ravel())
    assert np.array_equal(bits_array(x), before), "load must not modify its input"


def test_array_forms_validate_inputs():
    """Public array functions reject wrong dtypes and mismatched shapes clearly."""
    x = np.ones(3, dtype=np.float32)
    with pytest.raises(TypeError, match="float32"):
        ew.add(x, np.ones(3))
    with pytest.raises(TypeError, match="numpy float32 array"):
        ew.exp([1.0, 2.0])
    with pytest.raises(ValueError, match="same shape"):
        ew.mul(x, np.ones((3, 1), dtype=np.float32))
    y = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]  # non-contiguous view
    assert np.array_equal(ew.add(y, y), y + y) and ew.add(y, y).shape == (3, 2)
