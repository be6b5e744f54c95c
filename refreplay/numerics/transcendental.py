"""Transcendental functions defined by algorithm (``spec/02-transcendentals.txt``).

Each function is the clause's algorithm written out step for step, under the
common rules of [num.trans.c1]: range reduction with Cody-Waite constants, a
polynomial evaluated by Horner's rule, and reconstruction by an exact power
of two.  Every multiply and add goes through ``mul``/``add``/``sub`` of
``core`` (rounded separately, flushed, NaN-canonical; [num.nofma.c1]), every
quotient is ``a * recip(b)``.  No vendor ``exp``/``log``/``sin`` is called:
their bits differ between libm, NumPy and CUDA, which is exactly what the
spec exists to pin down.

Constants are bit patterns (``_c(0x...)``) so that the code, the spec and the
independent transcription in ``tests/naive_numerics.py`` can be compared by
eye; the coefficients were fitted by ``scripts/fit_coefficients.py``.

The scalar functions have the explicit signature ``float32(float32)``: a
Python float passed from Python is converted to binary32 first, never
evaluated in binary64.
"""

from __future__ import annotations

import numpy as np

from .._jit import kernel
from ._bits import bits_f32, f32_bits
from .core import CANONICAL_NAN_BITS, FLT_MIN, add, mul, recip, rint, sub


def _c(bits: int) -> np.float32:
    """The float32 whose bit pattern is ``bits`` (constants are written in hex)."""
    return np.array([bits], dtype=np.uint32).view(np.float32)[0]


ONE = _c(0x3F800000)
TWO = _c(0x40000000)
HALF = _c(0x3F000000)
MINUS_HALF = _c(0xBF000000)
NAN = _c(0x7FC00000)
INF = _c(0x7F800000)

# ---- [num.exp.c1] ----------------------------------------------------------
EXP_OVERFLOW = _c(0x42B17217)  # largest x with a finite result (88.72283)
EXP_UNDERFLOW = _c(0xC2B00000)  # -88: below, the result is below 2^-126
INV_LN2 = _c(0x3FB8AA3B)  # 1/ln 2 rounded
LN2_HI = _c(0x3F317200)  # ln 2 to 15 bits: k * LN2_HI is exact for |k| <= 255
LN2_LO = _c(0x35BFBE8E)  # ln 2 - LN2_HI rounded
EXP_C2 = _c(0x3EFFFFFE)
EXP_C3 = _c(0x3E2AAA49)
EXP_C4 = _c(0x3D2AAC79)
EXP_C5 = _c(0x3C091D06)
EXP_C6 = _c(0x3AB511F7)

# ---- [num.log.c1] ----------------------------------------------------------
SQRT2 = _c(0x3FB504F3)
LOG_L1 = _c(0x3F2AAAAB)
LOG_L2 = _c(0x3ECCCCF6)
LOG_L3 = _c(0x3E922E03)
LOG_L4 = _c(0x3E6EED18)

# ---- [num.tanh.c1] ---------------------------------------------------------
TANH_SMALL = _c(0x3F400000)  # 0.75: below, the odd polynomial; above, via exp
TANH_T1 = _c(0xBEAAAAA5)
TANH_T2 = _c(0x3E0886ED)
TANH_T3 = _c(0xBD5CC0CC)
TANH_T4 = _c(0x3CAFCBB4)
TANH_T5 = _c(0xBBFB4E28)
TANH_T6 = _c(0x3AE49BBD)

# ---- [num.sincos.c1] -------------------------------------------------------
TRIG_MAX = _c(0x46800000)  # 16384: the domain |x| <= 2^14
TWO_OVER_PI = _c(0x3F22F983)
PIO2_1 = _c(0x3FC90000)  # PIO2_1 + PIO2_2 + PIO2_3 + PIO2_4 = pi/2 + 1.2e-18;
PIO2_2 = _c(0x39FD8000)  # the first three have <= 9 significant bits, so
PIO2_3 = _c(0x34A88000)  # k * PIO2_i is exact for |k| < 2^15
PIO2_4 = _c(0x2E85A309)
SIN_S1 = _c(0xBE2AAAAB)
SIN_S2 = _c(0x3C088884)
SIN_S3 = _c(0xB95007CF)
SIN_S4 = _c(0x36366C2C)
COS_C1 = _c(0x3D2AAAAB)
COS_C2 = _c(0xBAB60B5C)
COS_C3 = _c(0x37D0086F)
COS_C4 = _c(0xB4920F41)


@kernel
def _pow2(j):
    """2^j as the float32 with biased exponent j + 127, for -126 <= j <= 127
    (exact by construction: [num.exp.c1] step 5)."""
    return bits_f32(np.uint32((j + 127) << 23))


@kernel("float32(float32)")
def exp(x):
    """[num.exp.c1] e^x: Cody-Waite reduction by ln 2, degree-6 polynomial
    1 + r + r^2 q(r), scaling by 2^k in two exact steps, then flush."""
    if x != x:
        return bits_f32(CANONICAL_NAN_BITS)
    if x > EXP_OVERFLOW:
        return INF
    if x < EXP_UNDERFLOW:
        return np.float32(0.0)
    k = rint(mul(x, INV_LN2))
    hi = sub(x, mul(k, LN2_HI))  # exact (Sterbenz): see the clause
    lo = mul(k, LN2_LO)
    r = sub(hi, lo)
    q = add(EXP_C5, mul(r, EXP_C6))
    q = add(EXP_C4, mul(r, q))
    q = add(EXP_C3, mul(r, q))
    q = add(EXP_C2, mul(r, q))
    # hi and lo are kept apart so that the rounding of r enters only the
    # small term r^2 q: this is what keeps exp within 1 ulp.
    p = add(ONE, add(hi, sub(mul(mul(r, r), q), lo)))
    ki = np.int32(k)
    k1 = ki >> 1  # floor(k / 2): both halves keep 2^j a normal number
    k2 = ki - k1
    return mul(mul(p, _pow2(k1)), _pow2(k2))


