"""Independent oracles for the bf16 ops whose binary32 clause fixes every
operation and its order: matmul_nt and matmul_tn ([mm.nt.c1], [mm.tn.c1]),
the backward passes of LayerNorm, RMSNorm, softmax, log-softmax and attention
([norm.layer.bwd.c1], [norm.rms.bwd.c1], [softmax.bwd.c1],
[softmax.log.bwd.c1], [attn.bwd.c1]), rotary embedding forward and backward
([rope.fwd.c1], [rope.bwd.c1]) and the embedding forward and backward
([emb.fwd.c1], [emb.bwd.c1]), each in the profile of [bf16.ops.c1].

Each oracle is a transcription of the spec's text, written here without
refreplay's code: widen the bf16 inputs ([bf16.load.c1], [bf16.widen.c1]: the
bit pattern shifted left by 16 after zeroing subnormals and canonicalising
NaN), load the binary32 inputs ([num.load.c1]), run the clause's steps in the
clause's order as NumPy binary32 operations (each + and * one IEEE rounding
to nearest-even, never fused, then the flush of [num.flush.c1] and the NaN
of [num.nan.c1]; the loops run over the reduction index in the stated order,
vectorised only across independent outputs), and round each bf16 output once
with the clean-room rounding of ``test_bf16_numerics.oracle_encode`` (exact
float64 neighbours, not the library's bit trick).  The one transcendental,
exp in [softmax.log.bwd.c1], is ``naive_numerics.exp``, the independent
transcription of [num.exp.c1].  The spec defines every bit, so the
comparison is bit for bit: no tolerance.

Inputs: every committed vector of these ops (the oracle must give the stored
bits, and so must ``ops.bf16.apply``), and seeded inputs made here that mix
ordinary values with bf16 subnormals, infinities, NaNs and values whose
binary32 results sit next to bf16 ties.  Each oracle has wrong readings
(truncating instead of rounding, rounding an internal value to bf16, another
summation order, subnormal inputs kept): each must disagree with the
reference on these inputs, so the comparison can fail.
"""

from __future__ import annotations

import numpy as np
import pytest

import naive_numerics as nn
from refreplay.conformance.golden import store
from refreplay.ops import bf16 as OB
from test_bf16_numerics import oracle_encode

F32 = np.float32
FLT_MIN = F32(2.0**-126)
CANON = np.array([0x7FC00000], np.uint32).view(F32)[0]


# ---- binary32 arithmetic of chapter 1 ---------------------------------------------------------------


def fin(r):
    """[num.flush.c1] a subnormal result becomes a zero of its sign; [num.nan.c1] NaN canonical."""
    r = np.asarray(r, F32)
    r = np.where((r != 0) & (np.abs(r) < FLT_MIN), r * F32(0), r)
    return np.where(np.isnan(r), CANON, r).astype(F32)


def add(a, b):
    with np.errstate(all="ignore"):
        return fin(np.add(np.asarray(a, F32), np.asarray(b, F32)))


def sub(a, b):
    return add(a, np.negative(np.asarray(b, F32)))


def mul(a, b):
    with np.errstate(all="ignore"):
        return fin(np.multiply(np.asarray(a, F32), np.asarray(b, F32)))


def recip(x):
    with np.errstate(all="ignore"):
        return fin(np.divide(F32(1), np.asarray(x, F32)))


def sqrt(x):
    with np.errstate(all="ignore"):
        return fin(np.sqrt(np.asarray(x, F32)))


def exp(x):
    x = np.asarray(x, F32)
    return np.array([nn.exp(F32(v)) for v in x.reshape(-1)], F32).reshape(x.shape)


# ---- the profile's conversions ----------------------------------------------------------------------


def widen(h, zero=True):
    """[bf16.load.c1] then [bf16.widen.c1]; ``zero=False`` is the wrong reading that keeps subnormals."""
    h = np.asarray(h, np.uint16)
    e, f = h & 0x7F80, h & 0x007F
    if zero:
        h = np.where(e == 0, h & 0x8000, h)
    h = np.where((e == 0x7F80) & (f != 0), 0x7FC0, h).astype(np.uint32)
    return (h << 16).view(F32)


