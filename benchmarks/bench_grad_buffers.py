"""The embedding backward with a new dwte per call against one reused buffer.

    python benchmarks/bench_grad_buffers.py [--threads 1 2] [--repeats 21] [--shapes gpt2-124m]
                                            [--json out.json]
    python benchmarks/bench_grad_buffers.py --model --threads 2 --repeats 3   # a whole micro-batch

Issue #32 item 4: at gpt2-124m's shapes dwte is [50,304 x 768] float32,
154 MB; a new array of that size is fresh pages from the kernel on every
call (the page faults of first touch), where a reused one (``out=``, as the
trainer's ``Model.workspace`` now passes it) is faulted in once.  For each
thread count a fresh worker (NUMBA_NUM_THREADS = N) warms both forms up and
then times them alternately; the table gives the median, the spread (min,
10th and 90th percentile, max) and the ratio fresh / reused.  The bits are
the same (tests/test_grad_buffers.py); the worker checks it once more.

``--model``: one whole micro-batch instead (``Model.loss_and_grads``,
forward and backward, at the preset's micro-batch), the model with its
workspace (logits, dlogits, the head's dx and, tied, dwte and dhead reused)
against the same model with it off (every temporary new).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from run_all import load_line, machine, run_worker, table, write_json  # noqa: E402


def worker(repeats: int, shapes: str) -> dict:
    import numpy as np

    from refreplay.ops import embedding
    from refreplay.training.presets import preset

    mc, tc = preset(shapes)
    B, T, C, V = tc.micro_batch_size, mc.seq_len, mc.width, mc.vocab
    rs = np.random.RandomState(1)
    tok = rs.randint(0, V, size=(B, T)).astype(np.int32)
    dout = (rs.standard_normal((B, T, C)) * 0.5).astype(np.float32)
    buf = np.empty((V, C), np.float32)
    fns = {
        "fresh": lambda: embedding.embedding_backward(dout, tok, V),
        "reused": lambda: embedding.embedding_backward(dout, tok, V, out=buf),
    }
    a, b = fns["fresh"](), fns["reused"]()
    if not np.array_equal(a.view(np.uint32), b.view(np.uint32)):
        raise SystemExit("fresh and reused dwte differ")
    del a, b
    for fn in fns.values():
        fn()
    times = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t = time.perf_counter()
            fn()  # the fresh result is dropped here, as the model dropped it after the sum
            times[k].append(time.perf_counter() - t)
    return {"shape": f"[{V}x{C}] <- [{B}x{T}]", "times": times, "loadavg": os.getloadavg()[0]}


def model_worker(repeats: int, shapes: str) -> dict:
    import numpy as np

    from refreplay.training.model import Model, init_params
    from refreplay.training.presets import preset

    mc, tc = preset(shapes)
    B, T, V = tc.micro_batch_size, mc.seq_len, mc.vocab
    rs = np.random.RandomState(1)
    t = rs.randint(0, V, size=(B, T + 1)).astype(np.int32)
    x, y = np.ascontiguousarray(t[:, :-1]), np.ascontiguousarray(t[:, 1:])
    params = init_params(mc, 0)
    reuse, fresh = Model(mc), Model(mc)
    fresh.workspace = None
    fns = {"fresh": lambda: fresh.loss_and_grads(params, x, y), "reused": lambda: reuse.loss_and_grads(params, x, y)}
    a, b = fns["fresh"](), fns["reused"]()
    if any(not np.array_equal(a.grads[k].view(np.uint32), b.grads[k].view(np.uint32)) for k in a.grads):
        raise SystemExit("fresh and reused gradients differ")
    del a, b
    times = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {
        "shape": f"{shapes} micro-batch B={B} T={T}",
        "times": times,
        "loadavg": os.getloadavg()[0],
        "workspace_mb": reuse.workspace.nbytes() / 1e6,
    }


def stats(ts: list[float]) -> dict:
    import numpy as np

    ms = 1e3 * np.array(ts)
    return {
        "median": float(np.median(ms)),
        "min": float(ms.min()),
        "p10": float(np.percentile(ms, 10)),
        "p90": float(np.percentile(ms, 90)),
        "max": float(ms.max()),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=21)
    ap.add_argument("--shapes", default="gpt2-124m")
    ap.add_argument("--json", default=None)
    ap.add_argument("--model", action="store_true", help="time a whole micro-batch (forward + backward)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps((model_worker if args.model else worker)(args.repeats, args.shapes)))
        return 0
    print(load_line(), flush=True)
    rows = []
    for n in args.threads:
        res = run_worker(
            Path(__file__),
            ["--worker", "--repeats", str(args.repeats), "--shapes", args.shapes] + (["--model"] if args.model else []),
            n,
        )
        for form in ("fresh", "reused"):
            rows.append(
                {
                    "threads": n,
                    "form": form,
                    "shape": res["shape"],
                    "loadavg": res["loadavg"],
                    **stats(res["times"][form]),
                }
            )
        rows[-2]["ratio"] = rows[-2]["median"] / rows[-1]["median"]
    what = "Model.loss_and_grads" if args.model else "embedding backward"
    print(f"\n{what} at the {args.shapes} preset's shapes {rows[0]['shape']}, {args.repeats} alternating repeats (ms)")
    if args.model:
        print(f"workspace held: {res['workspace_mb']:.0f} MB")
    print(
        table(
            ["threads", "form", "median", "min", "p10", "p90", "max", "fresh/reused", "load"],
            [
                [
                    r["threads"],
                    r["form"],
                    f"{r['median']:.1f}",
                    f"{r['min']:.1f}",
                    f"{r['p10']:.1f}",
                    f"{r['p90']:.1f}",
                    f"{r['max']:.1f}",
                    f"{r['ratio']:.2f}" if "ratio" in r else "",
                    f"{r['loadavg']:.1f}",
                ]
                for r in rows
            ],
        )
    )
    name = "grad-buffers-model.json" if args.model else "grad-buffers.json"
    out = write_json(name, {"machine": machine(), "repeats": args.repeats, "rows": rows}, args.json)
    print(f"\n{load_line()}\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
