"""Live cases: conformance cases at any shape, with inputs drawn from a seed
and the expected outputs computed by the reference at run time
([conf.runner.c1]: the comparison is the same bit-for-bit one as for the
committed vectors; only where the expected bits come from differs).

Every op that has a live form lists its shape letters (the spec's letters:
I, K, J for a matmul, N and V for a softmax, ...) and the shape of every
input and output in those letters, so the size of a case is known, and
bounded, before anything is allocated.  A shape is user input: letters,
values and the element count are checked and a bad one is an
``InputError`` (exit 2).

Inputs are drawn through a *source* (``NumpySource`` here, a hypothesis
source in ``refreplay.testing.strategies``), so the fuzzer and the live
cases build inputs the same way.  The expected outputs are computed exactly
as ``generate.py`` computes the committed vectors' (``expected``).
"""

from __future__ import annotations

import math
import re
import zlib
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ...errors import InputError
from ..inputs import values as V
from ..base.case import Case, as_outputs, load_inputs
from ..table import OPS

# Bound on the elements of one live case, inputs and outputs together:
# 2^27 elements is 512 MiB of binary32 (held about twice while comparing).
MAX_ELEMENTS = 1 << 27
MAX_DIM = (1 << 31) - 1
GENERATOR_VERSION = "live-1"  # recorded in a saved manifest; `vectors verify` does not regenerate these


@dataclass(frozen=True)
class LiveOp:
    """An op's live form: shape letters (in order), the smallest value of
    each letter the op accepts, every tensor's shape in letters (inputs, then
    outputs), and ``make(src, dims) -> {input name: array}``."""

    letters: tuple[str, ...]
    tensors: tuple[tuple[str, ...], ...]
    make: Callable
    minimum: dict = field(default_factory=dict)
    check: Callable | None = None  # dims -> error text or None

    def elements(self, dims: dict) -> int:
        return sum(math.prod(dims[x] for x in t) for t in self.tensors)


