"""Learned positions ([model.pos.c1]) and LayerNorm without a bias
([norm.layer.nobias.c1]) in the reference model and its recipe.

* the learned-position model's loss and gradients equal a float64 torch
  autograd oracle within tolerance, and two wrong readings of the clause
  (wpe added after the first norm; d wpe of one sequence, not summed over
  the batch) do not;
* d wpe is, bit for bit, the ordered sum over b of dh (and not the reverse
  order);
* a LayerNorm without a bias is the bias -0 bit for bit (the reference
  model and refreplay.torch), equals omitting the add, and differs from
  the bias +0 where the affine result is -0;
* the recipe leaves both fields out at their defaults (old hashes
  unchanged); bad values exit 2.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from cli_helpers import run_cli
from refreplay.errors import InputError
from refreplay.numerics.core import add, mul, sub
from refreplay.ops import norms
from refreplay.training.model import Model, init_params, param_shapes
from refreplay.training.presets import PRESETS, model_from_json, model_to_json

TINY = PRESETS["tiny"][0]
# small and quick: V = 64, T = 8; LayerNorm, GELU, tied, biases: nanoGPT's shape
NANO = dataclasses.replace(TINY, vocab=64, seq_len=8, norm="layer", pos="learned", bias=True)
NANO_NOBIAS = dataclasses.replace(NANO, bias=False, norm_bias=False)
NEG0 = np.uint32(0x80000000)


def _batch(cfg, B, seed=0, distinct=False):
    rng = np.random.default_rng(seed)
    if distinct:  # every token id once: dwte (untied) rows are then the rows of dh
        x = rng.permutation(cfg.vocab)[: B * cfg.seq_len].reshape(B, cfg.seq_len).astype(np.int32)
    else:
        x = rng.integers(0, cfg.vocab, (B, cfg.seq_len)).astype(np.int32)
    y = rng.integers(0, cfg.vocab, (B, cfg.seq_len)).astype(np.int32)
    return x, y


# ---- a float64 oracle written from chapter 20 (plain torch autograd) -------------------------


def _oracle(cfg, params, x, y, wrong=None):
    """Mean loss and gradients in float64.  ``wrong``: "after_norm" adds wpe
    to the first LayerNorm's output instead of the embedding; "first_seq"
    returns the gradient of wpe from sequence 0 alone (not summed)."""
    P = {k: torch.tensor(v.astype(np.float64), requires_grad=True) for k, v in params.items()}
    B, T = x.shape
    C, NH = cfg.width, cfg.heads
    HS = C // NH
    X = torch.from_numpy(x.astype(np.int64))

    def ln(h, pre):
        b = P.get(f"{pre}.b")
        return torch.nn.functional.layer_norm(h, (C,), P[f"{pre}.w"], b, float(cfg.norm_eps))

    def lin(h, pre):
        return torch.nn.functional.linear(h, P[f"{pre}.w"], P.get(f"{pre}.b"))

    pe = P["wpe"].unsqueeze(0).expand(B, T, C)
    if wrong == "first_seq":  # the table's gradient taken from sequence 0 only
        pe = torch.cat([P["wpe"].unsqueeze(0), P["wpe"].detach().unsqueeze(0).expand(B - 1, T, C)])
    h = P["wte"][X]
    if wrong != "after_norm":
        h = h + pe
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(cfg.layers):
        p = f"h.{i:02d}"
        n1 = ln(h, f"{p}.ln1")
        if wrong == "after_norm" and i == 0:
            n1 = n1 + pe
        q, k, v = lin(n1, f"{p}.attn.qkv").split(C, dim=2)
        q, k, v = (t.view(B, T, NH, HS).transpose(1, 2) for t in (q, k, v))
        s = (q @ k.transpose(-1, -2)) / np.sqrt(HS)
        o = torch.softmax(s.masked_fill(~mask, float("-inf")), -1) @ v
        h = h + lin(o.transpose(1, 2).reshape(B, T, C), f"{p}.attn.proj")
        u = lin(ln(h, f"{p}.ln2"), f"{p}.mlp.fc")
        h = h + lin(torch.nn.functional.gelu(u, approximate="tanh"), f"{p}.mlp.proj")
    logits = torch.nn.functional.linear(ln(h, "lnf"), P["wte"])
    Y = torch.from_numpy(y.astype(np.int64)).reshape(-1)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab), Y)
    loss.backward()
    return float(loss.detach()), {k: t.grad.numpy() for k, t in P.items()}


def _close(ref, grads, loss, oracle):
    o_loss, o_grads = oracle
    if abs(float(loss) - o_loss) > 1e-5 * max(1.0, abs(o_loss)):
        return False
    for k, g in grads.items():
        want = o_grads[k]
        if not np.allclose(g.astype(np.float64), want, rtol=2e-3, atol=2e-6 * max(1.0, np.abs(want).max())):
            return False
    return True


@pytest.fixture(scope="module", params=[NANO, NANO_NOBIAS], ids=["bias", "nobias"])
def case(request):
    cfg = request.param
    params = init_params(cfg, 3)
    x, y = _batch(cfg, 3)
    res = Model(cfg).loss_and_grads(params, x, y)
    return cfg, params, x, y, res


def test_learned_positions_match_float64_autograd(case):
    """[model.pos.c1] [model.forward.c1] [model.backward.c1]"""
    cfg, params, x, y, res = case
    assert sorted(res.grads) == sorted(params) and "wpe" in res.grads
    assert _close(None, res.grads, res.loss, _oracle(cfg, params, x, y))


@pytest.mark.parametrize("wrong", ["after_norm", "first_seq"])
def test_wrong_readings_of_the_position_clause_fail(case, wrong):
    """The oracle itself can fail: wpe added after the first LayerNorm, or
    its gradient not summed over the batch, is not the reference."""
    cfg, params, x, y, res = case
    assert not _close(None, res.grads, res.loss, _oracle(cfg, params, x, y, wrong))


def test_dwpe_is_the_ordered_sum_over_the_batch_bit_for_bit():
    """[model.pos.c1] [emb.bwd.c1] d wpe[t] = (((-0 + dh[0, t]) + dh[1, t]) + dh[2, t]): with an
    untied head and distinct tokens, d wte's rows are dh's rows, so the sum
    is checked with the spec's add; the reverse order differs somewhere."""
    cfg = dataclasses.replace(NANO, tied=False)
    B = 3
    params = init_params(cfg, 5)
    x, y = _batch(cfg, B, seed=2, distinct=True)
    g = Model(cfg).loss_and_grads(params, x, y).grads
    dh = g["wte"][x]  # [B, T, C]: one term per row, -0 + v = v exactly
    fwd = np.full((cfg.seq_len, cfg.width), -0.0, np.float32)
    rev = fwd.copy()
    for t in range(cfg.seq_len):
        for c in range(cfg.width):
            for b in range(B):
                fwd[t, c] = add(fwd[t, c], dh[b, t, c])
                rev[t, c] = add(rev[t, c], dh[B - 1 - b, t, c])
    assert g["wpe"].tobytes() == fwd.tobytes()
    assert g["wpe"].tobytes() != rev.tobytes()


