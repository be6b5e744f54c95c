"""int8 × int8 → int32 matmul: exact integer arithmetic ([mm.i8.c1]).

Integer addition is associative, so every order gives the same int32; the
only hazard is overflow, excluded by the bound of [mm.i8.c2] that the API
checks before calling these kernels.

The fast kernel borrows the fp32 tile, exactly: an int8 is a float32 without
rounding, a product of two (|p| <= 2^14) too, and a sum of at most
I8_EXACT_KB = 1024 such products is an integer of magnitude <= 2^24, which
float32 holds exactly, so no float operation in a block ever rounds (nor
flushes: every nonzero value is >= 1).  Blocks of 1024 k are converted back
to int32 and added in int32.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .._jit import kernel, parallel_kernel
from .mm_fp32 import _mm_packed

I8_MAX_K = 131071  # [mm.i8.c2] K * 2**14 < 2**31, i.e. K <= 2**17 - 1
I8_EXACT_KB = 1024  # k per float32 block: 1024 * 2**14 = 2**24, exact in float32


@parallel_kernel
def _widen(X, r0, r1, c0, c1, out):
    """out[r, c] = float32(X[r0 + r, c0 + c]) (exact for int8)."""
    for r in prange(r1 - r0):
        x = X[r0 + r]
        o = out[r]
        for c in range(c1 - c0):
            o[c] = np.float32(x[c0 + c])


@parallel_kernel
def _add_exact(C, S):
    """C[i, j] += int32(S[i, j]); S holds integers of magnitude <= 2^24."""
    for i in prange(C.shape[0]):
        c, s = C[i], S[i]
        for j in range(c.shape[0]):
            c[j] += np.int32(s[j])


@kernel
def mm_i8(A, B, C):
    """[mm.i8.c1] C = A·B exactly.  A: I×K int8, B: K×J int8, C: I×J int32,
    overwritten.  Requires K <= I8_MAX_K ([mm.i8.c2])."""
    I, K = A.shape
    J = B.shape[1]
    C[:] = 0
    S = np.empty((I, J), dtype=np.float32)
    for k0 in range(0, K, I8_EXACT_KB):
        k1 = min(K, k0 + I8_EXACT_KB)
        Af = np.empty((I, k1 - k0), dtype=np.float32)
        Bf = np.empty((k1 - k0, J), dtype=np.float32)
        _widen(A, 0, I, k0, k1, Af)
        _widen(B, k0, k1, 0, J, Bf)
        _mm_packed(Af, Bf, S, False, False)
        _add_exact(C, S)


@kernel
def mm_i8_naive(A, B, C):
    """[mm.i8.c1] One output at a time in int64, then stored as int32."""
    I, K = A.shape
    J = B.shape[1]
    for i in range(I):
        for j in range(J):
            s = np.int64(0)
            for k in range(K):
                s += np.int64(A[i, k]) * np.int64(B[k, j])
            C[i, j] = s
