"""Live cases ([conf.runner.c1]): `conform --shape/--shapes` builds inputs from
a seed, computes the expected bits with the reference now, reports like a
committed case, validates shapes as adversarial input, and `--save` writes
vectors that `--vectors` replays."""

import json

import numpy as np
import pytest

from refreplay import cli
from refreplay.conformance.shapes import live
from refreplay.conformance.golden import store
from refreplay.conformance.table import OPS
from refreplay.training.presets import PRESETS

FOCUS = ("matmul", "matmul_nt", "dot", "sum", "softmax_forward", "layernorm_forward", "cross_entropy_forward")


def _bits(a):
    a = np.ascontiguousarray(a)
    return a.view(f"u{a.dtype.itemsize}")


def test_live_expected_equals_committed_where_inputs_coincide():
    """For the committed cases' own inputs, the live path computes the
    committed outputs bit for bit: every random case of every op with a live
    form, and every case of the ops in FOCUS."""
    _, cases = store.load_cases()
    checked = 0
    for c in cases:
        if c.op not in live.LIVE or not (c.family == "random" or c.op in FOCUS):
            continue
        got = live.expected(c.op, c.inputs)
        assert list(got) == list(c.outputs), c.id
        for n, e in c.outputs.items():
            assert got[n].dtype == e.dtype and got[n].shape == e.shape, c.id
            assert np.array_equal(_bits(got[n]), _bits(e)), f"{c.id}/{n}"
        checked += 1
    assert checked > 150


def test_live_case_at_a_committed_shape_uses_the_committed_pipeline():
    """A live case's expected outputs are the reference on the loaded inputs,
    the generator's own rule: rebuilding the outputs of a live case from its
    inputs through the committed generator's path gives the same bits."""
    from refreplay.conformance.base.case import as_outputs, load_inputs

    for op, dims in (
        ("matmul", {"I": 17, "K": 35, "J": 23}),
        ("softmax_forward", {"N": 2, "V": 257}),
        ("cross_entropy_forward", {"N": 3, "V": 257}),
    ):
        c = live.build(op, live.validate(op, dims), seed=5)
        ref = as_outputs(OPS[op].reference(*load_inputs(list(c.inputs.values()))), OPS[op].outputs)
        for n in ref:
            assert np.array_equal(_bits(ref[n]), _bits(c.outputs[n]))
        assert [a.shape for a in c.inputs.values()][0][0] == list(dims.values())[0]


def test_live_inputs_are_deterministic_per_seed_and_shape():
    a = live.build("matmul", {"I": 3, "K": 70, "J": 2}, seed=7)
    b = live.build("matmul", {"I": 3, "K": 70, "J": 2}, seed=7)
    c = live.build("matmul", {"I": 3, "K": 70, "J": 2}, seed=8)
    assert all(np.array_equal(_bits(a.inputs[n]), _bits(b.inputs[n])) for n in a.inputs)
    assert not np.array_equal(_bits(a.inputs["A"]), _bits(c.inputs["A"]))


def _conform(tmp_path, *args):
    out = tmp_path / "r.json"
    rc = cli.main(["conform", *args, "--json", str(out)])
    return rc, (json.loads(out.read_text()) if out.exists() else None)


def test_live_shape_reports_like_a_committed_case(tmp_path, capsys):
    rc, rep = _conform(
        tmp_path,
        "reference",
        "--op",
        "matmul",
        "--shape",
        "I=4,K=300,J=3",
        "--shape",
        "I=2,K=0,J=2",
        "--junit",
        str(tmp_path / "j.xml"),
    )
    assert rc == 0 and rep["conformant"] and rep["counts"]["pass"] == 2
    assert rep["generator_version"] == live.GENERATOR_VERSION
    assert "verdict: CONFORMANT" in capsys.readouterr().out
    assert b"matmul-live-01" in (tmp_path / "j.xml").read_bytes()
    rc, rep = _conform(tmp_path, "numpy", "--op", "matmul", "--shape", "I=4,K=300,J=3")
    assert rc == 1 and not rep["conformant"] and rep["cases"][0]["mismatches"]
    assert rep["diagnosis"]  # the runner's diagnosis, as for the vectors


