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

import numba
import numpy as np
from numba import prange

from .._jit import kernel, parallel_kernel
from .._tiles import lanes_add, lanes_key_min, lanes_mul, lanes_sub, prefetch, stack_keys, stack_lanes
from ..linalg.common import sum_start
from ..numerics._bits import f32_bits
from ..numerics.core import F32, ZERO, add, canon, flush, mul, recip, sqrt, sub
from ..numerics.elementwise import add_flush, mul_flush, sub_flush
from . import check_f32, check_scalar_f32, check_shape
from .rowblock import RB, lane_sum, load_block, n_blocks, new_block, prefetch_block

# Columns per parallel task in the dw/db sums: any width gives the same bits,
# each column's sum runs over rows n in increasing order inside one task
# (128: C = 768 splits evenly between 2 threads).  _AHEAD: rows fetched ahead.
_COLUMN_BLOCK = 128
_AHEAD = 8
_MAX_C = 1 << 24  # C converts to binary32 exactly up to 2**24


# ---- LayerNorm -------------------------------------------------------------
#
# Every pass over a block of RB rows leaves out the flushes that are proved
# identities for the block, as [mm.flush.r1] allows: the row sums (steps
# 1-4 of the forward, 1-2 of the backward, one row per lane) and the
# element-wise passes that follow (the forward's normalisation, the
# backward's dx).  [num.flush.c1] turns a subnormal result into a signed
# zero, and where no result of an operation can be subnormal the flush
# changes nothing (the pass then uses plain IEEE ``+``, ``-``, ``*``:
# rounded one at a time as before, never contracted).  The proof uses two
# facts, with E(v) the least e such that |v| >= 2^e over the values
# concerned (zeros, infinities and NaN never need a flush and are left out;
# a subnormal input counts as below every bound):
#   * a product a*b is >= 2^(E(a) + E(b)) in magnitude; if that sum is at
#     least -126 the product is normal (the power of two is a normal float
#     and rounding is monotone);
#   * a normal v is an integer multiple of 2^(E(v) - 23), and a sum or
#     difference of multiples of 2^g is a multiple of 2^g after rounding
#     too; if g >= -126, a nonzero such result is normal, >= 2^g.  Every
#     partial sum of a row sum whose terms lie on such a grid is one too.
# Each block bounds E of its inputs (x and dout: the least |value| over the
# tile; w, b: once per call; the statistics mean, rstd and the backward's
# means dm, dnm over the block's rows) and follows the bounds through the
# clause's steps (the conditions beside each call of an _ln_* function).
# Where all hold, the block takes the flush-free form, otherwise the
# flushed one: both give the same bits.  The flush-free row sums run as
# vectors of RB lanes (``_tiles``): each step of a chain then waits on one
# add, not on an add and its flush.  The first sums over a tile run
# flush-free and take the tile's bound in the same pass
# (_ln_means_exact, _ln_grad_exact); where the bound then fails, the block
# computes them again with every flush.  tests/test_fast_paths.py holds
# both forms to the one-row-at-a-time kernels at scales that take either,
# and a kernel that skips a bound fails there.

_E_NONE = 1 << 20  # the bound of an empty set: no value to bound
_MIN_NORMAL = -126  # 2^-126: the least normal binary32
_GRID = 23  # a normal v is a multiple of 2^(E(v) - 23)
_KEY_NONE = np.uint32(0xFFFFFFFF)


@kernel(inline="always")
def _fl(v, keep):
    """[num.flush.c1] where keep; otherwise the caller has proved it an identity."""
    return flush(v) if keep else v


@kernel(inline="always")
def _key(v):
    """|v|'s bits minus 1, as uint32: ordered as |v| for finite nonzero v,
    largest (never the minimum of a set that has one) for +-0, inf and NaN."""
    return np.uint32((f32_bits(v) & np.uint32(0x7FFFFFFF)) - np.uint32(1))  # 0 wraps round


@kernel(inline="always")
def _e_of_key(k):
    """E(v) (unbiased) of the v whose _key is the minimum k; _E_NONE for none."""
    if k >= np.uint32(0x7F7FFFFF):  # only zeros, infinities and NaN
        return _E_NONE
    return np.int64((k + np.uint32(1)) >> np.uint32(23)) - 127  # a subnormal: -127 (below any bound used)


@kernel
def _e_min(v):
    """E over the values of v [n] (zeros, infinities and NaN left out)."""
    k = _KEY_NONE
    for i in range(v.shape[0]):
        k = min(k, _key(v[i]))
    return _e_of_key(k)