class NumpySource:
    """Input values from a seeded NumPy generator (bit patterns, so the same
    seed gives the same bits everywhere, see ``values.py``)."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng

    def f32(self, shape, lo=-8, hi=8, positive=False):
        return V.random_f32(self.rng, shape, lo, hi, positive=positive)

    def uniform(self, shape, lo, hi):
        return V.uniform_f32(self.rng, shape, lo, hi)

    def ints(self, shape, lo, hi):
        """Integers in [lo, hi) as int32."""
        return self.rng.integers(lo, hi, shape).astype(np.int32)


def _ops(module):
    import importlib

    return importlib.import_module(f"refreplay.ops.{module}")


def _loaded(*xs):
    return load_inputs(list(xs))


# ---- the live forms ----------------------------------------------------------------

LIVE: dict[str, LiveOp] = {}


def _mm(kind):
    def make(src, d):
        A, B = src.f32((d["I"], d["K"]), -4, 4), src.f32((d["K"], d["J"]), -4, 4)
        if kind == "nt":
            B = np.ascontiguousarray(B.T)
        if kind == "tn":
            A = np.ascontiguousarray(A.T)
        return {"A": A, "B": B}

    a = ("K", "I") if kind == "tn" else ("I", "K")
    b = ("J", "K") if kind == "nt" else ("K", "J")
    return LiveOp(("I", "K", "J"), (a, b, ("I", "J")), make)


for _name, _kind in (("matmul", "nn"), ("matmul_nt", "nt"), ("matmul_tn", "tn")):
    LIVE[_name] = _mm(_kind)
LIVE["matmul_i8"] = LiveOp(
    ("I", "K", "J"),
    (("I", "K"), ("K", "J"), ("I", "J")),
    lambda src, d: {
        "A": src.ints((d["I"], d["K"]), -128, 128).astype(np.int8),
        "B": src.ints((d["K"], d["J"]), -128, 128).astype(np.int8),
    },
    check=lambda d: "K must be at most 131071 ([mm.i8.c2])" if d["K"] > 131071 else None,
)
LIVE["dot"] = LiveOp(
    ("K",), (("K",), ("K",)), lambda src, d: {"x": src.f32(d["K"], -4, 4), "y": src.f32(d["K"], -4, 4)}
)
LIVE["sum"] = LiveOp(("I", "N"), (("I", "N"), ("I",)), lambda src, d: {"X": src.f32((d["I"], d["N"]))})
LIVE["max"] = LiveOp(("I", "N"), (("I", "N"), ("I",)), lambda src, d: {"X": src.f32((d["I"], d["N"]))})
LIVE["col_sum"] = LiveOp(("N", "J"), (("N", "J"), ("J",)), lambda src, d: {"X": src.f32((d["N"], d["J"]))})

# elementwise primitives: the domain each function is interesting on
_UNARY = {
    "recip": (-20, 20, False),
    "sqrt": (-20, 20, True),
    "rint": (-4, 24, False),
    "exp": (-3, 6, False),
    "log": (-30, 30, True),
    "tanh": (-4, 3, False),
    "sigmoid": (-4, 4, False),
    "sin": (-4, 6, False),
    "cos": (-4, 6, False),
}
for _name, (_lo, _hi, _pos) in _UNARY.items():
    LIVE[_name] = LiveOp(
        ("N",), (("N",), ("N",)), lambda src, d, lo=_lo, hi=_hi, pos=_pos: {"x": src.f32(d["N"], lo, hi, pos)}
    )
for _name in ("add", "sub", "mul", "fmax", "fmin"):
    LIVE[_name] = LiveOp(("N",), (("N",),) * 3, lambda src, d: {"a": src.f32(d["N"]), "b": src.f32(d["N"])})

# ---- transformer ops (table/model.py's calling conventions) -------------------------------

for _act in ("gelu", "silu"):
    LIVE[f"{_act}_forward"] = LiveOp(("N",), (("N",),) * 2, lambda src, d: {"x": src.uniform(d["N"], -6, 6)})
    LIVE[f"{_act}_backward"] = LiveOp(
        ("N",), (("N",),) * 3, lambda src, d: {"dout": src.f32(d["N"], -3, 1), "x": src.uniform(d["N"], -6, 6)}
    )
LIVE["swiglu_forward"] = LiveOp(
    ("N",), (("N",),) * 3, lambda src, d: {"a": src.uniform(d["N"], -6, 6), "b": src.f32(d["N"], -3, 1)}
)
LIVE["swiglu_backward"] = LiveOp(
    ("N",),
    (("N",),) * 5,
    lambda src, d: {"dout": src.f32(d["N"], -3, 1), "a": src.uniform(d["N"], -6, 6), "b": src.f32(d["N"], -3, 1)},
)

_LIN = ("N", "C", "OC")
LIVE["linear_forward"] = LiveOp(
    _LIN,
    (("N", "C"), ("OC", "C"), ("OC",), ("N", "OC")),
    lambda src, d: {
        "x": src.f32((d["N"], d["C"]), -3, 1),
        "W": src.f32((d["OC"], d["C"]), -3, 1),
        "b": src.f32(d["OC"], -3, 1),
    },
)
LIVE["linear_backward"] = LiveOp(
    _LIN,
    (("N", "OC"), ("N", "C"), ("OC", "C"), ("N", "C"), ("OC", "C"), ("OC",)),
    lambda src, d: {
        "dy": src.f32((d["N"], d["OC"]), -3, 1),
        "x": src.f32((d["N"], d["C"]), -3, 1),
        "W": src.f32((d["OC"], d["C"]), -3, 1),
    },
)


def _ln_forward_in(src, d):
    return {"x": src.f32((d["N"], d["C"]), -2, 2), "w": src.f32(d["C"], -1, 1), "b": src.f32(d["C"], -3, 1)}


def _ln_backward_in(src, d):
    f = _ln_forward_in(src, d)
    _, mean, rstd = _ops("norms").layernorm_forward(*_loaded(f["x"], f["w"], f["b"]))
    return {"dout": src.f32((d["N"], d["C"]), -3, 1), "x": f["x"], "w": f["w"], "mean": mean, "rstd": rstd}


def _rms_backward_in(src, d):
    x, w = src.f32((d["N"], d["C"]), -2, 2), src.f32(d["C"], -1, 1)
    _, rrms = _ops("norms").rmsnorm_forward(*_loaded(x, w))
    return {"dout": src.f32((d["N"], d["C"]), -3, 1), "x": x, "w": w, "rrms": rrms}


_NC, _C1 = ("N", "C"), {"C": 1}
LIVE["layernorm_forward"] = LiveOp(_NC, (_NC, ("C",), ("C",), _NC, ("N",), ("N",)), _ln_forward_in, _C1)
LIVE["layernorm_backward"] = LiveOp(_NC, (_NC, _NC, ("C",), ("N",), ("N",), _NC, ("C",), ("C",)), _ln_backward_in, _C1)
LIVE["rmsnorm_forward"] = LiveOp(
    _NC,
    (_NC, ("C",), _NC, ("N",)),
    lambda src, d: {"x": src.f32((d["N"], d["C"]), -2, 2), "w": src.f32(d["C"], -1, 1)},
    _C1,
)
LIVE["rmsnorm_backward"] = LiveOp(_NC, (_NC, _NC, ("C",), ("N",), _NC, ("C",)), _rms_backward_in, _C1)

_NV, _V1 = ("N", "V"), {"V": 1}
for _fn in ("softmax", "log_softmax"):
    LIVE[f"{_fn}_forward"] = LiveOp(_NV, (_NV, _NV), lambda src, d: {"x": src.f32((d["N"], d["V"]), -4, 3)}, _V1)

    def _sm_backward_in(src, d, f=_fn):
        y = getattr(_ops("softmax"), f"{f}_forward")(*_loaded(src.f32((d["N"], d["V"]), -4, 3)))
        return {"dy": src.f32((d["N"], d["V"]), -3, 1), "y": y}

    LIVE[f"{_fn}_backward"] = LiveOp(_NV, (_NV,) * 3, _sm_backward_in, _V1)


def _ce_in(src, d):
    t = src.ints(d["N"], -1, d["V"])  # -1: an ignored token
    return {"logits": src.f32((d["N"], d["V"]), -4, 3), "targets": t}


LIVE["cross_entropy_forward"] = LiveOp(_NV, (_NV, ("N",), ("N",)), _ce_in, _V1)
LIVE["cross_entropy_backward"] = LiveOp(_NV, (_NV, ("N",), _NV), _ce_in, _V1)

_ATT = ("B", "NH", "T", "HS")
_ATT1 = {x: 1 for x in _ATT}


def _qkv(src, d):
    return {n: src.f32(tuple(d[x] for x in _ATT), -3, 0) for n in ("q", "k", "v")}


def _att_backward_in(src, d):
    qkv = _qkv(src, d)
    _, att = _ops("attention").attention_forward(*_loaded(*qkv.values()))
    return {"dout": src.f32(tuple(d[x] for x in _ATT), -3, 1), **qkv, "att": att}


_ATT_T = ("B", "NH", "T", "T")
LIVE["attention_forward"] = LiveOp(_ATT, (_ATT,) * 4 + (_ATT_T,), _qkv, _ATT1)
LIVE["attention_backward"] = LiveOp(_ATT, (_ATT,) * 4 + (_ATT_T,) + (_ATT,) * 3, _att_backward_in, _ATT1)


def _rope_in(name):
    def make(src, d):
        cos_t, sin_t = _ops("rope").rope_tables(d["T"], d["HS"])
        return {name: src.f32(tuple(d[x] for x in _ATT), -2, 1), "cos_t": cos_t, "sin_t": sin_t}

    return make


def _even_hs(d):
    return "HS must be even (rotary pairs, [rope.fwd.c1])" if d["HS"] % 2 else None


_ROPE_T = (_ATT, ("T", "HS"), ("T", "HS"), _ATT)  # the tables are T x HS/2: bounded by T x HS
LIVE["rope_forward"] = LiveOp(_ATT, _ROPE_T, _rope_in("x"), {**_ATT1, "HS": 2}, _even_hs)
LIVE["rope_backward"] = LiveOp(_ATT, _ROPE_T, _rope_in("dout"), {**_ATT1, "HS": 2}, _even_hs)

_EMB = ("B", "T", "C", "V")
LIVE["embedding_forward"] = LiveOp(
    _EMB,
    (("V", "C"), ("B", "T"), ("B", "T", "C")),
    lambda src, d: {"wte": src.f32((d["V"], d["C"]), -3, 1), "tokens": src.ints((d["B"], d["T"]), 0, d["V"])},
    _V1,
)
LIVE["embedding_backward"] = LiveOp(
    _EMB,
    (("B", "T", "C"), ("B", "T"), ("V", "C")),
    lambda src, d: {
        "dout": src.f32((d["B"], d["T"], d["C"]), -3, 1),
        "tokens": src.ints((d["B"], d["T"]), 0, d["V"]),
        "V": np.array([d["V"]], np.int32),
    },
    _V1,
)


def _step(x):
    return np.array([_ops("quant").step_size(*_loaded(x))], np.float32)


def _fq_in(src, d):
    x = src.f32(d["N"], -4, 2)
    return {"x": x, "s": _step(x) * np.float32(1.5)}


def _bf16(op, base):
    """[bf16.ops.c1] The live form of bf16_<op>: the binary32 op's inputs
    rounded to bf16, statistics from the bf16 forward (``table.bf16.to_profile``)."""

    def make(src, d):
        from ..table.bf16 import to_profile

        return to_profile(op, base.make(src, d), lambda shape: src.f32(shape, -4, 3))

    return LiveOp(base.letters, base.tensors, make, base.minimum, base.check)


def _bf16_live():
    from ...ops.bf16 import PROFILE

    for op in PROFILE:
        if op in LIVE:
            LIVE[f"bf16_{op}"] = _bf16(op, LIVE[op])
    LIVE["bf16_encode"] = LiveOp(("N",), (("N",),) * 2, lambda src, d: {"x": src.f32(d["N"], -130, 127)})
    LIVE["bf16_decode"] = LiveOp(
        ("N",), (("N",),) * 2, lambda src, d: {"x": src.ints(d["N"], 0, 1 << 16).astype(np.uint16)}
    )


LIVE["quant_step_size"] = LiveOp(("N",), (("N",),), lambda src, d: {"x": src.f32(d["N"], -4, 2)})
LIVE["fake_quantize"] = LiveOp(("N",), (("N",), ("N",)), _fq_in)
LIVE["fake_quantize_backward"] = LiveOp(
    ("N",), (("N",),) * 3, lambda src, d: {"dy": src.f32(d["N"], -3, 1), **_fq_in(src, d)}
)
LIVE["adamw_update"] = LiveOp(
    ("N",),
    (("N",),) * 7,
    lambda src, d: {
        "p": src.f32(d["N"], -3, 0),
        "g": src.f32(d["N"], -8, -2),
        "m": src.f32(d["N"], -10, -4),
        "v": src.f32(d["N"], -20, -10, positive=True),
        "step": src.ints(1, 1, 1000),
        "lr": src.f32(1, -12, -8, positive=True),
    },
)


_bf16_live()


# ---- shapes ------------------------------------------------------------------------------


def live_op(op: str) -> LiveOp:
    if op not in OPS:
        raise InputError(f"unknown op {op!r} (ops: {', '.join(OPS)})")
    if op not in LIVE:
        raise InputError(f"op {op} has no live form yet (ops with one: {', '.join(o for o in OPS if o in LIVE)})")
    return LIVE[op]


def validate(op: str, dims: dict, max_elements: int = MAX_ELEMENTS) -> dict:
    """``dims`` checked against the op's letters, minimums, constraints and
    the element bound; returns the dims in the op's letter order."""
    lv = live_op(op)
    unknown = [x for x in dims if x not in lv.letters]
    if unknown:
        raise InputError(f"{op}: unknown shape letter(s) {', '.join(unknown)}; {op} takes {','.join(lv.letters)}")
    missing = [x for x in lv.letters if x not in dims]
    if missing:
        raise InputError(f"{op}: shape letter(s) {', '.join(missing)} missing; {op} takes {','.join(lv.letters)}")
    for x in lv.letters:
        v = dims[x]
        if isinstance(v, bool) or not isinstance(v, int) or not lv.minimum.get(x, 0) <= v <= MAX_DIM:
            raise InputError(f"{op}: {x}={v!r} out of range (an integer in [{lv.minimum.get(x, 0)}, {MAX_DIM}])")
    why = lv.check(dims) if lv.check else None
    if why:
        raise InputError(f"{op}: {why}")
    n = lv.elements(dims)
    if n > max_elements:
        raise InputError(
            f"{op} at {format_dims(dims)}: {n:,} elements in inputs and outputs, above the bound "
            f"of {max_elements:,} (default 2^27 = {MAX_ELEMENTS:,}; --max-elements changes it)"
        )
    return {x: dims[x] for x in lv.letters}


