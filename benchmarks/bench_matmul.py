"""Fixed-order fp32 matmul vs NumPy/OpenBLAS, side by side in one run.

    python benchmarks/bench_matmul.py [--threads 1 2] [--repeats 7] [--json out.json]

For each thread count fresh worker processes are started with
OPENBLAS_NUM_THREADS = NUMBA_NUM_THREADS = N (both libraries read them at
load time).  OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE, which this project's
machines may set to keep an old OpenBLAS from crashing, are removed together
from the worker's environment only, so that OpenBLAS picks its own kernel; the
table reports which one it ran.  Every case is warmed up (JIT and caches),
then timed `repeats` times.

With one thread, NumPy and refreplay are timed alternately in one worker, so
that load from other processes hits both alike.  With more threads they are
timed in separate workers, alternating worker by worker (refreplay, NumPy,
refreplay, NumPy; medians over both rounds): in one process, Numba's OpenMP
workers and OpenBLAS's threads each spin for a while after their own
parallel region and take the cores the other library's next call waits for
(measured on 2 cores: A·B at 512x256x768 took 14.9 ms alternating in one
process and 1.30 ms alone).  ``--same-process`` restores one worker.

The table shows medians of wall time and the throughput ratio refreplay /
NumPy (1.0 = as fast as OpenBLAS), and the same ratio from process CPU
time, which a busy shared machine disturbs less (for one thread it is the
time the core actually worked).  ``of peak`` (``of peak cpu``, from CPU time) is refreplay's throughput as a
fraction of this machine's unfused multiply-then-add peak (``peak.py``,
measured in a fresh worker with the same thread count just before the
cases): the yardstick that means the same on every CPU, where the ratio to an
FMA BLAS does not.

refreplay is called as its users call it, through ``refreplay.linalg``'s
API (``matmul``, ``matmul_nt``, ``matmul_tn`` with ``out=``), which hands
the kernel this thread's reused scratch for its packs and the running
thread count, as NumPy is called through ``np.matmul(..., out=)``.  (Until
session 29 the table timed the compiled kernel with neither: its packs
were allocated on every call and paid a page fault per 4 KiB wherever the
allocator mapped them anew, which no user call does since session 28.)
It runs with the block sizes ``refreplay.linalg.blocking`` derives from
this machine's caches (printed), or with ``--blocks KC B_CACHED B_BLOCK``.
Results go to ``--json`` (default benchmarks/results/matmul.json) and, as
section ``matmul``, into this CPU kind's file ``results/machine-<cpu>.json``.
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

from run_all import cpu_model  # one reading of /proc/cpuinfo for every benchmark

REPO = Path(__file__).resolve().parent.parent
DEFAULT_JSON = REPO / "benchmarks" / "results" / "matmul.json"

# (name, form, I, K, J): form nn = A·B, nt = A·Bᵀ, tn = Aᵀ·B; C is I×J.
CASES = [
    ("square 256", "nn", 256, 256, 256),
    ("square 512", "nn", 512, 512, 512),
    ("square 1024", "nn", 1024, 1024, 1024),
    ("1024x256 . 256x1024", "nn", 1024, 256, 1024),
    ("1024x256 . 256x768", "nn", 1024, 256, 768),
    ("small qkv fwd", "nn", 512, 256, 768),
    ("small mlp up fwd", "nn", 512, 256, 1024),
    ("small mlp down fwd", "nn", 512, 1024, 256),
    ("small mlp up dX (A.Bt)", "nt", 512, 1024, 256),
    ("small mlp up dW (At.B)", "tn", 256, 512, 1024),
    ("square 256 A.Bt", "nt", 256, 256, 256),
    ("square 256 At.B", "tn", 256, 256, 256),
    ("square 512 A.Bt", "nt", 512, 512, 512),
    ("square 512 At.B", "tn", 512, 512, 512),
    ("square 1024 A.Bt", "nt", 1024, 1024, 1024),
    ("square 1024 At.B", "tn", 1024, 1024, 1024),
]


def openblas_kernel() -> str:
    """Which OpenBLAS build and core kernel NumPy is using."""
    try:
        from threadpoolctl import threadpool_info

        for info in threadpool_info():
            if info.get("internal_api") == "openblas":
                return f"{info.get('version')} {info.get('architecture')} ({info.get('filepath')})"
    except ImportError:
        pass
    import ctypes
    import glob
    import numpy as np

    for so in glob.glob(os.path.join(os.path.dirname(np.__file__), "..", "numpy.libs", "*openblas*.so*")):
        lib = ctypes.CDLL(so)
        for prefix in ("scipy_openblas_", "openblas_"):
            for suffix in ("64_", ""):
                core = getattr(lib, f"{prefix}get_corename{suffix}", None)
                conf = getattr(lib, f"{prefix}get_config{suffix}", None)
                if core is not None and conf is not None:
                    core.restype = conf.restype = ctypes.c_char_p
                    return f"{conf().decode()} (core {core().decode()})"
    return "unknown (threadpoolctl not installed and no OpenBLAS symbols found)"


def worker(repeats: int, only: str, side: str, blocks: list[int] | None = None) -> dict:
    """Time the cases; ``side``: "both" (alternately), "ours" or "blas" alone.
    Returns every sample (wall and process CPU seconds) per case and side."""
    import numpy as np
    from refreplay import linalg as L
    from refreplay.linalg.blocking import Blocks, machine_blocks
    from refreplay.numerics import load

    blk = Blocks(*blocks) if blocks else machine_blocks()
    rng = np.random.default_rng(0)
    rows = []
    for name, form, I, K, J in CASES:
        if only not in name:
            continue
        a_shape = (K, I) if form == "tn" else (I, K)
        b_shape = (J, K) if form == "nt" else (K, J)
        A = load(rng.standard_normal(a_shape).astype(np.float32))
        B = load(rng.standard_normal(b_shape).astype(np.float32))
        C = np.empty((I, J), np.float32)
        mm = {"nn": L.matmul, "nt": L.matmul_nt, "tn": L.matmul_tn}[form]
        fns = {
            "ours": lambda: mm(A, B, out=C, blocks=blk),
            "blas": {
                "nn": lambda: np.matmul(A, B, out=C),
                "nt": lambda: np.matmul(A, B.T, out=C),
                "tn": lambda: np.matmul(A.T, B, out=C),
            }[form],
        }
        if side != "both":
            fns = {side: fns[side]}
        for _ in range(2):  # warm-up: JIT, page faults, caches
            for fn in fns.values():
                fn()
        samples = {k: ([], []) for k in fns}
        for _ in range(repeats):
            for k, fn in fns.items():
                c0, t0 = time.process_time(), time.perf_counter()
                fn()
                samples[k][0].append(time.perf_counter() - t0)
                samples[k][1].append(time.process_time() - c0)
        rows.append(dict(name=name, form=form, I=I, K=K, J=J, samples=samples))
    return dict(
        threads=int(os.environ["NUMBA_NUM_THREADS"]),
        openblas=openblas_kernel(),
        numpy=np.__version__,
        rows=rows,
        blocks=vars(blk),
    )


def _env(threads: int) -> dict:
    env = dict(
        os.environ, OPENBLAS_NUM_THREADS=str(threads), NUMBA_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads)
    )
    env.pop("OPENBLAS_CORETYPE", None)  # removed together: let OpenBLAS choose its kernel
    env.pop("OPENBLAS_L2_SIZE", None)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return env


def peak(threads: int) -> float:
    """This machine's unfused multiply-then-add peak (GF/s) at ``threads``:
    ``threads`` x one core's, measured now in a fresh 1-thread worker
    (benchmarks/peak.py, ``yardstick``); exits if its check fails."""
    out = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "peak.py"), "--worker-json"],
        env=_env(1),
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        sys.exit(f"peak worker ({threads} threads) failed:\n{out.stderr}")
    res = json.loads(out.stdout.strip().splitlines()[-1])
    if not res["check"]["ok"]:
        sys.exit(f"the yardstick kernel failed its check (fused or wrong bits): {res['check']}")
    return threads * res["runs"][0]["gflops"]


def run_worker(threads: int, repeats: int, only: str, side: str = "both", blocks=None) -> dict:
    env = _env(threads)
    extra = ["--blocks", *map(str, blocks)] if blocks else []
    out = subprocess.run(
        [sys.executable, __file__, "--worker", "--repeats", str(repeats), "--only", only, "--side", side, *extra],
        env=env,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        sys.exit(f"benchmark worker ({threads} threads) failed:\n{out.stderr}")
    return json.loads(out.stdout)


def measure(threads: int, repeats: int, only: str, same_process: bool, blocks=None) -> dict:
    """One table's rows: medians per case, from one worker or from separate ones."""
    gf_peak = peak(threads)
    if threads == 1 or same_process:
        parts = [run_worker(threads, repeats, only, blocks=blocks)]
    else:
        parts = [run_worker(threads, repeats, only, side, blocks) for _ in range(2) for side in ("ours", "blas")]
    base = parts[0]
    rows = []
    for i, r in enumerate(base["rows"]):
        pooled = {"ours": ([], []), "blas": ([], [])}
        for part in parts:
            for k, (wall, cpu) in part["rows"][i]["samples"].items():
                pooled[k][0].extend(wall)
                pooled[k][1].extend(cpu)
        m_ours, m_blas = statistics.median(pooled["ours"][0]), statistics.median(pooled["blas"][0])
        flop = 2.0 * r["I"] * r["J"] * r["K"]
        rows.append(
            dict(
                name=r["name"],
                form=r["form"],
                I=r["I"],
                K=r["K"],
                J=r["J"],
                refreplay_ms=m_ours * 1e3,
                numpy_ms=m_blas * 1e3,
                refreplay_gflops=flop / m_ours / 1e9,
                numpy_gflops=flop / m_blas / 1e9,
                ratio=m_blas / m_ours,
                of_peak=flop / m_ours / 1e9 / gf_peak,
                of_peak_cpu=flop / statistics.median(pooled["ours"][1]) / 1e9 / gf_peak,
                numpy_of_peak=flop / m_blas / 1e9 / gf_peak,
                ratio_cpu=statistics.median(pooled["blas"][1]) / statistics.median(pooled["ours"][1]),
            )
        )
    mode = "one process, alternating" if len(parts) == 1 else "separate processes, 2 rounds"
    return dict(
        threads=threads,
        openblas=base["openblas"],
        numpy=base["numpy"],
        mode=mode,
        rows=rows,
        peak_gflops=gf_peak,
        blocks=base["blocks"],
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--json", default=str(DEFAULT_JSON), help="where to write the results")
    p.add_argument("--only", default="", help="run only the cases whose name contains this text")
    p.add_argument(
        "--same-process",
        action="store_true",
        help="with several threads, time both libraries alternately in one process",
    )
    p.add_argument(
        "--blocks",
        type=int,
        nargs=3,
        metavar=("KC", "B_CACHED", "B_BLOCK"),
        default=None,
        help="run refreplay with these block sizes instead of the machine's (blocking.py)",
    )
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--side", default="both", choices=("both", "ours", "blas"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.repeats, args.only, args.side, args.blocks)))
        return 0
    load_start = os.getloadavg()
    runs = [measure(t, args.repeats, args.only, args.same_process, args.blocks) for t in args.threads]
    print(
        f"machine: {cpu_model()}, {os.cpu_count()} CPUs; 1-minute load average at the start "
        f"{load_start[0]:.1f}, at the end {os.getloadavg()[0]:.1f}"
    )
    for run in runs:
        print(f"\nthreads = {run['threads']} ({run['mode']})   NumPy {run['numpy']}, OpenBLAS {run['openblas']}")
        print(
            f"unfused mul+add peak (peak.py) {run['peak_gflops']:.1f} GF/s; blocks {run['blocks']}"
            + (
                "; 'of peak cpu' uses the CPU-time median (1 thread: the time the core worked)"
                if run["threads"] == 1
                else ""
            )
        )
        print(
            f"{'case':26s} {'form':4s} {'I x K x J':>16s} {'refreplay ms':>13s} {'numpy ms':>9s} "
            f"{'GF/s ours':>9s} {'GF/s numpy':>10s} {'ratio':>6s} {'ratio(cpu)':>10s} {'of peak':>7s} "
            f"{'numpy of peak':>13s} {'of peak cpu':>11s}"
        )
        for r in run["rows"]:
            print(
                f"{r['name']:26s} {r['form']:4s} {r['I']:>5d}x{r['K']:>4d}x{r['J']:>5d} "
                f"{r['refreplay_ms']:13.2f} {r['numpy_ms']:9.2f} {r['refreplay_gflops']:9.1f} "
                f"{r['numpy_gflops']:10.1f} {r['ratio']:6.2f} {r['ratio_cpu']:10.2f} {r['of_peak']:7.2f} "
                f"{r['numpy_of_peak']:13.2f} {r['of_peak_cpu']:11.2f}"
            )
    payload = dict(cpu=cpu_model(), load_average=os.getloadavg(), load_average_start=load_start, runs=runs)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=1) + "\n")
    print(f"\nwrote {out}")
    if not args.only and not args.blocks and Path(args.json).resolve() == DEFAULT_JSON.resolve():
        sys.path.insert(0, str(REPO / "benchmarks"))
        from run_all import update_machine_results

        print(f"wrote {update_machine_results('matmul', payload)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
