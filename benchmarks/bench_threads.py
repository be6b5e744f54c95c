"""Threads that never fight: a training step (forward + backward) of the
nanoGPT-style model of examples/nanogpt_port through refreplay.torch, with
all defaults and with every explicit thread setting, on the idle machine
and beside one competing busy process.

    python benchmarks/bench_threads.py [--models small,nanogpt-small] [--repeats N] [--json PATH]

Every setting runs in a fresh worker process (thread counts and the OpenMP
waiting policy are fixed when a process starts), the settings of one
scenario one after the other; "busy" starts one ``while True: pass``
process (bounded by a timeout, killed at the end of the scenario).  A
worker does 2 warm-up steps and reports the median of ``--repeats``.  The
table gives each setting's median and defaults / best.  Settings:

* ``defaults``: nothing set, ``import torch`` before refreplay (the usual
  order in a user's script);
* ``defaults, refreplay first``: ``import refreplay.torch`` before torch;
* ``numba N, torch M``: ``NUMBA_NUM_THREADS=N`` and ``torch.set_num_threads(M)``;
* ``spinning (before)``: ``OMP_WAIT_POLICY=ACTIVE``, OpenMP's own default,
  what every run got before refreplay chose the policy.
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
SETTINGS = {  # name: (environment, torch threads or None, import refreplay first)
    "defaults": ({}, None, False),
    "defaults, refreplay first": ({}, None, True),
    "numba 1, torch 1": ({"NUMBA_NUM_THREADS": "1"}, 1, False),
    "numba 2, torch 1": ({"NUMBA_NUM_THREADS": "2"}, 1, False),
    "numba 1, torch 2": ({"NUMBA_NUM_THREADS": "1"}, 2, False),
    "spinning (before)": ({"OMP_WAIT_POLICY": "ACTIVE"}, None, False),
}


def worker(model: str, torch_threads: int | None, refreplay_first: bool, repeats: int) -> dict:
    if refreplay_first:
        import refreplay.torch  # noqa: F401
    import torch

    sys.path.insert(0, str(REPO / "examples" / "nanogpt_port"))
    from model import Config, build

    if torch_threads:
        torch.set_num_threads(torch_threads)
    kw, B = MODELS[model]
    cfg = Config(**kw)
    net = build(cfg)
    gen = torch.Generator().manual_seed(1)
    idx = torch.randint(0, cfg.vocab, (B, cfg.block), generator=gen)
    y = torch.randint(0, cfg.vocab, (B, cfg.block), generator=gen)
    times = []
    for r in range(repeats + 2):
        t = time.perf_counter()
        net.zero_grad(set_to_none=True)
        net(idx, y).backward()
        if r >= 2:
            times.append(time.perf_counter() - t)
    return {"median_ms": statistics.median(times) * 1e3, "min_ms": min(times) * 1e3,
            "torch_threads": torch.get_num_threads()}


def run_setting(model, name, repeats, timeout):
    env_extra, tt, first = SETTINGS[name]
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_NUM_THREADS", "OMP_WAIT_POLICY",
                                                           "OMP_NUM_THREADS")}
    env.update(env_extra)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, __file__, "--worker", model, "--repeats", str(repeats),
           "--torch-threads", str(tt or 0)] + (["--refreplay-first"] if first else [])
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if out.returncode:
        raise SystemExit(f"worker {name} failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="small,nanogpt-small")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--settings", default=";".join(SETTINGS), help="names separated by ;")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per worker")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--worker")
    ap.add_argument("--torch-threads", type=int, default=0)
    ap.add_argument("--refreplay-first", action="store_true")
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.torch_threads or None, args.refreplay_first, args.repeats)))
        return 0
    settings = args.settings.split(";")
    rows = []
    print(f"CPU: AMD EPYC (Zen 5), {os.cpu_count()} cores; load at start {os.getloadavg()}")
    for model in args.models.split(","):
        for scenario in ("idle", "busy"):
            busy = None
            if scenario == "busy":
                # bounded by its own clock too, should this script die before killing it
                busy = subprocess.Popen([sys.executable, "-c", "import time\nt = time.monotonic() + "
                                         f"{args.timeout * len(settings)}\nwhile time.monotonic() < t: pass"])
                time.sleep(0.5)
            try:
                res = {name: run_setting(model, name, args.repeats, args.timeout) for name in settings}
            finally:
                if busy is not None:
                    busy.kill()
                    busy.wait()
            explicit = [n for n in res if n.startswith("numba")]
            best = min(explicit, key=lambda n: res[n]["median_ms"]) if explicit else None
            load = os.getloadavg()[0]
            for name, r in res.items():
                ratio = res[name]["median_ms"] / res[best]["median_ms"] if best else float("nan")
                rows.append(dict(model=model, scenario=scenario, setting=name, load=load,
                                 best=best, ratio_to_best=ratio, **r))
                print(f"{model:14s} {scenario:4s} {name:26s} {r['median_ms']:9.1f} ms  "
                      f"(min {r['min_ms']:8.1f})  / best explicit ({best}) {ratio:5.2f}   load {load:.1f}")
    if args.json:
        args.json.write_text(json.dumps({"cpu": "AMD EPYC (Zen 5), 2 cores", "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