def load(x):
    """[num.load.c1] binary32 inputs: subnormals zeroed, NaN canonical."""
    return fin(np.asarray(x, F32))


def rnd(x, mode="even"):
    """[bf16.round.c1] binary32 -> bf16 bits (``mode`` "trunc" is the wrong reading)."""
    u = np.ascontiguousarray(x, F32).view(np.uint32)
    if mode == "even":
        return oracle_encode(u)
    return np.where(np.isnan(x), np.uint16(0x7FC0), (u >> 16).astype(np.uint16)).astype(np.uint16)


def to_h(x):
    """An internal value rounded to bf16 and widened back (the wrong readings of [bf16.ops.c1])."""
    return widen(rnd(x))


def ident(x):
    return x


# ---- the ops ----------------------------------------------------------------------------------------


def seq_sum_last(X):
    """[red.sum.c1] over the last axis: -0, then the terms in increasing order; empty is +0."""
    X = np.asarray(X, F32)
    if X.shape[-1] == 0:
        return np.zeros(X.shape[:-1], F32)
    s = np.full(X.shape[:-1], F32(-0.0))
    for n in range(X.shape[-1]):
        s = add(s, X[..., n])
    return s


def o_matmul_nt(A, B, reverse=False, zero=True):
    """[mm.nt.c1] C[i, j] = sum over k increasing of mul(A[i, k], B[j, k]); C stays binary32."""
    a, b = widen(A, zero), widen(B, zero)
    K = a.shape[1]
    if K == 0:
        return np.zeros((a.shape[0], b.shape[0]), F32)
    s = np.full((a.shape[0], b.shape[0]), F32(-0.0))
    for k in range(K - 1, -1, -1) if reverse else range(K):
        s = add(s, mul(a[:, k][:, None], b[:, k][None, :]))
    return s


def o_matmul_tn(A, B, reverse=False, zero=True):
    """[mm.tn.c1] C[i, j] = sum over k increasing of mul(A[k, i], B[k, j])."""
    a, b = widen(A, zero), widen(B, zero)
    K = a.shape[0]
    if K == 0:
        return np.zeros((a.shape[1], b.shape[1]), F32)
    s = np.full((a.shape[1], b.shape[1]), F32(-0.0))
    for k in range(K - 1, -1, -1) if reverse else range(K):
        s = add(s, mul(a[k][:, None], b[k][None, :]))
    return s


def o_layernorm_backward(dout, x, w, mean, rstd, mode="even", inner=ident):
    """[norm.layer.bwd.c1] steps 1-5; ``inner`` is applied to norm (a wrong reading rounds it)."""
    dout, x, w = widen(dout), widen(x), widen(w)
    mean, rstd = load(mean), load(rstd)
    C = x.shape[1]
    inv_c = recip(F32(C))  # [norm.meanop.c1]
    norm = inner(mul(sub(x, mean[:, None]), rstd[:, None]))
    dnorm = mul(dout, w[None, :])
    a = seq_sum_last(dnorm)
    g = seq_sum_last(mul(dnorm, norm))
    dnorm_mean, dnorm_norm_mean = mul(a, inv_c), mul(g, inv_c)
    dx = mul(sub(sub(dnorm, dnorm_mean[:, None]), mul(norm, dnorm_norm_mean[:, None])), rstd[:, None])
    dw = seq_sum_last(mul(dout, norm).T)
    db = seq_sum_last(dout.T)
    return rnd(dx, mode), dw, db


