"""Input generators shared by the case builders: edge-value grids and random
binary32 values with a controlled spread of exponents.

All values are built from bit patterns, so the same seed gives the same bits
on every machine (no decimal parsing, no libm).
"""

from __future__ import annotations

import numpy as np

from ..base import deviant as fp

# Exponent classes (unbiased; -127 means the subnormal/zero encoding) and
# significand patterns: the edge grid is their product, both signs.
EXPONENTS = (-127, -126, -125, -64, -24, -1, 0, 1, 23, 24, 64, 126, 127)
SIGNIFICANDS = (0x000000, 0x000001, 0x2AAAAA, 0x400000, 0x7FFFFE, 0x7FFFFF)
# Specials, each named by the property it exercises.
SPECIALS = (
    0x7F800000,  # +inf
    0xFF800000,  # -inf
    0x7FC00000,  # canonical NaN
    0xFFC00000,  # x86 default NaN (sign set): must never leak
    0x7FFFFFFF,  # CUDA default NaN: must never leak
    0x7FC12345,  # quiet NaN with a payload
    0x7F800001,  # signalling NaN
    0x3F7FFFFE,  # 1 - 2^-23: with 0x00800001 the flush-before-rounding product
    0x3DCCCCCD,  # 0.1, an inexact decimal
    0x40490FDB,  # pi
    0x4B000001,  # 2^23 + 1
)


def edge_values() -> np.ndarray:
    """The edge grid as float32: exponent classes × significand patterns ×
    signs, then the specials.  Finite values with exponent 128 are not
    encodable; the subnormal class with significand 0 is ±0."""
    out = []
    for e in EXPONENTS:
        for m in SIGNIFICANDS:
            for s in (0, 1):
                out.append((s << 31) | ((e + 127) << 23) | m)
    out += list(SPECIALS)
    return fp.f32(out)


def random_f32(rng: np.random.Generator, shape, lo_exp=-8, hi_exp=8, mant_bits=23, positive=False) -> np.ndarray:
    """Random binary32 with uniform exponent in [lo_exp, hi_exp], ``mant_bits``
    random leading significand bits (the rest zero) and a random sign."""
    n = int(np.prod(shape))
    e = rng.integers(lo_exp, hi_exp + 1, n, dtype=np.int64) + 127
    m = rng.integers(0, 1 << mant_bits, n, dtype=np.int64) << (23 - mant_bits)
    s = np.zeros(n, np.int64) if positive else rng.integers(0, 2, n, dtype=np.int64)
    return fp.f32((s << 31) | (e << 23) | m).reshape(shape)


def uniform_f32(rng: np.random.Generator, shape, lo: float, hi: float) -> np.ndarray:
    """Uniform in [lo, hi), drawn in float64 and rounded to binary32 (bits
    depend only on the generator's stream, which NumPy keeps stable)."""
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


def powers_of_two(rng: np.random.Generator, shape, lo_exp=-3, hi_exp=3) -> np.ndarray:
    """±2^e: multiplying by these is exact, so products carry no rounding."""
    n = int(np.prod(shape))
    e = rng.integers(lo_exp, hi_exp + 1, n, dtype=np.int64) + 127
    s = rng.integers(0, 2, n, dtype=np.int64)
    return fp.f32((s << 31) | (e << 23)).reshape(shape)


def subnormals(rng: np.random.Generator, n: int) -> np.ndarray:
    m = rng.integers(1, 1 << 23, n, dtype=np.int64)
    s = rng.integers(0, 2, n, dtype=np.int64)
    return fp.f32((s << 31) | m)


# The exact product of a pair of window_pairs is FLT_MIN (1 - d).  IEEE rounding
# with gradual underflow (the spec) gives FLT_MIN for 0 < d <= 2^-24.  Hardware
# flush modes decide differently which of these are tiny:
#   before rounding (ARM FZ): every d > 0, so all of them become 0;
#   after rounding with an unbounded exponent (x86 MXCSR.FTZ): the product
#     rounded to 24 bits is FLT_MIN only for d <= 2^-25; for 2^-25 < d <= 2^-24
#     it is FLT_MIN (1 - 2^-24) < FLT_MIN, so those become 0.
# Two windows of 2^47 - P (P = mx my, d = (2^47 - P) 2^-47) separate the three.
WINDOW_BEFORE = (0, 1 << 22)  # 0 < d <= 2^-25: the spec and x86 FTZ give FLT_MIN, ARM FZ 0
WINDOW_UNBOUNDED = (1 << 22, 1 << 23)  # 2^-25 < d <= 2^-24: the spec gives FLT_MIN, x86 FTZ and ARM FZ 0


