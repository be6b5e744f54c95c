"""Threads that never fight: a training step with all thread defaults
against the best explicit thread setting, on an idle machine and beside one
competing busy process.

    python benchmarks/bench_threads.py [--models small,nanogpt-small,trainer-tiny]
                                       [--rounds N] [--steps K] [--json PATH]
    python benchmarks/bench_threads.py --models gpt2-124m --gpt2-layers 1

Models: ``small`` (2 layers, width 64, T = 32, batch 4), ``nanogpt-small``
(6 layers, width 384, 6 heads, T = 256, 8 sequences) and ``gpt2-124m``
(width 768, 12 heads, T = 1024, vocabulary 50304, batch 1, but only
``--gpt2-layers`` of its 12 layers, default 1: a whole step is too slow for
this benchmark's budget), each a forward + backward of the nanoGPT-style
model of examples/nanogpt_port through refreplay.torch; ``trainer-tiny``
is the reference trainer's own ``Trainer.step`` (preset ``tiny``, no
torch), and ``trainer-PRESET`` the same at another preset
(``trainer-gpt2-124m`` takes some 2 min a step on 2 cores: with
``--only "defaults;numba 2" --scenarios idle --rounds 1 --steps 1`` it
fits in 10 min).

Settings, each in its own worker process (thread counts are fixed when a
process starts; ``--interleaved``: all in one process, see below),
``import torch`` before refreplay as a user's script does:

* ``defaults``: nothing set;
* ``numba N, torch M``: ``NUMBA_NUM_THREADS=N``, ``REFREPLAY_THREADS=N``
  (a fixed count: no load policy) and ``torch.set_num_threads(M)``, for
  N, M in {1, 2} (the trainer: ``numba N`` only);
* extra, with ``--settings``: ``spinning``: ``OMP_WAIT_POLICY=ACTIVE``
  (OpenMP's spinning pool); ``spin N``: ``GOMP_SPINCOUNT=N`` (libgomp's
  workers spin N rounds before they sleep); ``layer L``:
  ``NUMBA_THREADING_LAYER=L``.

All workers of a model start together, build the model and warm up
(2 steps; 1 for the bigger models), then wait.  Each scenario runs ``--rounds`` rounds; in a round
every worker in turn (the order rotates) times ``--steps`` steps, so a
change of the machine's load falls on every setting alike.  ``busy`` starts
one spinning Python process (``while True: pass``, bounded by a timeout,
killed at the end of the scenario).  The table gives each setting's median
step time over all its timed steps, the load average beside it, and
defaults / best explicit setting (goal: at most 1.10), and the share of
refreplay.torch operands (trainer: of steps) that ran on 1 or 2 threads,
and of the policy's load samples (after a pause: the running count; else a
/proc/stat window) those that took a core from refreplay's kernels.

``--interleaved`` runs every setting's turns in one worker process:
refreplay's fixed count through ``set_threads`` (None for the defaults),
PyTorch's through ``torch.set_num_threads`` (its default for the
defaults), Numba launching its default count.  Only the counts differ, so
the spread between runs is smaller; short steps want long turns
(``--steps 30``): the first step after a pause is slower in every setting.
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

from run_all import cpu_model as cpu_name  # one reading of /proc/cpuinfo for every benchmark

REPO = Path(__file__).resolve().parents[1]

MODELS = {  # name: (Config kwargs, batch)
    "small": (dict(vocab=256, block=32, layers=2, heads=2, width=64), 4),
    "nanogpt-small": (dict(vocab=256, block=256, layers=6, heads=6, width=384), 8),
    "gpt2-124m": (dict(vocab=50304, block=1024, layers=1, heads=12, width=768), 1),
}
TRAINER = "trainer-"  # + a preset of the reference trainer: trainer-tiny, trainer-gpt2-124m
EXPLICIT = [(n, m) for n in (1, 2) for m in (1, 2)]
SETTLE_S = 2.0  # a pause between the workers' warm-up and the first timed turn


def settings_for(model: str, extra: list[str]) -> dict:
    """{name: (environment, torch threads or None)}."""
    out = {"defaults": ({}, None)}
    if model.startswith(TRAINER):
        out.update({f"numba {n}": ({"NUMBA_NUM_THREADS": str(n), "REFREPLAY_THREADS": str(n)}, None) for n in (1, 2)})
    else:
        out.update(
            {
                f"numba {n}, torch {m}": ({"NUMBA_NUM_THREADS": str(n), "REFREPLAY_THREADS": str(n)}, m)
                for n, m in EXPLICIT
            }
        )
    for name in extra:
        if name == "spinning":
            out[name] = ({"OMP_WAIT_POLICY": "ACTIVE"}, None)
        elif name.startswith("spin "):
            out[name] = ({"GOMP_SPINCOUNT": name.split()[1]}, None)
        elif name.startswith("layer "):
            out[name] = ({"NUMBA_THREADING_LAYER": name.split()[1]}, None)
        else:
            raise SystemExit(f"unknown extra setting {name!r}")
    return out


# --- the worker: one setting, steps on request ------------------------------


def _model_step(model: str, torch_threads: int | None, gpt2_layers: int):
    import torch

    sys.path.insert(0, str(REPO / "examples" / "nanogpt_port"))
    from model import Config, build

    if torch_threads:
        torch.set_num_threads(torch_threads)
    kw, B = MODELS[model]
    if model == "gpt2-124m":
        kw = dict(kw, layers=gpt2_layers)
    cfg = Config(**kw)
    net = build(cfg)
    if torch_threads:
        # again: Numba's OpenMP pool shares PyTorch's runtime here, and its
        # launch (the first kernel, in build) sets the pool's count to
        # NUMBA_NUM_THREADS (measured: torch 2 read 1 after it with
        # NUMBA_NUM_THREADS=1), so "numba 1, torch 2" had timed torch at 1
        torch.set_num_threads(torch_threads)
    gen = torch.Generator().manual_seed(1)
    idx = torch.randint(0, cfg.vocab, (B, cfg.block), generator=gen)
    y = torch.randint(0, cfg.vocab, (B, cfg.block), generator=gen)

    from refreplay.torch import _bridge

    real = _bridge.kernel_threads

    def counted(elements, wanted=None):  # which counts the ops ran on, for the table
        n = real(elements, wanted)
        USED[n] = USED.get(n, 0) + 1
        return n

    _bridge.kernel_threads = counted

    def step():
        net.zero_grad(set_to_none=True)
        net(idx, y).backward()

    return step


USED: dict = {}  # thread count -> operand count (refreplay.torch) or steps (trainer)


def _trainer_step(preset: str):
    from bench_step import reference_step

    run_step = reference_step(preset)[3]

    def step():
        import numba

        run_step()
        n = numba.get_num_threads()
        USED[n] = USED.get(n, 0) + 1

    return step


SAMPLES: list = []  # (stale, others, free) of each load sample the policy took in the timed steps


def _trace_samples() -> None:
    """Record each load sample: after a pause (the running count now) or
    over a /proc/stat window, what it saw and the free cores it left."""
    from refreplay import environ

    load = environ._LOAD
    refresh = load.refresh

    def traced():
        stale = load.at is None or time.monotonic() - load.at[0] > environ.STALE_S
        refresh()
        SAMPLES.append((stale, round(load.others, 3), load.free))

    load.refresh = traced


def worker(model: str, torch_threads: int | None, gpt2_layers: int, warmup: int) -> int:
    if model.startswith(TRAINER):
        step = _trainer_step(model[len(TRAINER) :])
    else:
        step = _model_step(model, torch_threads, gpt2_layers)
    _trace_samples()
    for _ in range(warmup):
        step()
    import numba

    print(json.dumps({"ready": True}), flush=True)
    torch_mod = sys.modules.get("torch")
    base = torch_mod.get_num_threads() if torch_mod else None  # PyTorch's own default here
    for line in sys.stdin:
        msg = json.loads(line)
        k = msg["steps"]
        if "fixed" in msg:  # --interleaved: this turn's setting, in this one process
            from refreplay import environ

            environ.set_threads(msg["fixed"])
            if torch_mod:
                torch_mod.set_num_threads(msg["torch"] or base)
        times = []
        USED.clear()
        SAMPLES.clear()
        for _ in range(k):
            t = time.perf_counter()
            step()
            times.append(time.perf_counter() - t)
        torch_n = sys.modules["torch"].get_num_threads() if "torch" in sys.modules else None
        from refreplay import environ

        print(
            json.dumps(
                {
                    "times": times,
                    "torch_threads": torch_n,
                    "used": USED,
                    "others": environ._LOAD.others,  # the policy's last view of other processes' load
                    "samples": SAMPLES,
                    "numba_layer": numba.threading_layer(),
                }
            ),
            flush=True,
        )
    return 0


# --- the driver -------------------------------------------------------------


class Worker:
    def __init__(self, model, env_extra, torch_threads, gpt2_layers, warmup):
        env = {
            k: v
            for k, v in os.environ.items()
            if k
            not in (
                "NUMBA_NUM_THREADS",
                "OMP_WAIT_POLICY",
                "OMP_NUM_THREADS",
                "REFREPLAY_THREADS",
                "NUMBA_THREADING_LAYER",
            )
        }
        env.update(env_extra)
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        cmd = [
            sys.executable,
            __file__,
            "--worker",
            model,
            "--torch-threads",
            str(torch_threads or 0),
            "--gpt2-layers",
            str(gpt2_layers),
            "--warmup",
            str(warmup),
        ]
        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def reply(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"a worker died (exit {self.proc.wait()}); see its stderr above")
        return json.loads(line)

    def steps(self, k: int, **setting) -> dict:
        self.proc.stdin.write(json.dumps({"steps": k, **setting}) + "\n")
        self.proc.stdin.flush()
        return self.reply()

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class _Turns:
    """One setting of ``--interleaved``: its turns run in the one shared
    worker, which sets the counts first (``set_threads`` of the fixed count
    or None for the policy, PyTorch's count or its default)."""

    def __init__(self, worker: Worker, fixed: int | None, torch_threads: int | None):
        self.worker, self.fixed, self.torch = worker, fixed, torch_threads

    def reply(self) -> dict:
        return self.worker.reply()

    def steps(self, k: int) -> dict:
        return self.worker.steps(k, fixed=self.fixed, torch=self.torch)

    def close(self):
        self.worker.close()


def spinner(seconds: float) -> subprocess.Popen:
    """One busy process, bounded by its own clock should this script die first."""
    return subprocess.Popen(
        [sys.executable, "-c", f"import time\nt = time.monotonic() + {seconds}\nwhile time.monotonic() < t: pass"]
    )


def bench_model(model, args, extra) -> list[dict]:
    settings = settings_for(model, extra)
    if args.only:
        keep = [n.strip() for n in args.only.split(";")]
        unknown = sorted(set(keep) - set(settings))
        if unknown or not any(n.startswith("numba") for n in keep):
            raise SystemExit(f"--only: {unknown or 'no explicit setting'}; settings are {sorted(settings)}")
        settings = {n: v for n, v in settings.items() if n in keep}
    warmup = 2 if model in ("small", TRAINER + "tiny") else 1
    if args.interleaved:
        if extra:
            raise SystemExit("--interleaved runs the thread counts in one process: no --settings")
        one = Worker(model, {}, None, args.gpt2_layers, warmup)
        workers = {
            name: _Turns(one, int(env["REFREPLAY_THREADS"]) if env else None, tt)
            for name, (env, tt) in settings.items()
        }
    else:
        workers = {name: Worker(model, env, tt, args.gpt2_layers, warmup) for name, (env, tt) in settings.items()}
    rows = []
    try:
        for w in {id(w.worker if isinstance(w, _Turns) else w): w for w in workers.values()}.values():
            w.reply()  # ready
        time.sleep(SETTLE_S)  # the last workers' warm-up tail is not the first timed turn's load
        names = list(workers)
        for scenario in args.scenarios.split(","):
            busy = spinner(args.timeout) if scenario == "busy" else None
            if busy is not None:
                time.sleep(1.0)
            times = {n: [] for n in names}
            loads = []
            info = {}
            used = {n: {} for n in names}
            seen = {n: [] for n in names}
            samples = {n: [] for n in names}
            try:
                for r in range(args.rounds):
                    order = names[r % len(names) :] + names[: r % len(names)]
                    for n in order:
                        loads.append(os.getloadavg()[0])
                        out = workers[n].steps(args.steps)
                        times[n] += out["times"]
                        info[n] = out
                        seen[n].append(out["others"])
                        samples[n] += out["samples"]
                        for c, k in out["used"].items():
                            used[n][c] = used[n].get(c, 0) + k
            finally:
                if busy is not None:
                    busy.kill()
                    busy.wait()
            med = {n: statistics.median(times[n]) * 1e3 for n in names}
            explicit = [n for n in names if n.startswith("numba")]
            best = min(explicit, key=med.get)
            for n in names:
                rows.append(
                    dict(
                        model=model,
                        scenario=scenario,
                        setting=n,
                        median_ms=med[n],
                        min_ms=min(times[n]) * 1e3,
                        n=len(times[n]),
                        best=best,
                        ratio_to_best=med[n] / med[best],
                        load_min=min(loads),
                        load_max=max(loads),
                        torch_threads=info[n]["torch_threads"],
                        numba_layer=info[n]["numba_layer"],
                        kernel_threads=used[n],
                        others_seen=seen[n],
                        samples=samples[n],
                    )
                )
                cores = len(os.sched_getaffinity(0))
                cut = {
                    kind: f"{sum(f < cores for st, _, f in samples[n] if st == stale)}/"
                    f"{sum(st == stale for st, _, _ in samples[n])}"
                    for kind, stale in (("paused", True), ("window", False))
                }
                share = {c: round(k / max(1, sum(used[n].values())), 2) for c, k in sorted(used[n].items())}
                print(
                    f"{model:14s} {scenario:4s} {n:18s} {med[n]:9.1f} ms (min {min(times[n]) * 1e3:8.1f}, "
                    f"n {len(times[n]):2d})  / best ({best}) {med[n] / med[best]:5.2f}  "
                    f"load {min(loads):.1f}-{max(loads):.1f}  [{info[n]['numba_layer']}; threads {share}; "
                    f"samples that took a core: {cut}]",
                    flush=True,
                )
    finally:
        for w in workers.values():
            w.close()
    return rows


def per_model(text: str):
    """ "K" or "MODEL=K,..." as a function of the model (1 where unnamed)."""
    if "=" not in text:
        return lambda model: int(text)
    table = {k.strip(): int(v) for k, v in (kv.split("=") for kv in text.split(","))}
    return lambda model: table.get(model, 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--models",
        default="small,nanogpt-small,trainer-tiny",
        help=f"comma-separated, from {', '.join(MODELS)}, {TRAINER}PRESET (the reference trainer's step)",
    )
    ap.add_argument(
        "--rounds",
        default="small=6,nanogpt-small=5,gpt2-124m=2,trainer-tiny=6",
        help="rounds per scenario: K, or MODEL=K,...",
    )
    ap.add_argument(
        "--steps",
        default="small=3,nanogpt-small=1,gpt2-124m=1,trainer-tiny=3",
        help="timed steps per worker turn: K, or MODEL=K,...",
    )
    ap.add_argument("--gpt2-layers", type=int, default=1, help="layers of the gpt2-124m shapes (of 12)")
    ap.add_argument("--settings", default="", help="extra settings, ';'-separated: spinning; layer omp; ...")
    ap.add_argument("--only", default="", help="run only these settings, ';'-separated: defaults;numba 2")
    ap.add_argument("--scenarios", default="idle,busy", help="idle, busy or both (comma-separated)")
    ap.add_argument(
        "--interleaved",
        action="store_true",
        help="every setting's turns in one process (Numba launches its default count; the fixed counts "
        "are set_threads): the same process and memory for all, so less spread between runs",
    )
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds the busy process lives at most")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--worker")
    ap.add_argument("--torch-threads", type=int, default=0)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker, args.torch_threads or None, args.gpt2_layers, args.warmup)
    steps, rounds = per_model(args.steps), per_model(args.rounds)
    extra = [s.strip() for s in args.settings.split(";") if s.strip()]
    cpu = f"{cpu_name()}, {len(os.sched_getaffinity(0))} cores"
    print(f"CPU: {cpu}; load average at start {os.getloadavg()}")
    rows = []
    t0 = time.monotonic()
    for model in args.models.split(","):
        args.steps, args.rounds = steps(model), rounds(model)
        rows += bench_model(model, args, extra)
    print(f"total {time.monotonic() - t0:.0f} s; load average at end {os.getloadavg()}")
    if args.json:
        args.json.write_text(json.dumps({"cpu": cpu, "gpt2_layers": args.gpt2_layers, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
