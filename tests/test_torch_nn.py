"""refreplay.torch.nn, convert and optim: modules replaced in place with the
same parameters and the reference's bits; a module that cannot be
converted makes strict conversion raise with its name; AdamW, clipping and
the LR schedule equal ``refreplay.ops.optim`` bit for bit and refuse
hyper-parameters that are not binary32.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import refreplay.torch as rt
from refreplay.ops import activations as A
from refreplay.ops import embedding as E
from refreplay.ops import linear as L
from refreplay.ops import norms as N
from refreplay.ops import optim as O
from refreplay.torch import Unsupported
from refreplay.torch import nn as rnn
from refreplay.torch.optim import AdamW, LRSchedule, clip_grad_norm_

EPS32 = float(np.float32(1e-5))  # a Python float that is exactly a binary32


def bits(a):
    if isinstance(a, torch.Tensor):
        a = a.detach().numpy()
    return np.asarray(a, np.float32).view(np.uint32)


class Toy(nn.Module):
    def __init__(self, eps=EPS32):
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.body = nn.Sequential(
            nn.LayerNorm(8, eps=eps), nn.Linear(8, 12), nn.GELU(approximate="tanh"), nn.Linear(12, 8, bias=False)
        )
        self.out = nn.ModuleDict({"norm": nn.RMSNorm(8, eps=EPS32), "drop": nn.Dropout(0.0)})

    def forward(self, idx):
        return self.out["norm"](self.body(self.emb(idx)))


def _load(model):
    with torch.no_grad():
        for p in model.parameters():
            rt.load_(p)
    return model


def test_convert_replaces_in_place_keeps_parameters_and_gives_reference_bits():
    torch.manual_seed(0)
    model = _load(Toy())
    params_before = dict(model.named_parameters())
    report = rt.convert(model)
    assert sorted(n for n, _, _ in report.replaced) == ["body.0", "body.1", "body.2", "body.3", "emb", "out.norm"]
    assert not report.unsupported
    assert ("out.drop", "Dropout", "dropout with p = 0 (identity)") in report.kept
    assert isinstance(model.body[1], rnn.Linear) and isinstance(model.out["norm"], rnn.RMSNorm)
    after = dict(model.named_parameters())
    assert sorted(after) == sorted(params_before)
    assert all(after[k] is params_before[k] for k in after)  # an optimizer built before still holds them
    idx = torch.tensor([[1, 5, 5, 0]])
    y = model(idx)
    p = {k: v.detach().numpy() for k, v in after.items()}
    h = E.embedding_forward(p["emb.weight"], idx.numpy().astype(np.int32)).reshape(4, 8)
    h = N.layernorm_forward(h, p["body.0.weight"], p["body.0.bias"], np.float32(1e-5))[0]
    h = A.gelu_forward(L.linear_forward(h, p["body.1.weight"], p["body.1.bias"]))
    h = L.linear_forward(h, p["body.3.weight"])
    h = N.rmsnorm_forward(h, p["out.norm.weight"], np.float32(1e-5))[0]
    assert np.array_equal(bits(y).reshape(-1), bits(h).reshape(-1))


class WithAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(8, 8), nn.MultiheadAttention(8, 2))])


class WithOwnParameter(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Module()
        self.inner.scale = nn.Parameter(torch.ones(8))
        self.fc = nn.Linear(8, 8)


@pytest.mark.parametrize(
    "model, name",
    [
        (WithAttention(), "blocks.0.1"),
        (WithOwnParameter(), "inner"),
        (nn.Sequential(nn.Linear(4, 4), nn.ReLU()), "1"),
        (nn.Sequential(nn.Linear(4, 4), nn.GELU()), "1"),  # the erf form
        (nn.Sequential(nn.LayerNorm(4)), "0"),  # eps 1e-5 is not a binary32
        (nn.Sequential(nn.Embedding(4, 4, padding_idx=0)), "0"),
        (nn.Sequential(nn.Dropout(0.1)), "0"),
        (nn.Sequential(nn.Conv1d(2, 2, 3)), "0"),
    ],
    ids=["attention", "own-parameter", "relu", "erf-gelu", "eps", "padding", "dropout", "conv"],
)
def test_strict_convert_names_what_it_cannot_replace_and_changes_nothing(model, name):
    before = [(n, type(m)) for n, m in model.named_modules()]
    with pytest.raises(rt.ConversionError, match=rf"(^|\W){name}( \(|: )"):
        rt.convert(model)
    assert [(n, type(m)) for n, m in model.named_modules()] == before


def test_non_strict_convert_reports_and_replaces_the_rest():
    model = WithAttention()
    report = rt.convert(model, strict=False)
    assert [n for n, _, _ in report.unsupported] == ["blocks.0.1"]
    assert {n for n, _, _ in report.replaced} == {"proj", "blocks.0.0"}
    assert isinstance(model.proj, rnn.Linear) and isinstance(model.blocks[0][1], nn.MultiheadAttention)
    assert "guard" in report.notes and "UNSUPPORTED blocks.0.1" in str(report)


def test_round_eps_takes_the_nearest_binary32_when_asked():
    model = nn.Sequential(nn.LayerNorm(4))
    rt.convert(model, round_eps=True)
    assert isinstance(model[0], rnn.LayerNorm) and model[0].eps == EPS32


def test_a_root_with_parameters_of_its_own_is_unsupported():
    class Root(nn.Module):
        def __init__(self):
            super().__init__()
            self.pos = nn.Parameter(torch.zeros(4))
            self.fc = nn.Linear(4, 4)

    with pytest.raises(rt.ConversionError, match="<root>"):
        rt.convert(Root())


# ---- modules refuse what the spec does not cover -------------------------------------------


@pytest.mark.parametrize(
    "build",
    [
        lambda: rnn.LayerNorm(8, eps=1e-5),
        lambda: rnn.RMSNorm((2, 4)),
        lambda: rnn.GELU("none"),
        lambda: rnn.Embedding(4, 4, padding_idx=1),
        lambda: rnn.Linear(4, 4, quant="int4"),
        lambda: rnn.Softmax(dim=0),
        lambda: rnn.CrossEntropyLoss(reduction="sum"),
        lambda: rnn.MLP(8, 16, kind="relu"),
        lambda: rnn.CausalSelfAttention(8, 3, 4),
    ],
    ids=["eps", "two-axes", "erf", "padding", "int4", "dim0", "sum", "relu", "heads"],
)
def test_modules_refuse_uncovered_configurations(build):
    with pytest.raises(Unsupported):
        build()


# ---- optimizer ----------------------------------------------------------------------------


def _param(rng, shape):
    return nn.Parameter(torch.from_numpy(rng.standard_normal(shape).astype(np.float32)))


def test_adamw_equals_the_reference_over_steps_with_and_without_decay():
    """[optim.adamw.c1] [optim.adamw.bias.c1] three updates, bit for bit."""
    rng = np.random.default_rng(3)
    w, b = _param(rng, (5, 4)), _param(rng, (5,))
    hp = O.AdamW()
    lr = np.float32(3e-3)
    opt = AdamW([{"params": [w]}, {"params": [b], "weight_decay": 0.0}], lr=lr)
    ref = {"w": w.detach().numpy().copy(), "b": b.detach().numpy().copy()}
    m, v = O.adamw_init(ref)
    for t in (1, 2, 3):
        grads = {"w": rng.standard_normal((5, 4)).astype(np.float32), "b": rng.standard_normal(5).astype(np.float32)}
        w.grad, b.grad = torch.from_numpy(grads["w"].copy()), torch.from_numpy(grads["b"].copy())
        opt.step()
        O.adamw_step(ref, grads, m, v, step=t, lr=lr, hp=hp, no_decay=frozenset({"b"}))
        assert np.array_equal(bits(w), bits(ref["w"])) and np.array_equal(bits(b), bits(ref["b"]))
        assert np.array_equal(bits(opt.state[w]["exp_avg"]), bits(m["w"]))
        assert np.array_equal(bits(opt.state[b]["exp_avg_sq"]), bits(v["b"]))
        assert opt.state[w]["step"] == t


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(lr=1e-3),
        dict(lr=np.float32(1e-3), betas=(0.9, 0.999)),
        dict(lr=np.float32(1e-3), eps=1e-8),
        dict(lr=np.float32(1e-3), weight_decay=0.01),
        dict(lr=np.float32(1e-3), amsgrad=True),
        dict(lr=np.float32(1e-3), foreach=True),
        dict(lr=np.float32(1e-3), maximize=True),
    ],
    ids=["lr", "betas", "eps", "wd", "amsgrad", "foreach", "maximize"],
)
def test_adamw_refuses_hyper_parameters_that_are_not_binary32_or_not_covered(kwargs):
    with pytest.raises(Unsupported):
        AdamW([nn.Parameter(torch.zeros(3))], **kwargs)


def test_adamw_refuses_a_float64_parameter_and_a_closure():
    with pytest.raises(Unsupported):
        AdamW([nn.Parameter(torch.zeros(3, dtype=torch.float64))], lr=np.float32(1e-3))
    p = nn.Parameter(torch.zeros(3))
    p.grad = torch.zeros(3)
    with pytest.raises(Unsupported):
        AdamW([p], lr=np.float32(1e-3)).step(lambda: 0.0)


def test_clip_sums_tensors_in_sorted_name_order():
    """[optim.clip.c1] Names, not positions, decide the order: the same
    gradients given in any order clip to the reference's bits."""
    rng = np.random.default_rng(4)
    grads = {k: (rng.standard_normal(n) * 3).astype(np.float32) for k, n in (("b", 7), ("a", 5), ("c", 3))}
    ref = {k: g.copy() for k, g in grads.items()}
    want_norm, want_coef = O.clip_grad_norm(ref, np.float32(1.0))
    for order in (["b", "a", "c"], ["c", "b", "a"]):
        named = {}
        for k in order:
            named[k] = nn.Parameter(torch.zeros(grads[k].shape))
            named[k].grad = torch.from_numpy(grads[k].copy())
        norm, coef = clip_grad_norm_(named, np.float32(1.0))
        assert bits(norm) == bits(want_norm) and bits(coef) == bits(want_coef)
        for k in grads:
            assert np.array_equal(bits(named[k].grad), bits(ref[k]))


