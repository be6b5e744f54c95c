"""Train the ported nanoGPT-style model (model.py) reproducibly: the loop of
docs/torch.md, "Recipe", with only the edits of "Porting a model".

    python examples/nanogpt_port/train.py [--steps 3] [--micro-batches 2]

Random tokens from a fixed seed stand in for a corpus.  Every step prints
its loss (hex) and state root; two runs, or runs at any thread count,
print the same lines.  Exit 0.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

import refreplay.torch as rt
from refreplay.torch.optim import AdamW, LRSchedule, clip_grad_norm_
from refreplay.training.data import Batching, Stream, inputs_targets
from refreplay.training.presets import f32_hex

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model import Config, build  # noqa: E402


class Run:
    """The model, its optimizer, schedule and data stream: what a step needs."""

    def __init__(self, cfg: Config, M: int = 2, B: int = 2, seed: int = 0, steps: int = 3):
        self.model = build(cfg, seed=seed)  # torch init + load_, then convert (strict)
        self.named = dict(self.model.named_parameters())  # names order the state hash and clipping
        decay = [p for _, p in sorted(self.named.items()) if p.dim() >= 2]
        no_decay = [p for _, p in sorted(self.named.items()) if p.dim() < 2]
        lr = np.float32(1e-3)
        self.opt = AdamW(
            [{"params": decay, "weight_decay": np.float32(0.1)}, {"params": no_decay, "weight_decay": np.float32(0.0)}],
            lr=lr,
            betas=(np.float32(0.9), np.float32(0.95)),
            eps=np.float32(1e-8),
        )
        self.schedule = LRSchedule(self.opt, 1, max(steps, 2), lr, np.float32(1e-4), "cosine")
        samples = np.random.default_rng(seed).integers(0, cfg.vocab, (8 * M * B, cfg.block + 1), dtype=np.uint16)
        self.stream = Stream(samples, seed, Batching(M, B))
        self.M, self.B = M, B

    def step(self, n: int) -> tuple[str, str]:
        """Step n: (loss hex, state root)."""
        batch = self.stream.batch(n)
        self.opt.zero_grad()  # .grad = None: nothing for autograd to add to
        fold = rt.GradFold(self.named)
        for m in range(self.M):  # micro-batches in global sample order
            x, y = inputs_targets(batch[m * self.B : (m + 1) * self.B])
            loss = self.model(torch.from_numpy(x), torch.from_numpy(y))
            loss.backward()
            fold.push(loss)  # takes every .grad, clears it
        loss = fold.mean()  # TreeFold, times recip(f32(M))
        clip_grad_norm_(self.named, np.float32(1.0))
        self.opt.step()
        self.schedule.step()
        return f32_hex(loss), rt.train_state(n, self.named, self.opt, self.stream.position(n + 1), []).root()


def train(cfg: Config, steps: int, M: int = 2, B: int = 2, seed: int = 0) -> list[tuple[str, str]]:
    """(loss hex, state root) of steps 1..steps."""
    run = Run(cfg, M, B, seed, steps)
    return [run.step(n) for n in range(1, steps + 1)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--micro-batches", type=int, default=2)
    args = ap.parse_args()
    for n, (loss, root) in enumerate(train(Config(), args.steps, args.micro_batches), 1):
        print(f"step {n}: loss {loss}  state root {root[:16]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
