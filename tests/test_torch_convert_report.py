"""refreplay.torch.convert names every blocker of a model in one report,
each with its cause and fix: bare Parameters, a tied weight, and the
PyTorch arithmetic written in forward (read from the source); the port of
the same model (examples/nanogpt_port) converts and its tie works with
fork."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from torch import nn

import refreplay.torch as rt
from refreplay.torch import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "nanogpt_port"))
from model import Config, build  # noqa: E402


class LayerNorm(nn.Module):
    """nanoGPT's own LayerNorm: bare Parameters."""

    def __init__(self, ndim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim))

    def forward(self, input):
        return TF.layer_norm(input, self.weight.shape, self.weight, self.bias, 1e-5)


class Attention(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.c_attn, self.c_proj, self.n_head = nn.Linear(C, 3 * C), nn.Linear(C, C), NH

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = TF.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.ln_1, self.attn = LayerNorm(C), Attention(C, NH)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x


class NanoGPT(nn.Module):
    """nanoGPT as written, cut down: every kind of blocker at once."""

    def __init__(self, V=32, T=8, C=16, NH=2):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.h = nn.ModuleList([Block(C, NH)])
        self.lm_head = nn.Linear(C, V, bias=False)
        self.wte.weight = self.lm_head.weight  # tied
        self.scale = 1.0 / math.sqrt(C)

    def forward(self, idx):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(x) * self.scale


def test_an_unconvertible_model_names_every_blocker_at_once_and_changes_nothing():
    model = NanoGPT()
    before = {n: type(m) for n, m in model.named_modules()}
    with pytest.raises(rt.ConversionError) as info:
        rt.convert(model)
    msg = str(info.value)
    assert {n: type(m) for n, m in model.named_modules()} == before
    assert "h.0.ln_1: LayerNorm: bare nn.Parameter(s) ['weight', 'bias']" in msg
    assert "build it as nn.LayerNorm" in msg
    assert "wte.weight = lm_head.weight" in msg or "lm_head.weight = wte.weight" in msg
    assert "tied weight" in msg and "fork(weight)" in msg
    assert "torch.nn.functional.scaled_dot_product_attention(...)" in msg
    assert "refreplay.torch.functional.scaled_dot_product_attention" in msg
    assert "`x + self.attn(self.ln_1(x))`" in msg and "functional.add" in msg  # the residual
    assert "`self.wte(idx) + self.wpe(pos)`" in msg
    assert "torch.arange in forward" in msg and "register_buffer" in msg
    assert "`self.lm_head(x) * self.scale`" in msg
    assert "C // self.n_head" not in msg  # shape arithmetic is not a blocker
    report = rt.convert(NanoGPT(), strict=False)
    assert len(report.unsupported) == msg.count("\n")  # one line per blocker, all in one report


def test_a_module_of_your_own_written_with_the_functions_can_be_kept():
    class Scale(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(4))

        def forward(self, x):
            return F.linear(x, torch.diag(self.w))

    holder = nn.Sequential(Scale())
    with pytest.raises(rt.ConversionError, match="bare nn.Parameter"):
        rt.convert(holder)
    report = rt.convert(holder, keep=(Scale,))
    assert ("0", "Scale", "kept on request (convert(keep=...))") in report.kept


def test_the_ported_model_converts_its_tie_works_through_fork_and_matches_pytorch():
    cfg = Config(layers=1, width=32, heads=2, block=8, vocab=32)
    model, plain = build(cfg), build(cfg, plain=True)
    idx, y = torch.randint(0, 32, (2, 8)), torch.randint(0, 32, (2, 8))
    loss, loss_plain = model(idx, y), plain(idx, y)
    loss.backward()
    loss_plain.backward()
    assert abs(loss.item() - loss_plain.item()) < 1e-5
    g, gp = model.wte.weight.grad, plain.wte.weight.grad  # embedding + head gradients of the tied weight
    assert torch.allclose(g, gp, rtol=1e-4, atol=1e-6)
    # the fork's sum is the spec's add of the two uses' gradients, embedding first
    again = build(cfg)
    again(idx, y).backward()
    assert np.array_equal(g.numpy().view(np.uint32), again.wte.weight.grad.numpy().view(np.uint32))


@pytest.mark.parametrize(
    "make",
    [
        lambda: rt.nn.GELU("none"),
        lambda: F.gelu(torch.ones(2), approximate="none"),
        lambda: rt.convert(nn.Sequential(nn.GELU())),
    ],
)
def test_the_erf_gelu_is_refused_naming_the_tanh_form(make):
    with pytest.raises(rt.Unsupported, match=r"why\.gelu\.erf\.r1.*approximate=.tanh."):
        make()


def test_dropout_above_zero_is_refused_with_the_fix_and_zero_is_kept():
    with pytest.raises(rt.ConversionError, match=r"dropout with p = 0\.1 > 0.*nn\.Dropout\(0\.0\)"):
        rt.convert(nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.1)))
    report = rt.convert(nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.0)))
    assert ("1", "Dropout", "dropout with p = 0 (identity)") in report.kept
