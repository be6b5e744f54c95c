"""The ops of the bf16 profile as conformance entries ([bf16.ops.c1],
[bf16.probes.c1]).

``bf16_<op>`` is ``ops.bf16.apply(<op>, ...)`` under the calling convention
of the binary32 entry ``<op>``: same tensor names and shapes, the tensors
the profile makes bf16 stored as BF16 bits.  Inputs are the binary32
entry's random inputs rounded to bf16 ([bf16.round.c1]); a statistic or
probability that a backward takes from its forward comes from the bf16
forward, so every case is a state the profile can reach.  Families: random,
edge (the bf16 edge grid in one bf16 input at a time), a small sweep (long
K, V, C and T: split-K and online softmax), and the four bf16 probe
families, each checked at generation time to isolate its misreading
(``bf16_variants``).  The conversions are ops of their own: bf16_encode and
bf16_decode.
"""

from __future__ import annotations

import numpy as np

from ..readings import bf16 as BV
from ..base import bf16 as bf16bits
from ..inputs.separation import ProbeError
from ..inputs import long_shapes as sweeps
from ..inputs import values as V
from .model import RANDOM
from .opdef import OPS, OpDef

F32 = np.float32
PROFILE_CLAUSES = ("bf16.ops.c1", "bf16.round.c1", "bf16.widen.c1", "bf16.load.c1", "bf16.format.c1")
# ops whose products have two bf16 factors: exact ([bf16.matmul.c1])
PRODUCT_OPS = (
    "matmul",
    "matmul_nt",
    "matmul_tn",
    "linear_forward",
    "linear_backward",
    "attention_forward",
    "attention_backward",
)


def _ops():
    from ...ops import bf16

    return bf16


def _enc(x) -> np.ndarray:
    from ...numerics import bf16

    return bf16.encode(np.ascontiguousarray(x, F32))


# ---- the bf16 edge grid ([bf16.probes.c1]) -------------------------------------------------

FRACTIONS = (0x00, 0x01, 0x2A, 0x40, 0x7E, 0x7F)
SPECIALS = (0x7F80, 0xFF80, 0x7FC0, 0xFFC0, 0x7FFF, 0x7FC1, 0x7F81)  # +-inf, NaNs: canonical, x86, CUDA, payloads


def edge_grid() -> np.ndarray:
    """Every exponent class of [conf.probes.c1] times the bf16 fractions, both
    signs (exponent -127: zero and bf16 subnormals), then +-inf and NaNs."""
    out = [(s << 15) | ((e + 127) << 7) | m for e in V.EXPONENTS for m in FRACTIONS for s in (0, 1)]
    return np.array(out + list(SPECIALS), np.uint16)


# ---- inputs: the binary32 entry's, rounded; statistics from the bf16 forward -------------------


def _derive(op, d, rng):
    """Inputs a backward takes from its forward, recomputed by the bf16 forward;
    ``rng``: a generator, or a function shape -> binary32 logits (a live source)."""
    apply = _ops().apply
    if op == "layernorm_backward":
        _, d["mean"], d["rstd"] = apply("layernorm_forward", d["x"], d["w"], np.zeros(d["w"].shape, np.uint16))
    elif op == "rmsnorm_backward":
        d["rrms"] = apply("rmsnorm_forward", d["x"], d["w"])[1]
    elif op == "attention_backward":
        d["att"] = apply("attention_forward", d["q"], d["k"], d["v"])[1]
    elif op in ("softmax_backward", "log_softmax_backward"):
        shape = d["y"].shape
        x = _enc(rng(shape) if callable(rng) else V.random_f32(rng, shape, -4, 3))
        d["y"] = apply(op.replace("backward", "forward"), x)
    return d


def to_profile(op, inputs, rng):
    """Binary32 inputs of ``op`` as the bf16 op takes them."""
    kin = _ops().PROFILE[op][0]
    names = OPS[op].inputs
    d = {n: (_enc(inputs[n]) if k == "h" else inputs[n]) for n, k in zip(names, kin)}
    return _derive(op, d, rng)


# ---- matmul and add have no table/model.py entry: their random inputs here ------------------------

MM_SHAPES = ((1, 1, 1), (3, 5, 7), (17, 35, 23), (2, 257, 3), (16, 64, 16))


