"""int8 quantization-aware linear layer on the device (``spec/16-quant.txt``);
mirrors ``refreplay.ops.quant``.

Step sizes are re-pinned from the tensor on every call ([quant.step.c1]);
codes are saturate_i8(rint(x * recip(s))) ([quant.quantize.c1]); the forward
product is the exact int8 matmul of ``linalg`` and ``rescale_k`` turns it back
into binary32 ([quant.linear.fwd.c1]); the backward runs in binary32 on the
dequantized operands with the straight-through mask ([quant.ste.c1]).

Row kernels: x [R, K] with one step s[r] per row; one thread per row for the
step sizes (grid ``blocks(R)``), one thread per element otherwise (grid
``blocks(R*K)``).  recip(s[r]) is the same value in every thread of a row.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from refreplay.ops.quant import QMAX, QMIN, RECIP_QMAX, STEP_FLOOR

from .. import shim
from .._jit import kernel

ZERO = np.float32(0.0)
_M = "float32[:, ::1]"


@kernel(f"void({_M}, float32[::1])")
def step_rows_k(x, s):
    """[quant.step.c1] s[r] = step of row r: a = +0, a = fmax(a, |x[r, k]|) over k;
    s = a * RQ, and the floor 2^-126 where s is a zero.  s [R] overwritten."""
    r = cuda.grid(1)
    R, K = x.shape
    if r < R:
        a = ZERO
        for k in range(K):
            a = shim.fmax(a, abs(x[r, k]))
        st = shim.mul(a, RECIP_QMAX)
        s[r] = STEP_FLOOR if st == ZERO else st


@kernel(f"void({_M}, float32[::1], int8[:, ::1])")
def quantize_rows_k(x, s, q):
    """[quant.quantize.c1] q[r, k] = saturate_i8(rint(x[r, k] * recip(s[r]))).  q overwritten."""
    t = cuda.grid(1)
    R, K = x.shape
    if t < R * K:
        r = t // K
        k = t - r * K
        q[r, k] = shim.saturate_i8(shim.rint(shim.mul(x[r, k], shim.recip(s[r]))))


@kernel(f"void(int8[:, ::1], float32[::1], {_M})")
def dequantize_rows_k(q, s, out):
    """[quant.dequantize.c1] out[r, k] = mul(f32(q[r, k]), s[r]) (the int8 converts exactly)."""
    t = cuda.grid(1)
    R, K = q.shape
    if t < R * K:
        r = t // K
        k = t - r * K
        out[r, k] = shim.mul(np.float32(q[r, k]), s[r])


@kernel(f"void({_M}, float32[::1], {_M})")
def ste_mask_rows_k(x, s, g):
    """[quant.ste.c1] g[r, k] = +0 where rint(x[r, k] * recip(s[r])) is outside
    [-128, 127] or NaN; elsewhere g passes unchanged (in place)."""
    t = cuda.grid(1)
    R, K = x.shape
    if t < R * K:
        r = t // K
        k = t - r * K
        v = shim.rint(shim.mul(x[r, k], shim.recip(s[r])))
        if not (v >= QMIN and v <= QMAX):
            g[r, k] = ZERO


@kernel(f"void(int32[:, ::1], float32[::1], float32[::1], float32[::1], boolean, int64, {_M})")
def rescale_k(acc, sx, sw, bias, has_bias, T, y):
    """[quant.linear.fwd.c1] step 4: y[n, o] = f32(acc[n, o]) * (sx[n // T] * sw[o]),
    then + bias[o] with ``has_bias``.  acc [N, OC] int32; y [N, OC] overwritten.
    f32() of an int32 rounds to nearest even (cvt.rn), as IEEE convertFromInt."""
    t = cuda.grid(1)
    N, OC = acc.shape
    if t < N * OC:
        n = t // OC
        o = t - n * OC
        v = shim.mul(np.float32(acc[n, o]), shim.mul(sx[n // T], sw[o]))
        y[n, o] = shim.add(v, bias[o]) if has_bias else v
