"""Transformer ops, part A: embedding, linear, LayerNorm/RMSNorm, GELU/SiLU/
SwiGLU, AdamW, clipping, learning-rate schedule (spec chapters 10, 11, 12, 15).

Oracles (none of them refreplay code): PyTorch autograd in float64 and
central finite differences in float64 (``torch_oracle``), and step-by-step
float32 NumPy transcriptions of the spec's algorithms with an explicit flush
(``flush32``).  The transcriptions of the activations take tanh and sigmoid
from ``numerics.elementwise`` (chapter 2 is tested on its own); everything
composed around them is transcribed here.

Run as a script (``python tests/test_ops_a.py``) it prints one SHA-256 over
the outputs of every op on fixed inputs; the thread/process test compares
that digest across NUMBA_NUM_THREADS=1, 2 and this process.
"""

import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import torch_oracle as TO
from torch_oracle import autograd, bits, central_diff, flush32, rel_err
from refreplay import spec
from refreplay.errors import InputError
from refreplay.numerics import elementwise as EW
from refreplay.ops import activations as A
from refreplay.ops import embedding as E
from refreplay.ops import linear as L
from refreplay.ops import norms as NM
from refreplay.ops import optim as O

f32 = np.float32
EPS = f32(1e-5)  # f32(0x3727C5AC), the norms' default


def rand(rng, shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def same_bits(a, b):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return a.shape == b.shape and np.array_equal(bits(a), bits(b))


# ---- op table: refreplay forward/backward beside a float64 torch definition ------
#
# Each case: make(rng, tiny) -> list of float32 inputs;
#   ref_fwd(*inputs) -> output; ref_bwd(dout, *inputs) -> tuple of gradients;
#   torch_fn(*float64 tensors) -> output.

TOKENS_SMALL = np.array([[3, 1, 3], [0, 3, 2]], dtype=np.int32)


def _tokens(tiny):
    if tiny:
        return TOKENS_SMALL
    return np.random.default_rng(7).integers(0, 11, size=(3, 9)).astype(np.int32)


def _emb_case(tiny):
    tok = _tokens(tiny)
    V = 5 if tiny else 11
    return dict(
        make=lambda rng: [rand(rng, (V, 4 if tiny else 70))],
        fwd=lambda wte: E.embedding_forward(wte, tok),
        bwd=lambda d, wte: (E.embedding_backward(d, tok, V),),
        torch=lambda wte: wte[torch.from_numpy(tok.astype(np.int64))],
    )


def _ln_fwd(x, w, b):
    return NM.layernorm_forward(x, w, b, EPS)[0]


def _ln_bwd(d, x, w, b):
    _, mean, rstd = NM.layernorm_forward(x, w, b, EPS)
    return NM.layernorm_backward(d, x, w, mean, rstd)


def _rms_fwd(x, w):
    return NM.rmsnorm_forward(x, w, EPS)[0]


def _rms_bwd(d, x, w):
    _, rrms = NM.rmsnorm_forward(x, w, EPS)
    return NM.rmsnorm_backward(d, x, w, rrms)


def _rms_torch(x, w):
    return x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + float(EPS)) * w