def _layout(kind, A, B):
    if kind == "nt":
        return {"A": A, "B": np.ascontiguousarray(B.T)}
    if kind == "tn":
        return {"A": np.ascontiguousarray(A.T), "B": B}
    return {"A": A, "B": B}


def _canon(kind, A, B):
    """(A: I x K, B: K x J) from the stored layout."""
    return _layout(kind, A, B).values()  # the transposes are their own inverse


def _kind(op):
    return {"matmul": "nn", "matmul_nt": "nt", "matmul_tn": "tn"}.get(op)


def _random(op, rng):
    if _kind(op):
        return [
            (
                _layout(_kind(op), V.random_f32(rng, (i, k), -4, 4), V.random_f32(rng, (k, j), -4, 4)),
                f"I,K,J={i},{k},{j}",
            )
            for i, k, j in MM_SHAPES
        ]
    if op == "add":
        return [({"a": V.random_f32(rng, n), "b": V.random_f32(rng, n)}, f"N={n}") for n in (1, 7, 31, 1021)]
    make, shapes = RANDOM[op]
    return [(make(rng, *s), f"shape {s}") for s in shapes]


def _edges(op, rng, randoms):
    """One case per bf16 input: the edge grid (cycled) in that input of a
    random case with at least as many elements, or else the largest."""
    grid = edge_grid()
    out = []
    kin = _ops().PROFILE[op][0]
    for name, k in zip(OPS[op].inputs, kin):
        if k != "h" or name == "y":  # a softmax backward's y comes from the forward (_derive)
            continue
        fits = [c for c in randoms if c[name].size >= grid.size]
        base = dict(min(fits, key=lambda c: c[name].size) if fits else max(randoms, key=lambda c: c[name].size))
        base[name] = np.resize(grid, base[name].shape)
        out.append(("edge", _derive(op, base, rng), f"bf16 edge grid in {name}"))
    return out


# ---- sweeps: long reductions on thin shapes ---------------------------------------------------


def _sweeps(op, rng, entry):
    r = lambda shape, lo=-3, hi=1: _enc(V.random_f32(rng, shape, lo, hi))  # noqa: E731
    note = sweeps.note
    if _kind(op):
        ks = (4097, 32769) if op == "matmul" else (4097,)
        return sweeps.matmul_cases(
            entry, rng, lambda A, B: {k: _enc(v) for k, v in _layout(_kind(op), A, B).items()}, ks
        )
    out = []
    if op in ("softmax_forward", "log_softmax_forward"):
        for v in (4097, 32769) if op == "softmax_forward" else (4097,):
            out.append(({"x": r((1, v), -4, 3)}, note(f"N,V=1,{v}")))
    elif op in ("softmax_backward", "log_softmax_backward"):
        out.append((_derive(op, {"dy": r((1, 4097)), "y": np.zeros((1, 4097), np.uint16)}, rng), note("N,V=1,4097")))
    elif op == "cross_entropy_forward":
        out.append(
            (
                {"logits": r((1, 32769), -4, 3), "targets": np.array([int(rng.integers(0, 32769))], np.int32)},
                note("N,V=1,32769"),
            )
        )
    elif op == "cross_entropy_backward":
        out.append(
            (
                {"logits": r((1, 4097), -4, 3), "targets": np.array([int(rng.integers(0, 4097))], np.int32)},
                note("N,V=1,4097"),
            )
        )
    elif op == "attention_forward":
        out.append(({n: r((1, 1, 257, 2)) for n in ("q", "k", "v")}, note("B,NH,T,HS=1,1,257,2")))
    elif op == "attention_backward":
        d = {"dout": r((1, 1, 130, 2)), **{n: r((1, 1, 130, 2)) for n in ("q", "k", "v")}}
        out.append((_derive(op, d, rng), note("B,NH,T,HS=1,1,130,2")))
    elif op in ("layernorm_forward", "rmsnorm_forward"):
        d = {"x": r((2, 4097), -2, 2), "w": r(4097, -1, 1)}
        if op == "layernorm_forward":
            d["b"] = r(4097)
        out.append((d, note("N,C=2,4097")))
    elif op in ("layernorm_backward", "rmsnorm_backward"):
        d = {"dout": r((2, 4097)), "x": r((2, 4097), -2, 2), "w": r(4097, -1, 1)}
        out.append((_derive(op, d, rng), note("N,C=2,4097")))
    elif op == "linear_forward":
        out.append(({"x": r((2, 4097)), "W": r((3, 4097)), "b": r(3)}, note("N,C,OC=2,4097,3")))
    elif op == "linear_backward":
        out.append(({"dy": r((4097, 2)), "x": r((4097, 3)), "W": r((2, 3))}, note("N,C,OC=4097,3,2 (dW, db sum N)")))
    return [("sweep", d, n) for d, n in out]


