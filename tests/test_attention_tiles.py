"""The tiled attention kernels equal the row-at-a-time kernels they replaced,
bit for bit ([attn.scores.c1] [attn.mask.c1] [attn.out.c1] [attn.bwd.c1]).

The oracle below is ``ops/attention.py`` as it was before the register
tiles: one query row t at a time, dot products vectorised over s, weighted
sums over s and the dk / dv updates one term at a time, each chain flushed
step by step.  The tiled kernels must give the same bits on every tile edge
(T and HS around MR and NR), with special values planted in every input,
including the future (s > t) of earlier rows, with tiny inputs that force
the flushing tiles and normal ones that allow the flush-free tile
([mm.flush.r1]), and at every thread count.
"""

from __future__ import annotations

import numba
import numpy as np
import pytest
from numba import prange

from refreplay._jit import kernel, parallel_kernel
from refreplay.linalg._tile import MR, NR
from refreplay.linalg.common import NEG_ZERO
from refreplay.numerics.core import ZERO, canon, flush, mul
from refreplay.conformance.inputs.model import dz_rounds_up_to_normal
from refreplay.ops import attention
from refreplay.ops.rowblock import CB, RB
from refreplay.ops.softmax import (
    softmax_row,
    softmax_row_backward,
    softmax_rows_causal,
    softmax_rows_causal_backward,
)

F32 = np.float32


def bits(a):
    return np.ascontiguousarray(a, dtype=F32).view(np.uint32)


def assert_same_bits(got, want, what=""):
    g, w = bits(got), bits(want)
    bad = np.flatnonzero(g != w)
    assert bad.size == 0, (
        f"{what}: {bad.size} of {g.size} differ; first at "
        f"{np.unravel_index(bad[0], g.shape)}: {g.flat[bad[0]]:#010x} vs {w.flat[bad[0]]:#010x}"
    )


# ---- the oracle: the kernels before the tiles ------------------------------------


@kernel
def dot_rows(x, MT, n, acc):
    a = acc[:n]
    a[:] = NEG_ZERO
    for d in range(x.shape[0]):
        xd = x[d]
        m = MT[d, :n]
        for s in range(n):
            a[s] = flush(a[s] + flush(xd * m[s]))
    for s in range(n):
        a[s] = canon(a[s])


@kernel
def axpy_rows(c, M, n, acc):
    for s in range(n):
        cs = c[s]
        m = M[s]
        for d in range(acc.shape[0]):
            acc[d] = flush(acc[d] + flush(cs * m[d]))


@kernel
def transpose_into(M, MT):
    for s in range(M.shape[0]):
        for d in range(M.shape[1]):
            MT[d, s] = M[s, d]


@kernel
def canon_all(x):
    for i in range(x.shape[0]):
        x[i] = canon(x[i])


@parallel_kernel
def forward_rows(q, k, v, scale, out, att):
    B, NH, T, HS = q.shape
    for bh in prange(B * NH):
        b = bh // NH
        h = bh % NH
        q_bh, v_bh = q[b, h], v[b, h]
        kT = np.empty((HS, T), np.float32)
        transpose_into(k[b, h], kT)
        z = np.empty(T, np.float32)
        for t in range(T):
            att_t = att[b, h, t]
            n = t + 1
            dot_rows(q_bh[t], kT, n, z)
            zr = z[:n]
            for s in range(n):
                zr[s] = mul(zr[s], scale)
            softmax_row(z, n, att_t)
            att_t[n:] = ZERO
            out_t = out[b, h, t]
            out_t[:] = NEG_ZERO
            axpy_rows(att_t, v_bh, n, out_t)
            canon_all(out_t)


@parallel_kernel
def backward_rows(dout, q, k, v, att, scale, dq, dk, dv):
    B, NH, T, HS = q.shape
    for bh in prange(B * NH):
        b = bh // NH
        h = bh % NH
        q_bh, k_bh = q[b, h], k[b, h]
        dq_bh, dk_bh, dv_bh = dq[b, h], dk[b, h], dv[b, h]
        dk_bh[:, :] = NEG_ZERO
        dv_bh[:, :] = NEG_ZERO
        vT = np.empty((HS, T), np.float32)
        transpose_into(v[b, h], vT)
        dp = np.empty(T, np.float32)
        dz = np.empty(T, np.float32)
        for t in range(T):
            n = t + 1
            att_t = att[b, h, t]
            dout_t = dout[b, h, t]
            q_t = q_bh[t]
            dot_rows(dout_t, vT, n, dp)
            softmax_row_backward(dp, att_t, n, dz)
            for s in range(n):
                dz[s] = mul(dz[s], scale)
            dq_t = dq_bh[t]
            dq_t[:] = NEG_ZERO
            axpy_rows(dz, k_bh, n, dq_t)
            canon_all(dq_t)
            for s in range(n):
                z = dz[s]
                p = att_t[s]
                dk_s = dk_bh[s]
                dv_s = dv_bh[s]
                for d in range(HS):
                    dk_s[d] = flush(dk_s[d] + flush(z * q_t[d]))
                    dv_s[d] = flush(dv_s[d] + flush(p * dout_t[d]))
        for s in range(T):
            canon_all(dk_bh[s])
            canon_all(dv_bh[s])


