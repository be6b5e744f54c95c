"""refreplay.torch.guard: the first leak raised with its origin, or with
collect=True every leak of a step in one pass, each with the op, forward
or backward, the module path and the fix; a clean model has none."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as TF
from torch import nn

import refreplay.torch as rt
from refreplay.torch import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "nanogpt_port"))
from model import Config, build  # noqa: E402


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return x + self.fc(x)  # a residual + (and the stream x read twice, unforked)


class Leaky(nn.Module):
    """Three kinds of leak: a tied weight used twice without fork (its
    gradients summed in backward), a residual +, a stray functional op."""

    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(16, 8)
        self.block = Block()

    def forward(self, idx, y):
        x = F.embedding(idx, self.wte.weight)
        x = TF.relu(self.block(x))
        logits = F.linear(x, self.wte.weight)
        return F.cross_entropy(logits.view(-1, 16), y.view(-1))


def _leaky():
    torch.manual_seed(0)
    m = Leaky()
    with torch.no_grad():
        for p in m.parameters():
            rt.load_(p)
    report = rt.convert(m, strict=False)  # convert reports these leaks too; guard must find them at run time
    assert len(report.unsupported) == 2  # x + fc(x) and TF.relu; the weight used twice is no tie of modules
    return m, torch.randint(0, 16, (2, 4)), torch.randint(0, 16, (2, 4))


def test_collect_lists_every_leak_kind_with_its_origin():
    m, idx, y = _leaky()
    with rt.guard(collect=True, model=m) as leaks:
        m(idx, y).backward()
    got = {(leak.op, leak.phase, leak.module) for leak in leaks}
    assert ("aten.add", "forward", "block") in got  # the residual +
    assert ("aten.relu", "forward", "<root>") in got  # the stray functional op
    assert ("aten.add", "backward", "<root>") in got  # the tied weight, summed when the embedding's arrives
    assert ("aten.add", "backward", "block.fc") in got  # the unforked stream of the block
    tied = next(
        leak for leak in leaks if leak.phase == "backward" and leak.module == "<root>" and leak.op == "aten.add"
    )
    assert tied.node == "EmbeddingBackward" and "fork" in tied.fix
    residual = next(leak for leak in leaks if leak.phase == "forward" and leak.op == "aten.add")
    assert "functional.add" in residual.fix
    assert m.wte.weight.grad is not None  # collect mode let the step run to its end
    assert len(str(leaks).splitlines()) == len(leaks) + 1


def test_the_default_mode_raises_at_the_first_leak_naming_its_module():
    m, idx, y = _leaky()
    with pytest.raises(rt.Unsupported, match=r"aten\.add in forward of block: .*functional\.add"):
        with rt.guard(model=m):
            m(idx, y)


def test_position_ids_made_in_forward_say_to_use_a_buffer():
    emb = rt.nn.Embedding(8, 4)
    with rt.guard(collect=True) as leaks:
        emb(torch.arange(8))
    assert [leak.op for leak in leaks] == ["aten.arange"] and "register_buffer" in leaks[0].fix


def test_the_ported_nanogpt_model_has_no_leak_and_the_plain_one_many():
    cfg = Config(layers=1, width=32, heads=2, block=8, vocab=32)
    idx, y = torch.randint(0, 32, (2, 8)), torch.randint(0, 32, (2, 8))
    model = build(cfg)
    with rt.guard(collect=True, model=model) as leaks:
        model(idx, y).backward()
    assert list(leaks) == [], str(leaks)
    plain = build(cfg, plain=True)
    with rt.guard(collect=True, model=plain) as leaks:
        plain(idx, y).backward()
    ops = {leak.op for leak in leaks}
    assert {"aten.add", "aten.addmm", "aten.native_layer_norm"} <= ops, ops
    assert any(leak.phase == "backward" for leak in leaks)
