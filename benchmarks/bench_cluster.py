"""Replay throughput on a Dask LocalCluster: steps per hour with 1 and 2
workers, scheduler overhead per task, bytes read and moved per task.

    python benchmarks/bench_cluster.py [--preset small] [--steps 4] [--json out.json]

A run of ``--steps`` steps with a checkpoint after every step is trained
first (into a temporary directory), so that each task replays exactly one
step.  Then, for 1 and 2 one-thread worker processes (NUMBA_NUM_THREADS=1),
every step is replayed as one task (``refreplay.verify.cluster.run_tasks``,
the code behind ``audit --cluster``), after one warm-up task per worker that
loads the compiled code (a step of the measured run, or with ``--warmup
PRESET`` a step of a 1-step run of that preset: the same kernels);
``--rounds`` rounds, alternating 1 and 2 workers.
Reported per measurement: wall time, steps per hour, the replay seconds the workers measured inside the tasks, and
``overhead``: wall time x workers - task seconds, per task (scheduling,
transfer, result pickling, idle tails).  Scheduler overhead alone: the
median round trip of 50 no-op tasks with the same resource restriction.
Bytes: read by the worker process per task (``/proc/self/io`` rchar: the
checkpoint, the shards, the records) and moved over the wire (pickled
arguments and result).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from run_all import load_line, machine, table, write_json  # noqa: E402


def _noop():
    return 0


def train_run(preset: str, steps: int, out: Path) -> Path:
    """``refreplay train`` with a checkpoint after every step; the GPT-2
    presets train on a token file of random ids (their data is tokens)."""
    from refreplay import cli
    from refreplay.training import presets

    argv = ["train", "--preset", preset, "--steps", str(steps), "--checkpoint-every", "1", "--out", str(out)]
    if preset.startswith("gpt2"):
        import numpy as np

        from refreplay.training import tokens

        model, tcfg = presets.preset(preset)
        tok = out.parent / f"{preset}-tokens.bin"
        samples = (steps + 1) * tcfg.micro_batches * tcfg.micro_batch_size
        tokens.write_llmc(tok, np.random.default_rng(0).integers(0, model.vocab, size=samples * (model.seq_len + 1)))
        argv += ["--tokens", str(tok), "--vocab", str(model.vocab)]
    rc = cli.main([*argv, "--quiet"])
    if rc != 0:
        raise SystemExit(f"refreplay {' '.join(argv)}: exit {rc}")
    return out


def measure(run_path: Path, workers: int, steps: int, warm_path: Path | None = None) -> dict:
    import cloudpickle
    from distributed import Client, LocalCluster

    from refreplay.training.run import open_run
    from refreplay.verify import cluster

    head = open_run(run_path).head["chain_link"]
    warm_path = warm_path or run_path
    warm_head = open_run(warm_path).head["chain_link"]
    lc = LocalCluster(
        n_workers=workers,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address=None,
        env={"NUMBA_NUM_THREADS": "1"},
    )
    try:
        with Client(lc) as client:
            cluster.prove_fitness(client)
            warm = [
                client.submit(
                    cluster.replay_task,
                    str(warm_path),
                    warm_head,
                    1,
                    workers=[w],
                    resources={"refreplay": 1},
                    pure=False,
                )
                for w in client.scheduler_info()["workers"]
            ]
            client.gather(warm)
            rtt = []
            for _ in range(50):
                t = time.perf_counter()
                client.submit(_noop, resources={"refreplay": 1}, pure=False).result()
                rtt.append(time.perf_counter() - t)
            t0 = time.perf_counter()
            out = cluster.run_tasks(client, run_path, head, list(range(1, steps + 1)))
            wall = time.perf_counter() - t0
    finally:
        lc.close()
    assert len(out.results) == steps and all(x["result"].verified for x in out.results.values()), out
    one = out.results[1]
    wire = len(cloudpickle.dumps((str(run_path), head, 1, None, None))) + len(cloudpickle.dumps(one))
    return {
        "workers": workers,
        "wall_s": wall,
        "steps_per_hour": 3600 * steps / wall,
        "task_s_median": statistics.median(out.task_seconds),
        "overhead_s_per_task": (wall * workers - sum(out.task_seconds)) / steps,
        "noop_rtt_ms_median": 1e3 * statistics.median(rtt),
        "bytes_read_per_task_median": statistics.median(out.bytes_read) if out.bytes_read else None,
        "bytes_on_wire_per_task": wire,
        "checkpoint_bytes": (run_path / "checkpoints" / "step-0000001.safetensors").stat().st_size,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2, help="1-worker and 2-worker measurements, alternated")
    ap.add_argument(
        "--warmup",
        default=None,
        metavar="PRESET",
        help="warm each worker with a step of a 1-step run of PRESET (same kernels, loaded from the cache) "
        "instead of a step of the measured run: for presets whose step takes minutes",
    )
    ap.add_argument("--json", default=None, help="write results here (default benchmarks/results/cluster.json)")
    a = ap.parse_args(argv)
    os.environ.setdefault("NUMBA_NUM_THREADS", "1")
    print(load_line())
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        t = time.perf_counter()
        run_path = train_run(a.preset, a.steps, Path(tmp) / "run")
        print(f"trained {a.steps} {a.preset} steps in {time.perf_counter() - t:.1f} s")
        warm_path = train_run(a.warmup, 1, Path(tmp) / "warm") if a.warmup else None
        rows = [measure(run_path, w, a.steps, warm_path) for w in (1, 2) * a.rounds]  # alternated: load drifts
    print(
        table(
            ["workers", "wall s", "steps/h", "task s", "overhead s/task", "no-op ms", "read MB/task", "wire kB/task"],
            [
                [
                    x["workers"],
                    f"{x['wall_s']:.1f}",
                    f"{x['steps_per_hour']:.0f}",
                    f"{x['task_s_median']:.2f}",
                    f"{x['overhead_s_per_task']:.2f}",
                    f"{x['noop_rtt_ms_median']:.1f}",
                    f"{(x['bytes_read_per_task_median'] or 0) / 1e6:.1f}",
                    f"{x['bytes_on_wire_per_task'] / 1e3:.1f}",
                ]
                for x in rows
            ],
        )
    )
    med = {w: statistics.median(x["steps_per_hour"] for x in rows if x["workers"] == w) for w in (1, 2)}
    print(
        f"median steps/hour: 1 worker {med[1]:.0f}, 2 workers {med[2]:.0f}; "
        f"scaling 2 workers / 1 worker: {med[2] / med[1]:.2f}x"
    )
    print(load_line())
    path = write_json(
        "cluster.json",
        {"machine": machine(), "preset": a.preset, "steps": a.steps, "warmup": a.warmup or a.preset, "rows": rows},
        a.json,
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
