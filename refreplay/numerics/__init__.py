"""Numerics core: binary32 primitives as the spec defines them.

``core`` holds rounding, flushing, NaN canonicalisation, min/max, rint and
saturation; ``transcendental`` holds exp, log, tanh, sigmoid, GELU pieces and
sin/cos, each defined by an algorithm in the spec and built on ``core``.
"""
from .core import (  # noqa: F401
    add, sub, mul, recip, sqrt, fmax, fmin, rint, saturate_i8, flush, canon,
    finish, load, F32, ZERO, ONE, TWO, HALF, FLT_MIN, FLT_MAX, INF,
)
from ._bits import f32_from_bits, bits_of  # noqa: F401
