"""The bf16 profile in the conformance suite ([bf16.probes.c1], [conf.vectors.c1],
[conf.exec.c1]): BF16 tensors on disk and through every kernel adapter, the
reference passing every bf16 vector, and wrong kernels failing with the
diagnosis that names their misreading: PyTorch's native bf16 ops, a
truncating kernel, a bf16-accumulating kernel, one that keeps bf16
subnormals and one that rounds an intermediate."""

import json
import sys
import textwrap

import numpy as np
import pytest

import refreplay.conformance as rc
from refreplay import tensorio
from refreplay.conformance.readings import bf16 as BV
from refreplay.conformance.base import bf16 as bf16bits
from refreplay.conformance.shapes import live
from refreplay.conformance.running import adapters, compare as runner
from refreplay.conformance.golden import store
from refreplay.conformance.table import OPS
from refreplay.errors import InputError

BF16_OPS = [o for o in OPS if o.startswith("bf16_")]


def _diagnosis(report, op=None):
    return " | ".join(f["message"] for f in report.diagnosis if op is None or f["op"] == op)


# ---- storage ------------------------------------------------------------------------------------


def test_vectors_store_bf16_as_BF16_with_manifest_dtype_bf16():
    """[bf16.format.c1] bf16 tensors are BF16 in the file, uint16 bits in
    memory, dtype bf16 in the manifest; the binary32 outputs of
    [bf16.tensors.c1] (dW, db) stay f32."""
    m = store.read_manifest()
    cases = [c for c in m["cases"] if c["op"] == "bf16_add"]
    assert cases and all(t["dtype"] == "bf16" for c in cases for t in c["inputs"] + c["outputs"])
    raw = (store.VECTOR_DIR / "bf16_add.safetensors").read_bytes()
    header = json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])
    dtypes = {e["dtype"] for k, e in header.items() if k != "__metadata__"}
    assert dtypes == {"BF16"}
    _, loaded = store.load_cases(store.VECTOR_DIR, {"bf16_linear_backward"})
    c = loaded[0]
    assert c.bf16 == frozenset({"in/dy", "in/x", "in/W", "out/dx"})
    assert c.inputs["x"].dtype == np.uint16 and c.outputs["dW"].dtype == np.float32


def test_state_files_still_refuse_BF16(tmp_path):
    """Only vectors read BF16: a checkpoint keeps the dtypes of [state.dtypes.c1]."""
    p = tmp_path / "v.safetensors"
    p.write_bytes(bytes.fromhex(tensorio.file_bytes("m", "x", np.array([0x3F80], np.uint16), bf16={"x"})))
    with pytest.raises(InputError, match="BF16"):
        tensorio.load(p)
    tensors, meta, bf16 = tensorio.load_vectors(p)
    assert bf16 == {"x"} and tensors["x"].tolist() == [0x3F80]
    with pytest.raises(TypeError, match="uint16"):
        tensorio.file_bytes("m", "x", np.zeros(1, np.float32), bf16={"x"})


