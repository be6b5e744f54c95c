"""Diagnoses that stay true on real kernels (issue 31, [conf.diagnosis.r1]).
Each kernel below deviates from the reference in known ways, and the
findings must name exactly those: a NaN payload beside a 1-ulp difference
names both; a sum started from +0 is named as such; a variant that explains
only part of the differences is called partial, with counts; a libm tanhf
and a loss computed as -log(e/s) are named; differences that cluster in an
input range are located."""
from __future__ import annotations

import numpy as np
import pytest

import refreplay.conformance as rc
from refreplay.conformance import fp
from refreplay.conformance.cases import load_inputs
from refreplay.conformance.registry import OPS

F32 = np.float32


def _reference(op, *inputs):
    out = OPS[op].reference(*load_inputs([np.ascontiguousarray(x) for x in inputs]))
    return out if isinstance(out, tuple) else (out,)


def _messages(report, op):
    return [d["message"] for d in report.diagnosis if d["op"] == op]


def _x86_nan_and_one_ulp(outs):
    """Every NaN as x86's default NaN 0xFFC00000 and every finite nonzero
    value with an odd last bit moved one ulp away from zero."""
    moved = []
    for o in outs:
        b = fp.bits(o).astype(np.int64)
        bump = np.isfinite(o) & (o != 0) & (b % 2 == 1) & (np.abs(o) < F32(1e30))
        b = np.where(bump, b + 1, b)
        b = np.where(np.isnan(o), 0xFFC00000, b)
        moved.append(b.astype(np.uint32).view(F32))
    return tuple(moved) if len(moved) > 1 else moved[0]


@pytest.mark.parametrize("op", ["adamw_update", "layernorm_backward", "linear_backward"])
def test_a_nan_payload_does_not_hide_a_one_ulp_difference(op):
    report = rc.check(lambda name, *xs: _x86_nan_and_one_ulp(_reference(name, *xs)), ops=[op])
    msgs = _messages(report, op)
    assert any(m.startswith("non-canonical NaN (0xFFC00000") for m in msgs), msgs
    rest = [m for m in msgs if m.startswith("with NaN payloads set aside: ")]
    assert rest and any("median of 1 ulp" in m for m in rest), msgs


def test_nan_payloads_alone_get_only_the_nan_finding():
    """The same kernel without the 1-ulp move: nothing remains to report."""
    def kernel(name, *xs):
        outs = _reference(name, *xs)
        outs = tuple(np.where(np.isnan(o), fp.f32(0xFFC00000), o).astype(F32) for o in outs)
        return outs if len(outs) > 1 else outs[0]

    report = rc.check(kernel, ops=["layernorm_backward"])
    msgs = _messages(report, "layernorm_backward")
    assert len(msgs) == 1 and msgs[0].startswith("non-canonical NaN"), msgs
