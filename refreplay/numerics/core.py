"""Binary32 arithmetic as the spec defines it: every result rounded to
nearest-even by the hardware's IEEE operation, then flushed and canonicalised.

Each function here is one clause of ``spec/01-numbers.txt``.  Everything else in
refreplay computes through these functions, never with bare ``+``/``*`` on
values that the spec treats as op results.

Scalars are ``np.float32``; every constant is ``np.float32`` (a Python float
would promote the arithmetic to float64).
"""

from __future__ import annotations

import math

import numpy as np
from numba import prange, types
from numba.extending import overload

from .._jit import kernel, parallel_kernel
from ._bits import bits_f32, f32_bits

F32 = np.float32
ZERO = F32(0.0)
ONE = F32(1.0)
TWO = F32(2.0)
HALF = F32(0.5)
FLT_MIN = F32(1.1754943508222875e-38)  # 0x00800000, smallest normal
FLT_MAX = F32(3.4028234663852886e38)  # 0x7F7FFFFF
INF = F32(np.inf)
CANONICAL_NAN_BITS = np.uint32(0x7FC00000)
RINT_MAGIC = F32(8388608.0)  # 2**23 (0x4B000000)


SIGN_BIT = np.uint32(0x80000000)
EXPONENT_BITS = np.uint32(0x7F800000)


def _flushed(x):
    """The flush of [num.flush.c1] for one scalar type (compiled form below)."""


@overload(_flushed, jit_options=dict(cache=True))
def _flushed_impl(x):
    if x == types.float32:
        # A zero or subnormal is exactly a binary32 whose exponent field is 0:
        # it becomes its sign bit alone.  One bit test and one masked and,
        # where the comparison below costs three instructions; this runs in
        # every rounded operation of the reference.
        def bit_test(x):
            b = f32_bits(x)
            return bits_f32(np.uint32(b & SIGN_BIT)) if (b & EXPONENT_BITS) == np.uint32(0) else x

        return bit_test

    # other types (a binary64 intermediate): the comparison, x * 0 keeps the sign
    def compare(x):
        return x * ZERO if abs(x) < FLT_MIN else x

    return compare


@kernel
def flush(x):
    """[num.flush.c1] A subnormal result becomes a zero of the same sign.

    Applied after IEEE rounding (tininess after rounding).  Zeros, NaN and
    infinities pass unchanged.
    """
    return _flushed(x)


@kernel
def canon(x):
    """[num.nan.c1] Every NaN becomes the canonical quiet NaN 0x7FC00000."""
    return bits_f32(CANONICAL_NAN_BITS) if x != x else x


@kernel
def finish(x):
    """Flush then canonicalise: what every primitive does to its IEEE result."""
    return canon(flush(x))


@kernel
def add(a, b):
    """[num.add.c1] a + b, rounded to nearest-even, flushed, NaN canonical."""
    return finish(a + b)


@kernel
def sub(a, b):
    """[num.add.c1] a - b is a + (-b) (negation is exact)."""
    return finish(a - b)


@kernel
def mul(a, b):
    """[num.mul.c1] a * b, rounded separately (never fused with an add)."""
    return finish(a * b)


@kernel
def recip(x):
    """[num.recip.c1] 1/x, IEEE correctly rounded; 1/±0 = ±inf."""
    return finish(ONE / x)


@kernel
def sqrt(x):
    """[num.sqrt.c1] IEEE correctly rounded square root; sqrt(-0) = -0;
    sqrt of a negative number is NaN."""
    if x < ZERO:
        return bits_f32(CANONICAL_NAN_BITS)
    return finish(math.sqrt(x))


@kernel
def fmax(a, b):
    """[num.minmax.c1] max: NaN if either is NaN; max(-0, +0) = +0."""
    if a != a or b != b:
        return bits_f32(CANONICAL_NAN_BITS)
    if a == b:  # equal values, or -0 vs +0: the one with the clear sign bit
        return flush(a if f32_bits(a) < f32_bits(b) else b)
    # flush: a subnormal operand must not survive as the result ([num.flush.c1])
    return flush(a if a > b else b)


@kernel
def fmin(a, b):
    """[num.minmax.c1] min: NaN if either is NaN; min(-0, +0) = -0."""
    if a != a or b != b:
        return bits_f32(CANONICAL_NAN_BITS)
    if a == b:
        return flush(a if f32_bits(a) > f32_bits(b) else b)
    return flush(a if a < b else b)


@kernel
def rint(x):
    """[num.rint.c1] Round to the nearest integer, ties to even, as a float32.

    For |x| < 2**23: (|x| + 2**23) - 2**23 with each add rounded to nearest
    even, and the sign of x restored (so rint(-0.4) = -0).  |x| >= 2**23 is
    already an integer.  NaN gives the canonical NaN.
    """
    if x != x:
        return bits_f32(CANONICAL_NAN_BITS)
    ax = abs(x)
    if ax >= RINT_MAGIC:
        return x
    r = (ax + RINT_MAGIC) - RINT_MAGIC
    return -r if x < ZERO or (x == ZERO and f32_bits(x) != 0) else r


@kernel
def saturate_i8(x):
    """[num.sat.c1] An integral float32 clamped to [-128, 127] as int8; NaN -> 0."""
    if x != x:
        return np.int8(0)
    if x < F32(-128.0):
        return np.int8(-128)
    if x > F32(127.0):
        return np.int8(127)
    return np.int8(x)


# ---- array forms -----------------------------------------------------------


@parallel_kernel
def _load_kernel(src, dst):
    for i in prange(src.size):
        dst[i] = canon(flush(src[i]))


def load(arr) -> np.ndarray:
    """[num.load.c1] Copy a float32 tensor into the reference, zeroing
    subnormals (sign kept) and canonicalising NaNs.  Any input shape; returns
    a new C-contiguous float32 array of the same shape."""
    a = np.asarray(arr)
    if a.dtype != np.float32:
        raise TypeError(f"load expects float32, got {a.dtype}")
    src = np.ascontiguousarray(a).reshape(-1)
    dst = np.empty_like(src)
    _load_kernel(src, dst)
    return dst.reshape(a.shape)