# ---- the probe families of [bf16.probes.c1] -----------------------------------------------------

TIE_HIGHS = (0x3F80, 0x3F81, 0x3F7F, 0xBF80, 0xBF81, 0x4049, 0x0080, 0x0081, 0x7F7E, 0x7F7F, 0xFF7F, 0xC2FF)
TIE_LOWS = (0x8000, 0x7FFF, 0x8001, 0x0000, 0x0001, 0xFFFF, 0x4000, 0xC000)


def tie_grid() -> np.ndarray:
    """binary32 values at and beside every kind of tie of [bf16.round.c1]:
    kept parts with even and odd last bits, halves exactly 0x8000 and one
    off, carries into the exponent (0x3F7F, 0x7F7E) and to infinity (0x7F7F)."""
    return np.array([(h << 16) | lo for h in TIE_HIGHS for lo in TIE_LOWS], np.uint32).view(F32)


def _tie_pairs():
    """(a, b) bf16 pairs whose exact binary32 sum is a tie or beside one:
    a is the kept part, b the low half (a bf16 value: 2^15, 2^15 + 2^8 or
    2^15 - 2^7 units of the sum's last place)."""
    a, b = [], []
    for h in TIE_HIGHS:
        e = (h >> 7) & 0xFF
        if not 1 <= e <= 0xFE or e < 10:
            continue
        s = h & 0x8000
        for low in ((e - 8) << 7, ((e - 8) << 7) | 0x02, ((e - 9) << 7) | 0x7F):  # 0x8000, 0x8100, 0x7F80
            a.append(h)
            b.append(s | low)
    return np.array(a, np.uint16), np.array(b, np.uint16)


def _rounding(op, rng):
    if op == "add":
        a, b = _tie_pairs()
        return [
            (
                {"a": a, "b": b},
                "sums exactly at ties (even and odd kept bits), beside them, and carrying "
                "into the exponent and to infinity",
            )
        ]
    if op == "linear_forward":
        a, b = _tie_pairs()
        return [
            (
                {"x": np.array([[0x3F80]], np.uint16), "W": a.reshape(-1, 1).copy(), "b": b},
                "y = W*1 + b exactly at and beside ties",
            )
        ]
    return []


def _accumulation(op, rng):
    """Integers 1..255 times powers of two 2^0..2^2: exact products and exact
    binary32 sums (any order gives the same bits), partial sums wider than bf16."""
    if not _kind(op):
        return []
    out = []
    for i, k, j in ((2, 16, 3), (3, 64, 2), (1, 300, 2)):
        A = rng.integers(1, 256, (i, k)).astype(F32) * np.where(rng.random((i, k)) < 0.5, F32(-1), F32(1))
        B = V.powers_of_two(rng, (k, j), 0, 2)
        out.append(
            (
                {n: _enc(x) for n, x in _layout(_kind(op), A, B).items()},
                f"I,K,J={i},{k},{j}; integer products, exact binary32 sums, partial sums not bf16 values",
            )
        )
    return out


def _zeroing(op, rng):
    sub = np.array(rng.integers(1, 0x80, 16), np.uint16) | (rng.integers(0, 2, 16).astype(np.uint16) << 15)
    if op == "matmul":
        A = sub.reshape(4, 4).copy()
        A[2:, 1] = _enc(V.random_f32(rng, 2, -40, -30, mant_bits=7))
        return [
            (
                {"A": A, "B": _enc(V.powers_of_two(rng, (4, 3), 90, 100))},
                "bf16 subnormal inputs times 2^90..2^100 (exact products)",
            )
        ]
    if op == "rmsnorm_forward":
        x = np.concatenate([sub[:8], _enc(V.random_f32(rng, 8, -2, 1))]).reshape(2, 8)
        x[0] = sub[8:]
        return [({"x": x, "w": _enc(V.random_f32(rng, 8, -1, 1))}, "a row of bf16 subnormals: out = x*rrms*w")]
    return []