def o_rmsnorm_backward(dout, x, w, rrms, mode="even", inner=ident):
    """[norm.rms.bwd.c1] steps 1-5."""
    dout, x, w, rrms = widen(dout), widen(x), widen(w), load(rrms)
    inv_c = recip(F32(x.shape[1]))
    norm = inner(mul(x, rrms[:, None]))
    dnorm = mul(dout, w[None, :])
    g = seq_sum_last(mul(dnorm, norm))
    dx = mul(sub(dnorm, mul(norm, mul(g, inv_c)[:, None])), rrms[:, None])
    dw = seq_sum_last(mul(dout, norm).T)
    return rnd(dx, mode), dw


def o_softmax_backward(dy, y, mode="even", inner=ident):
    """[softmax.bwd.c1] d = sum of dy*y (j increasing); dx = y * (dy - d); ``inner`` on d."""
    dy, y = widen(dy), widen(y)
    d = inner(seq_sum_last(mul(dy, y)))
    return rnd(mul(y, sub(dy, d[..., None])), mode)


def o_log_softmax_backward(dy, y, mode="even", inner=ident):
    """[softmax.log.bwd.c1] g = sum of dy (j increasing); dx = dy - exp(y) * g; ``inner`` on exp(y)."""
    dy, y = widen(dy), widen(y)
    g = seq_sum_last(dy)
    return rnd(sub(dy, mul(inner(exp(y)), g[..., None])), mode)


def o_attention_backward(dout, q, k, v, att, mode="even", inner=ident):
    """[attn.bwd.c1] per (b, h): t increasing, s = 0..t inside; dk, dv from -0 summed over t
    increasing; ``inner`` on dz (a wrong reading rounds the score gradients)."""
    do, q, k, v, att = widen(dout), widen(q), widen(k), widen(v), load(att)
    Bn, NH, T, HS = q.shape
    scale = recip(sqrt(F32(HS)))  # [attn.scores.c1]
    dq = np.zeros(q.shape, F32)
    dk = np.full(k.shape, F32(-0.0))
    dv = np.full(v.shape, F32(-0.0))
    for b in range(Bn):
        for h in range(NH):
            for t in range(T):
                dp = seq_sum_last(mul(do[b, h, t][None, :], v[b, h, : t + 1]))  # [mm.nt.c1] over d
                p = att[b, h, t, : t + 1]
                c = seq_sum_last(mul(dp, p))
                dz = inner(mul(mul(p, sub(dp, c)), scale))
                dq[b, h, t] = seq_sum_last(mul(dz[:, None], k[b, h, : t + 1]).T)  # over s increasing
                dk[b, h, : t + 1] = add(dk[b, h, : t + 1], mul(dz[:, None], q[b, h, t][None, :]))
                dv[b, h, : t + 1] = add(dv[b, h, : t + 1], mul(p[:, None], do[b, h, t][None, :]))
    return rnd(dq, mode), rnd(dk, mode), rnd(dv, mode)


def o_rope_forward(x, cos_t, sin_t, mode="even", inner=ident):
    """[rope.fwd.c1] half-split pairs; each product rounded before the subtract or add;
    ``inner`` on the products."""
    x, c, s = widen(x), load(cos_t), load(sin_t)
    h2 = x.shape[-1] // 2
    a, b = x[..., :h2], x[..., h2:]
    lo = sub(inner(mul(a, c)), inner(mul(b, s)))
    hi = add(inner(mul(b, c)), inner(mul(a, s)))
    return rnd(np.concatenate([lo, hi], -1), mode)


def o_rope_backward(dout, cos_t, sin_t, mode="even", inner=ident):
    """[rope.bwd.c1] the transposed rotation."""
    d, c, s = widen(dout), load(cos_t), load(sin_t)
    h2 = d.shape[-1] // 2
    a, b = d[..., :h2], d[..., h2:]
    lo = add(inner(mul(a, c)), inner(mul(b, s)))
    hi = sub(inner(mul(b, c)), inner(mul(a, s)))
    return rnd(np.concatenate([lo, hi], -1), mode)


