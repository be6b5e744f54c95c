"""Host entry points of the fixed-order linear algebra (spec chapters 3-4), as ``refreplay.linalg``."""

from __future__ import annotations

import numpy as np
from numba import cuda

from .. import linalg as L
from ._common import THREADS, _array, _contracted, _dev, _output, blocks, device_aware, is_device


I8_MAX_K = 131071  # [mm.i8.c2]


def _matmul(kernel, what, A, B, IJ, ka, kb, out, accumulate):
    _contracted(what, ka, kb)
    C = _output(out, IJ, accumulate=accumulate)
    dC = C if is_device(C) else _dev(C) if accumulate else cuda.device_array(IJ, dtype=np.float32)
    if IJ[0] and IJ[1]:
        grid = (blocks(IJ[1], L.TILE), blocks(IJ[0], L.TILE))
        kernel[grid, (L.TILE, L.TILE)](_dev(A), _dev(B), dC, bool(accumulate))
        if dC is not C:
            dC.copy_to_host(C)
    return C


@device_aware
def matmul(A, B, out=None, accumulate=False):
    """[mm.nn.c1] C = A·B, A: I×K, B: K×J -> C: I×J; ``accumulate`` adds into ``out``."""
    A, B = _array("A", A, ndim=2), _array("B", B, ndim=2)
    return _matmul(L.mm_nn_k, "matmul", A, B, (A.shape[0], B.shape[1]), A.shape[1], B.shape[0], out, accumulate)


@device_aware
def matmul_nt(A, B, out=None, accumulate=False):
    """[mm.nt.c1] C = A·Bᵀ, A: I×K, B: J×K -> C: I×J."""
    A, B = _array("A", A, ndim=2), _array("B", B, ndim=2)
    return _matmul(L.mm_nt_k, "matmul_nt", A, B, (A.shape[0], B.shape[0]), A.shape[1], B.shape[1], out, accumulate)


@device_aware
def matmul_tn(A, B, out=None, accumulate=False):
    """[mm.tn.c1] C = Aᵀ·B, A: K×I, B: K×J -> C: I×J."""
    A, B = _array("A", A, ndim=2), _array("B", B, ndim=2)
    return _matmul(L.mm_tn_k, "matmul_tn", A, B, (A.shape[1], B.shape[1]), A.shape[0], B.shape[0], out, accumulate)


@device_aware
def bias_add(C, b, inplace=True):
    """[mm.bias.c1] C[i,j] + b[j] for C: I×J, b: J; in place (returns C) or into a new array."""
    _array("C", C, ndim=2), _array("b", b, ndim=1)
    if b.shape[0] != C.shape[1]:
        raise ValueError(f"bias_add: b has length {b.shape[0]}, C has {C.shape[1]} columns")
    if inplace and not (is_device(C) or (C.flags.c_contiguous and C.flags.writeable)):
        raise ValueError("C must be C-contiguous and writeable for an in-place bias_add")
    if inplace:
        target = C
    elif is_device(C):
        target = cuda.device_array(C.shape, np.float32)
        target.copy_to_device(C)
    else:
        target = np.ascontiguousarray(C).copy()
    if target.size:
        dC = _dev(target)
        L.bias_add_k[blocks(target.size), THREADS](dC, _dev(b))
        if dC is not target:
            dC.copy_to_host(target)
    return target


def _rows(kernel, X, n_out, out, accumulate=None):
    o = _output(out, (n_out,), accumulate=bool(accumulate))
    if n_out:
        d_out = o if is_device(o) else _dev(o) if accumulate else cuda.device_array(n_out, dtype=np.float32)
        args = (_dev(X), d_out) + ((bool(accumulate),) if accumulate is not None else ())
        kernel[blocks(n_out), THREADS](*args)
        if d_out is not o:
            d_out.copy_to_host(o)
    return o


@device_aware
def row_sum(X, out=None):
    """[red.rowsum.c1] X: I×N -> I, each row summed in increasing n."""
    X = _array("X", X, ndim=2)
    return _rows(L.row_sum_k, X, X.shape[0], out)


@device_aware
def col_sum(X, out=None, accumulate=False):
    """[red.colsum.c1] X: N×J -> J, each column summed in increasing row index."""
    X = _array("X", X, ndim=2)
    return _rows(L.col_sum_k, X, X.shape[1], out, accumulate)


@device_aware
def row_max(X, out=None):
    """[red.rowmax.c1] X: I×N -> I, fmax of each row from -inf."""
    X = _array("X", X, ndim=2)
    return _rows(L.row_max_k, X, X.shape[0], out)


@device_aware
def matmul_i8(A, B, out=None):
    """[mm.i8.c1] int8 A: I×K times int8 B: K×J -> exact int32 C: I×J; K <= 131071 ([mm.i8.c2])."""
    A, B = _array("A", A, np.int8, 2), _array("B", B, np.int8, 2)
    _contracted("matmul_i8", A.shape[1], B.shape[0])
    if A.shape[1] > I8_MAX_K:
        raise ValueError(f"matmul_i8: K = {A.shape[1]} exceeds {I8_MAX_K} ([mm.i8.c2])")
    I, J = A.shape[0], B.shape[1]
    C = _output(out, (I, J), np.int32)
    if I and J:
        dC = cuda.device_array((I, J), dtype=np.int32)
        grid = (blocks(J, L.TILE), blocks(I, L.TILE))
        L.mm_i8_k[grid, (L.TILE, L.TILE)](_dev(A), _dev(B), dC)
        if is_device(C):
            C.copy_to_device(dC)
        else:
            dC.copy_to_host(C)
    return C
