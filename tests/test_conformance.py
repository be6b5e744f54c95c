"""The conformance runner: the reference passes every vector; NumPy, PyTorch
and a C matmul built with contraction fail with the right diagnosis; the
report, JSON, JUnit and xfail handling ([conf.runner.c1], [conf.exec.c1],
[conf.diagnosis.r1], [num.nofma.c1], [red.sum.c1], [num.exp.c1])."""

import json
import shutil
import subprocess
import xml.etree.ElementTree as ET
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

from refreplay import cli
from refreplay.conformance.base import deviant as fp
from refreplay.conformance.running import compare as runner
from refreplay.conformance.golden import store

REPO = Path(__file__).resolve().parent.parent
C_SOURCE = REPO / "examples" / "c_matmul" / "matmul.c"


def conform(tmp_path, *args):
    out = tmp_path / "report.json"
    rc = cli.main(["conform", *args, "--json", str(out)])
    return rc, json.loads(out.read_text())


def diagnosis(report, op):
    return " | ".join(d["message"] + " " + " ".join(d["clauses"]) for d in report["diagnosis"] if d["op"] == op)


def test_reference_passes_every_vector(tmp_path):
    rc, rep = conform(tmp_path, "reference")
    n_cases = len(store.read_manifest()["cases"])
    assert rc == 0
    assert rep["conformant"] and rep["counts"]["pass"] == n_cases
    assert rep["counts"]["fail"] == rep["counts"]["error"] == rep["counts"]["skip"] == 0


NEGATIVE = ("--op", "matmul", "--op", "sum", "--op", "exp")


@pytest.mark.parametrize("kernel", ["numpy", "torch"])
def test_library_kernels_fail_with_the_right_diagnosis(tmp_path, kernel):
    if kernel == "torch":
        pytest.importorskip("torch")
    rc, rep = conform(tmp_path, kernel, *NEGATIVE)
    assert rc == 1 and not rep["conformant"]
    for op in ("matmul", "sum", "exp"):
        assert rep["ops"][op]["fail"] > 0, op
    assert "contracts multiply-add" in diagnosis(rep, "matmul")
    assert "num.nofma.c1" in diagnosis(rep, "matmul")
    assert "sums in a different order" in diagnosis(rep, "sum")
    assert "red.sum.c1" in diagnosis(rep, "sum")
    assert "vendor exp" in diagnosis(rep, "exp") and "num.exp.c1" in diagnosis(rep, "exp")
    if kernel == "numpy":
        # the order NumPy uses is recognised, not just "different"
        assert "NumPy pairwise" in diagnosis(rep, "sum")


def test_torch_transformer_ops_are_negative_controls(tmp_path):
    """PyTorch's own softmax, norms, activations, attention and loss (what a
    kernel author compares with) fail the vectors; its embedding gather and
    its unfused rotary multiply-adds are exact and pass every case but the
    edge cases that hold NaN payloads and subnormals, which PyTorch copies
    where [num.load.c1] canonicalises and zeroes them."""
    pytest.importorskip("torch")
    failing = (
        "gelu_forward",
        "silu_backward",
        "layernorm_forward",
        "rmsnorm_forward",
        "softmax_forward",
        "attention_forward",
        "cross_entropy_backward",
        "linear_forward",
    )
    exact = ("embedding_forward", "rope_forward")
    args = [x for op in failing + exact for x in ("--op", op)]
    rc, rep = conform(tmp_path, "torch", *args)
    assert rc == 1 and not rep["conformant"]
    for op in failing:
        assert rep["ops"][op]["fail"] > 0, op
    for op in exact:
        assert rep["ops"][op]["error"] == 0 and rep["ops"][op]["pass"] > 0, op
        assert {c["family"] for c in rep["cases"] if c["op"] == op and c["status"] == "fail"} <= {"edge"}, op


def test_numpy_nan_and_flush_diagnoses(tmp_path):
    rc, rep = conform(tmp_path, "numpy", "--op", "add")
    d = diagnosis(rep, "add")
    assert rc == 1
    assert "non-canonical NaN" in d and "0xFFC00000" in d
    assert "does not flush subnormal results" in d and "does not zero subnormal inputs" in d


