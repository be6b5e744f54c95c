"""The transformer ops of ``refreplay.ops`` as conformance entries.

Each entry fixes a calling convention with tensors only (a scalar
hyper-parameter or result becomes a length-1 tensor), random inputs at the
shapes of the model presets of [model.config.c1] ("tiny": C = 32, NH = 2,
HS = 16, T = 32, F = 128, V = 256) and at odd sizes, and the reference call.
Inputs a backward takes from its forward (a norm's mean and rstd, the
attention probabilities, a softmax output) are produced by the reference
forward, so every case is a state the forward can reach.
"""

from __future__ import annotations

import numpy as np

from ..inputs import model as P
from ..inputs import values as V
from .opdef import OPS, OpDef

F32 = np.float32


def _ops(module):
    import importlib

    return importlib.import_module(f"refreplay.ops.{module}")


def _r(rng, shape, lo=-3, hi=1):
    return V.random_f32(rng, shape, lo, hi)


def _entry(name, clauses, signature, inputs, outputs, reference, make, shapes, *extra):
    """``extra``: builders ``rng -> [(family, inputs, note)]`` of the op's edge,
    empty and sweep cases (``model_probes``), drawn after the random cases."""

    def build(op, rng):
        return [("random", make(rng, *s), f"shape {s}") for s in shapes] + [c for e in extra for c in e(rng)]

    OPS[name] = OpDef(name, tuple(clauses), signature, inputs, outputs, reference, build)
    RANDOM[name] = (make, shapes)


RANDOM: dict = {}  # op -> (make(rng, *shape) -> inputs, shapes): the random cases, reused by table/bf16.py


# ---- activations ------------------------------------------------------------------

ELEM_SHAPES = ((1,), (7,), (4, 32), (3, 128), (2, 5, 13))

for _act in ("gelu", "silu"):
    _entry(
        f"{_act}_forward",
        [f"act.{_act}.fwd.c1"],
        f"{_act}_forward(x: f32[...]) -> out: f32[...]",
        ("x",),
        ("out",),
        lambda x, a=_act: getattr(_ops("activations"), f"{a}_forward")(x),
        lambda rng, *s: {"x": V.uniform_f32(rng, s, -6, 6)},
        ELEM_SHAPES,
        P.unary_act_edges,
    )
    _entry(
        f"{_act}_backward",
        [f"act.{_act}.bwd.c1"],
        f"{_act}_backward(dout: f32[...], x: f32[...]) -> dx: f32[...]",
        ("dout", "x"),
        ("dx",),
        lambda d, x, a=_act: getattr(_ops("activations"), f"{a}_backward")(d, x),
        lambda rng, *s: {"dout": _r(rng, s), "x": V.uniform_f32(rng, s, -6, 6)},
        ELEM_SHAPES,
        P.act_backward_edges,
    )

_entry(
    "swiglu_forward",
    ["act.swiglu.fwd.c1"],
    "swiglu_forward(a: f32[...], b: f32[...]) -> out: f32[...]",
    ("a", "b"),
    ("out",),
    lambda a, b: _ops("activations").swiglu_forward(a, b),
    lambda rng, *s: {"a": V.uniform_f32(rng, s, -6, 6), "b": _r(rng, s)},
    ELEM_SHAPES,
    P.swiglu_forward_edges,
)
_entry(
    "swiglu_backward",
    ["act.swiglu.bwd.c1"],
    "swiglu_backward(dout, a, b: f32[...]) -> (da, db: f32[...])",
    ("dout", "a", "b"),
    ("da", "db"),
    lambda d, a, b: _ops("activations").swiglu_backward(d, a, b),
    lambda rng, *s: {"dout": _r(rng, s), "a": V.uniform_f32(rng, s, -6, 6), "b": _r(rng, s)},
    ELEM_SHAPES,
    P.swiglu_backward_edges,
)

# ---- linear -------------------------------------------------------------------------

