"""Array forms of every primitive: the scalar function applied to each element.

``exp(x)`` here is ``transcendental.exp`` on every element of ``x``; ``add(a,
b)`` is ``core.add`` on every pair of elements at the same index.  Each element
is independent, so the loop runs in parallel over elements ([num.format.c1]:
the bits of one element never depend on another or on the thread count).

These are the entry points the conformance runner and the golden vectors use
for the primitive ops, so their names are exactly the scalar names.  Inputs
are float32 arrays of any shape (binary ops: equal shapes, no broadcasting);
the result is a new C-contiguous float32 array of that shape.
"""
from __future__ import annotations

import numpy as np
from numba import prange

from .._jit import kernel, parallel_kernel
from . import core, transcendental as tr
from ._bits import bits_f32, f32_bits

__all__ = ["add", "sub", "mul", "recip", "sqrt", "fmax", "fmin", "rint",
           "exp", "log", "tanh", "sigmoid", "sin", "cos"]


def _as_f32(name: str, arg: str, x) -> np.ndarray:
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name}: {arg} must be a numpy float32 array, got {type(x).__name__}")
    if x.dtype != np.float32:
        raise TypeError(f"{name}: {arg} must have dtype float32, got {x.dtype}")
    return np.ascontiguousarray(x).reshape(-1)


def _unary(name, kern, x):
    flat = _as_f32(name, "x", x)
    out = np.empty_like(flat)
    kern(flat, out)
    return out.reshape(x.shape)


def _binary(name, kern, a, b):
    fa, fb = _as_f32(name, "a", a), _as_f32(name, "b", b)
    if a.shape != b.shape:
        raise ValueError(f"{name}: operands must have the same shape, got {a.shape} and {b.shape}")
    out = np.empty_like(fa)
    kern(fa, fb, out)
    return out.reshape(a.shape)


# ---- lane forms: the scalar algorithm without control flow ----
# exp_lane and tanh_lane compute every branch of [num.exp.c1] / [num.tanh.c1]
# and then select the clause's branch, so a loop over independent elements
# that calls them has no control flow and compiles to SIMD.  On each element
# the selected value comes from the very operations, in the very order, of
# ``transcendental.exp`` / ``tanh``; an unselected branch only ever sees a
# clamped, finite argument.  tests/test_fast_paths.py checks them bit for bit
# against the scalar forms (random, special and swept inputs).

SIGN = np.uint32(0x80000000)


@kernel(inline="always")
def exp_lane(x):
    """[num.exp.c1] exp(x) as transcendental.exp, branch-free."""
    xc = min(max(x if x == x else core.ZERO, tr.EXP_UNDERFLOW), tr.EXP_OVERFLOW)  # identity where used
    kx = core.mul(xc, tr.INV_LN2)
    # [num.rint.c1] for |kx| < 2^23: (|kx| + 2^23) - 2^23, sign of kx put back
    kr = (abs(kx) + core.RINT_MAGIC) - core.RINT_MAGIC
    k = -kr if f32_bits(kx) >= SIGN else kr
    hi = core.sub(xc, core.mul(k, tr.LN2_HI))
    lo = core.mul(k, tr.LN2_LO)
    r = core.sub(hi, lo)
    q = core.add(tr.EXP_C5, core.mul(r, tr.EXP_C6))
    q = core.add(tr.EXP_C4, core.mul(r, q))
    q = core.add(tr.EXP_C3, core.mul(r, q))
    q = core.add(tr.EXP_C2, core.mul(r, q))
    p = core.add(core.ONE, core.add(hi, core.sub(core.mul(core.mul(r, r), q), lo)))
    ki = np.int32(k)
    k1 = ki >> 1
    k2 = ki - k1
    y = core.mul(core.mul(p, bits_f32(np.uint32((k1 + 127) << 23))), bits_f32(np.uint32((k2 + 127) << 23)))
    y = core.ZERO if x < tr.EXP_UNDERFLOW else y
    y = tr.INF if x > tr.EXP_OVERFLOW else y
    return tr.NAN if x != x else y


@kernel(inline="always")
def tanh_lane(x):
    """[num.tanh.c1] tanh(x) as transcendental.tanh, branch-free."""
    a = abs(x)
    z = core.mul(a, a)
    p = core.add(tr.TANH_T5, core.mul(z, tr.TANH_T6))
    p = core.add(tr.TANH_T4, core.mul(z, p))
    p = core.add(tr.TANH_T3, core.mul(z, p))
    p = core.add(tr.TANH_T2, core.mul(z, p))
    p = core.add(tr.TANH_T1, core.mul(z, p))
    small = core.add(a, core.mul(a, core.mul(z, p)))
    e = exp_lane(core.add(a, a))
    large = core.sub(core.ONE, core.mul(core.TWO, core.recip(core.add(e, core.ONE))))
    y = small if a < tr.TANH_SMALL else large
    y = -y if f32_bits(x) >= SIGN else y
    return tr.NAN if x != x else y


