"""A run published from a torch loop (refreplay.torch.publish, two real
gloo ranks) is the run `refreplay train` writes for the same recipe, file
for file, and `refreplay replay` / `audit` / `coverage` verify it with the
reference trainer alone; tampered variants fail at the step they affect.
The model -> ModelConfig mapping refuses what spec/20 cannot express."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
import zstandard
from torch import nn

from cli_helpers import run_cli
from torch_dist_helpers import warm, ROOT, corpus, ranks

import refreplay.torch as rt
from refreplay.training.presets import PRESETS
from refreplay.torch.publish import model_config

STEPS = 3


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    path = corpus(tmp_path_factory.mktemp("corpus") / "corpus.txt")
    warm(tmp_path_factory.mktemp("warm"), path)
    return path


def _publish(out, text, *extra, world=2):
    res = ranks(world, "--out", out, "--steps", STEPS, "--checkpoint-every", 2, "--data", text, *extra)
    assert all(rc == 0 for rc, _, _ in res), res
    return out


@pytest.fixture(scope="module")
def published(tmp_path_factory, text):
    return _publish(tmp_path_factory.mktemp("pub") / "run", text)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, text):
    out = tmp_path_factory.mktemp("ref") / "run"
    res = run_cli(
        "train", "--preset", "tiny", "--steps", STEPS, "--checkpoint-every", 2, "--data", text, "--out", out, "--quiet"
    )
    assert res.returncode == 0, res.stdout + res.stderr
    return out


def _files(run):
    return sorted(str(p.relative_to(run)) for p in run.rglob("*") if p.is_file())


def test_published_files_equal_refreplay_train(published, reference):
    """Every file byte for byte; recipe.json differs only in its unhashed
    "run" fields launcher and ranks (how the run was made)."""
    assert _files(published) == _files(reference)
    for name in _files(reference):
        if name != "recipe.json":
            assert (published / name).read_bytes() == (reference / name).read_bytes(), name
    pub, ref = (json.loads((r / "recipe.json").read_text()) for r in (published, reference))
    assert (pub["run"]["launcher"], pub["run"]["ranks"]) == ("torch", 2)
    pub["run"].update(launcher="inproc", ranks=1)
    assert pub == ref


def test_replay_audit_and_coverage_verify_the_published_run(published, tmp_path):
    rep = run_cli("replay", published, "--step", STEPS, "--quiet")
    assert rep.returncode == 0 and "VERIFIED" in rep.stdout, rep.stdout + rep.stderr
    import auditor_keys

    certs = tmp_path / "certs"
    key, pub = auditor_keys.key_files(tmp_path / "keys", "ann")
    aud = run_cli(
        "audit",
        published,
        "--sample",
        STEPS,
        "--beacon",
        "c0ffee",
        "--auditor",
        "ann",
        "--key",
        key,
        "--out",
        certs,
        "--quiet",
    )
    assert aud.returncode == 0 and aud.stdout.count("VERIFIED") == STEPS, aud.stdout + aud.stderr
    cov = run_cli("coverage", published, certs, "--trust", pub)
    assert cov.returncode == 0, cov.stdout + cov.stderr


def _copy(published, tmp_path):
    dst = tmp_path / "copy"
    shutil.copytree(published, dst)
    return dst


def _first_divergence(run, step):
    out = run_cli("replay", run, "--step", step, "--quiet")
    text = out.stdout + out.stderr
    assert out.returncode == 1 and "VERIFIED" not in text, text
    return text


def test_flipped_checkpoint_bit_fails(published, tmp_path):
    run = _copy(published, tmp_path)
    ck = run / "checkpoints" / "step-0000002.safetensors"
    raw = bytearray(ck.read_bytes())
    raw[-3] ^= 0x10
    ck.write_bytes(bytes(raw))
    assert "first divergence at step 2" in _first_divergence(run, 3)


def test_changed_token_fails_at_its_step(published, tmp_path):
    run = _copy(published, tmp_path)
    from refreplay.training.run import open_run

    sid = int(open_run(run).stream().sample_ids(1)[0])
    shard = run / "data" / "shard-00000.zst"
    width = json.loads((run / "data" / "manifest.json").read_text())["sample_tokens"]
    samples = np.frombuffer(zstandard.ZstdDecompressor().decompress(shard.read_bytes()), np.uint8)
    samples = samples.reshape(-1, width).copy()
    samples[sid, 3] ^= 1
    shard.write_bytes(zstandard.ZstdCompressor().compress(samples.tobytes()))
    assert "first divergence at step 1" in _first_divergence(run, 1)


def test_one_step_summed_by_all_reduce_is_named(published, tmp_path, text):
    """Three ranks, step 2 summed by dist.all_reduce: a self-consistent chain
    with another head; replay names step 2 (exit 1)."""
    run = _publish(tmp_path / "run", text, "--all-reduce-steps", 2, world=3)
    assert (run / "head.json").read_bytes() != (published / "head.json").read_bytes()
    assert json.loads((run / "steps.jsonl").read_text().splitlines()[1]) == json.loads(
        (published / "steps.jsonl").read_text().splitlines()[1]
    )
    assert "first divergence at step 2" in _first_divergence(run, 2)


# ---- the model -> ModelConfig mapping --------------------------------------------------


def _example():
    import importlib.util

    spec = importlib.util.spec_from_file_location("torch_gpt_gpt_pub", ROOT / "examples" / "torch_gpt" / "gpt.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


GPT = _example()


@pytest.mark.parametrize("preset", ["tiny"])
def test_model_config_of_the_example_is_the_preset(preset):
    cfg = PRESETS[preset][0]
    model = GPT.GPT(cfg)
    assert model_config(model, GPT.named_state(model), init_std=cfg.init_std) == cfg.validate()


def test_model_config_of_the_variant():
    import dataclasses

    cfg = dataclasses.replace(PRESETS["tiny"][0], norm="layer", mlp="swiglu", tied=False, bias=True)
    model = GPT.GPT(cfg)
    assert model_config(model, GPT.named_state(model)) == cfg.validate()


def test_model_config_refuses_an_unknown_module_by_name():
    cfg = PRESETS["tiny"][0]
    model = GPT.GPT(cfg)
    model.h["01"].drop = nn.Dropout(0.1)
    with pytest.raises(rt.Unsupported, match=r"'h\.01\.drop' \(Dropout\)"):
        model_config(model, GPT.named_state(model))


def test_model_config_refuses_a_torch_layernorm_by_name():
    cfg = PRESETS["tiny"][0]
    model = GPT.GPT(cfg)
    model.lnf = nn.LayerNorm(cfg.width)
    with pytest.raises(rt.Unsupported, match=r"'lnf' \(LayerNorm\)"):
        model_config(model, GPT.named_state(model))


def test_model_config_refuses_a_bare_parameter_by_name():
    cfg = PRESETS["tiny"][0]
    model = GPT.GPT(cfg)
    named = GPT.named_state(model)
    model.h["00"].scale = nn.Parameter(torch.ones(1))
    with pytest.raises(rt.Unsupported, match=r"'h\.00'.*scale"):
        model_config(model, named)


def test_model_config_refuses_names_that_are_not_the_spec_s():
    cfg = PRESETS["tiny"][0]
    model = GPT.GPT(cfg)
    named = GPT.named_state(model)
    named["wte.extra"] = named.pop("wte")
    with pytest.raises(rt.Unsupported, match=r"missing \['wte'\]"):
        model_config(model, named)


def test_model_config_refuses_other_rotary_tables():
    cfg = PRESETS["tiny"][0]
    model = GPT.GPT(cfg)
    with pytest.raises(rt.Unsupported, match="rotary tables"):
        model_config(model, GPT.named_state(model), rope_theta=np.float32(500.0))


# ---- the publisher refuses what would not be the run format -------------------------------


def test_publisher_refuses_steps_out_of_order_and_a_used_directory(tmp_path, text):
    import sys

    from refreplay.errors import InputError
    from refreplay.torch.publish import Publisher

    sys.path.insert(0, str(ROOT / "examples" / "torch_gpt"))
    from train import build

    cfg, tcfg = PRESETS["tiny"]
    pub = Publisher(tmp_path / "run", cfg, tcfg, steps=2, checkpoint_every=1, corpus_files=[text])
    _, named, opt, _ = build(cfg, tcfg)
    with pytest.raises(rt.Unsupported, match="step 0 has no loss"):
        pub.publish(0, named, opt, np.float32(1.0))
    with pytest.raises(rt.Unsupported, match="step 1 out of order"):
        pub.publish(1, named, opt, np.float32(1.0))
    pub.publish(0, named, opt)
    with pytest.raises(rt.Unsupported, match="step 2 out of order"):
        pub.publish(2, named, opt, np.float32(1.0))
    assert len((tmp_path / "run" / "steps.jsonl").read_text().splitlines()) == 1
    assert not (tmp_path / "run" / "head.json").exists()
    with pytest.raises(InputError, match="not an empty directory"):
        Publisher(tmp_path / "run", cfg, tcfg, steps=2, checkpoint_every=1, corpus_files=[text])
    import dataclasses

    with pytest.raises(InputError, match="vocabulary 512"):  # refused before any data is written
        Publisher(
            tmp_path / "other",
            dataclasses.replace(cfg, vocab=512),
            tcfg,
            steps=2,
            checkpoint_every=1,
            corpus_files=[text],
        )
    assert not (tmp_path / "other" / "data" / "manifest.json").exists()