LIN_SHAPES = ((1, 1, 1), (5, 7, 3), (64, 32, 128), (64, 128, 32), (17, 33, 96))  # N, C, OC

_entry(
    "linear_forward",
    ["linear.fwd.c1", "mm.nt.c1", "mm.bias.c1"],
    "linear_forward(x: f32[N, C], W: f32[OC, C], b: f32[OC]) -> y: f32[N, OC]",
    ("x", "W", "b"),
    ("y",),
    lambda x, W, b: _ops("linear").linear_forward(x, W, b),
    lambda rng, n, c, o: {"x": _r(rng, (n, c)), "W": _r(rng, (o, c)), "b": _r(rng, (o,))},
    LIN_SHAPES,
    P.linear_forward_edges,
)
_entry(
    "linear_backward",
    ["linear.bwd.c1", "mm.nn.c1", "mm.tn.c1", "red.colsum.c1"],
    "linear_backward(dy: f32[N, OC], x: f32[N, C], W: f32[OC, C]) -> (dx: f32[N, C], dW: f32[OC, C], db: f32[OC])",
    ("dy", "x", "W"),
    ("dx", "dW", "db"),
    lambda dy, x, W: _ops("linear").linear_backward(dy, x, W, True),
    lambda rng, n, c, o: {"dy": _r(rng, (n, o)), "x": _r(rng, (n, c)), "W": _r(rng, (o, c))},
    LIN_SHAPES,
    P.linear_backward_edges,
)

# ---- norms ----------------------------------------------------------------------------

NORM_SHAPES = ((1, 1), (3, 7), (64, 32), (16, 256), (5, 33))  # N, C


def _ln_back_inputs(rng, n, c):
    x, w, b = _r(rng, (n, c), -2, 2), _r(rng, (c,), -1, 1), _r(rng, (c,))
    _, mean, rstd = _ops("norms").layernorm_forward(x, w, b)
    return {"dout": _r(rng, (n, c)), "x": x, "w": w, "mean": mean, "rstd": rstd}


def _rms_back_inputs(rng, n, c):
    x, w = _r(rng, (n, c), -2, 2), _r(rng, (c,), -1, 1)
    _, rrms = _ops("norms").rmsnorm_forward(x, w)
    return {"dout": _r(rng, (n, c)), "x": x, "w": w, "rrms": rrms}


_entry(
    "layernorm_forward",
    ["norm.layer.fwd.c1", "norm.meanop.c1"],
    "layernorm_forward(x: f32[N, C], w: f32[C], b: f32[C]) -> (out: f32[N, C], mean: f32[N], rstd: f32[N]); eps 1e-5",
    ("x", "w", "b"),
    ("out", "mean", "rstd"),
    lambda x, w, b: _ops("norms").layernorm_forward(x, w, b),
    lambda rng, n, c: {"x": _r(rng, (n, c), -2, 2), "w": _r(rng, (c,), -1, 1), "b": _r(rng, (c,))},
    NORM_SHAPES,
    lambda rng: P.norm_edges(rng, "layer"),
    lambda rng: P.norm_sweeps(rng, "layer"),
)
_entry(
    "layernorm_backward",
    ["norm.layer.bwd.c1"],
    "layernorm_backward(dout, x: f32[N, C], w: f32[C], mean, rstd: f32[N]) -> (dx: f32[N, C], dw, db: f32[C])",
    ("dout", "x", "w", "mean", "rstd"),
    ("dx", "dw", "db"),
    lambda d, x, w, m, r: _ops("norms").layernorm_backward(d, x, w, m, r),
    _ln_back_inputs,
    NORM_SHAPES,
    lambda rng: P.norm_backward_edges(rng, "layer"),
    lambda rng: P.norm_sweeps(rng, "layer", True),
)
_entry(
    "rmsnorm_forward",
    ["norm.rms.fwd.c1", "norm.meanop.c1"],
    "rmsnorm_forward(x: f32[N, C], w: f32[C]) -> (out: f32[N, C], rrms: f32[N]); eps 1e-5",
    ("x", "w"),
    ("out", "rrms"),
    lambda x, w: _ops("norms").rmsnorm_forward(x, w),
    lambda rng, n, c: {"x": _r(rng, (n, c), -2, 2), "w": _r(rng, (c,), -1, 1)},
    NORM_SHAPES,
    lambda rng: P.norm_edges(rng, "rms"),
    lambda rng: P.norm_sweeps(rng, "rms"),
)
_entry(
    "rmsnorm_backward",
    ["norm.rms.bwd.c1"],
    "rmsnorm_backward(dout, x: f32[N, C], w: f32[C], rrms: f32[N]) -> (dx: f32[N, C], dw: f32[C])",
    ("dout", "x", "w", "rrms"),
    ("dx", "dw"),
    lambda d, x, w, r: _ops("norms").rmsnorm_backward(d, x, w, r),
    _rms_back_inputs,
    NORM_SHAPES,
    lambda rng: P.norm_backward_edges(rng, "rms"),
    lambda rng: P.norm_sweeps(rng, "rms", True),
)

