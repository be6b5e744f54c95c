"""Array forms of every primitive: the scalar function applied to each element.

``exp(x)`` here is ``transcendental.exp`` on every element of ``x``; ``add(a,
b)`` is ``core.add`` on every pair of elements at the same index.  Each element
is independent, so large arrays run in parallel over blocks of elements
([num.format.c1]: the bits of one element never depend on another, on the
block size or on the thread count).

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

__all__ = ["add", "sub", "mul", "recip", "sqrt", "fmax", "fmin", "rint", "exp", "log", "tanh", "sigmoid", "sin", "cos"]


def _as_f32(name: str, arg: str, x) -> np.ndarray:
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name}: {arg} must be a numpy float32 array, got {type(x).__name__}")
    if x.dtype != np.float32:
        raise TypeError(f"{name}: {arg} must have dtype float32, got {x.dtype}")
    return np.ascontiguousarray(x).reshape(-1)


def _unary(name, loop, blocks, x):
    flat = _as_f32(name, "x", x)
    out = np.empty_like(flat)
    run_elementwise(loop, blocks, out.size, flat, out)
    return out.reshape(x.shape)


def _binary(name, loop, blocks, a, b):
    fa, fb = _as_f32(name, "a", a), _as_f32(name, "b", b)
    if a.shape != b.shape:
        raise ValueError(f"{name}: operands must have the same shape, got {a.shape} and {b.shape}")
    out = np.empty_like(fa)
    run_elementwise(loop, blocks, out.size, fa, fb, out)
    return out.reshape(a.shape)


# ---- lane forms: the scalar algorithm without control flow ----
# exp_lane and tanh_lane compute every branch of [num.exp.c1] / [num.tanh.c1]
# and then select the clause's branch, so a loop over independent elements
# that calls them has no control flow and compiles to SIMD.  On each element
# the selected value comes from the very operations, in the very order, of
# ``transcendental.exp`` / ``tanh``; an unselected branch only ever sees a
# clamped, finite argument.  tests/test_fast_paths.py and
# tests/test_blocked_elementwise.py check them bit for bit against the scalar
# forms (random, special and swept inputs, raw bit patterns).

SIGN = np.uint32(0x80000000)

# add_flush, sub_flush and mul_flush are the primitives without their NaN
# canonicalisation: IEEE rounding and [num.flush.c1] alone.  Two cases make
# them exact stand-ins for add, sub and mul ([num.nan.c1]):
#   * finite operands: IEEE add, sub and mul give NaN only from a NaN,
#     inf - inf or 0 * inf, so there the canonicalisation is the identity.
#     Inside the lane forms every operand is finite (the argument is clamped,
#     or bounded by the algorithm; see each form), except in values that the
#     final selects discard.
#   * a chain of adds and multiplies whose result is canonicalised once at
#     its end (the clause allows it: a NaN anywhere in the chain reaches
#     the end), as the activation kernels do.
# Leaving out the NaN test removes a third of the work each rounded operation
# costs in vector code (the lane forms are most of the time of GELU, SiLU
# and softmax).


@kernel(inline="always")
def add_flush(a, b):
    """[num.add.c1] add(a, b) without the NaN canonicalisation (see above)."""
    return core.flush(a + b)


@kernel(inline="always")
def sub_flush(a, b):
    """[num.add.c1] sub(a, b) without the NaN canonicalisation (see above)."""
    return core.flush(a - b)


@kernel(inline="always")
def mul_flush(a, b):
    """[num.mul.c1] mul(a, b) without the NaN canonicalisation (see above)."""
    return core.flush(a * b)


# Flushes proved identities ([num.flush.c1], left out as [mm.flush.r1] allows).  [num.flush.c1] replaces a
# subnormal result by a signed zero; where no input of a lane form can make an
# operation's result subnormal, or where the flushed and the unflushed value
# lead to the same final bits, the flush changes no result bit and is left
# out (a plain IEEE ``*``, ``+`` or ``-``: still rounded separately, never
# contracted, since refreplay never compiles with fastmath).  The lane forms
# below keep a flush only where the result bits depend on it.  The proof is
# exhaustion: tests/test_lane_exhaustive.py compares exp_lane, tanh_lane,
# sigmoid_lane and the GELU lanes with the scalar clause functions (every
# operation flushed) on all 2^32 binary32 bit patterns (slow run; the default
# run checks every exponent class and a strided sweep).  The arguments in the
# comments say why each omission is an identity; the exhaustion is what
# proves it.


@kernel(inline="always")
def exp_lane(x):
    """[num.exp.c1] exp(x) as transcendental.exp, branch-free.

    xc is x clamped to [EXP_UNDERFLOW, EXP_OVERFLOW] (NaN to 0): finite, so
    k is an integer in [-128, 128], and hi, lo, r, q and p are bounded; no
    operation below sees a non-finite operand.

    Flushes ([num.flush.c1]): only the last product, the scaling by 2^k2,
    can be subnormal for a normal x (x in [-88, -87.34]): it keeps its flush.
    Why the others change nothing (the proof is the exhaustion): for k != 0,
    |xc| > 0.34, so hi = xc - k LN2_HI is exact and a multiple of 2^-25, and
    r = hi - lo stays far above 2^-63 in magnitude (or is 0), so r * r and
    the Horner steps are normal; p is in [0.7, 1.5] and p * 2^k1 normal.
    For k = 0, |xc| < 0.35: a subnormal xc, kx, r or r*r q is what the
    scalar form flushes to zero, and either way p = 1 + (hi + tiny) rounds
    the same.  Exhaustion: tests/test_lane_exhaustive.py,
    test_lane_all_inputs[exp]."""
    xc = min(max(x if x == x else core.ZERO, tr.EXP_UNDERFLOW), tr.EXP_OVERFLOW)  # identity where used
    kx = xc * tr.INV_LN2
    # [num.rint.c1] for |kx| < 2^23: (|kx| + 2^23) - 2^23, sign of kx put back
    kr = (abs(kx) + core.RINT_MAGIC) - core.RINT_MAGIC
    k = -kr if f32_bits(kx) >= SIGN else kr
    hi = xc - k * tr.LN2_HI
    lo = k * tr.LN2_LO
    r = hi - lo
    q = tr.EXP_C5 + r * tr.EXP_C6
    q = tr.EXP_C4 + r * q
    q = tr.EXP_C3 + r * q
    q = tr.EXP_C2 + r * q
    p = core.ONE + (hi + ((r * r) * q - lo))
    ki = np.int32(k)
    k1 = ki >> 1
    k2 = ki - k1
    y = mul_flush(p * bits_f32(np.uint32((k1 + 127) << 23)), bits_f32(np.uint32((k2 + 127) << 23)))
    y = core.ZERO if x < tr.EXP_UNDERFLOW else y
    y = tr.INF if x > tr.EXP_OVERFLOW else y
    return tr.NAN if x != x else y


@kernel(inline="always")
def tanh_lane(x):
    """[num.tanh.c1] tanh(x) as transcendental.tanh, branch-free.

    The polynomial is selected only for |x| < 0.75 (finite operands); the
    other branch sees e = exp(2|x|) in [1, inf] (NaN only for a NaN x, which
    the last select replaces), so e + 1, its reciprocal and 1 - 2/(e + 1)
    have no NaN operand and no inf - inf.

    Flushes ([num.flush.c1]): the polynomial's result a + a (z P(z)) keeps
    its flush: for a subnormal x the scalar form gives +-0 (z = a*a flushes
    to 0, then a + 0 flushes), the unflushed sum would be x.  For a normal a
    the terms a z P(z) are below a 2^-25 when they are subnormal (a < 2^-42),
    so a + (flushed or not) rounds to a either way.  The large branch is at
    least 0.63; inside it 1/(e + 1) may be subnormal (e > 2^126), and then
    1 - 2 (flushed or not) rounds to 1.  Exhaustion:
    tests/test_lane_exhaustive.py, test_lane_all_inputs[tanh]."""
    a = abs(x)
    z = a * a
    p = tr.TANH_T5 + z * tr.TANH_T6
    p = tr.TANH_T4 + z * p
    p = tr.TANH_T3 + z * p
    p = tr.TANH_T2 + z * p
    p = tr.TANH_T1 + z * p
    small = add_flush(a, a * (z * p))
    e = exp_lane(a + a)
    large = core.ONE - core.TWO * (core.ONE / (e + core.ONE))
    y = small if a < tr.TANH_SMALL else large
    y = -y if f32_bits(x) >= SIGN else y
    return tr.NAN if x != x else y


@kernel(inline="always")
def sigmoid_lane(x):
    """[num.sigmoid.c1] sigmoid(x) as transcendental.sigmoid, branch-free: both
    branches need exp of w = -x (x >= 0) or x (x < 0), one exp_lane serves both.
    w <= 0, so t = exp(w) is in [0, 1] (NaN only for a NaN x, replaced by the
    last select): every operation below has finite operands.

    Flushes ([num.flush.c1]): d = 1/(1 + t) is in [0.5, 1], never subnormal;
    t is exp_lane's flushed result (0 or >= 2^-126), t d = t for a tiny t, so
    t * (t d) is the only term that can be subnormal, and t - (that term)
    rounds the same whether it is flushed or not; the result keeps its flush.
    Exhaustion: tests/test_lane_exhaustive.py, test_lane_all_inputs[sigmoid]."""
    pos = x >= core.ZERO  # includes -0, as the clause's branch does
    t = exp_lane(-x if pos else x)
    d = core.ONE / (core.ONE + t)
    y = d if pos else sub_flush(t, t * (t * d))
    return tr.NAN if x != x else y


# ---- kernels: x, a, b, out are 1-D float32 of length N; out is overwritten ----
# Each op has two kernels: ``_<op>_loop``, a plain loop over all N elements
# (LLVM vectorises it where the element function has no control flow: exp,
# tanh and sigmoid call their lane forms, which have the scalar forms' bits),
# and ``_<op>_blocks``, which runs that loop on the BLOCK-element views of its
# inputs in parallel.  ``run_elementwise`` takes the loop for fewer than
# PARALLEL_MIN elements, where a parallel region costs more than it saves (and
# on a loaded machine can wait a whole scheduler quantum for a displaced
# worker).  Every element gets the same scalar function either way, so the
# bits depend neither on the block size nor on the thread count
# ([num.format.c1]); tests/test_blocked_elementwise.py checks every path
# against a one-element-at-a-time loop of the scalar forms.

BLOCK = 32768  # elements per parallel task (128 KiB of float32); measured, docs/performance.md
PARALLEL_MIN = 2 * BLOCK  # fewer elements run in one thread, without a parallel region


@kernel(inline="always")
def n_blocks(n):
    """How many BLOCK-element blocks cover n elements."""
    return (n + BLOCK - 1) // BLOCK


@kernel(inline="always")
def block_range(k, n):
    """(i0, i1): the elements [i0, i1) of block k of n elements."""
    i0 = k * BLOCK
    return i0, min(i0 + BLOCK, n)


def run_elementwise(loop, blocks, n, *args):
    """Run an element-wise kernel pair over n elements: ``loop(*args)`` (one
    thread, no parallel region) for n < PARALLEL_MIN, else ``blocks(*args)``."""
    (loop if n < PARALLEL_MIN else blocks)(*args)


# One loop and one block kernel per op, written out: a kernel built by a
# factory around the scalar function is a closure, and Numba never caches a
# closure (measured with Numba 0.68: a cache miss on every process start),
# so every run would pay its compile time again.


@kernel
def _add_loop(a, b, out):
    for i in range(out.size):
        out[i] = core.add(a[i], b[i])


@parallel_kernel
def _add_blocks(a, b, out):
    for k in prange(n_blocks(out.size)):
        i0, i1 = block_range(k, out.size)
        _add_loop(a[i0:i1], b[i0:i1], out[i0:i1])


@kernel
def _add_into_loop(a, b):
    """a[i] = add(a[i], b[i]): add's loop with a as its output, written with
    two arrays so the compiler sees one store stream and one load stream
    that it can tell apart (with a passed twice, as a and as out, its
    overlap check found them overlapping and ran the scalar loop: 2.3x the
    time on 124 M floats)."""
    for i in range(a.size):
        a[i] = core.add(a[i], b[i])


@parallel_kernel
def _add_into_blocks(a, b):
    for k in prange(n_blocks(a.size)):
        i0, i1 = block_range(k, a.size)
        _add_into_loop(a[i0:i1], b[i0:i1])


@kernel
def _sub_loop(a, b, out):
    for i in range(out.size):
        out[i] = core.sub(a[i], b[i])


@parallel_kernel
def _sub_blocks(a, b, out):
    for k in prange(n_blocks(out.size)):
        i0, i1 = block_range(k, out.size)
        _sub_loop(a[i0:i1], b[i0:i1], out[i0:i1])


@kernel
def _mul_loop(a, b, out):
    for i in range(out.size):
        out[i] = core.mul(a[i], b[i])


@parallel_kernel
def _mul_blocks(a, b, out):
    for k in prange(n_blocks(out.size)):
        i0, i1 = block_range(k, out.size)
        _mul_loop(a[i0:i1], b[i0:i1], out[i0:i1])


@kernel
def _fmax_loop(a, b, out):
    for i in range(out.size):
        out[i] = core.fmax(a[i], b[i])


@parallel_kernel
def _fmax_blocks(a, b, out):
    for k in prange(n_blocks(out.size)):
        i0, i1 = block_range(k, out.size)
        _fmax_loop(a[i0:i1], b[i0:i1], out[i0:i1])


@kernel
def _fmin_loop(a, b, out):
    for i in range(out.size):
        out[i] = core.fmin(a[i], b[i])


@parallel_kernel
def _fmin_blocks(a, b, out):
    for k in prange(n_blocks(out.size)):
        i0, i1 = block_range(k, out.size)
        _fmin_loop(a[i0:i1], b[i0:i1], out[i0:i1])


@kernel
def _recip_loop(x, out):
    for i in range(out.size):
        out[i] = core.recip(x[i])


@parallel_kernel
def _recip_blocks(x, out):
    for k in prange(n_blocks(out.size)):
        i0, i1 = block_range(k, out.size)
        _recip_loop(x[i0:i1], out[i0:i1])


@kernel
def _sqrt_loop(x, out):
    for i in range(out.size):
        out[i] = core.sqrt(x[i])


@parallel_kernel
def _sqrt_blocks(x, out):
    for k in prange(n_blocks(out.size)):
        i0, i1 = block_range(k, out.size)
        _sqrt_loop(x[i0:i1], out[i0:i1])


@kernel
def _rint_loop(x, out):
    for i in range(out.size):
        out[i] = core.rint(x[i])


@parallel_kernel
def _rint_blocks(x, out):
    for k in prange(n_blocks(out.size)):
        i0, i1 = block_range(k, out.size)
        _rint_loop(x[i0:i1], out[i0:i1])


@kernel
def _exp_loop(x, out):
    for i in range(out.size):
        out[i] = exp_lane(x[i])


@parallel_kernel
def _exp_blocks(x, out):
    for k in prange(n_blocks(out.size)):
        i0, i1 = block_range(k, out.size)
        _exp_loop(x[i0:i1], out[i0:i1])


@kernel
def _log_loop(x, out):
    for i in range(out.size):
        out[i] = tr.log(x[i])


@parallel_kernel
def _log_blocks(x, out):
    for k in prange(n_blocks(out.size)):
        i0, i1 = block_range(k, out.size)
        _log_loop(x[i0:i1], out[i0:i1])


@kernel
def _tanh_loop(x, out):
    for i in range(out.size):
        out[i] = tanh_lane(x[i])


@parallel_kernel
def _tanh_blocks(x, out):
    for k in prange(n_blocks(out.size)):
        i0, i1 = block_range(k, out.size)
        _tanh_loop(x[i0:i1], out[i0:i1])


@kernel
def _sigmoid_loop(x, out):
    for i in range(out.size):
        out[i] = sigmoid_lane(x[i])


@parallel_kernel
def _sigmoid_blocks(x, out):
    for k in prange(n_blocks(out.size)):
        i0, i1 = block_range(k, out.size)
        _sigmoid_loop(x[i0:i1], out[i0:i1])


@kernel
def _sin_loop(x, out):
    for i in range(out.size):
        out[i] = tr.sin(x[i])


@parallel_kernel
def _sin_blocks(x, out):
    for k in prange(n_blocks(out.size)):
        i0, i1 = block_range(k, out.size)
        _sin_loop(x[i0:i1], out[i0:i1])


@kernel
def _cos_loop(x, out):
    for i in range(out.size):
        out[i] = tr.cos(x[i])


@parallel_kernel
def _cos_blocks(x, out):
    for k in prange(n_blocks(out.size)):
        i0, i1 = block_range(k, out.size)
        _cos_loop(x[i0:i1], out[i0:i1])


# ---- public API -----------------------------------------------------------------


def add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[num.add.c1] a + b element by element."""
    return _binary("add", _add_loop, _add_blocks, a, b)


