"""Fixed-order reductions, compiled: row sum, column sum, row max.

SIMD lanes and threads run over independent outputs only; each output's own
chain keeps the order of [red.sum.c1].  Column sums vectorise directly (the
row index n runs outermost, the columns j are the lanes).  Row sums and row
maxima would be one long dependent chain per row, so blocks of RB rows are
transposed, chunk by chunk, into a scratch tile and reduced column-wise: the
chain of row i still visits X[i, 0], X[i, 1], ... in order, while RB rows
advance together.  ``reduce_naive.py`` holds the one-output-at-a-time
references.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from .._jit import kernel, parallel_kernel
from ..numerics.core import add, canon, flush, fmax
from .common import sum_start, NEG_INF

RB = 32  # rows reduced together (the SIMD lanes of the column-wise loop)
NB = 128  # columns transposed per chunk (an RB × NB tile stays in L1)
CB = 512  # columns per thread task of a column sum


@kernel
def _add_rows(T, acc):
    """acc[j] = flush(acc[j] + T[n, j]) for n = 0, 1, ... (NaN canonicalised by the caller)."""
    for n in range(T.shape[0]):
        t = T[n]
        for j in range(acc.shape[0]):
            acc[j] = flush(acc[j] + t[j])


@kernel
def _max_rows(T, acc):
    """acc[j] = fmax(acc[j], T[n, j]) for n = 0, 1, ..."""
    for n in range(T.shape[0]):
        t = T[n]
        for j in range(acc.shape[0]):
            acc[j] = fmax(acc[j], t[j])


@kernel
def _transpose_chunk(X, i0, rows, n0, cols, T):
    """T[n, r] = X[i0 + r, n0 + n] for r < rows, n < cols."""
    for r in range(rows):
        x = X[i0 + r]
        for n in range(cols):
            T[n, r] = x[n0 + n]


@parallel_kernel
def row_sum_k(X, out):
    """[red.rowsum.c1] out[i] = sum over n of X[i, n], n increasing.  X: I×N, out: I (overwritten)."""
    I, N = X.shape
    for b in prange((I + RB - 1) // RB):
        i0 = b * RB
        rows = min(RB, I - i0)
        acc = np.full(rows, sum_start(N), dtype=np.float32)
        T = np.empty((NB, rows), dtype=np.float32)
        for n0 in range(0, N, NB):  # chunks in increasing n: each row's chain stays in order
            cols = min(NB, N - n0)
            _transpose_chunk(X, i0, rows, n0, cols, T)
            _add_rows(T[:cols], acc)
        for r in range(rows):
            out[i0 + r] = canon(acc[r])  # [num.nan.c1] once at the end of the chain


@parallel_kernel
def row_max_k(X, out):
    """[red.rowmax.c1] out[i] = fmax over n of X[i, n], from -inf.  X: I×N, out: I (overwritten)."""
    I, N = X.shape
    for b in prange((I + RB - 1) // RB):
        i0 = b * RB
        rows = min(RB, I - i0)
        acc = np.full(rows, NEG_INF, dtype=np.float32)
        T = np.empty((NB, rows), dtype=np.float32)
        for n0 in range(0, N, NB):
            cols = min(NB, N - n0)
            _transpose_chunk(X, i0, rows, n0, cols, T)
            _max_rows(T[:cols], acc)
        for r in range(rows):
            out[i0 + r] = acc[r]


@parallel_kernel
def col_sum_k(X, out, accumulate=False):
    """[red.colsum.c1] out[j] = sum over n of X[n, j], n increasing.  X: N×J, out: J.

    Overwritten, or with ``accumulate`` out[j] = add(out[j], sum).  Threads
    take blocks of CB columns; within a block the n loop is outermost and the
    columns are the SIMD lanes.
    """
    N, J = X.shape
    for b in prange((J + CB - 1) // CB):
        j0 = b * CB
        acc = np.full(min(CB, J - j0), sum_start(N), dtype=np.float32)
        for n in range(N):
            x = X[n][j0 : j0 + acc.shape[0]]
            for j in range(acc.shape[0]):
                acc[j] = flush(acc[j] + x[j])
        for j in range(acc.shape[0]):
            out[j0 + j] = add(out[j0 + j], acc[j]) if accumulate else canon(acc[j])
