"""Clean-room checks of the bf16 conversions ([bf16.round.c1], [bf16.widen.c1],
[bf16.load.c1], [bf16.format.c1]) and of the exactness of bf16 products
([bf16.matmul.c1], [bf16.exact.r1]).

The oracle never uses the library's bit trick (add 0x7FFF + lsb, shift): it
takes the exact value of the binary32 input in float64, scales it so that
the two bf16 neighbours are consecutive integers (np.frexp / np.ldexp,
exact), picks the nearer one with ties to the even integer, and builds the
bf16 value from that integer.  A magnitude that rounds to 2^128 is infinity.
Only then is the (exact) binary32 of the bf16 value cut to its upper 16 bits.

The exhaustive check over all 2^32 binary32 inputs is marked slow: 512
blocks of 2^23 (one per sign and exponent field), about 0.3 s each on one
idle core; measured 496 s on the shared 2-core machine at load 3.
"""

import numpy as np
import pytest

from refreplay.numerics import bf16 as B
from refreplay.ops import bf16 as OB

TWO128 = 2.0**128
FLT_MIN = 2.0**-126


# ---- the oracle --------------------------------------------------------------------


def oracle_encode(u: np.ndarray) -> np.ndarray:
    """uint32 binary32 bit patterns -> uint16 bf16 bits, by exact float64
    arithmetic: [num.load.c1], then round to nearest even at 8 significant
    bits, overflow to infinity, NaN -> 0x7FC0."""
    u = np.asarray(u, np.uint32)
    with np.errstate(invalid="ignore"):
        x = u.view(np.float32).astype(np.float64)
    neg = (u >> 31).astype(bool)
    out = np.empty(u.shape, np.uint16)
    nan = np.isnan(x)
    inf = np.isinf(x)
    sub = np.abs(x) < FLT_MIN  # zeros and subnormals: both give a signed zero
    fin = ~(nan | inf | sub)
    m, e = np.frexp(np.abs(x[fin]))  # |x| = m * 2^e, 0.5 <= m < 1
    out[fin] = _round_binade(np.ldexp(m, 8), e - 8, neg[fin])
    out[nan] = 0x7FC0
    out[inf] = np.where(neg[inf], 0xFF80, 0x7F80)
    out[sub] = np.where(neg[sub], 0x8000, 0x0000)
    return out


def _round_binade(scaled, shift, neg):
    """|x| = scaled * 2^shift with scaled in [128, 256): the two bf16
    neighbours of |x| are floor(scaled) and floor(scaled) + 1 (times
    2^shift); the nearer wins, a tie goes to the even one."""
    lo = np.floor(scaled)
    rest = scaled - lo  # exact: both have at most 24 significant bits
    up = (rest > 0.5) | ((rest == 0.5) & (np.fmod(lo, 2.0) == 1.0))
    mag = np.ldexp(lo + up, shift)
    mag[mag >= TWO128] = np.inf
    val = np.where(neg, -mag, mag) if np.ndim(neg) else (-mag if neg else mag)
    bits = val.astype(np.float32).view(np.uint32)  # exact: val is a bf16 value or +-inf
    assert np.all((bits & 0xFFFF) == 0)
    return (bits >> 16).astype(np.uint16)


def oracle_encode_binade(u: np.ndarray, sign: int, field: int) -> np.ndarray:
    """oracle_encode for inputs that all have one sign and one exponent field
    1..254 (the exhaustive check's blocks): the binade is checked on the
    values, and the scale is one power of two for the block."""
    lo_mag = 2.0 ** (field - 127)
    a = np.abs(u.view(np.float32).astype(np.float64))
    assert np.all((a >= lo_mag) & (a < 2 * lo_mag)) and np.all((u >> 31) == sign)
    return _round_binade(a * 2.0 ** (134 - field), field - 134, bool(sign))


def oracle_value(h: np.ndarray) -> np.ndarray:
    """uint16 bf16 bits -> float64 value after [bf16.load.c1], from the
    fields: (-1)^s (1 + f/128) 2^(e-127); subnormals give a signed zero."""
    h = np.asarray(h, np.uint16).astype(np.int64)
    s, e, f = h >> 15, (h >> 7) & 0xFF, h & 0x7F
    sign = np.where(s == 1, -1.0, 1.0)
    val = sign * np.ldexp(1.0 + f / 128.0, (e - 127).astype(np.int32))
    val = np.where(e == 0, sign * 0.0, val)
    val = np.where((e == 255) & (f == 0), sign * np.inf, val)
    return np.where((e == 255) & (f != 0), np.nan, val)