def oracle(q, k, v, dout, att_in=None):
    """(out, att, dq, dk, dv) of the row kernels; the backward reads att_in
    when given (else the forward's att)."""
    scale = F32(attention.attention_scale(q.shape[3]))
    out, att = np.empty_like(q), np.empty(q.shape[:3] + (q.shape[2],), F32)
    forward_rows(q, k, v, scale, out, att)
    grads = [np.empty_like(q) for _ in range(3)]
    backward_rows(dout, q, k, v, att if att_in is None else att_in, scale, *grads)
    return (out, att, *grads)


def tiled(q, k, v, dout, att_in=None):
    out, att = attention.attention_forward(q, k, v)
    return (out, att, *attention.attention_backward(dout, q, k, v, att if att_in is None else att_in))


NAMES = ("out", "att", "dq", "dk", "dv")


def check(q, k, v, dout, att_in=None):
    want = oracle(q, k, v, dout, att_in)
    got = tiled(q, k, v, dout, att_in)
    for name, g, w in zip(NAMES, got, want):
        assert_same_bits(g, w, f"{name} {q.shape}")
    return got


# ---- inputs ----------------------------------------------------------------------

SPECIALS = np.array(
    [
        0x00000000,
        0x80000000,
        0x7F800000,
        0xFF800000,
        0x7FC00000,
        0x7F7FFFFF,
        0xFF7FFFFF,
        0x00800000,
        0x80800000,
        0x1E3CE508,
    ],
    np.uint32,
).view(F32)


def randn(rng, shape, scale):
    return (rng.standard_normal(shape) * scale).astype(F32)


def planted(rng, shape, scale, frac=0.02):
    """Random values with a fraction replaced by signed zeros, infinities,
    NaN, the extremes of binary32 and the smallest normals."""
    x = randn(rng, shape, scale)
    where = rng.random(shape) < frac
    x[where] = rng.choice(SPECIALS, size=int(where.sum()))
    return x


# T around MR (and 1), across RB-row softmax blocks and one and two NR
# panels; HS around NR.
T_EDGES = (1, 2, MR - 1, MR, MR + 1, 17, RB + 1, NR + 6, 2 * NR + 1)
HS_EDGES = (1, 3, NR, NR + 1)


@pytest.mark.parametrize("HS", HS_EDGES)
def test_tiles_equal_rows_on_every_edge(HS):
    """[attn.scores.c1] [attn.out.c1] [attn.bwd.c1] random inputs at three
    scales on every ragged edge of the MR x NR tiles."""
    rng = np.random.default_rng(100 + HS)
    for T in T_EDGES:
        for scale in (0.05, 1.0, 8.0):
            q, k, v, dout = (randn(rng, (1, 2, T, HS), scale) for _ in range(4))
            check(q, k, v, dout)


@pytest.mark.parametrize("T", [MR + 1, NR + 6])
def test_tiles_equal_rows_with_special_values(T):
    """[attn.mask.c1] [num.nan.c1] [num.flush.c1] +-0, +-inf, NaN, FLT_MAX and
    FLT_MIN planted in q, k, v and dout (scores overflow, exp underflows,
    0 * inf and inf - inf arise inside the chains)."""
    rng = np.random.default_rng(7 + T)
    for HS in (3, NR + 1):
        for _trial in range(3):
            q, k, v, dout = (planted(rng, (2, 2, T, HS), 2.0) for _ in range(4))
            check(q, k, v, dout)