def o_embedding_forward(wte, tokens, zero=True):
    """[emb.fwd.c1] an exact copy of the widened row, then the one rounding (exact for a
    loaded bf16 value); ``zero=False`` keeps subnormal rows as they are."""
    return rnd(widen(wte, zero)[np.asarray(tokens)], "even" if zero else "trunc")


def o_embedding_backward(dout, tokens, V, reverse=False, absent=F32(0.0)):
    """[emb.bwd.c1] every element of dwte from -0, positions i = b*T + t increasing; rows of
    ids that never occur are +0 (``absent`` -0 is the wrong reading)."""
    d = widen(dout)
    tk = np.asarray(tokens).reshape(-1)
    d = d.reshape(tk.size, np.shape(dout)[-1])  # C = 0 too (reshape(0, -1) cannot infer)
    nv = int(np.asarray(V).reshape(-1)[0])
    out = np.full((nv, d.shape[1]), F32(-0.0))
    for i in range(tk.size - 1, -1, -1) if reverse else range(tk.size):
        out[tk[i]] = add(out[tk[i]], d[i])
    out[np.setdiff1d(np.arange(nv), tk)] = absent
    return out


ORACLES = {
    "matmul_nt": o_matmul_nt,
    "matmul_tn": o_matmul_tn,
    "layernorm_backward": o_layernorm_backward,
    "rmsnorm_backward": o_rmsnorm_backward,
    "softmax_backward": o_softmax_backward,
    "log_softmax_backward": o_log_softmax_backward,
    "attention_backward": o_attention_backward,
    "rope_forward": o_rope_forward,
    "rope_backward": o_rope_backward,
    "embedding_forward": o_embedding_forward,
    "embedding_backward": o_embedding_backward,
}

# For each op, wrong readings of the spec (keyword arguments of its oracle); each must give
# other bits than the reference on this file's inputs.
H_OUT = [{"mode": "trunc"}]
WRONG = {
    "matmul_nt": [{"reverse": True}, {"zero": False}],
    "matmul_tn": [{"reverse": True}, {"zero": False}],
    "layernorm_backward": H_OUT + [{"inner": to_h}],
    "rmsnorm_backward": H_OUT + [{"inner": to_h}],
    "softmax_backward": H_OUT + [{"inner": to_h}],
    "log_softmax_backward": H_OUT + [{"inner": to_h}],
    "attention_backward": H_OUT + [{"inner": to_h}],
    "rope_forward": H_OUT + [{"inner": to_h}],
    "rope_backward": H_OUT + [{"inner": to_h}],
    "embedding_forward": [{"zero": False}],
    "embedding_backward": [{"reverse": True}, {"absent": F32(-0.0)}],
}


# ---- inputs -----------------------------------------------------------------------------------------

SPECIAL_H = np.array(
    [0x0001, 0x807F, 0x0080, 0x8080, 0x7F80, 0xFF80, 0x7FC0, 0x7F81, 0xFFC1, 0x0000, 0x8000, 0x7F7F, 0xFF7F], np.uint16
)


def h_values(g, shape, scale=1.0, special=0.0):
    """bf16 bits of N(0, scale) values, a fraction ``special`` of them replaced by edge patterns."""
    x = (g.standard_normal(shape) * scale).astype(F32)
    h = rnd(x)
    if special:
        pick = g.random(shape) < special
        h = np.where(pick, g.choice(SPECIAL_H, size=shape), h).astype(np.uint16)
    return h


def f_values(g, shape, lo, hi):
    return g.uniform(lo, hi, shape).astype(F32)


def subnormal_h(g, shape):
    """Tiny bf16 values among which some are subnormal: their zeroing changes sums of products."""
    h = g.integers(0x0001, 0x0200, size=shape).astype(np.uint16)
    return np.where(g.random(shape) < 0.5, h | 0x8000, h).astype(np.uint16)