@kernel(inline="always")
def _keys_e(k):
    """E over the values whose per-lane least _key are k [RB] (stack_keys)."""
    m = _KEY_NONE
    for r in range(RB):
        m = min(m, k[r])
    return _e_of_key(m)


@kernel(inline="always")
def _ln_means_exact(X, mean_b, rows, start, inv_C):
    """[norm.layer.fwd.c1] steps 1-2 on a tile X [C, RB] without step 1's
    flushes: mean_b[r] = the mean of lane r for r < rows, +0 beyond.
    Returns E over X: the result holds only if ex - _GRID >= _MIN_NORMAL
    (every x is then a multiple of 2^g with g >= -126, so is every partial
    sum, and a nonzero one is normal); otherwise the caller computes it
    again with _ln_means_flushed.  The lanes add as one vector
    (``_tiles.lanes_add``), each step waiting on one add alone; the bound
    is taken in the same pass over the tile.  The NaN test is left to step
    2's mul (rowblock.lane_sum_into)."""
    C = X.shape[0]
    s = stack_lanes(RB)  # lanes of its own: see _tiles (vectors and loops)
    k = stack_keys(RB)
    for r in range(RB):
        s[r] = start
        k[r] = _KEY_NONE
    for c in range(C):
        x_c = X[c]
        lanes_add(s, s, x_c, RB)
        lanes_key_min(k, x_c, RB)
    for r in range(RB):
        mean_b[r] = mul(s[r], inv_C) if r < rows else ZERO
    return _keys_e(k)


@kernel(inline="always")
def _ln_means_flushed(X, mean_b, rows, start, inv_C):
    """_ln_means_exact with every flush of step 1 (for a tile whose bound
    does not prove them identities)."""
    C = X.shape[0]
    s = stack_lanes(RB)
    for r in range(RB):
        s[r] = start
    for c in range(C):
        x_c = X[c]
        for r in range(RB):
            s[r] = add_flush(s[r], x_c[r])
    for r in range(RB):
        mean_b[r] = mul(s[r], inv_C) if r < rows else ZERO


@kernel(inline="always")
def _ln_dev_pass(X, mean_b, q_b, start, keep):
    """[norm.layer.fwd.c1] steps 3-4 on a tile X [C, RB], mean_b [RB] the
    lanes' means: q_b[r] = the sum of squared deviations of lane r (NaN not
    yet canonical).  Lanes of its own, as _ln_means_exact.  Without ``keep``,
    the caller has proved every flush an identity (d = x - mean is a
    multiple of 2^gd; d*d, when nonzero, is at least 2^(2 gd); it and the
    partial sums are multiples of 2^(2 gd); and 2 gd >= -126): the lanes
    then run as vectors."""
    C = X.shape[0]
    m = stack_lanes(RB)
    q = stack_lanes(RB)
    for r in range(RB):
        m[r] = mean_b[r]
        q[r] = start
    if keep:
        for c in range(C):
            x_c = X[c]
            for r in range(RB):
                d = sub_flush(x_c[r], m[r])  # step 3
                q[r] = add_flush(q[r], mul_flush(d, d))  # step 4
    else:
        d = stack_lanes(RB)
        for c in range(C):
            lanes_sub(d, X[c], m, RB)  # step 3
            lanes_mul(d, d, d, RB)
            lanes_add(q, q, d, RB)  # step 4
    for r in range(RB):
        q_b[r] = q[r]


@kernel(inline="always")
def _ln_normalise_rows(out, x, w, b, mean_b, rstd_b, i0, rows, keep):
    """[norm.layer.fwd.c1] steps 3, 7, 8 for rows i0 .. i0+rows-1."""
    C = x.shape[1]
    for r in range(rows):
        mean_n = mean_b[r]
        rstd_n = rstd_b[r]
        x_n = x[i0 + r]
        out_n = out[i0 + r]
        for c in range(C):  # one chain per element: canonicalised at its end ([num.nan.c1])
            norm_c = _fl(_fl(x_n[c] - mean_n, keep) * rstd_n, keep)  # steps 3, 7
            out_n[c] = canon(_fl(_fl(norm_c * w[c], keep) + b[c], keep))  # step 8