BAD_SHAPES = [
    (["--op", "matmul", "--shape", "I=4,K=-1,J=3"], "not LETTER=VALUE"),
    (["--op", "matmul", "--shape", "I=4,K=3"], "missing"),
    (["--op", "matmul", "--shape", "I=4,K=3,J=3,Q=1"], "unknown shape letter"),
    (["--op", "matmul", "--shape", "I=4,K=3,J=3,I=2"], "given twice"),
    (["--op", "matmul", "--shape", "I=1e3,K=1,J=1"], "not LETTER=VALUE"),
    (["--op", "matmul", "--shape", "I=99999999999,K=1,J=1"], "out of range"),
    (["--op", "matmul", "--shape", "I=65536,K=65536,J=65536"], "above the bound"),
    (["--op", "matmul", "--shape", "I=1,K=1,J=1", "--max-elements", "2"], "above the bound"),
    (["--op", "matmul", "--shape", "I=1,K=1,J=1", "--max-elements", "0"], "--max-elements"),
    (["--op", "matmul_i8", "--shape", "I=1,K=131072,J=1"], "131071"),
    (["--op", "rope_forward", "--shape", "B=1,NH=1,T=2,HS=3"], "even"),
    (["--op", "softmax_forward", "--shape", "N=2,V=0"], "out of range"),
    (["--op", "no_such_op", "--shape", "N=1"], "unknown op"),
    (["--shape", "I=1,K=1,J=1"], "needs --op"),
    (["--op", "matmul", "--save", "x"], "--save writes live cases"),
    (["--shapes", "no_such_preset"], "unknown preset"),
    (["--op", "matmul", "--shape", "I=1,K=1,J=1", "--vectors", "vectors"], "one or the other"),
    (["--op", "matmul", "--shape", "I=1,K=1,J=1", "--seed", "-1"], "--seed"),
]


