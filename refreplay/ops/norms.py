"""LayerNorm and RMSNorm over the channel axis, forward and backward
([norm.layer.fwd.c1], [norm.layer.bwd.c1], [norm.rms.fwd.c1],
[norm.rms.bwd.c1]).

Shapes: x, out, dout, dx [N, C] (N = B*T rows, normalised independently);
w, b, dw, db [C]; the saved statistics mean, rstd [N] (LayerNorm) and
rrms [N] (RMSNorm).  Every sum is sequential in increasing index from the
start value of [red.sum.c1]; 1/C is recip(C) computed once ([norm.meanop.c1]).
The backward recomputes the normalised value norm[n, c] from x and the saved
statistics with the forward's own operations, so it has the forward's bits.
Threads take blocks of RB rows whose per-row sums advance side by side in
SIMD lanes, each in its own row's order (``rowblock.py``); the dw/db sums
over rows put columns in the lanes.
"""
from __future__ import annotations

import numpy as np
from numba import prange

from .._jit import parallel_kernel
from ..linalg.common import sum_start
from ..numerics.core import F32, add, canon, mul, recip, sqrt, sub
from ..numerics.elementwise import add_flush, mul_flush, sub_flush
from . import check_f32, check_scalar_f32, check_shape
from .rowblock import RB, lane_sum, lane_vector, load_block, n_blocks, new_block

# Columns per parallel task in the dw/db sums: any width gives the same bits,
# each column's sum runs over rows n in increasing order inside one task.
_COLUMN_BLOCK = 256
_MAX_C = 1 << 24  # C converts to binary32 exactly up to 2**24


# ---- LayerNorm -------------------------------------------------------------


@parallel_kernel
def layernorm_forward_kernel(out, mean, rstd, x, w, b, eps):
    """[norm.layer.fwd.c1] out: [N, C], mean, rstd: [N] (all overwritten);
    x: [N, C]; w, b: [C]; eps: binary32.  Threads take blocks of RB rows;
    a block's sums s and q run side by side, one row per lane (rowblock.py)."""
    N, C = x.shape
    inv_C = recip(F32(C))  # [norm.meanop.c1] once for all rows
    start = sum_start(C)
    for blk in prange(n_blocks(N)):
        i0 = blk * RB
        rows = min(RB, N - i0)
        X = load_block(x, i0, rows)  # X[c, r] = x[i0 + r, c]
        mean_b = lane_sum(X, start)  # step 1: s
        for r in range(RB):
            mean_b[r] = mul(mean_b[r], inv_C)  # step 2
        q = np.full(RB, start, np.float32)
        for c in range(C):  # NaN test left to mul(q, inv_C) below (rowblock.lane_sum_into)
            x_c = X[c]
            for r in range(RB):
                d = sub_flush(x_c[r], mean_b[r])  # step 3
                q[r] = add_flush(q[r], mul_flush(d, d))  # step 4
        for r in range(rows):
            n = i0 + r
            mean_n = mean_b[r]
            rstd_n = recip(sqrt(add(mul(q[r], inv_C), eps)))  # steps 5, 6
            x_n = x[n]
            out_n = out[n]
            for c in range(C):  # one chain per element: canonicalised at its end ([num.nan.c1])
                norm_c = mul_flush(sub_flush(x_n[c], mean_n), rstd_n)  # steps 3, 7
                out_n[c] = canon(add_flush(mul_flush(norm_c, w[c]), b[c]))  # step 8
            mean[n] = mean_n
            rstd[n] = rstd_n


@parallel_kernel
def layernorm_backward_dx_kernel(dx, dout, x, w, mean, rstd):
    """[norm.layer.bwd.c1] steps 1-4: dx [N, C] (overwritten) from dout, x
    [N, C], w [C] and the saved mean, rstd [N].  Threads take blocks of RB
    rows; a block's sums a and g run side by side (rowblock.py)."""
    N, C = x.shape
    inv_C = recip(F32(C))
    start = sum_start(C)
    for blk in prange(n_blocks(N)):
        i0 = blk * RB
        rows = min(RB, N - i0)
        X = load_block(x, i0, rows)
        D = load_block(dout, i0, rows)
        mean_b = lane_vector(mean, i0, rows)
        rstd_b = lane_vector(rstd, i0, rows)
        s_dnorm = np.full(RB, start, np.float32)
        s_dnorm_norm = np.full(RB, start, np.float32)
        for c in range(C):  # NaN test left to the mul(., inv_C) below (rowblock.lane_sum_into)
            x_c = X[c]
            dout_c = D[c]
            w_c = w[c]
            for r in range(RB):
                norm = mul_flush(sub_flush(x_c[r], mean_b[r]), rstd_b[r])  # forward: norm
                dnorm = mul_flush(dout_c[r], w_c)  # out = norm*w + b
                s_dnorm[r] = add_flush(s_dnorm[r], dnorm)
                s_dnorm_norm[r] = add_flush(s_dnorm_norm[r], mul_flush(dnorm, norm))
        for r in range(rows):
            n = i0 + r
            x_n = x[n]
            dout_n = dout[n]
            dx_n = dx[n]
            mean_n = mean_b[r]
            rstd_n = rstd_b[r]
            dnorm_mean = mul(s_dnorm[r], inv_C)
            dnorm_norm_mean = mul(s_dnorm_norm[r], inv_C)
            for c in range(C):  # one chain per element: canonicalised at its end ([num.nan.c1])
                norm_c = mul_flush(sub_flush(x_n[c], mean_n), rstd_n)
                dnorm_c = mul_flush(dout_n[c], w[c])
                t = sub_flush(sub_flush(dnorm_c, dnorm_mean), mul_flush(norm_c, dnorm_norm_mean))
                dx_n[c] = canon(mul_flush(t, rstd_n))