_ITEM = re.compile(r"([A-Z]{1,3})=(\d{1,19})")


def parse_shape(op: str, text: str, max_elements: int = MAX_ELEMENTS) -> dict:
    """``"I=4,K=11008,J=4096"`` -> {"I": 4, "K": 11008, "J": 4096}, validated."""
    dims: dict[str, int] = {}
    for item in text.split(","):
        m = _ITEM.fullmatch(item.strip())
        if not m:
            raise InputError(
                f"--shape: {item.strip()!r} is not LETTER=VALUE (a shape letter in capitals, a "
                f"non-negative decimal integer), e.g. --shape I=4,K=11008,J=4096"
            )
        if m.group(1) in dims:
            raise InputError(f"--shape: letter {m.group(1)} given twice")
        dims[m.group(1)] = int(m.group(2))
    return validate(op, dims, max_elements)


def format_dims(dims: dict) -> str:
    return ",".join(f"{x}={v}" for x, v in dims.items())


# ---- cases ---------------------------------------------------------------------------------


def expected(op: str, inputs: dict) -> dict[str, np.ndarray]:
    """The reference's outputs for these inputs, computed as ``generate.py``
    computes the committed vectors' (load the inputs, call the reference).
    A shape the reference refuses is an ``InputError``."""
    opdef = OPS[op]
    raw = [np.ascontiguousarray(inputs[n]) for n in opdef.inputs]
    try:
        return as_outputs(opdef.reference(*load_inputs(raw)), opdef.outputs)
    except ValueError as exc:
        raise InputError(f"{op}: the reference refuses these inputs: {exc}") from None


