"""Run every training-side benchmark and print one summary against the targets.

    python benchmarks/run_all.py [--quick]

Runs, each as its own process (so each starts with its own thread settings):
bench_ops.py, bench_step.py, bench_hash.py, bench_memory.py, bench_start.py,
then reads their JSON from benchmarks/results/ and prints one table: each
measured ratio against its target (issue 8).  ``--quick`` passes fewer
repeats to each.  The matmul benchmark (bench_matmul.py) is run separately by
its owner; its JSON is summarised here when present.

This module also holds the small helpers the bench_*.py scripts share
(timing, worker processes, machine description, JSON output).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results"


# ---- shared helpers ---------------------------------------------------------------------


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict:
    """What the numbers were measured on, and how busy it was."""
    la = os.getloadavg()
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "loadavg_1_5_15": [round(x, 2) for x in la],
        "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


_ISA = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "asimd",
    "sve",
    "sve2",
)


def _cpuinfo() -> dict:
    """The first processor's fields of /proc/cpuinfo (empty where there is none)."""
    info = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if not line.strip():
                break
            k, _, v = line.partition(":")
            info[k.strip()] = v.strip()
    except OSError:
        pass
    return info


def machine_info() -> dict:
    """CPU model, vendor/family/model, the SIMD flags that matter, the caches
    the process sees (sysfs) and the matmul blocks derived from them."""
    from refreplay.linalg import blocking

    ci = _cpuinfo()
    flags = set((ci.get("flags") or ci.get("Features") or "").split())
    caches = {}
    root = Path(blocking.SYSFS)
    for d in sorted(root.glob("index*")) if root.is_dir() else []:
        try:
            lv, kind, size = ((d / n).read_text().strip() for n in ("level", "type", "size"))
            shared = (d / "shared_cpu_list").read_text().strip() if (d / "shared_cpu_list").exists() else ""
        except OSError:
            continue
        caches[f"L{lv}{'d' if kind == 'Data' else 'i' if kind == 'Instruction' else ''}"] = dict(
            size=size, shared_cpu_list=shared
        )
    c = blocking.machine_caches()
    return {
        "cpu": cpu_model(),
        "vendor": ci.get("vendor_id", ""),
        "family": ci.get("cpu family", ""),
        "model": ci.get("model", ""),
        "isa": [f for f in _ISA if f in flags],
        "caches": caches,
        "blocks": dict(vars(blocking.blocks_for(c)), from_caches=dict(vars(c))),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
    }


def machine_slug() -> str:
    """A file name for this CPU kind: model name, vendor family and model number."""
    ci = _cpuinfo()
    parts = [
        cpu_model(),
        f"f{ci['cpu family']}" if "cpu family" in ci else "",
        f"m{ci['model']}" if ci.get("model", "").isdigit() else "",
    ]
    slug = "-".join(p for p in parts if p).lower()
    return re.sub(r"[^a-z0-9]+", "-", slug).strip("-")[:80] or "unknown-cpu"


def machine_results_path() -> Path:
    """benchmarks/results/machine-<cpu>.json: every figure of this CPU kind in one
    file, so that runs on different CPUs never overwrite each other's."""
    return RESULTS / f"machine-{machine_slug()}.json"


def read_machine_results(path: Path | None = None) -> dict:
    p = path or machine_results_path()
    return json.loads(p.read_text()) if p.exists() else {}


def update_machine_results(section: str, payload: dict, path: Path | None = None) -> Path:
    """Replace one section (``peak``, ``matmul-1t``, ``ops-small``, ...) of this
    machine's results file, keeping the others; each section carries its own
    time and load average."""
    p = path or machine_results_path()
    data = read_machine_results(p)
    data["machine"] = machine_info()
    data[section] = dict(
        payload,
        utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        loadavg_1_5_15=[round(x, 2) for x in os.getloadavg()],
    )
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return p


def load_line() -> str:
    la = os.getloadavg()
    return f"load average {la[0]:.2f} {la[1]:.2f} {la[2]:.2f} on {os.cpu_count()} cores ({cpu_model()})"


def thread_env(threads: int) -> dict:
    """Environment of a worker process pinned to ``threads`` threads in every
    library (Numba, OpenMP, OpenBLAS, MKL; PyTorch reads OMP_NUM_THREADS)."""
    env = dict(os.environ)
    for k in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[k] = str(threads)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(HERE), env.get("PYTHONPATH", "")])
    return env


