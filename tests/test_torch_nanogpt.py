"""A nanoGPT-style GPT in PyTorch (learned position table, LayerNorm with
and without biases, tanh GELU, tied head: examples/torch_gpt/gpt.py's
``nanogpt_config``) is expressed by spec chapter 20 ([model.pos.c1],
[norm.layer.nobias.c1]), trained under torchrun (gloo, 127.0.0.1, bounded
by timeouts) and published: R = 1 and R = 2 give the same chain head, it
is the head `refreplay train` computes for the same recipe, `refreplay
replay` verifies it with the reference trainer (exit 0), `audit`
certifies the sampled steps, and a flipped checkpoint bit fails (exit 1).  R = 3 and 4 under `-m slow`.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import shutil

import numpy as np
import pytest
import torch

import refreplay.torch as rt
from cli_helpers import run_cli
from refreplay.training.data import inputs_targets
from refreplay.training.model import Model, init_params
from refreplay.training.presets import PRESETS, model_to_json, train_to_json
from refreplay.torch.publish import model_config
from torch_dist_helpers import ROOT, corpus, ranks, torchrun

STEPS = 2
TINY, TINY_TRAIN = PRESETS["tiny"]


def _example(name):
    spec = importlib.util.spec_from_file_location(f"nanogpt_{name}", ROOT / "examples" / "torch_gpt" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


GPT = _example("gpt")
TRAIN = _example("train")
CFG = {v: GPT.nanogpt_config(TINY, bias=v == "bias") for v in ("bias", "nobias")}


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    """The corpus, and one single-process nanoGPT run first so that every
    kernel is in the on-disk cache before several ranks start."""
    path = corpus(tmp_path_factory.mktemp("corpus") / "corpus.txt")
    res = ranks(
        1,
        "--out",
        tmp_path_factory.mktemp("warm") / "warm",
        "--steps",
        1,
        "--data",
        path,
        "--nanogpt",
        "nobias",
        timeout=900,
    )
    assert res[0][0] == 0, res
    return path


def _run(tmp, world, text, variant):
    out = tmp / f"run-{variant}-{world}"
    res = torchrun(
        world,
        "--out",
        out,
        "--steps",
        STEPS,
        "--checkpoint-every",
        1,
        "--data",
        text,
        "--nanogpt",
        variant,
        timeout=400,
    )
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    return out


def _records(run):
    return [json.loads(line) for line in (run / "steps.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module", params=["bias", "nobias"])
def runs(request, tmp_path_factory, text):
    tmp = tmp_path_factory.mktemp(f"nano-{request.param}")
    return request.param, {r: _run(tmp, r, text, request.param) for r in (1, 2)}


# ---- in one process: the torch model is the reference model ----------------------------------


@pytest.mark.parametrize("variant", ["bias", "nobias"])
def test_torch_nanogpt_is_the_reference_model_bit_for_bit(variant):
    """[model.pos.c1] [norm.layer.nobias.c1] One micro-batch: loss and every
    gradient (wpe included) equal the reference trainer's Model."""
    cfg = dataclasses.replace(CFG[variant], seq_len=16)
    model, named, _, _ = TRAIN.build(cfg, TINY_TRAIN)
    assert ("wpe" in named) and (("lnf.b" in named) == (variant == "bias"))
    g = torch.Generator().manual_seed(1)
    batch = torch.randint(0, cfg.vocab, (2, cfg.seq_len + 1), generator=g).numpy().astype(np.uint16)
    x, y = inputs_targets(batch)
    loss = model(torch.from_numpy(x), torch.from_numpy(y))
    loss.backward()
    ref = Model(cfg).loss_and_grads(init_params(cfg, TINY_TRAIN.seed), x, y)
    assert loss.detach().numpy().tobytes() == np.float32(ref.loss).tobytes()
    assert sorted(ref.grads) == sorted(named)
    for k, p in named.items():
        assert p.grad.numpy().tobytes() == ref.grads[k].tobytes(), k


