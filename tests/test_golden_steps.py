"""Golden training steps ([conf.steps.c1]): vectors/steps.json regenerates
byte for byte, every record reproduces from the file's own samples with 1, 3
and M ranks, the recipe hash is the stated function of configuration and
samples, and an altered or malformed file is refused with the right exit
code and the first differing record named."""

from __future__ import annotations

import hashlib
import importlib
import json

import numpy as np
import pytest

import mutants as M
from refreplay import cli
from refreplay.conformance.golden import steps
from refreplay.ops import optim
from refreplay.conformance.golden.store import VECTOR_DIR

PATH = VECTOR_DIR / steps.STEPS_FILE


@pytest.fixture(scope="module")
def committed():
    return json.loads(PATH.read_text())


def test_regeneration_is_byte_identical():
    assert steps.generate() == PATH.read_bytes()


def test_every_record_reproduces_with_1_3_and_m_ranks():
    checked, problems = steps.check(PATH, ranks=(1, 3, 6, 7, 8))
    assert problems == []
    # 4 records per case; tiny and tiny-bf16 (M = 8) with 5 rank counts, the M = 6 case with 3,
    # the M = 7 case with 4 (R > M is skipped)
    assert checked == 4 * 5 + 4 * 3 + 4 * 5 + 4 * 4


# ---- wrong readings of the step clauses fail the golden steps ([conf.steps.c1]) ------------

M7 = next(c for c in steps.CASES if c.name == "tiny-m7-clip")

# Every mutant of tests/mutants.py STEP_MUTANTS must fail tiny-m7-clip, the case where the final
# fold of three blocks ([fold.final.c1]), clipping ([optim.clip.c1]), an inexact recip(M)
# ([fold.scale.c1]) and the folded loss ([step.loss.c1]) each decide bits.  (Measured: bottom-up
# folding, no clipping and both clip misreadings pass the three other cases; division by M and
# the mean per micro-batch also fail the M = 6 case, the loss summed in order tiny and M = 6.)


def _patch(monkeypatch, name):
    for module, path, fn in M.STEP_MUTANTS[name][0]:
        owner = importlib.import_module(module)
        *outer, attr = path.split(".")
        for part in outer:
            owner = getattr(owner, part)
        assert hasattr(owner, attr), f"{module}.{path} does not exist: the mutant would patch nothing"
        monkeypatch.setattr(owner, attr, fn)


def test_every_step_clause_has_a_mutant():
    clauses = {clause for _, clause, _ in M.STEP_MUTANTS.values()}
    assert {"fold.final.c1", "fold.scale.c1", "step.loss.c1", "optim.clip.c1"} <= clauses
    assert len(M.STEP_MUTANTS) >= 4


@pytest.mark.parametrize("name", sorted(M.STEP_MUTANTS))
def test_a_step_mutant_fails_vectors_steps(name, monkeypatch, capsys):
    """`refreplay vectors steps` (the committed file, 1 rank) with one clause
    misread exits 1 and names the case that catches it."""
    _patch(monkeypatch, name)
    assert cli.main(["vectors", "steps", "--ranks", "1"]) == 1
    out = capsys.readouterr().out
    clause, what = M.STEP_MUTANTS[name][1:]
    assert f"MISMATCH {M7.name}, 1 rank(s): step " in out, f"{name} ([{clause}], {what}) passes"
    assert "FAILED" in out
    if name == "loss summed in order":  # the gradients are the tree's: only the loss field tells
        assert f"MISMATCH {M7.name}, 1 rank(s): step 2: loss is" in out


def _records(case):
    return steps.run_case(case.model, case.train, steps._samples(case), case.steps)


def test_the_m7_case_engages_clipping(monkeypatch):
    seen = []
    clip = optim.clip_grad_norm

    def spy(grads, max_norm):
        out = clip(grads, max_norm)
        seen.append(out[1])
        return out

    monkeypatch.setattr(optim, "clip_grad_norm", spy)
    _records(M7)
    assert len(seen) == M7.steps and all(coef < np.float32(1) for coef in seen), seen


