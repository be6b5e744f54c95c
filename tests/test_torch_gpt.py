"""A GPT written in ordinary PyTorch style from refreplay.torch modules
(examples/torch_gpt) reproduces the golden training steps of
vectors/steps.json bit for bit: state roots, data hashes, losses and chain
links ([conf.steps.c1]).  Chain links are computed by refreplay's own
``state.chain_link`` and compared with whatever steps.json is in the tree.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

import refreplay.torch as rt
from refreplay.conformance.golden import steps as golden
from refreplay.training.data import inputs_targets
from refreplay.training.model import Model, init_params
from refreplay.torch import functional as rF

ROOT = Path(__file__).resolve().parents[1]
# the example is a binary32 model: the bf16 profile's case (tiny-bf16) is not written in it
CASES = [c for c in golden.load(ROOT / "vectors" / "steps.json") if c.model.precision == "fp32"]
KEYS = ("state_root", "data_hash", "loss", "chain_link")


def _example(name):
    spec = importlib.util.spec_from_file_location(f"torch_gpt_{name}", ROOT / "examples" / "torch_gpt" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


TRAIN = _example("train")
GPT = _example("gpt")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_torch_gpt_reproduces_the_golden_steps(case):
    """[conf.steps.c1] Every record of both cases: the `tiny` preset (RMSNorm,
    GELU, tied head) and the variant (LayerNorm, SwiGLU, untied head, biases,
    int8 QAT, M = 6, a second epoch)."""
    got = TRAIN.train(case.model, case.train, case.samples, len(case.records) - 1, case.recipe_sha256)
    assert len(got) == len(case.records)
    for want, have in zip(case.records, got):
        for key in KEYS:
            assert have.get(key) == want.get(key), f"{case.name} step {want['step']}: {key}"


def _reference_checkpoint(case, step):
    """The reference trainer's state after ``step`` steps, through its flat
    checkpoint form ([step.state.c1]), and the chain link of that step."""
    from refreplay.training.data import Batching, Stream
    from refreplay.training.launch.inproc import InProcess
    from refreplay.training.step import Trainer, state_from_tensors

    stream = Stream(case.samples, case.train.seed, Batching(case.train.micro_batches, case.train.micro_batch_size))
    trainer = Trainer(case.model, case.train, stream, case.recipe_sha256)
    st = trainer.initial_state()
    rec = trainer.initial_record(st)
    for _ in range(step):
        st, rec = trainer.step(st, rec.chain_link, InProcess(1))
    return state_from_tensors(case.model, {k: v.copy() for k, v in st.tensors().items()}), rec.chain_link


def test_an_auditor_replays_a_step_from_a_reference_checkpoint():
    """The torch model loads state 2 written by refreplay's own trainer (int8
    case: moments, step counters, re-pinned steps) and replays step 3 to the
    golden record; one flipped bit in the checkpoint is caught at step 3."""
    case = CASES[1]
    start, link = _reference_checkpoint(case, 2)
    assert link == case.records[2]["chain_link"]
    got = TRAIN.train(case.model, case.train, case.samples, 3, case.recipe_sha256, start=start, link=link)
    assert [r["step"] for r in got] == [3]
    assert all(got[0][k] == case.records[3][k] for k in KEYS)
    start.params["h.01.mlp.up.w"].view(np.uint32)[0, 0] ^= 1
    bad = TRAIN.train(case.model, case.train, case.samples, 3, case.recipe_sha256, start=start, link=link)
    assert bad[0]["state_root"] != case.records[3]["state_root"]


def test_one_pytorch_kernel_in_the_model_changes_the_bits(monkeypatch):
    """The golden check can fail: the same model with PyTorch's own tanh-GELU
    in the MLP (mathematically the same function) misses step 1."""
    case = CASES[0]
    monkeypatch.setattr(rF, "gelu", lambda x, approximate="tanh": TF.gelu(x, approximate="tanh"))
    got = TRAIN.train(case.model, case.train, case.samples, 1, case.recipe_sha256)
    assert got[0]["state_root"] == case.records[0]["state_root"]  # init does not use the MLP
    assert got[1]["state_root"] != case.records[1]["state_root"]


def test_micro_batches_folded_out_of_order_change_the_bits():
    """[fold.tree.c1] The fold's leaves are in global sample order: pushing
    the same three micro-batches in another order give other gradients."""
    case = CASES[0]
    model, named, opt, _ = TRAIN.build(case.model, case.train)
    batch = golden.load(ROOT / "vectors" / "steps.json")[0].samples[:8]

    def folded(order):
        opt.zero_grad()
        fold = rt.GradFold(named)
        for m in order:
            x, y = inputs_targets(batch[2 * m : 2 * m + 2])
            loss = model(torch.from_numpy(x), torch.from_numpy(y))
            loss.backward()
            fold.push(loss)
        fold.mean()
        return {k: p.grad.numpy().copy() for k, p in named.items()}

    a, b = folded([0, 1, 2]), folded([1, 2, 0])
    assert any(not np.array_equal(a[k].view(np.uint32), b[k].view(np.uint32)) for k in a)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_micro_batch_gradients_equal_the_reference_model_whatever_pytorchs_settings(case):
    """Bits come from the spec, not from PyTorch's settings: with
    deterministic algorithms off (the default) or on, and 1 or 2 intra-op
    threads, one micro-batch's loss and every gradient equal the reference
    model's ([model.forward.c1] [model.backward.c1])."""
    x, y = inputs_targets(case.samples[: case.train.micro_batch_size])
    ref = Model(case.model).loss_and_grads(init_params(case.model, case.train.seed), x, y)
    threads, det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    try:
        for deterministic, n_threads in ((False, 1), (False, 2), (True, 2)):
            torch.use_deterministic_algorithms(deterministic)
            torch.set_num_threads(n_threads)
            model, named, _, _ = TRAIN.build(case.model, case.train)
            loss = model(torch.from_numpy(x), torch.from_numpy(y))
            loss.backward()
            assert loss.detach().numpy().view(np.uint32) == np.float32(ref.loss).view(np.uint32)
            assert sorted(named) == sorted(ref.grads)
            for k, p in named.items():
                assert np.array_equal(p.grad.numpy().view(np.uint32), ref.grads[k].view(np.uint32)), k
    finally:
        torch.use_deterministic_algorithms(det)
        torch.set_num_threads(threads)