@kernel("float32(float32)")
def log(x):
    """[num.log.c1] natural logarithm: x = 2^e m with m in (sqrt(1/2), sqrt(2)],
    f = m - 1, s = f * recip(2 + f), log(1+f) = f - (f^2/2 - s (f^2/2 + R(s^2)))."""
    if x != x:
        return bits_f32(CANONICAL_NAN_BITS)
    if abs(x) < FLT_MIN:  # +-0, and subnormals treated as zeros
        return -INF
    if x < np.float32(0.0):
        return bits_f32(CANONICAL_NAN_BITS)
    if x == INF:
        return INF
    b = f32_bits(x)
    e = np.int32(b >> np.uint32(23)) - np.int32(127)
    m = bits_f32(np.uint32((b & np.uint32(0x007FFFFF)) | np.uint32(0x3F800000)))
    if m > SQRT2:
        m = mul(m, HALF)  # exact
        e += 1
    f = sub(m, ONE)  # exact (Sterbenz)
    s = mul(f, recip(add(TWO, f)))
    z = mul(s, s)
    w = add(LOG_L3, mul(z, LOG_L4))
    w = add(LOG_L2, mul(z, w))
    w = add(LOG_L1, mul(z, w))
    big_r = mul(z, w)
    hfsq = mul(mul(HALF, f), f)
    t = mul(s, add(hfsq, big_r))
    if e == 0:
        return sub(f, sub(hfsq, t))
    dk = np.float32(e)  # |e| <= 128: exact
    return sub(mul(dk, LN2_HI), sub(sub(hfsq, add(t, mul(dk, LN2_LO))), f))


@kernel("float32(float32)")
def tanh(x):
    """[num.tanh.c1] odd polynomial a + a (z P(z)) for |x| < 0.75, otherwise
    1 - 2 * recip(exp(2|x|) + 1); the sign of x is put back exactly."""
    if x != x:
        return bits_f32(CANONICAL_NAN_BITS)
    a = abs(x)
    if a < TANH_SMALL:
        z = mul(a, a)
        p = add(TANH_T5, mul(z, TANH_T6))
        p = add(TANH_T4, mul(z, p))
        p = add(TANH_T3, mul(z, p))
        p = add(TANH_T2, mul(z, p))
        p = add(TANH_T1, mul(z, p))
        y = add(a, mul(a, mul(z, p)))
    else:
        e = exp(add(a, a))
        y = sub(ONE, mul(TWO, recip(add(e, ONE))))
    return -y if f32_bits(x) >= np.uint32(0x80000000) else y


@kernel("float32(float32)")
def sigmoid(x):
    """[num.sigmoid.c1] x >= 0: recip(1 + exp(-x)); x < 0: with t = exp(x),
    t - t * (t * recip(1 + t)) (keeps the small result accurate)."""
    if x != x:
        return bits_f32(CANONICAL_NAN_BITS)
    if x >= np.float32(0.0):  # includes -0
        return recip(add(ONE, exp(-x)))
    t = exp(x)
    d = recip(add(ONE, t))
    return sub(t, mul(t, mul(t, d)))


@kernel
def _sincos_reduced(x):
    """[num.sincos.c1] steps 2-4: (sin r, cos r, k mod 4) for |x| <= 2^14."""
    k = rint(mul(x, TWO_OVER_PI))
    r = sub(x, mul(k, PIO2_1))  # exact (Sterbenz)
    r = sub(r, mul(k, PIO2_2))
    r = sub(r, mul(k, PIO2_3))
    r = sub(r, mul(k, PIO2_4))
    z = mul(r, r)
    s = add(SIN_S3, mul(z, SIN_S4))
    s = add(SIN_S2, mul(z, s))
    s = add(SIN_S1, mul(z, s))
    sin_r = add(r, mul(r, mul(z, s)))
    c = add(COS_C3, mul(z, COS_C4))
    c = add(COS_C2, mul(z, c))
    c = add(COS_C1, mul(z, c))
    cos_r = add(ONE, mul(z, add(MINUS_HALF, mul(z, c))))
    return sin_r, cos_r, np.int32(k) & np.int32(3)


@kernel("float32(float32)")
def sin(x):
    """[num.sincos.c1] sine for |x| <= 2^14 by reduction modulo pi/2 in four
    parts; NaN outside that domain, sin(+-0) = +-0."""
    if x != x or abs(x) > TRIG_MAX:
        return bits_f32(CANONICAL_NAN_BITS)
    if x == np.float32(0.0):
        return x
    sin_r, cos_r, n = _sincos_reduced(x)
    if n == 0:
        return sin_r
    if n == 1:
        return cos_r
    if n == 2:
        return -sin_r
    return -cos_r


@kernel("float32(float32)")
def cos(x):
    """[num.sincos.c1] cosine for |x| <= 2^14 (same reduction as sin); NaN
    outside that domain."""
    if x != x or abs(x) > TRIG_MAX:
        return bits_f32(CANONICAL_NAN_BITS)
    sin_r, cos_r, n = _sincos_reduced(x)
    if n == 0:
        return cos_r
    if n == 1:
        return -sin_r
    if n == 2:
        return -cos_r
    return sin_r
