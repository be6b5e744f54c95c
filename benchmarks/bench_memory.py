"""Peak memory of replaying one step with M = 4, 16, 64 micro-batches.

    python benchmarks/bench_memory.py [--ms 4 16 64] [--json out.json]

One step of the `small` preset's model (B = 1 sequence per micro-batch, so
that M = 64 stays quick) is computed by ``Trainer.step`` -- the function a
replay calls for every step it checks -- in a fresh process per M.  The
process records (a) the peak of NumPy allocations during the step, from
``tracemalloc`` (NumPy reports its buffers to it), above what was live
before the step, and (b) the process's peak RSS.  TreeFold ([fold.tree.c1])
keeps at most floor(log2 M) + 1 partial sums on its stack, so the peak should
grow by about one gradient set (the parameters' size) per doubling of M, not
by M gradient sets.  The table shows the peak in MiB and in units of one
gradient set.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from run_all import load_line, machine, run_worker, table, write_json  # noqa: E402


def worker(M: int) -> dict:
    import tracemalloc
    from dataclasses import replace

    import numpy as np

    from refreplay.training.data import Batching, Stream
    from refreplay.training.launch.inproc import InProcess
    from refreplay.training.presets import preset
    from refreplay.training.step import Trainer

    mc, tc = preset("small")
    tc = replace(tc, micro_batches=M, micro_batch_size=1)
    rs = np.random.RandomState(0)
    samples = rs.randint(0, 256, size=(M, mc.seq_len + 1)).astype(np.uint8)
    tr = Trainer(mc, tc, Stream(samples, tc.seed, Batching(M, 1)), "00" * 32)
    s0 = tr.initial_state()
    grad_bytes = sum(a.nbytes for a in s0.params.values())
    tr.step(s0, "00" * 32, InProcess(1))  # JIT and first-touch outside the measurement
    tracemalloc.start()
    before, _ = tracemalloc.get_traced_memory()
    tracemalloc.reset_peak()
    tr.step(s0, "00" * 32, InProcess(1))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "M": M,
        "peak_bytes": peak - before,
        "peak_mib": (peak - before) / 2**20,
        "grad_bytes": grad_bytes,
        "peak_grad_sets": (peak - before) / grad_bytes,
        "max_rss_mib": rss_kib / 1024,
        "accumulators": int(math.log2(M)) + 1,
        "loadavg": os.getloadavg()[0],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ms", type=int, nargs="+", default=[4, 16, 64])
    ap.add_argument("--repeats", type=int, default=1, help="(unused: one measured step per M)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker is not None:
        print(json.dumps(worker(args.worker)))
        return 0
    print(load_line(), flush=True)
    rows = [run_worker(Path(__file__), ["--worker", str(m)], 1) for m in args.ms]
    g = rows[0]["grad_bytes"]
    print(f"\npeak memory of one small-preset step (B = 1), one gradient set = {g / 2**20:.1f} MiB")
    print(
        table(
            ["M", "floor(log2 M)+1", "step peak MiB (tracemalloc)", "in gradient sets", "max RSS MiB"],
            [
                [
                    r["M"],
                    r["accumulators"],
                    f"{r['peak_mib']:.1f}",
                    f"{r['peak_grad_sets']:.2f}",
                    f"{r['max_rss_mib']:.0f}",
                ]
                for r in rows
            ],
        )
    )
    # log growth: from the smallest to the largest M the peak may grow by about
    # one gradient set per doubling (+1 of slack), never by the M - M0 sets of
    # a linear accumulation.
    lo, hi = rows[0], rows[-1]
    allowed = math.log2(hi["M"] / lo["M"]) + 1
    grew = hi["peak_grad_sets"] - lo["peak_grad_sets"]
    log_growth = grew <= allowed
    print(
        f"\ngrowth from M = {lo['M']} to {hi['M']}: {grew:.2f} gradient sets "
        f"(log M allows <= {allowed:.0f}; linear would be {hi['M'] - lo['M']}): "
        f"{'grows with log M' if log_growth else 'NOT logarithmic'}"
    )
    out = write_json(
        "memory.json",
        {
            "machine": machine(),
            "rows": rows,
            "growth_grad_sets": grew,
            "allowed_grad_sets": allowed,
            "log_growth": log_growth,
        },
        args.json,
    )
    print(f"\n{load_line()}\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
