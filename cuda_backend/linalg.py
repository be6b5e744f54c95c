"""Fixed-order linear algebra on the device: fp32 matmul (A·B, A·Bᵀ, Aᵀ·B),
bias add, row/column sums, row max, exact int8 matmul.  Spec chapters
``03-reductions`` and ``04-matmul``; mirrors ``refreplay.linalg``.

fp32 matmul gives every output C[i, j] its own thread, which runs the sum of
[mm.nn.c1] over k = 0, 1, ..., K-1 in its own register: -0, then one rounded
and flushed product and one rounded and flushed add per k.  Threads of a
TILE x TILE block stage tiles of A and B in shared memory as the k loop
advances ([mm.order.r1]: tiling moves data, never reorders a sum).  Launch:
block (TILE, TILE), grid (blocks(J, TILE), blocks(I, TILE)); thread x runs
over j, thread y over i.

Reductions give each output one thread running the sequential loop of
[red.sum.c1] / [red.rowmax.c1]: grid ``blocks(outputs)`` x ``THREADS``.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from . import shim
from ._jit import device, kernel

TILE = 16
TILE_PAD = TILE + 1  # a padded row: column reads of a tile hit distinct shared-memory banks
NEG_ZERO = np.float32(-0.0)  # 0x80000000
NEG_INF = np.float32(-np.inf)  # 0xFF800000, the starting value of a max
ZERO = shim.ZERO

_MM = "void(float32[:, ::1], float32[:, ::1], float32[:, ::1], boolean)"


@device
def sum_start(n):
    """[red.sum.c1] A sum of n terms starts from -0; the empty sum is +0."""
    return NEG_ZERO if n > 0 else ZERO


@device
def _store(C, i, j, s, accumulate):
    """[mm.accumulate.c1] Overwrite C[i, j], or add the finished sum to it."""
    C[i, j] = shim.add(C[i, j], s) if accumulate else s


@kernel(_MM)
def mm_nn_k(A, B, C, accumulate):
    """[mm.nn.c1] C = A·B.  A: I×K, B: K×J, C: I×J; overwritten, or added to
    with ``accumulate`` ([mm.accumulate.c1])."""
    sA = cuda.shared.array((TILE, TILE_PAD), np.float32)  # sA[y, kk] = A[i0 + y, k0 + kk]
    sB = cuda.shared.array((TILE, TILE_PAD), np.float32)  # sB[kk, x] = B[k0 + kk, j0 + x]
    ty = cuda.threadIdx.y
    tx = cuda.threadIdx.x
    i = cuda.blockIdx.y * TILE + ty
    j = cuda.blockIdx.x * TILE + tx
    I, K = A.shape
    J = B.shape[1]
    s = sum_start(K)
    for k0 in range(0, K, TILE):
        sA[ty, tx] = A[i, k0 + tx] if i < I and k0 + tx < K else ZERO
        sB[ty, tx] = B[k0 + ty, j] if k0 + ty < K and j < J else ZERO
        cuda.syncthreads()
        for kk in range(min(TILE, K - k0)):
            s = shim.add(s, shim.mul(sA[ty, kk], sB[kk, tx]))
        cuda.syncthreads()
    if i < I and j < J:
        _store(C, i, j, s, accumulate)


@kernel(_MM)
def mm_nt_k(A, B, C, accumulate):
    """[mm.nt.c1] C = A·Bᵀ.  A: I×K, B: J×K, C: I×J; overwritten or accumulated."""
    sA = cuda.shared.array((TILE, TILE_PAD), np.float32)  # sA[y, kk] = A[i0 + y, k0 + kk]
    sB = cuda.shared.array((TILE, TILE_PAD), np.float32)  # sB[x, kk] = B[j0 + x, k0 + kk]
    ty = cuda.threadIdx.y
    tx = cuda.threadIdx.x
    i0 = cuda.blockIdx.y * TILE
    j0 = cuda.blockIdx.x * TILE
    i = i0 + ty
    j = j0 + tx
    I, K = A.shape
    J = B.shape[0]
    s = sum_start(K)
    for k0 in range(0, K, TILE):
        sA[ty, tx] = A[i, k0 + tx] if i < I and k0 + tx < K else ZERO
        sB[ty, tx] = B[j0 + ty, k0 + tx] if j0 + ty < J and k0 + tx < K else ZERO
        cuda.syncthreads()
        for kk in range(min(TILE, K - k0)):
            s = shim.add(s, shim.mul(sA[ty, kk], sB[tx, kk]))
        cuda.syncthreads()
    if i < I and j < J:
        _store(C, i, j, s, accumulate)


@kernel(_MM)
def mm_tn_k(A, B, C, accumulate):
    """[mm.tn.c1] C = Aᵀ·B.  A: K×I, B: K×J, C: I×J; overwritten or accumulated."""
    sA = cuda.shared.array((TILE, TILE_PAD), np.float32)  # sA[kk, y] = A[k0 + kk, i0 + y]
    sB = cuda.shared.array((TILE, TILE_PAD), np.float32)  # sB[kk, x] = B[k0 + kk, j0 + x]
    ty = cuda.threadIdx.y
    tx = cuda.threadIdx.x
    i0 = cuda.blockIdx.y * TILE
    i = i0 + ty
    j = cuda.blockIdx.x * TILE + tx
    K, I = A.shape
    J = B.shape[1]
    s = sum_start(K)
    for k0 in range(0, K, TILE):
        sA[ty, tx] = A[k0 + ty, i0 + tx] if k0 + ty < K and i0 + tx < I else ZERO
        sB[ty, tx] = B[k0 + ty, j] if k0 + ty < K and j < J else ZERO
        cuda.syncthreads()
        for kk in range(min(TILE, K - k0)):
            s = shim.add(s, shim.mul(sA[kk, ty], sB[kk, tx]))
        cuda.syncthreads()
    if i < I and j < J:
        _store(C, i, j, s, accumulate)


@kernel("void(float32[:, ::1], float32[::1])")
def bias_add_k(C, b):
    """[mm.bias.c1] C[i, j] = add(C[i, j], b[j]) in place.  C: I×J, b: J.
    Grid ``blocks(I*J)``: one thread per element."""
    t = cuda.grid(1)
    I, J = C.shape
    if t < I * J:
        i = t // J
        j = t - i * J
        C[i, j] = shim.add(C[i, j], b[j])


@kernel("void(float32[:, ::1], float32[::1])")
def row_sum_k(X, out):
    """[red.rowsum.c1] out[i] = sum over n of X[i, n], n increasing.  X: I×N, out: I (overwritten)."""
    i = cuda.grid(1)
    I, N = X.shape
    if i < I:
        s = sum_start(N)
        for n in range(N):
            s = shim.add(s, X[i, n])
        out[i] = s


@kernel("void(float32[:, ::1], float32[::1], boolean)")
def col_sum_k(X, out, accumulate):
    """[red.colsum.c1] out[j] = sum over n of X[n, j], n increasing.  X: N×J, out: J;
    overwritten, or out[j] = add(out[j], sum) with ``accumulate``."""
    j = cuda.grid(1)
    N, J = X.shape
    if j < J:
        s = sum_start(N)
        for n in range(N):
            s = shim.add(s, X[n, j])
        out[j] = shim.add(out[j], s) if accumulate else s


@kernel("void(float32[:, ::1], float32[::1])")
def row_max_k(X, out):
    """[red.rowmax.c1] out[i] = fmax over n of X[i, n], from -inf.  X: I×N, out: I (overwritten)."""
    i = cuda.grid(1)
    I, N = X.shape
    if i < I:
        m = NEG_INF
        for n in range(N):
            m = shim.fmax(m, X[i, n])
        out[i] = m


@kernel("void(int8[:, ::1], int8[:, ::1], int32[:, ::1])")
def mm_i8_k(A, B, C):
    """[mm.i8.c1] C = A·B exactly in int32.  A: I×K int8, B: K×J int8, C: I×J
    int32, overwritten.  K <= 131071 ([mm.i8.c2], checked by the caller).
    Block (TILE, TILE), grid as the fp32 matmul; any order is exact."""
    i = cuda.blockIdx.y * TILE + cuda.threadIdx.y
    j = cuda.blockIdx.x * TILE + cuda.threadIdx.x
    I, K = A.shape
    J = B.shape[1]
    if i < I and j < J:
        s = np.int32(0)
        for k in range(K):
            s += np.int32(A[i, k]) * np.int32(B[k, j])
        C[i, j] = s
