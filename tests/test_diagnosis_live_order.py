"""[conf.diagnosis.r1] A matmul that fails only random (live, sweep) cases
gets its summation order named from those cases, whole or sliced, as the
committed order probes name it; a kernel whose deviation is not an order
gets no order named, only the closest candidate with counts; an order that
reproduces every failing case but breaks a case the kernel passes is not
named either (issue 31)."""

from __future__ import annotations

import re

import pytest

import refreplay.conformance as rc
from refreplay.conformance.diagnosis import slices as S
from refreplay.conformance.diagnosis.diagnose import SLICED, diagnose
from refreplay.conformance.running import adapters, compare
from refreplay.conformance.shapes import live
from refreplay.conformance.table import OPS

SMALL = "I=4,K=300,J=5"  # re-evaluated whole
LARGE = "I=64,K=1024,J=128"  # its models take 192 MiB, above SLICE_FROM: re-evaluated on a slice

ORDERS = [("split_k", "blocked/split-k, blocks of 64"), ("strided_lanes", "8 strided lanes + butterfly (SIMD/warp)")]


@pytest.fixture(autouse=True)
def _kernels_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).parent))


def _run(kernel, op, shapes):
    cases = [live.build(op, live.parse_shape(op, s), 0, i) for i, s in enumerate(shapes)]
    return compare.run(adapters.resolve(f"order_kernels:{kernel}"), cases, [])


def _messages(kernel, op, *shapes):
    results = _run(kernel, op, shapes)
    return [f.message for f in diagnose(op, results)]


def _matched(msgs) -> list[str]:
    """The candidate orders an order finding names ([] if none)."""
    for m in msgs:
        hit = re.search(r"output matches (any of: )?(.*?)( \(every element|$)", m)
        if hit:
            return hit.group(2).split("; ")
    return []


def test_the_large_shape_is_sliced():
    case = live.build("matmul", live.parse_shape("matmul", LARGE), 0)
    assert S.model_bytes(OPS["matmul"], compare.Result(case, "fail", actual=case.outputs)) > S.SLICE_FROM


@pytest.mark.parametrize("kernel,order", ORDERS)
def test_the_committed_order_probes_name_the_kernels_order(kernel, order):
    import order_kernels

    report = rc.check(getattr(order_kernels, kernel), ops=["matmul"])
    found = [d["message"] for d in report.diagnosis if d["message"].startswith("sums in a different order")]
    assert order in _matched(found), found


@pytest.mark.parametrize("op", ["matmul", "matmul_nt", "matmul_tn"])
@pytest.mark.parametrize("shape", [SMALL, LARGE])
@pytest.mark.parametrize("kernel,order", ORDERS)
def test_a_live_failure_gets_the_order_the_probes_name(kernel, order, shape, op):
    """The probes cannot tell a fused from an unfused split (their products
    are exact); the live cases can, and name the unfused one alone."""
    msgs = _messages(kernel, op, shape)
    assert _matched(msgs) == [order], msgs
    named = next(m for m in msgs if "output matches" in m)
    assert named.startswith("sums in a different order — no probe isolates it; "), named
    assert "every element of the failing random case re-evaluated" in named, named
    sliced = [m for m in msgs if m.startswith(SLICED)]
    assert bool(sliced) == (shape == LARGE), msgs
    if sliced:  # the slice note says what is re-evaluated for a matmul: no variant model exists
        assert "for each candidate summation order" in sliced[0] and "variant" not in sliced[0], sliced


@pytest.mark.parametrize("shape", [SMALL, LARGE])
@pytest.mark.parametrize("kernel", ["tf32", "one_element"])
def test_a_deviation_that_is_no_order_gets_no_order_named(kernel, shape):
    msgs = _messages(kernel, "matmul", shape, "I=3,K=200,J=2")
    assert _matched(msgs) == [], msgs
    assert not any(m.startswith("sums in a different order") for m in msgs), msgs
    (said,) = [m for m in msgs if "candidate order" in m]
    counts = re.search(r"(reproduces (\d+) of the (\d+)|reproduces any of the (\d+)) differing elements among", said)
    assert counts, said
    if counts.group(2):  # a partial match is counted, and is fewer than all
        assert int(counts.group(2)) < int(counts.group(3)), said


def test_an_order_that_breaks_a_passing_case_is_not_named():
    """split-K from 512 terms on: blocks of 64 reproduce the long case that
    fails, but change the short case the kernel passes (K = 300, where the
    kernel keeps the spec's order), so the kernel's order is not that one."""
    results = _run("split_k_long", "matmul", [LARGE, SMALL])
    assert [r.status for r in results] == ["fail", "pass"]
    msgs = [f.message for f in diagnose("matmul", results)]
    assert _matched(msgs) == [], msgs
    (said,) = [m for m in msgs if "candidate order" in m]
    assert "blocked/split-k, blocks of 64 reproduces every element of the failing random case" in said, said
    assert re.search(r"but changes \d+ elements of the 1 case the kernel passes", said), said
