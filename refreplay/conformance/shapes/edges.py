"""Edge cases for readings that passed every other vector (issue 31, items 3
and 6; [conf.probes.c1], [conf.edges.c1]).

``extra(op)`` returns ``(family, inputs, note)`` triples appended to an op's
own cases by ``generate.build_op``.  They draw from a stream of their own
(seeded by the op's name and ``STREAM``), so the op's other cases keep their
bytes.  What each pins:

Cases of the transformer ops are "edge" cases: their failures are explained
by the variants of [conf.diagnosis.r1], not by a family.

* binary32 linear and norm backward ops: sums whose every term is -0 (a sum
  started from +0 gives +0 there, [red.sum.c1]); linear forward with
  x = -0, W > 0, b = -0 (y = -0 under the spec, +0 under a +0 start);
* linear forward and backward: fma probes whose second cancelling product
  lies in the last K mod 8 terms at K >= 64 (a kernel that fuses only the
  scalar tail after 8-wide blocks, [num.nofma.c1]);
* AdamW at steps where beta^t computed in float64 and rounded once gives
  another bias correction than the repeated binary32 product
  ([optim.adamw.bias.c1]), with p = +-0 and lr = 2^-10 so the update is not
  absorbed by p;
* fake_quantize_backward: elements whose code is saturated under x * recip(s)
  and not under x / s, or the reverse ([quant.ste.c1]: a mask computed with
  x / s fails; the forward's codes agree there, both clamp to 127 or -128);
* bf16 ops: the binary32 edges that pin a clause (rows below -10,000 and
  above +10,000, all -inf rows, attention scores below -1e9, every token
  ignored, C = 0, absent ids, the bias after the sum) rounded to bf16 so the
  bf16 vectors stand alone; fma probes in a K mod 8 tail at K >= 64 (a
  product below 2^-126 that only a fused multiply-add keeps,
  [bf16.exact.r1]); and near-tie cases: inputs whose binary32 result lies
  within a few ulp of a bf16 rounding boundary ([bf16.round.c1]), where a
  1-ulp binary32 deviation before the one rounding changes the bf16 output.
  For the elementwise ops the inputs are every bf16 value whose result lies
  within NEAR_UNARY ulp of a boundary, so any deviation of at most that many
  ulp that changes some bf16 output changes one of these.
"""

from __future__ import annotations

import zlib

import numpy as np

from ..inputs import builders as Bld
from ..inputs import separation
from ..base import deviant as fp
from ..inputs import values as V

F32 = np.float32
STREAM = 31
NEAR_UNARY = 64  # ulp of binary32 around a bf16 rounding boundary (elementwise, exhaustive)
NEAR_ROWS = 2  # ulp for row ops (drawn rows)
TAIL_SHAPES = ((3, 67, 2), (2, 133, 2))  # I (N), K, J: K >= 64, K mod 8 = 3, 5


def rng_for(name: str, seed: int) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode()), STREAM])


def extra(op, seed: int) -> list:
    """The extra cases of ``op`` (an ``OpDef``), or [] for ops without any."""
    rng = rng_for(op.name, seed)
    if op.name.startswith("bf16_"):
        fn = BF16.get(op.name[5:])
        return fn(op.name[5:], rng) if fn else []
    fn = F32_CASES.get(op.name)
    return fn(rng) if fn else []


# ---- binary32 ---------------------------------------------------------------------------------


def _mp():
    from ..inputs import model as model_probes

    return model_probes


def _norms():
    from ...ops import norms

    return norms


NEG0 = F32(-0.0)


def _tail_probe(rng, i, k, j):
    return Bld._fma_probe(rng, i, k, j, 0, tail=8)


def linear_forward(rng):
    t = fp.f32
    out = [
        (
            "edge",
            {
                "x": np.full((2, 3), NEG0),
                "W": t([[0x3F800000, 0x40000000, 0x3F000000], [0x3F800000, 0x3F800000, 0x3F800000]]),
                "b": t([0x80000000, 0x00000000]),
            },
            "x = -0, W > 0: every product -0, the sum -0; + b = -0 gives -0 (a sum from +0 gives +0), "
            "+ b = +0 gives +0",
        )
    ]
    for i, k, j in TAIL_SHAPES:
        A, B = _tail_probe(rng, i, k, j)
        out.append(
            (
                "edge",
                {"x": A, "W": np.ascontiguousarray(B.T), "b": np.full(j, NEG0)},
                f"N,C,OC={i},{k},{j}; the second cancelling product in the last C mod 8 terms; b = -0",
            )
        )
    return out


