"""Misreadings of the bf16 profile (``spec/08-bf16.txt``), modelled in NumPy:
what a kernel computes that truncates to bf16, rounds ties away from zero,
accumulates in bf16, keeps bf16 subnormal inputs, or rounds an internal
value to bf16.  The probe families of [bf16.probes.c1] are checked against
them when the vectors are generated (a probe that does not isolate its
misreading is refused), and the diagnosis names the ones that reproduce a
failing kernel ([conf.diagnosis.r1]).

Nothing here is on the normative path: expected outputs come from
``ops.bf16.apply``.  A misreading is a function ``(op, loaded inputs) ->
outputs`` in the stored form (uint16 bits for bf16 tensors, float32 for
binary32), or ``None`` where it does not apply to the op.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..base import deviant as fp
from ..base.bf16 import F32, loaded, rne, round_f32, ties_away, truncate, widen

# ---- the op in the profile, with one misreading ----------------------------------------------


def _base(op):
    return op.name[len("bf16_") :]


# the conversions as ops of the profile: the binary32 op between them is the identity
_CONVERSIONS = {"encode": ("f", "h"), "decode": ("h", "f")}


def _kinds(op):
    from ...ops.bf16 import PROFILE

    return _CONVERSIONS.get(_base(op)) or PROFILE[_base(op)]


def _profile(op, inputs, *, widen_in=loaded, round_out=rne, round_f=None):
    """The binary32 op between conversions: h inputs through ``widen_in``, h
    outputs through ``round_out``; ``round_f`` also rounds the binary32 outputs."""
    from ...numerics import load
    from ...ops.bf16 import FP32

    kin, kout = _kinds(op)
    args = [widen_in(x) if k == "h" else load(x) if k == "f" else x for k, x in zip(kin, inputs)]
    with np.errstate(all="ignore"):
        out = args[0] if _base(op) in _CONVERSIONS else FP32[_base(op)](*args)
    outs = out if isinstance(out, tuple) else (out,)
    return tuple(
        round_out(o) if k == "h" else (widen(round_f(o)) if round_f else np.asarray(o, F32)) for k, o in zip(kout, outs)
    )


def _has(op, kind_side, kind):
    from ...ops.bf16 import PROFILE

    return (
        op.name.startswith("bf16_")
        and (_base(op) in PROFILE or _base(op) in _CONVERSIONS)
        and kind in _kinds(op)[kind_side]
    )


def truncating(op, inputs):
    return _profile(op, inputs, round_out=truncate) if _has(op, 1, "h") else None


def rounding_ties_away(op, inputs):
    return _profile(op, inputs, round_out=ties_away) if _has(op, 1, "h") else None


def keeping_subnormals(op, inputs):
    return _profile(op, inputs, widen_in=widen) if _has(op, 0, "h") else None


def rounding_f32_outputs(op, inputs):
    """Every output rounded to bf16, the binary32 ones too (a kernel that
    stores a bare matmul product or a statistic in bf16, where
    [bf16.tensors.c1] keeps them binary32)."""
    return _profile(op, inputs, round_f=rne) if _has(op, 1, "f") else None


# ---- accumulation in bf16 ([bf16.matmul.c1]) ------------------------------------------------


def bf16_accumulated(a, b) -> np.ndarray:
    """R sums of products a*b (rows), the accumulator rounded to bf16 after
    every addition (from -0, k increasing)."""
    acc = np.full(a.shape[0], F32(-0.0))
    for k in range(a.shape[1]):
        acc = round_f32(fp.add(acc, fp.mul(a[:, k], b[:, k])))
    return acc


def halves_rounded(a, b) -> np.ndarray:
    """The sums split in two halves, each half's binary32 sum rounded to bf16, then added."""
    from ... import linalg

    t = np.ascontiguousarray(fp.mul(a, b), F32)
    h = (t.shape[1] + 1) // 2
    return fp.add(
        round_f32(linalg.row_sum(np.ascontiguousarray(t[:, :h]))),
        round_f32(linalg.row_sum(np.ascontiguousarray(t[:, h:]))),
    )


def _summed(op, inputs, fn):
    if op.terms is None or not op.name.startswith("bf16_matmul"):
        return None
    a, b = op.terms(*inputs)
    with np.errstate(all="ignore"):
        return (fn(a, b).reshape(op.reference(*inputs).shape),)


def accumulating_in_bf16(op, inputs):
    return _summed(op, inputs, bf16_accumulated)


def rounding_partial_sums(op, inputs):
    if op.terms is not None and op.terms(*inputs)[0].shape[1] < 2:  # no two halves to split into
        return None
    return _summed(op, inputs, halves_rounded)


# ---- an internal value rounded to bf16 ([bf16.ops.c1]: no other rounding) ----------------------


def _attention_out(att, v):
    """[attn.out.c1] out = att·v over s <= t, from -0, s increasing (``variants``' form)."""
    from . import transformer as Vr

    T = att.shape[-1]
    future = np.triu(np.ones((T, T), bool), 1)
    *lead, _, HS = v.shape
    a = np.broadcast_to(np.where(future, F32(-0.0), att)[..., :, None, :], (*lead, T, HS, T)).reshape(-1, T)
    vt = np.swapaxes(v, -1, -2)
    b = np.where(future[:, None, :], F32(0), np.broadcast_to(vt[..., None, :, :], (*lead, T, HS, T)))
    return Vr.dot(Vr.SPEC, a, b.reshape(-1, T)).reshape(v.shape)