def test_cases_cover_what_the_clause_says(committed):
    cases = {c["name"]: c for c in committed["cases"]}
    tiny, var = cases["tiny"]["model"], cases["layer-swiglu-int8"]["model"]
    assert (tiny["norm"], tiny["mlp"], tiny["tied"], tiny["linear"]) == ("rms", "gelu", True, "fp32")
    assert (var["norm"], var["mlp"], var["tied"], var["linear"], var["bias"]) == (
        "layer",
        "swiglu",
        False,
        "int8",
        True,
    )
    assert cases["layer-swiglu-int8"]["train"]["micro_batches"] == 6
    # [bf16.precision.c1] the tiny preset in the bf16 profile; the fp32 cases carry no precision field
    assert cases["tiny-bf16"]["model"] == {**tiny, "precision": "bf16"}
    assert "precision" not in tiny and "precision" not in var
    for c in committed["cases"]:
        g = c["train"]["micro_batches"] * c["train"]["micro_batch_size"]
        steps_per_epoch = len(c["samples"]) // g
        assert len(c["records"]) - 1 > steps_per_epoch  # the last step reads epoch 1
        losses = [r["loss"] for r in c["records"][1:]]
        assert len(set(losses)) == len(losses)  # training moves


def test_recipe_hash_is_the_stated_function(committed):
    c = committed["cases"][0]
    raw = b"".join(bytes.fromhex(r) for r in c["samples"])
    body = {"model": c["model"], "train": c["train"], "samples_sha256": hashlib.sha256(raw).hexdigest()}
    want = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    assert c["recipe_sha256"] == want


def test_cli_reports_success(capsys):
    assert cli.main(["vectors", "steps", "--ranks", "1"]) == 0
    out = capsys.readouterr().out
    assert "16 records of 4 cases" in out and "ops on cpu" in out


def test_an_altered_record_is_named(tmp_path, committed, capsys):
    bad = json.loads(json.dumps(committed))
    rec = bad["cases"][1]["records"][2]
    rec["loss"] = "0x3F800000"
    path = tmp_path / "steps.json"
    path.write_text(json.dumps(bad))
    assert cli.main(["vectors", "steps", "--file", str(path), "--ranks", "1", "3"]) == 1
    out = capsys.readouterr().out
    assert "MISMATCH layer-swiglu-int8, 1 rank(s): step 2: loss is 0x" in out
    assert "expected 0x3F800000" in out and "MISMATCH layer-swiglu-int8, 3 rank(s): step 2" in out
    assert "FAILED" in out


def test_altered_samples_change_the_recipe_hash(tmp_path, committed, capsys):
    bad = json.loads(json.dumps(committed))
    row = bytearray(bytes.fromhex(bad["cases"][0]["samples"][5]))
    row[3] ^= 1
    bad["cases"][0]["samples"][5] = row.hex()
    path = tmp_path / "steps.json"
    path.write_text(json.dumps(bad))
    checked, problems = steps.check(path)
    assert problems and problems[0].startswith("tiny: recipe_sha256 is")


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.update(format="other"), "not a refreplay-steps/1 file"),
        (lambda d: d["cases"][0]["samples"].__setitem__(0, "00"), "seq_len + 1"),
        (lambda d: d["cases"][0]["records"].reverse(), "steps 0, 1, 2"),
        (lambda d: d["cases"][0]["model"].__setitem__("width", "wide"), "width"),
        (lambda d: d["cases"][0].pop("recipe_sha256"), "malformed"),
    ],
)
def test_malformed_files_exit_2(tmp_path, committed, capsys, mutate, message):
    bad = json.loads(json.dumps(committed))
    mutate(bad)
    path = tmp_path / "steps.json"
    path.write_text(json.dumps(bad))
    assert cli.main(["vectors", "steps", "--file", str(path)]) == 2
    assert message in capsys.readouterr().err


def test_missing_and_non_json_files_exit_2(tmp_path, capsys):
    assert cli.main(["vectors", "steps", "--file", str(tmp_path / "none.json")]) == 2
    (tmp_path / "x.json").write_bytes(b"\xff\x00")
    assert cli.main(["vectors", "steps", "--file", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert "missing steps file" in err and "not valid JSON" in err


def test_samples_are_drawn_like_other_generated_inputs():
    """[conf.verify.c1] PCG64 seeded with (seed, crc32 of the name)."""
    import zlib

    case = steps.CASES[0]
    g = np.random.Generator(np.random.PCG64([steps.SEED, zlib.crc32(b"tiny")]))
    want = g.integers(0, 256, size=(case.samples, case.model.seq_len + 1), dtype=np.uint8)
    assert np.array_equal(steps._samples(case), want)