@parallel_kernel
def layernorm_backward_dwdb_kernel(dw, db, dout, x, mean, rstd):
    """[norm.layer.bwd.c1] step 5: dw[c] = sum over n of dout[n,c]*norm[n,c],
    db[c] = sum over n of dout[n,c], n increasing.  dw, db: [C] (overwritten).
    Parallel over blocks of columns; rows are walked in order inside a block."""
    N, C = x.shape
    start = sum_start(N)
    n_blocks = (C + _COLUMN_BLOCK - 1) // _COLUMN_BLOCK
    for blk in prange(n_blocks):
        c0 = blk * _COLUMN_BLOCK
        c1 = min(c0 + _COLUMN_BLOCK, C)
        dw_blk = dw[c0:c1]
        db_blk = db[c0:c1]
        dw_blk[:] = start
        db_blk[:] = start
        for n in range(N):
            x_n = x[n, c0:c1]
            dout_n = dout[n, c0:c1]
            mean_n = mean[n]
            rstd_n = rstd[n]
            for j in range(dw_blk.shape[0]):  # NaN test left to the canon below ([num.nan.c1])
                norm = mul_flush(sub_flush(x_n[j], mean_n), rstd_n)
                dw_blk[j] = add_flush(dw_blk[j], mul_flush(dout_n[j], norm))
                db_blk[j] = add_flush(db_blk[j], dout_n[j])
        for j in range(dw_blk.shape[0]):  # each column's chain canonicalised once, at its end
            dw_blk[j] = canon(dw_blk[j])
            db_blk[j] = canon(db_blk[j])


# ---- RMSNorm ---------------------------------------------------------------


@parallel_kernel
def rmsnorm_forward_kernel(out, rrms, x, w, eps):
    """[norm.rms.fwd.c1] out: [N, C], rrms: [N] (overwritten); x: [N, C];
    w: [C]; eps: binary32.  Threads take blocks of RB rows; a block's sums q
    run side by side (rowblock.py)."""
    N, C = x.shape
    inv_C = recip(F32(C))
    start = sum_start(C)
    for blk in prange(n_blocks(N)):
        i0 = blk * RB
        rows = min(RB, N - i0)
        SQ = new_block(C)  # SQ[c, r] = x[i0 + r, c]^2
        for r in range(rows):
            x_n = x[i0 + r]
            for c in range(C):
                SQ[c, r] = mul(x_n[c], x_n[c])
        q = lane_sum(SQ, start)  # step 1
        for r in range(rows):
            n = i0 + r
            rrms_n = recip(sqrt(add(mul(q[r], inv_C), eps)))  # steps 2, 3
            x_n = x[n]
            out_n = out[n]
            for c in range(C):
                out_n[c] = mul(mul(x_n[c], rrms_n), w[c])  # steps 4, 5
            rrms[n] = rrms_n


@parallel_kernel
def rmsnorm_backward_dx_kernel(dx, dout, x, w, rrms):
    """[norm.rms.bwd.c1] steps 1-4: dx [N, C] (overwritten).  Threads take
    blocks of RB rows; a block's sums g run side by side (rowblock.py)."""
    N, C = x.shape
    inv_C = recip(F32(C))
    start = sum_start(C)
    for blk in prange(n_blocks(N)):
        i0 = blk * RB
        rows = min(RB, N - i0)
        DNN = new_block(C)  # DNN[c, r] = dnorm * norm of row i0 + r
        for r in range(rows):
            n = i0 + r
            x_n = x[n]
            dout_n = dout[n]
            rrms_n = rrms[n]
            for c in range(C):
                norm_c = mul(x_n[c], rrms_n)  # forward: norm
                dnorm_c = mul(dout_n[c], w[c])  # out = norm*w
                DNN[c, r] = mul(dnorm_c, norm_c)
        g = lane_sum(DNN, start)
        for r in range(rows):
            n = i0 + r
            x_n = x[n]
            dout_n = dout[n]
            dx_n = dx[n]
            rrms_n = rrms[n]
            dnorm_norm_mean = mul(g[r], inv_C)
            for c in range(C):
                norm_c = mul(x_n[c], rrms_n)
                dnorm_c = mul(dout_n[c], w[c])
                dx_n[c] = mul(sub(dnorm_c, mul(norm_c, dnorm_norm_mean)), rrms_n)


