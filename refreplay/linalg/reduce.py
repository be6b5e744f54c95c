"""Fixed-order reductions, compiled: row sum, column sum, row max.

Threads and SIMD lanes run over independent outputs only; each output's own
sum keeps the order of [red.sum.c1].  ``reduce_naive.py`` holds the
one-output-at-a-time references.
"""
from __future__ import annotations

import numpy as np
from numba import prange

from .._jit import parallel_kernel
from ..numerics.core import add, canon, flush, fmax
from .common import sum_start, NEG_INF


@parallel_kernel
def row_sum_k(X, out):
    """[red.rowsum.c1] out[i] = sum over n of X[i, n], n increasing.  X: I×N, out: I (overwritten)."""
    I, N = X.shape
    for i in prange(I):
        x = X[i]
        s = sum_start(N)
        for n in range(N):
            s = flush(s + x[n])
        out[i] = canon(s)  # [num.nan.c1] once at the end of the chain


@parallel_kernel
def col_sum_k(X, out, accumulate=False):
    """[red.colsum.c1] out[j] = sum over n of X[n, j], n increasing.  X: N×J, out: J.

    Overwritten, or with ``accumulate`` out[j] = add(out[j], sum).  The n loop
    is outermost so the j loop runs over independent outputs and vectorises.
    """
    N, J = X.shape
    acc = np.full(J, sum_start(N), dtype=np.float32)
    for n in range(N):
        x = X[n]
        for j in range(J):
            acc[j] = flush(acc[j] + x[j])
    for j in prange(J):
        out[j] = add(out[j], acc[j]) if accumulate else canon(acc[j])


@parallel_kernel
def row_max_k(X, out):
    """[red.rowmax.c1] out[i] = fmax over n of X[i, n], from -inf.  X: I×N, out: I (overwritten)."""
    I, N = X.shape
    for i in prange(I):
        x = X[i]
        m = NEG_INF
        for n in range(N):
            m = fmax(m, x[n])
        out[i] = m
