"""Transformer training ops, one module per op family, forward and backward
side by side (llm.c style).

    module       functions                              spec clauses
    embedding    embedding_forward / _backward          [emb.fwd.c1] [emb.bwd.c1]
    linear       linear_forward / _backward             [linear.fwd.c1] [linear.bwd.c1]
    norms        layernorm_forward / _backward          [norm.layer.fwd.c1] [norm.layer.bwd.c1]
                 rmsnorm_forward / _backward            [norm.rms.fwd.c1] [norm.rms.bwd.c1]
    activations  gelu_, silu_, swiglu_forward / _backward   [act.*.fwd.c1] [act.*.bwd.c1]
    optim        adamw_step (in place), adamw_update    [optim.adamw.c1] [optim.adamw.bias.c1]
                 clip_grad_norm (in place)              [optim.clip.c1]
                 lr_at                                  [optim.lr.c1]
    rope, attention, softmax, loss, quant               (see their modules)

Each listed op is specified (spec chapters 10, 11, 12, 15, with hex worked
examples), implemented here, and tested in ``tests/test_ops_a.py`` against
float64 PyTorch autograd, central differences and float32 transcriptions.

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
        raise ValueError(
            f"{name}={x!r} is not exactly representable in binary32; pass np.float32({x!r}) to use the nearest binary32"
        )
    raise TypeError(f"{name} must be a binary32 scalar, got {type(x).__name__}")


def check_out(name: str, out, shape: tuple, inputs=()) -> np.ndarray:
    """An ``out=`` array: a writeable, C-contiguous float32 ndarray of
    ``shape`` that shares no memory with any of ``inputs`` (the kernels read
    their inputs while they write ``out``).  Its contents do not matter: every
    kernel that takes an ``out`` overwrites every element of it."""
    check_f32(name, out, len(shape))
    check_shape(name, out, shape)
    if not out.flags.writeable:
        raise ValueError(f"{name} must be writeable")
    if any(x is not None and np.may_share_memory(out, x) for x in inputs):
        raise ValueError(f"{name} must not overlap an input")
    return out


def check_outs(out, names: tuple, shapes: tuple, inputs=()) -> tuple:
    """An ``out=`` tuple of an op with several outputs: None (all new), or a
    tuple of len(names) whose entries are None (that one new) or ``check_out``
    arrays of their shapes, overlapping no input and no other entry."""
    if out is None:
        return (None,) * len(names)
    if not isinstance(out, tuple) or len(out) != len(names):
        raise TypeError(f"out must be a tuple ({', '.join(names)}) of arrays or None")
    for i, (o, name, shape) in enumerate(zip(out, names, shapes)):
        if o is not None:
            others = tuple(p for j, p in enumerate(out) if j != i and p is not None)
            check_out(f"out[{i}] ({name})", o, shape, tuple(inputs) + others)
    return out
