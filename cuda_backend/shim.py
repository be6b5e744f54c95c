"""The arithmetic shim: every float32 operation of device code goes through here.

On a GPU each primitive is a libdevice round-to-nearest intrinsic
(``__nv_fadd_rn``, ``__nv_fmul_rn``, ``__nv_frcp_rn``, ``__nv_fsqrt_rn``).
NVVM never contracts those into a fused multiply-add, whereas a plain
``acc + a*b`` becomes ``fma.rn.f32`` -- by default, and even with NVVM's
``-fma=0`` once link-time optimisation relinks the code ([num.nofma.c1]).

The CUDA simulator leaves libdevice as stubs that return None, so there the
same primitives are plain NumPy float32 operations, which are IEEE binary32
rounded to nearest-even (in NumPy's float32 loops, or via float64, which for
+, *, / and sqrt of binary32 operands rounds identically).

On top of the raw operations this module gives the device forms of
``refreplay.numerics.core``, clause by clause: ``add, sub, mul, recip, sqrt``
each round by IEEE, then flush ([num.flush.c1]) and canonicalise NaN
([num.nan.c1]); ``fmax, fmin, rint, saturate_i8`` follow [num.minmax.c1],
[num.rint.c1], [num.sat.c1].  Comparisons, ``abs`` and negation are exact and
stay plain.  Every constant is ``np.float32`` (a Python float would turn the
arithmetic into float64, which the PTX audit rejects).
"""

from __future__ import annotations

import numpy as np

from ._jit import SIMULATOR, device

F32 = np.float32
ZERO = F32(0.0)
ONE = F32(1.0)
FLT_MIN = F32(1.1754943508222875e-38)  # 0x00800000, smallest normal
RINT_MAGIC = F32(8388608.0)  # 2**23 (0x4B000000)
I8_LO = F32(-128.0)
I8_HI = F32(127.0)
CANONICAL_NAN_BITS = np.int32(0x7FC00000)

if SIMULATOR:
    # The simulator runs device code as Python on NumPy float32 scalars.
    def _ignore():  # IEEE special results (inf, NaN) are wanted, not warned about
        return np.errstate(all="ignore")

    def _fadd(a, b):
        with _ignore():
            return F32(a) + F32(b)

    def _fsub(a, b):
        with _ignore():
            return F32(a) - F32(b)

    def _fmul(a, b):
        with _ignore():
            return F32(a) * F32(b)

    def _frcp(x):
        with _ignore():
            return ONE / F32(x)

    def _fsqrt(x):
        with _ignore():
            return np.sqrt(F32(x))

    def _as_int(x):
        return F32(x).view(np.int32)

    def _as_float(i):
        return np.int32(i).view(F32)

    def _f2i_rn(x):
        return np.int32(np.rint(F32(x)))

else:
    from numba.cuda import libdevice

    _fadd = libdevice.fadd_rn
    _fsub = libdevice.fsub_rn
    _fmul = libdevice.fmul_rn
    _frcp = libdevice.frcp_rn
    _fsqrt = libdevice.fsqrt_rn
    _as_int = libdevice.float_as_int
    _as_float = libdevice.int_as_float
    _f2i_rn = libdevice.float2int_rn  # cvt.rni: exact on the integral values it gets


@device
def bits(x):
    """int32 bit pattern of a float32 (a reinterpretation, no rounding)."""
    return _as_int(x)


@device
def from_bits(i):
    """float32 whose bit pattern is the int32 i."""
    return _as_float(i)


@device
def int_of(x):
    """An integral float32 (the output of ``rint``, |x| < 2^31) as int32, exactly."""
    return _f2i_rn(x)


@device
def nan():
    """[num.nan.c1] The canonical quiet NaN 0x7FC00000."""
    return _as_float(CANONICAL_NAN_BITS)


@device
def signbit(x):
    """True when the sign bit of x is set (-0 included)."""
    return _as_int(x) < 0


@device
def flush(x):
    """[num.flush.c1] A subnormal result becomes a zero of the same sign.

    Judged on the rounded value; ``x * 0`` keeps the sign of x.  NaN and the
    infinities pass unchanged.
    """
    return _fmul(x, ZERO) if abs(x) < FLT_MIN else x


@device
def canon(x):
    """[num.nan.c1] Every NaN becomes the canonical quiet NaN 0x7FC00000."""
    return nan() if x != x else x


@device
def finish(x):
    """Flush then canonicalise: what every primitive does to its IEEE result."""
    return canon(flush(x))


@device
def add(a, b):
    """[num.add.c1] a + b, rounded to nearest-even, flushed, NaN canonical."""
    return finish(_fadd(a, b))


@device
def sub(a, b):
    """[num.add.c1] a - b is a + (-b) (negation is exact)."""
    return finish(_fsub(a, b))


@device
def mul(a, b):
    """[num.mul.c1] a * b, rounded separately (never fused with an add)."""
    return finish(_fmul(a, b))


@device
def recip(x):
    """[num.recip.c1] 1/x, IEEE correctly rounded; 1/±0 = ±inf."""
    return finish(_frcp(x))


@device
def sqrt(x):
    """[num.sqrt.c1] IEEE correctly rounded square root; sqrt(-0) = -0;
    the square root of a negative number is the canonical NaN."""
    if x < ZERO:
        return nan()
    return finish(_fsqrt(x))


@device
def fmax(a, b):
    """[num.minmax.c1] max: NaN if either is NaN; max(-0, +0) = +0; then flushed
    (a subnormal operand never survives as the result)."""
    if a != a or b != b:
        return nan()
    if a == b:  # equal values, or -0 vs +0: prefer the operand with the clear sign bit
        return flush(b if signbit(a) else a)
    return flush(a if a > b else b)


@device
def fmin(a, b):
    """[num.minmax.c1] min: NaN if either is NaN; min(-0, +0) = -0; then flushed."""
    if a != a or b != b:
        return nan()
    if a == b:  # prefer the operand with the sign bit set
        return flush(a if signbit(a) else b)
    return flush(a if a < b else b)


@device
def rint(x):
    """[num.rint.c1] Nearest integer, ties to even, as a float32.

    (|x| + 2**23) - 2**23 with each add rounded to nearest-even, then the sign
    of x restored (rint(-0.25) = -0); |x| >= 2**23 is already integral.
    """
    if x != x:
        return nan()
    ax = abs(x)
    if ax >= RINT_MAGIC:
        return x
    r = _fsub(_fadd(ax, RINT_MAGIC), RINT_MAGIC)
    return -r if signbit(x) else r


@device
def saturate_i8(x):
    """[num.sat.c1] An integral float32 clamped to [-128, 127] as int8; NaN -> 0."""
    if x != x:
        return np.int8(0)
    if x < I8_LO:
        return np.int8(-128)
    if x > I8_HI:
        return np.int8(127)
    return np.int8(int_of(x))