def test_wpe_init_is_its_own_stream_and_decayed():
    """[model.init.c1] [model.pos.c1] [step.hparams.c1] wpe [T, C] drawn from
    (s, 1, tag("wpe")); two axes, so AdamW decays it."""
    from refreplay.training.model import init_weight
    from refreplay.training.step import no_decay_names

    p = init_params(NANO, 0)
    assert p["wpe"].shape == (NANO.seq_len, NANO.width)
    assert p["wpe"].reshape(-1)[:3].tobytes() == init_weight(0, "wpe", 3, NANO.init_std).tobytes()
    assert p["wpe"].tobytes() != p["wte"][: NANO.seq_len].tobytes()
    assert "wpe" not in no_decay_names(p)
    rope = init_params(dataclasses.replace(NANO, pos="rope"), 0)
    assert "wpe" not in rope and rope["wte"].tobytes() == p["wte"].tobytes()


def test_bf16_profile_with_learned_positions_runs():
    """[bf16.tensors.c1] wpe's working copy is bf16, d wpe binary32."""
    cfg = dataclasses.replace(NANO_NOBIAS, precision="bf16")
    m = Model(cfg)
    params = init_params(cfg, 1)
    x, y = _batch(cfg, 2)
    res = m.loss_and_grads(m.working_params(params), x, y)
    assert np.isfinite(res.loss) and res.grads["wpe"].dtype == np.float32
    assert res.grads["wpe"].tobytes() != Model(NANO_NOBIAS).loss_and_grads(params, x, y).grads["wpe"].tobytes()


# ---- LayerNorm without a bias -------------------------------------------------------------


def _f32(*bits):
    return np.array(bits, np.uint32).view(np.float32)


ROW = np.ones((1, 3), np.float32)  # constant row: norm = +0, so mul(norm, w) = -0 where w < 0
W = _f32(0xBF800000, 0x3F800000, 0xBF000000)


