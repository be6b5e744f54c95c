"""Transcendental functions on the device, defined by algorithm
(``spec/02-transcendentals.txt``); mirrors ``refreplay.numerics.transcendental``
step for step.

Range reduction, Horner's rule and reconstruction are written exactly as in
the reference, every multiply and add through the shim (rounded separately,
flushed, NaN canonical; [num.nofma.c1]).  No CUDA ``expf``/``logf``/``sinf``
is called: their bits differ from the spec's.  The constants are imported
from the reference, so the two implementations cannot drift apart.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from refreplay.numerics.transcendental import (
    COS_C1,
    COS_C2,
    COS_C3,
    COS_C4,
    EXP_C2,
    EXP_C3,
    EXP_C4,
    EXP_C5,
    EXP_C6,
    EXP_OVERFLOW,
    EXP_UNDERFLOW,
    HALF,
    INF,
    INV_LN2,
    LN2_HI,
    LN2_LO,
    LOG_L1,
    LOG_L2,
    LOG_L3,
    LOG_L4,
    MINUS_HALF,
    ONE,
    PIO2_1,
    PIO2_2,
    PIO2_3,
    PIO2_4,
    SIN_S1,
    SIN_S2,
    SIN_S3,
    SIN_S4,
    SQRT2,
    TANH_SMALL,
    TANH_T1,
    TANH_T2,
    TANH_T3,
    TANH_T4,
    TANH_T5,
    TANH_T6,
    TRIG_MAX,
    TWO,
    TWO_OVER_PI,
)

from . import shim
from ._jit import device, kernel

ZERO = np.float32(0.0)
MANTISSA = np.int32(0x007FFFFF)
ONE_BITS = np.int32(0x3F800000)


@device
def pow2(j):
    """2^j for -126 <= j <= 127: the float32 with biased exponent j + 127 (exact)."""
    return shim.from_bits(np.int32((j + 127) << 23))


@device
def exp(x):
    """[num.exp.c1] e^x: Cody-Waite reduction by ln 2, degree-6 polynomial
    1 + r + r^2 q(r), scaling by 2^k in two exact steps."""
    if x != x:
        return shim.nan()
    if x > EXP_OVERFLOW:
        return INF
    if x < EXP_UNDERFLOW:
        return ZERO
    k = shim.rint(shim.mul(x, INV_LN2))
    hi = shim.sub(x, shim.mul(k, LN2_HI))  # exact (Sterbenz)
    lo = shim.mul(k, LN2_LO)
    r = shim.sub(hi, lo)
    q = shim.add(EXP_C5, shim.mul(r, EXP_C6))
    q = shim.add(EXP_C4, shim.mul(r, q))
    q = shim.add(EXP_C3, shim.mul(r, q))
    q = shim.add(EXP_C2, shim.mul(r, q))
    p = shim.add(ONE, shim.add(hi, shim.sub(shim.mul(shim.mul(r, r), q), lo)))
    ki = shim.int_of(k)
    k1 = ki >> 1  # floor(k / 2): both factors stay normal
    k2 = ki - k1
    return shim.mul(shim.mul(p, pow2(k1)), pow2(k2))


@device
def log(x):
    """[num.log.c1] x = 2^e m with m in [sqrt(1/2), sqrt(2)), f = m - 1,
    s = f * recip(2 + f), log(1+f) = f - (f^2/2 - s (f^2/2 + R(s^2)))."""
    if x != x:
        return shim.nan()
    if abs(x) < shim.FLT_MIN:  # +-0 (and subnormals, as zeros)
        return -INF
    if x < ZERO:
        return shim.nan()
    if x == INF:
        return INF
    b = shim.bits(x)  # x > 0: the sign bit is clear
    e = (b >> 23) - np.int32(127)
    m = shim.from_bits((b & MANTISSA) | ONE_BITS)
    if m > SQRT2:
        m = shim.mul(m, HALF)  # exact
        e += 1
    f = shim.sub(m, ONE)  # exact (Sterbenz)
    s = shim.mul(f, shim.recip(shim.add(TWO, f)))
    z = shim.mul(s, s)
    w = shim.add(LOG_L3, shim.mul(z, LOG_L4))
    w = shim.add(LOG_L2, shim.mul(z, w))
    w = shim.add(LOG_L1, shim.mul(z, w))
    big_r = shim.mul(z, w)
    hfsq = shim.mul(shim.mul(HALF, f), f)
    t = shim.mul(s, shim.add(hfsq, big_r))
    if e == 0:
        return shim.sub(f, shim.sub(hfsq, t))
    dk = np.float32(e)  # |e| <= 128: exact
    return shim.sub(shim.mul(dk, LN2_HI), shim.sub(shim.sub(hfsq, shim.add(t, shim.mul(dk, LN2_LO))), f))


@device
def tanh(x):
    """[num.tanh.c1] odd polynomial a + a (z P(z)) for |x| < 0.75, otherwise
    1 - 2 * recip(exp(2|x|) + 1); the sign of x is put back exactly."""
    if x != x:
        return shim.nan()
    a = abs(x)
    if a < TANH_SMALL:
        z = shim.mul(a, a)
        p = shim.add(TANH_T5, shim.mul(z, TANH_T6))
        p = shim.add(TANH_T4, shim.mul(z, p))
        p = shim.add(TANH_T3, shim.mul(z, p))
        p = shim.add(TANH_T2, shim.mul(z, p))
        p = shim.add(TANH_T1, shim.mul(z, p))
        y = shim.add(a, shim.mul(a, shim.mul(z, p)))
    else:
        e = exp(shim.add(a, a))
        y = shim.sub(ONE, shim.mul(TWO, shim.recip(shim.add(e, ONE))))
    return -y if shim.signbit(x) else y


@device
def sigmoid(x):
    """[num.sigmoid.c1] x >= 0: recip(1 + exp(-x)); x < 0: with t = exp(x),
    t - t * (t * recip(1 + t))."""
    if x != x:
        return shim.nan()
    if x >= ZERO:  # includes -0
        return shim.recip(shim.add(ONE, exp(-x)))
    t = exp(x)
    d = shim.recip(shim.add(ONE, t))
    return shim.sub(t, shim.mul(t, shim.mul(t, d)))


@device
def _sincos_reduced(x):
    """[num.sincos.c1] steps 2-4: (sin r, cos r, k mod 4) for |x| <= 2^14."""
    k = shim.rint(shim.mul(x, TWO_OVER_PI))
    r = shim.sub(x, shim.mul(k, PIO2_1))  # exact (Sterbenz)
    r = shim.sub(r, shim.mul(k, PIO2_2))
    r = shim.sub(r, shim.mul(k, PIO2_3))
    r = shim.sub(r, shim.mul(k, PIO2_4))
    z = shim.mul(r, r)
    s = shim.add(SIN_S3, shim.mul(z, SIN_S4))
    s = shim.add(SIN_S2, shim.mul(z, s))
    s = shim.add(SIN_S1, shim.mul(z, s))
    sin_r = shim.add(r, shim.mul(r, shim.mul(z, s)))
    c = shim.add(COS_C3, shim.mul(z, COS_C4))
    c = shim.add(COS_C2, shim.mul(z, c))
    c = shim.add(COS_C1, shim.mul(z, c))
    cos_r = shim.add(ONE, shim.mul(z, shim.add(MINUS_HALF, shim.mul(z, c))))
    return sin_r, cos_r, shim.int_of(k) & np.int32(3)


@device
def sin(x):
    """[num.sincos.c1] sine for |x| <= 2^14; NaN outside, sin(+-0) = +-0."""
    if x != x or abs(x) > TRIG_MAX:
        return shim.nan()
    if x == ZERO:
        return x
    sin_r, cos_r, n = _sincos_reduced(x)
    if n == 0:
        return sin_r
    if n == 1:
        return cos_r
    if n == 2:
        return -sin_r
    return -cos_r


@device
def cos(x):
    """[num.sincos.c1] cosine for |x| <= 2^14; NaN outside."""
    if x != x or abs(x) > TRIG_MAX:
        return shim.nan()
    sin_r, cos_r, n = _sincos_reduced(x)
    if n == 0:
        return cos_r
    if n == 1:
        return -sin_r
    if n == 2:
        return -cos_r
    return sin_r


# ---- elementwise kernels: x, out 1-D of length N, out overwritten, grid blocks(N) ----

_F1 = "void(float32[::1], float32[::1])"


@kernel(_F1)
def exp_k(x, out):
    """[num.exp.c1] out[n] = exp(x[n])."""
    n = cuda.grid(1)
    if n < out.size:
        out[n] = exp(x[n])


@kernel(_F1)
def log_k(x, out):
    """[num.log.c1] out[n] = log(x[n])."""
    n = cuda.grid(1)
    if n < out.size:
        out[n] = log(x[n])


@kernel(_F1)
def tanh_k(x, out):
    """[num.tanh.c1] out[n] = tanh(x[n])."""
    n = cuda.grid(1)
    if n < out.size:
        out[n] = tanh(x[n])


@kernel(_F1)
def sigmoid_k(x, out):
    """[num.sigmoid.c1] out[n] = sigmoid(x[n])."""
    n = cuda.grid(1)
    if n < out.size:
        out[n] = sigmoid(x[n])


@kernel(_F1)
def sin_k(x, out):
    """[num.sincos.c1] out[n] = sin(x[n])."""
    n = cuda.grid(1)
    if n < out.size:
        out[n] = sin(x[n])


@kernel(_F1)
def cos_k(x, out):
    """[num.sincos.c1] out[n] = cos(x[n])."""
    n = cuda.grid(1)
    if n < out.size:
        out[n] = cos(x[n])