def oracle_load(h: np.ndarray) -> np.ndarray:
    h = np.asarray(h, np.uint16)
    e, f = (h >> 7) & 0xFF, h & 0x7F
    out = np.where(e == 0, h & 0x8000, h).astype(np.uint16)
    return np.where((e == 255) & (f != 0), np.uint16(0x7FC0), out).astype(np.uint16)


def oracle_decode_bits(h: np.ndarray) -> np.ndarray:
    v = oracle_value(h)
    bits = v.astype(np.float32).view(np.uint32)
    return np.where(np.isnan(v), np.uint32(0x7FC00000), bits).astype(np.uint32)


def f32(bits) -> np.ndarray:
    return np.asarray(bits, np.uint32).view(np.float32)


# ---- inputs ------------------------------------------------------------------------


def edge_grid() -> np.ndarray:
    """Every exponent field (0..255), kept fractions 0x00, 0x01, 0x2A, 0x40,
    0x7E, 0x7F, low halves at and beside the tie (0x0000, 0x0001, 0x7FFF,
    0x8000, 0x8001, 0xFFFF: even and odd kept bits, carries into the exponent
    and, at 0x7F7F..., into infinity), both signs; NaNs with payloads in both
    halves."""
    exps = np.arange(256, dtype=np.uint32)
    kept = np.array([0x00, 0x01, 0x2A, 0x40, 0x7E, 0x7F], np.uint32)
    low = np.array([0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF], np.uint32)
    sign = np.array([0, 1], np.uint32)
    g = (
        (sign[:, None, None, None] << 31)
        | (exps[None, :, None, None] << 23)
        | (kept[None, None, :, None] << 16)
        | low[None, None, None, :]
    )
    return g.reshape(-1)


def random_bits(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 1 << 32, size=n, dtype=np.uint64).astype(np.uint32)


# ---- the oracle itself is right on hand-picked cases -------------------------------------


def test_oracle_on_the_spec_examples():
    """[bf16.round.c1] the worked examples, through the oracle and the library."""
    x = np.array(
        [
            0x3F808000,
            0x3F818000,
            0x3F808001,
            0xBF80FFFF,
            0x7F7FFFFF,
            0x7F7F7FFF,
            0xFF800000,
            0xFFC12345,
            0x00800000,
            0x00000001,
            0x80000001,
        ],
        np.uint32,
    )
    want = np.array([0x3F80, 0x3F82, 0x3F81, 0xBF81, 0x7F80, 0x7F7F, 0xFF80, 0x7FC0, 0x0080, 0x0000, 0x8000], np.uint16)
    assert np.array_equal(oracle_encode(x), want)
    assert np.array_equal(B.encode(f32(x)), want)


def test_the_edge_grid_separates_truncation_and_ties_away():
    """[bf16.probes.c1] the grid is sharp: truncating, or rounding ties away
    from zero, disagrees with the oracle on it."""
    u = edge_grid()
    finite = (u & 0x7F800000) != 0x7F800000
    trunc = (u >> 16).astype(np.uint16)
    away = ((u + 0x8000) >> 16).astype(np.uint16)
    want = oracle_encode(u)
    assert np.any((trunc != want) & finite)
    assert np.any((away != want) & finite)


# ---- encode / round_f32 ------------------------------------------------------------------


def _check_encode(u):
    got = B.encode(f32(u))
    want = oracle_encode(u)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, [f"0x{int(u[i]):08X} -> 0x{int(got[i]):04X}, oracle 0x{int(want[i]):04X}" for i in bad[:5]]
    # [bf16.round.c1] never a bf16 subnormal
    assert not np.any(((got & 0x7F80) == 0) & ((got & 0x7F) != 0))


def test_encode_edge_grid():
    _check_encode(edge_grid())


def test_encode_random_bits():
    _check_encode(random_bits(1 << 20, 1))