def _late_forward(model, idx, targets):
    """examples/torch_gpt/gpt.py's forward with one change: the position
    rows are added to the first LayerNorm's output, not to the embedding."""
    from refreplay.torch import functional as F

    B, T = idx.shape
    w_emb, w_head = F.fork(model.wte.weight)
    x = F.embedding(idx, w_emb)
    pos = model.wpe(model.pos_ids[:T].expand(B, T))
    for i, block in enumerate(model.h.values()):
        if i:
            x = block(x)
            continue
        x, x_attn = F.fork(x)
        x = F.add(x, block.attn(F.add(block.ln1(x_attn), pos)))
        x, x_mlp = F.fork(x)
        x = F.add(x, block.mlp(block.ln2(x_mlp)))
    logits = F.linear(model.lnf(x), w_head)
    return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def test_a_torch_model_that_adds_the_positions_after_the_first_norm_is_not_the_reference():
    """The check can fail: the same modules (model_config cannot tell), wpe
    added after ln1; loss and d wpe differ from the reference model's."""
    cfg = dataclasses.replace(CFG["bias"], seq_len=16)
    model, named, _, _ = TRAIN.build(cfg, TINY_TRAIN)
    g = torch.Generator().manual_seed(1)
    batch = torch.randint(0, cfg.vocab, (2, cfg.seq_len + 1), generator=g).numpy().astype(np.uint16)
    x, y = inputs_targets(batch)
    loss = _late_forward(model, torch.from_numpy(x), torch.from_numpy(y))
    loss.backward()
    ref = Model(cfg).loss_and_grads(init_params(cfg, TINY_TRAIN.seed), x, y)
    assert loss.detach().numpy().tobytes() != np.float32(ref.loss).tobytes()
    assert named["wpe"].grad.numpy().tobytes() != ref.grads["wpe"].tobytes()


def test_model_config_maps_the_nanogpt_model():
    for variant, cfg in CFG.items():
        model = GPT.GPT(cfg)
        got = model_config(model, GPT.named_state(model), init_std=cfg.init_std)
        assert got == cfg and got.pos == "learned" and got.norm_bias == (variant == "bias")


def test_model_config_refuses_what_chapter_20_cannot_express_naming_the_module():
    cfg = CFG["nobias"]
    model = GPT.GPT(cfg)
    model.h["01"].attn = rt.nn.CausalSelfAttention(cfg.width, cfg.heads, cfg.seq_len)  # rotary as well
    with pytest.raises(rt.Unsupported, match=r"attention 'h\.01\.attn' is built with rope=True.*'wpe'"):
        model_config(model, GPT.named_state(model))
    model = GPT.GPT(cfg)
    model.h["00"].ln2 = rt.nn.LayerNorm(cfg.width, eps=cfg.norm_eps)  # one LayerNorm with a bias
    with pytest.raises(rt.Unsupported, match=r"all have a bias or none.*'h\.00\.ln2', True"):
        model_config(model, GPT.named_state(model))
    model = GPT.GPT(cfg)
    named = GPT.named_state(model)
    named["pos_table"] = named.pop("wpe")  # positions not named as the spec's table: no rope either
    with pytest.raises(rt.Unsupported, match="one token embedding"):
        model_config(model, named)
    model = GPT.GPT(dataclasses.replace(TINY))
    model.h["00"].attn = rt.nn.CausalSelfAttention(TINY.width, TINY.heads, TINY.seq_len, rope=False)
    with pytest.raises(rt.Unsupported, match=r"'h\.00\.attn' is built with rope=False.*no position table"):
        model_config(model, GPT.named_state(model))


def test_model_config_refuses_a_norm_without_weight_naming_it():
    """[norm.layer.noaffine.c1] runs through refreplay.torch, but chapter 20's model has norm weights."""
    model = GPT.GPT(CFG["nobias"])
    model.h["00"].ln1 = rt.nn.LayerNorm(TINY.width, elementwise_affine=False)
    with pytest.raises(rt.Unsupported, match=r"'h\.00\.ln1'.*have none"):
        model_config(model, GPT.named_state(model))


def test_convert_swaps_a_torch_layernorm_without_bias():
    from torch import nn

    m = nn.Sequential(nn.LayerNorm(8, eps=float(np.float32(1e-5)), bias=False))
    rt.convert(m)
    assert isinstance(m[0], rt.nn.LayerNorm) and m[0].bias is None
    x = torch.ones(1, 8)
    with torch.no_grad():
        m[0].weight.fill_(-1.0)
    assert torch.equal(m(x).view(torch.int32), torch.full((1, 8), -0.0).view(torch.int32))


