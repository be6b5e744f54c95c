"""Regression check between two benchmark results, relative to each run's yardstick.

    python benchmarks/compare.py OLD.json NEW.json [--threshold 0.10]

Each file is a bench_matmul.py result (``runs[].rows[]``, each row with
``of_peak``: throughput as a fraction of that run's unfused multiply-then-add
peak, benchmarks/peak.py; at one thread ``of_peak_cpu``, from CPU time, where
present), a bench_ops.py result (``rows[]`` with
``refreplay_ms`` and a ``peak_gflops`` beside them), or a machine results
file (``results/machine-<cpu>.json``) holding either as its ``matmul`` /
``ops-*`` sections.  Rows are matched by (section, threads, case name); a
row's score is its fraction of peak (matmul) or 1 / (time x peak) (ops), so
a slower machine or a busier moment that lowers the peak as well is not
called a regression, and a faster machine does not hide one.

A row is flagged when NEW's score is below OLD's by more than ``threshold``
(default 10 %): ``new < old / (1 + threshold)``, i.e. it takes more than 10 %
longer relative to its yardstick.  Exit status: 0 none flagged, 1 at least
one flagged, 2 bad input (unreadable file, no comparable rows).
"""

from __future__ import annotations

import argparse
import json
import sys


def _rows_of(section: str, data: dict):
    """(key, score) for each comparable row of one result object."""
    if isinstance(data.get("runs"), list):  # bench_matmul
        for run in data["runs"]:
            for r in run.get("rows", []):
                if not isinstance(r, dict):
                    continue
                # one thread: the CPU-time fraction, which other processes disturb less
                v = r.get("of_peak_cpu") if run.get("threads") == 1 and "of_peak_cpu" in r else r.get("of_peak")
                if isinstance(v, (int, float)) and v > 0:
                    yield (section, run.get("threads"), r.get("name")), float(v)
    elif isinstance(data.get("rows"), list):  # bench_ops
        for r in data["rows"]:
            peak = r.get("peak_gflops", data.get("peak_gflops")) if isinstance(r, dict) else None
            ms = r.get("refreplay_ms") if isinstance(r, dict) else None
            if isinstance(peak, (int, float)) and isinstance(ms, (int, float)) and peak > 0 and ms > 0:
                yield (section, r.get("threads"), r.get("op")), 1.0 / (ms * peak)


def scores(data: dict) -> dict:
    """key -> score over a result file (a bench result, or a machine file's sections)."""
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    # a bench result is keyed like the machine file's section it would fill
    top = "matmul" if isinstance(data.get("runs"), list) else f"ops-{data.get('shapes') or 'small'}"
    out = dict(_rows_of(top, data))
    for name, section in data.items():
        if isinstance(section, dict) and (name == "matmul" or name.startswith("ops")):
            out.update(_rows_of(name, section))
    return out


def compare(old: dict, new: dict, threshold: float = 0.10) -> tuple[list[tuple], list[tuple]]:
    """(rows, flagged): each (key, old score, new score, new/old) for the rows in both."""
    so, sn = scores(old), scores(new)
    rows = [(k, so[k], sn[k], sn[k] / so[k]) for k in so if k in sn]
    flagged = [r for r in rows if r[2] < r[1] / (1 + threshold)]
    return rows, flagged


def _load(path: str) -> dict:
    try:
        with open(path, "rb") as f:
            raw = f.read(64 << 20)
        return json.loads(raw)
    except (OSError, ValueError) as e:
        raise SystemExit(f"compare.py: cannot read {path}: {e}") from None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--threshold", type=float, default=0.10, help="tolerated slowdown (default 0.10)")
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:
        return 2 if e.code else 0
    if not 0 <= args.threshold < 10:
        print("compare.py: --threshold must be in [0, 10)", file=sys.stderr)
        return 2
    try:
        old, new = _load(args.old), _load(args.new)
        rows, flagged = compare(old, new, args.threshold)
    except SystemExit as e:
        print(e, file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"compare.py: {e}", file=sys.stderr)
        return 2
    if not rows:
        print("compare.py: no rows in common with a yardstick (of_peak / peak_gflops) in both files", file=sys.stderr)
        return 2
    bad = {r[0] for r in flagged}
    print(f"{'section':12s} {'threads':>7s}  {'case':40s} {'old':>8s} {'new':>8s} {'new/old':>8s}")
    for (sec, th, name), o, n, q in sorted(rows, key=lambda r: tuple(map(str, r[0]))):
        mark = "  SLOWER" if (sec, th, name) in bad else ""
        print(f"{sec or '-':12s} {str(th):>7s}  {str(name)[:40]:40s} {o:8.4g} {n:8.4g} {q:8.3f}{mark}")
    print(f"\n{len(flagged)} of {len(rows)} rows more than {args.threshold:.0%} slower relative to the yardstick")
    return 1 if flagged else 0


if __name__ == "__main__":
    sys.exit(main())
