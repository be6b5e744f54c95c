"""Forward + backward of each transformer op: refreplay vs PyTorch CPU eager fp32.

    python benchmarks/bench_ops.py [--threads 1 2] [--repeats 7] [--json out.json]
    python benchmarks/bench_ops.py --shapes gpt2-124m --repeats 3
    python benchmarks/bench_ops.py --shapes gpt2-124m --ops gelu layernorm attention  # a subset, no JSON

Shapes are a preset's micro-batch: by default `small` (B = 4, T = 128, C = 256,
NH = 8, HS = 32, F = 1024, V = 256; N = B*T = 512 rows); with
``--shapes gpt2-124m`` B = 1, T = 1024, C = 768, NH = 12, HS = 64, F = 3072,
V = 50,304 (N = 1024 rows; the row ops that follow the matmuls at GPT-2
scale).  Each case times one forward and
its backward (refreplay: the public ``refreplay.ops`` functions, argument
checks included; PyTorch: the functional op on ``requires_grad`` leaves and
``.backward(dout)``), in a fresh worker process per thread count with
NUMBA_NUM_THREADS = OMP_NUM_THREADS = N and torch.set_num_threads(N).  Both
sides are warmed up and then timed alternately; the table gives medians and
the ratio refreplay / PyTorch (1.0 = as fast; above 1 = slower).

Beside the ratios: ``of peak``, throughput as a fraction of this machine's
unfused multiply-then-add peak (benchmarks/peak.py, measured in a fresh worker
per thread count) for the matmul-shaped ops (linear, attention; multiplies
and adds counted, the causal mask halving attention's), and each row's
``peak_gflops`` (compare.py scores every row as 1 / (time x peak)).  Full
runs also write section ``ops-<shapes>`` of results/machine-<cpu>.json.

PyTorch's attention is ``scaled_dot_product_attention(is_causal=True)``,
what a PyTorch user would call; AdamW is ``torch.optim.AdamW(foreach=True)``
over the small preset's parameter tensors, against ``optim.adamw_step``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from run_all import (  # noqa: E402
    alternate,
    load_line,
    machine,
    run_worker,
    table,
    update_machine_results,
    write_json,
)

B, T, C, NH, F, V = 4, 128, 256, 8, 1024, 256
HS, N = C // NH, B * T
SHAPES = "small"


def set_shapes(name: str) -> None:
    """Take B, T, C, NH, F, V from preset ``name`` (B: its micro-batch size)."""
    global B, T, C, NH, F, V, HS, N, SHAPES
    from refreplay.training.presets import preset

    mc, tc = preset(name)
    B, T, C, NH, F, V = tc.micro_batch_size, mc.seq_len, mc.width, mc.heads, mc.mlp_hidden, mc.vocab
    HS, N, SHAPES = C // NH, B * T, name


def cases():
    """name -> (refreplay fn, torch fn), each doing forward + backward."""
    import numpy as np
    import torch
    import torch.nn.functional as tF

    from refreplay.training.model import init_params
    from refreplay.ops import activations, attention, embedding, linear, loss, norms, optim, rope, softmax
    from refreplay.training.presets import preset
    from torch_gpt import rope as trope
    from torch_gpt import rope_tables

    rs = np.random.RandomState(1)
    f32 = lambda *s: (rs.standard_normal(s) * 0.5).astype(np.float32)  # noqa: E731
    tt = lambda a: torch.from_numpy(a.copy()).requires_grad_(True)  # noqa: E731
    eps = np.float32(1e-5)
    out = {}

    def both(fwd, bwd):
        """refreplay case: the forward, then the backward (which reads the
        forward's saved inputs, as in a training step)."""

        def run():
            fwd()
            bwd()

        return run

    def torch_case(fn, *leaves, dout=None):
        ts = [tt(a) for a in leaves]

        def run():
            for t in ts:
                t.grad = None
            y = fn(*ts)
            y.backward(torch.from_numpy(dout) if dout is not None else torch.ones_like(y))

        return run

    # linear (the qkv projection): y = x W^T; dx, dW
    x, W, dy = f32(N, C), f32(3 * C, C), f32(N, 3 * C)
    out[f"linear qkv [{N}x{C}]x[{3 * C}x{C}]^T"] = (
        both(lambda: linear.linear_forward(x, W), lambda: linear.linear_backward(dy, x, W, False)),
        torch_case(lambda a, w: tF.linear(a, w), x, W, dout=dy),
    )
    # norms
    w, b, dx = np.ones(C, np.float32), np.zeros(C, np.float32), f32(N, C)

    def ln():
        o, mu, rstd = norms.layernorm_forward(x, w, b, eps)
        norms.layernorm_backward(dx, x, w, mu, rstd)

    def rms():
        o, rr = norms.rmsnorm_forward(x, w, eps)
        norms.rmsnorm_backward(dx, x, w, rr)

    out[f"layernorm [{N}x{C}]"] = (
        ln,
        torch_case(lambda a, ww, bb: tF.layer_norm(a, (C,), ww, bb, 1e-5), x, w, b, dout=dx),
    )
    out[f"rmsnorm [{N}x{C}]"] = (rms, torch_case(lambda a, ww: tF.rms_norm(a, (C,), ww, 1e-5), x, w, dout=dx))
    # activations
    u, du, g2 = f32(N, F), f32(N, F), f32(N, F)
    out[f"gelu tanh [{N}x{F}]"] = (
        both(lambda: activations.gelu_forward(u), lambda: activations.gelu_backward(du, u)),
        torch_case(lambda a: tF.gelu(a, approximate="tanh"), u, dout=du),
    )
    out[f"swiglu [{N}x{F}]"] = (
        both(lambda: activations.swiglu_forward(u, g2), lambda: activations.swiglu_backward(du, u, g2)),
        torch_case(lambda a, bb: tF.silu(a) * bb, u, g2, dout=du),
    )
    # attention
    q, k, v, do = f32(B, NH, T, HS), f32(B, NH, T, HS), f32(B, NH, T, HS), f32(B, NH, T, HS)

    def attn():
        o, att = attention.attention_forward(q, k, v)
        attention.attention_backward(do, q, k, v, att)

    out[f"causal attention [{B}x{NH}x{T}x{HS}]"] = (
        attn,
        torch_case(lambda a, bb, c: tF.scaled_dot_product_attention(a, bb, c, is_causal=True), q, k, v, dout=do),
    )
    # the same with out and att written into reused buffers (out=), as the trainer's workspace does:
    # a fresh 48 MB att per call costs its first touch (huge-page faults and zeroing), up to 3x the
    # kernel's own time at 2 threads on a 2-vCPU host (benchmarks/README.md, session 23)
    o_buf, att_buf = np.empty_like(q), np.empty((B, NH, T, T), np.float32)

    def attn_reused():
        o, att = attention.attention_forward(q, k, v, out=(o_buf, att_buf))
        attention.attention_backward(do, q, k, v, att)

    out[f"causal attention [{B}x{NH}x{T}x{HS}], att reused"] = (
        attn_reused,
        torch_case(lambda a, bb, c: tF.scaled_dot_product_attention(a, bb, c, is_causal=True), q, k, v, dout=do),
    )
    # rope
    cos, sin = rope.rope_tables(T, HS, np.float32(10000.0))
    tcos, tsin = rope_tables(T, HS, 10000.0)
    out[f"rope [{B}x{NH}x{T}x{HS}]"] = (
        both(lambda: rope.rope_forward(q, cos, sin), lambda: rope.rope_backward(do, cos, sin)),
        torch_case(lambda a: trope(a, tcos, tsin), q, dout=do),
    )
    # softmax and cross-entropy over the vocabulary
    logits, dl = f32(N, V), f32(N, V)
    tgt = rs.randint(0, V, size=N).astype(np.int32)
    ttgt = torch.from_numpy(tgt.astype(np.int64))

    def sm():
        y = softmax.softmax_forward(logits)
        softmax.softmax_backward(dl, y)

    def ce():
        loss.cross_entropy_forward(logits, tgt)
        loss.cross_entropy_backward(logits, tgt)

    out[f"softmax [{N}x{V}]"] = (sm, torch_case(lambda a: torch.softmax(a, -1), logits, dout=dl))
    out[f"cross-entropy [{N}x{V}]"] = (
        ce,
        torch_case(lambda a: tF.cross_entropy(a, ttgt), logits, dout=np.array(1, np.float32)),
    )
    # embedding
    wte, tok, demb = f32(V, C), rs.randint(0, V, size=(B, T)).astype(np.int32), f32(B, T, C)
    ttok = torch.from_numpy(tok.astype(np.int64))
    out[f"embedding [{V}x{C}] <- [{B}x{T}]"] = (
        both(lambda: embedding.embedding_forward(wte, tok), lambda: embedding.embedding_backward(demb, tok, V)),
        torch_case(lambda ww: tF.embedding(ttok, ww), wte, dout=demb),
    )
    # the same with dwte written into one reused [V, C] buffer (out=), as the trainer does (issue #32)
    dwte_buf = np.empty((V, C), np.float32)
    out[f"embedding [{V}x{C}] <- [{B}x{T}], dwte reused"] = (
        both(
            lambda: embedding.embedding_forward(wte, tok),
            lambda: embedding.embedding_backward(demb, tok, V, out=dwte_buf),
        ),
        torch_case(lambda ww: tF.embedding(ttok, ww), wte, dout=demb),
    )
    # AdamW over the preset's parameters
    mc, _ = preset(SHAPES)
    params = init_params(mc, 0)
    grads = {n: (rs.standard_normal(a.shape) * 1e-3).astype(np.float32) for n, a in params.items()}
    m, vv = optim.adamw_init(params)
    no_decay = frozenset(n for n, a in params.items() if a.ndim == 1)
    tparams = [torch.from_numpy(params[n].copy()).requires_grad_(True) for n in sorted(params)]
    for p, n in zip(tparams, sorted(params)):
        p.grad = torch.from_numpy(grads[n])
    topt = torch.optim.AdamW(tparams, lr=1e-3, foreach=True)
    out[f"adamw ({sum(a.size for a in params.values()) / 1e6:.1f}M params)"] = (
        lambda: optim.adamw_step(
            params, grads, m, vv, step=1, lr=np.float32(1e-3), hp=optim.AdamW(), no_decay=no_decay
        ),
        topt.step,
    )
    return out


def flops(name: str) -> float | None:
    """Multiplies + adds of one forward + backward of the matmul-shaped cases
    (linear: 3 products of N x C x 3C; causal attention: 6 products of
    T x T x HS per head, halved by the mask), None for the others."""
    if name.startswith("linear qkv"):
        return 3 * 2.0 * N * C * 3 * C
    if name.startswith("causal attention"):
        return 6 * 2.0 * B * NH * T * T * HS / 2
    return None


def peak(threads: int) -> float:
    """The unfused multiply-then-add peak (GF/s) at ``threads``: threads x one
    core's, measured now in a fresh 1-thread worker (peak.py, ``yardstick``)."""
    res = run_worker(HERE / "peak.py", ["--worker-json"], 1)
    if not res["check"]["ok"]:
        raise SystemExit(f"the yardstick kernel failed its check: {res['check']}")
    return threads * res["runs"][0]["gflops"]


def worker(threads: int, repeats: int, shapes: str, ops: list[str] | None = None) -> dict:
    import torch

    torch.set_num_threads(threads)
    set_shapes(shapes)
    rows = []
    for name, (ref, tor) in cases().items():
        if ops and not any(o in name for o in ops):
            continue
        med = alternate({"refreplay": ref, "torch": tor}, repeats, warmup=2)
        rows.append(
            {
                "op": name,
                "threads": threads,
                "refreplay_ms": 1e3 * med["refreplay"]["wall"],
                "torch_ms": 1e3 * med["torch"]["wall"],
                "ratio_wall": med["refreplay"]["wall"] / med["torch"]["wall"],
                "ratio_cpu": med["refreplay"]["cpu"] / max(med["torch"]["cpu"], 1e-9),
            }
        )
    return {"rows": rows, "loadavg": os.getloadavg()[0]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--shapes",
        default="small",
        choices=("small", "gpt2-124m"),
        help="whose micro-batch shapes to time (default small)",
    )
    ap.add_argument(
        "--ops",
        nargs="+",
        default=None,
        metavar="SUBSTRING",
        help="time only the ops whose name contains one of these (the results file is then written only with --json)",
    )
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker is not None:
        print(json.dumps(worker(args.worker, args.repeats, args.shapes, args.ops)))
        return 0
    print(load_line(), flush=True)
    set_shapes(args.shapes)  # flops() counts with the shapes the workers time
    rows = []
    for n in args.threads:
        res = run_worker(
            Path(__file__),
            ["--worker", str(n), "--repeats", str(args.repeats), "--shapes", args.shapes]
            + (["--ops", *args.ops] if args.ops else []),
            n,
        )
        gf = peak(n)
        for r in res["rows"]:
            r["loadavg"] = res["loadavg"]
            r["peak_gflops"] = gf
            f = flops(r["op"])
            r["of_peak"] = f / (r["refreplay_ms"] * 1e-3) / 1e9 / gf if f else None
            r["torch_of_peak"] = f / (r["torch_ms"] * 1e-3) / 1e9 / gf if f else None
        rows += res["rows"]
    print(f"\nforward + backward at the {args.shapes} preset's shapes, medians of {args.repeats} (ms)")
    print(
        "of peak: throughput (counted multiplies and adds) as a fraction of the unfused mul+add peak "
        "(peak.py, GF/s in 'peak'), for the matmul-shaped ops; torch's beside it"
    )
    print(
        table(
            [
                "op",
                "threads",
                "refreplay ms",
                "torch ms",
                "ratio wall",
                "ratio cpu",
                "of peak",
                "torch of peak",
                "peak",
                "load",
            ],
            [
                [
                    r["op"],
                    r["threads"],
                    f"{r['refreplay_ms']:.2f}",
                    f"{r['torch_ms']:.2f}",
                    f"{r['ratio_wall']:.2f}",
                    f"{r['ratio_cpu']:.2f}",
                    f"{r['of_peak']:.2f}" if r["of_peak"] else "-",
                    f"{r['torch_of_peak']:.2f}" if r["torch_of_peak"] else "-",
                    f"{r['peak_gflops']:.0f}",
                    f"{r['loadavg']:.1f}",
                ]
                for r in rows
            ],
        )
    )
    if args.ops and not args.json:  # a subset must not replace the full results file
        print(f"\n{load_line()}")
        return 0
    name = "ops.json" if args.shapes == "small" else f"ops-{args.shapes}.json"
    payload = {"machine": machine(), "repeats": args.repeats, "shapes": args.shapes, "rows": rows}
    out = write_json(name, payload, args.json)
    print(f"\n{load_line()}\nwrote {out}")
    if not args.json:
        print(f"wrote {update_machine_results(f'ops-{args.shapes}', payload)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
