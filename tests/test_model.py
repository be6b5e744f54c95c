"""The reference model ([model.config.c1], [model.params.c1], [model.init.c1],
[model.residual.c1], [model.forward.c1], [model.backward.c1], [model.quant.c1])
against an independent float64 PyTorch transcription of the same decoder."""

import dataclasses
import math

import numpy as np
import pytest
import torch

from refreplay import rng
from refreplay.training import model, presets
from refreplay.errors import InputError
from refreplay.ops import quant
from torch_oracle import rel_err

F32 = np.float32


pytestmark = pytest.mark.usefixtures("one_numba_thread")


def _cfg(**kw):
    base = presets.ModelConfig(width=16, layers=2, heads=2, seq_len=8, mlp_hidden=24)
    return dataclasses.replace(base, **kw).validate()


def test_parameter_names_and_shapes():
    """[model.params.c1] [model.config.c1] names, shapes, sorted order."""
    cfg = _cfg(layers=1, norm="layer", mlp="swiglu", tied=False, bias=True)
    shapes = model.param_shapes(cfg)
    assert list(shapes) == sorted(shapes)
    assert shapes == {
        "h.00.attn.proj.b": (16,),
        "h.00.attn.proj.w": (16, 16),
        "h.00.attn.qkv.b": (48,),
        "h.00.attn.qkv.w": (48, 16),
        "h.00.ln1.b": (16,),
        "h.00.ln1.w": (16,),
        "h.00.ln2.b": (16,),
        "h.00.ln2.w": (16,),
        "h.00.mlp.gate.b": (24,),
        "h.00.mlp.gate.w": (24, 16),
        "h.00.mlp.proj.b": (16,),
        "h.00.mlp.proj.w": (16, 24),
        "h.00.mlp.up.b": (24,),
        "h.00.mlp.up.w": (24, 16),
        "head.w": (256, 16),
        "lnf.b": (16,),
        "lnf.w": (16,),
        "wte": (256, 16),
    }
    tiny = model.param_shapes(presets.preset("tiny")[0])
    assert "head.w" not in tiny and "h.01.mlp.fc.w" in tiny and "lnf.b" not in tiny
    assert 1_000_000 < model.param_count(presets.preset("small")[0]) < 10_000_000
    with pytest.raises(InputError, match="head size"):
        _cfg(width=18, heads=2)
    with pytest.raises(InputError, match="norm"):
        _cfg(norm="batch")


def test_initial_values():
    """[model.init.c1] biases +0, norm weights 1, the rest [rng.init.c1] with
    a = init_std * sqrt(3) rounded as binary32 products."""
    cfg = _cfg(norm="layer", bias=True, tied=False)
    params = model.init_params(cfg, 11)
    a = F32(F32(0.02) * F32(math.sqrt(3.0)))  # sqrt(3) correctly rounded, then one product
    assert model.init_scale(F32(0.02)) == a
    assert np.array([a]).view(np.uint32)[0] == 0x3D0DE3BD
    for name, p in params.items():
        if name.endswith(".b"):
            assert p.view(np.uint32).max() == 0
        elif name.endswith(".w") and p.ndim == 1:
            assert (p == 1).all()
        else:
            want = rng.init_uniform(11, name, p.shape, a)
            assert p.tobytes() == want.tobytes(), name
            assert np.abs(p).max() <= a and abs(float(p.std()) - 0.02) < 0.004
    assert model.init_weight(11, "wte", 5, F32(0.02)).tobytes() == params["wte"].reshape(-1)[:5].tobytes()
    assert model.init_params(cfg, 12)["wte"].tobytes() != params["wte"].tobytes()


def test_residual_add():
    """[model.residual.c1] num.add elementwise: flush and canonical NaN."""
    a = np.array([0x3F800000, 0x00C00000, 0x7F800000], np.uint32).view(F32)
    b = np.array([0x33800000, 0x80800000, 0xFF800000], np.uint32).view(F32)
    assert model.add(a, b).view(np.uint32).tolist() == [0x3F800000, 0x00000000, 0x7FC00000]


# ---- float64 PyTorch transcription of [model.forward.c1] ------------------------------


