"""Elementwise device kernels of the binary32 primitives (``spec/01-numbers.txt``).

Each kernel applies one primitive of the shim to every element: one thread
per output n, grid ``blocks(N)`` x ``THREADS``.  They exist so that every
clause of chapter 1 can be checked on the device against
``refreplay.numerics.core`` and audited in PTX; ops use the shim's device
functions directly.  All arrays are 1-D and C-contiguous, of length N;
``out`` is overwritten.
"""

from __future__ import annotations

from numba import cuda

from . import shim
from ._jit import kernel

_F1 = "void(float32[::1], float32[::1])"
_F2 = "void(float32[::1], float32[::1], float32[::1])"


@kernel(_F1)
def load_k(x, out):
    """[num.load.c1] out[n] = x[n] with subnormals zeroed (sign kept) and NaN canonical."""
    n = cuda.grid(1)
    if n < out.size:
        out[n] = shim.finish(x[n])


@kernel(_F2)
def add_k(a, b, out):
    """[num.add.c1] out[n] = add(a[n], b[n])."""
    n = cuda.grid(1)
    if n < out.size:
        out[n] = shim.add(a[n], b[n])


@kernel(_F2)
def sub_k(a, b, out):
    """[num.add.c1] out[n] = sub(a[n], b[n])."""
    n = cuda.grid(1)
    if n < out.size:
        out[n] = shim.sub(a[n], b[n])


@kernel(_F2)
def mul_k(a, b, out):
    """[num.mul.c1] out[n] = mul(a[n], b[n])."""
    n = cuda.grid(1)
    if n < out.size:
        out[n] = shim.mul(a[n], b[n])


@kernel("void(float32[::1], float32[::1], float32[::1], float32[::1])")
def mul_add_k(a, b, c, out):
    """[num.nofma.c1] out[n] = add(mul(a[n], b[n]), c[n]): two roundings, never one."""
    n = cuda.grid(1)
    if n < out.size:
        out[n] = shim.add(shim.mul(a[n], b[n]), c[n])


@kernel(_F1)
def recip_k(x, out):
    """[num.recip.c1] out[n] = recip(x[n])."""
    n = cuda.grid(1)
    if n < out.size:
        out[n] = shim.recip(x[n])


@kernel(_F1)
def sqrt_k(x, out):
    """[num.sqrt.c1] out[n] = sqrt(x[n])."""
    n = cuda.grid(1)
    if n < out.size:
        out[n] = shim.sqrt(x[n])


@kernel(_F2)
def fmax_k(a, b, out):
    """[num.minmax.c1] out[n] = fmax(a[n], b[n])."""
    n = cuda.grid(1)
    if n < out.size:
        out[n] = shim.fmax(a[n], b[n])


@kernel(_F2)
def fmin_k(a, b, out):
    """[num.minmax.c1] out[n] = fmin(a[n], b[n])."""
    n = cuda.grid(1)
    if n < out.size:
        out[n] = shim.fmin(a[n], b[n])


@kernel(_F1)
def rint_k(x, out):
    """[num.rint.c1] out[n] = rint(x[n])."""
    n = cuda.grid(1)
    if n < out.size:
        out[n] = shim.rint(x[n])


@kernel("void(float32[::1], int8[::1])")
def saturate_i8_k(x, out):
    """[num.sat.c1] out[n] = saturate_i8(x[n]) for integral x (int8 out)."""
    n = cuda.grid(1)
    if n < out.size:
        out[n] = shim.saturate_i8(x[n])