def linear_backward(rng):
    pos = lambda shape: V.powers_of_two(rng, shape, -2, 2)  # noqa: E731  (positive, exact products)
    out = [
        (
            "edge",
            {"dy": np.full((3, 2), NEG0), "x": pos((3, 4)), "W": pos((2, 4))},
            "dy = -0, x, W > 0: dx, dW and db are sums of -0 terms, -0 (a sum from +0 gives +0)",
        )
    ]
    i, k, j = TAIL_SHAPES[0]
    A, B = _tail_probe(rng, i, k, j)  # dx = dy·W: K = OC
    out.append(
        (
            "edge",
            {"dy": A, "x": V.random_f32(rng, (i, 2), -2, 2), "W": B},
            f"N,OC,C={i},{k},{j}: dx = dy·W, the second cancelling product in the last OC mod 8 terms",
        )
    )
    A, B = _tail_probe(rng, j, k, 3)  # dW = dyᵀ·x: K = N
    out.append(
        (
            "edge",
            {"dy": np.ascontiguousarray(A.T), "x": B, "W": V.random_f32(rng, (j, 3), -2, 2)},
            f"N,OC,C={k},{j},3: dW = dyᵀ·x, the second cancelling product in the last N mod 8 terms",
        )
    )
    return out


def _norm_zero_rows(rng, c=4):
    x = np.tile(np.arange(1, c + 1, dtype=F32), (3, 1))  # every row alike: xhat of one sign per column
    return x, V.powers_of_two(rng, c, -1, 1)


def layernorm_backward(rng):
    x, w = _norm_zero_rows(rng)
    _, mean, rstd = _norms().layernorm_forward(x, w, np.zeros(w.size, F32))
    return [
        (
            "edge",
            {"dout": np.full(x.shape, NEG0), "x": x, "w": w, "mean": mean, "rstd": rstd},
            "dout = -0: db and, where xhat > 0, dw are sums of -0 terms, -0 (a sum from +0 gives +0)",
        )
    ]


def rmsnorm_backward(rng):
    x, w = _norm_zero_rows(rng)
    _, rrms = _norms().rmsnorm_forward(x, w)
    return [
        (
            "edge",
            {"dout": np.full(x.shape, NEG0), "x": x, "w": w, "rrms": rrms},
            "dout = -0, x > 0: dw is a sum of -0 terms, -0 (a sum from +0 gives +0)",
        )
    ]


# steps where f32(beta^t in float64) gives another rbc2 (6) or rbc1 and rbc2 (14) than the product
ADAMW_POWER_STEPS = (6, 14)


def adamw_update(rng):
    out = []
    for step in ADAMW_POWER_STEPS:
        p = np.where(np.arange(16) % 2 == 0, F32(0.0), NEG0).astype(F32)
        out.append(
            (
                "edge",
                {
                    "p": p,
                    "g": V.random_f32(rng, 16, -8, 2),
                    "m": V.random_f32(rng, 16, -8, 0),
                    "v": V.random_f32(rng, 16, -12, 0, positive=True),
                    "step": np.array([step], np.int32),
                    "lr": fp.f32([0x3A800000]),
                },
                f"step {step}: beta^t by repeated binary32 products, not rounded once from float64; "
                f"p = +-0 and lr = 2^-10, so p' = -lr * update shows the update's every bit",
            )
        )
    return out


# (s, x at 127.5 s, x at -128.5 s): found by search over s.  Under the first s, x * recip(s) lands
# on 127.5 and -128.50002 (codes 128 and -129: saturated) where x / s gives 127.49999 and -128.5
# (127 and -128: passed); under the second, the other way round.  Forward codes agree on both
# sides (127.5 -> 128 and 127.49999 -> 127 both saturate to 127), so only the mask sees it.
STE_BOUNDS = ((0x3E032193, 0x41829E71, 0xC183A4B5), (0x3D577F9E, 0x40D6A81E, 0xC0D8571F))


