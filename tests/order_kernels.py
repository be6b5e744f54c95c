"""Matmul kernels that sum k in another order, fast at any shape, for the
tests of a live diagnosis that names the order (test_diagnosis_live_order.py).

Each is a dispatcher ``kernel(op, A, B)`` for matmul, matmul_nt and
matmul_tn (``refreplay conform order_kernels:split_k``): the inputs are put
in the canonical form A (I x K), B (K x J), and every partial sum is the
reference's own sequential matmul over a part of k, so a kernel at the
gpt2-124m head shape (K = 50,257) takes seconds, not hours."""

import numpy as np

from refreplay import numerics
from refreplay.conformance.base import deviant as fp

SPLIT = 64  # split_k: the length of each part of k
LANES = 8  # strided_lanes: the number of lanes


def _canonical(op, A, B):
    A, B = numerics.load(A), numerics.load(B)
    if op == "matmul":
        return A, B
    if op == "matmul_nt":  # B is J x K
        return A, B.T
    if op == "matmul_tn":  # A is K x I
        return A.T, B
    raise NotImplementedError(op)


def _mm(A, B):
    """The spec's sum over k, from -0 with k increasing ([mm.nn.c1])."""
    from refreplay import linalg

    return linalg.matmul(np.ascontiguousarray(A), np.ascontiguousarray(B))


def split_k(op, A, B):
    """Split-K: each part of ``SPLIT`` consecutive k summed in the spec's
    order, then the partial sums added in order from -0 (the candidate
    'blocked/split-k, blocks of 64')."""
    A, B = _canonical(op, A, B)
    if not A.shape[1]:  # the empty sum is +0 ([red.sum.c1])
        return _mm(A, B)
    acc = np.full((A.shape[0], B.shape[1]), -0.0, np.float32)
    for k in range(0, A.shape[1], SPLIT):
        acc = fp.add(acc, _mm(A[:, k : k + SPLIT], B[k : k + SPLIT]))
    return acc


def strided_lanes(op, A, B):
    """SIMD lanes: lane l sums k = l, l + 8, ... in order, then the lanes
    are combined by a butterfly (lane l += lane l + 4, then + 2, then + 1),
    the candidate '8 strided lanes + butterfly (SIMD/warp)'."""
    A, B = _canonical(op, A, B)
    if not A.shape[1]:  # the empty sum is +0 ([red.sum.c1])
        return _mm(A, B)
    # a lane with no terms holds the -0 it starts from
    lanes = [
        _mm(A[:, lane::LANES], B[lane::LANES]) if lane < A.shape[1] else np.full((len(A), B.shape[1]), -0.0, np.float32)
        for lane in range(LANES)
    ]
    while len(lanes) > 1:
        half = len(lanes) // 2
        lanes = [fp.add(lanes[i], lanes[i + half]) for i in range(half)]
    return lanes[0]


def tf32(op, A, B):
    """Not an order: the spec's order on inputs rounded to TF32 (10
    significand bits), as a tensor core's fp32 matmul does by default."""
    A, B = _canonical(op, A, B)
    return _mm(fp.round_mantissa(A, 10), fp.round_mantissa(B, 10))


def one_element(op, A, B):
    """Not an order: the spec's output with one element, C[0, 0], one ulp
    off (whatever k-order would give it, no order gives only that)."""
    A, B = _canonical(op, A, B)
    C = _mm(A, B)
    if C.size:
        C.view(np.uint32)[0, 0] ^= np.uint32(1)
    return C


def split_k_long(op, A, B):
    """Split-K (as ``split_k``) for sums of 512 terms and more only, the
    spec's order below: an order that changes with shape."""
    A, B = _canonical(op, A, B)
    return split_k("matmul", A, B) if A.shape[1] >= 512 else _mm(A, B)