def make_case(op: str, inputs: dict, case_id: str, note: str, family: str = "random") -> Case:
    from ..base.case import FAMILIES

    opdef = OPS[op]
    prop, extra = FAMILIES[family]
    raw = {n: np.ascontiguousarray(inputs[n]) for n in opdef.inputs}
    return Case(
        case_id,
        op,
        family,
        f"live: {note}",
        list(dict.fromkeys(opdef.clauses + extra)),
        raw,
        expected(op, raw),
        opdef.bf16,
    )


def rng_for(op: str, dims: dict, seed: int) -> np.random.Generator:
    """One stream per (seed, op, shape): the cases of one run do not depend on
    which other shapes were asked for."""
    key = zlib.crc32(f"{op}:{format_dims(dims)}".encode())
    return np.random.default_rng([seed, key])


def build(op: str, dims: dict, seed: int, index: int = 0, label: str = "") -> Case:
    """A live case of ``op`` at ``dims`` (already validated) from ``seed``."""
    inputs = live_op(op).make(NumpySource(rng_for(op, dims, seed)), dims)
    note = f"{label + ': ' if label else ''}{format_dims(dims)}; seed {seed}"
    return make_case(op, inputs, f"{op}-live-{index:02d}", note)


def require_fit():
    """The checks of `refreplay doctor`: a live expected output is computed
    here, so an unfit platform would make it wrong.  Refused with exit 2."""
    from ... import doctor

    bad = [f for f in doctor.run_checks() if not f.ok]
    if bad:
        raise InputError(
            "refusing to compute live expected outputs on an unfit platform: "
            + "; ".join(f.detail for f in bad)
            + " (run `refreplay doctor`)"
        )


