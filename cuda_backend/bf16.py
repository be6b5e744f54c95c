"""Device forms of the bf16 conversions (``spec/08-bf16.txt``), the twins of
``refreplay.numerics.bf16``: scalar device functions on bf16 bit patterns
(uint16) and binary32 values, and one elementwise kernel per array form
(one thread per element n, grid ``blocks(N)`` x ``THREADS``; 1-D, C-contiguous
arrays of length N; ``out`` may be the input itself).

The bit arithmetic runs on int64, where every intermediate of the 32-bit
formulas fits, so no signed/unsigned reinterpretation is needed in the
simulator or on the device; bit patterns cross to binary32 through the
shim's exact reinterpretations (``shim.bits``, ``shim.from_bits``).
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from . import shim
from ._jit import device, kernel

_I64 = np.int64
CANONICAL_NAN = np.uint16(0x7FC0)
_EXP = _I64(0x7F80)
_FRAC = _I64(0x007F)
_SIGN = _I64(0x8000)
_LOW32 = _I64(0xFFFFFFFF)
_TWO31 = _I64(0x80000000)


@device
def load1(h):
    """[bf16.load.c1] A bf16 subnormal becomes a zero of its sign; a NaN becomes bf16(0x7FC0)."""
    v = _I64(h)
    e = v & _EXP
    if e == _I64(0):
        return np.uint16(v & _SIGN)
    if e == _EXP and (v & _FRAC) != _I64(0):
        return CANONICAL_NAN
    return np.uint16(v)


@device
def decode1(h):
    """[bf16.widen.c1] The binary32 whose upper 16 bits are h: exact.  The
    int32 pattern is (h & 0x7FFF) << 16, minus 2^31 when the sign bit is set."""
    v = _I64(h)
    b = (v & _I64(0x7FFF)) << _I64(16)
    if (v & _SIGN) != _I64(0):
        b = b - _TWO31
    return shim.from_bits(np.int32(b))


@device
def encode1(x):
    """[bf16.round.c1] x after [num.load.c1] rounded to bf16, to nearest with
    ties to even (the carry moves into the exponent and to infinity); NaN
    gives bf16(0x7FC0)."""
    v = shim.finish(x)
    if v != v:
        return CANONICAL_NAN
    u = _I64(shim.bits(v)) & _LOW32
    lsb = (u >> _I64(16)) & _I64(1)
    return np.uint16(((u + _I64(0x7FFF) + lsb) >> _I64(16)) & _I64(0xFFFF))


@device
def round1(x):
    """[bf16.round.c1] The bf16 value of x, held in a binary32."""
    return decode1(encode1(x))


@kernel("void(float32[::1], uint16[::1])")
def encode_k(x, out):
    """[bf16.round.c1] out[n] = encode1(x[n])."""
    n = cuda.grid(1)
    if n < out.size:
        out[n] = encode1(x[n])


@kernel("void(uint16[::1], float32[::1])")
def decode_k(h, out):
    """[bf16.load.c1] [bf16.widen.c1] out[n] = decode1(load1(h[n]))."""
    n = cuda.grid(1)
    if n < out.size:
        out[n] = decode1(load1(h[n]))


@kernel("void(uint16[::1], uint16[::1])")
def load_k(h, out):
    """[bf16.load.c1] out[n] = load1(h[n])."""
    n = cuda.grid(1)
    if n < out.size:
        out[n] = load1(h[n])


@kernel("void(float32[::1], float32[::1])")
def round_k(x, out):
    """[bf16.round.c1] out[n] = round1(x[n]) (in place when out is x)."""
    n = cuda.grid(1)
    if n < out.size:
        out[n] = round1(x[n])