@parallel_kernel
def layernorm_forward_kernel(out, mean, rstd, x, w, b, eps):
    """[norm.layer.fwd.c1] out: [N, C], mean, rstd: [N] (all overwritten);
    x: [N, C]; w, b: [C]; eps: binary32.  Threads take blocks of RB rows;
    a block's sums s and q run side by side, one row per lane (rowblock.py),
    their accumulators in registers (stack_lanes); each block without the
    flushes its bounds prove identities (above)."""
    N, C = x.shape
    inv_C = recip(F32(C))  # [norm.meanop.c1] once for all rows
    start = sum_start(C)
    ew = _e_min(w)
    eb = _e_min(b)
    for blk in prange(n_blocks(N)):
        i0 = blk * RB
        rows = min(RB, N - i0)
        X = load_block(x, i0, rows)  # X[c, r] = x[i0 + r, c]
        prefetch_block(x, i0 + RB)  # the next block, while this one computes
        prefetch_block(out, i0 + RB)  # (its lines are written whole: fetched for the stores)
        mean_b = np.empty(RB, np.float32)
        ex = _ln_means_exact(X, mean_b, rows, start, inv_C)  # x lies on the grid 2^(ex - _GRID)
        if ex - _GRID < _MIN_NORMAL:  # a flush of step 1 may change a bit: the flushed sums
            _ln_means_flushed(X, mean_b, rows, start, inv_C)
        gd = min(ex, _e_min(mean_b)) - _GRID  # x - mean lies on the grid 2^gd (pad lanes: 0 - 0)
        q = np.empty(RB, np.float32)
        if gd + gd >= _MIN_NORMAL:
            _ln_dev_pass(X, mean_b, q, start, False)
        else:
            _ln_dev_pass(X, mean_b, q, start, True)
        rstd_b = np.empty(RB, np.float32)
        for r in range(RB):
            rstd_b[r] = recip(sqrt(add(mul(q[r], inv_C), eps))) if r < rows else ZERO  # steps 5, 6
        en = gd + _e_min(rstd_b)  # norm = d * rstd >= 2^en
        if gd >= _MIN_NORMAL and en >= _MIN_NORMAL and en + ew - _GRID >= _MIN_NORMAL and eb - _GRID >= _MIN_NORMAL:
            _ln_normalise_rows(out, x, w, b, mean_b, rstd_b, i0, rows, False)
        else:
            _ln_normalise_rows(out, x, w, b, mean_b, rstd_b, i0, rows, True)
        for r in range(rows):
            mean[i0 + r] = mean_b[r]
            rstd[i0 + r] = rstd_b[r]


@kernel(inline="always")
def _ln_grad_lanes(m, rs, a, g, mean_b, rstd_b, start):
    """The backward sums' lanes at their start: the statistics, and a and g
    at the sums' start value."""
    for r in range(RB):
        m[r] = mean_b[r]
        rs[r] = rstd_b[r]
        a[r] = start
        g[r] = start


@kernel(inline="always")
def _ln_grad_exact(X, D, w, mean_b, rstd_b, a_b, g_b, start):
    """[norm.layer.bwd.c1] steps 1-2 on tiles X, D [C, RB] without flushes,
    with mean_b, rstd_b [RB] the lanes' statistics: a_b[r] = the sum of
    dnorm, g_b[r] = the sum of dnorm*norm over lane r's row (NaN not yet
    canonical).  Returns (ex, ed), E over X and over D: the result holds
    only where the caller's conditions on them hold (otherwise it computes
    it again with _ln_grad_flushed).  The lanes run as vectors
    (``_tiles``), w[c] in every lane, and the bounds are taken in the same
    pass."""
    C = X.shape[0]
    m = stack_lanes(RB)  # lanes of their own: see _tiles (vectors and loops)
    rs = stack_lanes(RB)
    a = stack_lanes(RB)
    g = stack_lanes(RB)
    _ln_grad_lanes(m, rs, a, g, mean_b, rstd_b, start)
    kx = stack_keys(RB)
    kd = stack_keys(RB)
    for r in range(RB):
        kx[r] = _KEY_NONE
        kd[r] = _KEY_NONE
    norm = stack_lanes(RB)
    dnorm = stack_lanes(RB)
    for c in range(C):
        x_c = X[c]
        dout_c = D[c]
        lanes_sub(norm, x_c, m, RB)
        lanes_mul(norm, norm, rs, RB)  # forward: norm
        lanes_mul(dnorm, dout_c, w[c], RB)  # out = norm*w + b
        lanes_add(a, a, dnorm, RB)
        lanes_mul(norm, dnorm, norm, RB)  # dnorm*norm
        lanes_add(g, g, norm, RB)
        lanes_key_min(kx, x_c, RB)
        lanes_key_min(kd, dout_c, RB)
    for r in range(RB):
        a_b[r] = a[r]
        g_b[r] = g[r]
    return _keys_e(kx), _keys_e(kd)