def add_into(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[num.add.c1] a = a + b element by element, in place (returns ``a``):
    the bits of ``add(a, b)``, each element read before it is written, so
    no new array.  ``a``: C-contiguous, writeable; ``b``: the same shape,
    sharing no memory with ``a``."""
    fa, fb = _as_f32("add_into", "a", a), _as_f32("add_into", "b", b)
    if a.shape != b.shape:
        raise ValueError(f"add_into: operands must have the same shape, got {a.shape} and {b.shape}")
    if not a.flags.c_contiguous or not a.flags.writeable:
        raise ValueError("add_into: a must be a C-contiguous, writeable array (it receives the sum)")
    if np.may_share_memory(a, b):
        raise ValueError("add_into: a and b must not overlap")
    run_elementwise(_add_into_loop, _add_into_blocks, fa.size, fa, fb)
    return a


def sub(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[num.add.c1] a - b element by element."""
    return _binary("sub", _sub_loop, _sub_blocks, a, b)


def mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[num.mul.c1] a * b element by element."""
    return _binary("mul", _mul_loop, _mul_blocks, a, b)


def fmax(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[num.minmax.c1] maximum element by element."""
    return _binary("fmax", _fmax_loop, _fmax_blocks, a, b)


def fmin(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[num.minmax.c1] minimum element by element."""
    return _binary("fmin", _fmin_loop, _fmin_blocks, a, b)


def recip(x: np.ndarray) -> np.ndarray:
    """[num.recip.c1] 1/x element by element."""
    return _unary("recip", _recip_loop, _recip_blocks, x)


def sqrt(x: np.ndarray) -> np.ndarray:
    """[num.sqrt.c1] square root element by element."""
    return _unary("sqrt", _sqrt_loop, _sqrt_blocks, x)


def rint(x: np.ndarray) -> np.ndarray:
    """[num.rint.c1] round to integer (ties to even) element by element."""
    return _unary("rint", _rint_loop, _rint_blocks, x)


def exp(x: np.ndarray) -> np.ndarray:
    """[num.exp.c1] e^x element by element."""
    return _unary("exp", _exp_loop, _exp_blocks, x)


def log(x: np.ndarray) -> np.ndarray:
    """[num.log.c1] natural logarithm element by element."""
    return _unary("log", _log_loop, _log_blocks, x)


def tanh(x: np.ndarray) -> np.ndarray:
    """[num.tanh.c1] hyperbolic tangent element by element."""
    return _unary("tanh", _tanh_loop, _tanh_blocks, x)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """[num.sigmoid.c1] logistic sigmoid element by element."""
    return _unary("sigmoid", _sigmoid_loop, _sigmoid_blocks, x)


def sin(x: np.ndarray) -> np.ndarray:
    """[num.sincos.c1] sine element by element (|x| <= 2^14, else NaN)."""
    return _unary("sin", _sin_loop, _sin_blocks, x)


def cos(x: np.ndarray) -> np.ndarray:
    """[num.sincos.c1] cosine element by element (|x| <= 2^14, else NaN)."""
    return _unary("cos", _cos_loop, _cos_blocks, x)
