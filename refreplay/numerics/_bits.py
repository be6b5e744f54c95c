"""Bit casts between binary32 and uint32 inside compiled code (LLVM bitcast)."""

from __future__ import annotations

import numpy as np
from numba import types
from numba.extending import intrinsic


@intrinsic
def f32_bits(typingctx, x):
    """uint32 bit pattern of a float32 (no conversion, no rounding)."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.uint32))

    return types.uint32(types.float32), codegen


@intrinsic
def bits_f32(typingctx, x):
    """float32 whose bit pattern is the given uint32."""
    if x != types.uint32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.float32))

    return types.float32(types.uint32), codegen


def f32_from_bits(bits: int) -> np.float32:
    """Python-level helper: a numpy float32 from its bit pattern."""
    return np.array([bits], dtype=np.uint32).view(np.float32)[0]


def bits_of(x) -> int:
    return int(np.array([x], dtype=np.float32).view(np.uint32)[0])
