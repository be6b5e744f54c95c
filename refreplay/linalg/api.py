"""Python API of the fixed-order linear algebra: validate, allocate, dispatch.

Arithmetic lives in the compiled kernels (``mm_fp32.py``, ``reduce.py``,
``mm_int8.py``); this module only checks dtypes, ranks, contiguity and shapes,
so that a caller sees a clear ``TypeError``/``ValueError`` instead of a Numba
typing traceback.
"""

from __future__ import annotations

import numba
import numpy as np

from .. import _scratch

from . import mm_fp32 as _mm
from . import reduce as _red
from .blocking import Blocks, machine_blocks
from .mm_int8 import I8_MAX_K, mm_i8


def _matrix(name, x, dtype=np.float32, ndim=2):
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, got {type(x).__name__}")
    if x.dtype != dtype:
        raise TypeError(f"{name} must have dtype {np.dtype(dtype).name}, got {x.dtype}")
    if x.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {x.shape}")
    if not x.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous (use np.ascontiguousarray)")
    return x


def _output(out, shape, inputs, dtype=np.float32, accumulate=False):
    if out is None:
        if accumulate:
            raise ValueError("accumulate=True needs out= (the array to accumulate into)")
        return np.empty(shape, dtype=dtype)
    _matrix("out", out, dtype, len(shape))
    if out.shape != shape:
        raise ValueError(f"out must have shape {shape}, got {out.shape}")
    if not out.flags.writeable:
        raise ValueError("out must be writeable")
    if any(np.may_share_memory(out, x) for x in inputs):
        raise ValueError("out must not overlap an input (the kernels read inputs while writing out)")
    return out


def _blocks(blocks):
    """The block sizes to run with: the machine's (``blocking.py``) unless given."""
    if blocks is None:
        return machine_blocks().args()
    if not isinstance(blocks, Blocks):
        raise TypeError(f"blocks must be a refreplay.linalg.blocking.Blocks, got {type(blocks).__name__}")
    if min(blocks.args()) < 1:
        raise ValueError(f"blocks must be positive, got {blocks}")
    return blocks.args()


def release_scratch():
    """Free the scratch arrays this thread keeps between calls (the
    matmul's packs, attention's rows: ``refreplay/_scratch.py``)."""
    _scratch.release()


def _run(kernel, A, B, C, accumulate, blocks, K):
    b = _blocks(blocks)
    # the packs come from this thread's scratch, reused from call to call (refreplay/_scratch.py):
    # allocated afresh, 256 page faults made a 384^3 product run at 0.43 of the peak, not 0.82
    scratch = _scratch.get("matmul", int(_mm.scratch_floats(C.shape[0], C.shape[1], K, *b)))
    kernel(A, B, C, bool(accumulate), *b, numba.get_num_threads(), scratch)


def _contracted(what, ka, kb):
    if ka != kb:
        raise ValueError(f"{what}: contracted lengths differ (K = {ka} vs {kb})")


def matmul(A, B, out=None, accumulate=False, blocks=None):
    """[mm.nn.c1] C = A·B, A: I×K, B: K×J -> C: I×J (float32).

    With ``out`` the result is written there; with ``accumulate=True`` it is
    added to ``out`` ([mm.accumulate.c1]).  Returns the output array.
    ``blocks`` (a ``blocking.Blocks``) overrides the block sizes derived from
    this machine's caches; no bit depends on them.
    """
    _matrix("A", A), _matrix("B", B)
    _contracted("matmul", A.shape[1], B.shape[0])
    C = _output(out, (A.shape[0], B.shape[1]), (A, B), accumulate=accumulate)
    _run(_mm.mm_nn, A, B, C, accumulate, blocks, A.shape[1])
    return C


def matmul_nt(A, B, out=None, accumulate=False, blocks=None):
    """[mm.nt.c1] C = A·Bᵀ, A: I×K, B: J×K -> C: I×J (float32)."""
    _matrix("A", A), _matrix("B", B)
    _contracted("matmul_nt", A.shape[1], B.shape[1])
    C = _output(out, (A.shape[0], B.shape[0]), (A, B), accumulate=accumulate)
    _run(_mm.mm_nt, A, B, C, accumulate, blocks, A.shape[1])
    return C


def matmul_tn(A, B, out=None, accumulate=False, blocks=None):
    """[mm.tn.c1] C = Aᵀ·B, A: K×I, B: K×J -> C: I×J (float32)."""
    _matrix("A", A), _matrix("B", B)
    _contracted("matmul_tn", A.shape[0], B.shape[0])
    C = _output(out, (A.shape[1], B.shape[1]), (A, B), accumulate=accumulate)
    _run(_mm.mm_tn, A, B, C, accumulate, blocks, A.shape[0])
    return C


def bias_add(C, b, inplace=True):
    """[mm.bias.c1] C[i,j] + b[j] for C: I×J, b: J.  In place (returns C) or,
    with ``inplace=False``, into a new array."""
    _matrix("C", C), _matrix("b", b, ndim=1)
    if b.shape[0] != C.shape[1]:
        raise ValueError(f"bias_add: b has length {b.shape[0]}, C has {C.shape[1]} columns")
    if inplace and not C.flags.writeable:
        raise ValueError("C must be writeable for an in-place bias_add")
    target = C if inplace else C.copy()
    _mm.bias_add_k(target, b)
    return target


def row_sum(X, out=None):
    """[red.rowsum.c1] X: I×N -> I, each row summed in increasing n."""
    _matrix("X", X)
    o = _output(out, (X.shape[0],), (X,))
    _red.row_sum_k(X, o)
    return o


def col_sum(X, out=None, accumulate=False):
    """[red.colsum.c1] X: N×J -> J, each column summed in increasing row index
    (the bias-gradient reduction); ``accumulate=True`` adds into ``out``."""
    _matrix("X", X)
    o = _output(out, (X.shape[1],), (X,), accumulate=accumulate)
    _red.col_sum_k(X, o, bool(accumulate))
    return o


def row_max(X, out=None):
    """[red.rowmax.c1] X: I×N -> I, fmax of each row (NaN propagates, +0 beats -0)."""
    _matrix("X", X)
    o = _output(out, (X.shape[0],), (X,))
    _red.row_max_k(X, o)
    return o


def matmul_i8(A, B, out=None):
    """[mm.i8.c1] int8 A: I×K times int8 B: K×J -> exact int32 C: I×J.

    Refuses K > 131071 ([mm.i8.c2]): beyond it an int32 sum can overflow.
    """
    _matrix("A", A, np.int8), _matrix("B", B, np.int8)
    _contracted("matmul_i8", A.shape[1], B.shape[0])
    if A.shape[1] > I8_MAX_K:
        raise ValueError(
            f"matmul_i8: K = {A.shape[1]} exceeds {I8_MAX_K}; an int32 sum of "
            f"K products of magnitude up to 2**14 could overflow ([mm.i8.c2])"
        )
    C = _output(out, (A.shape[0], B.shape[1]), (A, B), np.int32)
    mm_i8(A, B, C)
    return C