def test_future_specials_do_not_reach_the_past():
    """[attn.mask.c1] [attn.bwd.c1] inf and NaN at the last position s = T-1
    (k, v) and in dout's last row leave every earlier output row exactly as
    with clean values there; the bits equal the oracle's in both runs."""
    rng = np.random.default_rng(3)
    for T, HS in ((MR + 1, 3), (NR + 6, NR), (2 * NR + 1, 5)):
        q, k, v, dout = (randn(rng, (1, 2, T, HS), 1.0) for _ in range(4))
        clean = check(q, k, v, dout)
        k2, v2 = k.copy(), v.copy()
        k2[..., -1, 0], v2[..., -1, :] = np.inf, np.nan
        k2[..., -1, -1] = -np.inf
        dirty = check(q, k2, v2, dout)
        for name, c, d in zip(NAMES, clean, dirty):
            if name in ("out", "att", "dq"):  # rows t < T-1 never see position T-1
                assert_same_bits(d[..., :-1, :], c[..., :-1, :], name)
        assert np.isnan(dirty[0][..., -1, :]).all()


def test_att_above_the_diagonal_is_never_read():
    """[attn.bwd.c1] the backward takes att[t, s] for s <= t only: NaN and inf
    planted above the diagonal change no bit."""
    rng = np.random.default_rng(4)
    for T, HS in ((MR + 1, 3), (NR + 6, NR + 1)):
        q, k, v, dout = (randn(rng, (1, 1, T, HS), 1.0) for _ in range(4))
        clean = tiled(q, k, v, dout)
        att = clean[1].copy()
        upper = np.triu(np.ones((T, T), bool), 1)
        att[0, 0][upper] = rng.choice(SPECIALS[2:5], size=int(upper.sum()))
        dirty = check(q, k, v, dout, att)
        for name, c, d in zip(NAMES[2:], clean[2:], dirty[2:]):
            assert_same_bits(d, c, name)


def test_scale_product_rounds_to_binary32_before_its_flush():
    """[attn.bwd.c1] [num.mul.c1] [num.flush.c1] dz = mul(ds, scale) in
    binary32: rounded, then flushed.  With HS = 64 (scale 2^-3), q = 0 (so
    att[1] = [1/2, 1/2] exactly), dout[1, 0] = X = (2^24 - 1) * 2^-145,
    v[0, 0] = 1 and every other entry of v 0, row t = 1 has dp = [X, 0],
    d = X/2, ds[0] = (X - X/2)/2 = (2^24 - 1) * 2^-147 (all exact and
    normal), and the exact dz[0] = (2^24 - 1) * 2^-150 lies half a subnormal
    ulp below 2^-126: binary32 rounds it (to even) up to the smallest
    normal, 2^-126, which the flush keeps.  With k[0, 5] = 2^20 and k[1] = 0,
    dq[1, 5] = dz[0] * 2^20 = 2^-106 exactly.  The API once passed the scale
    as a Python float: the kernels multiplied in binary64 and flushed before
    rounding, and dq[1, 5] came out 0."""
    s = dz_rounds_up_to_normal()  # the same input is attention_backward-edge-07 of the vectors
    q, k, v, dout = s["q"], s["k"], s["v"], s["dout"]
    HS = q.shape[3]
    assert HS == 64 and float(dout[0, 0, 1, 0]) == (2**24 - 1) * 2.0**-145 and k[0, 0, 0, 5] == 2.0**20
    out, att, dq, dk, dv = check(q, k, v, dout)
    assert_same_bits(att[0, 0, 1], np.array([0.5, 0.5], F32), "att[1]")
    assert dq[0, 0, 1, 5] == F32(2.0**-106)
    # every other entry of dq is a signed zero (k is 0 outside [0, 5])
    rest = np.delete(dq.reshape(-1), 1 * HS + 5)
    assert not rest.any()


@pytest.mark.parametrize("T", [MR - 1, NR + 6])
def test_tiles_equal_rows_on_the_flush_path(T):
    """[mm.flush.r1] [num.flush.c1] inputs near 2^-64 make products and
    partial sums subnormal (the flushing tiles run); inputs mixing them with
    normal magnitudes make only some tiles flush-free."""
    rng = np.random.default_rng(5 + T)
    for HS in (3, NR, NR + 1):
        for scale in (F32(2.0**-64), F32(2.0**-55)):
            q, k, v, dout = (randn(rng, (1, 2, T, HS), scale) for _ in range(4))
            check(q, k, v, dout)
            # a head of normal values beside a head of tiny ones
            q[:, 0] *= F32(2.0**60)
            k[:, 0] *= F32(2.0**60)
            dout[:, 1] *= F32(2.0**60)
            check(q, k, v, dout)
        # products of exactly 2^-126 and just below: the bound's edges
        q, k, v, dout = (np.full((1, 1, T, HS), F32(2.0**-63), F32) for _ in range(4))
        check(q, k, v, dout)
        q *= F32(2.0**-1) if HS > 1 else F32(1.0)
        check(q, k, v, dout)