CASES = {
    "embedding": _emb_case,
    "linear": lambda tiny: dict(
        make=lambda rng: [
            rand(rng, (4, 3) if tiny else (37, 29)),
            rand(rng, (2, 3) if tiny else (23, 29)),
            rand(rng, (2,) if tiny else (23,)),
        ],
        fwd=L.linear_forward,
        bwd=lambda d, x, W, b: L.linear_backward(d, x, W),
        torch=lambda x, W, b: x @ W.T + b,
    ),
    "layernorm": lambda tiny: dict(
        make=lambda rng: [
            rand(rng, (2, 3) if tiny else (19, 67), 2.0),
            rand(rng, (3,) if tiny else (67,)),
            rand(rng, (3,) if tiny else (67,)),
        ],
        fwd=_ln_fwd,
        bwd=_ln_bwd,
        torch=lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, float(EPS)),
    ),
    "rmsnorm": lambda tiny: dict(
        make=lambda rng: [rand(rng, (2, 3) if tiny else (19, 67), 2.0), rand(rng, (3,) if tiny else (67,))],
        fwd=_rms_fwd,
        bwd=_rms_bwd,
        torch=_rms_torch,
    ),
    "gelu": lambda tiny: dict(
        make=lambda rng: [rand(rng, (5,) if tiny else (7, 300), 3.0)],
        fwd=A.gelu_forward,
        bwd=lambda d, x: (A.gelu_backward(d, x),),
        torch=lambda x: F.gelu(x, approximate="tanh"),
    ),
    "silu": lambda tiny: dict(
        make=lambda rng: [rand(rng, (5,) if tiny else (7, 300), 3.0)],
        fwd=A.silu_forward,
        bwd=lambda d, x: (A.silu_backward(d, x),),
        torch=F.silu,
    ),
    "swiglu": lambda tiny: dict(
        make=lambda rng: [rand(rng, (5,) if tiny else (7, 300), 3.0), rand(rng, (5,) if tiny else (7, 300))],
        fwd=A.swiglu_forward,
        bwd=lambda d, a, b: A.swiglu_backward(d, a, b),
        torch=lambda a, b: F.silu(a) * b,
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_backward_matches_torch_autograd_float64(name):
    """[emb.bwd.c1] [linear.bwd.c1] [norm.layer.bwd.c1] [norm.rms.bwd.c1]
    [act.gelu.bwd.c1] [act.silu.bwd.c1] [act.swiglu.bwd.c1]: each gradient
    within 1e-4 normwise of float64 autograd on the same inputs; forwards
    ([emb.fwd.c1] [linear.fwd.c1] [norm.layer.fwd.c1] [norm.rms.fwd.c1]
    [act.gelu.fwd.c1] [act.silu.fwd.c1] [act.swiglu.fwd.c1]) within 1e-5."""
    case = CASES[name](tiny=False)
    rng = np.random.default_rng(sum(map(ord, name)))  # fixed per op
    inputs = case["make"](rng)
    out = case["fwd"](*inputs)
    dout = rand(rng, out.shape)
    want_out, want_grads = autograd(case["torch"], inputs, dout)
    assert rel_err(out, want_out) <= 1e-5, name
    grads = case["bwd"](dout, *inputs)
    assert len(grads) == len(want_grads)
    for k, (g, w) in enumerate(zip(grads, want_grads)):
        assert g.dtype == np.float32 and g.shape == w.shape
        err = rel_err(g, w)
        assert err <= 1e-4, f"{name} gradient {k}: normwise relative error {err:.2e}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_backward_matches_central_differences(name):
    """Every backward agrees with central differences of the float64
    definition on tiny shapes (independent of autograd): [emb.bwd.c1]
    [linear.bwd.c1] [norm.layer.bwd.c1] [norm.rms.bwd.c1] [act.gelu.bwd.c1]
    [act.silu.bwd.c1] [act.swiglu.bwd.c1]."""
    case = CASES[name](tiny=True)
    rng = np.random.default_rng(11)
    inputs = case["make"](rng)
    dout = rand(rng, case["fwd"](*inputs).shape)
    want = central_diff(case["torch"], inputs, dout)
    got = case["bwd"](dout, *inputs)
    for k, (g, w) in enumerate(zip(got, want)):
        err = rel_err(g, w)
        assert err <= 1e-4, f"{name} gradient {k}: normwise relative error {err:.2e}"


def test_oracle_detects_a_wrong_gradient():
    """The oracle comparison can fail: dropping the mean term of the
    LayerNorm backward ([norm.layer.bwd.c1] step 4) is far outside 1e-4."""
    rng = np.random.default_rng(3)
    x, w, b = rand(rng, (4, 8)), rand(rng, (8,)), rand(rng, (8,))
    dout = rand(rng, (4, 8))
    _, (want_dx, _, _) = autograd(lambda x, w, b: F.layer_norm(x, (8,), w, b, float(EPS)), [x, w, b], dout)
    out, mean, rstd = NM.layernorm_forward(x, w, b, EPS)
    dx, _, _ = NM.layernorm_backward(dout, x, w, mean, rstd)
    wrong = dx + (dout * w).mean(axis=1, keepdims=True) * rstd[:, None]
    assert rel_err(dx, want_dx) <= 1e-4 < rel_err(wrong, want_dx)


# ---- worked examples and float32 transcriptions -----------------------------------

MY_CHAPTERS = ("10-ops-embedding-linear.txt", "11-ops-norms.txt", "12-ops-activations.txt", "15-optim.txt")
MY_EXAMPLES = [
    (c.label, line, e, r) for c in spec.parse().values() if c.file in MY_CHAPTERS for line, e, r in c.examples
]


@pytest.mark.parametrize("label,line,expr,result", MY_EXAMPLES, ids=[f"{e[0]}:{e[1]}" for e in MY_EXAMPLES])
def test_hex_worked_example(label, line, expr, result):
    """The hex examples of chapters 10-12 and 15 reproduce bit for bit."""
    ok, msg = spec.run_example(expr, result)
    assert ok, f"[{label}] line {line}: {msg}"


def test_every_normative_clause_of_mine_has_an_example():
    """Every normative clause of these chapters has a hex example, except
    [optim.state.c1], which defines naming and order rather than an op (it
    is checked by the AdamW and clipping tests)."""
    labels = {
        c.label for c in spec.parse().values() if c.file in MY_CHAPTERS and c.normative and c.label != "optim.state.c1"
    }
    with_example = {lb for lb, *_ in MY_EXAMPLES}
    assert labels and labels <= with_example, sorted(labels - with_example)


def _seq_sum_rows(terms):
    """[red.sum.c1] over axis 0 in increasing index, from -0, in float32."""
    acc = np.full(terms.shape[1:], -0.0, dtype=np.float32)
    for t in terms:
        acc = flush32(acc + t)
    return acc if terms.shape[0] else np.zeros(terms.shape[1:], np.float32)


def _mean_op(s, C):
    return flush32(s * flush32(f32(1) / f32(C)))


def ln_forward_f32(x, w, b, eps):
    """[norm.layer.fwd.c1] transcribed step by step (rows vectorised)."""
    C = x.shape[1]
    mean = _mean_op(_seq_sum_rows(x.T), C)
    d = flush32(x - mean[:, None])
    var = _mean_op(_seq_sum_rows(flush32(d * d).T), C)
    rstd = flush32(f32(1) / flush32(np.sqrt(flush32(var + eps))))
    norm = flush32(d * rstd[:, None])
    return flush32(flush32(norm * w) + b), mean, rstd


def ln_backward_f32(dout, x, w, mean, rstd):
    """[norm.layer.bwd.c1] transcribed step by step."""
    C = x.shape[1]
    norm = flush32(flush32(x - mean[:, None]) * rstd[:, None])
    dnorm = flush32(dout * w)
    dnorm_mean = _mean_op(_seq_sum_rows(dnorm.T), C)
    dnorm_norm_mean = _mean_op(_seq_sum_rows(flush32(dnorm * norm).T), C)
    t = flush32(flush32(dnorm - dnorm_mean[:, None]) - flush32(norm * dnorm_norm_mean[:, None]))
    dx = flush32(t * rstd[:, None])
    return dx, _seq_sum_rows(flush32(dout * norm)), _seq_sum_rows(dout)


def rms_forward_f32(x, w, eps):
    """[norm.rms.fwd.c1] transcribed."""
    ms = _mean_op(_seq_sum_rows(flush32(x * x).T), x.shape[1])
    rrms = flush32(f32(1) / flush32(np.sqrt(flush32(ms + eps))))
    return flush32(flush32(x * rrms[:, None]) * w), rrms


def rms_backward_f32(dout, x, w, rrms):
    """[norm.rms.bwd.c1] transcribed."""
    norm = flush32(x * rrms[:, None])
    dnorm = flush32(dout * w)
    m = _mean_op(_seq_sum_rows(flush32(dnorm * norm).T), x.shape[1])
    dx = flush32(flush32(dnorm - flush32(norm * m[:, None])) * rrms[:, None])
    return dx, _seq_sum_rows(flush32(dout * norm))


def test_norms_equal_float32_transcription():
    """[norm.meanop.c1] [norm.layer.fwd.c1] [norm.layer.bwd.c1]
    [norm.rms.fwd.c1] [norm.rms.bwd.c1] bit for bit, C spanning two column
    blocks of the dw kernels, rows with a constant value and with zeros."""
    rng = np.random.default_rng(5)
    x = rand(rng, (9, 300), 3.0)
    x[1] = f32(0.1)  # the constant row of [norm.meanop.c1]
    x[2] = 0.0
    w, b, dout = rand(rng, (300,)), rand(rng, (300,)), rand(rng, (9, 300))
    got = NM.layernorm_forward(x, w, b, EPS)
    want = ln_forward_f32(x, w, b, EPS)
    assert all(same_bits(g, h) for g, h in zip(got, want))
    assert not np.all(got[0][1] == b)  # the constant row is not exactly b
    assert all(
        same_bits(g, h)
        for g, h in zip(NM.layernorm_backward(dout, x, w, got[1], got[2]), ln_backward_f32(dout, x, w, got[1], got[2]))
    )
    got = NM.rmsnorm_forward(x, w, EPS)
    assert all(same_bits(g, h) for g, h in zip(got, rms_forward_f32(x, w, EPS)))
    assert all(
        same_bits(g, h) for g, h in zip(NM.rmsnorm_backward(dout, x, w, got[1]), rms_backward_f32(dout, x, w, got[1]))
    )


GELU_S, GELU_K, GELU_K3 = TO.f32(0x3F4C422A), TO.f32(0x3D372713), TO.f32(0x3E095D4F)


@np.errstate(invalid="ignore", over="ignore")  # inf*0 and overflow are cases under test
def test_activations_equal_float32_transcription():
    """[act.gelu.fwd.c1] [act.gelu.bwd.c1] [act.silu.fwd.c1] [act.silu.bwd.c1]
    [act.swiglu.fwd.c1] [act.swiglu.bwd.c1] bit for bit on random values and
    the special cases (±0, ±inf, NaN, huge and tiny magnitudes)."""
    rng = np.random.default_rng(9)
    x = rand(rng, (400,), 4.0)
    x[:12] = np.array(
        [
            0x00000000,
            0x80000000,
            0x7F800000,
            0xFF800000,
            0x7FC00000,
            0x5F000000,
            0xDF000000,
            0x00800000,
            0xC1200000,
            0xC2C80000,
            0x42C80000,
            0x3F800000,
        ],
        np.uint32,
    ).view(np.float32)
    b, dout = rand(rng, (400,)), rand(rng, (400,))
    one, half = f32(1), f32(0.5)
    fl = flush32
    cube = fl(fl(fl(GELU_K * x) * x) * x)
    th = EW.tanh(fl(GELU_S * fl(x + cube)))
    assert same_bits(A.gelu_forward(x), fl(fl(half * x) * fl(one + th)))
    sech2 = fl(one - fl(th * th))
    dinner = fl(GELU_S * fl(one + fl(fl(GELU_K3 * x) * x)))
    local = fl(fl(half * fl(one + th)) + fl(fl(fl(half * x) * sech2) * dinner))
    assert same_bits(A.gelu_backward(dout, x), fl(dout * local))
    s = EW.sigmoid(x)
    assert same_bits(A.silu_forward(x), fl(x * s))
    dsilu = fl(s * fl(one + fl(x * fl(one - s))))
    assert same_bits(A.silu_backward(dout, x), fl(dout * dsilu))
    assert same_bits(A.swiglu_forward(x, b), fl(fl(x * s) * b))
    da, db = A.swiglu_backward(dout, x, b)
    assert same_bits(da, fl(fl(dout * b) * dsilu)) and same_bits(db, fl(dout * fl(x * s)))


@pytest.mark.slow
@np.errstate(invalid="ignore", over="ignore")
def test_activations_dense_sweep_equal_transcription():
    """[act.gelu.fwd.c1] [act.gelu.bwd.c1] [act.silu.fwd.c1] [act.silu.bwd.c1]
    on every 251st binary32 bit pattern (about 17 million values, loaded so
    subnormals are zero): the ops equal the float32 transcription."""
    x = flush32(np.arange(0, 2**32, 251, dtype=np.uint64).astype(np.uint32).view(np.float32))
    dout = np.ones_like(x)
    one, half, fl = f32(1), f32(0.5), flush32
    th = EW.tanh(fl(GELU_S * fl(x + fl(fl(fl(GELU_K * x) * x) * x))))
    assert same_bits(A.gelu_forward(x), fl(fl(half * x) * fl(one + th)))
    local = fl(
        fl(half * fl(one + th))
        + fl(fl(fl(half * x) * fl(one - fl(th * th))) * fl(GELU_S * fl(one + fl(fl(GELU_K3 * x) * x))))
    )
    assert same_bits(A.gelu_backward(dout, x), fl(dout * local))
    s = EW.sigmoid(x)
    assert same_bits(A.silu_forward(x), fl(x * s))
    assert same_bits(A.silu_backward(dout, x), fl(dout * fl(s * fl(one + fl(x * fl(one - s))))))


def test_gelu_cube3_constant_is_the_rounded_coefficient():
    """[act.gelu.bwd.c1]: K3 is the binary32 nearest 3*0.044715, and differs
    from mul(3, K) (so an implementation that computes it fails)."""
    assert TO.bits(np.float32(3 * 0.044715)) == 0x3E095D4F
    assert TO.bits(f32(3) * GELU_K) == 0x3E095D4E


def test_linear_equals_float32_loops():
    """[linear.fwd.c1] [linear.bwd.c1]: bias added after the full sum; dW and
    db summed over tokens in increasing n (transcribed with flush32)."""
    rng = np.random.default_rng(2)
    x, W, b, dy = rand(rng, (13, 5)), rand(rng, (4, 5)), rand(rng, (4,)), rand(rng, (13, 4))
    s = _seq_sum_rows(flush32(x[None, :, :] * W[:, None, :]).transpose(2, 1, 0))  # over c
    assert same_bits(L.linear_forward(x, W, b), flush32(s + b))
    assert same_bits(L.linear_forward(x, W), s)
    dx, dW, db = L.linear_backward(dy, x, W)
    assert same_bits(dx, _seq_sum_rows(flush32(dy.T[:, :, None] * W[:, None, :])))
    assert same_bits(dW, _seq_sum_rows(flush32(dy[:, :, None] * x[:, None, :])))
    assert same_bits(db, _seq_sum_rows(dy))
    assert L.linear_backward(dy, x, W, has_bias=False)[2] is None


def test_embedding_backward_order_and_zero_signs():
    """[emb.bwd.c1]: per id, the sum in increasing flat index from -0; ids
    that never occur are +0; a -0 contribution alone stays -0."""
    rng = np.random.default_rng(4)
    tok = rng.integers(0, 6, size=(4, 25)).astype(np.int32)
    tok[tok == 5] = 0  # id 5 never occurs
    dout = rand(rng, (4, 25, 130))
    dout[tok == 4] = -0.0  # id 4 receives only -0
    got = E.embedding_backward(dout, tok, 7)
    flat_t, flat_d = tok.reshape(-1), dout.reshape(-1, 130)
    for v in range(7):
        rows = flat_d[flat_t == v]
        want = _seq_sum_rows(rows)
        assert same_bits(got[v], want), v
    assert np.all(bits(got[5]) == 0) and np.all(bits(got[6]) == 0)
    assert np.all(bits(got[4]) == 0x80000000)


# ---- optimizer ---------------------------------------------------------------------


def adamw_f32(p, g, m, v, t, lr, beta1, beta2, eps, wd):
    """[optim.adamw.c1] [optim.adamw.bias.c1] transcribed in float32 NumPy."""
    fl, one = flush32, f32(1)
    pow1, pow2 = beta1, beta2
    for _ in range(t - 1):
        pow1, pow2 = fl(pow1 * beta1), fl(pow2 * beta2)
    rbc1, rbc2 = fl(one / fl(one - pow1)), fl(one / fl(one - pow2))
    m2 = fl(fl(beta1 * m) + fl(fl(one - beta1) * g))
    v2 = fl(fl(beta2 * v) + fl(fl(fl(one - beta2) * g) * g))
    upd = fl(fl(m2 * rbc1) * fl(one / fl(np.sqrt(fl(v2 * rbc2)) + eps)))
    p2 = fl(p - fl(lr * fl(upd + fl(wd * p))))
    return p2, m2, v2


def _params(rng):
    return {"wte": rand(rng, (5, 3)), "ln.b": rand(rng, (3,)), "h.0.w": rand(rng, (2, 3, 2))}


def test_adamw_equals_float32_transcription_over_steps():
    """[optim.adamw.c1] [optim.adamw.bias.c1] [optim.state.c1]: eight steps
    on a small state, one tensor without decay, bit for bit; p, m, v updated
    in place, grads untouched; moments start at +0."""
    rng = np.random.default_rng(8)
    params = _params(rng)
    hp = O.AdamW(beta1=f32(0.9), beta2=f32(0.95), eps=f32(1e-8), weight_decay=f32(0.1))
    m, v = O.adamw_init(params)
    assert all(np.all(bits(a) == 0) for a in list(m.values()) + list(v.values()))
    shadow = {k: (params[k].copy(), m[k].copy(), v[k].copy()) for k in params}
    ids = {k: id(params[k]) for k in params}
    for t in range(1, 9):
        grads = {k: rand(rng, a.shape) for k, a in params.items()}
        keep = {k: g.copy() for k, g in grads.items()}
        lr = O.lr_at(t, 3, 8, f32(1e-3), f32(1e-4))
        O.adamw_step(params, grads, m, v, step=t, lr=lr, hp=hp, no_decay={"ln.b"})
        for k in params:
            wd = f32(0) if k == "ln.b" else hp.weight_decay
            shadow[k] = adamw_f32(*shadow[k][:1], keep[k], *shadow[k][1:], t, lr, hp.beta1, hp.beta2, hp.eps, wd)
            assert all(same_bits(a, b) for a, b in zip((params[k], m[k], v[k]), shadow[k])), (t, k)
            assert same_bits(grads[k], keep[k]) and id(params[k]) == ids[k]


def test_adamw_matches_torch_adamw_float64():
    """[optim.adamw.c1]: the same mathematics as torch.optim.AdamW (bias
    corrections, eps after the root, decoupled decay) within 1e-5 after
    twenty steps; the float32 reference differs only by rounding."""
    rng = np.random.default_rng(12)
    p = rand(rng, (50,))
    grads = [rand(rng, (50,)) for _ in range(20)]
    hp = O.AdamW()
    tp = torch.nn.Parameter(TO.t64(p))
    opt = torch.optim.AdamW(
        [tp],
        lr=float(f32(1e-2)),
        betas=(float(hp.beta1), float(hp.beta2)),
        eps=float(hp.eps),
        weight_decay=float(hp.weight_decay),
    )
    state = {"p": p.copy()}
    m, v = O.adamw_init(state)
    for t, g in enumerate(grads, 1):
        tp.grad = TO.t64(g)
        opt.step()
        O.adamw_step(state, {"p": g}, m, v, step=t, lr=f32(1e-2), hp=hp)
    assert rel_err(state["p"] - p, tp.detach().numpy() - p) <= 1e-4
    assert rel_err(state["p"], tp.detach().numpy()) <= 1e-5


def test_adamw_bias_correction_powers_flush():
    """[optim.adamw.bias.c1]: powers by repeated multiplication; a power that
    falls below 2^-126 flushes to +0 and the correction becomes exactly 1."""
    b1 = f32(0.5)
    r, _ = O.adamw_bias_corrections(b1, b1, 126)  # 2^-126 is normal
    assert TO.bits(f32(r)) == TO.bits(flush32(f32(1) / flush32(f32(1) - f32(2.0**-126))))
    r, _ = O.adamw_bias_corrections(b1, b1, 127)  # 2^-127 flushes to +0
    assert TO.bits(f32(r)) == 0x3F800000
    p = f32(0.9)
    for _ in range(6):
        p = flush32(p * f32(0.9))
    r1, _ = O.adamw_bias_corrections(f32(0.9), f32(0.95), 7)
    assert TO.bits(f32(r1)) == TO.bits(flush32(f32(1) / flush32(f32(1) - p)))


def clip_f32(grads, max_norm):
    """[optim.clip.c1] transcribed: scalar float32 loops, names sorted."""
    total = f32(-0.0) if grads else f32(0.0)
    for k in sorted(grads):
        flat = grads[k].reshape(-1)
        s = f32(-0.0) if flat.size else f32(0.0)
        for g in flat:
            s = flush32(s + flush32(g * g))
        total = flush32(total + s)
    norm = flush32(np.sqrt(total))
    coef = flush32(max_norm * flush32(f32(1) / flush32(norm + TO.f32(0x358637BD))))
    out = {k: (flush32(g * coef) if coef < 1 else g.copy()) for k, g in grads.items()}
    return out, norm, coef


@pytest.mark.parametrize("max_norm", [f32(0.5), f32(1e3)])
def test_clip_equals_float32_transcription(max_norm):
    """[optim.clip.c1] [optim.state.c1]: norm, coefficient and the scaled
    gradients bit for bit; with a large max_norm nothing changes."""
    rng = np.random.default_rng(13)
    grads = {"b": rand(rng, (7, 3)), "a": rand(rng, (40,)), "c.w": rand(rng, (2, 2, 2))}
    want, wnorm, wcoef = clip_f32(grads, max_norm)
    norm, coef = O.clip_grad_norm(grads, max_norm)
    assert TO.bits(norm) == TO.bits(wnorm) and TO.bits(coef) == TO.bits(wcoef)
    assert all(same_bits(grads[k], want[k]) for k in grads)
    assert (coef < 1) == (max_norm == f32(0.5))


def test_clip_order_is_sorted_names_then_tensor_order():
    """[optim.clip.c1]: partial sums are added in sorted name order, not dict
    insertion order.  One tensor's square is 1, four others' are 2^-24 each:
    with the 1 first, every 2^-24 is lost to rounding (norm 1); with it last,
    the small ones add up to 2^-22 first and norm = 1 + 2^-23."""
    tiny = np.array([2.0**-12], np.float32)  # square 2^-24, exact
    one = np.array([1.0], np.float32)
    first = {"e": tiny.copy(), "a": one.copy(), "c": tiny.copy(), "b": tiny.copy(), "d": tiny.copy()}
    norm, _ = O.clip_grad_norm(first, f32(10))
    assert TO.bits(norm) == 0x3F800000
    last = {"z": one.copy(), "e": tiny.copy(), "c": tiny.copy(), "b": tiny.copy(), "d": tiny.copy()}
    norm, _ = O.clip_grad_norm(last, f32(10))
    assert TO.bits(norm) == 0x3F800001


@np.errstate(invalid="ignore", over="ignore")
def test_clip_special_cases():
    """[optim.clip.c1]: overflowing norm scales by +0; NaN norm leaves the
    gradients alone; no tensors gives norm +0."""
    g = {"a": np.array([3e30, -1.0, np.inf], np.float32)}
    norm, coef = O.clip_grad_norm(g, f32(1))
    assert np.isinf(norm) and TO.bits(coef) == 0
    assert list(bits(g["a"])) == [0x00000000, 0x80000000, 0x7FC00000]
    g = {"a": np.array([np.nan, 2.0], np.float32)}
    norm, coef = O.clip_grad_norm(g, f32(1))
    assert np.isnan(norm) and np.isnan(coef) and g["a"][1] == 2.0
    norm, coef = O.clip_grad_norm({}, f32(1))
    assert TO.bits(norm) == 0 and coef > 1


def test_clip_matches_torch():
    """[optim.clip.c1] agrees with torch.nn.utils.clip_grad_norm_ in float64."""
    rng = np.random.default_rng(14)
    grads = {"x": rand(rng, (30,)), "y": rand(rng, (5, 6))}
    ts = [torch.nn.Parameter(TO.t64(np.zeros_like(grads[k]))) for k in sorted(grads)]
    for t, k in zip(ts, sorted(grads)):
        t.grad = TO.t64(grads[k])
    tnorm = torch.nn.utils.clip_grad_norm_(ts, 1.0)
    norm, _ = O.clip_grad_norm(grads, f32(1))
    assert abs(float(norm) - float(tnorm)) <= 1e-6 * float(tnorm)
    for t, k in zip(ts, sorted(grads)):
        assert rel_err(grads[k], t.grad.numpy()) <= 1e-6


LR_CASES = [  # (step, kind, bits) with W = 10, S = 100, 6e-4 -> 6e-5
    (1, "cosine", 0x387BA883),
    (5, "cosine", 0x399D4952),
    (10, "cosine", 0x3A1D4952),
    (11, "cosine", 0x3A1D3E48),
    (55, "cosine", 0x39AD03D9),
    (100, "cosine", 0x387BA882),
    (101, "cosine", 0x387BA882),
    (11, "linear", 0x3A1BB6AB),
    (55, "linear", 0x39AD03DA),
    (100, "linear", 0x387BA882),
    (11, "constant", 0x3A1D4952),
    (99, "constant", 0x3A1D4952),
]


@pytest.mark.parametrize("step,kind,want", LR_CASES)
def test_lr_schedule_hex(step, kind, want):
    """[optim.lr.c1] at chosen steps: exact bits, and a float32 transcription
    with the spec's cos, and the float64 formula within 1e-6."""
    lr_max, lr_min = f32(6e-4), f32(6e-5)
    got = O.lr_at(step, 10, 100, lr_max, lr_min, kind)
    assert isinstance(got, np.float32) and TO.bits(got) == want
    fl, one = flush32, f32(1)
    if step <= 10:
        t = fl(lr_max * fl(f32(step) * fl(one / f32(10))))
        exact = float(lr_max) * step / 10
    elif kind == "constant":
        t, exact = lr_max, float(lr_max)
    else:
        prog = min(fl(f32(step - 10) * fl(one / f32(90))), one)
        pe = min((step - 10) / 90, 1.0)
        if kind == "cosine":
            c = fl(f32(0.5) * fl(one + EW.cos(np.array([fl(TO.f32(0x40490FDB) * prog)]))[0]))
            ce = 0.5 * (1 + np.cos(np.pi * pe))
        else:
            c, ce = fl(one - prog), 1 - pe
        t = fl(lr_min + fl(c * fl(lr_max - lr_min)))
        exact = float(lr_min) + ce * (float(lr_max) - float(lr_min))
    assert TO.bits(t) == want
    assert abs(float(got) - exact) <= 1e-6 * exact


# ---- batch invariance ----------------------------------------------------------------


def _rows_ops(x, w, b, a2):
    """Per-row outputs and per-row gradients of every row-wise op on x [N, C]."""
    out_ln, mean, rstd = NM.layernorm_forward(x, w, b, EPS)
    dx_ln = NM.layernorm_backward(a2, x, w, mean, rstd)[0]
    out_rms, rrms = NM.rmsnorm_forward(x, w, EPS)
    dx_rms = NM.rmsnorm_backward(a2, x, w, rrms)[0]
    W = np.ascontiguousarray(np.outer(w[:9], b)).astype(np.float32)  # [9, C]
    y = L.linear_forward(x, W, w[:9].copy())
    dx_lin = L.linear_backward(np.ascontiguousarray(a2[:, :9]), x, W)[0]
    return [
        out_ln,
        dx_ln,
        out_rms,
        dx_rms,
        y,
        dx_lin,
        A.gelu_forward(x),
        A.gelu_backward(a2, x),
        A.silu_forward(x),
        A.silu_backward(a2, x),
        A.swiglu_forward(x, a2),
        *A.swiglu_backward(b * np.ones_like(x), x, a2),
    ]


def test_batch_invariance_per_token_ops():
    """Per-token outputs and input gradients of sequence s are bitwise the
    same alone and inside a batch of 4 at any position ([linear.batch.r1],
    [norm.batch.r1], [emb.batch.r1]): [emb.fwd.c1] [linear.fwd.c1]
    [linear.bwd.c1] [norm.layer.fwd.c1] [norm.layer.bwd.c1] [norm.rms.fwd.c1]
    [norm.rms.bwd.c1] and the activations."""
    rng = np.random.default_rng(21)
    B, T, C = 4, 6, 300
    x, a2 = rand(rng, (B, T, C)), rand(rng, (B, T, C))
    w, b = rand(rng, (C,)), rand(rng, (C,))
    full = _rows_ops(x.reshape(B * T, C), w, b, a2.reshape(B * T, C))
    for s in (0, 2):
        alone = _rows_ops(np.ascontiguousarray(x[s]), w, b, np.ascontiguousarray(a2[s]))
        for k, (f, a) in enumerate(zip(full, alone)):
            assert same_bits(f[s * T : (s + 1) * T], a), (s, k)
    wte = rand(rng, (20, C))
    tok = rng.integers(0, 20, size=(B, T)).astype(np.int32)
    full_e = E.embedding_forward(wte, tok)
    assert same_bits(full_e[2], E.embedding_forward(wte, tok[2:3])[0])


def test_batch_sums_continue_the_first_sequence():
    """What holds for dW, db, dw, dwte, which sum over all tokens: the batch
    [s0, s1] equals s0's own result continued term by term over s1's tokens
    in increasing index ([linear.batch.r1] [norm.batch.r1] [emb.batch.r1];
    [linear.bwd.c1] [norm.layer.bwd.c1] [norm.rms.bwd.c1] [emb.bwd.c1])."""
    rng = np.random.default_rng(22)
    T, C, OC = 7, 10, 6
    x, dy = rand(rng, (2 * T, C)), rand(rng, (2 * T, OC))
    W = rand(rng, (OC, C))

    def cont(acc, terms):
        for t in terms:
            acc = flush32(acc + t)
        return acc

    _, dW0, db0 = L.linear_backward(dy[:T].copy(), x[:T].copy(), W)
    _, dW, db = L.linear_backward(dy, x, W)
    assert same_bits(dW, cont(dW0, flush32(dy[T:, :, None] * x[T:, None, :])))
    assert same_bits(db, cont(db0, dy[T:]))

    w, b, d = rand(rng, (C,)), rand(rng, (C,)), rand(rng, (2 * T, C))
    _, mean, rstd = NM.layernorm_forward(x, w, b, EPS)
    _, dw0, db0 = NM.layernorm_backward(d[:T].copy(), x[:T].copy(), w, mean[:T].copy(), rstd[:T].copy())
    _, dw, dbb = NM.layernorm_backward(d, x, w, mean, rstd)
    norm1 = flush32(flush32(x[T:] - mean[T:, None]) * rstd[T:, None])
    assert same_bits(dw, cont(dw0, flush32(d[T:] * norm1))) and same_bits(dbb, cont(db0, d[T:]))
    _, rrms = NM.rmsnorm_forward(x, w, EPS)
    _, dw0 = NM.rmsnorm_backward(d[:T].copy(), x[:T].copy(), w, rrms[:T].copy())
    _, dw = NM.rmsnorm_backward(d, x, w, rrms)
    assert same_bits(dw, cont(dw0, flush32(d[T:] * flush32(x[T:] * rrms[T:, None]))))

    tok = np.array([[1, 2, 1, 0, 1, 2, 1], [2, 1, 1, 3, 2, 1, 0]], np.int32)
    de = rand(rng, (2, T, C))
    dwte0 = E.embedding_backward(de[:1].copy(), tok[:1].copy(), 4)
    dwte = E.embedding_backward(de, tok, 4)
    want = dwte0.copy()
    for t in range(T):
        v = tok[1, t]
        if not np.any(tok[0] == v) and not np.any(tok[1, :t] == v):
            want[v] = -0.0  # first occurrence: the sum starts from -0
        want[v] = flush32(want[v] + de[1, t])
    assert same_bits(dwte, want)


# ---- identical bits across threads and processes --------------------------------------


def all_ops_digest() -> str:
    """SHA-256 over the outputs of every op of this part on fixed inputs big
    enough that each parallel kernel splits its work."""
    rng = np.random.default_rng(1234)
    B, T, C, V, F_ = 3, 40, 300, 50, 700
    x, d = rand(rng, (B * T, C), 2.0), rand(rng, (B * T, C))
    w, b = rand(rng, (C,)), rand(rng, (C,))
    W, dy = rand(rng, (F_, C)), rand(rng, (B * T, F_))
    h, g = rand(rng, (B * T, F_), 3.0), rand(rng, (B * T, F_))
    tok = rng.integers(0, V, size=(B, T)).astype(np.int32)
    wte = rand(rng, (V, C))
    out = [E.embedding_forward(wte, tok), E.embedding_backward(d.reshape(B, T, C), tok, V)]
    out += [L.linear_forward(x, W, b[:1].repeat(F_)), *L.linear_backward(dy, x, W)]
    y, mean, rstd = NM.layernorm_forward(x, w, b, EPS)
    out += [y, mean, rstd, *NM.layernorm_backward(d, x, w, mean, rstd)]
    y, rrms = NM.rmsnorm_forward(x, w, EPS)
    out += [y, rrms, *NM.rmsnorm_backward(d, x, w, rrms)]
    out += [
        A.gelu_forward(h),
        A.gelu_backward(g, h),
        A.silu_forward(h),
        A.silu_backward(g, h),
        A.swiglu_forward(h, g),
        *A.swiglu_backward(g, h, g),
    ]
    params = {"wte": wte.copy(), "w": w.copy(), "W": W.copy()}
    grads = {"wte": out[1].copy(), "w": rand(rng, (C,)), "W": out[4].copy()}
    m, v = O.adamw_init(params)
    norm, coef = O.clip_grad_norm(grads, f32(0.5))
    for t in (1, 2):
        O.adamw_step(params, grads, m, v, step=t, lr=O.lr_at(t, 1, 10, f32(1e-3), f32(0)), no_decay={"w"})
    out += [np.array([norm, coef], np.float32)] + [a[k] for a in (params, m, v, grads) for k in sorted(a)]
    h_ = hashlib.sha256()
    for a in out:
        h_.update(np.ascontiguousarray(a, dtype=np.float32).tobytes())
    return h_.hexdigest()


def test_identical_bits_across_threads_and_processes():
    """Every op of chapters 10-12 and 15 gives the same digest in this
    process and in fresh processes with NUMBA_NUM_THREADS=1 and 2."""
    here = all_ops_digest()
    procs = [  # both at once: the compiled code is in the cache by now, each process mostly computes
        subprocess.Popen(
            [sys.executable, __file__],
            env=dict(os.environ, NUMBA_NUM_THREADS=n),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in ("1", "2")
    ]
    digests = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=600)
            assert p.returncode == 0, err[-2000:]
            digests.append(out.strip().splitlines()[-1])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert digests == [here, here]


# ---- argument validation ---------------------------------------------------------------


def test_validation_errors_are_clear():
    """Bad inputs raise InputError/TypeError/ValueError naming the problem,
    never a Numba typing error ([emb.fwd.c1] token range)."""
    wte = np.zeros((4, 3), np.float32)
    with pytest.raises(InputError, match="token id 4"):
        E.embedding_forward(wte, np.array([[0, 4]], np.int32))
    with pytest.raises(InputError, match="token id -1"):
        E.embedding_backward(np.zeros((1, 1, 3), np.float32), np.array([[-1]], np.int32), 4)
    with pytest.raises(TypeError, match="tokens must be int32"):
        E.embedding_forward(wte, np.array([[0]], np.int64))
    with pytest.raises(TypeError, match="x must be float32"):
        L.linear_forward(np.zeros((2, 3)), wte)
    with pytest.raises(ValueError, match="W must have shape"):
        L.linear_forward(np.zeros((2, 2), np.float32), wte)
    with pytest.raises(ValueError, match="C-contiguous"):
        NM.rmsnorm_forward(np.zeros((3, 4), np.float32).T, np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="not exactly representable"):
        NM.layernorm_forward(np.zeros((1, 3), np.float32), *np.zeros((2, 3), np.float32), eps=1e-5)
    with pytest.raises(ValueError, match="expected"):
        A.swiglu_forward(np.zeros(3, np.float32), np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="step must be"):
        O.lr_at(0, 1, 10, f32(1), f32(0))
    with pytest.raises(ValueError, match="warmup < total"):
        O.lr_at(1, 10, 10, f32(1), f32(0))
    with pytest.raises(ValueError, match="exactly the names"):
        O.adamw_step({"a": np.zeros(2, np.float32)}, {}, {}, {}, step=1, lr=f32(1))


if __name__ == "__main__":
    print(all_ops_digest())
