"""Fixed-order fp32 matmul kernels, compiled, for the API and for other kernels.

Every output is the sequential sum of [mm.nn.c1] / [mm.nt.c1] / [mm.tn.c1]:
products and partial sums rounded and flushed one by one, k increasing.
Speed comes only from computing many independent outputs at once; no sum is
split or reordered.  ``matmul_naive.py`` holds the one-output-at-a-time loops
these must equal bit for bit.

Call from compiled code: ``mm_nn(A, B, C)`` overwrites C, ``mm_nn(A, B, C,
True)`` accumulates into it ([mm.accumulate.c1]); likewise mm_nt, mm_tn.
"""
from __future__ import annotations

import numpy as np
from numba import prange

from .._jit import kernel, parallel_kernel
from ..numerics.core import add, canon, flush
from .common import sum_start


@kernel
def _row_axpy_chain(a_row, B, acc):
    """acc[j] = flush(acc[j] + flush(a_row[k] * B[k, j])) for k = 0, 1, ...

    One output row; the k loop is outermost so that the j loop runs over
    independent outputs and vectorises.  a_row: K, B: K×J, acc: J.
    """
    for k in range(a_row.shape[0]):
        a = a_row[k]
        b = B[k]
        for j in range(acc.shape[0]):
            acc[j] = flush(acc[j] + flush(a * b[j]))


@kernel
def _store_row(acc, c_row, accumulate):
    """[num.nan.c1] canonicalise once at the end of the chain; [mm.accumulate.c1]."""
    if accumulate:
        for j in range(acc.shape[0]):
            c_row[j] = add(c_row[j], acc[j])
    else:
        for j in range(acc.shape[0]):
            c_row[j] = canon(acc[j])


@parallel_kernel
def mm_nn(A, B, C, accumulate=False):
    """[mm.nn.c1] C = A·B.  A: I×K, B: K×J, C: I×J; overwritten, or accumulated
    into with ``accumulate`` ([mm.accumulate.c1]).  Threads over rows i."""
    I, K = A.shape
    J = B.shape[1]
    start = sum_start(K)
    for i in prange(I):
        acc = np.full(J, start, dtype=np.float32)
        _row_axpy_chain(A[i], B, acc)
        _store_row(acc, C[i], accumulate)


@parallel_kernel
def mm_nt(A, B, C, accumulate=False):
    """[mm.nt.c1] C = A·Bᵀ.  A: I×K, B: J×K, C: I×J; overwritten or accumulated."""
    I, K = A.shape
    J = B.shape[0]
    Bt = np.empty((K, J), dtype=np.float32)  # packing copies bits, never reorders a sum
    for k in prange(K):
        for j in range(J):
            Bt[k, j] = B[j, k]
    start = sum_start(K)
    for i in prange(I):
        acc = np.full(J, start, dtype=np.float32)
        _row_axpy_chain(A[i], Bt, acc)
        _store_row(acc, C[i], accumulate)


@parallel_kernel
def mm_tn(A, B, C, accumulate=False):
    """[mm.tn.c1] C = Aᵀ·B.  A: K×I, B: K×J, C: I×J; overwritten or accumulated."""
    K, I = A.shape
    J = B.shape[1]
    At = np.empty((I, K), dtype=np.float32)
    for i in prange(I):
        for k in range(K):
            At[i, k] = A[k, i]
    start = sum_start(K)
    for i in prange(I):
        acc = np.full(J, start, dtype=np.float32)
        _row_axpy_chain(At[i], B, acc)
        _store_row(acc, C[i], accumulate)


@parallel_kernel
def bias_add(C, b):
    """[mm.bias.c1] C[i,j] = add(C[i,j], b[j]) in place.  C: I×J, b: J."""
    I, J = C.shape
    for i in prange(I):
        c = C[i]
        for j in range(J):
            c[j] = add(c[j], b[j])
