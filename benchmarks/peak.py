"""The yardstick: this machine's peak for unfused multiply-then-add chains.

    python benchmarks/peak.py [--threads 1 2] [--repeats 7]

The fp32 kernels may never fuse a multiply and an add ([num.fma.c1]: each is
rounded on its own), so their honest ceiling is not an FMA BLAS's but the
rate at which this core can issue a separate vector multiply and vector add.
On an AMD Zen core the multiply and the add go to different pipes and an
unfused kernel can match a fused one's rate of useful work; on an Intel core
with AVX-512 both occupy the two FMA ports, and the ceiling is about half.
Ratios to OpenBLAS therefore mean different things on different CPUs; the
fraction of this peak does not.

The kernel: NACC independent accumulators of one 512-bit vector each (16
float32 lanes), each with its own multiplier vector held in a register; per
step k every accumulator does ``acc = acc + x * v_k``: an LLVM ``fmul`` then
an ``fadd`` with no fast-math flags, so LLVM may neither contract them into
a fused multiply-add nor reorder anything.  v_k is measured two ways, and
the peak is the faster: a vector of 16 floats loaded from b[] (``vector``),
or one float b[k] broadcast to all lanes (``broadcast``, as the matmul's
tile multiplies).  On AMD Zen 4 a broadcast from memory takes a slot of the
vector pipes the multiplies and adds need: the broadcast chains ran 97 GF/s
a thread, the vector ones 111.5 (2026-12-07), so a yardstick with the
broadcast alone understated that core's peak by an eighth.  (It is
written as vector IR, like ``refreplay/linalg/_tile.py``, because Numba's
auto-vectoriser cannot keep accumulators in registers; it is the same kind
of code the matmul runs.)  Threads run separate copies
(a ``prange`` over independent work).

``check()`` proves the measured code is what it claims: its results equal,
bit for bit, a NumPy float32 loop that multiplies and then adds (NumPy never
fuses), the fused result differs from that in many lanes (so the comparison
would catch a contraction), and the compiled code contains no FMA
instruction.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

LANES = 16
NACC = 12  # 12 accumulators + 12 multipliers + v_k: 25 of 32 vector registers
N_B = 1024  # b[] stays in L1


def _build(fused: bool = False, vector: bool = True):
    import numba
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    f32 = ir.FloatType()
    vf = ir.VectorType(f32, LANES)
    arr = types.Array(types.float32, 1, "C")

    @intrinsic
    def chains(typingctx, X, Bv, reps, Out):
        """Out[i*16 + l] = the chain acc = acc + X[i*16+l] * operand(Bv, k)[l] over reps passes of Bv, from Out."""
        if X != arr or Bv != arr or Out != arr or not isinstance(reps, types.Integer):
            return None
        sig = types.void(X, Bv, reps, Out)

        def codegen(context, builder, signature, args):
            intp = context.get_value_type(types.intp)
            x = context.make_array(arr)(context, builder, args[0]).data
            b = context.make_array(arr)(context, builder, args[1]).data
            nb = context.make_array(arr)(context, builder, args[1]).nitems
            out = context.make_array(arr)(context, builder, args[3]).data
            reps_ = context.cast(builder, args[2], signature.args[2], types.intp)

            def vp(base, i):
                return builder.bitcast(builder.gep(base, [ir.Constant(intp, i * LANES)]), vf.as_pointer())

            xs = [builder.load(vp(x, i), align=4) for i in range(NACC)]
            fma_ty = ir.FunctionType(vf, [vf, vf, vf])
            fma = cgutils.get_or_insert_function(builder.module, fma_ty, "llvm.fma.v16f32") if fused else None
            acc = [cgutils.alloca_once(builder, vf) for _ in range(NACC)]
            for i in range(NACC):
                builder.store(builder.load(vp(out, i), align=4), acc[i])
            with cgutils.for_range(builder, reps_, intp=intp):
                with cgutils.for_range(builder, nb, intp=intp) as loop:
                    if vector:  # b[16q .. 16q+15], q = k mod (N_B / 16): a different vector each step
                        at = builder.mul(
                            builder.and_(loop.index, ir.Constant(intp, N_B // LANES - 1)), ir.Constant(intp, LANES)
                        )
                        bv = builder.load(builder.bitcast(builder.gep(b, [at]), vf.as_pointer()), align=4)
                    else:  # b[k] in every lane
                        bk = builder.load(builder.gep(b, [loop.index]), align=4)
                        bv = builder.shuffle_vector(
                            builder.insert_element(ir.Constant(vf, ir.Undefined), bk, ir.Constant(ir.IntType(32), 0)),
                            ir.Constant(vf, ir.Undefined),
                            ir.Constant(ir.VectorType(ir.IntType(32), LANES), [0] * LANES),
                        )
                    for i in range(NACC):
                        if fused:  # the FMA reference: one rounding (llvm.fma)
                            builder.store(builder.call(fma, [xs[i], bv, builder.load(acc[i])]), acc[i])
                        else:
                            p = builder.fmul(xs[i], bv)  # rounded product
                            builder.store(builder.fadd(builder.load(acc[i]), p), acc[i])  # rounded sum
            for i in range(NACC):
                builder.store(builder.load(acc[i]), vp(out, i), align=4)
            return context.get_dummy_value()

        return sig, codegen

    @numba.njit(error_model="numpy", nogil=True)
    def run_one(X, Bv, reps, Out):
        chains(X, Bv, reps, Out)

    @numba.njit(error_model="numpy", parallel=True)
    def run_many(Xs, Bv, reps, Outs):
        for t in numba.prange(Xs.shape[0]):  # independent copies, one per thread
            chains(Xs[t], Bv, reps, Outs[t])

    return run_one, run_many


_KERNELS: dict = {}


def kernels(fused: bool = False, vector: bool = True):
    """(run_one, run_many) of the unfused chains, or with ``fused`` of the
    same chains as fused multiply-adds (the FMA peak, for comparison only);
    ``vector``: v_k loaded as a vector, else b[k] broadcast."""
    if (fused, vector) not in _KERNELS:
        _KERNELS[fused, vector] = _build(fused, vector)
    return _KERNELS[fused, vector]


def operand(b, k: int, vector: bool):
    """v_k of every accumulator's lanes, as the kernel takes it (NumPy)."""
    import numpy as np

    if not vector:
        return b[k]
    q = k % (N_B // LANES)
    return np.tile(b[q * LANES : (q + 1) * LANES], NACC)


def inputs(seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    x = (1 + rng.random(NACC * LANES)).astype(np.float32)  # [1, 2): products never subnormal
    b = (rng.random(N_B) * 1e-3 + 1e-4).astype(np.float32)
    start = rng.standard_normal(NACC * LANES).astype(np.float32)
    return x, b, start


def _expected(x, b, start, vector: bool):
    """(multiply-then-add, fused) results of one pass over b, by NumPy."""
    import numpy as np

    want = start.copy()
    fused = start.astype(np.float64)
    for k in range(b.size):
        v = operand(b, k, vector)
        want = want + x * v  # float32: rounded product, then rounded sum
        fused = (fused + x.astype(np.float64) * np.asarray(v, np.float64)).astype(np.float32).astype(np.float64)
    return want, fused.astype(np.float32)


def check() -> dict:
    """Each unfused kernel's bits against NumPy's multiply-then-add, and its
    code for FMA; the FMA reference kernel's code for FMA."""
    import numpy as np

    x, b, start = inputs(1)
    ok_bits, fused_differs, fma, vec, zmm = True, [], [], set(), True
    for vector in (False, True):  # the vector form last: the FMA reference below takes its operands
        run_one, _ = kernels(vector=vector)
        out = start.copy()
        run_one(x, b, 1, out)
        want, fused = _expected(x, b, start, vector)
        ok_bits = ok_bits and bool(np.array_equal(out.view(np.uint32), want.view(np.uint32)))
        fused_differs.append(int(np.sum(fused.view(np.uint32) != want.view(np.uint32))))
        asm = "\n".join(run_one.inspect_asm().values())
        fma += _fma_instructions(asm)
        vec |= set(re.findall(r"\bv(?:mul|add)ps\b", asm))
        zmm = zmm and "zmm" in asm
    vec = sorted(vec)
    fused_differs = min(fused_differs)  # want: the vector form's, from the last pass above
    fused_one, _ = kernels(fused=True)  # the FMA reference kernel: it must fuse, or its peak means nothing
    out_fused = start.copy()
    fused_one(x, b, 1, out_fused)
    fused_asm = "\n".join(fused_one.inspect_asm().values())
    fma_ok = bool(_fma_instructions(fused_asm)) and not np.array_equal(out_fused.view(np.uint32), want.view(np.uint32))
    return dict(
        fma_kernel_fuses=fma_ok,
        bits_equal_numpy_mul_then_add=ok_bits,
        lanes_where_fused_differs=fused_differs,
        lanes=int(start.size),
        fma_instructions=fma,
        vector_mul_add=vec,
        uses_zmm=zmm,
        ok=ok_bits and not fma and fused_differs > 0 and len(vec) == 2,
    )


def _fma_instructions(asm: str) -> list[str]:
    return sorted(set(re.findall(r"\bv?fn?m(?:add|sub)\w*", asm)))


def measure(threads: int, repeats: int, seconds: float = 0.2, fused: bool = False, vector: bool = True) -> dict:
    """GF/s (2 flops per lane per step: one multiply, one add) of ``threads``
    copies at once, each run for about ``seconds``, ``repeats`` times.

    ``gflops`` is the best sample by process CPU time (flops / (CPU seconds /
    threads)): a ceiling of the hardware, which other processes on a shared
    machine can only lower, and CPU time leaves out the time they held the
    core.  The wall-time median is kept beside it.  With several threads CPU
    time is not to be trusted (idle OpenMP workers spin, and threads sharing a
    busy core each count their share), so the yardstick for T threads is T x
    one thread's ``gflops`` (the chains live in registers: cores share nothing;
    measured idle here, 2 threads gave 192.5 GF/s wall against 2 x 96.6)."""
    import numba
    import numpy as np

    run_one, run_many = kernels(fused, vector)
    numba.set_num_threads(threads)
    x, b, start = inputs()
    Xs = np.tile(x, (threads, 1))
    Outs = np.tile(start, (threads, 1))
    run_many(Xs, b, 1, Outs)  # compile, warm
    t0 = time.perf_counter()
    run_many(Xs, b, 20, Outs)
    per_rep = max((time.perf_counter() - t0) / 20, 1e-7)
    reps = max(1, int(seconds / per_rep))
    flop = 2.0 * NACC * LANES * N_B * reps * threads
    wall, cpu = [], []
    for _ in range(repeats):
        c0, t0 = time.process_time(), time.perf_counter()
        run_many(Xs, b, reps, Outs)
        wall.append(flop / (time.perf_counter() - t0) / 1e9)
        cpu.append(flop / max((time.process_time() - c0) / threads, 1e-9) / 1e9)
    wall.sort()
    return dict(
        threads=threads,
        gflops=max(cpu),
        gflops_wall_median=wall[len(wall) // 2],
        gflops_wall_max=wall[-1],
        samples_wall=wall,
        samples_cpu=cpu,
        accumulators=NACC,
        lanes=LANES,
        operand="vector" if vector else "broadcast",
    )


def peak_table(threads_list, repeats: int, fma: bool = True) -> dict:
    """check() and measure() for each thread count, in this process; with
    ``fma`` also the same chains fused (``fma_runs``) and ``fma_ratio``: one
    thread's FMA peak over its unfused peak.  The ratio is what issue 32's
    step goal scales by: about 1 where the multiply and the add have pipes
    of their own (AMD Zen), about 2 where both take an FMA port (Intel)."""
    runs = []
    for t in threads_list:  # the faster operand is the peak; the other is kept beside it
        both = [measure(t, repeats, vector=v) for v in (True, False)]
        best = max(both, key=lambda r: r["gflops"])
        runs.append(dict(best, gflops_by_operand={r["operand"]: r["gflops"] for r in both}))
    res = dict(check=check(), runs=runs)
    if fma:
        res["fma_runs"] = [measure(t, repeats, fused=True) for t in threads_list]
        one = {r["threads"]: r["gflops"] for r in res["runs"]}
        fone = {r["threads"]: r["gflops"] for r in res["fma_runs"]}
        if 1 in one and 1 in fone:
            res["fma_ratio"] = fone[1] / one[1]
    return res


def main(argv=None) -> int:
    from run_all import load_line, machine_info, update_machine_results

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--no-save", action="store_true", help="print only; do not write the machine's results file")
    args = ap.parse_args(argv)
    res = peak_table(args.threads, args.repeats)
    c = res["check"]
    print(load_line())
    print(
        f"check: bits equal NumPy mul-then-add: {c['bits_equal_numpy_mul_then_add']}; fused would differ in "
        f"{c['lanes_where_fused_differs']}/{c['lanes']} lanes; FMA instructions in the code: "
        f"{c['fma_instructions'] or 'none'}; vector ops {c['vector_mul_add']}, zmm: {c['uses_zmm']}"
    )
    one = next((r["gflops"] for r in res["runs"] if r["threads"] == 1), None)
    res["yardstick"] = {str(r["threads"]): r["threads"] * one for r in res["runs"]} if one else {}
    for r in res["runs"]:
        if one:
            print(f"yardstick, {r['threads']} thread(s): {r['threads'] * one:.1f} GF/s ({r['threads']} x one core's)")
        print(
            f"unfused mul+add peak, {r['threads']} thread(s): {r['gflops']:.1f} GF/s (best by CPU time; "
            f"wall median {r['gflops_wall_median']:.1f}, max {r['gflops_wall_max']:.1f}; "
            f"{r['accumulators']} x {r['lanes']}-lane chains per thread; "
            + ", ".join(f"{k} operand {v:.1f}" for k, v in r["gflops_by_operand"].items())
            + ")"
        )
    if not c["fma_kernel_fuses"]:  # no FMA instruction on this CPU, or LLVM called fmaf: no ratio
        print("the FMA reference kernel did not fuse: no FMA peak or ratio is kept", file=sys.stderr)
        res.pop("fma_runs", None)
        res.pop("fma_ratio", None)
    for r in res.get("fma_runs", []):
        print(f"fused multiply-add peak, {r['threads']} thread(s): {r['gflops']:.1f} GF/s (for comparison only)")
    if "fma_ratio" in res:
        print(f"FMA peak / unfused peak, 1 thread: {res['fma_ratio']:.2f}")
    if not c["ok"]:
        print("the yardstick kernel failed its check: figures not saved", file=sys.stderr)
        return 1
    if not args.no_save:
        out = update_machine_results("peak", dict(res, machine=machine_info()))
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    if "--worker-json" in sys.argv:  # used by bench_matmul: measure in a fresh process, print JSON
        sys.argv.remove("--worker-json")
        ts = [int(os.environ.get("NUMBA_NUM_THREADS", "1"))]
        print(json.dumps(peak_table(ts, 9, fma=False)))
        sys.exit(0)
    sys.exit(main())
