"""Bit-level helpers for the conformance suite: bit casts, ulp distance, and
NumPy emulations of *deviant* arithmetic (fused multiply-add, other orders)
used to build probes and to diagnose failures.

Nothing here is on the normative path: expected outputs always come from the
reference kernels.  These helpers model what a non-conformant kernel does, so
that a probe can be checked to separate conformant from deviant arithmetic
and a failure can be explained.
"""

from __future__ import annotations

import numpy as np

F32 = np.float32
FLT_MIN = F32(np.finfo(np.float32).tiny)  # 0x00800000
CANONICAL_NAN = 0x7FC00000


def f32(bits) -> np.ndarray:
    """float32 array from bit patterns (an int or a list of ints)."""
    return np.asarray(bits, dtype=np.uint64).astype(np.uint32).view(np.float32)


def bits(x) -> np.ndarray:
    """uint32 bit patterns of a float32 array."""
    a = np.asarray(x, dtype=np.float32)
    return (a if a.flags.c_contiguous else a.copy()).view(np.uint32)


def flush(x: np.ndarray) -> np.ndarray:
    """[num.flush.c1] subnormal -> zero of the same sign (x * 0 keeps the sign)."""
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(invalid="ignore"):
        return np.where(np.abs(x) < FLT_MIN, x * F32(0), x).astype(np.float32)


def add(a, b):
    with np.errstate(all="ignore"):
        return flush(np.add(a, b, dtype=np.float32))


def mul(a, b):
    with np.errstate(all="ignore"):
        return flush(np.multiply(a, b, dtype=np.float32))


def mul_ftz_before(a, b) -> np.ndarray:
    """float32 product under a flush that judges tininess on the exact product
    (ARM FZ): 0 when |a b| < FLT_MIN, else the IEEE product."""
    a64, b64 = (np.asarray(v, dtype=np.float32).astype(np.float64) for v in (a, b))
    with np.errstate(all="ignore"):
        exact = a64 * b64  # 48 significant bits: exact in float64
        p = np.multiply(a, b, dtype=np.float32)
        return np.where(np.abs(exact) < float(FLT_MIN), p * F32(0), p).astype(np.float32)


def mul_ftz_unbounded(a, b) -> np.ndarray:
    """float32 product under x86's MXCSR.FTZ: tininess judged on the product
    rounded to 24 significant bits with an unbounded exponent; a tiny result
    is 0, any other is the IEEE product."""
    a64, b64 = (np.asarray(v, dtype=np.float32).astype(np.float64) for v in (a, b))
    with np.errstate(all="ignore"):
        exact = a64 * b64
        m, e = np.frexp(exact)  # exact = m 2^e, 0.5 <= |m| < 1
        rounded = np.ldexp(np.rint(np.ldexp(m, 24)), e - 24)  # to nearest, ties to even
        p = np.multiply(a, b, dtype=np.float32)
        tiny = np.isfinite(exact) & (np.abs(rounded) < float(FLT_MIN))
        return np.where(tiny, p * F32(0), p).astype(np.float32)


def fma(a, b, c) -> np.ndarray:
    """float32 fused multiply-add round(a*b + c), one rounding, then flushed."""
    return flush(fma_ieee(a, b, c))


def fma_ieee(a, b, c) -> np.ndarray:
    """float32 fused multiply-add round(a*b + c), one rounding, subnormals kept (IEEE 754).

    a*b is exact in float64 (48 significant bits).  The float64 sum s may be
    rounded; TwoSum gives its exact error e.  Rounding s to float32 equals
    rounding the exact value unless s lies exactly halfway between two float32
    neighbours, where the sign of e decides.
    """
    a, b, c = (np.asarray(v, dtype=np.float32).astype(np.float64) for v in (a, b, c))
    with np.errstate(all="ignore"):
        p = a * b
        s = p + c
        bb = s - p
        e = (p - (s - bb)) + (c - bb)
        r = s.astype(np.float32)
        r64 = r.astype(np.float64)
        toward = np.nextafter(r, np.where(s > r64, F32(np.inf), F32(-np.inf)).astype(np.float32))
        other = np.where(s == r64, r, toward)
        mid = (s != r64) & (np.abs(s - r64) == np.abs(other.astype(np.float64) - s)) & (e != 0)
        up = np.maximum(r, other)
        down = np.minimum(r, other)
        fixed = np.where(e > 0, up, down)
        finite = np.isfinite(s) & np.isfinite(e)
        return np.where(mid & finite, fixed, r).astype(np.float32)


def is_subnormal(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    return (x != 0) & (np.abs(x) < FLT_MIN)


def ordered(x) -> np.ndarray:
    """Map float32 bits to integers whose order is the order of the values
    (-0 and +0 both map to 0), so that |ordered(a) - ordered(b)| is the ulp
    distance."""
    u = bits(x).astype(np.int64)
    mag = u & 0x7FFFFFFF
    return np.where(u >> 31 == 1, -mag, mag)


def ulp_distance(expected, actual) -> np.ndarray:
    """Ulp distance per element; -1 where either side is NaN (no distance)."""
    e = np.asarray(expected, dtype=np.float32)
    a = np.asarray(actual, dtype=np.float32)
    d = np.abs(ordered(e) - ordered(a))
    return np.where(np.isnan(e) | np.isnan(a), -1, d)


def hex32(x) -> str:
    """'0x3F800000' for one binary32 value."""
    return f"0x{int(bits(np.float32(x))):08X}"


def round_mantissa(x, keep: int) -> np.ndarray:
    """x with its significand rounded to ``keep`` explicit bits (nearest even):
    what TF32 (keep=10) or bfloat16 (keep=7) does to an fp32 input."""
    u = bits(x).astype(np.uint64)
    drop = 23 - keep
    half = np.uint64(1 << (drop - 1))
    lsb = (u >> np.uint64(drop)) & np.uint64(1)
    r = ((u + half - np.uint64(1) + lsb) >> np.uint64(drop)) << np.uint64(drop)
    special = (u & np.uint64(0x7F800000)) == np.uint64(0x7F800000)
    return np.where(special, u, r).astype(np.uint32).view(np.float32)
