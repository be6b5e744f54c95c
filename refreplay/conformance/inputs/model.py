"""Edge, empty and sweep cases of the transformer ops (chapters 10-16).

Random inputs check a transformer op's arithmetic at ordinary values; a
misreading of a clause shows only where the clause says something special:
a branch, a clamp, a rounding tie, the sign of a zero, an ignored token, an
empty reduction, a hyper-parameter at a boundary, a NaN or an infinity.
Each builder here returns ``(family, inputs, note)`` triples that sit exactly
there; the notes say which rule each case pins.  Sweep cases give the long
reductions of these ops (``sweeps.py``).
"""

from __future__ import annotations

import numpy as np

from ..base import deviant as fp
from . import long_shapes as sweeps
from . import values as V

F32 = np.float32
NAN_INF = (0x7FC00000, 0xFFC00000, 0x7FC12345, 0x7F800000, 0xFF800000)


def _ops(module):
    import importlib

    return importlib.import_module(f"refreplay.ops.{module}")


def _r(rng, shape, lo=-3, hi=1):
    return V.random_f32(rng, shape, lo, hi)


def _specials():
    """The edge grid plus the values chapters 12-16 single out."""
    return np.concatenate(
        [
            V.edge_values(),
            fp.f32(
                [
                    0xC1200000,
                    0xC2C80000,
                    0x42C80000,
                    0xC2B00000,
                    0x3F400000,
                    0xBF400000,
                    0x3F4CCCCD,
                    0xBF4CCCCD,
                    0x3A800000,
                    0xBA800000,
                ]
            ),
        ]
    )


def _gelu_branch_points():
    """x whose tanh argument S*(x + K x^3) is near +-0.75, the branch
    boundary of [num.tanh.c1], and their neighbours."""
    s, k = 0.7978845608028654, 0.044715
    lo, hi = 0.0, 2.0
    for _ in range(80):  # bisection in float64, the same on every machine
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if s * (mid + k * mid**3) < 0.75 else (lo, mid)
    p = V.nearest([lo])[0]
    return V.neighbours([p, p | 0x80000000], 4)


# ---- activations -------------------------------------------------------------------------


def unary_act_edges(rng):
    x = np.concatenate([_specials(), _gelu_branch_points(), V.uniform_f32(rng, 512, -12, 12)])
    return [
        (
            "edge",
            {"x": x},
            "edge grid; large negative x where 1 + tanh and sigmoid reach +0; "
            "x where the tanh argument crosses the branch at 0.75",
        )
    ]


def _pairs_with(x, others):
    a, b = np.meshgrid(x, fp.f32(others), indexing="ij")
    return a.ravel().copy(), b.ravel().copy()


def act_backward_edges(rng):
    x, dout = _pairs_with(np.concatenate([_specials(), _gelu_branch_points()]), [0x3F800000, 0x80000000, 0xC0400000])
    out = [("edge", {"dout": dout, "x": x}, "edge grid of x with dout = 1, -0, -3")]
    xs = V.uniform_f32(rng, 16, -6, 6)
    x2, d2 = _pairs_with(xs, list(NAN_INF) + [0x00000000, 0x00400000])
    out.append(("edge", {"dout": d2, "x": x2}, "NaN, inf, +0 and subnormal upstream gradients"))
    return out


def swiglu_forward_edges(rng):
    a, b = _pairs_with(np.concatenate([_specials(), _gelu_branch_points()]), [0x40000000, 0x80000000, 0x7F800000])
    return [("edge", {"a": a, "b": b}, "edge grid of the gate with b = 2, -0, +inf")]


def swiglu_backward_edges(rng):
    a, b = _pairs_with(_specials(), [0x40000000, 0x80000000, 0xFF800000])
    d = np.where(np.arange(a.size) % 3 == 0, F32(-1.0), F32(1.0)).astype(F32)
    return [("edge", {"dout": d, "a": a, "b": b}, "edge grid of the gate with b = 2, -0, -inf")]


# ---- linear -----------------------------------------------------------------------------