@pytest.fixture(scope="module")
def c_builds(tmp_path_factory):
    """The example C matmul built without and with contraction."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed: the exec: C matmul check needs a C compiler")
    d = tmp_path_factory.mktemp("c")
    out = {}
    for name, flags in (
        ("off", ["-O2", "-ffp-contract=off"]),
        ("fast", ["-O2", "-march=native", "-ffp-contract=fast"]),
    ):
        out[name] = d / f"mm_{name}"
        subprocess.run(["gcc", *flags, "-o", str(out[name]), str(C_SOURCE)], check=True, capture_output=True)
    # whether -march=native fuses depends on the tuning (GCC 12 on Zen 3 does not): fall back to generic
    if (
        shutil.which("objdump")
        and "fmadd" not in subprocess.run(["objdump", "-d", str(out["fast"])], capture_output=True, text=True).stdout
    ):
        subprocess.run(
            [
                "gcc",
                "-O2",
                "-march=native",
                "-mtune=generic",
                "-ffp-contract=fast",
                "-o",
                str(out["fast"]),
                str(C_SOURCE),
            ],
            check=True,
            capture_output=True,
        )
    return out


def test_c_matmul_without_contraction_passes(tmp_path, c_builds):
    rc, rep = conform(tmp_path, f"exec:{c_builds['off']}", "--op", "matmul")
    assert rc == 0 and rep["counts"]["pass"] == rep["ops"]["matmul"]["pass"] > 0


def test_c_matmul_with_contraction_fails_with_multiply_add_diagnosis(tmp_path, c_builds):
    exe = c_builds["fast"]
    dis = (
        subprocess.run(["objdump", "-d", str(exe)], capture_output=True, text=True).stdout
        if shutil.which("objdump")
        else "fma"
    )
    if "fma" not in dis and "fmadd" not in dis:
        pytest.skip("this CPU/compiler emits no fused multiply-add for -march=native")
    rc, rep = conform(tmp_path, f"exec:{exe}", "--op", "matmul")
    assert rc == 1
    d = diagnosis(rep, "matmul")
    assert "contracts multiply-add" in d and "num.nofma.c1" in d
    assert "different order" not in d  # the order probes pass: only contraction is wrong
    fma = [c for c in rep["cases"] if c["family"] == "fma"]
    assert fma and all(c["status"] == "fail" for c in fma)
    # the first mismatch of the 1x2x1 probe: +0 expected, +-2^-24 * 2^f delivered
    first = next(c for c in fma if c["id"] == "matmul-fma-00")["mismatches"][0]
    assert first["expected"] == "0x00000000" and first["actual"] != "0x00000000"
    assert sum(first["histogram"].values()) == first["count"]


def test_exec_protocol_unsupported_op_is_skipped(tmp_path, c_builds):
    rc, rep = conform(tmp_path, f"exec:{c_builds['off']}", "--op", "sum")
    assert rc == 1  # an op named with --op that the kernel declines is not a pass
    assert rep["counts"]["skip"] == rep["ops"]["sum"]["skip"] > 0


def test_exec_writes_language_neutral_case(tmp_path):
    from refreplay.conformance.running import execproto

    A = np.arange(6, dtype=np.float32).reshape(2, 3)
    B = np.ones((3, 1), np.float32)
    execproto.write_case(tmp_path, "matmul", "x", [A, B], {"C": ("f32", (2, 1))})
    desc = json.loads((tmp_path / "case.json").read_text())
    assert desc["op"] == "matmul" and desc["inputs"][0] == {
        "name": "A",
        "dtype": "f32",
        "shape": [2, 3],
        "file": "in_A.bin",
    }
    assert (tmp_path / "in_A.bin").read_bytes() == A.astype("<f4").tobytes()
    assert "input A f32 2 2 3 in_A.bin" in (tmp_path / "case.txt").read_text()
    assert "output C f32 2 2 1 out_C.bin" in (tmp_path / "case.txt").read_text()


def test_python_callable_kernel_and_errors(tmp_path, monkeypatch):
    mod = tmp_path / "mykernels.py"
    mod.write_text(
        "from refreplay import linalg, numerics\n"
        "def good(op, *xs):\n"
        "    if op != 'sum':\n"
        "        raise NotImplementedError(op)\n"
        "    return linalg.row_sum(numerics.load(xs[0]))\n"
        "def broken(op, *xs):\n"
        "    raise RuntimeError('boom')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(REPO / "examples" / "python_kernel"))
    rc, rep = conform(tmp_path, "mykernels:good", "--op", "sum")
    assert rc == 0 and rep["counts"]["pass"] > 0
    rc, rep = conform(tmp_path, "pairwise_sum:sum", "--op", "sum", "--op", "max")
    # a function named after an op implements that op only: max is declined
    assert rc == 1 and rep["ops"]["sum"]["fail"] > 0
    assert rep["ops"]["max"]["skip"] > 0 and rep["ops"]["max"]["pass"] == 0
    rc, rep = conform(tmp_path, "mykernels:broken", "--op", "sum")
    assert rc == 1 and rep["counts"]["error"] == rep["ops"]["sum"]["error"] > 0
    assert "boom" in rep["cases"][0]["message"]
    assert cli.main(["conform", "no_such_module_xyz:f"]) == 2


def test_xfail_needs_a_reason(tmp_path):
    f = tmp_path / "xfail.txt"
    f.write_text("sum\n")
    assert cli.main(["conform", "numpy", "--op", "sum", "--xfail", str(f)]) == 2


def test_xfail_and_unexpected_pass(tmp_path):
    f = tmp_path / "xfail.txt"
    f.write_text("# known\nsum  NumPy sums pairwise; tracked elsewhere\nmax-random-*  expected to pass\n")
    rc, rep = conform(tmp_path, "numpy", "--op", "sum", "--op", "max", "--xfail", str(f))
    sums = [c for c in rep["cases"] if c["op"] == "sum"]
    assert all(c["status"] in ("xfail", "xpass") for c in sums)
    assert any(c["status"] == "xpass" for c in rep["cases"] if c["id"].startswith("max-random"))
    assert rc == (0 if rep["ops"]["max"]["fail"] == 0 else 1)


def test_junit_report(tmp_path):
    out = tmp_path / "junit.xml"
    rc = cli.main(["conform", "numpy", "--op", "sum", "--junit", str(out)])
    assert rc == 1
    root = ET.parse(out).getroot()
    suite = root.find("testsuite[@name='sum']")
    failures = suite.findall("testcase/failure")
    assert int(suite.get("failures")) == len(failures) > 0
    assert "expected 0x" in failures[0].get("message")


def test_text_report_shows_hex_ulp_and_verdict(tmp_path, capsys):
    assert cli.main(["conform", "numpy", "--op", "sum"]) == 1
    out = capsys.readouterr().out
    assert "ulp histogram:" in out and "expected 0x" in out
    assert "verdict: NOT CONFORMANT" in out and "Diagnosis:" in out


def test_unknown_op_is_bad_usage():
    assert cli.main(["conform", "reference", "--op", "no_such_op"]) == 2


# ---- the helpers the diagnosis rests on -------------------------------------------


def test_fma_emulation_is_exact():
    """fp.fma against exact rationals, including values halfway between
    two binary32 after the float64 sum (where double rounding would err)."""
    rng = np.random.default_rng(5)
    a = (rng.standard_normal(2000) * 4).astype(np.float32)
    b = (rng.standard_normal(2000) * 4).astype(np.float32)
    c = (rng.standard_normal(2000) * 4).astype(np.float32)
    # a*b = 1 + 2^-23 + 2^-46 ... : c = -tiny puts the double sum on a float32 midpoint
    a[:3] = np.float32(1 + 2.0**-12)
    b[:3] = np.float32(1 + 2.0**-12)
    c[:3] = fp.f32([0xB3800000, 0x33800000, 0xA5800000])
    got = fp.fma(a, b, c)
    for x, y, z, g in zip(a, b, c, got):
        exact = Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z))
        want = _round_f32(exact)
        assert fp.bits(g) == fp.bits(want), (x, y, z)


def _round_f32(q: Fraction) -> np.float32:
    lo = np.float32(float(q))  # nearest double, then to float: fix ties exactly below
    cands = [np.nextafter(lo, np.float32(-np.inf)), lo, np.nextafter(lo, np.float32(np.inf))]
    best = min(cands, key=lambda v: (abs(Fraction(float(v)) - q), int(fp.bits(v)) & 1))
    return fp.flush(np.float32(best))


def test_ulp_distance_and_histogram():
    e = fp.f32([0x3F800000, 0x00000000, 0x7FC00000, 0x3F800000])
    a = fp.f32([0x3F800001, 0x80000000, 0xFFC00000, 0x3F800010])
    d = fp.ulp_distance(e, a)
    assert d.tolist() == [1, 0, -1, 16]
    assert runner.histogram(d) == {"nan": 1, "sign of zero": 1, "1": 1, "5-16": 1}


DEVIANT = '''
import numpy as np
from refreplay import linalg, numerics
import refreplay.numerics.elementwise
from refreplay.conformance.base import deviant as fp
from refreplay.conformance.readings import orders


def tf32_matmul(op, A, B):
    """Inputs rounded to TF32 (10 significand bits), then the spec's matmul."""
    if op != "matmul":
        raise NotImplementedError(op)
    A, B = (fp.round_mantissa(numerics.load(x), 10) for x in (A, B))
    return linalg.matmul(np.ascontiguousarray(A), np.ascontiguousarray(B))


