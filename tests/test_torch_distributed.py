"""TreeFold over torch.distributed ([fold.ranks.c1]): real separate
processes (gloo, 127.0.0.1, bounded by timeouts) running
examples/torch_gpt/train_dist.py on the `tiny` preset (M = 8).

* R = 1..4 give the same state roots and chain head (R = 3 does not divide M);
* the same loop with dist.all_reduce does not;
* a rank that dies or hangs mid-step stops the others with an error, and
  nothing is published for that step.
"""

from __future__ import annotations

import json

import pytest

from torch_dist_helpers import warm, corpus, ranks, torchrun

STEPS = 2


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    path = corpus(tmp_path_factory.mktemp("corpus") / "corpus.txt")
    warm(tmp_path_factory.mktemp("warm"), path)
    return path


def _run(tmp, world, text, *extra, launch="torchrun"):
    out = tmp / f"run-{world}-{'-'.join(map(str, extra)) or 'fold'}"
    args = ("--out", out, "--steps", STEPS, "--checkpoint-every", 1, "--data", text, *extra)
    res = torchrun(world, *args) if launch == "torchrun" else ranks(world, *args)
    if launch == "torchrun":
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-4000:]
    else:
        assert all(rc == 0 for rc, _, _ in res), res
    return out


def _records(run):
    return [json.loads(line) for line in (run / "steps.jsonl").read_text().splitlines()]


def _head(run):
    return json.loads((run / "head.json").read_text())["chain_link"]


@pytest.fixture(scope="module")
def fold_runs(tmp_path_factory, text):
    tmp = tmp_path_factory.mktemp("dist")
    return {r: _run(tmp, r, text) for r in (1, 3)}


def test_world_sizes_1_and_3_publish_the_same_records(fold_runs):
    """[fold.ranks.c1] R = 3 does not divide M = 8: rank ranges [0,2) [2,5) [5,8)."""
    one, three = fold_runs[1], fold_runs[3]
    assert _records(one) == _records(three)
    assert (one / "head.json").read_bytes() == (three / "head.json").read_bytes()
    for k in range(STEPS + 1):
        name = f"checkpoints/step-{k:07d}.safetensors"
        assert (one / name).read_bytes() == (three / name).read_bytes(), name


@pytest.mark.slow
def test_world_sizes_2_and_4_publish_the_same_records(fold_runs, tmp_path, text):
    for r in (2, 4):
        assert _records(_run(tmp_path, r, text)) == _records(fold_runs[1]), f"R = {r}"


def test_all_reduce_is_not_invariant(fold_runs, tmp_path, text):
    """The ordinary loop (PyTorch's += over local micro-batches, then
    dist.all_reduce) changes the bits with the world size: its R = 1 and
    R = 3 heads are not one value, and neither is TreeFold's head."""
    heads = {r: _head(_run(tmp_path, r, text, "--all-reduce-steps", "1,2", launch="ranks")) for r in (1, 3)}
    fold = _head(fold_runs[1])
    assert fold not in heads.values()
    assert heads[1] != heads[3], heads


@pytest.mark.parametrize("how", ["exit", "hang"])
def test_a_rank_that_dies_mid_step_stops_the_others_and_nothing_is_published(tmp_path, text, how):
    out = tmp_path / "run"
    res = ranks(
        2,
        "--out",
        out,
        "--steps",
        3,
        "--checkpoint-every",
        1,
        "--data",
        text,
        "--timeout",
        8,
        "--die-rank",
        1,
        "--die-step",
        2,
        "--die-how",
        how,
        timeout=90,
    )
    (rc0, _, err0), (rc1, _, _) = res
    assert rc0 not in (0, None) and rc1 != 0, res
    assert "step 2" in err0 and "a rank died or hung" in err0, err0
    assert [r["step"] for r in _records(out)] == [0, 1]
    assert not (out / "head.json").exists()
    assert not (out / "checkpoints" / "step-0000002.safetensors").exists()