# ---- softmax ----------------------------------------------------------------------------

SOFTMAX_SHAPES = ((1, 1), (3, 7), (32, 32), (4, 256), (2, 257))  # N, V

for _fn, _c in (("softmax", "softmax.fwd.c1"), ("log_softmax", "softmax.log.c1")):
    _entry(
        f"{_fn}_forward",
        [_c],
        f"{_fn}_forward(x: f32[N, V]) -> y: f32[N, V]",
        ("x",),
        ("y",),
        lambda x, f=_fn: getattr(_ops("softmax"), f"{f}_forward")(x),
        lambda rng, n, v: {"x": _r(rng, (n, v), -4, 3)},
        SOFTMAX_SHAPES,
        P.softmax_edges,
        lambda rng, log=_fn == "log_softmax": P.softmax_sweeps(rng, log=log),
    )

    def _sm_back(rng, n, v, f=_fn):
        y = getattr(_ops("softmax"), f"{f}_forward")(_r(rng, (n, v), -4, 3))
        return {"dy": _r(rng, (n, v)), "y": y}

    _entry(
        f"{_fn}_backward",
        ["softmax.bwd.c1" if _fn == "softmax" else "softmax.log.bwd.c1"],
        f"{_fn}_backward(dy: f32[N, V], y: f32[N, V]) -> dx: f32[N, V]  (y: the forward's output)",
        ("dy", "y"),
        ("dx",),
        lambda dy, y, f=_fn: getattr(_ops("softmax"), f"{f}_backward")(dy, y),
        _sm_back,
        SOFTMAX_SHAPES,
        lambda rng, log=_fn == "log_softmax": P.softmax_backward_edges(rng, log),
        lambda rng, log=_fn == "log_softmax": P.softmax_sweeps(rng, True, log),
    )

# ---- attention and rotary embedding ------------------------------------------------------

ATT_SHAPES = ((1, 1, 1, 2), (1, 2, 5, 4), (2, 2, 32, 16), (1, 3, 17, 6))  # B, NH, T, HS


def _qkv(rng, b, nh, t, hs):
    return {n: _r(rng, (b, nh, t, hs), -3, 0) for n in ("q", "k", "v")}


def _att_back(rng, b, nh, t, hs):
    d = _qkv(rng, b, nh, t, hs)
    _, att = _ops("attention").attention_forward(d["q"], d["k"], d["v"])
    return {"dout": _r(rng, (b, nh, t, hs)), **d, "att": att}


