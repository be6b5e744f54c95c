"""Rotary embedding, softmax / log-softmax, causal attention and cross-entropy
(spec/13-ops-attention.txt, spec/14-ops-loss.txt).

Three kinds of oracle: PyTorch autograd and central differences in float64
(tolerances), scalar transcriptions of the stated orders from tests/naive.py
and the spec's exp/log/sin/cos (bits), and the same computation in other
processes and thread counts (bits).
"""

import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import naive
from torch_oracle import autograd, central_diff, rel_err
from refreplay import spec
from refreplay.errors import InputError
from refreplay.numerics import elementwise as ew
from refreplay.ops import attention as A
from refreplay.ops import loss as L
from refreplay.ops import rope as R
from refreplay.ops import softmax as S

F = np.float32
TOL = 1e-4  # normwise relative error of a float32 backward vs float64


def rand(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(F)


def same_bits(a, b):
    return np.asarray(a, F).tobytes() == np.asarray(b, F).tobytes()


# ---- float64 references written with torch's own operations ---------------------


def rope_t(x, theta=10000.0):
    T, HS = x.shape[-2], x.shape[-1]
    H2 = HS // 2
    inv = theta ** (-2.0 * torch.arange(H2, dtype=torch.float64) / HS)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    c, s = torch.cos(ang), torch.sin(ang)
    x1, x2 = x[..., :H2], x[..., H2:]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def attention_t(q, k, v):
    T, HS = q.shape[-2], q.shape[-1]
    z = (q @ k.transpose(-1, -2)) / HS**0.5
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    z = z.masked_fill(~mask, float("-inf"))
    return torch.softmax(z, dim=-1) @ v


def ce_t(targets):
    tg = torch.tensor(targets, dtype=torch.long)
    return lambda x: torch.nn.functional.cross_entropy(x, tg, ignore_index=-1)


# ---- worked examples of these chapters -------------------------------------------

MINE = [
    (c.label, line, e, r)
    for c in spec.parse().values()
    for line, e, r in c.examples
    if c.file in ("13-ops-attention.txt", "14-ops-loss.txt")
]


@pytest.mark.parametrize("label,line,expr,result", MINE, ids=[f"{m[0]}:{m[1]}" for m in MINE])
def test_worked_examples(label, line, expr, result):
    """Every hex example of chapters 13 and 14 reproduces bit for bit."""
    ok, msg = spec.run_example(expr, result)
    assert ok, f"[{label}] line {line}: {msg}"


# ---- softmax --------------------------------------------------------------------


def test_softmax_bits_are_the_stated_composition():
    """[softmax.fwd.c1] [softmax.log.c1] max from -inf, exp(x - m), -0-started
    sum in increasing j, one recip per row, one multiply per element."""
    rng = np.random.default_rng(1)
    x = rand(rng, 5, 33, scale=4.0)
    m = naive.row_max(x)
    e = ew.exp(naive_sub(x, m[:, None]))
    s = naive.row_sum(e)
    r = ew.recip(s)
    y = np.array([[naive.mul(e[i, j], r[i]) for j in range(33)] for i in range(5)], F)
    assert same_bits(S.softmax_forward(x), y)
    ls = ew.log(s)
    ly = np.array([[naive.add(naive.add(x[i, j], -m[i]), -ls[i]) for j in range(33)] for i in range(5)], F)
    assert same_bits(S.log_softmax_forward(x), ly)


def naive_sub(a, b):
    a, b = np.broadcast_arrays(np.asarray(a, F), np.asarray(b, F))
    return np.array([naive.add(x, -y) for x, y in zip(a.reshape(-1), b.reshape(-1))], F).reshape(a.shape)


def test_softmax_backward_bits_are_the_stated_composition():
    """[softmax.bwd.c1] [softmax.log.bwd.c1] the dot / sum over j increasing."""
    rng = np.random.default_rng(2)
    x, dy = rand(rng, 4, 17), rand(rng, 4, 17)
    y = S.softmax_forward(x)
    d = np.array([naive.seq_sum(naive.mul(dy[i, j], y[i, j]) for j in range(17)) for i in range(4)], F)
    want = np.array([[naive.mul(y[i, j], naive.add(dy[i, j], -d[i])) for j in range(17)] for i in range(4)], F)
    assert same_bits(S.softmax_backward(dy, y), want)
    ly = S.log_softmax_forward(x)
    g = naive.row_sum(dy)
    p = ew.exp(ly)
    want = np.array([[naive.add(dy[i, j], -naive.mul(p[i, j], g[i])) for j in range(17)] for i in range(4)], F)
    assert same_bits(S.log_softmax_backward(dy, ly), want)


@pytest.mark.parametrize("which", ["softmax", "log_softmax"])
def test_softmax_matches_torch_and_finite_differences(which):
    """[softmax.fwd.c1] [softmax.bwd.c1] [softmax.log.c1] [softmax.log.bwd.c1]"""
    rng = np.random.default_rng(3)
    x, dy = rand(rng, 3, 6, scale=2.0), rand(rng, 3, 6)
    fwd, bwd = getattr(S, f"{which}_forward"), getattr(S, f"{which}_backward")
    fn = getattr(torch, which) if which == "softmax" else torch.log_softmax
    ref_y, (ref_dx,) = autograd(lambda t: fn(t, dim=-1), [x], dy)
    y = fwd(x)
    assert rel_err(y, ref_y) <= 1e-6
    dx = bwd(dy, y)
    assert rel_err(dx, ref_dx) <= TOL
    (fd,) = central_diff(lambda t: fn(t, dim=-1), [x], dy)
    assert rel_err(dx, fd) <= TOL


def test_softmax_special_rows():
    """[softmax.fwd.c1] NaN or +inf poison the row; -inf entries give +0; an
    all -inf row is NaN."""
    nan = np.uint32(0x7FC00000)
    rows = np.array([[1, np.nan, 2], [1, np.inf, 2], [-np.inf, 3, -np.inf], [-np.inf] * 3], F)
    y = S.softmax_forward(rows).view(np.uint32)
    assert (y[0] == nan).all() and (y[1] == nan).all() and (y[3] == nan).all()
    assert y[2].tolist() == [0, 0x3F800000, 0]


# ---- rotary embedding -------------------------------------------------------------


def test_rope_tables_are_the_stated_composition():
    """[rope.freq.c1] inv_freq = exp(-((2i * recip(HS)) * log(theta))),
    angle = t * inv_freq, tables from the spec's cos and sin."""
    T, HS = 40, 16
    cos_t, sin_t = R.rope_tables(T, HS)
    two_i = np.arange(0, HS, 2, dtype=F)
    e = np.array(
        [naive.mul(naive.mul(v, ew.recip(np.array([HS], F))[0]), ew.log(np.array([10000], F))[0]) for v in two_i], F
    )
    inv = ew.exp(-e)
    ang = np.array([[naive.mul(F(t), f) for f in inv] for t in range(T)], F)
    assert same_bits(cos_t, ew.cos(ang)) and same_bits(sin_t, ew.sin(ang))
    t64 = np.arange(T)[:, None] * 10000.0 ** (-np.arange(0, HS, 2) / HS)[None, :]
    assert np.max(np.abs(cos_t - np.cos(t64))) < 2e-5
    assert np.max(np.abs(sin_t - np.sin(t64))) < 2e-5


def test_rope_matches_torch_and_finite_differences():
    """[rope.fwd.c1] [rope.bwd.c1] half-split pairs (i, i + HS/2)."""
    rng = np.random.default_rng(4)
    x, dy = rand(rng, 2, 2, 5, 8), rand(rng, 2, 2, 5, 8)
    cos_t, sin_t = R.rope_tables(5, 8)
    ref_y, (ref_dx,) = autograd(rope_t, [x], dy)
    assert rel_err(R.rope_forward(x, cos_t, sin_t), ref_y) <= 1e-6
    dx = R.rope_backward(dy, cos_t, sin_t)
    assert rel_err(dx, ref_dx) <= TOL
    (fd,) = central_diff(rope_t, [x[:1, :1]], dy[:1, :1])
    assert rel_err(dx[:1, :1], fd) <= TOL


def test_rope_bits_and_layout():
    """[rope.fwd.c1] [rope.bwd.c1] exact transcription of one rotation, and
    position 0 is the identity."""
    rng = np.random.default_rng(5)
    x = rand(rng, 1, 1, 3, 4)
    cos_t, sin_t = R.rope_tables(3, 4)
    out = R.rope_forward(x, cos_t, sin_t)
    dx = R.rope_backward(x, cos_t, sin_t)
    assert same_bits(out[0, 0, 0], x[0, 0, 0]) and same_bits(dx[0, 0, 0], x[0, 0, 0])
    for t in range(3):
        for i in range(2):
            c, s = cos_t[t, i], sin_t[t, i]
            x1, x2 = x[0, 0, t, i], x[0, 0, t, i + 2]
            assert same_bits(out[0, 0, t, i], naive.add(naive.mul(x1, c), -naive.mul(x2, s)))
            assert same_bits(out[0, 0, t, i + 2], naive.add(naive.mul(x2, c), naive.mul(x1, s)))
            assert same_bits(dx[0, 0, t, i], naive.add(naive.mul(x1, c), naive.mul(x2, s)))
            assert same_bits(dx[0, 0, t, i + 2], naive.add(naive.mul(x2, c), -naive.mul(x1, s)))


# ---- attention --------------------------------------------------------------------


def test_attention_matches_torch_and_finite_differences():
    """[attn.scores.c1] [attn.mask.c1] [attn.out.c1] [attn.bwd.c1]"""
    rng = np.random.default_rng(6)
    B, NH, T, HS = 2, 2, 6, 4
    q, k, v, dout = (rand(rng, B, NH, T, HS) for _ in range(4))
    out, att = A.attention_forward(q, k, v)
    ref_out, ref_grads = autograd(attention_t, [q, k, v], dout)
    assert rel_err(out, ref_out) <= 1e-6
    grads = A.attention_backward(dout, q, k, v, att)
    for g, r in zip(grads, ref_grads):
        assert rel_err(g, r) <= TOL
    sl = (slice(0, 1), slice(0, 1))
    fd = central_diff(attention_t, [q[sl], k[sl], v[sl]], dout[sl])
    for g, r in zip(grads, fd):
        assert rel_err(g[sl], r) <= TOL


def test_attention_bits_are_matmul_compositions():
    """[attn.scores.c1] [attn.out.c1] [attn.bwd.c1] each sum equals the
    fixed-order matmul of chapter 4 restricted to s <= t: scores from
    q·kᵀ, out = att·v, dv = attᵀ·dout, dq = dz·k, dk = dzᵀ·q (finite data,
    so the +0 entries above the diagonal add nothing)."""
    from refreplay import linalg

    rng = np.random.default_rng(7)
    T, HS = 7, 5
    q, k, v, dout = (rand(rng, 1, 1, T, HS) for _ in range(4))
    out, att = A.attention_forward(q, k, v)
    dq, dk, dv = A.attention_backward(dout, q, k, v, att)
    q2, k2, v2, d2, a2 = q[0, 0], k[0, 0], v[0, 0], dout[0, 0], att[0, 0]
    scale = F(A.attention_scale(HS))
    assert naive.bits(scale) == naive.bits(ew.recip(ew.sqrt(np.array([HS], F))))[0]
    z = linalg.matmul_nt(q2, k2)
    z = np.array([[naive.mul(z[t, s], scale) for s in range(T)] for t in range(T)], F)
    for t in range(T):
        assert same_bits(a2[t, : t + 1], S.softmax_forward(np.ascontiguousarray(z[t, : t + 1])))
        assert not a2[t, t + 1 :].view(np.uint32).any()  # +0 above the diagonal
    dp = linalg.matmul_nt(d2, v2)
    dz = np.zeros((T, T), F)
    for t in range(T):
        row = S.softmax_backward(np.ascontiguousarray(dp[t, : t + 1]), np.ascontiguousarray(a2[t, : t + 1]))
        dz[t, : t + 1] = [naive.mul(g, scale) for g in row]
    for t in range(T):  # sums over s = 0 .. t only
        assert same_bits(out[0, 0, t], linalg.matmul(np.ascontiguousarray(a2[t : t + 1, : t + 1]), v2[: t + 1]))
        assert same_bits(dq[0, 0, t], linalg.matmul(np.ascontiguousarray(dz[t : t + 1, : t + 1]), k2[: t + 1]))
    for s in range(T):  # sums over t = s .. T-1 only
        assert same_bits(dv[0, 0, s], linalg.matmul_tn(np.ascontiguousarray(a2[s:, s : s + 1]), d2[s:]))
        assert same_bits(dk[0, 0, s], linalg.matmul_tn(np.ascontiguousarray(dz[s:, s : s + 1]), q2[s:]))
    assert np.signbit(dq[0, 0, 0]).any()  # dz[0, 0] = +0: the zero signs follow k


def test_attention_future_never_leaks():
    """[attn.mask.c1] NaN and inf at position s change nothing at t < s, in
    the forward and in dq of earlier rows."""
    rng = np.random.default_rng(8)
    T, HS = 6, 4
    q, k, v, dout = (rand(rng, 1, 2, T, HS) for _ in range(4))
    out, att = A.attention_forward(q, k, v)
    dq, _, _ = A.attention_backward(dout, q, k, v, att)
    k2, v2 = k.copy(), v.copy()
    k2[0, :, 4, 1], v2[0, :, 4, 2] = np.inf, np.nan
    out2, att2 = A.attention_forward(q, k2, v2)
    dq2, _, _ = A.attention_backward(dout, q, k2, v2, att2)
    assert same_bits(out[:, :, :4], out2[:, :, :4]) and same_bits(att[:, :, :4], att2[:, :, :4])
    assert same_bits(dq[:, :, :4], dq2[:, :, :4])
    assert np.isnan(out2[:, :, 4:, 2]).all()  # v[4, 2] = NaN reaches every later row


def test_attention_and_rope_are_batch_invariant():
    """[attn.batch.c1] a sequence's forward and backward bits do not depend on
    B or on the other sequences."""
    rng = np.random.default_rng(9)
    NH, T, HS = 2, 5, 4
    one = [rand(rng, 1, NH, T, HS) for _ in range(4)]
    more = [np.concatenate([rand(rng, 2, NH, T, HS, scale=30.0), a, rand(rng, 1, NH, T, HS)]) for a in one]
    cos_t, sin_t = R.rope_tables(T, HS)
    r1, rb = R.rope_forward(one[0], cos_t, sin_t), R.rope_forward(more[0], cos_t, sin_t)
    assert same_bits(r1[0], rb[2])
    assert same_bits(R.rope_backward(one[3], cos_t, sin_t)[0], R.rope_backward(more[3], cos_t, sin_t)[2])
    o1, a1 = A.attention_forward(*one[:3])
    ob, ab = A.attention_forward(*more[:3])
    assert same_bits(o1[0], ob[2]) and same_bits(a1[0], ab[2])
    g1 = A.attention_backward(one[3], *one[:3], a1)
    gb = A.attention_backward(more[3], *more[:3], ab)
    for x, y in zip(g1, gb):
        assert same_bits(x[0], y[2])


# ---- cross-entropy ------------------------------------------------------------------


def test_cross_entropy_matches_torch_and_finite_differences():
    """[loss.token.c1] [loss.mean.c1] [loss.bwd.c1] against
    torch.nn.functional.cross_entropy(ignore_index=-1) in float64."""
    rng = np.random.default_rng(10)
    x = rand(rng, 6, 7, scale=2.0)
    tg = np.array([3, -1, 0, 6, -1, 2], np.int32)
    losses, mean, count = L.cross_entropy_forward(x, tg)
    assert count == 4
    ref_mean, (ref_dx,) = autograd(ce_t(tg), [x], np.float64(1.0))
    assert rel_err(mean, ref_mean) <= 1e-6
    per_tok = torch.nn.functional.cross_entropy(
        torch.tensor(x, dtype=torch.float64), torch.tensor(tg, dtype=torch.long), ignore_index=-1, reduction="none"
    ).numpy()
    assert rel_err(losses, per_tok) <= 1e-6
    dx = L.cross_entropy_backward(x, tg)
    assert rel_err(dx, ref_dx) <= TOL
    (fd,) = central_diff(ce_t(tg), [x], np.float64(1.0))
    assert rel_err(dx, fd) <= TOL
    dx2 = L.cross_entropy_backward(x, tg, dloss=F(0.5))
    assert rel_err(dx2, 0.5 * ref_dx) <= TOL


def test_cross_entropy_bits_are_the_stated_composition():
    """[loss.token.c1] [loss.mean.c1] [loss.bwd.c1] loss = log(s) - (x[y] - m);
    mean = ordered sum * recip(count); gradient (softmax - onehot) * c;
    ignored tokens are +0 rows and no term."""
    rng = np.random.default_rng(11)
    x = rand(rng, 5, 9, scale=3.0)
    tg = np.array([8, -1, 0, 4, -1], np.int32)
    losses, mean, count = L.cross_entropy_forward(x, tg)
    m = naive.row_max(x)
    ls = ew.log(naive.row_sum(ew.exp(naive_sub(x, m[:, None]))))
    for n in range(5):
        want = F(0.0) if tg[n] < 0 else naive.add(ls[n], -naive.add(x[n, tg[n]], -m[n]))
        assert same_bits(losses[n], want)
    total = naive.seq_sum(losses[n] for n in range(5) if tg[n] >= 0)
    assert same_bits(mean, naive.mul(total, ew.recip(np.array([3], F))[0]))
    dx = L.cross_entropy_backward(x, tg, dloss=F(1.5))
    c = naive.mul(F(1.5), ew.recip(np.array([3], F))[0])
    y = S.softmax_forward(x)
    for n in range(5):
        if tg[n] < 0:
            assert not dx[n].view(np.uint32).any()
            continue
        g = y[n].copy()
        g[tg[n]] = naive.add(g[tg[n]], F(-1.0))
        assert same_bits(dx[n], [naive.mul(v, c) for v in g])


def test_cross_entropy_gradient_coefficient_rounds_before_its_flush():
    """[loss.bwd.c1] [num.mul.c1] [num.flush.c1] c = mul(dloss, recip(f32(count)))
    in binary32.  dloss = (2^24 - 1) * 2^-149 (normal) and count 2: the exact
    product (2^24 - 1) * 2^-150 lies half a subnormal ulp below 2^-126 and
    rounds (to even) up to the smallest normal, which the flush keeps.  With
    softmax [1, 0] and target 1 the gradient is [c, -c] = [2^-126, -2^-126].
    The API once multiplied by recip's result as a Python float (binary64,
    flushed before rounding) and gave [+0, -0]."""
    x = np.array([[100.0, -100.0]], F)
    dloss = F((2**24 - 1) * 2.0**-149)
    assert float(dloss) == (2**24 - 1) * 2.0**-149
    c = naive.mul(dloss, F(0.5))
    assert naive.bits(c) == 0x00800000  # the oracle's own reading: 2^-126
    dx = L.cross_entropy_backward(x, np.array([1], np.int32), dloss=dloss, count=2)
    assert dx.view(np.uint32).tolist() == [[0x00800000, 0x80800000]]


def test_cross_entropy_no_counted_token_and_bad_targets():
    """[loss.mean.c1] count 0 gives mean +0 and +0 gradients; a target outside
    [0, V) that is not -1 is an input error."""
    x = np.ones((3, 4), F)
    none = np.full(3, -1, np.int32)
    losses, mean, count = L.cross_entropy_forward(x, none)
    assert count == 0 and naive.bits(mean) == 0 and not losses.view(np.uint32).any()
    assert not L.cross_entropy_backward(x, none).view(np.uint32).any()
    with pytest.raises(InputError):
        L.cross_entropy_forward(x, np.array([0, 4, -1], np.int32))
    with pytest.raises(InputError):
        L.cross_entropy_forward(x, np.array([0, -2, -1], np.int32))
    with pytest.raises(TypeError):
        L.cross_entropy_forward(x, np.zeros(3, np.int64))
    with pytest.raises(ValueError):
        L.cross_entropy_backward(x, np.zeros(3, np.int32), count=2)


def test_cross_entropy_is_batch_invariant():
    """[loss.token.c1] [loss.bwd.c1] [attn.batch.c1] a sequence's per-token
    losses, and its gradient rows for the same denominator, are bitwise
    unchanged when other sequences join the batch."""
    rng = np.random.default_rng(12)
    T, V = 4, 11
    x1 = rand(rng, T, V)
    t1 = np.array([1, -1, 10, 3], np.int32)
    xb = np.concatenate([rand(rng, 2 * T, V, scale=5.0), x1])
    tb = np.concatenate([rng.integers(-1, V, 2 * T).astype(np.int32), t1])
    l1, _, _ = L.cross_entropy_forward(x1, t1)
    lb, _, cb = L.cross_entropy_forward(xb, tb)
    assert same_bits(l1, lb[2 * T :])
    d1 = L.cross_entropy_backward(x1, t1, count=cb)
    db = L.cross_entropy_backward(xb, tb)
    assert same_bits(d1, db[2 * T :])


# ---- input validation -----------------------------------------------------------------


def test_input_validation():
    """Clear TypeError / ValueError instead of a Numba typing error; the rope
    tables reach T = 2^14 + 1 and no further ([rope.freq.c1])."""
    q = np.ones((1, 1, 3, 4), F)
    with pytest.raises(TypeError):
        A.attention_forward(q.astype(np.float64), q, q)
    with pytest.raises(ValueError):
        A.attention_forward(q, q, np.ones((1, 1, 3, 2), F))
    with pytest.raises(ValueError):
        A.attention_backward(q, q, q, q, np.ones((1, 1, 3, 2), F))
    with pytest.raises(ValueError):
        R.rope_tables(3, 5)
    with pytest.raises(ValueError):
        R.rope_tables(R.MAX_T + 1, 4)
    last = R.rope_tables(R.MAX_T, 2)  # angle 2^14: the edge of [num.sincos.c1]
    assert np.isfinite(last[0]).all() and np.isfinite(last[1]).all()
    cos_t, sin_t = R.rope_tables(2, 4)
    with pytest.raises(ValueError):
        R.rope_forward(q, cos_t, sin_t)  # tables shorter than T
    with pytest.raises(ValueError):
        S.softmax_forward(np.ones((2, 0), F))
    with pytest.raises(ValueError):
        S.softmax_backward(np.ones((2, 3), F), np.ones((2, 4), F))


# ---- same bits with 1 and 2 threads and in separate processes ---------------------------

DIGEST_SCRIPT = r"""
import hashlib, sys
import numpy as np
from refreplay.ops import attention as A, loss as L, quant as Q, rope as R, softmax as S
rng = np.random.default_rng(2024)
f = lambda *s: rng.standard_normal(s).astype(np.float32)
B, NH, T, HS, V, C, OC = 3, 2, 9, 8, 13, 16, 6
q, k, v, do = f(B, NH, T, HS), f(B, NH, T, HS), f(B, NH, T, HS), f(B, NH, T, HS)
x, dy, lg = f(B, T, C), f(B, T, OC), f(B * T, V)
w, b = f(OC, C), f(OC)
tg = rng.integers(-1, V, B * T).astype(np.int32)
cs, sn = R.rope_tables(T, HS)
outs = [cs, sn, R.rope_forward(q, cs, sn), R.rope_backward(do, cs, sn)]
sm = S.softmax_forward(lg); ls = S.log_softmax_forward(lg)
outs += [sm, ls, S.softmax_backward(lg, sm), S.log_softmax_backward(lg, ls)]
o, att = A.attention_forward(q, k, v)
outs += [o, att, *A.attention_backward(do, q, k, v, att)]
losses, mean, _ = L.cross_entropy_forward(lg, tg)
outs += [losses, np.array([mean], np.float32), L.cross_entropy_backward(lg, tg)]
outs += [Q.qlinear_forward(x, w, b), *Q.qlinear_backward(dy, x, w)]
h = hashlib.sha256()
for a in outs:
    h.update(np.ascontiguousarray(a).tobytes())
print(h.hexdigest())
"""


def _digest_in_subprocess(threads: int) -> str:
    env = dict(os.environ, NUMBA_NUM_THREADS=str(threads))
    out = subprocess.run([sys.executable, "-c", DIGEST_SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_same_bits_with_1_and_2_threads_and_across_processes():
    """[attn.batch.c1] [softmax.fwd.c1] [rope.fwd.c1] [loss.bwd.c1]
    [quant.linear.fwd.c1] [quant.linear.bwd.c1]: every output of these ops
    hashes identically in this process and in two separate processes run
    with NUMBA_NUM_THREADS=1 and 2."""
    ns = {}
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(compile(DIGEST_SCRIPT, "<digest>", "exec"), ns)
    here = buf.getvalue().strip()
    one = _digest_in_subprocess(1)
    two = _digest_in_subprocess(2)
    assert len(here) == 64 and here == one == two
    assert hashlib.sha256(b"").hexdigest() != here
