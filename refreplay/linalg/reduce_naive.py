"""Fixed-order reductions over one axis, written as the spec states them.

Readable references for ``reduce.py``; the tests require bit-for-bit agreement.
"""

from __future__ import annotations

from .._jit import kernel
from ..numerics.core import add, fmax
from .common import sum_start, NEG_INF


@kernel
def row_sum_naive(X, out):
    """[red.rowsum.c1] out[i] = sum over n of X[i, n], n increasing.  X: I×N, out: I (overwritten)."""
    I, N = X.shape
    for i in range(I):
        s = sum_start(N)
        for n in range(N):
            s = add(s, X[i, n])
        out[i] = s


@kernel
def col_sum_naive(X, out, accumulate=False):
    """[red.colsum.c1] out[j] = sum over n of X[n, j], n increasing.  X: N×J, out: J.

    Overwritten, or with ``accumulate`` out[j] = add(out[j], sum).
    """
    N, J = X.shape
    for j in range(J):
        s = sum_start(N)
        for n in range(N):
            s = add(s, X[n, j])
        out[j] = add(out[j], s) if accumulate else s


@kernel
def row_max_naive(X, out):
    """[red.rowmax.c1] out[i] = fmax over n of X[i, n], from -inf.  X: I×N, out: I (overwritten)."""
    I, N = X.shape
    for i in range(I):
        m = NEG_INF
        for n in range(N):
            m = fmax(m, X[i, n])
        out[i] = m
