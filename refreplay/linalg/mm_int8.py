"""int8 × int8 → int32 matmul: exact integer arithmetic ([mm.i8.c1]).

Integer addition is associative, so every order gives the same int32; the
only hazard is overflow, excluded by the bound of [mm.i8.c2] that the API
checks before calling these kernels.
"""
from __future__ import annotations

import numpy as np
from numba import prange

from .._jit import kernel, parallel_kernel

I8_MAX_K = 131071  # [mm.i8.c2] K * 2**14 < 2**31, i.e. K <= 2**17 - 1


@parallel_kernel
def mm_i8(A, B, C):
    """[mm.i8.c1] C = A·B exactly.  A: I×K int8, B: K×J int8, C: I×J int32,
    overwritten.  Requires K <= I8_MAX_K ([mm.i8.c2])."""
    I, K = A.shape
    J = B.shape[1]
    for i in prange(I):
        c = C[i]
        c[:] = 0
        for k in range(K):
            a = np.int32(A[i, k])
            b = B[k]
            for j in range(J):
                c[j] += a * np.int32(b[j])


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
