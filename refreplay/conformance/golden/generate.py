"""Build every case of every op in the op table, deterministically
([conf.verify.c1]: byte-for-byte regeneration).

Each op draws from its own random stream, seeded by (SEED, crc32(op name)),
so adding an op leaves the other ops' vectors unchanged.  Expected outputs
come from the reference only ([conv.conformance.c1]); the probe families'
isolation claims are checked on the spot (``separation.ProbeError``).
"""

from __future__ import annotations

import zlib

import numpy as np

from ..inputs import builders, separation
from ..shapes import edges
from ..base import deviant as fp
from ..shapes import axes as axis_sweeps
from ..base.case import FAMILIES, Case, as_outputs, load_inputs
from ..table import OPS

SEED = 20261129
GENERATOR_VERSION = "1"


def op_names() -> list[str]:
    return list(OPS)


def build_op(name: str) -> list[Case]:
    op = OPS[name]
    rng = np.random.default_rng([SEED, zlib.crc32(name.encode())])
    cases: list[Case] = []
    counters: dict[str, int] = {}
    distinguished: set[str] = set()
    # the axis sweeps ([conf.domain.c1]) draw from a stream of their own, after the op's own cases,
    # so adding them (like edges' own stream, issue 31) left every earlier case's bits unchanged
    axes = np.random.default_rng([SEED, zlib.crc32(name.encode()), 1])
    own = op.build(op, rng) + edges.extra(op, SEED)
    built = [(f, i, n, {}, True) for f, i, n in own] + axis_sweeps.axis_cases(op, axes)
    for family, inputs, note, tiles, separate in built:
        if family not in FAMILIES:
            raise separation.ProbeError(f"{name}: unknown family {family}")
        raw = [np.ascontiguousarray(inputs[n]) for n in op.inputs]
        outputs = as_outputs(op.reference(*load_inputs(raw)), op.outputs)
        _check_probe(op, family, raw, outputs, distinguished, separate)
        idx = counters.get(family, 0)
        counters[family] = idx + 1
        prop, extra = FAMILIES[family]
        axis = ("conf.domain.c1",) if note.startswith(("axis ", "aligned ")) else ()
        clauses = list(dict.fromkeys(op.clauses + extra + axis + (("conf.vectors.c2",) if tiles else ())))
        tiles = dict(tiles)
        if tiles:  # [conf.vectors.c2] every tensor of the tiled length is stored tiled: outputs too
            n = next(a.size for k, a in zip(op.inputs, raw) if f"in/{k}" in tiles)
            tiles.update({f"out/{k}": axis_sweeps.TILE for k, a in outputs.items() if a.size == n})
            for k, a in outputs.items():
                if (
                    f"out/{k}" in tiles
                    and not (
                        a.reshape(-1).view(np.uint8) == np.resize(a.reshape(-1)[: axis_sweeps.TILE], n).view(np.uint8)
                    ).all()
                ):
                    raise separation.ProbeError(f"{name}: output {k} of a tiled case is not tiled")
        hashed = _hashed(name, outputs)
        cases.append(
            Case(
                f"{name}-{family}-{idx:02d}",
                name,
                family,
                f"{prop} ({note})",
                clauses,
                dict(zip(op.inputs, raw)),
                outputs,
                op.bf16,
                tiles,
                _causal(name, op) - hashed,  # a hashed att is not stored at all
                hashed,
            )
        )
    if counters.get("order") and op.terms is not None:
        missing = builders.MUST_DISTINGUISH - distinguished
        if missing:
            raise separation.ProbeError(f"{name}: order probes do not separate {sorted(missing)}")
    return cases


def _causal(name, op) -> frozenset[str]:
    """[conf.vectors.c3] The attention ops' att [B, NH, T, T], +0 above the diagonal
    ([attn.out.c1]), is stored as its lower triangles (``store.stored`` checks the +0)."""
    if name.removeprefix("bf16_") not in ("attention_forward", "attention_backward"):
        return frozenset()
    return frozenset(f"{kind}/att" for kind, names in (("in", op.inputs), ("out", op.outputs)) if "att" in names)


HASHED_FROM = 1 << 18  # elements: att at T = 513 and beyond, of one (b, h) pair


def _hashed(name, outputs) -> frozenset[str]:
    """[conf.vectors.c4] The attention forwards' att output of 2^18 elements or more is held by
    its sha256 alone (stored, T = 1,024 took 2.1 MB); out, and every smaller att, are stored."""
    if name.removeprefix("bf16_") != "attention_forward" or outputs["att"].size < HASHED_FROM:
        return frozenset()
    return frozenset({"out/att"})


def _check_probe(op, family, raw, outputs, distinguished, separate=True):
    first = next(iter(outputs.values()))
    if family.startswith("bf16_"):
        from ..table.bf16 import check_probe

        check_probe(op, family, raw, outputs)
    if family == "input_zeroing":
        unloaded = as_outputs(op.reference(*raw), op.outputs)
        if not any(builders.differs(outputs[k], unloaded[k]).any() for k in outputs):
            raise separation.ProbeError(f"{op.name}: input_zeroing probe does not depend on zeroing")
    if family in ("ftz_before_rounding", "ftz_after_rounding"):
        if not (np.abs(first) == fp.FLT_MIN).any():
            raise separation.ProbeError(f"{op.name}: no output rounds up to FLT_MIN")
        if op.name == "mul":  # the window separates the flush modes, product by product
            a, b = raw
            x86 = fp.mul_ftz_unbounded(a, b)
            if not (fp.mul_ftz_before(a, b) == 0).all() or not ((x86 == 0) == (family == "ftz_after_rounding")).all():
                raise separation.ProbeError(f"{op.name}: {family} products outside their window")
    if family == "empty" and not any(0 in x.shape for x in raw):
        raise separation.ProbeError(f"{op.name}: empty probe without a zero-length input")
    if op.terms is not None:
        terms = op.terms(*load_inputs(raw))
        builders.check_isolation(family, terms, first.ravel())
        if family == "sweep" and separate:
            separation.check_sweep(terms, first.ravel())
        if family == "order":
            distinguished |= builders.distinguished_orders(terms, first.ravel(), terms[1] is not None)


def build_all(names=None) -> list[Case]:
    out = []
    for name in names or op_names():
        out.extend(build_op(name))
    return out
