"""Causal multi-head self-attention (``spec/13-ops-attention.txt``).

Shapes (spec letters): q, k, v, out [B, NH, T, HS]; att [B, NH, T, T].
Row t of a head attends to positions s = 0 .. t.  Positions s > t take part
in no arithmetic that reaches an output (they are not masked by adding
-inf), so a NaN or inf in the future cannot leak into the past
([attn.mask.c1]).

Each (b, h) pair is computed by one part of a ``prange`` (the parts claim
pairs one at a time) with its own sequential loops, so a sequence's bits
depend only on that sequence ([attn.batch.c1]).

The six products of a head (q·kᵀ, att·v forward; dout·vᵀ, dz·k, dzᵀ·q,
attᵀ·dout backward) run through the matmul's register tiles
(``linalg.mm_fp32``: ``pack_a``, ``pack_b_panel``, ``tile_proved``), MR
query (or key) rows by NR columns at a time.  Every output is still the
spec's single chain: same terms, same increasing order, from -0; only
independent outputs share a tile.  The causal triangle is handled thus:

* Scores: a tile of rows t0 .. t0+MR-1 computes whole NR-wide panels of
  keys, so lanes with s > t are computed and discarded: they are never
  stored and enter no chain.
* att·v and dz·k (sums over s = 0 .. t): the tile runs s = 0 .. t0, common
  to all its rows; row t0+r then adds its ragged tail s = t0+1 .. t0+r.
* dzᵀ·q and attᵀ·dout (sums over t = s .. T-1): row s0+r first adds its
  ragged head t = s0+r .. s0+MR-2 from -0, then the tile takes the common
  range t = s0+MR-1 .. T-1, starting from those partial sums.
Masked positions are never added as zero terms.  Flushes are skipped only
where [mm.flush.r1] proves them identities, with exponent bounds over each
output's whole chain.  The softmax of each row and its backward keep
softmax_row's steps; the sums of RB rows run side by side in SIMD lanes
(``softmax.softmax_rows_causal``).  The backward keeps the dz of a whole
head (T² floats per running head) because dk's chains need every row of it,
and copies att's rows beside it while they are in cache (T² more).  The key
sums read both down their columns in place (``tile_strided_proved``: MR
floats from each row), with rows padded to an odd count of cache lines
(``row_stride``): att's own rows, 4 KiB apart at T = 1024, fall in one
cache set, and packing its columns from them per block of keys took 0.18
of the backward.
``tests/test_attention_tiles.py`` holds the row-at-a-time kernels these
replaced and checks the bits against them.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

from .. import _scratch
from .._jit import kernel, parallel_kernel
from .._tiles import claim
from ..linalg._tile import MR, NR
from ..linalg.common import NEG_ZERO
from ..linalg.mm_fp32 import (
    E_IGNORED,
    cols_exp_min,
    NO_KEY,
    key_exp,
    mag_key,
    pack_a,
    pack_b_panel,
    scratch_part,
    rows_exp_min,
    tile_proved,
    tile_strided_proved,
)
from ..numerics.core import F32, ZERO, canon, flush, mul, recip, sqrt
from . import check_outs
from .rowblock import RB
from .softmax import softmax_rows_causal, softmax_rows_causal_backward


@kernel
def attention_scale(HS):
    """[attn.scores.c1] scale = recip(sqrt(f32(HS))), computed once per call."""
    return recip(sqrt(F32(HS)))


def _scale(HS):
    """attention_scale as the binary32 the kernels must multiply by.  Numba
    hands a compiled float32 result to Python as a float; passed on as one, it
    made the kernels' mul(z, scale) a binary64 product flushed before its
    rounding to binary32: (2^24 - 1) * 2^-150, which rounds up to the smallest
    normal, became 0 ([num.flush.c1] flushes after rounding)."""
    return np.float32(attention_scale(HS))


# ---- operands packed once per head ------------------------------------------------


@kernel
def rows_floats(T, HS):
    """Floats of pack_rows's panels for X [T, HS]."""
    return (HS + NR - 1) // NR * T * NR


@kernel
def transposed_floats(T, HS):
    """Floats of pack_transposed's panels for X [T, HS]."""
    return (T + NR - 1) // NR * HS * NR