def test_nobias_is_the_bias_minus_zero_and_equals_omitting_the_add():
    """[norm.layer.nobias.c1] add(y, -0) = y for every mul output; +0 is not."""
    neg = norms.layernorm_forward(ROW, W, np.full(3, -0.0, np.float32), np.float32(1e-5))
    pos = norms.layernorm_forward(ROW, W, np.zeros(3, np.float32), np.float32(1e-5))
    assert neg[0].view(np.uint32).tolist() == [[0x80000000, 0, 0x80000000]]
    assert pos[0].view(np.uint32).tolist() == [[0, 0, 0]]
    rng = np.random.default_rng(4)
    x = rng.standard_normal((5, 16)).astype(np.float32)
    x[0] = 1.5  # a constant row: -0 outputs
    w = rng.standard_normal(16).astype(np.float32)
    w[3] = -0.0
    out, mean, rstd = norms.layernorm_forward(x, w, np.full(16, -0.0, np.float32), np.float32(1e-5))
    omitted = np.empty_like(out)  # steps 3, 7 and the mul of 8, without the add
    for n in range(5):
        for c in range(16):
            d = np.float32(sub(x[n, c], mean[n]))  # (a boxed result is a Python float: back to binary32)
            omitted[n, c] = mul(np.float32(mul(d, rstd[n])), w[c])
    assert out.tobytes() == omitted.tobytes()
    assert (out.view(np.uint32) == NEG0).any()


def test_model_without_norm_bias_uses_minus_zero():
    """[norm.layer.nobias.c1] The reference model's LayerNorms take -0: the
    model without bias parameters equals the model whose bias parameters
    are all -0, bit for bit, and not the one with +0 biases (a -0 appears)."""
    cfg = dataclasses.replace(NANO_NOBIAS, vocab=64)
    withb = dataclasses.replace(cfg, norm_bias=True)
    assert not any(k.endswith((".ln1.b", ".ln2.b")) or k == "lnf.b" for k in param_shapes(cfg))
    params = init_params(cfg, 7)
    x, y = _batch(cfg, 2, seed=7)
    got = Model(cfg).forward(params, x, y)
    extra = {k: np.full(s, -0.0, np.float32) for k, s in param_shapes(withb).items() if k not in params}
    want = Model(withb).forward({**params, **extra}, x, y)
    assert got[1].tobytes() == want[1].tobytes() and got[0].tobytes() == want[0].tobytes()
    g = Model(cfg).backward(params, got[2])
    assert sorted(g) == sorted(params)


def test_torch_layernorm_without_bias_is_the_spec_s():
    """[norm.layer.nobias.c1] rt.nn.LayerNorm(bias=False) and F.layer_norm(bias=None):
    the bias -0 bit for bit, not +0, close to PyTorch's own; gradients of x and w."""
    import refreplay.torch as rt
    from refreplay.torch import functional as F

    ln = rt.nn.LayerNorm(3, bias=False)
    assert ln.bias is None
    with torch.no_grad():
        ln.weight.copy_(torch.from_numpy(W))
    xt = torch.from_numpy(ROW.copy()).requires_grad_()
    out = ln(xt)
    neg = F.layer_norm(xt, (3,), ln.weight, torch.full((3,), -0.0))
    zero = F.layer_norm(xt, (3,), ln.weight, torch.zeros(3))
    assert out.detach().numpy().view(np.uint32).tolist() == [[0x80000000, 0, 0x80000000]]
    assert torch.equal(out.view(torch.int32), neg.view(torch.int32))
    assert not torch.equal(out.view(torch.int32), zero.view(torch.int32))
    x = torch.randn(4, 6, 3, generator=torch.Generator().manual_seed(0)).requires_grad_()
    y = rt.nn.LayerNorm(3, bias=False)(x)
    torch.testing.assert_close(
        y,
        torch.nn.functional.layer_norm(x, (3,), ln.weight.new_ones(3), None, float(np.float32(1e-5))),
        rtol=1e-5,
        atol=1e-5,
    )
    y.sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape


# ---- the recipe ------------------------------------------------------------------------------


def test_recipe_leaves_the_defaults_out():
    """[model.config.c1] Every preset's recipe model has neither field, so its
    bytes (and hash) are those of a recipe from before the fields."""
    for name, (m, _) in PRESETS.items():
        obj = model_to_json(m)
        assert "pos" not in obj and "norm_bias" not in obj, name
        assert model_to_json(dataclasses.replace(m, pos="rope", norm_bias=True)) == obj
        assert model_from_json(obj) == m
    obj = model_to_json(NANO_NOBIAS)
    assert obj["pos"] == "learned" and obj["norm_bias"] is False
    assert model_from_json(json.loads(json.dumps(obj))) == NANO_NOBIAS