def fake_quantize_backward(rng):
    """[quant.ste.c1] [quant.quantize.c1] elements whose code is saturated under x * recip(s) and
    not under x / s, or the reverse, each with its neighbours at +-1 and +-2 ulp."""
    out = []
    for s, hi, lo in STE_BOUNDS:
        x = fp.f32([b + d for b in (hi, lo) for d in (-2, -1, 0, 1, 2)])
        sv = fp.f32([s])
        with np.errstate(all="ignore"):
            by_div = np.rint(np.divide(x, sv, dtype=F32))
        by_recip = np.rint(fp.mul(x, np.divide(F32(1), sv, dtype=F32)))
        moved = ((by_div >= -128) & (by_div <= 127)) != ((by_recip >= -128) & (by_recip <= 127))
        if moved.sum() != 2:
            raise separation.ProbeError(f"s = 0x{s:08X}: x / s moves {moved.sum()} codes across the bound, not 2")
        kept = "x * recip(s) saturates and x / s passes" if s == STE_BOUNDS[0][0] else "the reverse"
        out.append(
            (
                "edge",
                {"dy": V.random_f32(rng, x.size, -3, 3), "x": x, "s": sv},
                f"s = 0x{s:08X}: x at 127.5 s and -128.5 s, +-2 ulp; {kept} (a mask computed with x / s differs there)",
            )
        )
    return out


F32_CASES = {
    "linear_forward": linear_forward,
    "linear_backward": linear_backward,
    "layernorm_backward": layernorm_backward,
    "rmsnorm_backward": rmsnorm_backward,
    "adamw_update": adamw_update,
    "fake_quantize_backward": fake_quantize_backward,
}


# ---- bf16 -----------------------------------------------------------------------------------


def _bo():
    from ..table import bf16 as bf16_ops

    return bf16_ops


def _fp32(op):
    from ...ops import bf16

    return bf16.FP32[op]


def _profile(op, inputs, rng):
    return _bo().to_profile(op, {k: np.ascontiguousarray(v) for k, v in inputs.items()}, rng)


def _ported(op, cases, rng, keep=None):
    """Binary32 edge cases of ``op`` rounded to bf16 (``keep``: which, by index)."""
    out = []
    for i, (family, inputs, note) in enumerate(cases):
        if keep is None or i in keep:
            out.append((family, _profile(op, inputs, rng), note + "; rounded to bf16"))
    return out


def _distance(r):
    """Per element of binary32 r: ulp of r to the nearest bf16 rounding
    boundary (the halfway point between two bf16 values); large for NaN, inf."""
    b = fp.bits(np.ascontiguousarray(r, F32)).astype(np.int64)
    d = np.abs((b & 0xFFFF) - 0x8000)
    return np.where(np.isfinite(r), d, 1 << 20)


def _all_bf16():
    """Every finite bf16 value (subnormals and zeros included)."""
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    return h[(h & 0x7F80) != 0x7F80]


def _decode(h):
    from ...numerics import bf16

    return bf16.decode(np.ascontiguousarray(h, np.uint16))


def _enc(x):
    from ...numerics import bf16

    return bf16.encode(np.ascontiguousarray(x, F32))


def _near_unary(op, make):
    """``make(x_bits)`` -> the op's bf16 inputs for elementwise inputs x; the
    cases keep the x whose binary32 result (first output) lies within
    NEAR_UNARY ulp of a bf16 rounding boundary."""
    x = _all_bf16()
    inputs = make(x)
    from ...ops import bf16

    kin = bf16.PROFILE[op][0]
    args = [_decode(v) if k == "h" else v for k, v in zip(kin, inputs.values())]
    with np.errstate(all="ignore"):
        r = _fp32(op)(*args)
    r = r[0] if isinstance(r, tuple) else r
    keep = _distance(r) <= NEAR_UNARY
    e6 = x[(x & 0x7F80) == (133 << 7)]  # exponent 6
    return [
        (
            "edge",
            make(np.ascontiguousarray(x[keep])),
            f"every bf16 x whose binary32 result lies within {NEAR_UNARY} ulp of a bf16 rounding boundary "
            f"({int(keep.sum())} of {x.size}): a deviation of at most {NEAR_UNARY} ulp before the one rounding "
            f"that changes any bf16 output changes one of these",
        ),
        (
            "edge",
            make(np.ascontiguousarray(e6)),
            "every bf16 x with |x| in [64, 128): exp(|x|) crosses its "
            "overflow threshold, sigmoid and 1 + tanh reach +0",
        ),
    ]


ONE_H = np.uint16(0x3F80)


def _ones(x):
    return np.full(x.shape, ONE_H, np.uint16)