def _intermediate(op, rng):
    if f"bf16_{op}" not in BV.INTERMEDIATE_OPS:
        return []
    if op == "attention_forward":
        d = {n: _enc(V.random_f32(rng, (1, 2, 9, 4), -3, 1)) for n in ("q", "k", "v")}
        return [(d, "B,NH,T,HS=1,2,9,4: att·v from binary32 probabilities")]
    if op == "layernorm_forward":
        return [
            (
                {
                    "x": _enc(V.random_f32(rng, (3, 16), -2, 2)),
                    "w": _enc(V.random_f32(rng, 16, -1, 1)),
                    "b": _enc(V.random_f32(rng, 16, -8, -4)),
                },
                "N,C=3,16: the affine from the binary32 normalised value",
            )
        ]
    return [({"x": _enc(V.random_f32(rng, (3, 33), -4, 3))}, "N,V=3,33: the sum of binary32 exponentials")]


def _fma(op, rng):
    """[bf16.exact.r1] bf16 products are exact, so a fused multiply-add
    changes a sum only through a product below 2^-126: per row a product
    2^-126 or 2^-125, then one of magnitude 2^-127 d positions later; the
    separate multiply flushes it ([num.flush.c1]), a fused one adds it."""
    out = []
    for i, k, j in ((2, 4, 3), (4, 33, 2)):
        A = np.zeros((i, k), F32)
        for r in range(i):
            k0 = int(rng.integers(0, k - 1))
            d = int(rng.integers(1, k - k0))
            A[r, k0] = F32(2.0 ** (-63 + r % 2))
            A[r, k0 + d] = F32(2.0**-64) * (F32(-1) if rng.random() < 0.5 else F32(1))
        B = np.full((k, j), F32(2.0**-63))
        out.append(
            (
                "fma",
                {n: _enc(x) for n, x in _layout(_kind(op), A, B).items()},
                f"I,K,J={i},{k},{j}; a product below 2^-126 after 2^-126 or 2^-125",
            )
        )
    return out


PROBES = {
    "bf16_rounding": _rounding,
    "bf16_accumulation": _accumulation,
    "bf16_input_zeroing": _zeroing,
    "bf16_intermediate": _intermediate,
}


def check_probe(op: OpDef, family: str, raw, outputs: dict) -> None:
    """[bf16.probes.c1] A bf16 probe must change under its misreading and
    be built on arithmetic that the other misreadings leave alone where that
    can be had; ``separation.ProbeError`` otherwise."""
    expected = tuple(outputs.values())
    inputs = [np.ascontiguousarray(x) for x in raw]
    mis = [m for m in BV.MISREADINGS if m.family == family]
    for m in mis:
        got = m.fn(op, inputs)
        if got is not None and not any(BV.differs(e, g) for e, g in zip(expected, got)):
            raise ProbeError(f"{op.name}: {family} probe does not change under '{m.name}'")
    if family == "bf16_intermediate" and not BV.same(expected, BV.unrounded_intermediate(op, inputs)):
        raise ProbeError(f"{op.name}: the bf16_intermediate emulation does not give the spec's bits")
    if family == "bf16_rounding" and any(m.fn(op, inputs) is None for m in mis):
        raise ProbeError(f"{op.name}: bf16_rounding probe on an op without bf16 outputs")


# ---- the entries --------------------------------------------------------------------------------


def _signature(op, kin, kout):
    base = OPS[op]
    tag = {"h": "bf16", "f": "f32", "i": "i32"}
    ins = ", ".join(f"{n}: {tag[k]}" for n, k in zip(base.inputs, kin))
    outs = ", ".join(f"{n}: {tag[k]}" for n, k in zip(base.outputs, kout))
    return f"bf16_{op}({ins}) -> ({outs})  (shapes as {op}; [bf16.ops.c1])"