def test_manifest_dtype_must_match_the_file(tmp_path):
    """A BF16 tensor listed as u16 (or the reverse) is refused, never compared."""
    for f in ("manifest.json", "bf16_add.safetensors"):
        (tmp_path / f).write_bytes((store.VECTOR_DIR / f).read_bytes())
    m = json.loads((tmp_path / "manifest.json").read_text())
    m["cases"] = [c for c in m["cases"] if c["op"] == "bf16_add"]
    m["files"] = {"bf16_add.safetensors": m["files"]["bf16_add.safetensors"]}
    m["cases"][0]["inputs"][0]["dtype"] = "u16"
    (tmp_path / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(InputError, match="is bf16.*the manifest says u16"):
        store.load_cases(tmp_path)


# ---- the reference and the adapters -------------------------------------------------------------


def test_reference_passes_every_bf16_vector():
    report = rc.check("reference", ops=BF16_OPS)
    assert report.conformant and report.counts["pass"] >= 230 and report.counts["fail"] == 0


def test_compare_reports_bf16_positions_and_reads_ml_dtypes():
    e = np.array([0x3F80, 0x3F82, 0x7FC0], np.uint16)
    m = runner.compare(e, np.array([0x3F81, 0x3F82, 0xFFC0], np.uint16), "out", bf16=True)
    assert (m.count, m.ulp, m.expected, m.actual) == (2, 1, "bf16(0x3F80)", "bf16(0x3F81)")
    assert m.histogram == {"nan": 1, "1": 1}
    assert runner.compare(e, e.astype(np.float32), "out", bf16=True).shape_mismatch
    ml = pytest.importorskip("ml_dtypes")
    assert runner.compare(e, e.view(ml.bfloat16), "out", bf16=True) is None


def _reference_dispatch(op, *inputs):
    return OPS[op].reference(*inputs)


def test_python_dispatcher_gets_uint16_and_may_return_ml_dtypes():
    seen = []

    def kernel(op, *inputs):
        seen.extend(x.dtype for x in inputs)
        out = _reference_dispatch(op, *[x.copy() for x in inputs])
        try:
            import ml_dtypes
        except ImportError:
            return out
        return out.view(ml_dtypes.bfloat16)

    report = rc.check(kernel, ops=["bf16_add"])
    assert report.conformant and set(seen) == {np.dtype(np.uint16)}


def test_exec_program_reads_and_writes_bf16(tmp_path):
    """[conf.exec.c1] dtype bf16: 2 bytes per element, little-endian bits."""
    prog = tmp_path / "conv"
    prog.write_text(
        f"#!{sys.executable}\n"
        + textwrap.dedent("""
        import sys, json, numpy as np
        d = sys.argv[1]
        c = json.load(open(d + "/case.json"))
        lines = open(d + "/case.txt").read().splitlines()
        if c["op"] != "bf16_decode":
            sys.exit(3)
        assert c["inputs"][0]["dtype"] == "bf16" and lines[2].startswith("input x bf16 1 ")
        h = np.fromfile(d + "/in_x.bin", "<u2")
        e, f = h & 0x7F80, h & 0x7F
        h = np.where(e == 0, h & 0x8000, np.where((e == 0x7F80) & (f != 0), 0x7FC0, h)).astype(np.uint32)
        (h << 16).astype("<u4").tofile(d + "/out_out.bin")
    """)
    )
    prog.chmod(0o755)
    report = rc.check(f"exec:{prog}", ops=["bf16_decode", "bf16_encode"])
    n = {op: sum(c["op"] == op for c in store.read_manifest()["cases"]) for op in ("bf16_decode", "bf16_encode")}
    assert report.counts["pass"] == n["bf16_decode"] and report.counts["skip"] == n["bf16_encode"]


def test_live_and_fuzz_accept_bf16_ops():
    dims = live.parse_shape("bf16_matmul", "I=2,K=300,J=3")
    case = live.build("bf16_matmul", dims, seed=1)
    assert case.bf16 == {"in/A", "in/B"} and case.inputs["A"].dtype == np.uint16
    assert runner.run_case(adapters.resolve("reference"), case).status == "pass"
    case = live.build("bf16_softmax_backward", live.parse_shape("bf16_softmax_backward", "N=2,V=9"), seed=1)
    assert case.bf16 == {"in/dy", "in/y", "out/dx"}
    pytest.importorskip("hypothesis")
    from refreplay.testing import fuzz

    out = fuzz.fuzz(adapters.resolve("reference"), "bf16_layernorm_forward", 5, 0, 4096)
    assert out.result is None


# ---- wrong kernels and their diagnosis ------------------------------------------------------------


def _misreading(fn):
    def kernel(op, *inputs):
        got = fn(OPS[op], [np.ascontiguousarray(x) for x in inputs])
        if got is None:
            return _reference_dispatch(op, *inputs)
        return got if len(got) > 1 else got[0]

    kernel.__name__ = fn.__name__
    return kernel


@pytest.mark.parametrize(
    "fn, ops, words, family",
    [
        (BV.truncating, ["bf16_encode", "bf16_add", "bf16_linear_forward"], "by truncation", "bf16_rounding"),
        (BV.rounding_ties_away, ["bf16_encode", "bf16_add"], "ties away from zero", "bf16_rounding"),
        (BV.accumulating_in_bf16, ["bf16_matmul", "bf16_matmul_nt"], "accumulates in bf16", "bf16_accumulation"),
        (BV.keeping_subnormals, ["bf16_decode", "bf16_matmul"], "subnormal inputs not zeroed", "bf16_input_zeroing"),
        (
            BV.rounding_an_intermediate,
            ["bf16_softmax_forward", "bf16_attention_forward"],
            "rounds an intermediate",
            "bf16_intermediate",
        ),
    ],
)
def test_a_misreading_fails_its_probes_and_is_named(fn, ops, words, family):
    report = rc.check(_misreading(fn), ops=ops)
    assert not report.conformant
    for op in ops:
        failed = {c["family"] for c in report.cases if c["op"] == op and c["status"] == "fail"}
        assert family in failed, (op, failed)
        assert words in _diagnosis(report, op), (op, _diagnosis(report, op))


def test_torch_native_bf16_ops_fail_with_their_cause():
    """Negative controls: PyTorch's bf16 ops.  Its matmul returns a bf16
    result (the binary32 accumulator rounded), its ops keep bf16 subnormals
    and NaN payloads and use its own exp/tanh."""
    pytest.importorskip("torch")
    ops = [
        "bf16_matmul",
        "bf16_add",
        "bf16_gelu_forward",
        "bf16_layernorm_forward",
        "bf16_softmax_forward",
        "bf16_cross_entropy_forward",
        "bf16_attention_forward",
        "bf16_encode",
        "bf16_embedding_forward",
    ]
    report = rc.check("torch", ops=ops)
    assert not report.conformant
    for op in ops:
        assert report.ops[op]["fail"] > 0, op
    assert "rounds a binary32 output to bf16" in _diagnosis(report, "bf16_matmul")
    assert "non-canonical bf16 NaN" in _diagnosis(report, "bf16_add")
    assert "subnormal inputs not zeroed" in _diagnosis(report, "bf16_embedding_forward")
    for op in ops:
        assert _diagnosis(report, op), op


def test_a_probe_that_does_not_isolate_is_refused():
    """[bf16.probes.c1] The generator's check: a rounding probe of exact bf16
    sums, an accumulation probe whose partial sums are bf16 values, and an
    intermediate probe whose rounding changes nothing are refused."""
    from refreplay.conformance.table import bf16 as bf16_ops
    from refreplay.conformance.inputs.separation import ProbeError

    def check(op, family, inputs):
        opdef = OPS[op]
        raw = [np.ascontiguousarray(inputs[n]) for n in opdef.inputs]
        outputs = dict(zip(opdef.outputs, (lambda o: o if isinstance(o, tuple) else (o,))(opdef.reference(*raw))))
        bf16_ops.check_probe(opdef, family, raw, outputs)

    ones = np.full(4, 0x3F80, np.uint16)
    ties = {"a": np.array([0x3F80, 0x3F81], np.uint16), "b": np.full(2, 0x3B80, np.uint16)}
    check("bf16_add", "bf16_rounding", ties)  # + 2^-8: ties with even (away differs) and odd (truncation differs) bits
    with pytest.raises(ProbeError, match="truncation"):
        check("bf16_add", "bf16_rounding", {"a": ones, "b": ones})  # 1 + 1 = 2: nothing to round
    with pytest.raises(ProbeError, match="accumulates in bf16"):
        check(
            "bf16_matmul",
            "bf16_accumulation",
            {"A": np.full((1, 4), 0x3F80, np.uint16), "B": np.full((4, 1), 0x3F80, np.uint16)},
        )  # 1+1+1+1
    with pytest.raises(ProbeError, match="rounds an intermediate"):
        check("bf16_softmax_forward", "bf16_intermediate", {"x": np.zeros((1, 4), np.uint16)})  # e = 1: exact


def test_exec_output_of_the_wrong_width_fails_the_case(tmp_path):
    """A bf16 output written as 4-byte floats is the wrong size: the case errs, never passes."""
    prog = tmp_path / "wide"
    prog.write_text(
        f"#!{sys.executable}\n"
        + textwrap.dedent("""
        import sys, numpy as np
        d = sys.argv[1]
        np.fromfile(d + "/in_x.bin", "<f4").tofile(d + "/out_out.bin")
    """)
    )
    prog.chmod(0o755)
    report = rc.check(f"exec:{prog}", ops=["bf16_encode"])
    assert not report.conformant and report.counts["error"] == sum(
        c["op"] == "bf16_encode" for c in store.read_manifest()["cases"]
    )
    assert "bytes, expected" in report.cases[0]["message"]


def test_bf16_variant_models_give_the_reference_bits():
    """[conf.diagnosis.r1] The binary32 op models of ``variants`` between the
    conversions give every committed bf16 case's bits with the spec's parts,
    so a variant the diagnosis names differs from the spec by its one part."""
    from refreplay.conformance.readings import transformer as Vr
    from refreplay.conformance.base.case import load_inputs

    ops = [o for o in Vr.MODELS if o.startswith("bf16_")]
    assert len(ops) >= 14
    _, cases = store.load_cases(ops=set(ops))
    checked = 0
    for c in cases:
        if c.family == "sweep":
            continue
        outs = Vr.evaluate(c.op, load_inputs(list(c.inputs.values())))
        exp = [bf16bits.widen(e) if f"out/{n}" in c.bf16 else e for n, e in c.outputs.items()]
        assert Vr.distance(outs, exp)[0] == 0, c.id
        checked += 1
    assert checked >= 90


def test_pytest_plugin_runs_bf16_cases(tmp_path):
    """The pytest plugin hands bf16 tensors to a kernel module as uint16 bits:
    a NumPy decode passes case by case; a truncating encode fails its
    bf16_rounding case with the diagnosis in the failure text."""
    import os
    import subprocess
    from pathlib import Path

    (tmp_path / "bf16k.py").write_text(
        textwrap.dedent("""
        import numpy as np

        def bf16_decode(x):
            e, f = x & 0x7F80, x & 0x7F
            h = np.where(e == 0, x & 0x8000, np.where((e == 0x7F80) & (f != 0), 0x7FC0, x))
            return (h.astype(np.uint32) << 16).view(np.float32)

        def bf16_encode(x):
            u = x.view(np.uint32)
            sub = (u & 0x7F800000) == 0
            nan = np.isnan(x)
            return np.where(nan, 0x7FC0, np.where(sub, (u >> 16) & 0x8000, u >> 16)).astype(np.uint16)
    """)
    )
    env = dict(
        os.environ,
        PYTHONPATH=f"{Path(__file__).resolve().parent.parent}{os.pathsep}{tmp_path}",
        PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",
    )
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "refreplay.pytest_plugin",
            "-q",
            "-rA",
            "-p",
            "no:cacheprovider",
            "--refreplay-kernel",
            "bf16k",
            "--refreplay-op",
            "bf16_decode",
            "--refreplay-op",
            "bf16_encode",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 1, p.stdout[-3000:]
    assert "PASSED bf16k::bf16_decode-bf16_input_zeroing-00" in p.stdout
    assert "FAILED bf16k::bf16_encode-bf16_rounding-00" in p.stdout
    assert "rounds to bf16 by truncation" in p.stdout


def test_a_fused_bf16_matmul_is_diagnosed_as_contracting():
    """[bf16.exact.r1] bf16 products are exact, yet the fma probes (a product
    below 2^-126) catch a fused multiply-add; the diagnosis says so, and that
    unflushed products would give the same bits."""
    import mutants as M

    def bf16_matmul(A, B):
        return M.k_bf16_matmul(A, B, fused=True)

    report = rc.check(bf16_matmul, ops=["bf16_matmul"])
    failed = {c["family"] for c in report.cases if c["status"] == "fail"}
    assert failed == {"fma"}, failed
    assert "a fused multiply-add or unflushed (gradual-underflow) products" in _diagnosis(report)


def test_fuzz_finds_torch_bf16_matmul_and_saves_a_bf16_case(tmp_path, capsys):
    """`refreplay fuzz` on a bf16 op: a difference is shrunk, diagnosed and
    saved with its BF16 tensors, and the saved case replays as vectors."""
    pytest.importorskip("torch")
    pytest.importorskip("hypothesis")
    from refreplay import cli

    save = tmp_path / "fz"
    assert cli.main(["fuzz", "torch", "--op", "bf16_matmul", "--examples", "20", "--save", str(save)]) == 1
    assert "A: uint16[" in capsys.readouterr().out
    m = json.loads((save / "manifest.json").read_text())
    assert {t["dtype"] for t in m["cases"][0]["inputs"]} == {"bf16"}
    assert rc.check("reference", vectors=save).conformant
