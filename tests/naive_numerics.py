"""An independent transcription of the spec's numerics, for tests only.

Written from the text of ``spec/01-numbers.txt`` and
``spec/02-transcendentals.txt`` -- never by calling refreplay -- on NumPy
float32 scalars: NumPy rounds each scalar float32 ``+``, ``*`` and ``/`` to
nearest-even in binary32 and never fuses, so each primitive below is the IEEE
operation followed by the spec's flush and NaN rule, spelled out in Python.
It is slow and obvious on purpose; the tests compare the compiled library with
it bit for bit.
"""

from __future__ import annotations

import numpy as np

F = np.float32
MIN_NORMAL = np.array([0x00800000], dtype=np.uint32).view(F)[0]


def f32(bits: int) -> np.float32:
    """[conv.values.c1] f32(0x...) -> the binary32 with that bit pattern."""
    return np.uint32(bits).view(F)


def bits(x) -> int:
    return int(F(x).view(np.uint32))


CANON = f32(0x7FC00000)
F_ONE = f32(0x3F800000)


def quiet(fn):
    """Run fn with NumPy's overflow/invalid warnings off: inf and NaN results
    are expected values here, not accidents.  (Only the chapter-2 functions
    are wrapped; entering errstate for every primitive would triple the
    time.)"""

    def wrapper(*args):
        with np.errstate(all="ignore"):
            return fn(*args)

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


def finish(r):
    """[num.flush.c1] then [num.nan.c1] on an IEEE-rounded float32 result.
    (Every value in this module is already an np.float32, so the primitives
    below operate on float32 scalars without converting.)"""
    if r != r:
        return CANON
    if r != 0 and abs(r) < MIN_NORMAL:
        return f32(bits(r) & 0x80000000)  # zero of the same sign
    return r


def add(a, b):
    return finish(a + b)


def sub(a, b):
    return add(a, neg(b))


def mul(a, b):
    return finish(a * b)


def recip(x):
    return finish(F_ONE / x)


def neg(x):
    """-x flips the sign bit (exact)."""
    return f32(bits(x) ^ 0x80000000)


def rint(x):
    """[num.rint.c1] (|x| + 2^23) - 2^23 with the sign of x."""
    x = F(x)
    if x != x:
        return CANON
    ax = abs(x)
    if ax >= MAGIC:
        return x
    r = (ax + MAGIC) - MAGIC
    return neg(r) if bits(x) & 0x80000000 else r


def pow2(j: int):
    """2^j for -126 <= j <= 127 from its exponent bits ([num.trans.c1])."""
    assert -126 <= j <= 127
    return f32((j + 127) << 23)


def horner(coeffs_high_to_low, z):
    """Horner(c_n, ..., c_1; z): p = c_n; p = c_i + z * p."""
    p = coeffs_high_to_low[0]
    for c in coeffs_high_to_low[1:]:
        p = add(c, mul(z, p))
    return p


# ---- chapter 2, clause by clause ---------------------------------------------

LN2_HI, LN2_LO = f32(0x3F317200), f32(0x35BFBE8E)
ONE, TWO, HALF = f32(0x3F800000), f32(0x40000000), f32(0x3F000000)
INF = f32(0x7F800000)
MAGIC = f32(0x4B000000)
EXP_MAX, EXP_MIN, INV_LN2 = f32(0x42B17217), f32(0xC2B00000), f32(0x3FB8AA3B)
EXP_C = [f32(b) for b in (0x3AB511F7, 0x3C091D06, 0x3D2AAC79, 0x3E2AAA49, 0x3EFFFFFE)]  # C6..C2
SQRT2 = f32(0x3FB504F3)
LOG_L = [f32(b) for b in (0x3E6EED18, 0x3E922E03, 0x3ECCCCF6, 0x3F2AAAAB)]  # L4..L1
TANH_SMALL = f32(0x3F400000)
TANH_T = [f32(b) for b in (0x3AE49BBD, 0xBBFB4E28, 0x3CAFCBB4, 0xBD5CC0CC, 0x3E0886ED, 0xBEAAAAA5)]  # T6..T1
TRIG_MAX, TWO_OVER_PI = f32(0x46800000), f32(0x3F22F983)
PIO2 = [f32(b) for b in (0x3FC90000, 0x39FD8000, 0x34A88000, 0x2E85A309)]
SIN_S = [f32(b) for b in (0x36366C2C, 0xB95007CF, 0x3C088884, 0xBE2AAAAB)]  # S4..S1
COS_C = [f32(b) for b in (0xB4920F41, 0x37D0086F, 0xBAB60B5C, 0x3D2AAAAB)]  # C4..C1
MINUS_HALF = f32(0xBF000000)


