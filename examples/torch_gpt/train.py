"""The training loop of a replayable torch run (docs/torch.md, "Recipe").

``train`` runs steps 1..N of ``gpt.GPT`` on refreplay's data stream and
returns what a run publishes per step: state root, data hash, loss and
chain link ([step.record.c1]).  Everything that decides a bit is pinned:

* which samples form step n: refreplay's stream, a pure function of
  (seed, step, global batch) ([data.stream.c1]);
* micro-batch gradients: never summed by PyTorch (``GradFold.push`` clears
  ``.grad`` after each backward); folded by TreeFold and scaled by
  recip(M) ([fold.tree.c1], [fold.scale.c1]);
* clipping in sorted name order, the LR schedule and AdamW as binary32
  ([optim.clip.c1], [optim.lr.c1], [optim.adamw.c1]);
* the state hash and the chain: refreplay's own functions.

Run it: ``python examples/torch_gpt/train.py`` (the `tiny` case of
vectors/steps.json; prints each record and whether it matches).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

from refreplay.training.data import Batching, Stream, inputs_targets
from refreplay.training.model import init_params
from refreplay.training.presets import f32_hex
from refreplay.torch import GradFold, chain_link, load_state, train_state
from refreplay.torch.optim import AdamW, LRSchedule, clip_grad_norm_

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpt import GPT, named_state, quant_names  # noqa: E402

GENESIS = "00" * 32


def build(model_cfg, train_cfg, start=None):
    """The model with the reference's initial values ([model.init.c1]), or
    the state ``start`` (a checkpoint), and its optimizer: weight decay for
    tensors with two axes, +0 for the rest ([step.hparams.c1])."""
    model = GPT(model_cfg)
    named = named_state(model)
    init = init_params(model_cfg, train_cfg.seed)
    with torch.no_grad():
        for name, p in named.items():
            p.copy_(torch.from_numpy(init[name]))
    decay = [p for _, p in sorted(named.items()) if p.dim() >= 2]
    no_decay = [p for _, p in sorted(named.items()) if p.dim() < 2]
    opt = AdamW(
        [
            {"params": decay, "weight_decay": train_cfg.weight_decay},
            {"params": no_decay, "weight_decay": np.float32(0.0)},
        ],
        lr=train_cfg.lr,
        betas=(train_cfg.beta1, train_cfg.beta2),
        eps=train_cfg.eps,
    )
    if start is not None:
        load_state(start, named, opt)
    schedule = LRSchedule(
        opt,
        train_cfg.warmup_steps,
        train_cfg.schedule_steps,
        train_cfg.lr,
        train_cfg.min_lr,
        "cosine",
        next_update=1 if start is None else start.step + 1,
    )
    return model, named, opt, schedule


def train(
    model_cfg, train_cfg, samples: np.ndarray, steps: int, recipe_hash: str, start=None, link: str = GENESIS
) -> list[dict]:
    """Records of steps 0..steps, in the format of vectors/steps.json; or,
    from ``start`` (a state, with ``link`` the chain link of its step: what
    an auditor replays from a checkpoint), of steps start.step+1..steps."""
    model, named, opt, schedule = build(model_cfg, train_cfg, start)
    stream = Stream(samples, train_cfg.seed, Batching(train_cfg.micro_batches, train_cfg.micro_batch_size))
    qnames = quant_names(model)
    first = 0 if start is None else start.step
    records = []
    if start is None:
        records.append({"step": 0, "state_root": train_state(0, named, opt, stream.position(1), qnames).root()})
    M, B = train_cfg.micro_batches, train_cfg.micro_batch_size
    for n in range(first + 1, steps + 1):
        batch = stream.batch(n)
        data_hash = stream.data_hash(n).hex()
        opt.zero_grad()  # set_to_none: the first backward must not add to anything
        fold = GradFold(named)
        for m in range(M):
            x, y = inputs_targets(batch[m * B : (m + 1) * B])
            loss = model(torch.from_numpy(x), torch.from_numpy(y))
            loss.backward()
            fold.push(loss)
        loss = fold.mean()
        clip_grad_norm_(named, train_cfg.clip_norm)
        opt.step()
        schedule.step()
        st = train_state(n, named, opt, stream.position(n + 1), qnames)
        root = st.root()
        link = chain_link(link, root, data_hash, recipe_hash, loss)
        loss_hex = f32_hex(loss)
        records.append({"step": n, "state_root": root, "data_hash": data_hash, "loss": loss_hex, "chain_link": link})
    return records


def main() -> int:
    from refreplay.conformance.golden import steps as golden

    root = Path(__file__).resolve().parents[2]
    case = golden.load(root / "vectors" / "steps.json")[0]
    got = train(case.model, case.train, case.samples, len(case.records) - 1, case.recipe_sha256)
    ok = True
    for want, have in zip(case.records, got):
        same = all(want.get(k) == have.get(k) for k in ("state_root", "data_hash", "loss", "chain_link"))
        ok &= same
        print(
            f"step {have['step']}: root {have['state_root'][:16]}  loss {have.get('loss')}  "
            f"{'matches' if same else 'DIFFERS'}"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
