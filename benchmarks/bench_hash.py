"""State hashing throughput vs a plain ``hashlib.sha256`` over the same bytes.

    python benchmarks/bench_hash.py [--repeats 7] [--json out.json]

The state is the `small` preset's training state 0 (parameters and both
AdamW moments, about 38 MB).  ``refreplay.state.state_hash(tensors, threads)``
(the Merkle tree of [state.tree.c1]: 1 MiB chunk leaves, tensor and state
nodes) is timed with 1 and 2 hashing threads, alternately with one
``hashlib.sha256`` pass over the concatenated tensor bytes (one thread, the
fastest a single SHA-256 stream can go).  Ratio = sha256 time / state_hash
time, i.e. the throughput relative to hashlib (targets: >= 0.9 with one
thread, >= 1.6 with two).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from run_all import alternate, load_line, machine, table, write_json  # noqa: E402

TARGETS = {1: 0.9, 2: 1.6}


def small_state() -> dict:
    from refreplay.training.data import Batching, Stream
    from refreplay.training.presets import preset
    from refreplay.training.step import Trainer
    import numpy as np

    mc, tc = preset("small")
    samples = np.zeros((tc.micro_batches * tc.micro_batch_size, mc.seq_len + 1), np.uint8)
    tr = Trainer(mc, tc, Stream(samples, 0, Batching(tc.micro_batches, tc.micro_batch_size)), "00" * 32)
    return tr.initial_state().tensors()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    from refreplay import state as statehash

    tensors = small_state()
    nbytes = sum(a.nbytes for a in tensors.values())

    def sha():
        h = hashlib.sha256()
        for k in sorted(tensors):
            h.update(memoryview(tensors[k]).cast("B"))
        return h.digest()

    fns = {"sha256": sha}
    for t in TARGETS:
        fns[f"state_hash {t}"] = lambda t=t: statehash.state_hash(tensors, threads=t)
    print(load_line(), flush=True)
    med = alternate(fns, args.repeats, warmup=2)
    base = med["sha256"]["wall"]
    rows = []
    for t, target in TARGETS.items():
        w = med[f"state_hash {t}"]["wall"]
        rows.append(
            {
                "threads": t,
                "seconds": w,
                "sha256_seconds": base,
                "ratio": base / w,
                "mb_per_s": nbytes / w / 1e6,
                "target": target,
            }
        )
    print(
        f"\nstate hash of the small preset's state ({nbytes / 1e6:.1f} MB, {len(tensors)} tensors), "
        f"medians of {args.repeats}"
    )
    print(
        table(
            ["threads", "state_hash s", "MB/s", "sha256 s", "MB/s", "ratio", "target"],
            [
                [
                    r["threads"],
                    f"{r['seconds']:.4f}",
                    f"{r['mb_per_s']:.0f}",
                    f"{base:.4f}",
                    f"{nbytes / base / 1e6:.0f}",
                    f"{r['ratio']:.2f}",
                    f">= {r['target']}",
                ]
                for r in rows
            ],
        )
    )
    out = write_json(
        "hash.json", {"machine": machine(), "bytes": nbytes, "repeats": args.repeats, "rows": rows}, args.json
    )
    print(f"\n{load_line()}\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