@kernel(inline="always")
def _ln_grad_flushed(X, D, w, mean_b, rstd_b, a_b, g_b, start):
    """_ln_grad_exact with every flush (for tiles whose bounds do not prove
    them identities); returns nothing."""
    C = X.shape[0]
    m = stack_lanes(RB)
    rs = stack_lanes(RB)
    a = stack_lanes(RB)
    g = stack_lanes(RB)
    _ln_grad_lanes(m, rs, a, g, mean_b, rstd_b, start)
    for c in range(C):
        x_c = X[c]
        dout_c = D[c]
        w_c = w[c]
        for r in range(RB):
            norm = mul_flush(sub_flush(x_c[r], m[r]), rs[r])  # forward: norm
            dnorm = mul_flush(dout_c[r], w_c)  # out = norm*w + b
            a[r] = add_flush(a[r], dnorm)
            g[r] = add_flush(g[r], mul_flush(dnorm, norm))
    for r in range(RB):
        a_b[r] = a[r]
        g_b[r] = g[r]


@kernel(inline="always")
def _ln_dx_rows(dx, dout, x, w, mean, rstd, dm, dnm, i0, rows, dw, db, with_dwdb, keep):
    """[norm.layer.bwd.c1] steps 3-4 for rows i0 .. i0+rows-1, with dm, dnm
    [RB] the block's two means; with ``with_dwdb``, step 5's chains go on
    through these rows (NaN not yet canonical; flush-free when ``keep`` is
    False, which the caller then has proved for them too)."""
    C = x.shape[1]
    for r in range(rows):
        n = i0 + r
        x_n = x[n]
        dout_n = dout[n]
        dx_n = dx[n]
        mean_n = mean[n]
        rstd_n = rstd[n]
        dm_n = dm[r]
        dnm_n = dnm[r]
        for c in range(C):  # one chain per element: canonicalised at its end ([num.nan.c1])
            norm_c = _fl(_fl(x_n[c] - mean_n, keep) * rstd_n, keep)
            dnorm_c = _fl(dout_n[c] * w[c], keep)
            t = _fl(_fl(dnorm_c - dm_n, keep) - _fl(norm_c * dnm_n, keep), keep)
            dx_n[c] = canon(_fl(t * rstd_n, keep))
            if with_dwdb:
                dw[c] = _fl(dw[c] + _fl(dout_n[c] * norm_c, keep), keep)  # step 5
                db[c] = _fl(db[c] + dout_n[c], keep)