def _layernorm_out(x, w, b, mean, rstd, keep):
    from . import transformer as Vr

    norm = Vr.mul(Vr.sub(x, mean[:, None]), rstd[:, None])
    return Vr.add(Vr.mul(keep(norm), w), b)


def _softmax_out(x, keep):
    from . import transformer as Vr

    _, e, _ = Vr._exp_rows(x, Vr.SPEC)
    e = keep(e)
    return Vr.scale_by_recip(e, Vr._rows(Vr.SPEC, e))


def _intermediate(op, inputs, keep):
    """The op with its internal value passed through ``keep`` (identity: the
    spec's bits; ``round_f32``: the misreading).  Internal values: the
    probabilities before att·v, the normalised value before the affine, the
    exponentials before their sum."""
    base = _base(op) if op.name.startswith("bf16_") else ""
    with np.errstate(all="ignore"):
        if base == "attention_forward":
            q, k, v = (loaded(x) for x in inputs)
            from ...ops import attention

            _, att = attention.attention_forward(q, k, v)
            return rne(_attention_out(keep(att), v)), att
        if base == "layernorm_forward":
            x, w, b = (loaded(t) for t in inputs)
            from ...ops import norms

            _, mean, rstd = norms.layernorm_forward(x, w, b)
            return rne(_layernorm_out(x, w, b, mean, rstd, keep)), mean, rstd
        if base == "softmax_forward":
            return (rne(_softmax_out(loaded(inputs[0]), keep)),)
    return None


INTERMEDIATE_OPS = ("bf16_attention_forward", "bf16_layernorm_forward", "bf16_softmax_forward")


def rounding_an_intermediate(op, inputs):
    return _intermediate(op, inputs, round_f32)


def unrounded_intermediate(op, inputs):
    """The emulation of ``rounding_an_intermediate`` without the rounding:
    must give the spec's bits, so the probe shows the rounding and nothing else."""
    return _intermediate(op, inputs, lambda x: x)


# ---- the table ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Misreading:
    name: str  # what the diagnosis says
    family: str  # the probe family built to isolate it
    fn: Callable  # (op, loaded inputs) -> outputs, or None
    clauses: tuple[str, ...]


MISREADINGS = (
    Misreading("rounds to bf16 by truncation (drops the low 16 bits)", "bf16_rounding", truncating, ("bf16.round.c1",)),
    Misreading(
        "rounds to bf16 with ties away from zero (the spec: ties to even)",
        "bf16_rounding",
        rounding_ties_away,
        ("bf16.round.c1",),
    ),
    Misreading(
        "accumulates in bf16 (the accumulator rounded to bf16 after every addition)",
        "bf16_accumulation",
        accumulating_in_bf16,
        ("bf16.matmul.c1", "bf16.ops.c1"),
    ),
    Misreading(
        "rounds partial sums to bf16 (split-K halves stored in bf16)",
        "bf16_accumulation",
        rounding_partial_sums,
        ("bf16.matmul.c1", "bf16.ops.c1"),
    ),
    Misreading("bf16 subnormal inputs not zeroed", "bf16_input_zeroing", keeping_subnormals, ("bf16.load.c1",)),
    Misreading(
        "rounds an intermediate to bf16 (probabilities, normalised values or exponentials)",
        "bf16_intermediate",
        rounding_an_intermediate,
        ("bf16.ops.c1", "bf16.rounding.r1"),
    ),
    Misreading(
        "rounds a binary32 output to bf16 (a bare product, statistic or gradient sum stays binary32)",
        "random",
        rounding_f32_outputs,
        ("bf16.ops.c1", "bf16.tensors.c1"),
    ),
)


def differs(expected, other) -> bool:
    """Some element's bits differ (NaN against NaN of any payload: equal)."""
    e, o = np.asarray(expected), np.asarray(other)
    if e.shape != o.shape or e.dtype != o.dtype:
        return True
    if e.dtype == np.uint16:
        return bool(np.any((e != o) & ~(((e & 0x7FFF) > 0x7F80) & ((o & 0x7FFF) > 0x7F80))))
    return bool(np.any((fp.bits(e) != fp.bits(o)) & ~(np.isnan(e) & np.isnan(o))))


def matches(actual: tuple, other) -> bool:
    """Every output equal bit for bit but for NaN payloads (a non-canonical
    NaN is a finding of its own, and must not hide the arithmetic)."""
    if other is None or len(actual) != len(other):
        return False
    return not any(differs(a, o) for a, o in zip(actual, other))


def same(expected: tuple, other) -> bool:
    """Every output bit for bit equal (NaN payloads included)."""
    if other is None or len(expected) != len(other):
        return False
    for e, o in zip(expected, other):
        e, o = np.asarray(e), np.asarray(o)
        if e.shape != o.shape or e.dtype != o.dtype:
            return False
        u = np.dtype(f"u{e.dtype.itemsize}")
        if not np.array_equal(np.ascontiguousarray(e).view(u), np.ascontiguousarray(o).view(u)):
            return False
    return True