@pytest.mark.threads
def test_bits_do_not_depend_on_the_thread_count():
    """[attn.batch.c1] one thread and all threads give the same bits."""
    rng = np.random.default_rng(6)
    q, k, v, dout = (planted(rng, (2, 3, NR + 6, NR + 1), 1.0, 0.005) for _ in range(4))
    keep = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = tiled(q, k, v, dout)
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
        many = tiled(q, k, v, dout)
    finally:
        numba.set_num_threads(keep)
    for name, a, b in zip(NAMES, one, many):
        assert_same_bits(a, b, name)
    want = oracle(q, k, v, dout)
    for name, g, w in zip(NAMES, many, want):
        assert_same_bits(g, w, name)


@pytest.mark.parametrize("parts", [1, 2, 4, 7])
def test_heads_sharing_a_scratch_keep_their_bits(parts):
    """Forward and backward run their heads in ``parts`` that claim heads one
    at a time, each part reusing one scratch for its heads' packs, strips,
    score rows and (backward) dz's and att's rows (whatever an earlier head
    left, or NaN, is never read): every part count gives the oracle's bits,
    with heads of different scales beside each other and a T that is not a
    whole number of MR-key blocks."""
    rng = np.random.default_rng(40 + parts)
    T, HS = 2 * MR + 3, NR + 1
    q, k, v, dout = (planted(rng, (2, 3, T, HS), 1.0, 0.01) for _ in range(4))
    with np.errstate(over="ignore"):  # a planted FLT_MAX becomes inf
        for x in (q, k, dout):
            x[0, 1] *= F32(64.0)  # a head with larger dz and att follows a small one
    out, att = np.full_like(q, np.nan), np.full((2, 3, T, T), np.nan, F32)
    scratch = np.full(attention.forward_scratch_floats(2, 3, T, HS, parts), np.nan, F32)  # what earlier calls left
    attention.attention_forward_kernel(q, k, v, attention._scale(HS), out, att, parts, scratch)
    want = oracle(q, k, v, dout)
    assert_same_bits(out, want[0], NAMES[0])
    assert_same_bits(att, want[1], NAMES[1])
    out2, att2 = np.empty_like(q), np.empty_like(att)  # no scratch: each part allocates its buffers
    attention.attention_forward_kernel(q, k, v, attention._scale(HS), out2, att2, parts, np.empty(0, F32))
    assert_same_bits(out2, want[0], NAMES[0])
    assert_same_bits(att2, want[1], NAMES[1])
    got = [np.empty_like(q) for _ in range(3)]
    scratch = np.full(attention.backward_scratch_floats(2, 3, T, HS, parts), np.nan, F32)
    attention.attention_backward_kernel(dout, q, k, v, att, attention._scale(HS), *got, parts, scratch)
    for name, g, w in zip(NAMES[2:], got, want[2:]):
        assert_same_bits(g, w, name)


@pytest.mark.parametrize("T, HS", [(1, 1), (MR + 5, 7), (NR, NR), (NR + 1, 2 * NR + 3)])
def test_head_buffers_tile_their_floats(T, HS):
    """head_buffers cuts exactly head_floats floats, end to end and without
    overlap, into the sizes the kernels use (packs of pack_transposed and
    pack_rows, an A strip of max(HS, T) rows, RB score rows of whole NR
    panels of T, MR output rows of whole NR panels of HS); and a part's
    scratch is its dz and att rows plus those buffers."""
    panels = lambda n: (n + NR - 1) // NR * NR  # noqa: E731
    for transposed, rows in [(1, 1), (1, 3), (0, 2)]:
        n = attention.head_floats(T, HS, transposed, rows)
        S = np.arange(n, dtype=F32)
        packs, Ap, Z, O = attention.head_buffers(S, T, HS, transposed, rows)
        want = transposed * panels(T) * HS + rows * panels(HS) * T
        assert packs.shape == (want,)
        assert Ap.shape == (max(HS, T) * MR,)
        assert Z.shape == (RB, panels(T))
        assert O.shape == (MR * panels(HS),)
        pieces = [packs, Ap, Z.reshape(-1), O]
        assert np.concatenate(pieces).tolist() == S.tolist()  # in order, each float once
    L = attention.backward_row_stride(T)
    assert L >= (T + MR - 1) // MR * MR
    assert attention.backward_part_floats(T, HS) == 2 * T * L + attention.head_floats(T, HS, 1, 3)
    assert attention.forward_part_floats(T, HS) == attention.head_floats(T, HS, 1, 1)
    for threads in (1, 2, 7, 100):
        parts = min(threads, 6)
        assert attention.forward_scratch_floats(2, 3, T, HS, threads) == parts * attention.forward_part_floats(T, HS)
        assert attention.backward_scratch_floats(2, 3, T, HS, threads) == parts * attention.backward_part_floats(T, HS)


