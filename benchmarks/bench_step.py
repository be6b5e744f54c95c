"""One full training step of the `small` preset: refreplay vs PyTorch CPU eager.

    python benchmarks/bench_step.py [--threads 1 2] [--repeats 3] [--json out.json]

refreplay: ``Trainer.step`` on one in-process rank (M = 8 micro-batches of
B = 4 sequences of T = 128 tokens: forward, backward, TreeFold, clip, AdamW,
state hash, chain link).  PyTorch: ``benchmarks/torch_gpt.py``, the same
architecture and micro-batching in eager fp32 (forward, backward, clip,
AdamW; no state hash).  For each thread count a fresh worker process runs
with NUMBA_NUM_THREADS = OMP_NUM_THREADS = N and torch.set_num_threads(N);
both steps are warmed up (JIT, allocator) and then timed alternately.  The
table gives medians of wall time and of process CPU time and the ratio
refreplay / PyTorch (target <= 2), and beside them the same refreplay step
with its buffer reuse off (``fresh``: every temporary of the backward and
every TreeFold node a new array, as before issue #32) and the reuse gain.  The worker also profiles one refreplay
step with cProfile and prints where the time goes, per compiled kernel.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from run_all import alternate, load_line, machine, run_worker, table, write_json  # noqa: E402


def reference_step(name: str, reuse: bool = True):
    """The reference trainer on preset ``name`` over random byte samples:
    (model config, train config, stream, a function running step 1).
    ``reuse`` False: ``Trainer.fresh_buffers()``, every temporary a new array
    (as before issue #32's buffer reuse; same bits)."""
    import numpy as np

    from refreplay.training.data import Batching, Stream
    from refreplay.training.launch.inproc import InProcess
    from refreplay.training.presets import preset
    from refreplay.training.step import Trainer

    mc, tc = preset(name)
    rs = np.random.RandomState(0)
    samples = rs.randint(0, 256, size=(4 * tc.micro_batches * tc.micro_batch_size, mc.seq_len + 1))
    stream = Stream(samples.astype(np.uint8), tc.seed, Batching(tc.micro_batches, tc.micro_batch_size))
    trainer = Trainer(mc, tc, stream, "00" * 32)
    if not reuse:
        trainer.fresh_buffers()
    s0 = trainer.initial_state()
    launcher = InProcess(1)
    return mc, tc, stream, lambda: trainer.step(s0, "00" * 32, launcher)


def _setup(threads: int):
    import numpy as np
    import torch

    from refreplay.training.data import inputs_targets
    from torch_gpt import TorchTrainer

    torch.set_num_threads(threads)
    mc, tc, stream, ref_step = reference_step("small")
    batch = stream.batch(1)
    B = tc.micro_batch_size
    mbs = []
    for m in range(tc.micro_batches):
        x, y = inputs_targets(batch[m * B : (m + 1) * B])
        mbs.append((torch.from_numpy(x.astype(np.int64)), torch.from_numpy(y.astype(np.int64))))
    tt = TorchTrainer(mc, tc)

    def torch_step():
        return tt.step(mbs)

    _, _, _, fresh_step = reference_step("small", reuse=False)
    return ref_step, torch_step, fresh_step


def profile_step(ref_step, top: int = 14) -> list[dict]:
    """Per-function self time of one refreplay step (compiled kernels appear
    as single entries), largest first, then the rest as 'other'."""
    prof = cProfile.Profile()
    prof.enable()
    ref_step()
    prof.disable()
    st = pstats.Stats(prof)
    total = sum(v[2] for v in st.stats.values())
    rows = []
    for (path, _line, fn), (_, ncalls, tottime, _, _) in st.stats.items():
        where = f"{Path(path).parent.name}/{Path(path).name}:{fn}" if path.startswith("/") else fn
        rows.append({"function": where, "calls": ncalls, "seconds": tottime})
    rows.sort(key=lambda r: -r["seconds"])
    head = rows[:top]
    rest = sum(r["seconds"] for r in rows[top:])
    head.append({"function": "other", "calls": sum(r["calls"] for r in rows[top:]), "seconds": rest})
    for r in head:
        r["share"] = r["seconds"] / total if total else 0.0
    return head


def worker(threads: int, repeats: int) -> dict:
    ref_step, torch_step, fresh_step = _setup(threads)
    med = alternate({"refreplay": ref_step, "torch": torch_step, "fresh": fresh_step}, repeats)
    prof = profile_step(ref_step)
    return {
        "threads": threads,
        "refreplay": med["refreplay"],
        "torch": med["torch"],
        "ratio_wall": med["refreplay"]["wall"] / med["torch"]["wall"],
        "ratio_cpu": med["refreplay"]["cpu"] / med["torch"]["cpu"],
        "fresh": med["fresh"],
        "reuse_gain": med["fresh"]["wall"] / med["refreplay"]["wall"],
        "profile": prof,
        "loadavg": os.getloadavg()[0],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None)
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker is not None:
        import json

        print(json.dumps(worker(args.worker, args.repeats)))
        return 0
    print(load_line(), flush=True)
    rows = [run_worker(Path(__file__), ["--worker", str(n), "--repeats", str(args.repeats)], n) for n in args.threads]
    print(f"\nsmall preset training step (8 micro-batches x 4 x 128 tokens), medians of {args.repeats} after warm-up")
    print(
        table(
            [
                "threads",
                "refreplay wall s",
                "torch wall s",
                "ratio wall",
                "refreplay cpu s",
                "torch cpu s",
                "ratio cpu",
                "target",
                "fresh-buffers wall s",
                "reuse gain",
                "load",
            ],
            [
                [
                    r["threads"],
                    f"{r['refreplay']['wall']:.3f}",
                    f"{r['torch']['wall']:.3f}",
                    f"{r['ratio_wall']:.2f}",
                    f"{r['refreplay']['cpu']:.3f}",
                    f"{r['torch']['cpu']:.3f}",
                    f"{r['ratio_cpu']:.2f}",
                    "<= 2",
                    f"{r['fresh']['wall']:.3f}",
                    f"{r['reuse_gain']:.3f}",
                    f"{r['loadavg']:.1f}",
                ]
                for r in rows
            ],
        )
    )
    print(
        "fresh buffers: the same step with Trainer.fresh_buffers() (every temporary and node new); "
        "reuse gain = its wall time / refreplay's"
    )
    for r in rows:
        print(f"\nwhere one refreplay step spends its time ({r['threads']} thread(s), cProfile self time)")
        print(
            table(
                ["function", "calls", "seconds", "share"],
                [[p["function"], p["calls"], f"{p['seconds']:.3f}", f"{100 * p['share']:.1f}%"] for p in r["profile"]],
            )
        )
    out = write_json("step.json", {"machine": machine(), "repeats": args.repeats, "rows": rows}, args.json)
    print(f"\n{load_line()}\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