def test_clip_refuses_unnamed_parameters_and_other_norms():
    p = nn.Parameter(torch.zeros(3))
    p.grad = torch.ones(3)
    with pytest.raises(Unsupported, match="named"):
        clip_grad_norm_([p], np.float32(1.0))
    with pytest.raises(Unsupported):
        clip_grad_norm_({"p": p}, np.float32(1.0), norm_type=1.0)
    with pytest.raises(Unsupported):
        clip_grad_norm_({"p": p}, 0.1)  # not a binary32


def test_lr_schedule_sets_the_reference_rate_of_each_update():
    """[optim.lr.c1] update n runs with lr_at(n), as exact binary32 values."""
    opt = AdamW([nn.Parameter(torch.zeros(2))], lr=np.float32(1.0))
    sched = LRSchedule(opt, 2, 6, np.float32(3e-3), np.float32(3e-4), "cosine")
    for n in range(1, 9):
        want = O.lr_at(n, 2, 6, np.float32(3e-3), np.float32(3e-4), "cosine")
        assert sched.get_last_lr() == [float(want)]
        sched.step()
    with pytest.raises(Unsupported):
        LRSchedule(opt, 2, 6, 3e-3, np.float32(3e-4))


def test_grad_fold_refuses_stale_gradients_and_missing_ones():
    p, q = nn.Parameter(torch.ones(2)), nn.Parameter(torch.ones(2))
    p.grad = torch.ones(2)
    with pytest.raises(Unsupported, match="zero_grad"):
        rt.GradFold({"p": p, "q": q})
    p.grad = None
    fold = rt.GradFold({"p": p, "q": q})
    p.grad = torch.ones(2)  # q has none: its leaf would be missing
    with pytest.raises(Unsupported, match="no gradient"):
        fold.push(torch.tensor(1.0))


