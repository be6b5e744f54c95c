"""Real scale: a gpt2-124m step against PyTorch, its train/replay cost and
peak memory, and one step of the 1.5 B preset within a memory budget.

    python benchmarks/bench_scale.py step [--threads 1 2]      # gpt2-124m step vs PyTorch
    python benchmarks/bench_scale.py replay [--max-memory GIB]  # train + replay via the CLI
    python benchmarks/bench_scale.py billion [--max-memory 10] [--seq-len 256] [--micro-batches 2]

step: for each thread count a fresh worker (NUMBA_NUM_THREADS =
OMP_NUM_THREADS = N, torch.set_num_threads(N)) first runs the ``--estimate``
calibration (which also warms the kernels), then times ``--steps``
consecutive refreplay ``Trainer.step`` calls of gpt2-124m (M = 8
micro-batches of 1 x 1024 tokens, V = 50,304, random token ids below
50,257; default 2 steps) and PyTorch eager on the same shapes
(``torch_gpt.py``: forward, backward, clip, AdamW; one warm-up step, then
the best of two).  Both are compared the same way: refreplay's best step
after its first against PyTorch's best after its warm-up.  The first step
is reported beside it: it also pays the first touch of the trainer's
reused buffers (each layer's attention probabilities, the logits and their
gradient, the tied weight's two halves: about 1.3 GB of page faults), which
later steps do not.

replay: ``refreplay train`` of one gpt2-124m step from a generated llm.c
token file, then ``refreplay replay RUN --step 1`` and ``--estimate``, each
a child process whose resident memory is sampled every 50 ms from
/proc/PID/status (peak RssAnon: the process's own memory; VmHWM: peak RSS
including mapped file pages).

billion: one step of the gpt2-xl shape (1.56 B parameters) as a replay runs
it (``Trainer.step`` from a state, TreeFold, clip, AdamW, state hash) under
``budget.Memory`` mapped, in this process, sampling its own memory.  The
state to start from is the initial state with its parameters in mapped files
and zero moments; no run directory is written (two checkpoints of 18.7 GB
each would not fit beside the step's own files on this machine's disk).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from run_all import (  # noqa: E402
    load_line,
    machine,
    read_machine_results,
    run_worker,
    table,
    thread_env,
    write_json,
)

GPT2_VOCAB = 50257


def _status(pid) -> dict:
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            k, _, v = line.partition(":")
            if k in ("RssAnon", "RssFile", "VmHWM", "VmRSS"):
                out[k] = int(v.split()[0]) * 1024
    except (OSError, ValueError):
        pass
    return out


class Sampler(threading.Thread):
    """Peak RssAnon and VmHWM of process ``pid``, sampled every 50 ms."""

    def __init__(self, pid):
        super().__init__(daemon=True)
        self.pid, self.peak_anon, self.hwm, self.stop = pid, 0, 0, False

    def run(self):
        while not self.stop:
            s = _status(self.pid)
            self.peak_anon = max(self.peak_anon, s.get("RssAnon", 0))
            self.hwm = max(self.hwm, s.get("VmHWM", 0))
            time.sleep(0.05)


def _gib(x) -> str:
    return f"{x / (1 << 30):.2f}"


def _token_file(directory: Path, samples: int, t: int) -> Path:
    import numpy as np

    from refreplay.training import tokens

    path = directory / "tokens.bin"
    ids = np.random.default_rng(0).integers(0, GPT2_VOCAB, size=samples * (t + 1))
    tokens.write_llmc(path, ids)
    return path


# ---- step: gpt2-124m vs PyTorch ------------------------------------------------------------


def step_worker(threads: int, steps: int = 2) -> dict:
    import numpy as np
    import torch

    from refreplay.training import estimate
    from refreplay.training.data import Batching, Stream, inputs_targets
    from refreplay.training.launch.inproc import InProcess
    from refreplay.training.presets import preset
    from refreplay.training.step import Trainer
    from torch_gpt import TorchTrainer

    torch.set_num_threads(threads)
    mc, tc = preset("gpt2-124m")
    cost = estimate.estimate(mc, tc)
    g = np.random.default_rng(0)
    samples = g.integers(0, GPT2_VOCAB, size=(tc.micro_batches, mc.seq_len + 1)).astype(np.uint16)
    stream = Stream(samples, tc.seed, Batching(tc.micro_batches, tc.micro_batch_size))
    trainer = Trainer(mc, tc, stream, "00" * 32)
    t0 = time.perf_counter()
    s0 = trainer.initial_state()
    init_s = time.perf_counter() - t0
    st, link, timed = s0, "00" * 32, []
    for _ in range(steps):  # consecutive steps, each from the state the last one made
        w, c = time.perf_counter(), time.process_time()
        st, rec = trainer.step(st, link, InProcess(1))
        timed.append({"wall": time.perf_counter() - w, "cpu": time.process_time() - c})
        link = rec.chain_link
    later = timed[1:] or timed  # with --steps 1 the first step is all there is
    ref = {"wall": min(t["wall"] for t in later), "cpu": min(t["cpu"] for t in later)}
    batch = stream.batch(1)
    mbs = []
    for m in range(tc.micro_batches):
        x, y = inputs_targets(batch[m : m + 1])
        mbs.append((torch.from_numpy(x.astype(np.int64)), torch.from_numpy(y.astype(np.int64))))
    tt = TorchTrainer(mc, tc)
    tt.step(mbs)
    walls, cpus = [], []
    for _ in range(2):
        w, c = time.perf_counter(), time.process_time()
        tt.step(mbs)
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    tor = {"wall": sorted(walls)[0], "cpu": sorted(cpus)[0]}
    return {
        "threads": threads,
        "refreplay": ref,
        "refreplay_steps": timed,
        "refreplay_first": timed[0],
        "torch": tor,
        "ratio_wall": ref["wall"] / tor["wall"],
        "ratio_first_wall": timed[0]["wall"] / tor["wall"],
        "predicted_s": cost.seconds,
        "calibration_s": cost.calibration_s,
        "init_s": init_s,
        "loadavg": os.getloadavg()[0],
    }


SPEEDUP_GOAL = 1.85  # issue 32: 2 threads at least this much faster than 1 for the step


def step_goal(fma_ratio: float | None) -> tuple[float | None, str]:
    """Issue 32's goal for the step's time over PyTorch's, from this CPU's
    FMA peak over its unfused peak (peak.py): at most 1.0 where the two
    peaks are equal (within 5 %), else within 1.15x of PyTorch's time
    scaled by the ratio.  (None, why) when peak.py has not measured it."""
    if fma_ratio is None:
        return None, "run peak.py first: no FMA/unfused peak ratio for this CPU"
    if 0.95 <= fma_ratio <= 1.05:
        return 1.0, f"FMA/unfused peak {fma_ratio:.2f}: equal"
    return 1.15 * fma_ratio, f"FMA/unfused peak {fma_ratio:.2f}: 1.15 x {fma_ratio:.2f}"


def cmd_step(args) -> dict:
    if args.steps < 1:
        raise SystemExit("--steps must be at least 1")
    goal, why = step_goal(read_machine_results().get("peak", {}).get("fma_ratio"))
    rows = [run_worker(Path(__file__), ["--worker-step", str(n), "--steps", str(args.steps)], n) for n in args.threads]
    print(
        "\ngpt2-124m training step (8 micro-batches x 1 x 1024 tokens, V = 50,304); refreplay: "
        + ("the best step after the first" if args.steps > 1 else "one step, cold")
        + ", torch: the best of two after a warm-up step"
    )
    print(
        table(
            ["threads", "refreplay s", "first s", "predicted s", "torch s", "ratio", "first/torch", "goal", "load"],
            [
                [
                    r["threads"],
                    f"{r['refreplay']['wall']:.1f}",
                    f"{r['refreplay_first']['wall']:.1f}",
                    f"{r['predicted_s']:.1f}",
                    f"{r['torch']['wall']:.2f}",
                    f"{r['ratio_wall']:.2f}",
                    f"{r['ratio_first_wall']:.2f}",
                    "?" if goal is None else f"<= {goal:.2f}",
                    f"{r['loadavg']:.1f}",
                ]
                for r in rows
            ],
        )
    )
    print(f"goal (issue 32): {why}")
    by = {r["threads"]: r for r in rows}
    if 1 in by and 2 in by:
        print(
            f"2-thread speed-up: refreplay {by[1]['refreplay']['wall'] / by[2]['refreplay']['wall']:.2f}x "
            f"(goal >= {SPEEDUP_GOAL}), torch {by[1]['torch']['wall'] / by[2]['torch']['wall']:.2f}x"
        )
    return {"rows": rows, "goal_ratio": goal, "goal_basis": why}


# ---- replay: the CLI on gpt2-124m ----------------------------------------------------------


def _child(argv, threads) -> dict:
    env = thread_env(threads)
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "refreplay", *argv],
        env=env,
        cwd=str(HERE.parent),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    sampler = Sampler(proc.pid)
    sampler.start()
    out, _ = proc.communicate()
    sampler.stop = True
    sampler.join()
    return {
        "argv": argv,
        "rc": proc.returncode,
        "seconds": time.perf_counter() - t0,
        "peak_anon": sampler.peak_anon,
        "vm_hwm": sampler.hwm,
        "output": out,
    }


def cmd_replay(args) -> dict:
    d = Path(tempfile.mkdtemp(prefix="bench-scale-", dir=args.dir))
    tok = _token_file(d, 8, 1024)
    budget = ["--max-memory", str(args.max_memory)] if args.max_memory else []
    rows = []
    steps = [
        (
            "train",
            [
                "train",
                "--preset",
                "gpt2-124m",
                "--tokens",
                str(tok),
                "--vocab",
                str(GPT2_VOCAB),
                "--steps",
                "1",
                "--out",
                str(d / "run"),
                "--quiet",
                *budget,
            ],
        ),
        ("estimate", ["replay", str(d / "run"), "--step", "1", "--estimate", *budget]),
        ("replay", ["replay", str(d / "run"), "--step", "1", "--quiet", *budget]),
    ]
    for name, argv in steps:
        r = _child(argv, args.threads[0])
        r["what"] = name
        print(f"\n$ refreplay {' '.join(argv)}\n{r['output'].strip()}", flush=True)
        rows.append(r)
        if r["rc"] != 0:
            break
    print(f"\ngpt2-124m, one step, {args.threads[0]} thread(s)")
    print(
        table(
            ["command", "exit", "wall s", "peak RssAnon GiB", "peak RSS (VmHWM) GiB"],
            [[r["what"], r["rc"], f"{r['seconds']:.1f}", _gib(r["peak_anon"]), _gib(r["vm_hwm"])] for r in rows],
        )
    )
    return {"rows": rows, "max_memory": args.max_memory, "threads": args.threads[0]}


# ---- billion: the 1.5 B preset under a budget ------------------------------------------------


def cmd_billion(args) -> dict:
    import numpy as np

    from refreplay.training import budget, estimate
    from refreplay.training import backend as backends
    from refreplay.training.data import Batching, Stream
    from refreplay.training.launch.inproc import InProcess
    from refreplay.training.model import init_scale, param_shapes
    from refreplay.training.presets import preset
    from refreplay.training.step import Trainer, TrainState

    sampler = Sampler(os.getpid())
    sampler.start()
    mc, tc = preset(args.preset)
    mc = dataclasses.replace(mc, seq_len=args.seq_len, vocab=50304)
    tc = dataclasses.replace(tc, micro_batches=args.micro_batches, micro_batch_size=1)
    limit = budget.parse_gib(args.max_memory)
    cost = estimate.cost(mc, tc)
    mem = budget.Memory.for_budget(limit, cost.peak_ram, args.dir)
    print("\n".join(cost.lines(limit)), flush=True)
    t0 = time.perf_counter()
    g = np.random.default_rng(0)
    samples = g.integers(0, GPT2_VOCAB, size=(tc.micro_batches, mc.seq_len + 1)).astype(np.uint16)
    stream = Stream(samples, tc.seed, Batching(tc.micro_batches, tc.micro_batch_size))
    trainer = Trainer(mc, tc, stream, "00" * 32, memory=mem)
    # [model.init.c1] as model.init_params, one tensor at a time, each into
    # its file at once (init_params would hold all 6.2 GB at the same time)
    scale, rng = init_scale(mc.init_std), backends.get("cpu").rng
    params = {}
    for k, shape in param_shapes(mc).items():
        if k.endswith(".b"):
            a = np.zeros(shape, np.float32)
        elif ".ln" in k or k.startswith("lnf."):
            a = np.ones(shape, np.float32)
        else:
            a = rng.init_uniform(tc.seed, k, shape, scale)
        params[k] = mem.keep(np.ascontiguousarray(a))
    # the moments of state 0 are zeros: np.zeros pages are not touched until
    # written (np.zeros_like, as adamw_init uses, would write 12 GB)
    m = {k: np.zeros(a.shape, np.float32) for k, a in params.items()}
    v = {k: np.zeros(a.shape, np.float32) for k, a in params.items()}
    st = TrainState(0, params, m, v, {}, trainer.data_position(0))
    init_s = time.perf_counter() - t0
    print(
        f"state 0 built in {init_s:.1f} s (parameters in {mem.files} mapped files); "
        f"peak RssAnon so far {_gib(sampler.peak_anon)} GiB",
        flush=True,
    )
    anon_before = sampler.peak_anon
    t1 = time.perf_counter()
    new, rec = trainer.step(st, "00" * 32, InProcess(1))
    step_s = time.perf_counter() - t1
    sampler.stop = True
    sampler.join()
    print(
        f"\n{args.preset} shape ({cost.params:,} parameters), T = {mc.seq_len}, M = {tc.micro_batches} x B = 1, "
        f"--max-memory {args.max_memory} GiB: tensors {'mapped' if mem.mapped else 'in RAM'}"
    )
    print(
        f"step {step_s:.1f} s (predicted {'-' if cost.seconds is None else f'{cost.seconds:.1f}'}), "
        f"loss {float(rec.loss):.4f}, state root {rec.state_root[:16]}"
    )
    print(
        f"peak RssAnon {_gib(sampler.peak_anon)} GiB (before the step {_gib(anon_before)}), "
        f"peak RSS incl. mapped pages {_gib(sampler.hwm)} GiB; predicted mapped peak "
        f"{_gib(cost.peak_mapped)} GiB, all-in-RAM {_gib(cost.peak_ram)} GiB"
    )
    return {
        "params": cost.params,
        "seq_len": mc.seq_len,
        "micro_batches": tc.micro_batches,
        "max_memory_gib": args.max_memory,
        "mapped": mem.mapped,
        "files": mem.files,
        "init_s": init_s,
        "step_s": step_s,
        "peak_anon": sampler.peak_anon,
        "vm_hwm": sampler.hwm,
        "predicted_peak_mapped": cost.peak_mapped,
        "predicted_peak_ram": cost.peak_ram,
        "state_root": rec.state_root,
        "loss": float(rec.loss),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", nargs="?", choices=("step", "replay", "billion"), default="step")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--max-memory", default=None, help="GiB (replay, billion: default 10)")
    ap.add_argument("--seq-len", type=int, default=256, help="billion: T (default 256)")
    ap.add_argument("--micro-batches", type=int, default=2, help="billion: M (default 2)")
    ap.add_argument("--preset", default="gpt2-xl", help="billion: the shape (default gpt2-xl; smaller to try)")
    ap.add_argument("--dir", default=None, help="where runs and mapped files go (default: the temp dir)")
    ap.add_argument("--steps", type=int, default=2, help="step: consecutive refreplay steps (default 2)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--worker-step", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker_step is not None:
        print(json.dumps(step_worker(args.worker_step, args.steps)))
        return 0
    print(load_line(), flush=True)
    if args.what == "billion" and args.max_memory is None:
        args.max_memory = "10"
    res = {"step": cmd_step, "replay": cmd_replay, "billion": cmd_billion}[args.what](args)
    res["machine"] = machine()
    out = write_json(f"scale-{args.what}.json", res, args.json)
    print(f"\n{load_line()}\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
