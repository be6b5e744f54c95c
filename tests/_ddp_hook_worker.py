"""One rank of the DDP communication-hook test (tests/test_torch_distributed.py):
DistributedDataParallel with ``fold_hook``, one micro-batch per rank, must
give every rank the gradient bits that GradFold gives on one process over
all M = R micro-batches; exit 0 when they are equal, 1 when not."""

from __future__ import annotations

import datetime
import os
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "torch_gpt"))
from train import build  # noqa: E402

from refreplay.torch import GradFold, Unsupported  # noqa: E402
from refreplay.torch.distributed import HookState, fold_hook, fold_loss  # noqa: E402
from refreplay.training.presets import PRESETS  # noqa: E402


def main() -> int:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    q, R = dist.get_rank(), dist.get_world_size()
    cfg, tcfg = PRESETS["tiny"]
    g = torch.Generator().manual_seed(5)
    xs = torch.randint(0, cfg.vocab, (R, 2, cfg.seq_len), generator=g)
    ys = torch.randint(0, cfg.vocab, (R, 2, cfg.seq_len), generator=g)

    ref_model, ref_named, _, _ = build(cfg, tcfg)  # one process, every micro-batch
    fold = GradFold(ref_named)
    for m in range(R):
        loss = ref_model(xs[m], ys[m])
        loss.backward()
        fold.push(loss)
    ref_loss = fold.mean()

    model, named, _, _ = build(cfg, tcfg)
    ddp = DDP(model, bucket_cap_mb=0.05)  # several buckets
    state = HookState(R)
    ddp.register_comm_hook(state, fold_hook)
    loss = ddp(xs[q], ys[q])
    loss.backward()
    got_loss = fold_loss(loss, R)
    bad = [
        k
        for k in sorted(named)
        if not torch.equal(named[k].grad.view(torch.int32), ref_named[k].grad.view(torch.int32))
    ]
    try:  # M != R: refused before any collective
        fold_hook(HookState(2 * R), None)
        refused = False
    except Unsupported as exc:
        refused = "one micro-batch per rank" in str(exc)
    ok = not bad and np.float32(got_loss).tobytes() == np.float32(ref_loss).tobytes() and refused
    print(f"rank {q}: differing {bad[:5]}, loss {got_loss!r} vs {ref_loss!r}, refused {refused}", flush=True)
    dist.barrier()
    return 0 if ok else 1


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # no teardown of the DDP reducer's threads (it can block at exit)
