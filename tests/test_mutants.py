"""Mutation testing of the golden vectors ([conf.probes.c1], [conf.runner.c1]):
every wrong reading of the spec in ``tests/mutants.py`` must fail the
committed vectors when the runner checks it as a Python kernel, while the
faithful transcription it varies passes them (so the one change is what
fails).  Readings that are equivalent (same bits on every input, argued in
``mutants.EQUIVALENT``) must pass.

The default run gives each kernel its op's cases without the sweep family
(thin-but-long shapes that cost seconds in plain NumPy), except for mutants
that only misbehave at long reductions; ``-m slow`` runs every case.
"""

import numpy as np
import pytest

import mutants as M
from refreplay.conformance.running import adapters as kernels
from refreplay.conformance.running import compare as runner
from refreplay.conformance.golden import store

# Mutants whose change is a shape-dependent switch: only the sweep cases reach it.
SHAPE_SWITCHES = {"sum split above 8192", "matmul split-K above 4096", "softmax online above V=4096"}


@pytest.fixture(scope="module")
def by_op():
    ops = {op for op, *_ in M.MUTANTS.values()} | set(M.CORRECT) | {op for op, *_ in M.EQUIVALENT.values()}
    _, cases = store.load_cases(ops=ops)
    out = {}
    for c in cases:
        out.setdefault(c.op, []).append(c)
    return out


def _cases(by_op, op, sweeps):
    return [c for c in by_op[op] if sweeps or c.family != "sweep"]


def _results(fn, cases):
    kernel = kernels.PythonCallable("mutant", lambda op, *xs: fn(*xs), per_op=False)
    return runner.run(kernel, cases)


def test_at_least_thirty_mutants_over_every_chapter():
    ops = {op for op, *_ in M.MUTANTS.values()}
    assert len(M.MUTANTS) >= 30
    assert {
        "rng_philox",
        "softmax_forward",
        "cross_entropy_forward",
        "adamw_update",
        "fake_quantize",
        "layernorm_forward",
        "attention_forward",
        "matmul",
        "exp",
    } <= ops
    assert set(ops) <= set(M.CORRECT)


@pytest.mark.parametrize("op", sorted(M.CORRECT))
def test_faithful_transcription_passes(by_op, op):
    """The control: without its change a mutant's kernel gives the vectors' bits."""
    bad = [r.case.id for r in _results(M.CORRECT[op], _cases(by_op, op, False)) if r.status != "pass"]
    assert bad == []


@pytest.mark.parametrize("name", sorted(M.MUTANTS))
def test_mutant_fails_the_vectors(by_op, name):
    op, fn, clause, what = M.MUTANTS[name]
    results = _results(fn, _cases(by_op, op, name in SHAPE_SWITCHES))
    failing = [r for r in results if r.status == "fail"]
    assert failing, f"{name} ({what}, [{clause}]) passes every case of {op}"


def test_binary64_scale_fails_one_edge_case(by_op):
    """[attn.bwd.c1] [num.flush.c1] attention's backward with dz = ds * scale formed in
    binary64 and flushed before its rounding (refreplay's own kernel did this until
    session 27) passed every vector until attention_backward-edge-07, which puts the
    exact dz half a subnormal ulp below 2^-126; it fails that case alone.  Its bf16
    twin (test_edge_vectors) fails the bf16 case where att times a bf16 dp rounds to
    the one binary32 ds, (2^24 - 1) * 2^-147, whose product with 2^-3 lies in the
    window (inputs.model.dz_rounds_up_to_normal_bf16)."""
    results = _results(M.k_attention_backward_binary64_scale, _cases(by_op, "attention_backward", False))
    failing = {r.case.id for r in results if r.status != "pass"}
    assert failing == {"attention_backward-edge-07"}


# An equivalent reading is written in plain NumPy, a minute or more on each 2^22 + 1-element case
# (exp, tanh, sigmoid): the default run gives it every case up to this many input elements, the
# slow run every case.
BIG = 1 << 20


def _small(case):
    return sum(int(np.prod(case.shape(f"in/{n}"))) for n in case.inputs) <= BIG


@pytest.mark.parametrize("name", sorted(M.EQUIVALENT))
def test_equivalent_reading_passes(by_op, name):
    op, fn, why = M.EQUIVALENT[name]
    cases = [c for c in _cases(by_op, op, True) if _small(c)]
    bad = [r.case.id for r in _results(fn, cases) if r.status != "pass"]
    assert bad == [], why


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(M.EQUIVALENT))
def test_equivalent_reading_passes_every_case(by_op, name):
    op, fn, why = M.EQUIVALENT[name]
    cases = [c for c in _cases(by_op, op, True) if not _small(c)]
    bad = [r.case.id for r in _results(fn, cases) if r.status != "pass"]
    assert bad == [], why


@pytest.mark.parametrize("name", sorted(SHAPE_SWITCHES))
def test_shape_switch_passes_every_short_case(by_op, name):
    """A shape switch is invisible below its threshold: only the sweeps catch it."""
    op, fn, *_ = M.MUTANTS[name]
    results = _results(fn, _cases(by_op, op, False))
    assert all(r.status == "pass" for r in results)


@pytest.mark.slow
@pytest.mark.parametrize("op", sorted(M.CORRECT))
def test_faithful_transcription_passes_the_sweeps(by_op, op):
    sweeps = [c for c in by_op[op] if c.family == "sweep"]
    assert all(r.status == "pass" for r in _results(M.CORRECT[op], sweeps))


def test_runner_bits_not_values():
    """The harness compares bits: a kernel that returns -0 for +0 is a mutant killed."""
    _, cases = store.load_cases(ops={"sum"})
    empty = [c for c in cases if c.family == "empty"]
    res = _results(lambda X: np.full(X.shape[0], np.float32(-0.0)), empty)
    assert empty and all(r.status == "fail" for r in res)