def test_encode_nan_payloads_and_infinities():
    payloads = np.array(
        [
            0x7F800001,
            0x7F808000,
            0x7FBFFFFF,
            0x7FC00000,
            0x7FFFFFFF,
            0xFF800001,
            0xFFC00001,
            0xFFFFFFFF,
            0x7F800000,
            0xFF800000,
        ],
        np.uint32,
    )
    got = B.encode(f32(payloads))
    assert np.array_equal(got[:8], np.full(8, 0x7FC0, np.uint16))
    assert list(got[8:]) == [0x7F80, 0xFF80]


def test_round_f32_is_the_oracle_value():
    u = np.concatenate([edge_grid(), random_bits(1 << 18, 2)])
    got = B.round_f32(f32(u)).view(np.uint32)
    want = oracle_encode(u).astype(np.uint32) << 16
    assert np.array_equal(got, want)
    x = f32(u).copy()
    assert B.round_inplace(x) is x
    assert np.array_equal(x.view(np.uint32), want)


# ---- decode / load: every one of the 2^16 bf16 patterns -------------------------------------


ALL16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)


def test_decode_all_bf16_patterns():
    """[bf16.widen.c1] [bf16.load.c1] exact widening after loading."""
    got = B.decode(ALL16).view(np.uint32)
    assert np.array_equal(got, oracle_decode_bits(ALL16))


def test_load_all_bf16_patterns():
    assert np.array_equal(B.load(ALL16), oracle_load(ALL16))
    assert np.array_equal(B.load(ALL16.reshape(256, 256)), oracle_load(ALL16).reshape(256, 256))


def test_decode_then_encode_is_the_identity_on_loaded_values():
    """A loaded bf16 value is a binary32 value: encoding it gives it back."""
    loaded = oracle_load(ALL16)
    assert np.array_equal(B.encode(B.decode(ALL16)), loaded)


# ---- the array forms' contracts ---------------------------------------------------------------


@pytest.mark.parametrize(
    "fn, bad",
    [
        (B.encode, np.zeros(3, np.float64)),
        (B.encode, np.zeros(3, np.uint32)),
        (B.encode, [1.0, 2.0]),
        (B.decode, np.zeros(3, np.int16)),
        (B.decode, np.zeros(3, np.float32)),
        (B.load, np.zeros(3, np.uint32)),
        (B.round_f32, np.zeros(3, np.float16)),
        (B.round_inplace, np.zeros(3, np.float64)),
        (B.round_inplace, np.zeros((3, 4), np.float32)[:, ::2]),
    ],
)
def test_array_forms_reject_wrong_dtypes(fn, bad):
    with pytest.raises(TypeError):
        fn(bad)


def test_round_inplace_rejects_a_read_only_array():
    x = np.zeros(4, np.float32)
    x.setflags(write=False)
    with pytest.raises(TypeError):
        B.round_inplace(x)


def test_shapes_are_kept():
    x = f32(random_bits(24, 3)).reshape(2, 3, 4)
    assert B.encode(x).shape == (2, 3, 4)
    assert B.round_f32(x).shape == (2, 3, 4)
    assert B.decode(B.encode(x)).shape == (2, 3, 4)


def test_as_bits_with_ml_dtypes():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = np.array([1.0, -2.5, 3.0e38, 1e-40], ml_dtypes.bfloat16)
    bits = B.as_bits(x)
    assert bits.dtype == np.uint16
    assert np.array_equal(B.decode(x).view(np.uint32), oracle_decode_bits(bits))


def test_as_bits_leaves_other_arrays_alone():
    h = np.array([0x3F80], np.uint16)
    assert B.as_bits(h) is h
    f = np.zeros(2, np.float16)
    assert B.as_bits(f) is f


# ---- [bf16.matmul.c1] [bf16.exact.r1]: products of bf16 values are exact -------------------


