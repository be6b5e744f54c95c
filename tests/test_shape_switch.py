"""Shape-dependent algorithm switches are NOT CONFORMANT under a plain
`refreplay conform KERNEL --op OP` ([conf.probes.c1] sweep, [conf.domain.c1],
[conf.runner.c1]): each kernel of ``shape_switch_kernels`` follows the spec up
to a size and switches past it, on one axis each (split-K, an online softmax,
a fast path for J and K multiples of 128, blocked norms, row halves, a
pairwise token mean, reordered embedding backward, another AdamW formula above
2^20 elements, a blocked softmax backward, bf16 accumulation above K = 8192,
attention whose backward or softmax changes with the sequence length T).
Each passes every case below its switch and fails a case just past it."""

import json
import re

import pytest

import shape_switch_kernels as SK
from refreplay import cli


def _conform(tmp_path, op, kernel="shape_switch_kernels"):
    out = tmp_path / "report.json"
    rc = cli.main(["conform", kernel, "--op", op, "--json", str(out)])
    return rc, json.loads(out.read_text())


def _failing_families(rep):
    return {c["family"] for c in rep["cases"] if c["status"] == "fail"}


def _diagnosis(rep, op):
    return " | ".join(d["message"] for d in rep["diagnosis"] if d["op"] == op)


def test_split_k_matmul_is_not_conformant(tmp_path):
    rc, rep = _conform(tmp_path, "matmul")
    assert rc == 1 and not rep["conformant"]
    assert _failing_families(rep) == {"sweep"}
    d = _diagnosis(rep, "matmul")
    assert "fails long reductions" in d and "changes algorithm with shape" in d
    assert "split into two halves" in d


def test_online_softmax_is_not_conformant(tmp_path):
    rc, rep = _conform(tmp_path, "softmax_forward")
    assert rc == 1 and not rep["conformant"]
    assert _failing_families(rep) == {"sweep"}
    assert "changes algorithm with shape" in _diagnosis(rep, "softmax_forward")


# op (or dispatcher), the op run, the letter that switches, how a case's size on it is read
AXES = [
    ("aligned_matmul", "matmul", None),
    ("rmsnorm_forward", "rmsnorm_forward", "C"),
    ("layernorm_backward", "layernorm_backward", "N"),
    ("cross_entropy_forward", "cross_entropy_forward", "N"),
    ("embedding_backward", "embedding_backward", "T"),
    ("adamw_update", "adamw_update", "N"),
    ("softmax_backward", "softmax_backward", "V"),
    ("bf16_matmul_nt", "bf16_matmul_nt", "K"),
    ("attention_backward", "attention_backward", "T"),
    ("bf16_attention_forward", "bf16_attention_forward", "T"),
    ("bf16_attention_backward", "bf16_attention_backward", "T"),
]


def _size(probes, letter):
    """The size of ``letter`` in a case's note: "N=1,V=8193" or "N,V=1,50257"."""
    for names, values in re.findall(r"\b([A-Z]+(?:,[A-Z]+)*) ?= ?(\d+(?:,\d+)*)", probes):
        names, values = names.split(","), values.split(",")
        if letter in names and len(names) == len(values):
            return int(values[names.index(letter)])
    return None