def test_load_state_refuses_other_names_and_shapes():
    from refreplay.training.step import TrainState

    z = np.zeros((2, 2), np.float32)
    st = TrainState(3, {"w": z}, {"w": z}, {"w": z}, {}, (0, 3))
    p = nn.Parameter(torch.ones(2, 2))
    opt = AdamW([p], lr=np.float32(1e-3))
    with pytest.raises(Unsupported, match="names differ"):
        rt.load_state(st, {"v": p}, opt)
    with pytest.raises(Unsupported, match="float32"):
        rt.load_state(st, {"w": nn.Parameter(torch.ones(2, 3))}, opt)
    rt.load_state(st, {"w": p}, opt)
    assert bits(p).tolist() == [[0, 0], [0, 0]] and opt.state[p]["step"] == 3


def test_chain_link_is_refreplays_own_with_the_loss_bits(monkeypatch):
    """[state.chain.c2] rt.chain_link forwards to refreplay.state.chain_link
    with the loss's bits as 0x and 8 upper-case hex digits; another loss gives
    another link."""
    from refreplay import state as statehash

    h = "ab" * 32
    loss = np.float32(5.5)
    assert rt.chain_link(h, h, h, h, loss) == statehash.chain_link(h, h, h, h, "0x40B00000")
    assert rt.chain_link(h, h, h, h, np.float32(5.5000005)) != rt.chain_link(h, h, h, h, loss)
    seen = []
    monkeypatch.setattr(statehash, "chain_link", lambda prev, root, data, recipe, loss: seen.append(loss) or "x")
    assert rt.chain_link(h, h, h, h, loss) == "x" and seen == ["0x40B00000"]


def test_a_pytorch_scheduler_rate_that_is_not_binary32_is_refused_at_the_step():
    p = nn.Parameter(torch.ones(3))
    opt = AdamW([p], lr=0.5)  # a Python float that is exactly a binary32
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=7)
    p.grad = torch.ones(3)
    opt.step()
    sched.step()  # lr = 0.5 * (1 + cos(pi / 7)) / 2 in float64
    p.grad = torch.ones(3)
    before = bits(p).copy()
    with pytest.raises(Unsupported, match="lr="):
        opt.step()
    assert np.array_equal(bits(p), before)
