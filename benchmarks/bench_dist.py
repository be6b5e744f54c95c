"""TreeFold over torch.distributed (refreplay.torch.distributed) beside
dist.all_reduce on the same gradient tensors, over gloo on 127.0.0.1.

    python benchmarks/bench_dist.py                     # gpt2-124m's gradients, 2 ranks, 3 repeats
    python benchmarks/bench_dist.py --preset tiny --repeats 5 --json /tmp/dist.json

Each rank holds the aligned block of its micro-batch range ([fold.ranks.c1]:
M = 8 on 2 ranks, one block of 4 per rank) with gpt2-124m's 123.7 M
gradient elements (plus the loss leaf).  Timed, alternating, per repeat:

* ``fold``: ``exchange_blocks`` (block positions, then one all_gather of
  the int32-viewed payloads) + the fold of every rank's blocks with the
  reference's tree node + the recip(M) scale: what ``all_fold`` costs once
  the leaves are pushed;
* ``exchange``: the byte exchange alone (the collective part of ``fold``);
* ``all_reduce``: ``dist.all_reduce`` (SUM) of every gradient tensor, then
  ``mul_(1/M)``: an ordinary data-parallel loop's collective (not
  conformant).

Bytes: the payload each rank must send (its blocks, or its gradients), and
the bytes the loopback interface carried during the call (/proc/net/dev,
divided by the ranks; other traffic on the machine adds to it).  Prints
medians and writes JSON (benchmarks/results/dist.json by default).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _lo_bytes() -> int:
    try:
        for line in Path("/proc/net/dev").read_text().splitlines():
            if line.strip().startswith("lo:"):
                return int(line.split(":", 1)[1].split()[8])  # transmitted bytes
    except OSError:
        pass
    return -1


def worker(args) -> None:
    import datetime

    import numpy as np
    import torch
    import torch.distributed as dist

    from refreplay.torch.distributed import exchange_blocks
    from refreplay.training import treefold
    from refreplay.training.model import param_shapes
    from refreplay.training.presets import PRESETS
    from refreplay.training.step import LOSS

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    q, R = dist.get_rank(), dist.get_world_size()
    M = args.micro_batches
    a, b = treefold.rank_ranges(M, R)[q]
    shapes = dict(param_shapes(PRESETS[args.preset][0]))
    rng = np.random.default_rng(q)
    grads = {k: rng.standard_normal(int(np.prod(s)), dtype=np.float32).reshape(s) for k, s in shapes.items()}
    grads[LOSS] = np.ones(1, np.float32)
    shapes[LOSS] = (1,)
    names = sorted(shapes)
    blocks = [treefold.Block(s, z, grads) for s, z in treefold.aligned_blocks(a, b)]
    elements = sum(int(np.prod(s)) for s in shapes.values())
    tensors = [torch.from_numpy(grads[k].copy()) for k in names]

    def fold():
        every = exchange_blocks(blocks, names, shapes, M, reuse=True)
        return treefold.scale(treefold.fold_blocks(every), M)

    def all_reduce():
        for t in tensors:
            dist.all_reduce(t)
            t.mul_(1.0 / M)

    if os.environ.get("BENCH_PROFILE") and q == 0:  # where the fold's time goes (rank 0)
        import cProfile
        import pstats

        dist.barrier()
        prof = cProfile.Profile()
        prof.runcall(fold)
        pstats.Stats(prof).sort_stats("cumulative").print_stats(18)
    elif os.environ.get("BENCH_PROFILE"):
        dist.barrier()
        fold()

    def exchange():
        exchange_blocks(blocks, names, shapes, M, reuse=True)

    rows = {"exchange": [], "fold": [], "all_reduce": []}
    lo = {"exchange": [], "fold": [], "all_reduce": []}
    for _ in range(args.repeats):
        for name, fn in (("exchange", exchange), ("fold", fold), ("all_reduce", all_reduce)):
            dist.barrier()
            b0, t0 = _lo_bytes(), time.perf_counter()
            fn()
            dist.barrier()
            rows[name].append(time.perf_counter() - t0)
            lo[name].append((_lo_bytes() - b0) / R)
    if q == 0:
        out = {
            "preset": args.preset,
            "ranks": R,
            "micro_batches": M,
            "elements": elements,
            "blocks_per_rank": len(blocks),
            "payload_bytes_per_rank": {
                "exchange": 4 * elements * len(blocks),
                "fold": 4 * elements * len(blocks),
                "all_reduce": 4 * elements,
            },
            "seconds": rows,
            "median_s": {k: statistics.median(v) for k, v in rows.items()},
            "loopback_bytes_per_rank_median": {k: statistics.median(v) for k, v in lo.items()},
        }
        Path(args.worker_out).write_text(json.dumps(out))
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="gpt2-124m")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--micro-batches", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=str(HERE / "results" / "dist.json"))
    ap.add_argument("--worker-out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if "RANK" in os.environ:
        worker(args)
        return 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tmp = Path(args.json).with_suffix(".worker.json")
    procs = []
    for q in range(args.ranks):
        env = dict(
            os.environ,
            RANK=str(q),
            WORLD_SIZE=str(args.ranks),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS="1",
            NUMBA_NUM_THREADS="1",
        )
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--preset",
                    args.preset,
                    "--micro-batches",
                    str(args.micro_batches),
                    "--repeats",
                    str(args.repeats),
                    "--worker-out",
                    str(tmp),
                ],
                env=env,
            )
        )
    rcs = []
    for p in procs:
        try:
            rcs.append(p.wait(timeout=1800))
        except subprocess.TimeoutExpired:
            p.kill()
            rcs.append(-9)
    if any(rcs):
        print(f"worker exit codes {rcs}", file=sys.stderr)
        return 1
    res = json.loads(tmp.read_text())
    tmp.unlink()
    res["cpu"] = (
        "AMD EPYC (Zen 5, AVX-512), 2 cores, 1 MiB L2/core, 32 MiB L3 ("
        + (platform.processor() or platform.machine())
        + ")"
    )
    res["threads"] = "1 torch, 1 Numba thread per rank"
    res["load_average"] = os.getloadavg()
    Path(args.json).write_text(json.dumps(res, indent=2) + "\n")
    mb = 1 / 2**20
    print(
        f"{args.preset}: {res['elements']:,} gradient elements, {args.ranks} ranks, M = {args.micro_batches}, "
        f"load {res['load_average'][0]:.1f}"
    )
    for k in ("exchange", "fold", "all_reduce"):
        print(
            f"  {k:<10} {res['median_s'][k]:8.3f} s  payload {res['payload_bytes_per_rank'][k] * mb:8.1f} MiB/rank"
            f"  loopback {res['loopback_bytes_per_rank_median'][k] * mb:8.1f} MiB/rank"
        )
    print(f"  fold / all_reduce time: {res['median_s']['fold'] / res['median_s']['all_reduce']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