@pytest.mark.parametrize("name,op,letter", AXES, ids=[a[0] for a in AXES])
def test_switch_on_each_axis_is_not_conformant(tmp_path, name, op, letter):
    """Every failing case lies past the switch, one lies just past it (the
    axis sweep's +1 neighbour), and every case below the switch passes."""
    kernel = "shape_switch_kernels:aligned_matmul" if name == "aligned_matmul" else "shape_switch_kernels"
    rc, rep = _conform(tmp_path, op, kernel)
    assert rc == 1 and not rep["conformant"] and rep["verdict"] == "NOT CONFORMANT"
    assert _failing_families(rep) == {"sweep"}
    failing = [c for c in rep["cases"] if c["status"] == "fail"]
    assert all(c["status"] in ("pass", "fail") for c in rep["cases"])  # the kernel ran every case
    from refreplay.conformance.golden import store

    notes = {c["id"]: c["probes"] for c in store.read_manifest()["cases"] if c["op"] == op}
    if letter is None:  # the fast path: K and J multiples of 128, and nothing else
        for c in failing:
            m = re.search(r"aligned I,K,J = (\d+),(\d+),(\d+)", notes[c["id"]])
            assert m and int(m.group(2)) % 128 == 0 and int(m.group(3)) % 128 == 0, notes[c["id"]]
        assert any("aligned I,K,J = 1,128,128" in notes[c["id"]] for c in failing)
        return
    switch = SK.SWITCH[name]
    assert switch + 1 in rep["domain"][op]["axes"][letter]  # the verdict states the size it covered
    sizes = [_size(notes[c["id"]], letter) for c in failing]
    assert all(s is not None and s > switch for s in sizes), sizes
    assert switch + 1 in sizes, sorted(sizes)


LONG = sorted(SK.LONG_SWITCH)
_LETTER = {"linear_forward": "C", **{op: "N" for op in SK.LONG_SWITCH if SK.LONG_SWITCH[op] == 1 << 22}}


@pytest.mark.parametrize("op", LONG)
def test_switch_past_16385_and_2_22_is_not_conformant(tmp_path, op):
    """The reductions past 16,385 (rows reversed, or two blocks) and the
    element counts past 2^22 (GELU in float64): NOT CONFORMANT under plain
    conform, every failing case past the switch and one just past it."""
    rc, rep = _conform(tmp_path, op, "shape_switch_kernels:long_rows")
    assert rc == 1 and rep["verdict"] == "NOT CONFORMANT"
    from refreplay.conformance.golden import store

    notes = {c["id"]: c["probes"] for c in store.read_manifest()["cases"] if c["op"] == op}
    letter = _LETTER.get(op, "V" if "softmax" in op or "entropy" in op else "C")
    switch = SK.LONG_SWITCH[op]
    failing = [c for c in rep["cases"] if c["status"] == "fail"]
    sizes = [_size(notes[c["id"]], letter) for c in failing if c["family"] == "sweep"]
    assert sizes and all(s is not None and s > switch for s in sizes), sizes
    assert switch + 1 in sizes and switch + 1 in rep["domain"][op]["axes"][letter]
    assert {c["family"] for c in failing} == {"sweep"}


@pytest.mark.parametrize("op", sorted(SK.LONG_T))
def test_attention_switch_past_the_old_T_is_not_conformant(tmp_path, op):
    """[conf.vectors.c3, c4] The backward's T past the 513 (bf16 257) of whole att tensors,
    the forward's past 1,024 (bf16 257): dv in float64 above T = 1,024, P in bf16 above 512,
    (binary32) a fast path for T a multiple of 128 from 256 on, att returned in bf16 above
    1,024 (only the hashed output differs), the bf16 forward's online softmax above 512 are
    NOT CONFORMANT; each fails only the cases past its switch, the fast path only T = 512."""
    rc, rep = _conform(tmp_path, op, "shape_switch_kernels:long_attention")
    assert rc == 1 and rep["verdict"] == "NOT CONFORMANT"
    assert all(c["status"] in ("pass", "fail") for c in rep["cases"])
    from refreplay.conformance.golden import store

    notes = {c["id"]: c["probes"] for c in store.read_manifest()["cases"] if c["op"] == op}
    sizes = sorted(_size(notes[c["id"]], "T") for c in rep["cases"] if c["status"] == "fail")
    assert (
        sizes
        == {
            "attention_backward": [512, 1025],
            "bf16_attention_backward": [513, 1025],
            "attention_forward": [1025],
            "bf16_attention_forward": [1024, 1025],
        }[op]
    ), sizes
    if op == "attention_forward":  # the hashed att is the one output that differs, and is located
        (case,) = [c for c in rep["cases"] if c["status"] == "fail"]
        assert [m["output"] for m in case["mismatches"]] == ["att"], case["mismatches"]
    assert _failing_families(rep) == {"sweep"}
    assert 1025 in rep["domain"][op]["axes"]["T"]  # the verdict states the reach