def _near_rows(op, rng, v=8, rows=48, pool=1 << 17, lo=-4, hi=3):
    """Rows of V bf16 logits drawn until ``rows`` of them have an output whose
    binary32 value lies within NEAR_ROWS ulp of a bf16 rounding boundary."""
    x = _enc(V.random_f32(rng, (pool, v), lo, hi))
    with np.errstate(all="ignore"):
        r = _fp32(op)(_decode(x))
    near = (_distance(r) <= NEAR_ROWS).any(axis=1)
    pick = np.flatnonzero(near)[:rows]
    Bld._check(pick.size >= rows // 2, f"{op}: too few rows near a bf16 rounding boundary")
    return [
        (
            "edge",
            {"x": np.ascontiguousarray(x[pick])},
            f"N,V={pick.size},{v}: every row has an output within {NEAR_ROWS} ulp of a bf16 rounding boundary "
            f"before the one rounding (a division for the reciprocal, another association, shows there)",
        )
    ]


def _softmax_far(op, rng):
    rows = _mp()._softmax_rows(5)
    if op.endswith("forward"):
        return [
            (
                "edge",
                {"x": _enc(rows)},
                "V=5: all -inf; one finite; equal; +inf; NaN; underflow; -inf beside "
                "finite; -0 and subnormals; rows entirely below -10,000 and above "
                "+10,000; rounded to bf16",
            )
        ]
    dy = _enc(V.random_f32(rng, rows.shape, -3, 1))
    d = _bo()._derive(op, {"dy": dy, "y": np.zeros(rows.shape, np.uint16)}, lambda shape: rows)
    return [("edge", d, "V=5: the forward's edge rows (below -10,000, above +10,000, all -inf), rounded to bf16")]


def _tail_fma_bf16(rng, i, k, j):
    """[bf16.exact.r1] per row a product 2^-126 or 2^-125, then one of
    magnitude 2^-127 in the last K mod 8 terms: the separate multiply
    flushes it, a fused multiply-add adds it (A: I x K, B: K x J)."""
    A = np.zeros((i, k), F32)
    for r in range(i):
        k1 = k - k % 8 + int(rng.integers(0, k % 8))
        k0 = k1 - (1, 8, 32)[r % 3]
        A[r, k0] = F32(2.0 ** (-63 + r % 2))
        A[r, k1] = F32(2.0**-64) * (F32(-1) if rng.random() < 0.5 else F32(1))
    return A, np.full((k, j), F32(2.0**-63))


def bf16_matmul(op, rng):
    out = []
    kind = {"matmul": "nn", "matmul_nt": "nt", "matmul_tn": "tn"}[op]
    for i, k, j in TAIL_SHAPES:
        A, B = _tail_fma_bf16(rng, i, k, j)
        out.append(
            (
                "fma",
                {n: _enc(x) for n, x in _bo()._layout(kind, A, B).items()},
                f"I,K,J={i},{k},{j}; a product below 2^-126 in the last K mod 8 terms after 2^-126 or 2^-125",
            )
        )
    return out


def bf16_linear_forward(op, rng):
    t = fp.f32
    cases = [c for c in _mp().linear_forward_edges(rng) if c[0] == "empty"] + linear_forward(rng)[:1]
    out = _ported(op, cases, rng)
    # spec: (2^-8 + 2^-24) + 2^-24 = 2^-8 + 2^-23, + 1 rounds up to 1 + 2^-7; bias first:
    # (1 + 2^-8) + 2^-24 ties to 1 + 2^-8 twice, a bf16 tie that rounds to even, 1
    out.append(
        (
            "edge",
            {
                "x": _enc(t([[0x3B800000, 0x33800000, 0x33800000]])),
                "W": _enc(np.ones((1, 3), F32)),
                "b": _enc(t([0x3F800000])),
            },
            "the bias after the sum: 1 + ((2^-8 + 2^-24) + 2^-24) rounds to 1 + 2^-7, "
            "((1 + 2^-8) + 2^-24) + 2^-24 is a bf16 tie that rounds to 1",
        )
    )
    for i, k, j in TAIL_SHAPES:
        A, B = _tail_fma_bf16(rng, i, k, j)
        out.append(
            (
                "edge",
                {"x": _enc(A), "W": _enc(np.ascontiguousarray(B.T)), "b": np.full(j, 0x8000, np.uint16)},
                f"N,C,OC={i},{k},{j}; a product below 2^-126 in the last C mod 8 terms; b = -0",
            )
        )
    return out


def bf16_add(op, rng):
    a = np.array([0x0040, 0x0001, 0x8040, 0x007F, 0x0040, 0x8001], np.uint16)
    b = np.array([0x0040, 0x0080, 0x8080, 0x0001, 0x8080, 0x8080], np.uint16)
    return [
        (
            "bf16_input_zeroing",
            {"a": np.concatenate([a, b]), "b": np.concatenate([b, a])},
            "bf16 subnormals beside subnormals and +-FLT_MIN: kept, their sums are normal",
        )
    ]


def bf16_from_f32(op, rng):
    """The binary32 cases of ``F32_CASES`` with their inputs rounded to bf16 (all
    exact: -0, powers of two, small integers); the fma probes rebuilt with
    products below 2^-126."""
    out = [c for c in F32_CASES[op](rng) if c[0] != "fma"]
    out = _ported(op, out, rng)
    if op == "linear_backward":
        i, k, j = TAIL_SHAPES[0]
        A, B = _tail_fma_bf16(rng, i, k, j)
        out.append(
            (
                "edge",
                {"dy": _enc(A), "x": _enc(V.random_f32(rng, (i, 2), -2, 2)), "W": _enc(B)},
                f"N,OC,C={i},{k},{j}: dx = dy·W, a product below 2^-126 in the last OC mod 8 terms",
            )
        )
        A, B = _tail_fma_bf16(rng, j, k, 3)
        out.append(
            (
                "edge",
                {"dy": _enc(np.ascontiguousarray(A.T)), "x": _enc(B), "W": _enc(V.random_f32(rng, (j, 3), -2, 2))},
                f"N,OC,C={k},{j},3: dW = dyᵀ·x, a product below 2^-126 in the last N mod 8 terms",
            )
        )
    return out


def bf16_attention(op, rng):
    sets = _mp()._attention_edge_inputs(rng)
    far = sets[-1]  # every score finite and below -1e9
    if op == "attention_forward":
        return _ported(op, [("edge", far, "scores below -1e9: a causal mask filled with -1e9 outweighs them")], rng)
    att = _bo()._ops().apply("attention_forward", *(_enc(far[n]) for n in ("q", "k", "v")))[1]
    d = {
        "dout": _enc(V.random_f32(rng, far["q"].shape, -3, 1)),
        **{n: _enc(far[n]) for n in ("q", "k", "v")},
        "att": att,
    }
    e = {n: _enc(x) for n, x in _mp().dz_rounds_up_to_normal_bf16().items()}
    e["att"] = _bo()._ops().apply("attention_forward", e["q"], e["k"], e["v"])[1]
    return [
        ("edge", d, "scores below -1e9 (a backward that recomputes att with a -1e9 mask fails); rounded to bf16"),
        ("edge", e, "dz rounds up to 2^-126 before its flush: dq = 2^-106; bf16 inputs"),
    ]


def bf16_cross_entropy(op, rng):
    return _ported(op, _mp().ce_edges(rng), rng, keep={0, 1, 2})


def bf16_embedding_backward(op, rng):
    return _ported(op, _mp().embedding_backward_edges(rng), rng)


def bf16_embedding_forward(op, rng):
    return _ported(op, _mp().embedding_forward_edges(rng), rng)


def _softmax_bf16(op, rng):
    out = _softmax_far(op, rng)
    if op.endswith("forward"):
        out += _near_rows(op, rng)
    return out


BF16 = {
    "add": bf16_add,
    **{op: bf16_from_f32 for op in ("linear_backward", "layernorm_backward", "rmsnorm_backward")},
    "matmul": bf16_matmul,
    "matmul_nt": bf16_matmul,
    "matmul_tn": bf16_matmul,
    "linear_forward": bf16_linear_forward,
    "attention_forward": bf16_attention,
    "attention_backward": bf16_attention,
    "cross_entropy_forward": bf16_cross_entropy,
    "cross_entropy_backward": bf16_cross_entropy,
    "embedding_forward": bf16_embedding_forward,
    "embedding_backward": bf16_embedding_backward,
    "gelu_forward": lambda op, rng: _near_unary(op, lambda x: {"x": x}),
    "silu_forward": lambda op, rng: _near_unary(op, lambda x: {"x": x}),
    "gelu_backward": lambda op, rng: _near_unary(op, lambda x: {"dout": _ones(x), "x": x}),
    "silu_backward": lambda op, rng: _near_unary(op, lambda x: {"dout": _ones(x), "x": x}),
    "swiglu_forward": lambda op, rng: _near_unary(op, lambda x: {"a": x, "b": _ones(x)}),
    "swiglu_backward": lambda op, rng: _near_unary(op, lambda x: {"dout": _ones(x), "a": x, "b": _ones(x)}),
    **{f"{f}_{d}": _softmax_bf16 for f in ("softmax", "log_softmax") for d in ("forward", "backward")},
}
