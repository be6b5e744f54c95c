"""The cases of ``conformance/shapes/edges.py`` (issue 31, items 3 and 6;
[conf.edges.c1]): each wrong reading that passed every committed vector
passes every case but these and fails one of these; and the bf16 twin of
every binary32 reading of the mutation harness ([bf16.ops.c1]: the reading
between the conversions) fails the bf16 vectors alone, unless it is
equivalent in bf16, which is shown by enumeration.

Measured when the cases were added: of the bf16 twins, 13 of the 34 readings
then in the harness (plus 2 twins equivalent in bf16) passed every bf16
vector; with the edges cases, none that is not equivalent passes
(``test_bf16_twins_before_and_after``).
"""

import numpy as np
import pytest

import mutants as M
from refreplay.conformance.shapes import edges
from refreplay.conformance.golden import generate
from refreplay.conformance.running import adapters as kernels
from refreplay.conformance.running import compare as runner
from refreplay.conformance.golden import store
from refreplay.conformance.table import OPS

SHAPE_SWITCHES = {"sum split above 8192", "matmul split-K above 4096", "softmax online above V=4096"}
# readings that passed every vector before edges.py; each must now fail an edges case and only those
PASSED_BEFORE = {
    "linear sums from +0",
    "linear fused in the C mod 8 tail",
    "linear backward fused in the K mod 8 tail",
    "layernorm backward dw, db from +0",
    "rmsnorm backward dw from +0",
    "AdamW bias powers in float64",
}
# bf16 twins that give the spec's bits on every input (test_bf16_equivalent_twins_*)
BF16_EQUIVALENT = {"gelu cube as K*(x*x*x)", "gelu K3 = 3*K"}
TWINS = M.bf16_twins()


@pytest.fixture(scope="module")
def by_op():
    ops = {op for op, *_ in M.EDGE_MUTANTS.values()} | {op for op, _ in TWINS.values()}
    _, cases = store.load_cases(ops=ops)
    out = {}
    for c in cases:
        out.setdefault(c.op, []).append(c)
    return out


def _edge_ids(op, cases):
    """The ids of ``op``'s cases that edges.extra built (matched by family and note)."""
    notes = {(f, n) for f, _, n in edges.extra(OPS[op], generate.SEED)}
    return {c.id for c in cases if any(c.family == f and c.probes.endswith(f"({n})") for f, n in notes)}


def _failing(fn, cases):
    kernel = kernels.PythonCallable("mutant", lambda op, *xs: fn(*xs), per_op=False)
    return {r.case.id for r in runner.run(kernel, cases) if r.status != "pass"}


def _cases(by_op, op, name):
    return [c for c in by_op[op] if name in SHAPE_SWITCHES or c.family != "sweep"]


def test_every_edges_case_is_in_the_vectors(by_op):
    for op in {op for op, *_ in M.EDGE_MUTANTS.values()} | {op for op, _ in TWINS.values()}:
        if op in edges.F32_CASES or (op.startswith("bf16_") and op[5:] in edges.BF16):
            assert len(_edge_ids(op, by_op[op])) == len(edges.extra(OPS[op], generate.SEED)), op


@pytest.mark.parametrize("name", sorted(M.EDGE_MUTANTS))
def test_edge_mutant_fails(by_op, name):
    op, fn, clause, what = M.EDGE_MUTANTS[name]
    cases = _cases(by_op, op, name)
    failing = _failing(fn, cases)
    assert failing, f"{name} ({what}, [{clause}]) passes every case of {op}"
    if name in PASSED_BEFORE:
        new = _edge_ids(op, cases)
        assert failing <= new and failing, f"{name}: fails {sorted(failing - new)} outside edges.py"


@pytest.mark.parametrize("name", sorted(set(TWINS) - BF16_EQUIVALENT))
def test_bf16_twin_fails_the_bf16_vectors(by_op, name):
    op, fn = TWINS[name]
    assert _failing(fn, _cases(by_op, op, name)), f"the bf16 twin of '{name}' passes every case of {op}"


def test_bf16_twins_before_and_after(by_op):
    """Without the edges cases, 13 twins of the harness's earlier readings,
    the twin of session 27's binary64 scale, and all 8 of issue 31's new
    readings in the profile, none of them equivalent, pass every bf16 vector;
    with them, none."""
    before, after = set(), set()
    for name, (op, fn) in TWINS.items():
        cases = _cases(by_op, op, name)
        failing = _failing(fn, cases)
        after |= {name} if not failing else set()
        before |= {name} if not failing - _edge_ids(op, cases) else set()
    assert after == BF16_EQUIVALENT
    old = before - set(M.EDGE_MUTANTS) - BF16_EQUIVALENT
    assert len(old) == 14 and "attention backward scale in binary64" in old, sorted(old)
    assert before & set(M.EDGE_MUTANTS) == {n for n in M.EDGE_MUTANTS if n in TWINS} and len(before) == 24


def _bits16(a):
    a = np.asarray(a, np.uint16)
    nan = ((a & 0x7F80) == 0x7F80) & ((a & 0x7F) != 0)
    return np.where(nan, 0x7FC0, a)


def test_bf16_equivalent_twins_gelu_cube():
    """The cube as K*(x*x*x): every one of the 65,536 bf16 inputs gives the spec's bf16 bits."""
    from refreplay.ops import bf16

    x = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    _, fn = TWINS["gelu cube as K*(x*x*x)"]
    assert (_bits16(fn(x)) == _bits16(bf16.apply("gelu_forward", x))).all()


@pytest.mark.slow
def test_bf16_equivalent_twins_gelu_k3():
    """K3 = 3*K changes the binary32 local gradient at 142 bf16 x; at each of
    them every bf16 dout gives the spec's bf16 bits (all 2^32 inputs covered)."""
    from refreplay.numerics import bf16 as B
    from refreplay.ops import bf16

    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    x, one = B.decode(h), np.ones(h.size, np.float32)
    k3 = np.float32(M.mul(np.float32(3), M.GELU_K))
    a, b = M.k_gelu_backward(one, x), M.k_gelu_backward(one, x, k3=k3)
    differ = (a.view(np.uint32) != b.view(np.uint32)) & ~(np.isnan(a) & np.isnan(b))
    assert 0 < differ.sum() < 1000
    _, fn = TWINS["gelu K3 = 3*K"]
    for xv in h[differ]:
        X = np.full(h.size, xv, np.uint16)
        assert (_bits16(fn(h, X)) == _bits16(bf16.apply("gelu_backward", h, X))).all(), xv