def test_backward_reuses_the_thread_scratch():
    """The API's backward keeps its rows in this thread's scratch between calls
    (refreplay/_scratch.py); NaN left in it by anything changes no bit."""
    from refreplay import _scratch

    rng = np.random.default_rng(12)
    q, k, v, dout = (planted(rng, (1, 3, MR + 5, 7), 1.0, 0.01) for _ in range(4))
    want = oracle(q, k, v, dout)
    first = tiled(q, k, v, dout)
    held = _scratch.held("attention")
    assert held.shape[0] >= attention.backward_scratch_floats(1, 3, MR + 5, 7, numba.get_num_threads())
    assert held.shape[0] >= attention.forward_scratch_floats(1, 3, MR + 5, 7, numba.get_num_threads())
    held[:] = np.nan
    again = tiled(q, k, v, dout)
    assert _scratch.held("attention") is held
    for name, a, b, w in zip(NAMES, first, again, want):
        assert_same_bits(a, w, name)
        assert_same_bits(b, w, name)


def test_row_stride_is_an_odd_count_of_lines():
    """row_stride(n): at least n floats, whole 64-byte lines, an odd count of
    them (so rows read down a column never share one cache set), at most two
    lines more than n needs."""
    for n in range(1, 5000):
        L = attention.row_stride(n)
        assert n <= L < n + 32 and L % 16 == 0 and (L // 16) % 2 == 1, (n, L)


def test_causal_row_softmax_equals_row_kernels():
    """[softmax.fwd.c1] [softmax.bwd.c1] softmax_rows_causal(_backward) give
    softmax_row(_backward)'s bits row by row, for any number of rows."""
    rng = np.random.default_rng(8)
    for rows in (1, 2, MR, RB - 1, RB):
        for n0 in (1, 2, 9, 70, CB + 44):
            x = planted(rng, (rows, n0 + rows + 3), 4.0, 0.05)
            dy = planted(rng, x.shape, 1.0, 0.05)
            y = np.zeros_like(x)
            softmax_rows_causal(x, n0, y)
            dx = np.zeros_like(x)
            softmax_rows_causal_backward(dy, y, n0, dx)
            for r in range(rows):
                want, dwant = np.zeros(x.shape[1], F32), np.zeros(x.shape[1], F32)
                softmax_row(x[r], n0 + r, want)
                softmax_row_backward(dy[r], y[r], n0 + r, dwant)
                assert_same_bits(y[r], want, f"softmax row {r} of {rows}, n0={n0}")
                assert_same_bits(dx[r], dwant, f"softmax backward row {r} of {rows}, n0={n0}")


def test_tiles_equal_rows_past_a_chunk():
    """[attn.mask.c1] [attn.bwd.c1] T beyond one CB-column chunk of the softmax
    sums' tile, random and planted inputs."""
    rng = np.random.default_rng(10)
    check(*(randn(rng, (1, 1, CB + 44, 3), 1.0) for _ in range(4)))
    check(*(planted(rng, (1, 1, CB + 44, 3), 1.0, 0.002) for _ in range(4)))


@pytest.mark.slow
def test_tiles_equal_rows_sweep():
    """[attn.scores.c1] [attn.bwd.c1] every T from 1 to 2*NR+2 with several
    head sizes, random and planted inputs, and a gpt2-like head."""
    rng = np.random.default_rng(9)
    for T in range(1, 2 * NR + 3):
        for HS in (1, 2, 7, NR, NR + 1, 2 * NR + 3):
            check(*(planted(rng, (1, 2, T, HS), 1.5, 0.01) for _ in range(4)))
    check(*(randn(rng, (1, 2, 1024, 64), 0.5) for _ in range(4)))
