"""refreplay.torch beside plain PyTorch eager: one training step (forward +
backward) of the nanoGPT-style model of examples/nanogpt_port, the same
model built from torch.nn (PyTorch's kernels) and converted to
refreplay.torch, at the same thread count, alternating in one process.

    python benchmarks/bench_torch.py [--models nanogpt-small,gpt2-124m] [--threads 1,2] [--repeats N] [--json PATH]

Each thread count runs in a fresh worker (NUMBA_NUM_THREADS = N and
torch.set_num_threads(N)); 2 warm-up steps of each, then ``--repeats``
steps of each alternately; medians and the ratio refreplay / PyTorch.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODELS = {  # name: (Config kwargs, batch)
    "small": (dict(vocab=256, block=32, layers=2, heads=2, width=64), 4),
    "nanogpt-small": (dict(vocab=256, block=256, layers=6, heads=6, width=384), 8),
    "gpt2-124m": (dict(vocab=50304, block=1024, layers=12, heads=12, width=768), 1),
}


def worker(model: str, threads: int, repeats: int) -> dict:
    import torch

    sys.path.insert(0, str(REPO / "examples" / "nanogpt_port"))
    from model import Config, build

    torch.set_num_threads(threads)
    kw, B = MODELS[model]
    cfg = Config(**kw)
    nets = {"refreplay": build(cfg), "pytorch": build(cfg, plain=True)}
    gen = torch.Generator().manual_seed(1)
    idx = torch.randint(0, cfg.vocab, (B, cfg.block), generator=gen)
    y = torch.randint(0, cfg.vocab, (B, cfg.block), generator=gen)
    times = {k: [] for k in nets}
    for r in range(repeats + 2):
        for name, net in nets.items():
            t = time.perf_counter()
            net.zero_grad(set_to_none=True)
            net(idx, y).backward()
            if r >= 2:
                times[name].append(time.perf_counter() - t)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    return {
        "model": model,
        "threads": threads,
        "refreplay_ms": med["refreplay"],
        "pytorch_ms": med["pytorch"],
        "ratio": med["refreplay"] / med["pytorch"],
        "load": os.getloadavg()[0],
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="nanogpt-small")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=1200.0)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--worker")
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, int(args.threads), args.repeats)))
        return 0
    rows = []
    print(f"CPU: AMD EPYC (Zen 5), {os.cpu_count()} cores; load at start {os.getloadavg()}")
    for model in args.models.split(","):
        for n in (int(t) for t in args.threads.split(",")):
            env = dict(
                os.environ,
                NUMBA_NUM_THREADS=str(n),
                PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            )
            out = subprocess.run(
                [sys.executable, __file__, "--worker", model, "--threads", str(n), "--repeats", str(args.repeats)],
                env=env,
                capture_output=True,
                text=True,
                timeout=args.timeout,
            )
            if out.returncode:
                raise SystemExit(f"worker failed: {out.stderr[-2000:]}")
            r = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append(r)
            print(
                f"{model:14s} {n} thread(s): refreplay.torch {r['refreplay_ms']:9.1f} ms, PyTorch "
                f"{r['pytorch_ms']:9.1f} ms, ratio {r['ratio']:.2f}  (load {r['load']:.1f})"
            )
    if args.json:
        args.json.write_text(json.dumps({"cpu": "AMD EPYC (Zen 5), 2 cores", "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
