"""Fixed-order fp32 matmul written as the spec states it: one output at a
time, a sequential sum over k in increasing order through ``numerics.add`` and
``numerics.mul``.

These loops are the readable reference for ``mm_fp32.py``'s blocked kernels;
the tests require the two to agree bit for bit.  Shapes use the letters of
[conv.shapes.c1]: I rows, J columns, K the contracted length.
"""

from __future__ import annotations

from .._jit import kernel
from ..numerics.core import add, mul
from .common import sum_start


@kernel
def mm_nn_naive(A, B, C, accumulate=False):
    """[mm.nn.c1] C = A·B.  A: I×K, B: K×J, C: I×J.

    C is overwritten, or with ``accumulate`` C[i,j] = add(C[i,j], sum)
    ([mm.accumulate.c1]).
    """
    I, K = A.shape
    J = B.shape[1]
    start = sum_start(K)
    for i in range(I):
        for j in range(J):
            s = start
            for k in range(K):
                s = add(s, mul(A[i, k], B[k, j]))
            C[i, j] = add(C[i, j], s) if accumulate else s


@kernel
def mm_nt_naive(A, B, C, accumulate=False):
    """[mm.nt.c1] C = A·Bᵀ.  A: I×K, B: J×K, C: I×J; overwritten or accumulated."""
    I, K = A.shape
    J = B.shape[0]
    start = sum_start(K)
    for i in range(I):
        for j in range(J):
            s = start
            for k in range(K):
                s = add(s, mul(A[i, k], B[j, k]))
            C[i, j] = add(C[i, j], s) if accumulate else s


@kernel
def mm_tn_naive(A, B, C, accumulate=False):
    """[mm.tn.c1] C = Aᵀ·B.  A: K×I, B: K×J, C: I×J; overwritten or accumulated."""
    K, I = A.shape
    J = B.shape[1]
    start = sum_start(K)
    for i in range(I):
        for j in range(J):
            s = start
            for k in range(K):
                s = add(s, mul(A[k, i], B[k, j]))
            C[i, j] = add(C[i, j], s) if accumulate else s


@kernel
def bias_add_naive(C, b):
    """[mm.bias.c1] C[i,j] = add(C[i,j], b[j]) in place.  C: I×J, b: J."""
    I, J = C.shape
    for i in range(I):
        for j in range(J):
            C[i, j] = add(C[i, j], b[j])