@pytest.mark.parametrize("world", [3])
def test_ddp_comm_hook_gives_the_treefold_of_one_micro_batch_per_rank(world, text):
    """fold_hook under DistributedDataParallel (small buckets): every rank's
    gradient equals GradFold's on one process over M = R micro-batches, and
    M != R is refused."""
    from torch_dist_helpers import ROOT

    res = ranks(world, script=ROOT / "tests" / "_ddp_hook_worker.py", timeout=120)
    assert all(rc == 0 for rc, _, _ in res), res


# ---- in this process: a gloo group of one rank ------------------------------------------


@pytest.fixture(scope="module")
def group1():
    import datetime

    import torch.distributed as dist

    from torch_dist_helpers import free_port

    store = dist.TCPStore("127.0.0.1", free_port(), 1, True, timeout=datetime.timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=30))
    yield
    dist.destroy_process_group()


def _tiny_model():
    import sys

    from torch_dist_helpers import ROOT

    sys.path.insert(0, str(ROOT / "examples" / "torch_gpt"))
    from train import build

    from refreplay.training.presets import PRESETS

    cfg, tcfg = PRESETS["tiny"]
    return build(cfg, tcfg)[:2], cfg


def _leaves(model, cfg, count):
    import torch

    g = torch.Generator().manual_seed(3)
    for _ in range(count):
        x = torch.randint(0, cfg.vocab, (2, cfg.seq_len), generator=g)
        y = torch.randint(0, cfg.vocab, (2, cfg.seq_len), generator=g)
        loss = model(x, y)
        loss.backward()
        yield loss


def test_all_fold_on_one_rank_is_gradfold_mean(group1):
    import torch

    import refreplay.torch as rt
    from refreplay.torch.distributed import all_fold

    (model, named), cfg = _tiny_model()
    fold = rt.GradFold(named)
    for loss in _leaves(model, cfg, 3):
        fold.push(loss)
    loss = all_fold(fold, 3)
    got = {k: p.grad.clone() for k, p in named.items()}
    for p in named.values():
        p.grad = None
    fold = rt.GradFold(named)
    for loss2 in _leaves(model, cfg, 3):
        fold.push(loss2)
    assert fold.mean().tobytes() == loss.tobytes()
    assert all(torch.equal(got[k].view(torch.int32), p.grad.view(torch.int32)) for k, p in named.items())


def test_all_fold_refuses_a_fold_of_another_range(group1):
    import refreplay.torch as rt
    from refreplay.torch.distributed import all_fold

    (model, named), cfg = _tiny_model()
    fold = rt.GradFold(named, start=1)
    for loss in _leaves(model, cfg, 2):
        fold.push(loss)
    with pytest.raises(rt.Unsupported, match=r"holds micro-batches \[0, 3\).*pushed \[1, 3\)"):
        all_fold(fold, 3)


def test_exchanged_blocks_with_a_gap_or_overlap_are_refused(group1):
    import numpy as np

    from refreplay.torch.distributed import CollectiveError, _fold_exchanged, exchange_blocks
    from refreplay.training.step import LOSS
    from refreplay.training.treefold import Block

    (model, named), _ = _tiny_model()
    value = {k: np.zeros(tuple(p.shape), np.float32) for k, p in named.items()}
    value[LOSS] = np.zeros(1, np.float32)
    names = sorted(value)
    shapes = {k: v.shape for k, v in value.items()}
    sent = exchange_blocks([Block(0, 2, value), Block(2, 1, value)], names, shapes, 3)
    assert [(b.start, b.size) for b in sent] == [(0, 2), (2, 1)]
    assert all(np.array_equal(b.value[k], value[k]) for b in sent for k in names)
    short, overlap, gap = (
        [Block(0, 2, value)],
        [Block(0, 2, value), Block(1, 1, value)],
        [Block(0, 2, value), Block(3, 1, value)],
    )
    for bad in (short, overlap, gap):
        with pytest.raises(CollectiveError, match="step 7"):
            _fold_exchanged(named, bad, 3, 7)