# ---- the guard: arithmetic convert cannot see ------------------------------------------


def test_a_whole_step_of_the_example_runs_under_the_guard():
    case = CASES[1]
    model, named, opt, schedule = TRAIN.build(case.model, case.train)
    x, y = inputs_targets(case.samples[:2])
    with rt.guard():
        opt.zero_grad()
        fold = rt.GradFold(named)
        loss = model(torch.from_numpy(x), torch.from_numpy(y))
        loss.backward()
        fold.push(loss)
        fold.mean()
        rt.optim.clip_grad_norm_(named, case.train.clip_norm)
        opt.step()
        schedule.step()
        rt.train_state(1, named, opt, (0, 1), GPT.quant_names(model)).root()


class _PlainResidual(torch.nn.Module):
    """Ordinary PyTorch: x + f(x) with converted modules inside."""

    def __init__(self):
        super().__init__()
        self.norm = rt.nn.RMSNorm(8)
        self.fc = rt.nn.Linear(8, 8, bias=False)

    def forward(self, x):
        return x + self.fc(self.norm(x))


def test_the_guard_names_pytorch_arithmetic_in_forward():
    m = _PlainResidual()
    x = torch.randn(2, 3, 8)
    m(x)  # runs without the guard: PyTorch's add decided those bits
    with pytest.raises(rt.Unsupported, match="aten.add"), rt.guard():
        m(x)


def test_the_guard_names_autograds_own_gradient_sum():
    """A tensor used twice without fork: the forward is all refreplay, but
    autograd sums the two gradients with PyTorch's add."""
    x = torch.randn(4, 8, requires_grad=True)
    with rt.guard():
        y = rF.add(rF.gelu(x), rF.silu(x))
        with pytest.raises(rt.Unsupported, match="aten.add"):
            y.backward(torch.ones(4, 8))


@pytest.mark.parametrize(
    "op, name",
    [
        (lambda d: d.to(torch.float32), "_to_copy"),
        (lambda d: torch.empty(3).copy_(d), "copy_"),
        (lambda d: torch.full((3,), 0.1), "full"),
        (lambda d: torch.empty(3).fill_(0.1), "fill_"),
    ],
    ids=["to", "copy_", "full", "fill_"],
)
def test_the_guard_refuses_copies_and_fills_that_round(op, name):
    d = torch.ones(3, dtype=torch.float64)
    with pytest.raises(rt.Unsupported, match=f"aten.{name} "), rt.guard():
        op(d)
    with rt.guard():  # the exact forms pass
        torch.empty(3).copy_(torch.ones(3))
        torch.full((3,), 0.5)
        d.to(torch.float64)


def test_ranks_holding_contiguous_micro_batches_give_the_one_device_bits():
    """[fold.ranks.c1] Each rank folds its micro-batches from its start and
    hands over its aligned blocks; the root's fold equals one GradFold over
    all M = 8 micro-batches, bit for bit, for 2, 3 and 5 ranks."""
    from refreplay.training.treefold import rank_ranges

    case = CASES[0]
    model, named, opt, _ = TRAIN.build(case.model, case.train)
    micro = []  # each micro-batch's (loss, gradients), computed once
    for m in range(8):
        x, y = inputs_targets(case.samples[2 * m : 2 * m + 2])
        loss = model(torch.from_numpy(x), torch.from_numpy(y))
        loss.backward()
        micro.append((loss.detach(), {k: p.grad for k, p in named.items()}))
        opt.zero_grad()

    def push(fold, ms):
        for m in ms:
            for k, p in named.items():
                p.grad = micro[m][1][k].clone()
            fold.push(micro[m][0])

    one = rt.GradFold(named)
    push(one, range(8))
    want_loss = one.mean()
    want = {k: p.grad.numpy().copy() for k, p in named.items()}
    for ranks in (2, 3, 5):
        opt.zero_grad()
        blocks = []
        for a, b in rank_ranges(8, ranks):
            fold = rt.GradFold(named, start=a)
            push(fold, range(a, b))
            blocks += fold.blocks()
        loss = rt.fold_ranks(named, blocks, 8)
        assert np.float32(loss).view(np.uint32) == np.float32(want_loss).view(np.uint32)
        for k, p in named.items():
            assert np.array_equal(p.grad.numpy().view(np.uint32), want[k].view(np.uint32)), (ranks, k)
    opt.zero_grad()
    with pytest.raises(rt.Unsupported, match="cover"):
        rt.fold_ranks(named, blocks[1:], 8)
    with pytest.raises(rt.Unsupported, match="whole step"):
        fold.mean()