def arm_ftz_mul(op, a, b):
    """Products flushed when their exact value is below 2^-126 (tininess
    before rounding), otherwise as the spec."""
    if op != "mul":
        raise NotImplementedError(op)
    a, b = numerics.load(a), numerics.load(b)
    exact = a.astype(np.float64) * b.astype(np.float64)
    out = numerics.elementwise.mul(a, b)
    return np.where(np.abs(exact) < 2.0 ** -126, out * np.float32(0), out).astype(np.float32)


def split_k_sum(op, X):
    """Rows summed in blocks of 8, the block sums then summed in order."""
    if op != "sum":
        raise NotImplementedError(op)
    X = numerics.load(X)
    order = next(o for o in orders.candidates(False) if o.name == "blocked/split-k, blocks of 8")
    return numerics.load(order(X))
'''


@pytest.fixture
def deviant(tmp_path, monkeypatch):
    (tmp_path / "deviant_kernels.py").write_text(DEVIANT)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "deviant_kernels"


def test_tf32_inputs_are_recognised(tmp_path, deviant):
    rc, rep = conform(tmp_path, f"{deviant}:tf32_matmul", "--op", "matmul")
    assert rc == 1
    d = diagnosis(rep, "matmul")
    assert "rounds fp32 inputs to TF32" in d and "num.format.c1" in d
    assert "multiply-add" not in d  # the fma probes pass: their values have few bits


def test_flush_before_rounding_is_recognised(tmp_path, deviant):
    rc, rep = conform(tmp_path, f"{deviant}:arm_ftz_mul", "--op", "mul")
    assert rc == 1
    failing = {c["family"] for c in rep["cases"] if c["status"] == "fail"}
    # ARM FZ flushes both windows below FLT_MIN; the finding names the before-rounding flush
    assert {"ftz_before_rounding", "ftz_after_rounding"} <= failing
    assert failing <= {"ftz_before_rounding", "ftz_after_rounding", "edge"}
    d = diagnosis(rep, "mul")
    assert "flushes before rounding" in d and "x86 FTZ" not in d


def test_split_k_order_is_named(tmp_path, deviant):
    rc, rep = conform(tmp_path, f"{deviant}:split_k_sum", "--op", "sum")
    assert rc == 1
    d = diagnosis(rep, "sum")
    assert "sums in a different order" in d and "blocked/split-k, blocks of 8" in d
    assert {c["family"] for c in rep["cases"] if c["status"] == "fail"} <= {"order", "random", "edge", "sweep", "empty"}