@kernel(inline="always")
def sigmoid_lane(x):
    """[num.sigmoid.c1] sigmoid(x) as transcendental.sigmoid, branch-free: both
    branches need exp of w = -x (x >= 0) or x (x < 0), one exp_lane serves both."""
    pos = x >= core.ZERO  # includes -0, as the clause's branch does
    t = exp_lane(-x if pos else x)
    d = core.recip(core.add(core.ONE, t))
    y = d if pos else core.sub(t, core.mul(t, core.mul(t, d)))
    return tr.NAN if x != x else y


# ---- kernels: x, a, b, out are 1-D float32 of length N; out is overwritten ----

@parallel_kernel
def _add_kernel(a, b, out):
    for i in prange(out.size):
        out[i] = core.add(a[i], b[i])


@parallel_kernel
def _sub_kernel(a, b, out):
    for i in prange(out.size):
        out[i] = core.sub(a[i], b[i])


@parallel_kernel
def _mul_kernel(a, b, out):
    for i in prange(out.size):
        out[i] = core.mul(a[i], b[i])


@parallel_kernel
def _fmax_kernel(a, b, out):
    for i in prange(out.size):
        out[i] = core.fmax(a[i], b[i])


@parallel_kernel
def _fmin_kernel(a, b, out):
    for i in prange(out.size):
        out[i] = core.fmin(a[i], b[i])


@parallel_kernel
def _recip_kernel(x, out):
    for i in prange(out.size):
        out[i] = core.recip(x[i])


@parallel_kernel
def _sqrt_kernel(x, out):
    for i in prange(out.size):
        out[i] = core.sqrt(x[i])


@parallel_kernel
def _rint_kernel(x, out):
    for i in prange(out.size):
        out[i] = core.rint(x[i])


@parallel_kernel
def _exp_kernel(x, out):
    for i in prange(out.size):
        out[i] = tr.exp(x[i])


@parallel_kernel
def _log_kernel(x, out):
    for i in prange(out.size):
        out[i] = tr.log(x[i])


@parallel_kernel
def _tanh_kernel(x, out):
    for i in prange(out.size):
        out[i] = tr.tanh(x[i])


@parallel_kernel
def _sigmoid_kernel(x, out):
    for i in prange(out.size):
        out[i] = tr.sigmoid(x[i])


@parallel_kernel
def _sin_kernel(x, out):
    for i in prange(out.size):
        out[i] = tr.sin(x[i])


@parallel_kernel
def _cos_kernel(x, out):
    for i in prange(out.size):
        out[i] = tr.cos(x[i])


# ---- public API -----------------------------------------------------------------

def add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[num.add.c1] a + b element by element."""
    return _binary("add", _add_kernel, a, b)


def sub(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[num.add.c1] a - b element by element."""
    return _binary("sub", _sub_kernel, a, b)


def mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[num.mul.c1] a * b element by element."""
    return _binary("mul", _mul_kernel, a, b)


def fmax(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[num.minmax.c1] maximum element by element."""
    return _binary("fmax", _fmax_kernel, a, b)


def fmin(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[num.minmax.c1] minimum element by element."""
    return _binary("fmin", _fmin_kernel, a, b)


def recip(x: np.ndarray) -> np.ndarray:
    """[num.recip.c1] 1/x element by element."""
    return _unary("recip", _recip_kernel, x)


def sqrt(x: np.ndarray) -> np.ndarray:
    """[num.sqrt.c1] square root element by element."""
    return _unary("sqrt", _sqrt_kernel, x)


def rint(x: np.ndarray) -> np.ndarray:
    """[num.rint.c1] round to integer (ties to even) element by element."""
    return _unary("rint", _rint_kernel, x)


def exp(x: np.ndarray) -> np.ndarray:
    """[num.exp.c1] e^x element by element."""
    return _unary("exp", _exp_kernel, x)


def log(x: np.ndarray) -> np.ndarray:
    """[num.log.c1] natural logarithm element by element."""
    return _unary("log", _log_kernel, x)


def tanh(x: np.ndarray) -> np.ndarray:
    """[num.tanh.c1] hyperbolic tangent element by element."""
    return _unary("tanh", _tanh_kernel, x)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """[num.sigmoid.c1] logistic sigmoid element by element."""
    return _unary("sigmoid", _sigmoid_kernel, x)


def sin(x: np.ndarray) -> np.ndarray:
    """[num.sincos.c1] sine element by element (|x| <= 2^14, else NaN)."""
    return _unary("sin", _sin_kernel, x)


def cos(x: np.ndarray) -> np.ndarray:
    """[num.sincos.c1] cosine element by element (|x| <= 2^14, else NaN)."""
    return _unary("cos", _cos_kernel, x)
