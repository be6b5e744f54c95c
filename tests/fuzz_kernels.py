"""Kernels that follow the spec up to a shape and switch algorithm above it,
as real kernels do: what ``refreplay fuzz`` (and live cases) must catch.

Below the threshold each calls the reference itself, so it is exact on
every input there; above it, it changes only the summation structure, with
the spec's own rounded primitives ([num.add.c1], [num.exp.c1], ...).
"""

import numpy as np

from refreplay import linalg
from refreplay.conformance.base.case import load_inputs
from refreplay.numerics import elementwise as E
from refreplay.ops import softmax as S

SPLIT_K_ABOVE = 64
ONLINE_SOFTMAX_ABOVE = 128


def matmul(A, B):
    """Sequential in k up to K = 64; above, split-K: two halves summed
    separately, then added (the order of [mm.nn.c1] is broken)."""
    A, B = load_inputs([A, B])
    K = A.shape[1]
    if K <= SPLIT_K_ABOVE:
        return linalg.matmul(A, B)
    h = K // 2
    lo = linalg.matmul(np.ascontiguousarray(A[:, :h]), np.ascontiguousarray(B[:h]))
    hi = linalg.matmul(np.ascontiguousarray(A[:, h:]), np.ascontiguousarray(B[h:]))
    return E.add(lo, hi)


def _block_stats(x):
    """Row max m and the sequential sum s of exp(x - m) of a block [N, W]."""
    m = np.full(x.shape[0], -np.inf, np.float32)
    for j in range(x.shape[1]):
        m = E.fmax(m, np.ascontiguousarray(x[:, j]))
    s = np.full(x.shape[0], -0.0, np.float32)
    for j in range(x.shape[1]):
        s = E.add(s, E.exp(E.sub(np.ascontiguousarray(x[:, j]), m)))
    return m, s


def softmax_forward(x):
    """[softmax.fwd.c1] up to V = 128; above, the two-block online form:
    each half's max and sum, combined as s = s1 e^(m1-m) + s2 e^(m2-m)."""
    (x,) = load_inputs([x])
    N, V = x.shape
    if V <= ONLINE_SOFTMAX_ABOVE:
        return S.softmax_forward(x)
    h = V // 2
    m1, s1 = _block_stats(x[:, :h])
    m2, s2 = _block_stats(x[:, h:])
    m = E.fmax(m1, m2)
    s = E.add(E.mul(s1, E.exp(E.sub(m1, m))), E.mul(s2, E.exp(E.sub(m2, m))))
    r = E.recip(s)
    y = np.empty_like(x)
    for j in range(V):
        y[:, j] = E.mul(E.exp(E.sub(np.ascontiguousarray(x[:, j]), m)), r)
    return y