def linear_forward_edges(rng):
    t = fp.f32
    return [
        (
            "edge",
            {
                "x": t(
                    [
                        [0x33800000, 0x33800000],
                        [0x80000000, 0x80000000],
                        [0x80000000, 0x3F800000],
                        [0x7F800000, 0x3F800000],
                        [0x7FC12345, 0x00000000],
                    ]
                ),
                "W": t([[0x3F800000, 0x3F800000], [0xBF800000, 0x80000000], [0x3F800000, 0x3F800000]]),
                "b": t([0x3F800000, 0x80000000, 0x00000000]),
            },
            "bias after the sum (2^-24 + 2^-24 + 1); sums of -0 products plus a -0 and a +0 bias; inf, NaN",
        ),
        (
            "edge",
            {
                "x": V.edge_values()[:160].reshape(10, 16).copy(),
                "W": _r(rng, (3, 16), -2, 2),
                "b": t([0x80000000, 0x7F800000, 0x3F800000]),
            },
            "edge grid in x; biases -0, +inf, 1",
        ),
        (
            "empty",
            {"x": np.zeros((3, 0), F32), "W": np.zeros((2, 0), F32), "b": t([0x80000000, 0x3F800000])},
            "C = 0: y = (+0, the empty sum) + b, so a -0 bias gives +0",
        ),
    ]


def linear_backward_edges(rng):
    t = fp.f32
    return [
        (
            "edge",
            {"dy": t([[0x3F800000], [0x33800000], [0x33800000]]), "x": t([[0x3F800000]] * 3), "W": t([[0x40000000]])},
            "the example of [linear.bwd.c1]: n increasing loses the 2^-24s",
        ),
        (
            "edge",
            {
                "dy": t([[0x80000000, 0x7F800000], [0x80000000, 0x3F800000]]),
                "x": t([[0x3F800000, 0x80000000, 0x7FC00000], [0x40000000, 0x80000000, 0x3F800000]]),
                "W": t([[0x80000000, 0x3F800000, 0x3F800000], [0x3F800000, 0xFF800000, 0x00000000]]),
            },
            "-0 gradients: sums of -0 products are -0; inf and NaN",
        ),
        (
            "empty",
            {"dy": np.zeros((0, 2), F32), "x": np.zeros((0, 3), F32), "W": _r(rng, (2, 3))},
            "N = 0 tokens: dW and db are empty sums, +0",
        ),
    ]


# ---- norms ------------------------------------------------------------------------------