def window_pairs(rng: np.random.Generator, n: int, window=WINDOW_BEFORE) -> tuple[np.ndarray, np.ndarray]:
    """n pairs (x, y) of normal binary32 whose exact product is FLT_MIN (1 - d)
    with lo < d 2^47 <= hi for ``window`` = (lo, hi): IEEE rounding (gradual
    underflow) gives FLT_MIN; which hardware flush gives 0 depends on the
    window (WINDOW_BEFORE, WINDOW_UNBOUNDED above).

    With integer significands mx, my in [2^23, 2^24): my = floor((2^47-1)/mx)
    makes P = mx*my < 2^47; the pair is kept when lo < 2^47 - P <= hi.  Then
    x = mx 2^(t-23), y = my 2^(-150-t) and x*y = P 2^-173.
    """
    lo, hi = window
    xs, ys = [], []
    while len(xs) < n:
        mx = int(rng.integers(1 << 23, 1 << 24))
        my = ((1 << 47) - 1) // mx
        if not ((1 << 23) <= my < (1 << 24)) or not (lo < (1 << 47) - mx * my <= hi):
            continue
        t = int(rng.integers(-60, 0))
        sx, sy = (int(v) for v in rng.integers(0, 2, 2))
        # biased exponents: x = 1.f * 2^t, y = 1.g * 2^(-127-t)
        xs.append((sx << 31) | ((t + 127) << 23) | (mx - (1 << 23)))
        ys.append((sy << 31) | ((-127 - t + 127) << 23) | (my - (1 << 23)))
    return fp.f32(xs), fp.f32(ys)


def neighbours(patterns, radius=2) -> np.ndarray:
    """Each bit pattern and the patterns up to ``radius`` ulps either side
    (same sign; a step below +-0 or past the largest finite is dropped)."""
    out = []
    for p in patterns:
        sign, mag = p & 0x80000000, p & 0x7FFFFFFF
        out += [sign | m for m in range(mag - radius, mag + radius + 1) if 0 <= m <= 0x7F800000]
    return fp.f32(list(dict.fromkeys(out)))


def nearest(values64) -> list[int]:
    """Bit patterns of the binary32 nearest to float64 values (IEEE rounding,
    the same on every machine)."""
    return [int(b) for b in fp.bits(np.asarray(values64, np.float64).astype(np.float32))]


def rounding_pairs() -> tuple[np.ndarray, np.ndarray]:
    """Operand pairs for add, sub, mul, fmax, fmin whose exact result is a
    rounding tie (to even upwards and downwards), lies at the overflow
    threshold (the largest finite plus half an ulp and its neighbours), or is
    1 - 2^-24 and its neighbours; each pair in both orders and both signs."""
    pairs = [
        (0x3F800000, 0x33800000),
        (0x3F800001, 0x33800000),
        (0x3F800000, 0x33800001),
        (0x3F800000, 0xB3800000),
        (0x3F800000, 0xB3000000),
        (0x3F800001, 0xB3800000),
        (0x7F7FFFFF, 0x73000000),
        (0x7F7FFFFF, 0x72FFFFFF),
        (0x7F7FFFFE, 0x73000000),
        (0x7F7FFFFF, 0x7F7FFFFF),
        (0x4B000000, 0x3F000000),
        (0x4B000001, 0x3F000000),
        (0x3F800001, 0x3F800001),
        (0x3F7FFFFF, 0x3F800001),
        (0x3FFFFFFF, 0x3FFFFFFF),
        (0x5F800000, 0x5F800000),
        (0x5F7FFFFF, 0x5F800001),
        (0x1F800000, 0x1F800000),
        (0x20000000, 0x1F000000),
        (0x00800000, 0x3F7FFFFF),
        (0x00800001, 0x3F000000),
    ]
    a, b = [], []
    for x, y in pairs:
        for sx, sy in ((0, 0), (1, 0), (0, 1), (1, 1)):
            a += [x ^ (sx << 31), y ^ (sy << 31)]
            b += [y ^ (sy << 31), x ^ (sx << 31)]
    return fp.f32(a), fp.f32(b)
