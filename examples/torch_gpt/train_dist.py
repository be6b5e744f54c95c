"""Data-parallel training of ``gpt.GPT`` under torchrun, published as a
refreplay run directory that ``refreplay replay`` / ``audit`` check with
the reference trainer (docs/torch.md, "Distributed training").

    torchrun --nproc-per-node R examples/torch_gpt/train_dist.py --out RUN --steps 4 --data FILE

Every R gives the same chain head: rank q holds the micro-batches of
[fold.ranks.c1] and ``all_fold`` moves their TreeFold blocks as bytes.

``--nanogpt bias`` / ``--nanogpt nobias`` trains nanoGPT's architecture
at the preset's shape instead (learned positions, LayerNorm with or
without biases, tanh GELU, tied head: ``gpt.nanogpt_config``); the recipe
carries pos "learned" (and norm_bias false), which the reference trainer
replays ([model.pos.c1], [norm.layer.nobias.c1]).

Switches that exist to show what is NOT conformant (the tests use them):
``--all-reduce-steps 2,3`` sums those steps' gradients with
``dist.all_reduce`` like an ordinary DDP loop; ``--die-rank q --die-step n``
(``--die-how hang``: sleep) makes rank q exit in the middle of step n (the others must stop with an
error and publish nothing for step n).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from refreplay.errors import InputError
from refreplay.training.data import inputs_targets
from refreplay.training.presets import PRESETS
from refreplay.torch import GradFold, Unsupported
from refreplay.torch.distributed import CollectiveError, all_fold, my_range
from refreplay.torch.optim import clip_grad_norm_
from refreplay.torch.publish import Publisher, model_config

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpt import nanogpt_config, quant_names  # noqa: E402
from train import build  # noqa: E402


def all_reduce_step(model, named, batch, M, B, a, b):
    """The ordinary loop (NOT conformant): PyTorch adds the local
    micro-batch gradients into .grad, ``dist.all_reduce`` sums the ranks'
    sums in the backend's order, then x (1/M)."""
    total = torch.zeros(1)
    for m in range(a, b):
        x, y = inputs_targets(batch[m * B : (m + 1) * B])
        loss = model(torch.from_numpy(x), torch.from_numpy(y))
        loss.backward()
        total += loss.detach()
    for _, p in sorted(named.items()):
        dist.all_reduce(p.grad)
        p.grad.mul_(1.0 / M)
    dist.all_reduce(total)
    return np.float32(total.item() / M)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--data", nargs="+", default=None, help="corpus files (default: refreplay's corpus)")
    ap.add_argument(
        "--nanogpt",
        choices=("bias", "nobias"),
        default=None,
        help="nanoGPT's architecture at the preset's shape, with or without biases",
    )
    ap.add_argument("--checkpoint-every", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds before a missing rank is an error")
    ap.add_argument("--all-reduce-steps", default="", help="comma-separated steps summed by dist.all_reduce")
    ap.add_argument("--die-rank", type=int, default=-1)
    ap.add_argument("--die-step", type=int, default=-1)
    ap.add_argument("--die-how", choices=("exit", "hang"), default="exit")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    rank = dist.get_rank()
    try:
        model_cfg, train_cfg = PRESETS[args.preset]
        preset = args.preset
        if args.nanogpt:
            model_cfg, preset = nanogpt_config(model_cfg, bias=args.nanogpt == "bias"), None
        reduce_steps = {int(s) for s in args.all_reduce_steps.split(",") if s}
        # the model is built for the data's vocabulary; Publisher checks it
        pub = Publisher(
            args.out,
            model_cfg,
            train_cfg,
            steps=args.steps,
            checkpoint_every=args.checkpoint_every,
            corpus_files=args.data,
            preset=preset,
        )
        model, named, opt, schedule = build(pub.model, train_cfg)
        cfg = model_config(model, named, init_std=model_cfg.init_std, rope_theta=model_cfg.rope_theta)
        assert dataclasses.asdict(cfg) == dataclasses.asdict(pub.model)
        qnames = quant_names(model)
        M, B = train_cfg.micro_batches, train_cfg.micro_batch_size
        a, b = my_range(M)
        pub.publish(0, named, opt, quant_names=qnames)
        for n in range(1, args.steps + 1):
            batch = pub.batch(n)
            opt.zero_grad()
            if n in reduce_steps:
                loss = all_reduce_step(model, named, batch, M, B, a, b)
            else:
                fold = GradFold(named, start=a)
                for m in range(a, b):
                    if rank == args.die_rank and n == args.die_step:
                        if args.die_how == "hang":
                            time.sleep(3600)  # a rank that stops answering
                        os._exit(17)  # a crash in the middle of the step
                    x, y = inputs_targets(batch[m * B : (m + 1) * B])
                    loss = model(torch.from_numpy(x), torch.from_numpy(y))
                    loss.backward()
                    fold.push(loss)
                loss = all_fold(fold, M, step=n)
            clip_grad_norm_(named, train_cfg.clip_norm)
            opt.step()
            schedule.step()
            rec = pub.publish(n, named, opt, loss, qnames)
            if rank == 0:
                print(f"step {n}: loss {float(loss):.4f}  link {rec.chain_link[:16]}", flush=True)
        if rank == 0:
            print(f"head {pub.last.chain_link}", flush=True)
        return 0
    except CollectiveError as exc:
        print(f"rank {rank}: error: {exc}", file=sys.stderr, flush=True)
        os._exit(3)  # a peer is gone: no teardown collective can finish
    except (Unsupported, InputError) as exc:
        print(f"rank {rank}: error: {exc}", file=sys.stderr, flush=True)
        return 2
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
