"""Row blocks: the sequential sums of several rows advance together in SIMD lanes.

A row op (norm, softmax, cross-entropy) sums each row of an [N, C] tensor
in the order of [red.sum.c1]: s = -0, then s = add(s, z[c]) for c
increasing.  One row's sum is one chain of dependent, rounded and flushed
adds, so a kernel that finishes one row before starting the next waits on
that chain at every element.  The rows are independent, so a kernel here
takes a block of RB rows, copies it transposed into a scratch tile
T[c, r] = X[i0 + r, c] (c = column, r = the row's lane) -- or writes the
terms of its sums there, computed along each row -- and runs all RB chains
at once:

    for c in increasing order:
        for r in range(RB):           # the SIMD lanes: one row each
            acc[r] = add(acc[r], T[c, r])

Row r's chain is exactly the sequential sum of its row; the lanes only put
different rows' chains side by side.  Threads (``prange``) take whole blocks,
so a sum never crosses threads, and the bits depend neither on RB nor on the
thread count (the technique of ``linalg/reduce.py``'s row sums).

A block at the end of the tensor may hold fewer than RB rows; its remaining
lanes hold +0 (or what an earlier chunk left there) and compute values that
are never stored, so every lane loop runs the constant trip count RB and
compiles to straight vector code.

Long rows (softmax and cross-entropy over V = 50,304 columns: a whole-row
tile would be 6 MiB) are walked in chunks of CB columns through one [CB, RB]
tile that stays in the L1 cache: ``load_chunk`` fills it, ``lane_sum_into``
carries each lane's chain on from the previous chunk, so row r's chain still
visits its columns in increasing order.
Kernels take arrays and integers and do arithmetic only; shapes are given
in spec letters (C columns of a block; RB lanes).
"""

from __future__ import annotations

import numpy as np

from .._jit import kernel
from .._tiles import prefetch, transpose8
from ..numerics.elementwise import add_flush, mul_flush

RB = 32  # rows per block: the SIMD lanes of every lane loop (a [256, 32] tile is 32 KiB)
CB = 256  # columns per chunk of a long row: a [CB, RB] tile is 32 KiB, it stays in L1


@kernel
def n_blocks(N):
    """The number of RB-row blocks that cover N rows."""
    return (N + RB - 1) // RB


@kernel
def new_block(C):
    """A new tile [C, RB] of +0, for a kernel that writes its own lanes."""
    return np.zeros((C, RB), np.float32)


@kernel
def new_tile():
    """A new [CB, RB] chunk tile of +0."""
    return np.zeros((CB, RB), np.float32)


@kernel
def load_chunk(X, i0, rows, c0, T):
    """T[c, r] = X[i0 + r, c0 + c] for r < rows and c < T.shape[0] (the
    chunk's width; T a [width, RB] view of a tile).  X: [N, V], C-contiguous.
    Lanes r >= rows keep what they held."""
    w = T.shape[0]
    if rows == RB:
        w8 = w - w % 8
        for c in range(0, w8, 8):  # 8 x 8 blocks moved by vector shuffles (_tiles.py)
            for r in range(0, RB, 8):
                transpose8(X, i0 + r, c0 + c, T, c, r)
        for r in range(RB):  # the last w % 8 columns, element by element
            x_r = X[i0 + r]
            for c in range(w8, w):
                T[c, r] = x_r[c0 + c]
        return
    for r in range(rows):
        x_r = X[i0 + r, c0 : c0 + w]
        for c in range(w):
            T[c, r] = x_r[c]


@kernel
def store_chunk(T, X, i0, rows, c0):
    """X[i0 + r, c0 + c] = T[c, r] for r < rows and c < T.shape[0]."""
    w = T.shape[0]
    if rows == RB:
        w8 = w - w % 8
        for c in range(0, w8, 8):
            for r in range(0, RB, 8):
                transpose8(T, c, r, X, i0 + r, c0 + c)
        for r in range(RB):
            x_r = X[i0 + r]
            for c in range(w8, w):
                x_r[c0 + c] = T[c, r]
        return
    for r in range(rows):
        x_r = X[i0 + r, c0 : c0 + w]
        for c in range(w):
            x_r[c] = T[c, r]


@kernel
def load_block(X, i0, rows):
    """A new tile T [C, RB] with T[c, r] = X[i0 + r, c] for r < rows and +0 in
    the lanes r >= rows.  X: [N, C], C-contiguous.

    A full block moves by 8 x 8 transposes (``_tiles.py``): copied element
    by element, the block went as a gather, and its copies took about half
    of LayerNorm's time at C = 768 (docs/performance-training.md)."""
    C = X.shape[1]
    if rows == RB:
        T = np.empty((C, RB), np.float32)
        load_chunk(X, i0, RB, 0, T)
        return T
    T = np.zeros((C, RB), np.float32)
    load_chunk(X, i0, rows, 0, T)
    return T


@kernel
def prefetch_block(X, i0):
    """Start fetching rows i0 .. i0+RB-1 of X [N, C] (those that exist) into
    the cache, one request per 64-byte line; call it a block ahead of
    load_block.  A hint only (_tiles.prefetch)."""
    N, C = X.shape
    for i in range(i0, min(i0 + RB, N)):
        for j in range(0, C, 16):
            prefetch(X, i, j)


@kernel
def lane_sum(T, start):
    """[red.sum.c1] acc[r] = sum over c increasing of T[c, r], from start
    (the caller's sum_start or -0).  T: [C, RB]; a new [RB] array, NaN not
    yet canonical (see lane_sum_into)."""
    acc = np.full(RB, start, np.float32)
    lane_sum_into(T, acc)
    return acc


@kernel
def lane_dot_into(A, B, i0, rows, c0, T, U, acc):
    """[red.sum.c1] acc[r] = add(acc[r], A[i0 + r, c] * B[i0 + r, c]) for the
    columns c0 <= c < c0 + w increasing (w = T.shape[0]; products flushed, the
    adds as in lane_sum_into): lane r's chain goes on along row i0 + r.  The
    chunks of A and B move into the tiles T and U by 8 x 8 transposes
    (load_chunk) and the products are formed in the lanes: written into the
    tile along each row instead, as a scatter of one element per store, the
    terms took over half of softmax_backward's time at V = 50,304."""
    load_chunk(A, i0, rows, c0, T)
    load_chunk(B, i0, rows, c0, U)
    for c in range(T.shape[0]):
        t, u = T[c], U[c]
        for r in range(RB):
            acc[r] = add_flush(acc[r], mul_flush(t[r], u[r]))


@kernel
def lane_sum_into(T, acc):
    """[red.sum.c1] acc[r] = add(acc[r], T[c, r]) for c increasing: each
    lane's chain goes on through the rows of T (one chunk of columns).

    The adds leave out the NaN test (``add_flush``): a chain may
    canonicalise once at its end ([num.nan.c1]), and every caller's next
    step with the sum is a rounded primitive (recip, log, mul, sub) that
    does.  This shortens each step of the chain, which is what a row sum
    waits on."""
    for c in range(T.shape[0]):
        t = T[c]
        for r in range(RB):
            acc[r] = add_flush(acc[r], t[r])