def test_tiled_rows_separate_their_order():
    """[conf.vectors.c2] Every tiled one-row case of the committed vectors
    reaches 65,537 (the bf16 log-softmaxes' built rows also 32,769) and
    tells the spec's order from the reversed one on some output
    (separation.reversing_rows): a row whose outputs round both orders alike
    would pass a kernel that sums it in any order."""
    from refreplay.conformance.base.case import load_inputs
    from refreplay.conformance.golden import store
    from refreplay.conformance.inputs import separation
    from refreplay.conformance.table import OPS

    from refreplay.conformance.shapes import axes, long_rows

    ops = [o for o in OPS if {"C", "V"} & set(axes._later(o)) and "linear" not in o]
    seen = set()
    for case in store.load_cases(ops=ops)[1]:
        if not case.tiles or "N=1," not in case.probes:
            continue
        op = OPS[case.op]
        n = max(a.shape[-1] for k, a in case.inputs.items() if f"in/{k}" in case.tiles)
        assert n == 65537 or (n == 32769 and case.op in long_rows.DESIGNED), case.id
        rev = separation.reversed_rows(op, load_inputs([case.inputs[k] for k in op.inputs]), n)
        assert any(separation.differs(case.outputs[k], r).any() for k, r in zip(op.outputs, rev)), case.id
        seen.add(case.op)
    assert {"layernorm_forward", "bf16_softmax_backward", "cross_entropy_forward"} <= seen, sorted(seen)
    assert set(long_rows.DESIGNED) <= seen, sorted(seen)
    assert seen == set(ops), sorted(set(ops) - seen)


def test_committed_domain_reaches_every_listed_switch():
    """[conf.domain.c1] The committed vectors' domain holds a size just past
    every switch of ``shape_switch_kernels`` and the production sizes, on
    the axis the switch is on; every op with a live form has its axis sweep."""
    from refreplay.conformance.shapes import live
    from refreplay.conformance.golden import store
    from refreplay.conformance.shapes import axes
    from refreplay.conformance.shapes import domain as domain_of

    dom = domain_of.manifest_domain(store.read_manifest())
    past = {
        ("layernorm_backward", "N"): 513,
        ("cross_entropy_forward", "N"): 1025,
        ("embedding_backward", "T"): 4097,
        ("adamw_update", "N"): 2**20 + 1,
        ("softmax_backward", "V"): 8193,
        ("bf16_matmul_nt", "K"): 8193,
        ("rmsnorm_forward", "C"): 8193,
        ("bf16_layernorm_backward", "N"): 513,
        ("bf16_cross_entropy_forward", "N"): 1025,
        ("col_sum", "N"): 8193,
        ("col_sum", "J"): 1025,
        ("matmul_tn", "K"): 8193,
        ("layernorm_forward", "C"): 65537,
        ("bf16_rmsnorm_backward", "C"): 65537,
        ("log_softmax_backward", "V"): 65537,
        ("cross_entropy_forward", "V"): 65537,
        ("linear_forward", "C"): 8193,
        ("bf16_linear_backward", "OC"): 8193,
        ("gelu_backward", "N"): 2**22 + 1,
        ("bf16_add", "N"): 2**22 + 1,
        ("attention_forward", "T"): 1025,
        ("attention_backward", "T"): 1025,
        ("bf16_attention_forward", "T"): 1025,
        ("bf16_attention_backward", "T"): 1025,
        ("bf16_log_softmax_forward", "V"): 16385,
        ("bf16_log_softmax_backward", "V"): 16385,
    }
    for (op, letter), size in past.items():
        assert size in dom[op]["axes"][letter], (op, letter)
    assert max(dom["adamw_update"]["axes"]["N"]) > 2**22
    for op in live.LIVE:
        spec = axes._axes(op)
        assert spec is not None, op
        for letter, sizes in spec[0].items():
            assert set(sizes) <= set(dom[op]["axes"][letter]), (op, letter)
