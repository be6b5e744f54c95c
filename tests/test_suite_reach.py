"""What the committed suite reaches ([conf.probes.c1], [conf.vectors.c1]):
the sweep lengths the issue asks for, an empty reduction for every sum, the
branch boundaries of chapter 2 at the value and its neighbours, the ops of
chapter 5, and generator checks that refuse a vacuous sweep or empty probe."""

import numpy as np
import pytest

from refreplay.conformance.inputs import separation
from refreplay.conformance.base import deviant as fp
from refreplay.conformance.golden import generate
from refreplay.conformance.golden import store
from refreplay.conformance.table import OPS


@pytest.fixture(scope="module")
def manifest():
    return store.read_manifest()


def _longest(manifest, op, family, name, axis):
    return max(
        (
            t["shape"][axis]
            for c in manifest["cases"]
            if c["op"] == op and c["family"] == family
            for t in c["inputs"]
            if t["name"] == name
        ),
        default=0,
    )


def _lengths(manifest, op, name, axis):
    return {
        t["shape"][axis]
        for c in manifest["cases"]
        if c["op"] == op and c["family"] == "sweep"
        for t in c["inputs"]
        if t["name"] == name
    }


def test_sweeps_reach_the_production_lengths(manifest):
    assert _longest(manifest, "matmul", "sweep", "A", 1) >= 65536
    assert _longest(manifest, "dot", "sweep", "x", 0) >= 65536
    assert _longest(manifest, "sum", "sweep", "X", 1) >= 65536
    for op in ("softmax_forward", "log_softmax_forward", "cross_entropy_forward"):
        name = "logits" if op.startswith("cross") else "x"
        assert max(_lengths(manifest, op, name, 1)) >= 65536 and 50257 in _lengths(manifest, op, name, 1), op
    assert _longest(manifest, "attention_forward", "sweep", "q", 2) >= 1024
    for op in ("layernorm_forward", "rmsnorm_forward", "layernorm_backward", "rmsnorm_backward"):
        assert _longest(manifest, op, "sweep", "x", 1) >= 8192, op
    assert _longest(manifest, "matmul_i8", "sweep", "A", 1) == 131071  # [mm.i8.c2]
    ks = _lengths(manifest, "matmul", "A", 1)
    for p in range(6, 13):  # powers of two and both neighbours
        assert {2**p - 1, 2**p, 2**p + 1} <= ks


def test_every_sum_has_an_empty_case(manifest):
    for op in (
        "sum",
        "col_sum",
        "max",
        "dot",
        "matmul",
        "matmul_nt",
        "matmul_tn",
        "matmul_i8",
        "linear_forward",
        "linear_backward",
        "embedding_backward",
        "quant_step_size",
    ):
        assert any(c["op"] == op and c["family"] == "empty" for c in manifest["cases"]), op


def test_empty_sums_are_plus_zero_and_the_empty_max_minus_inf():
    _, cases = store.load_cases(ops={"sum", "max", "matmul"})
    for c in cases:
        if c.family == "empty":
            out = next(iter(c.outputs.values()))
            want = 0xFF800000 if c.op == "max" else 0x00000000
            assert (fp.bits(out) == want).all(), c.id


def test_branch_boundaries_hold_the_value_and_its_neighbours():
    _, cases = store.load_cases(ops={"exp", "tanh", "log", "sin", "rint"})
    edge = {c.op: fp.bits(c.inputs["x"]) for c in cases if c.family == "edge" and "branch" in c.probes}
    for op, pattern in (
        ("exp", 0x42B17217),
        ("tanh", 0x3F400000),
        ("log", 0x3FB504F3),
        ("sin", 0x46800000),
        ("rint", 0x3F000000),
    ):
        assert {pattern - 1, pattern, pattern + 1} <= set(edge[op].tolist()), op
    assert (edge["tanh"] == 0x3F400000 - 200).any()  # where two formulas meet: 200 ulps either side


def test_chapter_5_has_vector_ops(manifest):
    ops = {c["op"] for c in manifest["cases"]}
    assert {"rng_philox", "rng_words", "rng_unit", "rng_symmetric", "rng_bounded", "rng_permutation"} <= ops
    _, cases = store.load_cases(ops={"rng_philox"})
    edge = next(c for c in cases if c.family == "edge")
    triples = zip(edge.inputs["counter"].tolist(), edge.inputs["key"].tolist(), edge.outputs["out"].tolist())
    rows = {tuple(c) + tuple(k): tuple(o) for c, k, o in triples}
    # the Random123 known answer of [rng.philox.c1]
    assert rows[(0, 0, 0, 0, 0, 0)] == (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)


def test_a_sweep_that_a_split_cannot_tell_apart_is_refused():
    x = np.ones((1, 64), np.float32)  # every split of a sum of ones gives 64
    with pytest.raises(separation.ProbeError):
        separation.check_sweep((x, None), np.array([64.0], np.float32))
    with pytest.raises(separation.ProbeError):
        separation.separating(OPS["sum"], lambda: {"X": x}, tries=2)


def test_an_empty_probe_needs_a_zero_length_input():
    op = OPS["sum"]
    X = np.ones((2, 3), np.float32)
    with pytest.raises(separation.ProbeError):
        generate._check_probe(op, "empty", [X], {"out": op.reference(X)}, set())
