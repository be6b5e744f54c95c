"""[conf.diagnosis.r1] A mismatch always wins: the diagnosis of a failing
kernel runs in bounded memory, and a diagnosis that cannot be completed
(too large, out of memory, a bug) is said so in one line while the verdict
stays NOT CONFORMANT with exit 1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_helpers import run_cli

TESTS = Path(__file__).parent
ROOT = TESTS.parent

# Failing at a live shape whose variant models would hold 4 x 1024 x 1024 x 64
# product terms at once (about 6 GiB): more than the address space allowed below.
BIG = "B=1,NH=4,T=1024,HS=64"
ADDRESS_SPACE = 4 << 30

_LIMITED = """
import resource, sys, runpy
resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
sys.argv = ["refreplay", *sys.argv[1:]]
runpy.run_module("refreplay", run_name="__main__")
"""


def test_a_large_failing_live_case_gets_a_verdict_in_bounded_memory(tmp_path):
    env = {
        **os.environ,
        "NUMBA_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    args = ["conform", "diagnosis_kernels", "--op", "attention_backward", "--shape", BIG]
    p = subprocess.run(
        [sys.executable, "-c", _LIMITED.format(limit=ADDRESS_SPACE), *args, "--json", tmp_path / "r.json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
    )
    assert p.returncode == 1, p.stdout + p.stderr
    assert "Traceback" not in p.stdout + p.stderr and "internal error" not in p.stderr
    assert "verdict: NOT CONFORMANT" in p.stdout
    assert "FAIL  attention_backward-live-00" in p.stdout
    assert "attention_backward: diagnosis skipped" in p.stdout or "could not be completed" in p.stdout
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["verdict"] == "NOT CONFORMANT" and not doc["conformant"]
    assert any(f["message"].startswith("diagnosis skipped") for f in doc["diagnosis"])


def test_a_fault_in_the_diagnosis_leaves_the_verdict_standing(monkeypatch, tmp_path):
    from refreplay.conformance.reporting import report

    def fails(op, results):
        raise MemoryError("Unable to allocate 3.00 GiB for an array with shape (64, 12582912)")

    monkeypatch.setattr(report, "diagnose", fails)
    r = run_cli("conform", "numpy", "--op", "sum", "--json", tmp_path / "r.json", "--junit", tmp_path / "r.xml")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "verdict: NOT CONFORMANT" in r.stdout and "FAIL  sum-" in r.stdout
    line = next(x for x in r.stdout.splitlines() if "diagnosis could not be completed" in x)
    assert "ran out of memory (Unable to allocate 3.00 GiB" in line
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["verdict"] == "NOT CONFORMANT"
    assert [f["op"] for f in doc["diagnosis"]] == ["sum"]
    assert doc["diagnosis"][0]["message"].startswith("diagnosis could not be completed")
    assert "diagnosis could not be completed" in (tmp_path / "r.xml").read_text()


def test_any_exception_in_the_diagnosis_is_named(monkeypatch):
    from refreplay.conformance.reporting import report

    def fails(op, results):
        raise ValueError("a bug in a variant model")

    monkeypatch.setattr(report, "diagnose", fails)
    r = run_cli("conform", "numpy", "--op", "sum")
    assert r.returncode == 1
    assert "diagnosis could not be completed: it failed: ValueError: a bug in a variant model" in r.stdout


def _result(expected, actual):
    from types import SimpleNamespace

    case = SimpleNamespace(outputs={"y": expected}, inputs={}, family="random")
    return SimpleNamespace(case=case, actual={"y": actual}, status="fail")


def test_where_the_differences_lie_is_counted_not_listed():
    """The rows and tail of the differing elements, found without a list of
    their indices (10^8 of them at a live matmul's shape)."""
    import numpy as np

    from refreplay.conformance.diagnosis.diagnose import _where
    from refreplay.conformance.table import OPS

    e = np.arange(64 * 48, dtype=np.float32).reshape(64, 48)
    rows, tail = e.copy(), e.copy()
    rows[40:, 5] += 1
    tail[:, -3:] += 1
    op = OPS["softmax_forward"]
    assert _where(op, [_result(e, rows)]) == "only in rows 40 and above (rows from 0; up to 64 in a case)"
    assert _where(op, [_result(e, tail)]) == "only in the last 3 columns of each row (a tail)"
    assert _where(op, [_result(e, e.copy())]) == ""


def _variant_message(shape, tmp_path):
    r = run_cli(
        "conform",
        "diagnosis_kernels:sm_grad_distributed",
        "--op",
        "attention_backward",
        "--shape",
        shape,
        "--json",
        tmp_path / f"{shape}.json",
    )
    assert r.returncode == 1, r.stdout + r.stderr
    found = json.loads((tmp_path / f"{shape}.json").read_text())["diagnosis"]
    return [f["message"] for f in found]


def test_a_sliced_diagnosis_names_the_small_cases_cause(monkeypatch, tmp_path):
    """Too large to re-evaluate whole (16 x 256 x 256 x 64 terms, about
    1.6 GiB), the case is diagnosed on one (b, h) pair, and names the
    deviation the whole diagnosis of a small case with it names."""
    monkeypatch.syspath_prepend(str(TESTS))
    small = _variant_message("B=1,NH=2,T=16,HS=8", tmp_path)
    large = _variant_message("B=2,NH=8,T=256,HS=64", tmp_path)
    cause = "reproduced exactly by the spec's algorithm with softmax gradient as y*dy - y*d"
    assert [m for m in small if m.startswith(cause)] == [m for m in large if m.startswith(cause)] != []
    assert any(m.startswith("diagnosed on a slice: attention_backward-live-00 at its (b, h) = (0, 0)") for m in large)
    assert not any(m.startswith("diagnosed on a slice") for m in small)


def test_a_row_op_is_sliced_to_its_differing_rows():
    """A bf16 row op too large to re-evaluate whole is cut to its first
    differing rows, whose outputs are the case's own; a kernel's ml_dtypes
    bfloat16 outputs are compared as their bits."""
    import numpy as np

    ml_dtypes = pytest.importorskip("ml_dtypes")
    from refreplay.conformance.diagnosis.slices import SLICE_FROM, model_bytes, slices
    from refreplay.conformance.base.case import Case
    from refreplay.conformance.running.compare import Result
    from refreplay.conformance.table import OPS

    op = OPS["bf16_softmax_forward"]
    N, V = 512, 1 << 13
    x = np.arange(N * V, dtype=np.uint16).reshape(N, V)
    y = (x + np.uint16(1)).astype(np.uint16)
    case = Case("big", op.name, "random", "", [], {"x": x}, {"y": y}, frozenset({"in/x", "out/y"}))
    actual = y.copy()
    actual[[7, 9, 200]] ^= np.uint16(1)
    r = Result(case, "fail", actual={"y": actual.view(ml_dtypes.bfloat16)})  # as a kernel may give it
    assert model_bytes(op, r) > SLICE_FROM
    ((sub, where),) = slices(op, r)
    assert where == "3 differing rows from 7 to 200"
    assert np.array_equal(sub.case.inputs["x"], x[[7, 9, 200]])
    assert np.array_equal(sub.case.outputs["y"], y[[7, 9, 200]])
    assert np.array_equal(sub.actual["y"].view(np.uint16), actual[[7, 9, 200]])