def run_worker(script: Path, args: list[str], threads: int, timeout: float = 3600) -> dict:
    """Run ``script --worker ...`` with ``threads`` threads; its last stdout
    line is a JSON object, which is returned.  Its stderr passes through."""
    cmd = [sys.executable, str(script), *args]
    proc = subprocess.run(cmd, env=thread_env(threads), stdout=subprocess.PIPE, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{script.name} worker ({threads} threads) failed with {proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


class Clock:
    """Wall and process-CPU time of one timed call."""

    def __init__(self):
        self.wall, self.cpu = [], []

    def time(self, fn, *a):
        w, c = time.perf_counter(), time.process_time()
        out = fn(*a)
        self.cpu.append(time.process_time() - c)
        self.wall.append(time.perf_counter() - w)
        return out

    def median(self) -> tuple[float, float]:
        return statistics.median(self.wall), statistics.median(self.cpu)


def alternate(pairs: dict, repeats: int, warmup: int = 1) -> dict:
    """Time each callable of ``pairs`` (name -> fn) ``repeats`` times after
    ``warmup`` calls, interleaved (a, b, a, b, ...) so that load from other
    processes hits all alike.  Returns name -> {"wall": median s, "cpu": median s}."""
    for fn in pairs.values():
        for _ in range(warmup):
            fn()
    clocks = {k: Clock() for k in pairs}
    for _ in range(repeats):
        for k, fn in pairs.items():
            clocks[k].time(fn)
    return {k: dict(zip(("wall", "cpu"), c.median())) for k, c in clocks.items()}


def write_json(name: str, payload: dict, path: str | None = None) -> Path:
    out = Path(path) if path else RESULTS / name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=1, sort_keys=True) + "\n")
    return out


def table(headers: list[str], rows: list[list]) -> str:
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.rjust(w) if j else c.ljust(w) for j, (c, w) in enumerate(zip(r, widths))) for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


# ---- the summary ------------------------------------------------------------------------


def _read(name):
    p = RESULTS / name
    return json.loads(p.read_text()) if p.exists() else None


def summary_rows() -> list[list]:
    rows = []
    mm = _read("matmul.json")
    if mm:  # bench_matmul.py's format: runs[threads].rows[case]
        for run in mm.get("runs", []):
            for r in run.get("rows", []):
                if r.get("name") == "square 1024" and run.get("threads") == 1:
                    ratio = r["ratio"]
                    rows.append(
                        [
                            "matmul 1024, 1 thread (x OpenBLAS throughput; bench_matmul.py)",
                            f"{ratio:.2f}",
                            ">= 0.5",
                            "yes" if ratio >= 0.5 else "no",
                        ]
                    )
    pk = read_machine_results().get("peak")
    for th, gf in sorted((pk or {}).get("yardstick", {}).items()):
        rows.append([f"unfused mul+add yardstick, {th} thread(s) (GF/s; peak.py)", f"{gf:.1f}", "", ""])
    mf = read_machine_results().get("matmul")
    for run in (mf or {}).get("runs", []):
        fr = [r["of_peak"] for r in run.get("rows", []) if "of_peak" in r]
        if fr:
            rows.append(
                [
                    f"matmul, {run['threads']} thread(s): min / median fraction of peak",
                    f"{min(fr):.2f} / {statistics.median(fr):.2f}",
                    ">= 0.85 (issue 32)",
                    "yes" if min(fr) >= 0.85 else "no",
                ]
            )
    st = _read("step.json")
    if st:
        for r in st["rows"]:
            ratio = r["ratio_wall"]
            rows.append(
                [
                    f"small step, {r['threads']} thread(s) (refreplay / torch time)",
                    f"{ratio:.2f}",
                    "<= 2",
                    "yes" if ratio <= 2 else "no",
                ]
            )
    hs = _read("hash.json")
    if hs:
        for r in hs["rows"]:
            target = 0.9 if r["threads"] == 1 else 1.6
            rows.append(
                [
                    f"state hash, {r['threads']} thread(s) (x hashlib.sha256)",
                    f"{r['ratio']:.2f}",
                    f">= {target}",
                    "yes" if r["ratio"] >= target else "no",
                ]
            )
    me = _read("memory.json")
    if me:
        rows.append(
            [
                "replay peak memory M=4/16/64 (MiB)",
                " / ".join(f"{r['peak_mib']:.0f}" for r in me["rows"]),
                "grows ~ log M",
                "yes" if me["log_growth"] else "no",
            ]
        )
    sa = _read("start.json")
    if sa:
        w = sa["warm_cli_s"]
        rows.append(["warm `refreplay --version` (s)", f"{w:.2f}", "< 2", "yes" if w < 2 else "no"])
    op = _read("ops.json")
    if op:
        for th in sorted({r["threads"] for r in op["rows"]}):
            rs = [r["ratio_wall"] for r in op["rows"] if r["threads"] == th]
            rows.append(
                [
                    f"ops fwd+bwd, {th} thread(s): median ratio (refreplay / torch)",
                    f"{statistics.median(rs):.2f}",
                    "(no target)",
                    "",
                ]
            )
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats")
    ap.add_argument("--only", nargs="*", default=None, help="run only these (ops step hash memory start)")
    args = ap.parse_args(argv)
    names = args.only or ["ops", "step", "hash", "memory", "start"]
    print(load_line(), flush=True)
    print("\n===== peak.py (the yardstick) =====", flush=True)
    if subprocess.run([sys.executable, str(HERE / "peak.py")]).returncode != 0:
        print("peak.py failed: the yardstick kernel's check or run")
    for name in names:
        extra = ["--repeats", "2"] if args.quick else []
        print(f"\n===== bench_{name}.py =====", flush=True)
        rc = subprocess.run([sys.executable, str(HERE / f"bench_{name}.py"), *extra]).returncode
        if rc != 0:
            print(f"bench_{name}.py failed with exit status {rc}")
    print("\n===== summary against the targets of issue 8 =====")
    print(load_line())
    print(table(["measure", "measured", "target", "met"], summary_rows()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