def _check_products(a_bits: np.ndarray, b_bits: np.ndarray):
    """Every product a_i * b_j through the profile's matmul with K = 1
    (C = -0 + a_i b_j): equal to the exact float64 product whenever that is
    zero or in [2^-126, 2^128); otherwise its binary32 rounding, flushed
    ([num.flush.c1]) or infinite."""
    a = oracle_load(a_bits)
    b = oracle_load(b_bits)
    keep_a = np.isfinite(oracle_value(a))
    keep_b = np.isfinite(oracle_value(b))
    a, b = a[keep_a], b[keep_b]
    c = OB.apply("matmul", a.reshape(-1, 1), b.reshape(1, -1))
    assert c.dtype == np.float32 and c.shape == (a.size, b.size)
    exact = oracle_value(a)[:, None] * oracle_value(b)[None, :]  # <= 16 significant bits: exact
    mag = np.abs(exact)
    in_range = (exact == 0) | ((mag >= FLT_MIN) & (mag < TWO128))
    c64 = c.astype(np.float64)
    assert np.array_equal(c64[in_range], exact[in_range])
    # the zero's sign: -0 + p keeps p's sign for a non-zero p, and -0 + +0 = +0
    assert np.array_equal(np.signbit(c[in_range & (exact != 0)]), np.signbit(exact[in_range & (exact != 0)]))
    with np.errstate(over="ignore", invalid="ignore"):
        r = exact[~in_range].astype(np.float32)  # one IEEE rounding of the exact product
        r = np.where(np.abs(r) < np.float32(FLT_MIN), r * np.float32(0), r)
    assert np.array_equal(c[~in_range].view(np.uint32), (r + np.float32(-0.0)).view(np.uint32))
    return int(in_range.sum())


def test_bf16_products_are_exact_random_pairs():
    g = np.random.default_rng(4)
    a = g.integers(0, 1 << 16, 512, dtype=np.uint32).astype(np.uint16)
    b = g.integers(0, 1 << 16, 256, dtype=np.uint32).astype(np.uint16)
    # plus values whose products straddle 2^-126 and 2^128
    edges = np.array(
        [
            0x0080,
            0x0081,
            0x3F80,
            0x3F81,
            0x3FFF,
            0x7F7F,
            0x7F00,
            0x2000,
            0x1F80,
            0x1FFF,
            0x8080,
            0xBF81,
            0xFF7F,
            0x0000,
            0x8000,
        ],
        np.uint16,
    )
    assert _check_products(np.concatenate([a, edges]), np.concatenate([b, edges])) > 100_000


def test_bf16_square_example():
    """[bf16.exact.r1] bf16(0x3F81)^2 = f32(0x3F820200) exactly."""
    c = OB.apply("matmul", np.array([[0x3F81]], np.uint16), np.array([[0x3F81]], np.uint16))
    assert int(c.view(np.uint32)[0, 0]) == 0x3F820200


@pytest.mark.slow
def test_bf16_products_are_exact_all_patterns_times_slices():
    """All 2^16 bf16 patterns times 4 slices of 2^8 random patterns (2^26
    products)."""
    g = np.random.default_rng(5)
    for _ in range(4):
        b = g.integers(0, 1 << 16, 256, dtype=np.uint32).astype(np.uint16)
        _check_products(ALL16, b)


def test_the_binade_oracle_is_the_general_one():
    for sign, field in ((0, 1), (1, 127), (0, 254), (1, 200)):
        u = (np.uint32(sign << 31) | np.uint32(field << 23) | random_bits(1 << 14, field) & np.uint32(0x7FFFFF)).astype(
            np.uint32
        )
        assert np.array_equal(oracle_encode_binade(u, sign, field), oracle_encode(u))


@pytest.mark.slow
def test_encode_all_binary32_inputs():
    """[bf16.round.c1] every one of the 2^32 binary32 inputs against the
    oracle, one block of 2^23 per sign and exponent field (512 blocks; the
    finite normal ones through oracle_encode_binade)."""
    base = np.arange(1 << 23, dtype=np.uint32)
    for block in range(512):
        sign, field = block >> 8, block & 0xFF
        u = base | np.uint32(block << 23)
        got = B.encode(u.view(np.float32))
        want = oracle_encode(u) if field in (0, 255) else oracle_encode_binade(u, sign, field)
        if not np.array_equal(got, want):
            i = int(np.flatnonzero(got != want)[0])
            pytest.fail(f"0x{int(u[i]):08X} -> 0x{int(got[i]):04X}, oracle 0x{int(want[i]):04X}")
