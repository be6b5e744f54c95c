"""Transformer training ops, one module per op family, forward and backward
side by side (llm.c style).

    embedding    token embedding; backward as an ordered scatter-add
    linear       y = x·Wᵀ + b; dx, dW, db
    norms        LayerNorm and RMSNorm over C
    activations  GELU (tanh form), SiLU, SwiGLU
    optim        AdamW, global gradient-norm clipping, learning-rate schedule
    rope, attention, softmax, loss, quant   (see their modules)

Every public function validates its arguments here, in Python, and then calls
a compiled kernel that does arithmetic only.  Operands are values of the
reference: already loaded ([num.load.c1]), so never subnormal and every NaN
canonical.  Public functions return new arrays unless their docstring says
that an argument is updated in place.

The helpers below are the shared argument checks: a bad dtype, layout or
shape raises ``TypeError``/``ValueError`` naming the argument, never a Numba
typing traceback.
"""
from __future__ import annotations

import numpy as np


def check_array(name: str, a, dtype, ndim: int) -> np.ndarray:
    """``a`` must be a C-contiguous ndarray of ``dtype`` with ``ndim`` axes."""
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name} must be a numpy array, got {type(a).__name__}")
    if a.dtype != dtype:
        raise TypeError(f"{name} must be {np.dtype(dtype).name}, got {a.dtype}")
    if a.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} axes, got shape {a.shape}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous")
    return a


def check_f32(name: str, a, ndim: int) -> np.ndarray:
    return check_array(name, a, np.float32, ndim)


def check_shape(name: str, a: np.ndarray, shape: tuple) -> None:
    if a.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {a.shape}")


def check_scalar_f32(name: str, x) -> np.float32:
    """A hyper-parameter as binary32.  Accepted: an np.float32, or a Python
    float/int that converts to binary32 exactly (so no silent rounding of a
    decimal literal decides bits: pass np.float32(1e-5) to mean the nearest
    binary32)."""
    if isinstance(x, np.float32):
        return x
    if isinstance(x, (float, int, np.floating, np.integer)) and not isinstance(x, bool):
        f = np.float32(x)
        if float(f) == float(x) or x != x:
            return f
        raise ValueError(f"{name}={x!r} is not exactly representable in binary32; "
                         f"pass np.float32({x!r}) to use the nearest binary32")
    raise TypeError(f"{name} must be a binary32 scalar, got {type(x).__name__}")