_entry(
    "attention_forward",
    ["attn.scores.c1", "attn.mask.c1", "attn.out.c1"],
    "attention_forward(q, k, v: f32[B, NH, T, HS]) -> (out: f32[B, NH, T, HS], att: f32[B, NH, T, T])  (causal)",
    ("q", "k", "v"),
    ("out", "att"),
    lambda q, k, v: _ops("attention").attention_forward(q, k, v),
    _qkv,
    ATT_SHAPES,
    P.attention_edges,
    P.attention_sweeps,
)
_entry(
    "attention_backward",
    ["attn.bwd.c1"],
    "attention_backward(dout, q, k, v: f32[B, NH, T, HS], att: f32[B, NH, T, T]) -> (dq, dk, dv: f32[B, NH, T, HS])",
    ("dout", "q", "k", "v", "att"),
    ("dq", "dk", "dv"),
    lambda d, q, k, v, a: _ops("attention").attention_backward(d, q, k, v, a),
    _att_back,
    ATT_SHAPES,
    P.attention_backward_edges,
    lambda rng: P.attention_sweeps(rng, True),
)


def _rope_in(name):
    def make(rng, b, nh, t, hs):
        cos_t, sin_t = _ops("rope").rope_tables(t, hs)
        return {name: _r(rng, (b, nh, t, hs), -2, 1), "cos_t": cos_t, "sin_t": sin_t}

    return make


_entry(
    "rope_forward",
    ["rope.fwd.c1", "rope.freq.c1"],
    "rope_forward(x: f32[B, NH, T, HS], cos_t, sin_t: f32[T, HS/2]) -> out: f32[B, NH, T, HS]",
    ("x", "cos_t", "sin_t"),
    ("out",),
    lambda x, c, s: _ops("rope").rope_forward(x, c, s),
    _rope_in("x"),
    ATT_SHAPES,
    lambda rng: P.rope_edges(rng, "x"),
)
_entry(
    "rope_backward",
    ["rope.bwd.c1"],
    "rope_backward(dout: f32[B, NH, T, HS], cos_t, sin_t: f32[T, HS/2]) -> dx: f32[B, NH, T, HS]",
    ("dout", "cos_t", "sin_t"),
    ("dx",),
    lambda d, c, s: _ops("rope").rope_backward(d, c, s),
    _rope_in("dout"),
    ATT_SHAPES,
    lambda rng: P.rope_edges(rng, "dout"),
)

# ---- embedding and loss ---------------------------------------------------------------------

EMB_SHAPES = ((1, 1, 1, 1), (2, 5, 7, 11), (4, 32, 32, 256))  # B, T, C, V


def _tokens(rng, b, t, v):
    return rng.integers(0, v, (b, t)).astype(np.int32)


