"""bfloat16 as the profile of ``spec/08-bf16.txt`` defines it.

bf16 data is held as its uint16 bit pattern ([bf16.format.c1]); there is no
bf16 arithmetic.  Scalar forms (``encode1``, ``decode1``, ``load1``,
``round1``) are for use inside kernels; the array forms (``encode``,
``decode``, ``load``, ``round_f32``, ``round_inplace``) are what ops, the
trainer and the conformance runner call.  Element n of an output depends on
element n of the input only, so the array forms run in parallel over
elements.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .._jit import kernel, parallel_kernel
from ._bits import bits_f32, f32_bits
from .core import canon, flush

CANONICAL_NAN = np.uint16(0x7FC0)
_EXP = np.uint16(0x7F80)
_FRAC = np.uint16(0x007F)
_SIGN = np.uint16(0x8000)


@kernel
def load1(h):
    """[bf16.load.c1] A bf16 subnormal becomes a zero of its sign; a NaN
    becomes bf16(0x7FC0)."""
    e = h & _EXP
    if e == 0:
        return np.uint16(h & _SIGN)
    if e == _EXP and (h & _FRAC) != 0:
        return CANONICAL_NAN
    return np.uint16(h)


@kernel
def decode1(h):
    """[bf16.widen.c1] The binary32 whose upper 16 bits are h: exact."""
    return bits_f32(np.uint32(np.uint32(h) << np.uint32(16)))


@kernel
def encode1(x):
    """[bf16.round.c1] x (loaded first: [num.load.c1]) rounded to bf16, to
    nearest with ties to even; NaN gives bf16(0x7FC0).  The carry of the
    added 0x7FFF + lsb moves a rounded-up fraction into the exponent and
    past bf16(0x7F7F) into infinity, as IEEE rounding does."""
    v = canon(flush(x))
    if v != v:
        return CANONICAL_NAN
    u = f32_bits(v)
    lsb = (u >> np.uint32(16)) & np.uint32(1)
    return np.uint16((u + np.uint32(0x7FFF) + lsb) >> np.uint32(16))


@kernel
def round1(x):
    """[bf16.round.c1] The bf16 value of x, held in a binary32:
    decode1(encode1(x))."""
    return decode1(encode1(x))


# ---- array forms ---------------------------------------------------------------


@parallel_kernel
def _encode_kernel(src, dst):
    for i in prange(src.size):
        dst[i] = encode1(src[i])


@parallel_kernel
def _decode_kernel(src, dst):
    for i in prange(src.size):
        dst[i] = decode1(load1(src[i]))


@parallel_kernel
def _load_kernel(src, dst):
    for i in prange(src.size):
        dst[i] = load1(src[i])


@parallel_kernel
def _round_kernel(src, dst):
    for i in prange(src.size):
        dst[i] = round1(src[i])


def _flat(name: str, x, dtype) -> np.ndarray:
    if not isinstance(x, np.ndarray):
        raise TypeError(f"bf16.{name}: expected a numpy array, got {type(x).__name__}")
    if x.dtype != dtype:
        raise TypeError(f"bf16.{name}: expected dtype {np.dtype(dtype).name}, got {x.dtype}")
    return np.ascontiguousarray(x).reshape(-1)


def as_bits(x) -> np.ndarray:
    """A bf16 tensor's uint16 bit patterns: a uint16 array as it is, an
    ml_dtypes bfloat16 array viewed as uint16 ([bf16.format.c1])."""
    if isinstance(x, np.ndarray) and x.dtype.name == "bfloat16" and x.dtype.itemsize == 2:
        return x.view(np.uint16)
    return x


def encode(x: np.ndarray) -> np.ndarray:
    """[bf16.round.c1] float32 array -> uint16 array of bf16 bit patterns."""
    src = _flat("encode", x, np.float32)
    dst = np.empty(src.size, np.uint16)
    _encode_kernel(src, dst)
    return dst.reshape(x.shape)


def decode(h: np.ndarray) -> np.ndarray:
    """[bf16.load.c1] then [bf16.widen.c1]: uint16 bf16 bits -> float32."""
    h = as_bits(h)
    src = _flat("decode", h, np.uint16)
    dst = np.empty(src.size, np.float32)
    _decode_kernel(src, dst)
    return dst.reshape(h.shape)


def load(h: np.ndarray) -> np.ndarray:
    """[bf16.load.c1] A copy of the bf16 bits with subnormals zeroed and NaN
    canonical."""
    h = as_bits(h)
    src = _flat("load", h, np.uint16)
    dst = np.empty_like(src)
    _load_kernel(src, dst)
    return dst.reshape(h.shape)


def round_f32(x: np.ndarray) -> np.ndarray:
    """[bf16.round.c1] float32 array -> float32 array of the bf16 values."""
    src = _flat("round_f32", x, np.float32)
    dst = np.empty_like(src)
    _round_kernel(src, dst)
    return dst.reshape(x.shape)


def round_inplace(x: np.ndarray) -> np.ndarray:
    """[bf16.round.c1] Round a C-contiguous float32 array to bf16 values in
    place (the trainer's activations); returns x."""
    if not (isinstance(x, np.ndarray) and x.dtype == np.float32 and x.flags.c_contiguous and x.flags.writeable):
        raise TypeError("bf16.round_inplace: expected a writeable C-contiguous float32 array")
    flat = x.reshape(-1)
    _round_kernel(flat, flat)
    return x
