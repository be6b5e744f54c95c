"""Slow, obviously correct oracles for the fixed-order kernels.

Pure Python loops over NumPy float32 scalars: every product and every sum is
one IEEE binary32 operation (NumPy rounds float32 scalar arithmetic to
nearest-even), followed by the explicit flush of [num.flush.c1]; the
canonical NaN of [num.nan.c1] is applied to each result.  Nothing here
imports refreplay, so these share no code with the library.
"""

from __future__ import annotations

import numpy as np

F32 = np.float32
FLT_MIN = F32(2.0**-126)
CANON_NAN = np.array([0x7FC00000], dtype=np.uint32).view(np.float32)[0]


def flush(x):
    return x * F32(0.0) if abs(x) < FLT_MIN else x


def canon(x):
    return CANON_NAN if x != x else x


def add(a, b):
    with np.errstate(all="ignore"):
        return canon(flush(F32(a) + F32(b)))


def mul(a, b):
    with np.errstate(all="ignore"):
        return canon(flush(F32(a) * F32(b)))


def fmax(a, b):
    if a != a or b != b:
        return CANON_NAN
    if a == b:  # +0 beats -0
        return a if not np.signbit(a) else b
    return a if a > b else b


def seq_sum(terms):
    """[red.sum.c1] -0, then each term in order; the empty sum is +0."""
    terms = list(terms)
    if not terms:
        return F32(0.0)
    s = F32(-0.0)
    for t in terms:
        s = add(s, t)
    return s


def matmul(A, B, flush_results=True):
    """[mm.nn.c1] A: I×K, B: K×J, one output at a time.

    ``flush_results=False`` computes the same order with plain IEEE gradual
    underflow (a deliberately wrong model, to show that test data is
    sensitive to the flushes).
    """
    I, K = A.shape
    J = B.shape[1]
    C = np.empty((I, J), dtype=np.float32)
    for i in range(I):
        for j in range(J):
            if flush_results:
                C[i, j] = seq_sum(mul(A[i, k], B[k, j]) for k in range(K))
            else:
                with np.errstate(all="ignore"):
                    s = F32(-0.0) if K else F32(0.0)
                    for k in range(K):
                        s = s + A[i, k] * B[k, j]
                C[i, j] = canon(s)
    return C


def row_sum(X):
    return np.array([seq_sum(X[i]) for i in range(X.shape[0])], dtype=np.float32)


def col_sum(X):
    return np.array([seq_sum(X[:, j]) for j in range(X.shape[1])], dtype=np.float32)


def row_max(X):
    out = np.empty(X.shape[0], dtype=np.float32)
    for i in range(X.shape[0]):
        m = F32(-np.inf)
        for x in X[i]:
            m = fmax(m, x)
        out[i] = m
    return out


def matmul_i8(A, B):
    """Exact integers (Python int), returned as int64 for comparison."""
    I, K = A.shape
    J = B.shape[1]
    return np.array(
        [[sum(int(A[i, k]) * int(B[k, j]) for k in range(K)) for j in range(J)] for i in range(I)], dtype=np.int64
    )


def bits(x):
    """uint32 view of a float32 array, for exact comparisons that see -0 and NaN payloads."""
    return np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