@kernel
def pack_rows(X, Xp):
    """X [T, HS] as the B operand of a product summed over its rows, into
    Xp[:rows_floats]: panels of NR channels, Xp[(jp*T + s)*NR + j] = X[s, jp*NR + j]."""
    T, HS = X.shape
    for jp in range((HS + NR - 1) // NR):
        pack_b_panel(X, False, jp * NR, 0, T, Xp, jp * T * NR, NR)
    return Xp[: rows_floats(T, HS)]


@kernel
def pack_transposed(X, Xp):
    """X [T, HS] as the B operand Xᵀ of a product summed over channels, into
    Xp[:transposed_floats]: panels of NR positions, Xp[(sp*HS + d)*NR + j] = X[sp*NR + j, d]."""
    T, HS = X.shape
    for sp in range((T + NR - 1) // NR):
        pack_b_panel(X, True, sp * NR, 0, HS, Xp, sp * HS * NR, NR)
    return Xp[: transposed_floats(T, HS)]


# ---- a part's buffers, reused by every head it claims --------------------------------


@kernel
def _head_sizes(T, HS, transposed, rows):
    """Floats of each buffer a head works in, in head_buffers' order: the
    packs (``transposed`` of pack_transposed and ``rows`` of pack_rows), Ap,
    Z and O."""
    ns = (T + NR - 1) // NR
    nd = (HS + NR - 1) // NR
    packs = transposed * transposed_floats(T, HS) + rows * rows_floats(T, HS)
    return packs, max(HS, T) * MR, RB * ns * NR, MR * nd * NR


@kernel
def head_floats(T, HS, transposed, rows):
    """Floats of the buffers a head works in (head_buffers)."""
    packs, ap, z, o = _head_sizes(T, HS, transposed, rows)
    return packs + ap + z + o


@kernel
def _take(S, off, n):
    """(S[off .. off+n-1], off + n)."""
    return S[off : off + n], off + n


@kernel
def head_buffers(S, T, HS, transposed, rows):
    """S (head_floats floats) cut into (packs, Ap, Z, O): the packs as one
    array, ``transposed`` then ``rows`` of them end to end; Ap the A strips
    (max(HS, T) x MR), Z [RB, NR panels of T] the score rows, O one block of
    outputs (MR x NR panels of HS).  Every float of them that a head reads
    it has written first: what S held changes no bit."""
    n_packs, n_ap, n_z, n_o = _head_sizes(T, HS, transposed, rows)
    packs, o = _take(S, 0, n_packs)
    Ap, o = _take(S, o, n_ap)
    Z, o = _take(S, o, n_z)
    O, o = _take(S, o, n_o)
    return packs, Ap, Z.reshape((RB, n_z // RB)), O


@kernel
def head_parts(B, NH, threads):
    """The parts of a kernel's region over B * NH heads: one per thread, no more than the heads."""
    return max(1, min(threads, B * NH))


@kernel
def forward_part_floats(T, HS):
    """Floats of one forward part's scratch: a head's buffers with one pack of k and one of v."""
    return head_floats(T, HS, 1, 1)


@kernel
def backward_row_stride(T):
    """L: the backward's rows of dz and att span whole blocks of keys (+0 past T), padded (row_stride)."""
    return row_stride((T + MR - 1) // MR * MR)


@kernel
def backward_part_floats(T, HS):
    """Floats of one backward part's scratch: dz's and att's rows (2 x T x L),
    then a head's buffers with one transposed pack and three row packs."""
    return 2 * T * backward_row_stride(T) + head_floats(T, HS, 1, 3)


# ---- one block of MR query rows t0 .. t0+rows-1 ------------------------------------


@kernel
def dots_block(X, e_x, t0, Yp, e_y, Ap, Z, z0, ldz):
    """[attn.scores.c1] [mm.nt.c1] Z[z0 + r*ldz + s] = dot(X[t0+r], Y[s]) over d
    increasing from -0, NaN canonical, for s = 0 .. t0+r (and discarded
    lanes up to the end of the last NR panel).  Yp = pack_transposed(Y);
    e_x, e_y the exponent bounds of the X row block and the Y panels."""
    T, HS = X.shape
    rows = min(MR, T - t0)
    pack_a(X, False, t0, 0, HS, Ap[: HS * MR], MR)
    for sp in range((t0 + rows - 1) // NR + 1):
        tile_proved(e_x + e_y[sp], Ap, 0, Yp, sp * HS * NR, HS, Z, z0 + sp * NR, ldz, False)


@kernel
def row_exp_min(x, n):
    """min of exp_floor over x[0 .. n-1] ([mm.flush.r1] bound of a row), as
    the smallest magnitude key (mm_fp32.mag_key)."""
    m = NO_KEY
    for s in range(n):
        m = min(m, mag_key(x[s]))
    return key_exp(m)


@kernel
def softmax_block(Z, scale, t0, att_bh):
    """[attn.scores.c1] [attn.mask.c1] att[t, 0..t] = softmax(Z[t-t0, 0..t] * scale),
    att[t, t+1..] = +0, for the rows t = t0 .. t0+RB-1 (Z [RB, >= T], scaled
    in place); returns their exponent bound."""
    T = att_bh.shape[0]
    rows = min(Z.shape[0], T - t0)
    for r in range(rows):
        z = Z[r, : t0 + r + 1]
        for s in range(t0 + r + 1):
            z[s] = mul(z[s], scale)
    # Z is scratch apart from att: the exponentials read and write distinct
    # buffers and vectorise.
    softmax_rows_causal(Z, t0 + 1, att_bh[t0 : t0 + rows])
    e = E_IGNORED
    for t in range(t0, t0 + rows):
        att_t = att_bh[t]
        att_t[t + 1 :] = ZERO
        e = min(e, row_exp_min(att_t, t + 1))
    return e


@kernel
def dz_block(Z, att_bh, scale, t0, DZr, ATr, zcol, acol):
    """[attn.bwd.c1] DZr[r, 0..t] = softmax_backward(dp = Z[r, 0..t], att[t]) * scale
    and ATr[r, 0..t] = att[t, 0..t] (copied bits) for t = t0 + r; zcol[s] and
    acol[s] take the smallest magnitude keys of dz[t, s] and att[t, s]
    (bounds of dk's and dv's chains, block_min), for t = t0 .. t0+RB-1.
    Returns the rows' exponent bound."""
    T = att_bh.shape[0]
    rows = min(Z.shape[0], T - t0)
    softmax_rows_causal_backward(Z, att_bh[t0 : t0 + rows], t0 + 1, DZr[:rows])
    m = NO_KEY
    for t in range(t0, t0 + rows):
        att_t, at_r = att_bh[t], ATr[t - t0]
        dz = DZr[t - t0]
        for s in range(t + 1):
            dz[s] = mul(dz[s], scale)
        for s in range(t + 1):
            kz = mag_key(dz[s])
            m = min(m, kz)
            zcol[s] = min(zcol[s], kz)
        for s in range(t + 1):
            a = att_t[s]
            at_r[s] = a
            acol[s] = min(acol[s], mag_key(a))
    return key_exp(m)


@kernel
def weighted_sum_block(P, e_p, t0, X, Xp, e_x, Ap, O, out_bh):
    """[attn.out.c1] [attn.bwd.c1] out[t, d] = sum over s = 0 .. t, increasing,
    from -0, of P[t-t0, s] * X[s, d], for t = t0 .. t0+rows-1 (overwritten,
    NaN canonical).  P holds the block's rows (att or dz); Xp = pack_rows(X).
    The tile takes s = 0 .. t0, then each row adds its ragged tail."""
    T, HS = X.shape
    rows = P.shape[0]
    ld = O.shape[0] // MR
    kc = t0 + 1
    pack_a(P, False, 0, 0, kc, Ap[: kc * MR], MR)
    for jp in range((HS + NR - 1) // NR):
        tile_proved(e_p + e_x[jp], Ap, 0, Xp, jp * T * NR, kc, O, jp * NR, ld, False)
    for r in range(rows):
        t = t0 + r
        o = O[r * ld : r * ld + HS]
        p = P[r]
        for s in range(kc, t + 1):  # the tail, after the tile's s <= t0
            ps = p[s]
            x = X[s]
            for d in range(HS):
                o[d] = flush(o[d] + flush(ps * x[d]))
        out_t = out_bh[t]
        for d in range(HS):
            out_t[d] = canon(o[d])


# ---- one block of MR key rows s0 .. s0+rows-1 (backward) --------------------------


@kernel
def row_stride(n):
    """Floats between rows of a buffer of n-float rows read down its columns:
    n rounded up to whole 64-byte lines, and to an odd count of them, so that
    consecutive rows fall in different cache sets.  Rows 4 KiB apart (att's
    at T = 1024) all fall in one set of L1 and in a sixteenth of L2's sets:
    the key sums read 16 bytes of each of T rows per block of keys."""
    lines = (n + 15) // 16
    return (lines + 1 - lines % 2) * 16


@kernel
def key_sum_block(Ap, a_off, lda, e_a, s0, X, Xp, e_x, O, out_bh):
    """[attn.bwd.c1] out[s, d] = sum over t = s .. T-1, increasing, from -0,
    of A[t, s] * X[t, d], for s = s0 .. s0+rows-1 (overwritten, NaN
    canonical), where Ap[a_off + (t-s0)*lda + r] = A[t, s0+r] for t >= s0
    (A's rows lda floats apart, read in place by the strided tile).
    Each row adds its ragged head t = s .. s0+MR-2, then the tile takes
    t = s0+MR-1 .. T-1 from those partial sums."""
    T, HS = X.shape
    rows = min(MR, T - s0)
    ld = O.shape[0] // MR
    O[:] = NEG_ZERO
    t1 = min(s0 + MR - 1, T)  # first t of the tile
    for r in range(rows):
        o = O[r * ld : r * ld + HS]
        for t in range(s0 + r, t1):  # the head, before the tile's t >= t1
            a = Ap[a_off + (t - s0) * lda + r]
            x = X[t]
            for d in range(HS):
                o[d] = flush(o[d] + flush(a * x[d]))
    if t1 < T:
        for jp in range((HS + NR - 1) // NR):
            a_t1, xp_t1 = a_off + (t1 - s0) * lda, (jp * T + t1) * NR
            tile_strided_proved(e_a + e_x[jp], Ap, a_t1, lda, Xp, xp_t1, T - t1, O, jp * NR, ld, True)
    for r in range(rows):
        out_s = out_bh[s0 + r]
        for d in range(HS):
            out_s[d] = canon(O[r * ld + d])


@kernel
def block_min(keys, i0, n):
    """The exponent bound of entries i0 .. i0+n-1 of a column key array."""
    m = NO_KEY
    for i in range(i0, min(i0 + n, keys.shape[0])):
        m = min(m, keys[i])
    return key_exp(m)


# ---- the kernels ------------------------------------------------------------------


@parallel_kernel
def attention_forward_kernel(q, k, v, scale, out, att, threads, scratch):
    """q, k, v [B, NH, T, HS] -> out [B, NH, T, HS], att [B, NH, T, T]
    (both overwritten).  For every (b, h) and t = 0 .. T-1:
        att[t, s] = dot(q[t], k[s]) * scale            s = 0 .. t   [attn.scores.c1]
        att[t, :t+1] = softmax_row(att[t, :t+1]); att[t, s>t] = +0  [attn.mask.c1]
        out[t, d] = (-0 + att[t,0]*v[0,d]) + ... + att[t,t]*v[t,d] [attn.out.c1]
    computed MR rows t at a time (module docstring).  ``threads``: the
    parts that claim the (b, h) pairs one at a time (``_tiles.claim``: a
    part on a slower core takes fewer), each with one set of buffers for
    all its heads (forward_scratch_floats floats in all, taken from
    ``scratch`` where it holds them, else allocated); no bit depends on
    either.
    """
    B, NH, T, HS = q.shape
    parts = head_parts(B, NH, threads)
    n = forward_part_floats(T, HS)
    taken = np.zeros(1, np.int64)  # heads claimed so far
    for part in prange(parts):
        packs, Ap, Z, O = head_buffers(scratch_part(scratch, part * n, n), T, HS, 1, 1)
        bh = claim(taken)
        while bh < B * NH:
            _forward_head(q, k, v, scale, out, att, bh // NH, bh % NH, packs, Ap, Z, O)
            bh = claim(taken)


@kernel
def forward_scratch_floats(B, NH, T, HS, threads):
    """Floats of scratch attention_forward_kernel takes for its parts."""
    return head_parts(B, NH, threads) * forward_part_floats(T, HS)


@kernel
def _forward_head(q, k, v, scale, out, att, b, h, packs, Ap, Z, O):
    """attention_forward_kernel's head (b, h), in a part's buffers (head_buffers)."""
    T, HS = q.shape[2], q.shape[3]
    ni = (T + MR - 1) // MR
    ns = (T + NR - 1) // NR
    nd = (HS + NR - 1) // NR
    q_bh, k_bh, v_bh, att_bh, out_bh = q[b, h], k[b, h], v[b, h], att[b, h], out[b, h]
    kp = pack_transposed(k_bh, packs)
    vp = pack_rows(v_bh, packs[kp.shape[0] :])
    e_q, e_k, e_v = rows_exp_min(q_bh, ni, MR), rows_exp_min(k_bh, ns, NR), cols_exp_min(v_bh, nd, NR)
    for t00 in range(0, T, RB):  # RB rows' softmax sums side by side, MR rows' tiles
        ibs = range(t00 // MR, min(ni, (t00 + RB) // MR))
        for ib in ibs:
            dots_block(q_bh, e_q[ib], ib * MR, kp, e_k, Ap, Z.reshape(-1), (ib * MR - t00) * ns * NR, ns * NR)
        e_att = softmax_block(Z, scale, t00, att_bh)
        for ib in ibs:
            t0 = ib * MR
            weighted_sum_block(att_bh[t0 : t0 + MR], e_att, t0, v_bh, vp, e_v, Ap, O, out_bh)


@parallel_kernel
def attention_backward_kernel(dout, q, k, v, att, scale, dq, dk, dv, threads, scratch):
    """dout, q, k, v [B, NH, T, HS], att [B, NH, T, T] -> dq, dk, dv
    [B, NH, T, HS] (overwritten).  For every (b, h), t = 0 .. T-1 in
    increasing order, s = 0 .. t  [attn.bwd.c1]:
        dp[s]  = dot(dout[t], v[s])
        ds[s]  = softmax_row_backward(dp, att[t])[s]     (dot over s increasing)
        dz[s]  = ds[s] * scale
        dq[t,d] = (-0 + dz[0]*k[0,d]) + ... + dz[t]*k[t,d]
        dk[s,d] = dk[s,d] + dz[s]*q[t,d]        (so dk sums over t increasing)
        dv[s,d] = dv[s,d] + att[t,s]*dout[t,d]  (so dv sums over t increasing)
    dk and dv start at -0 ([red.sum.c1]).  dp, dz and dq are computed MR rows
    t at a time, then dk and dv MR rows s at a time (module docstring).
    ``threads``: the parts that claim the (b, h) pairs one at a time, each
    with one scratch of dz's and att's rows and the head's buffers for all
    its heads (backward_scratch_floats
    floats in all, taken from ``scratch`` where it holds them, else
    allocated: fresh ones cost a page fault per 4 KiB written wherever the
    allocator maps them anew); no bit depends on either.
    """
    B, NH, T, HS = q.shape
    L = backward_row_stride(T)
    parts = head_parts(B, NH, threads)
    nw = 2 * T * L
    n = backward_part_floats(T, HS)
    taken = np.zeros(1, np.int64)  # heads claimed so far (_tiles.claim: a part on a slower core takes fewer)
    for part in prange(parts):
        S = scratch_part(scratch, part * n, n)
        W = S[:nw].reshape((2, T, L))  # dz's and att's rows, read down their columns
        W[:, :, T:] = ZERO
        packs, Ap, Z, O = head_buffers(S[nw:], T, HS, 1, 3)
        zcol = np.empty(T, np.uint32)
        acol = np.empty(T, np.uint32)
        bh = claim(taken)
        while bh < B * NH:
            _backward_head(
                dout, q, k, v, att, scale, dq, dk, dv, bh // NH, bh % NH, W[0], W[1], packs, Ap, Z, O, zcol, acol
            )
            bh = claim(taken)


@kernel
def backward_scratch_floats(B, NH, T, HS, threads):
    """Floats of scratch attention_backward_kernel takes for its parts."""
    return head_parts(B, NH, threads) * backward_part_floats(T, HS)


@kernel
def _backward_head(dout, q, k, v, att, scale, dq, dk, dv, b, h, DZ, AT, packs, Ap, Z, O, zcol, acol):
    """attention_backward_kernel's head (b, h); DZ and AT [T, L] scratch
    whose columns T .. L-1 hold +0; packs, Ap, Z, O a part's buffers
    (head_buffers); zcol and acol [T] (overwritten)."""
    T, HS = q.shape[2], q.shape[3]
    ni = (T + MR - 1) // MR
    ns = (T + NR - 1) // NR
    nd = (HS + NR - 1) // NR
    L = DZ.shape[1]
    q_bh, k_bh, v_bh, do_bh, att_bh = q[b, h], k[b, h], v[b, h], dout[b, h], att[b, h]
    vp = pack_transposed(v_bh, packs)
    o = vp.shape[0]
    kp = pack_rows(k_bh, packs[o:])
    qp = pack_rows(q_bh, packs[o + kp.shape[0] :])
    dop = pack_rows(do_bh, packs[o + 2 * kp.shape[0] :])
    e_do, e_v = rows_exp_min(do_bh, ni, MR), rows_exp_min(v_bh, ns, NR)
    e_k, e_q, e_doc = cols_exp_min(k_bh, nd, NR), cols_exp_min(q_bh, nd, NR), cols_exp_min(do_bh, nd, NR)
    zcol[:] = NO_KEY
    acol[:] = NO_KEY
    for t00 in range(0, T, RB):  # as in the forward
        ibs = range(t00 // MR, min(ni, (t00 + RB) // MR))
        for ib in ibs:
            dots_block(do_bh, e_do[ib], ib * MR, vp, e_v, Ap, Z.reshape(-1), (ib * MR - t00) * ns * NR, ns * NR)
        e_dz = dz_block(Z, att_bh, scale, t00, DZ[t00:], AT[t00:], zcol, acol)
        for ib in ibs:
            t0 = ib * MR
            weighted_sum_block(DZ[t0 : min(t0 + MR, T)], e_dz, t0, k_bh, kp, e_k, Ap, O, dq[b, h])
    dz_f, at_f = DZ.reshape(-1), AT.reshape(-1)
    for sb in range(ni):  # the key sums read dz's and att's rows in place
        s0 = sb * MR
        key_sum_block(dz_f, s0 * L + s0, L, block_min(zcol, s0, MR), s0, q_bh, qp, e_q, O, dk[b, h])
        key_sum_block(at_f, s0 * L + s0, L, block_min(acol, s0, MR), s0, do_bh, dop, e_doc, O, dv[b, h])


# ---- public API ------------------------------------------------------------------


def _check(names_arrays, shape=None):
    for name, a in names_arrays:
        if not isinstance(a, np.ndarray) or a.dtype != np.float32:
            raise TypeError(f"{name} must be a float32 ndarray")
        if not a.flags.c_contiguous:
            raise ValueError(f"{name} must be C-contiguous")
        if a.ndim != 4:
            raise ValueError(f"{name} must be [B, NH, T, HS], got shape {a.shape}")
        shape = shape or a.shape
        if a.shape != shape:
            raise ValueError(f"{name} has shape {a.shape}, expected {shape}")
    if min(shape) < 1:
        raise ValueError(f"empty attention shape {shape}")
    return shape


def attention_forward(q, k, v, out=None):
    """[attn.scores.c1] [attn.out.c1] Causal attention.

    q, k, v [B, NH, T, HS] -> (out [B, NH, T, HS], att [B, NH, T, T]); att
    holds the probabilities (+0 above the diagonal) that the backward needs.
    ``out``: a pair (out, att) of arrays to write (either None: that one
    new); every element is overwritten, so what they held changes no bit.
    """
    B, NH, T, HS = _check([("q", q), ("k", k), ("v", v)])
    o_out, o_att = check_outs(out, ("out", "att"), ((B, NH, T, HS), (B, NH, T, T)), (q, k, v))
    o = np.empty_like(q) if o_out is None else o_out
    att = np.empty((B, NH, T, T), np.float32) if o_att is None else o_att
    threads = numba.get_num_threads()
    # the heads' packs and rows in this thread's reused scratch (refreplay/_scratch.py), as the backward's
    scratch = _scratch.get("attention", int(forward_scratch_floats(B, NH, T, HS, threads)))
    attention_forward_kernel(q, k, v, _scale(HS), o, att, threads, scratch)
    return o, att


def attention_backward(dout, q, k, v, att):
    """[attn.bwd.c1] -> (dq, dk, dv), each [B, NH, T, HS], new arrays."""
    B, NH, T, HS = _check([("dout", dout), ("q", q), ("k", k), ("v", v)])
    _check([("att", att)], (B, NH, T, T))
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    threads = numba.get_num_threads()
    # dz's and att's rows in this thread's reused scratch (refreplay/_scratch.py): allocated per
    # call, their page faults took a quarter of the backward on a KVM host
    scratch = _scratch.get("attention", int(backward_scratch_floats(B, NH, T, HS, threads)))
    attention_backward_kernel(dout, q, k, v, att, _scale(HS), dq, dk, dv, threads, scratch)
    return dq, dk, dv