@kernel
def layernorm_backward_block(dx, dout, x, w, ew, mean, rstd, i0, rows, dw, db, with_dwdb):
    """[norm.layer.bwd.c1] steps 1-4 for rows i0 .. i0+rows-1 (rows <= RB):
    dx there (overwritten) from dout, x [N, C], w [C] (ew: its bound) and the
    saved mean, rstd [N].  The block's sums a and g run side by side
    (rowblock.py), their accumulators in registers (stack_lanes), without the
    flushes the block's bounds prove identities (above).  With
    ``with_dwdb``, step 5's chains dw[c] += dout[n, c]*norm[n, c] and db[c]
    += dout[n, c] go on through these rows, n increasing, as each row's dx is
    computed (the caller runs blocks in increasing order and canonicalises
    at the end)."""
    C = x.shape[1]
    inv_C = recip(F32(C))
    start = sum_start(C)
    X = load_block(x, i0, rows)
    D = load_block(dout, i0, rows)
    prefetch_block(x, i0 + RB)  # the next block, while this one computes
    prefetch_block(dout, i0 + RB)
    prefetch_block(dx, i0 + RB)
    mean_b = np.empty(RB, np.float32)
    rstd_b = np.empty(RB, np.float32)
    for r in range(RB):
        mean_b[r] = mean[i0 + r] if r < rows else ZERO
        rstd_b[r] = rstd[i0 + r] if r < rows else ZERO
    # the pad lanes hold +0 in X, D, mean_b and rstd_b: their d, norm, dnorm are 0 (or NaN, for an infinite w)
    a = np.empty(RB, np.float32)
    g = np.empty(RB, np.float32)
    ex, ed = _ln_grad_exact(X, D, w, mean_b, rstd_b, a, g, start)
    gd = min(ex, _e_min(mean_b)) - _GRID  # x - mean: on the grid 2^gd
    en = gd + _e_min(rstd_b)  # norm >= 2^en
    edn = ed + ew  # dnorm >= 2^edn, a multiple of 2^(edn - _GRID)
    # dnorm*norm >= 2^(edn + en), a multiple of 2^(edn + en - _GRID): so are the partial sums of a and g
    if not (gd >= _MIN_NORMAL and en >= _MIN_NORMAL and edn - _GRID >= _MIN_NORMAL and edn + en - _GRID >= _MIN_NORMAL):
        _ln_grad_flushed(X, D, w, mean_b, rstd_b, a, g, start)  # a flush may change a bit
    dm = np.empty(RB, np.float32)
    dnm = np.empty(RB, np.float32)
    for r in range(RB):
        dm[r] = mul(a[r], inv_C) if r < rows else ZERO
        dnm[r] = mul(g[r], inv_C) if r < rows else ZERO
    # t = (dnorm - dm) - norm*dnm lies on the grid 2^gt; dx = t * rstd
    gt = min(edn, _e_min(dm), en + _e_min(dnm)) - _GRID
    # step 5 over these rows: dout*norm >= 2^(ed + en); the chains dw and db
    # lie on the grids of their terms and of their values so far
    sums_exact = not with_dwdb or (
        ed + en >= _MIN_NORMAL
        and min(ed + en, _e_min(dw)) - _GRID >= _MIN_NORMAL
        and min(ed, _e_min(db)) - _GRID >= _MIN_NORMAL
    )
    if (
        gd >= _MIN_NORMAL
        and en >= _MIN_NORMAL
        and edn >= _MIN_NORMAL
        and gt >= _MIN_NORMAL
        and gt + _e_min(rstd_b) >= _MIN_NORMAL
        and sums_exact
    ):
        _ln_dx_rows(dx, dout, x, w, mean, rstd, dm, dnm, i0, rows, dw, db, with_dwdb, False)
    else:
        _ln_dx_rows(dx, dout, x, w, mean, rstd, dm, dnm, i0, rows, dw, db, with_dwdb, True)


@parallel_kernel
def layernorm_backward_dx_kernel(dx, dout, x, w, mean, rstd):
    """[norm.layer.bwd.c1] steps 1-4: dx [N, C] (overwritten).  Threads take
    blocks of RB rows (layernorm_backward_block)."""
    N = x.shape[0]
    ew = _e_min(w)
    no_sums = np.empty(0, np.float32)
    for blk in prange(n_blocks(N)):
        i0 = blk * RB
        layernorm_backward_block(dx, dout, x, w, ew, mean, rstd, i0, min(RB, N - i0), no_sums, no_sums, False)


@kernel
def layernorm_backward_one_pass_kernel(dx, dw, db, dout, x, w, mean, rstd):
    """[norm.layer.bwd.c1] all steps in one pass over x and dout, for one
    thread: the blocks of RB rows in increasing order, each block's rows
    adding to the dw/db chains as their dx is computed.  The same chains as
    layernorm_backward_dx_kernel + layernorm_backward_dwdb_kernel, without
    reading x and dout a second time (at [1024 x 768] the second read, from
    memory, cost as much as the rest of the backward)."""
    N = x.shape[0]
    ew = _e_min(w)
    start = sum_start(N)
    dw[:] = start
    db[:] = start
    for blk in range(n_blocks(N)):
        i0 = blk * RB
        layernorm_backward_block(dx, dout, x, w, ew, mean, rstd, i0, min(RB, N - i0), dw, db, True)
    for c in range(dw.shape[0]):  # each column's chain canonicalised once, at its end
        dw[c] = canon(dw[c])
        db[c] = canon(db[c])


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
            if n + _AHEAD < N:  # rows a column block walks are strided: fetch ahead (a hint only)
                for j in range(c0, c1, 16):
                    prefetch(x, n + _AHEAD, j)
                    prefetch(dout, n + _AHEAD, j)
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
    for name, a, shape in (("dout", dout, (N, C)), ("w", w, (C,)), ("mean", mean, (N,)), ("rstd", rstd, (N,))):
        check_f32(name, a, len(shape))
        check_shape(name, a, shape)
    dx = np.empty((N, C), dtype=np.float32)
    dw = np.empty(C, dtype=np.float32)
    db = np.empty(C, dtype=np.float32)
    if numba.get_num_threads() == 1:
        layernorm_backward_one_pass_kernel(dx, dw, db, dout, x, w, mean, rstd)
    else:
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