def _norm_rows(rng, c):
    """Rows a misreading shows on: a constant row (variance 0: eps decides
    rstd), the 0.1 row of [norm.meanop.c1], zeros of both signs, a row with
    a tiny spread (eps inside vs outside the root), huge values (squares
    overflow), an infinity, a NaN, a subnormal beside FLT_MIN."""
    rows = [
        np.full(c, F32(0.1)),
        np.full(c, F32(-3.0)),
        np.zeros(c, F32),
        np.full(c, F32(-0.0)),
        F32(1.0) + _r(rng, c, -24, -20),
        _r(rng, c, 60, 66),
        _r(rng, c, -2, 2),
        _r(rng, c, -2, 2),
        _r(rng, c, -2, 2),
        _r(rng, c, -70, -60),
    ]
    rows[6][0] = np.inf
    rows[7][c // 2] = np.nan
    rows[8][:2] = fp.f32([0x00400001, 0x00800000])[:c]
    return np.stack(rows).astype(F32)


def norm_edges(rng, kind):
    out = []
    for c in (1, 3, 7):
        x = _norm_rows(rng, c)
        w = _r(rng, c, -1, 1)
        w[0] = F32(-0.0) if c > 1 else w[0]
        inputs = {"x": x, "w": w} if kind == "rms" else {"x": x, "w": w, "b": fp.f32([0x80000000] * c)}
        out.append(
            (
                "edge",
                inputs,
                f"C={c}: constant rows (variance 0), zeros, tiny spread, squares that "
                f"overflow, inf, NaN, subnormal; a -0 weight and bias",
            )
        )
    return out


def norm_backward_edges(rng, kind):
    out = []
    for c in (1, 3, 7):
        x = _norm_rows(rng, c)[[0, 2, 3, 4, 5, 6, 7]]
        w = _r(rng, c, -1, 1)
        dout = _r(rng, x.shape)
        dout[1] = F32(-0.0)
        if kind == "rms":
            _, rrms = _ops("norms").rmsnorm_forward(x, w)
            out.append(("edge", {"dout": dout, "x": x, "w": w, "rrms": rrms}, f"C={c}: rows as the forward's edges"))
        else:
            _, mean, rstd = _ops("norms").layernorm_forward(x, w, np.zeros(c, F32))
            out.append(
                (
                    "edge",
                    {"dout": dout, "x": x, "w": w, "mean": mean, "rstd": rstd},
                    f"C={c}: rows as the forward's edges",
                )
            )
    return out


def norm_sweeps(rng, kind, backward=False):
    out = []
    for c in sweeps.C_SWEEP:
        x, w = _r(rng, (2, c), -2, 2), _r(rng, (c,), -1, 1)
        if not backward:
            inputs = {"x": x, "w": w} if kind == "rms" else {"x": x, "w": w, "b": _r(rng, (c,))}
        elif kind == "rms":
            inputs = {"dout": _r(rng, (2, c)), "x": x, "w": w, "rrms": _ops("norms").rmsnorm_forward(x, w)[1]}
        else:
            _, mean, rstd = _ops("norms").layernorm_forward(x, w, np.zeros(c, F32))
            inputs = {"dout": _r(rng, (2, c)), "x": x, "w": w, "mean": mean, "rstd": rstd}
        out.append(("sweep", inputs, sweeps.note(f"N,C=2,{c}")))
    return out


# ---- softmax and cross-entropy ------------------------------------------------------------


def _softmax_rows(v):
    """Rows of length v that pin [softmax.fwd.c1]'s special cases."""
    t = np.float32
    rows = np.zeros((10, v), F32)
    rows[0] = -np.inf  # all -inf: a NaN row
    rows[1] = -np.inf
    rows[1][v // 2] = t(0.0)  # one finite element: exactly 1
    rows[2] = t(1.0)  # all equal
    rows[3][0] = np.inf  # +inf: a NaN row
    rows[4][v - 1] = np.nan
    rows[5] = np.linspace(-200, 0, v, dtype=F32)  # exp underflows to +0 for most
    rows[6] = np.linspace(0, 3, v, dtype=F32)
    rows[6][0] = -np.inf  # a -inf beside finite values gives +0
    rows[7] = fp.f32([0x80000000 if j % 2 else 0x00400000 for j in range(v)])  # -0 and subnormals
    rows[8] = np.linspace(-20000, -10200, v, dtype=F32)  # below a running maximum started at -10,000
    rows[9] = np.linspace(10001, 20000, v, dtype=F32)  # exp overflows without the maximum subtracted
    return rows


def softmax_edges(rng):
    out = [
        (
            "edge",
            {"x": _softmax_rows(v)},
            f"V={v}: all -inf; one finite; equal; +inf; NaN; underflow; "
            f"-inf beside finite; -0 and subnormals; rows below -10,000 "
            f"and above +10,000",
        )
        for v in (1, 2, 5)
    ]
    out.append(("edge", {"x": V.edge_values()[:160].reshape(10, 16).copy()}, "edge grid rows"))
    return out


def softmax_backward_edges(rng, log):
    out = []
    fwd = _ops("softmax").log_softmax_forward if log else _ops("softmax").softmax_forward
    for v in (1, 2, 5):
        y = fwd(_softmax_rows(v))
        dy = _r(rng, y.shape)
        dy[1] = F32(-0.0)
        dy[2, 0] = np.inf
        out.append(("edge", {"dy": dy, "y": y}, f"V={v}: the forward's edge rows; -0 and inf gradients"))
    return out


def softmax_sweeps(rng, backward=False, log=False):
    out = []
    fwd = _ops("softmax").log_softmax_forward if log else _ops("softmax").softmax_forward
    for v in sweeps.V_BACKWARD if backward else sweeps.V_SWEEP:
        x = _r(rng, (1, v), -4, 3)
        inputs = {"dy": _r(rng, (1, v)), "y": fwd(x)} if backward else {"x": x}
        out.append(("sweep", inputs, sweeps.note(f"N,V=1,{v}")))
    return out


def ce_edges(rng):
    t = fp.f32
    lg = np.zeros((9, 4), F32)
    lg[0] = t([0x00000000, 0xC3480000, 0xC3480000, 0xC3480000])  # target 0 dominates: loss exactly +0
    lg[1] = t([0x3F800000, 0x40000000, 0x40400000, 0x40800000])  # target V-1
    lg[2] = t([0xFF800000, 0x3F800000, 0x3F800000, 0x3F800000])  # -inf at the target: loss +inf
    lg[3] = t([0x3F800000, 0x7F800000, 0x3F800000, 0x3F800000])  # +inf: NaN
    lg[4] = t([0x7FC12345, 0x3F800000, 0x3F800000, 0x3F800000])  # NaN in an ignored row: loss +0
    lg[5] = t([0xFF800000] * 4)  # all -inf, ignored
    lg[6] = t([0x80000000, 0x00000000, 0x80000000, 0x00400000])  # zeros and a subnormal
    lg[7] = t([0x42C80000, 0x42C80000, 0xC2C80000, 0x42C80000])  # ties for the maximum
    lg[8] = _r(rng, 4, -4, 3)
    targets = np.array([0, 3, 0, 2, -1, -1, 1, 1, 2], np.int32)
    out = [
        (
            "edge",
            {"logits": lg, "targets": targets},
            "loss exactly +0; target V-1; -inf at the target; +inf; NaN and all -inf in ignored rows; "
            "zeros; a tied maximum; 7 counted tokens (recip(7) inexact)",
        )
    ]
    out.append(
        (
            "edge",
            {"logits": _r(rng, (3, 5), -4, 3), "targets": np.full(3, -1, np.int32)},
            "every token ignored: count 0, mean +0, gradient +0",
        )
    )
    far = np.stack([np.linspace(-20000, -10200, 5, dtype=F32), np.linspace(10001, 20000, 5, dtype=F32)])
    out.append(
        (
            "edge",
            {"logits": far, "targets": np.array([2, 4], np.int32)},
            "rows entirely below -10,000 and above +10,000 (a running maximum started at -10,000, "
            "or no maximum subtracted, fails)",
        )
    )
    for n in (1, 3, 6):
        targets = rng.integers(0, 5, n).astype(np.int32)
        out.append(
            ("edge", {"logits": _r(rng, (n, 5), -4, 3), "targets": targets}, f"{n} counted tokens, none ignored")
        )
    return out


def ce_sweeps(rng, backward=False):
    out = []
    for v in sweeps.V_BACKWARD if backward else sweeps.V_SWEEP:
        logits = _r(rng, (1, v), -4, 3)  # drawn before the target, as always
        target = np.array([int(rng.integers(0, v))], np.int32)
        out.append(("sweep", {"logits": logits, "targets": target}, sweeps.note(f"N,V=1,{v}")))
    return out


# ---- attention -----------------------------------------------------------------------------


def _attention_edge_inputs(rng):
    """(q, k, v) sets: HS = 3, 5, 6 (recip(sqrt(HS)) inexact), T = 1, a
    later key holding +inf and a later value holding NaN (must not reach
    earlier rows), scores large enough to overflow exp without the max
    shift, and -0 values (sums of -0 products)."""
    sets = []
    for hs in (3, 5, 6):
        sets.append({n: _r(rng, (1, 2, 4, hs), -3, 2) for n in ("q", "k", "v")})
    sets.append({n: _r(rng, (1, 1, 1, 2)) for n in ("q", "k", "v")})
    q, k, v = (_r(rng, (1, 1, 4, 2)) for _ in range(3))
    k[0, 0, 3, 0] = np.inf
    v[0, 0, 2, 1] = np.nan
    sets.append({"q": q, "k": k, "v": v})
    q, k = _r(rng, (1, 1, 5, 4), 5, 6), _r(rng, (1, 1, 5, 4), 5, 6)
    sets.append({"q": q, "k": k, "v": np.full((1, 1, 5, 4), F32(-0.0))})
    # every score finite and below -1e9 (q . k about -3.2e9, scaled by 1/sqrt(2)): a causal
    # mask filled with -1e9 instead of -inf ([attn.mask.c1]) outweighs them
    q = rng.uniform(40000, 41000, (1, 1, 4, 2)).astype(F32)
    k = -rng.uniform(40000, 41000, (1, 1, 4, 2)).astype(F32)
    sets.append({"q": q, "k": k, "v": _r(rng, (1, 1, 4, 2))})
    return sets


def attention_edges(rng):
    return [
        ("edge", s, "HS 3, 5, 6; T = 1; inf and NaN at later positions; large scores; -0 values; scores below -1e9")
        for s in _attention_edge_inputs(rng)
    ]


def attention_backward_edges(rng):
    out = []
    for s in _attention_edge_inputs(rng):
        _, att = _ops("attention").attention_forward(s["q"], s["k"], s["v"])
        dout = _r(rng, s["q"].shape)
        dout.reshape(-1)[0] = F32(-0.0)
        out.append(("edge", {"dout": dout, **s, "att": att}, "the forward's edge inputs"))
    out.append(("edge", dz_rounds_up_to_normal(), "dz rounds up to 2^-126 before its flush: dq = 2^-106"))
    return out


def dz_rounds_up_to_normal():
    """[attn.bwd.c1] [num.flush.c1] HS = 64 (scale 2^-3), q = 0 (att[1] = [1/2, 1/2]),
    dout[1, 0] = (2^24 - 1) * 2^-145, v[0, 0] = 1: ds[1, 0] = (2^24 - 1) * 2^-147, and the
    exact dz = (2^24 - 1) * 2^-150 rounds (to even) up to 2^-126, which the flush keeps;
    k[0, 5] = 2^20 makes dq[1, 5] = 2^-106.  A kernel that forms ds * scale in binary64 and
    flushes it before rounding gives 0 there."""
    q = np.zeros((1, 1, 2, 64), F32)
    k, v, dout = np.zeros_like(q), np.zeros_like(q), np.zeros_like(q)
    k[0, 0, 0, 5] = F32(2.0**20)
    v[0, 0, 0, 0] = F32(1.0)
    dout[0, 0, 1, 0] = F32((2**24 - 1) * 2.0**-145)
    _, att = _ops("attention").attention_forward(q, k, v)
    return {"dout": dout, "q": q, "k": k, "v": v, "att": att}


def dz_rounds_up_to_normal_bf16():
    """The same edge with bf16 inputs (8-bit significands), as the bf16 profile's
    binary32 inputs before encoding: HS = 64, q[1, 0] = 1, k[0, 0] = -1/8 (scores
    [-2^-6, 0], att[1, 0] = 0x3EFE0003 from the forward), dout[1, 1] = 226 * 2^-68 and
    v[0, 1] = 145 * 2^-68, every product normal.  Then dp[0] = 32770 * 2^-136 and
    ds[1, 0] = (2^24 - 1) * 2^-147 (found by search: a bf16 dp times att must
    round to the one binary32 ds whose product with 2^-3 lies in the window), so dz
    rounds up to 2^-126 and k[0, 2] = 2^20 makes dq[1, 2] = 2^-106.  The forward's
    att is added by the caller (the bf16 forward's)."""
    q = np.zeros((1, 1, 2, 64), F32)
    k, v, dout = np.zeros_like(q), np.zeros_like(q), np.zeros_like(q)
    q[0, 0, 1, 0] = F32(1.0)
    k[0, 0, 0, 0] = F32(-0.125)
    k[0, 0, 0, 2] = F32(2.0**20)
    v[0, 0, 0, 1] = F32(145 * 2.0**-68)
    dout[0, 0, 1, 1] = F32(226 * 2.0**-68)
    return {"dout": dout, "q": q, "k": k, "v": v}


def attention_sweeps(rng, backward=False):
    out = []
    for t in sweeps.T_BACKWARD if backward else sweeps.T_SWEEP:
        s = {n: _r(rng, (1, 1, t, 2), -3, 1) for n in ("q", "k", "v")}
        if backward:
            _, att = _ops("attention").attention_forward(s["q"], s["k"], s["v"])
            s = {"dout": _r(rng, (1, 1, t, 2)), **s, "att": att}
        out.append(("sweep", s, sweeps.note(f"B,NH,T,HS=1,1,{t},2")))
    return out


# ---- rotary embedding, embedding -----------------------------------------------------------


def rope_edges(rng, name):
    x = V.edge_values()[:160].reshape(1, 2, 20, 4).copy()
    cos_t, sin_t = _ops("rope").rope_tables(20, 4)
    c2, s2 = cos_t.copy(), sin_t.copy()
    c2[3], s2[3] = fp.f32([0x80000000, 0x7F800000]), fp.f32([0x7FC12345, 0x00400000])
    return [
        ("edge", {name: x, "cos_t": cos_t, "sin_t": sin_t}, "edge grid"),
        (
            "edge",
            {name: _r(rng, (1, 1, 20, 4)), "cos_t": c2, "sin_t": s2},
            "-0, inf, NaN and a subnormal in the tables",
        ),
    ]


def embedding_forward_edges(rng):
    wte = fp.f32([[0x7FC12345, 0x80000000], [0x00400000, 0xFF800000], [0x7F800001, 0x3F800000]])
    return [
        (
            "edge",
            {"wte": wte, "tokens": np.array([[2, 0, 1, 1, 2]], np.int32)},
            "a copy after loading: NaN payloads canonical, subnormals zeroed, -0 and inf kept",
        )
    ]


def embedding_backward_edges(rng):
    t = fp.f32
    return [
        (
            "edge",
            {
                "dout": t([[[0x3F800000], [0x33800000], [0x33800000], [0x80000000]]]),
                "tokens": np.array([[0, 0, 0, 1]], np.int32),
                "V": np.array([3], np.int32),
            },
            "the example of [emb.bwd.c1]: in increasing position; an id with a -0 term; an id absent (+0)",
        ),
        (
            "edge",
            {
                "dout": t([[[0x33800000], [0x33800000], [0x3F800000], [0x80000000]]]),
                "tokens": np.array([[0, 0, 0, 1]], np.int32),
                "V": np.array([3], np.int32),
            },
            "the same terms in the other order",
        ),
        (
            "empty",
            {"dout": np.zeros((1, 0, 2), F32), "tokens": np.zeros((1, 0), np.int32), "V": np.array([2], np.int32)},
            "no positions: every row is the empty sum, +0",
        ),
        (
            "empty",
            {"dout": np.zeros((1, 3, 0), F32), "tokens": np.array([[0, 2, 0]], np.int32), "V": np.array([3], np.int32)},
            "C = 0: rows of no channels",
        ),
    ]


# ---- int8 quantization ------------------------------------------------------------------------


def _quant_ties():
    """x * r = k + 1/2 for s = 1, the clamps at -128 and 127 and beyond, NaN, inf."""
    halves = [k + 0.5 for k in range(-130, 130)] + [-0.4, 0.49999997, -0.49999997, 126.99999, 127.00001, -128.00002]
    return np.concatenate(
        [
            fp.f32(V.nearest(halves)),
            fp.f32(
                [
                    0x80000000,
                    0x00000000,
                    0x7F800000,
                    0xFF800000,
                    0x7FC12345,
                    0x42FE0000,
                    0x42FF0000,
                    0xC3000000,
                    0xC3010000,
                    0x43480000,
                    0xC3480000,
                ]
            ),
        ]
    )


def _s_values():
    """Steps: 1 (ties exact), 2/127 (the step of [1, -2]), 0.1, the floor
    2^-126 (recip 2^126), 2^-3."""
    return (0x3F800000, 0x3C810204, 0x3DCCCCCD, 0x00800000, 0x3E000000)


def fake_quantize_edges(rng):
    x = _quant_ties()
    out = []
    for s in _s_values():
        xs = x if s in (0x3F800000, 0x3E000000) else fp.mul(x, fp.f32([s]))
        xs = np.concatenate([xs, V.uniform_f32(rng, 64, -140, 140) * fp.f32([s])])
        out.append(
            (
                "edge",
                {"x": xs.astype(F32), "s": fp.f32([s])},
                f"s = 0x{s:08X}: ties k + 1/2, the clamps at -128 and 127, NaN, inf",
            )
        )
    return out


def fake_quantize_backward_edges(rng):
    out = []
    for s in _s_values()[:3]:
        x = _quant_ties() if s == 0x3F800000 else fp.mul(_quant_ties(), fp.f32([s]))
        dy = V.random_f32(rng, x.size, -3, 3)
        dy[::7] = F32(-0.0)
        out.append(
            (
                "edge",
                {"dy": dy, "x": x.astype(F32), "s": fp.f32([s])},
                f"s = 0x{s:08X}: codes at and beyond -128 and 127, ties, NaN; -0 gradients",
            )
        )
    return out


def step_size_edges(rng):
    t = fp.f32
    rows = [
        ([0x00000000, 0x80000000], "all zero: the floor 2^-126"),
        ([0x03800000, 0x83000000], "a * RQ subnormal: the floor"),
        ([0x04800000], "a * RQ normal just above the floor"),
        ([0x7FC00000, 0x3F800000], "NaN"),
        ([0x3F800000, 0x7FC12345], "NaN last"),
        ([0x7F800000, 0x3F800000], "+inf"),
        ([0xFF800000], "-inf"),
        ([0xC2FE0000, 0x3F800000], "the maximum magnitude is negative: |g|"),
        ([0x00400000, 0x80000001], "subnormals only"),
        ([0x7F7FFFFF], "the largest finite"),
        ([0x42FE0000], "127"),
    ]
    out = [("edge", {"x": t(r)}, w) for r, w in rows]
    out.append(("empty", {"x": np.zeros(0, F32)}, "no element: a = +0, the floor"))
    return out


# ---- optimizer ----------------------------------------------------------------------------------

STEPS = (1, 2, 3, 10, 1702, 1703, 1704, 1705, 10000, 1 << 24)


def adamw_edges(rng):
    """Steps where the bias corrections show (t = 1, 2; beta2^t flushing near
    t = 1703; the largest t), gradients where eps inside or outside the root
    differs (tiny v), squares that overflow, NaN, -0 parameters with zero
    gradients, and zero moments."""
    t = fp.f32
    p = t([0x3F800000, 0xC0000000, 0x80000000, 0x00000000, 0x3F800000, 0x3F800000, 0x7F800000, 0x3F800000])
    g = t([0x40400000, 0x30000000, 0x00000000, 0x80000000, 0x5F800000, 0x7FC12345, 0x3F800000, 0x20000000])
    m = t([0x3DCCCCCD, 0x00000000, 0x00000000, 0x80000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000])
    v = t([0x3C23D70A, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00000000, 0x00400000])
    out = []
    for step in STEPS:
        x = _r(rng, 8, -3, 0)
        out.append(
            (
                "edge",
                {
                    "p": np.concatenate([p, x]),
                    "g": np.concatenate([g, _r(rng, 8, -30, 2)]),
                    "m": np.concatenate([m, _r(rng, 8, -20, -4)]),
                    "v": np.concatenate([v, V.random_f32(rng, 8, -60, -10, positive=True)]),
                    "step": np.array([step], np.int32),
                    "lr": t([0x3A83126F]),
                },
                f"step {step}: bias corrections; tiny v (eps after the root); overflow; NaN; -0",
            )
        )
    out.append(
        (
            "edge",
            {
                "p": np.zeros(0, F32),
                "g": np.zeros(0, F32),
                "m": np.zeros(0, F32),
                "v": np.zeros(0, F32),
                "step": np.array([1], np.int32),
                "lr": t([0x3A83126F]),
            },
            "an empty tensor",
        )
    )
    return out
