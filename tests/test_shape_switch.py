"""Shape-dependent algorithm switches are NOT CONFORMANT under a plain
`refreplay conform KERNEL --op OP` ([conf.probes.c1] sweep, [conf.runner.c1]):
a split-K matmul above K = 4096 and a two-block online softmax above
V = 4096 pass every short case and fail the sweep cases, and the diagnosis
says so."""
import json

from refreplay import cli


def _conform(tmp_path, op):
    out = tmp_path / "report.json"
    rc = cli.main(["conform", "shape_switch_kernels", "--op", op, "--json", str(out)])
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