def made_cases(op: str) -> list[tuple]:
    """Seeded inputs for ``op``: one ordinary case, one with edge patterns, one sharp for
    subnormal inputs where the op multiplies two bf16 tensors."""
    g = np.random.default_rng(sum(op.encode()))
    out = []
    if op in ("matmul_nt", "matmul_tn"):
        for I, K, J in ((3, 37, 5), (2, 130, 4)):
            a = h_values(g, (I, K) if op == "matmul_nt" else (K, I), 4.0)
            b = h_values(g, (J, K) if op == "matmul_nt" else (K, J), 4.0)
            out.append((a, b))
        # bf16 subnormals (zeroed on loading) beside tiny normal values, times large ones: kept
        # subnormals would make products of about 2^-30 where the profile has zeros
        a = np.where(g.random((4, 16)) < 0.5, subnormal_h(g, (4, 16)), h_values(g, (4, 16), 2.0**-120))
        b = h_values(g, (3, 16), 2.0**100)
        out.append((a, b) if op == "matmul_nt" else (np.ascontiguousarray(a.T), np.ascontiguousarray(b.T)))
        a, b = h_values(g, (3, 9), 2.0, 0.2), h_values(g, (4, 9), 2.0, 0.2)  # edge patterns: inf, NaN, -0
        out.append((a, b) if op == "matmul_nt" else (np.ascontiguousarray(a.T), np.ascontiguousarray(b.T)))
    elif op in ("layernorm_backward", "rmsnorm_backward"):
        for N, C, special in ((6, 24, 0.0), (5, 33, 0.05)):
            dout, x, w = (
                h_values(g, (N, C), 1.0, special),
                h_values(g, (N, C), 2.0, special),
                h_values(g, (C,), 1.0, special),
            )
            xv = widen(x).astype(np.float64)
            xv = np.where(np.isfinite(xv), xv, 0.0)
            mean = xv.mean(1).astype(F32)  # statistics need only be binary32 inputs: any values do
            rstd = (1.0 / np.sqrt(((xv - xv.mean(1, keepdims=True)) ** 2).mean(1) + 1e-5)).astype(F32)
            rrms = (1.0 / np.sqrt((xv**2).mean(1) + 1e-5)).astype(F32)
            out.append((dout, x, w, mean, rstd) if op == "layernorm_backward" else (dout, x, w, rrms))
    elif op in ("softmax_backward", "log_softmax_backward"):
        for N, V, special in ((4, 50, 0.0), (3, 17, 0.05)):
            dy = h_values(g, (N, V), 1.0, special)
            z = g.standard_normal((N, V))
            if op == "softmax_backward":
                y = rnd((np.exp(z) / np.exp(z).sum(1, keepdims=True)).astype(F32))
            else:
                y = rnd((z - np.log(np.exp(z).sum(1, keepdims=True))).astype(F32))
            if special:
                y = np.where(g.random((N, V)) < special, g.choice(SPECIAL_H, size=(N, V)), y).astype(np.uint16)
            out.append((dy, y))
    elif op == "attention_backward":
        for Bn, NH, T, HS, special in ((1, 2, 7, 4, 0.0), (2, 1, 5, 6, 0.03)):
            shp = (Bn, NH, T, HS)
            z = g.standard_normal((Bn, NH, T, T))
            z = np.where(np.tril(np.ones((T, T), bool)), z, -np.inf)
            att = (np.exp(z) / np.exp(z).sum(-1, keepdims=True)).astype(F32)
            out.append(
                (
                    h_values(g, shp, 1.0, special),
                    h_values(g, shp, 1.0, special),
                    h_values(g, shp, 1.0, special),
                    h_values(g, shp, 1.0, special),
                    att,
                )
            )
    elif op in ("rope_forward", "rope_backward"):
        for Bn, NH, T, HS, special in ((2, 2, 6, 8, 0.0), (1, 3, 5, 6, 0.05)):
            ang = np.arange(T)[:, None] * 10000.0 ** (-np.arange(HS // 2)[None, :] * 2.0 / HS)
            out.append((h_values(g, (Bn, NH, T, HS), 3.0, special), np.cos(ang).astype(F32), np.sin(ang).astype(F32)))
    elif op == "embedding_forward":
        wte = h_values(g, (12, 8), 1.0, 0.1)
        wte[0, :4] = [0x0001, 0x807F, 0x7F81, 0xFFC1]  # subnormals zeroed, NaN payloads canonical
        out.append((wte, np.array([[0, 3, 0, 11, 5]], np.int32)))
        out.append((h_values(g, (7, 3)), g.integers(0, 7, (2, 4)).astype(np.int32)))
    elif op == "embedding_backward":
        V = 9
        tokens = np.array([[0, 2, 0, 0, 5], [2, 8, 0, 5, 5]], np.int32)  # ids 1, 3, 4, 6, 7 never occur
        dout = h_values(g, (2, 5, 6), 1.0)
        dout[0, 0] = rnd(np.full(6, 1.0, F32))
        dout[0, 2] = dout[0, 3] = rnd(np.full(6, 2.0**-24, F32))  # 1 + 2^-24 + 2^-24 is 1 in order,
        dout[1, 2] = 0x8000  # and 1 + 2^-23 summed backwards (id 0's last term is -0)
        out.append((dout, tokens, np.array([V], np.int32)))
        d2 = h_values(g, (1, 3, 2))
        d2[0, :] = 0x8000  # only -0 terms: an occurring id keeps -0, an absent one is +0
        out.append((d2, np.array([[1, 1, 2]], np.int32), np.array([4], np.int32)))
    return out


OPS = sorted(ORACLES)


def _vector_cases(op):
    _, cases = store.load_cases(ops={f"bf16_{op}"})
    assert cases, f"no committed vectors for bf16_{op}"
    return cases


def _as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


def _same(got, want) -> list[int]:
    """Indices of the outputs whose bits differ."""
    bad = []
    for i, (a, b) in enumerate(zip(_as_tuple(got), _as_tuple(want))):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape or a.dtype != b.dtype or a.tobytes() != b.tobytes():
            bad.append(i)
    return bad


# ---- the checks -------------------------------------------------------------------------------------


def test_every_op_of_the_profile_has_an_oracle_here_or_is_named_elsewhere():
    """The 11 ops of this file are ops of [bf16.ops.c1] with the kinds the oracles assume."""
    assert set(ORACLES) <= set(OB.PROFILE)
    assert set(WRONG) == set(ORACLES)
    for op in ORACLES:
        ins, outs = OB.PROFILE[op]
        assert len(made_cases(op)[0]) == len(ins), op


@pytest.mark.parametrize("op", OPS)
def test_oracle_gives_the_committed_vectors(op):
    """The committed vectors' stored bits are the oracle's, and the reference's."""
    for case in _vector_cases(op):
        args = list(case.inputs.values())
        want = tuple(case.outputs.values())
        got = _as_tuple(ORACLES[op](*args))
        assert not _same(got, want), f"{case.id}: the oracle differs from the stored outputs"


@pytest.mark.parametrize("op", OPS)
def test_reference_equals_oracle_on_made_inputs(op):
    for n, args in enumerate(made_cases(op)):
        got = _as_tuple(OB.apply(op, *args))
        want = _as_tuple(ORACLES[op](*args))
        bad = _same(got, want)
        assert not bad, f"{op} case {n}: outputs {bad} differ from the oracle"


@pytest.mark.parametrize(
    "op, wrong",
    [(op, w) for op in OPS for w in WRONG[op]],
    ids=lambda v: v if isinstance(v, str) else ",".join(f"{k}={getattr(x, '__name__', x)}" for k, x in v.items()),
)
def test_a_wrong_reading_disagrees_with_the_reference(op, wrong):
    """The comparison can fail: each wrong reading gives other bits on the made inputs."""
    diffs = 0
    for args in made_cases(op):
        diffs += bool(_same(OB.apply(op, *args), ORACLES[op](*args, **wrong)))
    assert diffs, f"{op} with {wrong} agrees with the reference on every made input"