def test_golden_recipe_hash_is_unchanged():
    """vectors/steps.json's recipe hashes are recomputed from the configs."""
    from pathlib import Path

    from refreplay.conformance.golden import steps as golden

    for c in golden.load(Path(__file__).resolve().parents[1] / "vectors" / "steps.json"):
        assert "pos" not in model_to_json(c.model) and "norm_bias" not in model_to_json(c.model)


@pytest.mark.parametrize(
    "model,match",
    [
        ({"pos": "absolute"}, "pos must be one of"),
        ({"pos": 1}, "expected a string"),
        ({"norm_bias": "no"}, "expected true or false"),
        ({"norm_bias": 0}, "expected true or false"),
        ({"norm_bias": False}, "norm_bias false is a LayerNorm setting"),
    ],
    ids=["pos-value", "pos-type", "bias-str", "bias-int", "bias-rms"],
)
def test_bad_values_are_input_errors_and_exit_2(tmp_path, model, match):
    with pytest.raises(InputError, match=match):
        model_from_json(model, partial=True, base=TINY)
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"preset": "tiny", "model": model}))
    res = run_cli("train", "--config", cfg, "--steps", 1, "--out", tmp_path / "run")
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert match.split()[0] in res.stderr and "Traceback" not in res.stderr


def test_an_older_spec_recipe_with_the_new_fields_is_refused():
    """[conv.version.c1] pos and norm_bias are fields of 0.4.0."""
    from refreplay import spec
    from refreplay.training.run import new_recipe, recipe_from_json

    rec = new_recipe(
        NANO, PRESETS["tiny"][1], "0" * 64, 10, preset=None, ranks=1, launcher="inproc", steps=1, checkpoint_every=1
    )
    obj = json.loads(json.dumps(rec.to_json()))
    recipe_from_json(obj)  # as written: accepted
    obj["recipe"]["spec_version"] = [v for v in spec.replayed_versions() if v != spec.version()][0]
    obj["recipe_sha256"] = dataclasses.replace(rec, spec_version=obj["recipe"]["spec_version"]).sha256()
    with pytest.raises(InputError, match=r"recipe.model.pos is a field of spec 0\.4\.0 and later"):
        recipe_from_json(obj)
    norm_only = dataclasses.replace(rec, model=dataclasses.replace(rec.model, pos="rope", norm_bias=False))
    obj = json.loads(json.dumps(norm_only.to_json()))
    obj["recipe"]["spec_version"] = "0.3.0"
    obj["recipe_sha256"] = dataclasses.replace(norm_only, spec_version="0.3.0").sha256()
    with pytest.raises(InputError, match=r"recipe.model.norm_bias is a field of spec 0\.4\.0 and later"):
        recipe_from_json(obj)


_SIM = """
import dataclasses, numpy as np
from refreplay.training.presets import PRESETS
from refreplay.training.model import Model, init_params
m = PRESETS["tiny"][0]
for nb in (True, False):
    cfg = dataclasses.replace(m, vocab=64, width=16, heads=2, layers=1, seq_len=4, mlp_hidden=32, norm="layer",
                              pos="learned", bias=nb, norm_bias=nb)
    P = init_params(cfg, 0)
    rng = np.random.default_rng(0)
    x = rng.integers(0, 64, (2, 4)).astype(np.int32)
    y = rng.integers(0, 64, (2, 4)).astype(np.int32)
    a = Model(cfg).loss_and_grads(P, x, y)
    mc = Model(cfg, device="cuda")
    b = mc.loss_and_grads({k: mc.arrays.to_device(v) for k, v in P.items()}, x, y)
    host = getattr(mc.arrays, "to_host", np.asarray)
    assert np.float32(a.loss).tobytes() == np.float32(b.loss).tobytes()
    for k in a.grads:
        assert a.grads[k].tobytes() == np.ascontiguousarray(host(b.grads[k])).tobytes(), k
print("same")
"""


@pytest.mark.slow
def test_cuda_twin_in_the_simulator_gives_the_cpu_bits():
    """[model.pos.c1] [norm.layer.nobias.c1] on device="cuda" (numba-cuda's
    simulator): loss and every gradient equal the CPU reference's."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=str(root))
    res = subprocess.run([sys.executable, "-c", _SIM], env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0 and "same" in res.stdout, res.stdout + res.stderr[-3000:]
