"""Cold and warm start of the CLI and of a one-step replay.

    python benchmarks/bench_start.py [--repeats 5] [--json out.json]

A one-step `tiny` run is trained first (into a temporary directory).  Then,
with REFREPLAY_CACHE_ROOT pointing at a fresh, empty temporary directory
(so Numba finds no compiled code):

* cold: ``refreplay --version`` and ``refreplay replay RUN --step 1`` once
  each -- import plus every JIT compilation the command needs;
* warm: the same two commands again ``repeats`` times each with the cache
  now populated (median), which is what a user sees from the second call on.

Each command is a fresh process; the times are wall-clock seconds of the
whole process.  Target: warm ``refreplay --version`` under 2 s.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from run_all import load_line, machine, table, thread_env, write_json  # noqa: E402


def timed(cmd, env) -> float:
    t = time.perf_counter()
    proc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    dt = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return dt


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    exe = [sys.executable, "-m", "refreplay"]
    print(load_line(), flush=True)
    tmp = Path(tempfile.mkdtemp(prefix="refreplay-bench-start-"))
    try:
        env = thread_env(1)
        run = tmp / "run"
        subprocess.run(
            exe + ["train", "--preset", "tiny", "--steps", "1", "--out", str(run), "--quiet"],
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        env = dict(env, REFREPLAY_CACHE_ROOT=str(tmp / "cache"))
        commands = {
            "refreplay --version": exe + ["--version"],
            "refreplay replay RUN --step 1 (tiny)": exe + ["replay", str(run), "--step", "1", "--quiet"],
        }
        cold = {name: timed(cmd, env) for name, cmd in commands.items()}
        warm = {}
        for name, cmd in commands.items():
            warm[name] = statistics.median(timed(cmd, env) for _ in range(args.repeats))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rows = [{"command": n, "cold_s": cold[n], "warm_s": warm[n]} for n in commands]
    print(f"\nstart-up, wall seconds of the whole process (warm: median of {args.repeats})")
    print(
        table(
            ["command", "cold (empty cache)", "warm (cache populated)", "target"],
            [
                [
                    r["command"],
                    f"{r['cold_s']:.2f}",
                    f"{r['warm_s']:.2f}",
                    "warm < 2" if "version" in r["command"] else "",
                ]
                for r in rows
            ],
        )
    )
    out = write_json(
        "start.json", {"machine": machine(), "rows": rows, "warm_cli_s": warm["refreplay --version"]}, args.json
    )
    print(f"\n{load_line()}\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