@parallel_kernel
def rmsnorm_backward_dw_kernel(dw, dout, x, rrms):
    """[norm.rms.bwd.c1] step 4: dw[c] = sum over n of dout[n,c]*norm[n,c],
    n increasing.  dw: [C] (overwritten).  Parallel over blocks of columns."""
    N, C = x.shape
    start = sum_start(N)
    n_blocks = (C + _COLUMN_BLOCK - 1) // _COLUMN_BLOCK
    for blk in prange(n_blocks):
        c0 = blk * _COLUMN_BLOCK
        c1 = min(c0 + _COLUMN_BLOCK, C)
        dw_blk = dw[c0:c1]
        dw_blk[:] = start
        for n in range(N):
            x_n = x[n, c0:c1]
            dout_n = dout[n, c0:c1]
            rrms_n = rrms[n]
            for j in range(dw_blk.shape[0]):
                dw_blk[j] = add(dw_blk[j], mul(dout_n[j], mul(x_n[j], rrms_n)))


# ---- Python API: validation and allocation ----------------------------------


def _check_rows(x, name="x"):
    check_f32(name, x, 2)
    N, C = x.shape
    if C < 1 or C > _MAX_C:
        raise ValueError(f"{name} must have 1 <= C <= 2**24 channels, got {C}")
    return N, C


def layernorm_forward(x, w, b, eps=np.float32(1e-5)):
    """[norm.layer.fwd.c1] x [N, C], w [C], b [C] -> (out [N, C], mean [N],
    rstd [N]), all new.  eps is a binary32 (default f32(0x3727C5AC) ~ 1e-5)."""
    N, C = _check_rows(x)
    check_f32("w", w, 1)
    check_shape("w", w, (C,))
    check_f32("b", b, 1)
    check_shape("b", b, (C,))
    eps = check_scalar_f32("eps", eps)
    out = np.empty((N, C), dtype=np.float32)
    mean = np.empty(N, dtype=np.float32)
    rstd = np.empty(N, dtype=np.float32)
    layernorm_forward_kernel(out, mean, rstd, x, w, b, eps)
    return out, mean, rstd


def layernorm_backward(dout, x, w, mean, rstd):
    """[norm.layer.bwd.c1] -> (dx [N, C], dw [C], db [C]), all new."""
    N, C = _check_rows(x)
    for name, a, shape in (("dout", dout, (N, C)), ("w", w, (C,)),
                           ("mean", mean, (N,)), ("rstd", rstd, (N,))):
        check_f32(name, a, len(shape))
        check_shape(name, a, shape)
    dx = np.empty((N, C), dtype=np.float32)
    dw = np.empty(C, dtype=np.float32)
    db = np.empty(C, dtype=np.float32)
    layernorm_backward_dx_kernel(dx, dout, x, w, mean, rstd)
    layernorm_backward_dwdb_kernel(dw, db, dout, x, mean, rstd)
    return dx, dw, db


def rmsnorm_forward(x, w, eps=np.float32(1e-5)):
    """[norm.rms.fwd.c1] x [N, C], w [C] -> (out [N, C], rrms [N]), new."""
    N, C = _check_rows(x)
    check_f32("w", w, 1)
    check_shape("w", w, (C,))
    eps = check_scalar_f32("eps", eps)
    out = np.empty((N, C), dtype=np.float32)
    rrms = np.empty(N, dtype=np.float32)
    rmsnorm_forward_kernel(out, rrms, x, w, eps)
    return out, rrms


def rmsnorm_backward(dout, x, w, rrms):
    """[norm.rms.bwd.c1] -> (dx [N, C], dw [C]), both new."""
    N, C = _check_rows(x)
    for name, a, shape in (("dout", dout, (N, C)), ("w", w, (C,)), ("rrms", rrms, (N,))):
        check_f32(name, a, len(shape))
        check_shape(name, a, shape)
    dx = np.empty((N, C), dtype=np.float32)
    dw = np.empty(C, dtype=np.float32)
    rmsnorm_backward_dx_kernel(dx, dout, x, w, rrms)
    rmsnorm_backward_dw_kernel(dw, dout, x, rrms)
    return dx, dw