@pytest.mark.parametrize("args,message", BAD_SHAPES)
def test_bad_live_shapes_exit_2_with_a_clear_message(capsys, args, message):
    assert cli.main(["conform", "reference", *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_live_cases_refuse_an_unfit_platform(monkeypatch, capsys):
    from refreplay import doctor

    monkeypatch.setattr(doctor, "run_checks", lambda: [doctor.Finding("flush-to-zero off", False, "FTZ is on")])
    assert cli.main(["conform", "reference", "--op", "matmul", "--shape", "I=1,K=2,J=1"]) == 2
    assert "unfit platform" in capsys.readouterr().err


def test_save_then_vectors_round_trips(tmp_path):
    d = tmp_path / "saved"
    rc = cli.main(
        [
            "conform",
            "reference",
            "--op",
            "matmul",
            "--shape",
            "I=3,K=70,J=2",
            "--shape",
            "I=1,K=0,J=4",
            "--seed",
            "11",
            "--save",
            str(d),
        ]
    )
    assert rc == 0 and (d / store.MANIFEST).is_file() and (d / "matmul.safetensors").is_file()
    m, cases = store.load_cases(d)
    fresh = [
        live.build("matmul", {"I": 3, "K": 70, "J": 2}, 11, 0),
        live.build("matmul", {"I": 1, "K": 0, "J": 4}, 11, 1),
    ]
    for got, want in zip(cases, fresh):
        assert got.id == want.id
        for n in want.inputs:
            assert np.array_equal(_bits(got.inputs[n]), _bits(want.inputs[n]))
        for n in want.outputs:
            assert np.array_equal(_bits(got.outputs[n]), _bits(want.outputs[n]))
    rc, rep = _conform(tmp_path, "reference", "--vectors", str(d))
    assert rc == 0 and rep["counts"]["pass"] == 2
    rc, rep = _conform(tmp_path, "numpy", "--vectors", str(d), "--op", "matmul")
    assert rc == 1
    # saving again replaces an earlier live save
    assert cli.main(["conform", "reference", "--op", "sum", "--shape", "I=2,N=9", "--save", str(d)]) == 0
    assert not (d / "matmul.safetensors").exists() and [c.op for c in store.load_cases(d)[1]] == ["sum"]
    # a flipped byte is caught by the manifest's checksums
    f = d / "sum.safetensors"
    data = bytearray(f.read_bytes())
    data[-1] ^= 1
    f.write_bytes(bytes(data))
    assert cli.main(["conform", "reference", "--vectors", str(d)]) == 2


def test_save_never_overwrites_other_files(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    assert cli.main(["conform", "reference", "--op", "sum", "--shape", "I=1,N=2", "--save", str(tmp_path)]) == 2
    assert "not empty" in capsys.readouterr().err and (tmp_path / "notes.txt").read_text() == "mine"
    fake = tmp_path / "v"
    fake.mkdir()
    (fake / store.MANIFEST).write_text(json.dumps({"generator_version": "1", "files": {}}))
    assert cli.main(["conform", "reference", "--op", "sum", "--shape", "I=1,N=2", "--save", str(fake)]) == 2


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_preset_shapes_are_valid_live_shapes(preset):
    table = live.preset_shapes(preset)
    assert {"linear_forward", "attention_forward", "softmax_forward", "matmul_nt"} <= set(table)
    for op, shapes in table.items():
        for label, dims in shapes:
            assert list(live.validate(op, dims, max_elements=1 << 40)) == list(live.LIVE[op].letters), (op, label)


def test_shapes_preset_runs_the_model_shapes(tmp_path):
    rc, rep = _conform(
        tmp_path,
        "reference",
        "--shapes",
        "tiny",
        "--op",
        "softmax_forward",
        "--op",
        "rmsnorm_forward",
        "--op",
        "matmul_nt",
    )
    assert rc == 0 and rep["conformant"]
    ids = [c["id"] for c in rep["cases"]]
    assert len([i for i in ids if i.startswith("matmul_nt-live")]) == 5  # qkv, proj, mlp in/out, head
    rc, rep = _conform(tmp_path, "numpy", "--shapes", "tiny", "--op", "matmul_nt")
    assert rc == 1


def test_live_cases_catch_shape_dependent_switches(tmp_path):
    """The split-K matmul and the online softmax of tests/fuzz_kernels.py are
    exact below their thresholds and caught at a live shape above them, and
    at the model shapes of the tiny preset (matmul input gradients with K up
    to 256, logits with V = 256)."""
    import fuzz_kernels  # noqa: F401  (importable: tests/ is on the path)

    k = "fuzz_kernels:matmul"
    assert _conform(tmp_path, k, "--op", "matmul", "--shape", "I=3,K=64,J=5")[0] == 0
    rc, rep = _conform(tmp_path, k, "--op", "matmul", "--shape", "I=3,K=65,J=5")
    assert rc == 1 and rep["cases"][0]["status"] == "fail"
    assert _conform(tmp_path, k, "--op", "matmul", "--shapes", "tiny")[0] == 1
    s = "fuzz_kernels:softmax_forward"
    assert _conform(tmp_path, s, "--op", "softmax_forward", "--shape", "N=4,V=128")[0] == 0
    rc, rep = _conform(tmp_path, s, "--op", "softmax_forward", "--shapes", "tiny")
    assert rc == 1
    # the preset's softmax shapes: attention rows (V = T = 32) pass, logits (V = 256) fail
    assert [c["status"] for c in rep["cases"]] == ["pass", "fail"]


def test_a_shape_not_run_is_incomplete_never_conformant(tmp_path, capsys):
    """[conf.domain.c2] A preset shape above the element bound is listed and
    makes the verdict INCOMPLETE (exit 4) when every case that ran passed; a
    failing case keeps NOT CONFORMANT (exit 1).  The small preset's softmax
    shapes: attention rows N = 1,024, V = 128 (2^18 elements) and logits
    N = 128, V = 256 (2^16)."""
    args = ("--op", "softmax_forward", "--shapes", "small", "--max-elements", str(1 << 17))
    rc, rep = _conform(tmp_path, "reference", *args)
    out = capsys.readouterr().out
    assert rc == 4 and not rep["conformant"] and rep["verdict"] == "INCOMPLETE"
    assert len(rep["not_run"]) == 1 and "attention rows" in rep["not_run"][0]
    assert "verdict: INCOMPLETE" in out and "Not run (1 shapes" in out and "CONFORMANT —" not in out
    rc, rep = _conform(tmp_path, "fuzz_kernels:softmax_forward", *args)
    assert rc == 1 and rep["verdict"] == "NOT CONFORMANT"
    rc, rep = _conform(tmp_path, "reference", "--op", "softmax_forward", "--shapes", "small")
    assert rc == 0 and rep["verdict"] == "CONFORMANT" and rep["not_run"] == []


def test_gpt2_preset_never_conformant_with_a_skipped_case(tmp_path):
    """[conf.domain.c2] `--shapes gpt2-124m` on a softmax backward blocked
    above V = 8,192: its logits case (N = 1,024, V = 50,304: 3 x 51.5 M
    elements) is above the default bound, the attention rows (V = 1,024)
    pass; the verdict is INCOMPLETE, exit 4, never CONFORMANT."""
    import shape_switch_kernels  # noqa: F401  (importable: tests/ is on the path)

    rc, rep = _conform(tmp_path, "shape_switch_kernels", "--op", "softmax_backward", "--shapes", "gpt2-124m")
    assert rc == 4 and rep["verdict"] == "INCOMPLETE" and not rep["conformant"]
    assert [c["status"] for c in rep["cases"]] == ["pass"]
    assert any("logits" in x and "V=50304" in x for x in rep["not_run"])


@pytest.mark.parametrize("op", ["bf16_matmul_nt", "bf16_softmax_forward", "bf16_cross_entropy_forward"])
def test_presets_cover_bf16_ops(tmp_path, op):
    """[conf.domain.c2] A preset gives a bf16 op the shapes of its binary32 op."""
    table = live.preset_shapes("gpt2-124m")
    assert table[op] == table[op[5:]]
    rc, rep = _conform(tmp_path, "reference", "--op", op, "--shapes", "tiny")
    assert rc == 0 and rep["conformant"] and len(rep["cases"]) == len(live.preset_shapes("tiny")[op[5:]])