def _terms(kind):
    def terms(A, B):
        A, B = (bf16bits.loaded(x) for x in (A, B))
        A, B = _canon(kind, A, B)
        I, J = A.shape[0], B.shape[1]
        return np.repeat(A, J, axis=0), np.tile(np.ascontiguousarray(B.T), (I, 1))

    return terms


def _register(op):
    kin, kout = _ops().PROFILE[op]
    base = OPS[op]
    name = f"bf16_{op}"
    bf16 = frozenset(
        [f"in/{n}" for n, k in zip(base.inputs, kin) if k == "h"]
        + [f"out/{n}" for n, k in zip(base.outputs, kout) if k == "h"]
    )
    clauses = PROFILE_CLAUSES + (("bf16.matmul.c1",) if op in PRODUCT_OPS else ()) + base.clauses

    def reference(*xs):
        return _ops().apply(op, *xs)

    def build(entry, rng):
        randoms = [(to_profile(op, d, rng), note) for d, note in _random(op, rng)]
        cases = [("random", d, note) for d, note in randoms]
        cases += _edges(op, rng, [d for d, _ in randoms])
        cases += _sweeps(op, rng, entry)
        for family, probe in PROBES.items():
            cases += [(family, d, note) for d, note in probe(op, rng)]
        if _kind(op):
            cases += _fma(op, rng)
        if _kind(op):  # the order probes of [conf.probes.c1] with bf16 values: products exact
            for i, k, j in ((2, 9, 3), (3, 33, 2), (2, 257, 2), (1, 1024, 2)):
                A = V.random_f32(rng, (i, k), -24, 24, mant_bits=7)
                B = V.powers_of_two(rng, (k, j), -2, 2)
                cases.append(
                    (
                        "order",
                        {n: _enc(x) for n, x in _layout(_kind(op), A, B).items()},
                        f"I,K,J={i},{k},{j}; exact bf16 products 2^-26..2^26",
                    )
                )
        return cases

    OPS[name] = OpDef(
        name,
        clauses,
        _signature(op, kin, kout),
        base.inputs,
        base.outputs,
        reference,
        build,
        terms=_terms(_kind(op)) if _kind(op) else None,
        bf16=bf16,
    )


def _conversion_build(kind):
    def build(op, rng):
        if kind == "encode":
            return [("random", {"x": V.random_f32(rng, n, -130, 127)}, f"N={n}") for n in (1, 7, 1021)] + [
                ("edge", {"x": V.edge_values()}, "binary32 edge grid"),
                (
                    "bf16_rounding",
                    {"x": tie_grid()},
                    "at and beside every kind of tie, carries to the exponent and to infinity",
                ),
            ]
        return [("random", {"x": rng.integers(0, 1 << 16, n).astype(np.uint16)}, f"N={n}") for n in (1, 7, 1021)] + [
            ("edge", {"x": edge_grid()}, "bf16 edge grid"),
            (
                "bf16_input_zeroing",
                {"x": np.arange(0x8001, 0x8080, dtype=np.uint16)[::3].copy()},
                "negative bf16 subnormals",
            ),
        ]

    return build


def _encode_ref(x):
    from ...numerics import bf16

    return bf16.encode(x)


def _decode_ref(x):
    from ...numerics import bf16

    return bf16.decode(x)


OPS["bf16_encode"] = OpDef(
    "bf16_encode",
    ("bf16.round.c1", "bf16.format.c1", "num.load.c1"),
    "bf16_encode(x: f32[N]) -> out: bf16[N]  ([bf16.round.c1])",
    ("x",),
    ("out",),
    _encode_ref,
    _conversion_build("encode"),
    bf16=frozenset({"out/out"}),
)
OPS["bf16_decode"] = OpDef(
    "bf16_decode",
    ("bf16.widen.c1", "bf16.load.c1", "bf16.format.c1"),
    "bf16_decode(x: bf16[N]) -> out: f32[N]  ([bf16.load.c1] then [bf16.widen.c1])",
    ("x",),
    ("out",),
    _decode_ref,
    _conversion_build("decode"),
    bf16=frozenset({"in/x"}),
)
for _op in _ops().PROFILE:
    _register(_op)