# ---- under torchrun ------------------------------------------------------------------------


def test_world_sizes_1_and_2_publish_the_same_run(runs):
    """[fold.ranks.c1] every record, checkpoint and the head."""
    _, by_r = runs
    one, two = by_r[1], by_r[2]
    assert _records(one) == _records(two) and len(_records(one)) == STEPS + 1
    assert (one / "head.json").read_bytes() == (two / "head.json").read_bytes()
    for k in range(STEPS + 1):
        name = f"checkpoints/step-{k:07d}.safetensors"
        assert (one / name).read_bytes() == (two / name).read_bytes(), name
    recipe = json.loads((one / "recipe.json").read_text())["recipe"]["model"]
    assert recipe["pos"] == "learned" and recipe.get("norm_bias", True) == (runs[0] == "bias")


def test_the_head_is_refreplay_train_s(runs, tmp_path, text):
    """The reference trainer, from the recipe's model config, computes the same chain."""
    variant, by_r = runs
    cfg = tmp_path / "cfg.json"
    train = train_to_json(TINY_TRAIN)
    cfg.write_text(json.dumps({"model": model_to_json(CFG[variant]), "train": train}))
    out = tmp_path / "ref"
    res = run_cli(
        "train", "--config", cfg, "--steps", STEPS, "--checkpoint-every", 1, "--data", text, "--out", out, "--quiet"
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert _records(out) == _records(by_r[2])
    assert (out / "head.json").read_bytes() == (by_r[2] / "head.json").read_bytes()


def test_replay_verifies_and_a_flipped_checkpoint_bit_fails(runs, tmp_path):
    _, by_r = runs
    run = by_r[2]
    rep = run_cli("replay", run, "--steps", f"1:{STEPS}", "--quiet")
    assert rep.returncode == 0 and "VERIFIED" in rep.stdout, rep.stdout + rep.stderr
    bad = tmp_path / "bad"
    shutil.copytree(run, bad)
    ck = bad / "checkpoints" / "step-0000001.safetensors"
    raw = bytearray(ck.read_bytes())
    raw[-3] ^= 0x10
    ck.write_bytes(bytes(raw))
    out = run_cli("replay", bad, "--step", STEPS, "--quiet")
    assert out.returncode == 1 and "VERIFIED" not in out.stdout, out.stdout + out.stderr


def test_audit_certifies_the_sampled_steps_and_coverage_accepts_them(runs, tmp_path):
    import auditor_keys

    run = runs[1][2]
    key, pub = auditor_keys.key_files(tmp_path / "keys", "ann")
    certs = tmp_path / "certs"
    aud = run_cli(
        "audit",
        run,
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
    cov = run_cli("coverage", run, certs, "--trust", pub)
    assert cov.returncode == 0, cov.stdout + cov.stderr


@pytest.mark.slow
@pytest.mark.parametrize("world", [3, 4])
def test_world_sizes_3_and_4_publish_the_same_run(runs, tmp_path, text, world):
    variant, by_r = runs
    assert _records(_run(tmp_path, world, text, variant)) == _records(by_r[1])


def test_the_nanogpt_port_with_bias_false_converts_and_runs_without_a_leak():
    """examples/nanogpt_port with nanoGPT's bias=False: nn.LayerNorm(bias=False)
    and bias-free Linears convert; a whole step has no leak under guard, and
    two runs give the same bits."""
    import sys

    here = ROOT / "examples" / "nanogpt_port"
    sys.path.insert(0, str(here))
    try:
        from model import Config

        spec = importlib.util.spec_from_file_location("nanogpt_port_train_nobias", here / "train.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(here))
    cfg = Config(vocab=64, block=16, layers=1, heads=2, width=32, bias=False)
    run = mod.Run(cfg)
    assert all(p.dim() == 2 or n.endswith("weight") for n, p in run.named.items())
    assert not any(n.endswith("bias") for n in run.named)
    with rt.guard(collect=True, model=run.model) as leaks:
        first = run.step(1)
    assert list(leaks) == [], str(leaks)
    assert mod.Run(cfg).step(1) == first
    assert mod.Run(Config(vocab=64, block=16, layers=1, heads=2, width=32, bias=True)).step(1) != first