@quiet
def exp(x):
    """[num.exp.c1]"""
    x = F(x)
    if x != x:
        return CANON
    if x > EXP_MAX:
        return INF
    if x < EXP_MIN:
        return F(0.0)
    k = rint(mul(x, INV_LN2))
    hi = sub(x, mul(k, LN2_HI))
    lo = mul(k, LN2_LO)
    r = sub(hi, lo)
    q = horner(EXP_C, r)
    p = add(ONE, add(hi, sub(mul(mul(r, r), q), lo)))
    ki = int(k)
    k1 = ki // 2  # floor
    k2 = ki - k1
    return mul(mul(p, pow2(k1)), pow2(k2))


@quiet
def log(x):
    """[num.log.c1]"""
    x = F(x)
    if x != x:
        return CANON
    if abs(x) < MIN_NORMAL:
        return neg(INF)
    if x < 0:
        return CANON
    if x == INF:
        return INF
    b = bits(x)
    e = (b >> 23) - 127
    m = f32((b & 0x007FFFFF) | 0x3F800000)
    if m > SQRT2:
        m = mul(m, HALF)
        e += 1
    f = sub(m, ONE)
    s = mul(f, recip(add(TWO, f)))
    z = mul(s, s)
    big_r = mul(z, horner(LOG_L, z))
    hfsq = mul(mul(HALF, f), f)
    t = mul(s, add(hfsq, big_r))
    if e == 0:
        return sub(f, sub(hfsq, t))
    d = F(e)
    return sub(mul(d, LN2_HI), sub(sub(hfsq, add(t, mul(d, LN2_LO))), f))


@quiet
def tanh(x):
    """[num.tanh.c1]"""
    x = F(x)
    if x != x:
        return CANON
    a = f32(bits(x) & 0x7FFFFFFF)
    if a < TANH_SMALL:
        z = mul(a, a)
        p = horner(TANH_T, z)
        y = add(a, mul(a, mul(z, p)))
    else:
        y = sub(ONE, mul(TWO, recip(add(exp(add(a, a)), ONE))))
    return neg(y) if bits(x) & 0x80000000 else y


@quiet
def sigmoid(x):
    """[num.sigmoid.c1]"""
    x = F(x)
    if x != x:
        return CANON
    if x >= 0:
        return recip(add(ONE, exp(neg(x))))
    t = exp(x)
    d = recip(add(ONE, t))
    return sub(t, mul(t, mul(t, d)))


def _reduced(x):
    """[num.sincos.c1] steps 1-4: (sr, cr, n)."""
    k = rint(mul(x, TWO_OVER_PI))
    r = x
    for part in PIO2:
        r = sub(r, mul(k, part))
    z = mul(r, r)
    sr = add(r, mul(r, mul(z, horner(SIN_S, z))))
    cr = add(ONE, mul(z, add(MINUS_HALF, mul(z, horner(COS_C, z)))))
    return sr, cr, int(k) & 3  # Python's & on a negative int is two's complement


@quiet
def sin(x):
    """[num.sincos.c1]"""
    x = F(x)
    if x != x or abs(x) > TRIG_MAX:
        return CANON
    if x == 0:
        return x
    sr, cr, n = _reduced(x)
    return (sr, cr, neg(sr), neg(cr))[n]


@quiet
def cos(x):
    """[num.sincos.c1]"""
    x = F(x)
    if x != x or abs(x) > TRIG_MAX:
        return CANON
    sr, cr, n = _reduced(x)
    return (cr, neg(sr), neg(cr), sr)[n]