_entry(
    "embedding_forward",
    ["emb.fwd.c1"],
    "embedding_forward(wte: f32[V, C], tokens: i32[B, T]) -> out: f32[B, T, C]",
    ("wte", "tokens"),
    ("out",),
    lambda w, tk: _ops("embedding").embedding_forward(w, tk),
    lambda rng, b, t, c, v: {"wte": _r(rng, (v, c)), "tokens": _tokens(rng, b, t, v)},
    EMB_SHAPES,
    P.embedding_forward_edges,
)
_entry(
    "embedding_backward",
    ["emb.bwd.c1"],
    "embedding_backward(dout: f32[B, T, C], tokens: i32[B, T], V: i32[1]) -> dwte: f32[V, C]",
    ("dout", "tokens", "V"),
    ("dwte",),
    lambda d, tk, vv: _ops("embedding").embedding_backward(d, tk, int(vv[0])),
    lambda rng, b, t, c, v: {
        "dout": _r(rng, (b, t, c)),
        "tokens": _tokens(rng, b, t, max(1, v // 8)),
        "V": np.array([max(1, v // 8)], np.int32),
    },
    EMB_SHAPES,
    P.embedding_backward_edges,
)


def _ce_inputs(rng, n, v):
    t = rng.integers(0, v, n).astype(np.int32)
    t[rng.random(n) < 0.2] = -1  # ignored tokens
    return {"logits": _r(rng, (n, v), -4, 3), "targets": t}


CE_SHAPES = ((1, 1), (5, 7), (64, 256), (3, 257))  # N, V


def _ce_forward(logits, targets):
    losses, mean, _ = _ops("loss").cross_entropy_forward(logits, targets)
    return losses, np.array([mean], np.float32)


_entry(
    "cross_entropy_forward",
    ["loss.token.c1", "loss.mean.c1"],
    "cross_entropy_forward(logits: f32[N, V], targets: i32[N]) -> (losses: f32[N], mean: f32[1]); target -1 ignored",
    ("logits", "targets"),
    ("losses", "mean"),
    _ce_forward,
    _ce_inputs,
    CE_SHAPES,
    P.ce_edges,
    P.ce_sweeps,
)
_entry(
    "cross_entropy_backward",
    ["loss.bwd.c1"],
    "cross_entropy_backward(logits: f32[N, V], targets: i32[N]) -> dlogits: f32[N, V]  (of the mean loss)",
    ("logits", "targets"),
    ("dlogits",),
    lambda lg, t: _ops("loss").cross_entropy_backward(lg, t),
    _ce_inputs,
    CE_SHAPES,
    P.ce_edges,
    lambda rng: P.ce_sweeps(rng, True),
)

# ---- int8 quantization ------------------------------------------------------------------------

Q_SHAPES = ((1,), (7,), (32, 32), (128, 33))


def _step(x):
    return np.array([_ops("quant").step_size(x)], np.float32)


_entry(
    "quant_step_size",
    ["quant.step.c1"],
    "quant_step_size(x: f32[...]) -> s: f32[1]  (re-pinned step)",
    ("x",),
    ("s",),
    _step,
    lambda rng, *s: {"x": _r(rng, s, -4, 2)},
    Q_SHAPES,
    P.step_size_edges,
)
_entry(
    "fake_quantize",
    ["quant.quantize.c1", "quant.dequantize.c1"],
    "fake_quantize(x: f32[...], s: f32[1]) -> out: f32[...]",
    ("x", "s"),
    ("out",),
    lambda x, s: _ops("quant").fake_quantize(x, s[0]),
    lambda rng, *s: (lambda x: {"x": x, "s": _step(x) * F32(1.5)})(_r(rng, s, -4, 2)),
    Q_SHAPES,
    P.fake_quantize_edges,
)
_entry(
    "fake_quantize_backward",
    ["quant.ste.c1"],
    "fake_quantize_backward(dy: f32[...], x: f32[...], s: f32[1]) -> dx: f32[...]",
    ("dy", "x", "s"),
    ("dx",),
    lambda dy, x, s: _ops("quant").fake_quantize_backward(dy, x, s[0]),
    lambda rng, *s: (lambda x: {"dy": _r(rng, s), "x": x, "s": _step(x) * F32(1.5)})(_r(rng, s, -4, 2)),
    Q_SHAPES,
    P.fake_quantize_backward_edges,
)

# ---- optimizer ----------------------------------------------------------------------------------

OPT_SHAPES = ((1,), (7,), (32, 32), (1000,))


def _adamw(p, g, m, v, step, lr):
    return _ops("optim").adamw_update(p, g, m, v, int(step[0]), lr[0])


_entry(
    "adamw_update",
    ["optim.adamw.c1", "optim.adamw.bias.c1"],
    "adamw_update(p, g, m, v: f32[...], step: i32[1], lr: f32[1]) -> (p, m, v: f32[...])  (default hyper-parameters)",
    ("p", "g", "m", "v", "step", "lr"),
    ("p", "m", "v"),
    _adamw,
    lambda rng, *s: {
        "p": _r(rng, s, -3, 0),
        "g": _r(rng, s, -8, -2),
        "m": _r(rng, s, -10, -4),
        "v": V.random_f32(rng, s, -20, -10, positive=True),
        "step": np.array([int(rng.integers(1, 1000))], np.int32),
        "lr": V.random_f32(rng, (1,), -12, -8, positive=True),
    },
    OPT_SHAPES,
    P.adamw_edges,
)