def _torch_loss(cfg, P, x, y):
    C, NH, HS, T = cfg.width, cfg.heads, cfg.head_size, cfg.seq_len
    B = x.shape[0]
    eps = float(cfg.norm_eps)

    def norm(h, prefix):
        if cfg.norm == "rms":
            return h / torch.sqrt((h * h).mean(-1, keepdim=True) + eps) * P[prefix + ".w"]
        mu = h.mean(-1, keepdim=True)
        var = ((h - mu) ** 2).mean(-1, keepdim=True)
        return (h - mu) / torch.sqrt(var + eps) * P[prefix + ".w"] + P[prefix + ".b"]

    def lin(h, prefix):
        out = h @ P[prefix + ".w"].T
        return out + P[prefix + ".b"] if cfg.bias else out

    h2 = HS // 2
    inv = torch.tensor([float(cfg.rope_theta) ** (-2 * i / HS) for i in range(h2)], dtype=torch.float64)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]
    cos, sin = torch.cos(ang), torch.sin(ang)

    def rope(q):  # half-split pairs (i, i + HS/2)
        a, b = q[..., :h2], q[..., h2:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)

    h = P["wte"][torch.tensor(x, dtype=torch.long)].reshape(B * T, C)
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    for i in range(cfg.layers):
        p = f"h.{i:02d}"
        qkv = lin(norm(h, p + ".ln1"), p + ".attn.qkv").reshape(B, T, 3, NH, HS)
        q, k, v = (qkv[:, :, j].permute(0, 2, 1, 3) for j in range(3))
        q, k = rope(q), rope(k)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(HS)
        att = torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1)
        o = (att @ v).permute(0, 2, 1, 3).reshape(B * T, C)
        h = h + lin(o, p + ".attn.proj")
        n2 = norm(h, p + ".ln2")
        if cfg.mlp == "gelu":
            u = lin(n2, p + ".mlp.fc")
            g = 0.5 * u * (1 + torch.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * u**3)))
        else:
            a = lin(n2, p + ".mlp.gate")
            g = a * torch.sigmoid(a) * lin(n2, p + ".mlp.up")
        h = h + lin(g, p + ".mlp.proj")
    logits = norm(h, "lnf") @ (P["wte"] if cfg.tied else P["head.w"]).T
    return torch.nn.functional.cross_entropy(logits, torch.tensor(y.reshape(-1), dtype=torch.long))


def _batch(cfg, b, seed):
    r = np.random.default_rng(seed)
    toks = r.integers(0, 256, size=(b, cfg.seq_len + 1)).astype(np.int32)
    return np.ascontiguousarray(toks[:, :-1]), np.ascontiguousarray(toks[:, 1:])


def _perturbed(cfg, seed):
    """Initial parameters with norm weights and biases moved off 1 and 0, so
    their gradients are exercised in general position."""
    params = model.init_params(cfg, seed)
    r = np.random.default_rng(seed)
    for k, p in params.items():
        if p.ndim == 1:
            params[k] = (p + r.normal(0, 0.1, p.shape)).astype(F32)
    return params


@pytest.mark.parametrize(
    "kw",
    [
        dict(),
        dict(norm="layer", mlp="swiglu", tied=False, bias=True),
        dict(mlp="swiglu", tied=True, bias=True, layers=1),
    ],
)
def test_loss_and_gradients_match_float64_autograd(kw):
    """[model.forward.c1] [model.backward.c1] [model.residual.c1] the binary32
    model agrees with a float64 PyTorch transcription: loss to 1e-5 relative,
    every gradient (incl. the tied embedding's two parts) to 1e-4 normwise."""
    cfg = _cfg(**kw)
    params = _perturbed(cfg, 3)
    x, y = _batch(cfg, 3, 4)
    res = model.Model(cfg).loss_and_grads(params, x, y)
    assert list(res.grads) == list(model.param_shapes(cfg))
    P = {k: torch.tensor(v.astype(np.float64), requires_grad=True) for k, v in params.items()}
    want = _torch_loss(cfg, P, x, y)
    want.backward()
    want_loss = want.detach().item()
    assert abs(float(res.loss) - want_loss) <= 1e-5 * abs(want_loss)
    for k, g in res.grads.items():
        assert g.dtype == np.float32 and g.shape == params[k].shape
        assert rel_err(g, P[k].grad.numpy()) < 1e-4, k


def test_int8_model_quantizes_and_repins():
    """[model.quant.c1] int8 linears inside the blocks: the loss stays near the
    fp32 loss, gradients near fp32's, and the stored steps are [quant.step.c1]."""
    cfg = _cfg()
    cfg8 = dataclasses.replace(cfg, linear="int8")
    params = _perturbed(cfg, 5)
    x, y = _batch(cfg, 2, 6)
    r32 = model.Model(cfg).loss_and_grads(params, x, y)
    r8 = model.Model(cfg8).loss_and_grads(params, x, y)
    assert r8.loss != r32.loss and abs(float(r8.loss) - float(r32.loss)) < 0.02
    assert rel_err(r8.grads["wte"], r32.grads["wte"]) < 0.1
    steps = model.quant_steps(cfg8, params)
    assert sorted(steps) == sorted(model.linear_names(cfg8))
    for name, s in steps.items():
        assert s.tobytes() == quant.step_size_rows(params[name]).tobytes()
    assert model.quant_steps(cfg, params) == {}


def test_forward_is_deterministic_and_batch_invariant():
    """[model.forward.c1] a sequence's logits do not depend on its batch-mates
    (same bits alone and in a batch of two), and a repeated call gives the
    same bits."""
    cfg = _cfg()
    m = model.Model(cfg)
    params = model.init_params(cfg, 1)
    x, y = _batch(cfg, 2, 9)
    a = m.loss_and_grads(params, x, y)
    b = m.loss_and_grads(params, x, y)
    assert np.float32(a.loss).tobytes() == np.float32(b.loss).tobytes()
    assert all(a.grads[k].tobytes() == b.grads[k].tobytes() for k in a.grads)
    _, logits2, _ = m.forward(params, x, y)
    _, logits1, _ = m.forward(params, x[:1].copy(), y[:1].copy())
    assert logits1.tobytes() == logits2[: cfg.seq_len].tobytes()
