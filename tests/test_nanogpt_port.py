"""examples/nanogpt_port: the ported nanoGPT-style model trains with the
same bits at 1 and 2 threads, its whole step (forward, backward, fold,
clip, AdamW) has no leak under guard, and a changed token changes the
result (the check can fail)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

import refreplay.torch as rt

HERE = Path(__file__).resolve().parents[1] / "examples" / "nanogpt_port"
sys.path.insert(0, str(HERE))
from model import Config  # noqa: E402

_spec = importlib.util.spec_from_file_location("nanogpt_port_train", HERE / "train.py")
train_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(train_mod)

CFG = Config(vocab=64, block=16, layers=1, heads=2, width=32)


def test_two_steps_give_the_same_bits_at_one_and_two_threads_and_a_seed_changes_them():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = train_mod.train(CFG, 2)
        torch.set_num_threads(2)
        two = train_mod.train(CFG, 2)
    finally:
        torch.set_num_threads(before)
    assert one == two
    assert train_mod.train(CFG, 2, seed=1) != one


def test_a_whole_step_runs_without_a_leak_under_guard():
    run = train_mod.Run(CFG)
    with rt.guard(collect=True, model=run.model) as leaks:
        run.step(1)
    assert list(leaks) == [], str(leaks)