def preset_shapes(name: str) -> dict[str, list[tuple[str, dict]]]:
    """op -> [(label, dims)]: the shapes at which a model of preset ``name``
    ([model.config.c1]) calls each op, for one sequence of T tokens (N = T;
    a larger batch repeats the same rows).  Linear layers appear in all three
    matmul forms: the forward x·Wᵀ (matmul_nt, and matmul_i8 for int8
    linears), the input gradient dy·W (matmul) and the weight gradient dyᵀ·x
    (matmul_tn)."""
    from ...training.presets import preset

    m, _ = preset(name)
    C, NH, HS, T, F, Vv = m.width, m.heads, m.head_size, m.seq_len, m.mlp_hidden, m.vocab
    N = T
    lins = [
        ("attn.qkv", C, 3 * C),
        ("attn.proj", C, C),
        ("mlp.fc" if m.mlp == "gelu" else "mlp.gate/up", C, F),
        ("mlp.proj", F, C),
        ("head", C, Vv),
    ]
    out: dict[str, list[tuple[str, dict]]] = {}

    def add(ops, label, **dims):
        for op in ops:
            if op in LIVE:
                out.setdefault(op, []).append((label, dims))

    for label, ic, oc in lins:
        add(("linear_forward", "linear_backward"), label, N=N, C=ic, OC=oc)
        add(("matmul_nt", "matmul_i8"), f"{label} forward", I=N, K=ic, J=oc)
        add(("matmul",), f"{label} input gradient", I=N, K=oc, J=ic)
        add(("matmul_tn",), f"{label} weight gradient", I=oc, K=N, J=ic)
        add(("col_sum",), f"{label} bias gradient", N=N, J=oc)
    add(("dot",), "a row of x·Wᵀ", K=C)
    att = dict(B=1, NH=NH, T=T, HS=HS)
    add(("attention_forward", "attention_backward", "rope_forward", "rope_backward"), "attention", **att)
    for fn in ("softmax", "log_softmax"):
        add((f"{fn}_forward", f"{fn}_backward"), "attention rows", N=NH * T, V=T)
        add((f"{fn}_forward", f"{fn}_backward"), "logits", N=N, V=Vv)
    add(("cross_entropy_forward", "cross_entropy_backward"), "logits", N=N, V=Vv)
    add(("max",), "logits rows", I=N, N=Vv)
    add(("sum",), "residual rows", I=N, N=C)
    norms = (
        ("layernorm_forward", "layernorm_backward") if m.norm == "layer" else ("rmsnorm_forward", "rmsnorm_backward")
    )
    add(norms, "norm", N=N, C=C)
    add(("embedding_forward", "embedding_backward"), "embedding", B=1, T=T, C=C, V=Vv)
    add(
        (
            "gelu_forward",
            "gelu_backward",
            "silu_forward",
            "silu_backward",
            "swiglu_forward",
            "swiglu_backward",
            *_UNARY,
        ),
        "MLP hidden",
        N=N * F,
    )
    add(("add", "sub", "mul", "fmax", "fmin"), "residual", N=N * C)
    add(("quant_step_size", "fake_quantize", "fake_quantize_backward", "adamw_update"), "MLP weight", N=C * F)
    from ...ops.bf16 import PROFILE

    for op in PROFILE:  # [bf16.ops.c1] a bf16 op meets the shapes of its binary32 op
        if op in out and f"bf16_{op}" in LIVE:
            out[f"bf16_{op}"] = list(out[op])
    add(("bf16_encode", "bf16_decode"), "residual", N=N * C)
    return out
