"""What refreplay.torch costs: one training step of the `tiny` golden case
(or of the `small` preset on random tokens, ``--preset small``), computed
by the reference trainer (``refreplay.training.step.Trainer``) and by the
PyTorch-built GPT of examples/torch_gpt (same ops, plus autograd and tensor
plumbing), in one process, alternating, medians and their ratio.

    python benchmarks/bench_torch_module.py [--repeats N] [--preset tiny|small] [--torch-threads N]

Both sides run the same compiled kernels, so the ratio is the overhead of
going through torch.autograd; the first step of each is a warm-up.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from refreplay.conformance.golden import steps as golden  # noqa: E402
from refreplay.training.data import Batching, Stream  # noqa: E402
from refreplay.training.launch.inproc import InProcess  # noqa: E402
from refreplay.training.presets import preset  # noqa: E402
from refreplay.training.step import Trainer  # noqa: E402


def _example():
    spec = importlib.util.spec_from_file_location("torch_gpt_train", REPO / "examples/torch_gpt/train.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--torch-threads",
        type=int,
        default=None,
        help="torch.set_num_threads before timing (default: leave PyTorch's choice)",
    )
    ap.add_argument("--preset", choices=("tiny", "small"), default="tiny")
    args = ap.parse_args()
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    case = golden.load(REPO / "vectors" / "steps.json")[0]
    if args.preset == "small":
        model, tr = preset("small")
        samples = np.random.default_rng(0).integers(
            0, 256, (tr.micro_batches * tr.micro_batch_size, model.seq_len + 1), dtype=np.uint8
        )
        case = golden.Loaded("small", model, tr, samples, golden.recipe_sha256(model, tr, samples), [])
    train = _example()

    stream = Stream(case.samples, case.train.seed, Batching(case.train.micro_batches, case.train.micro_batch_size))
    trainer = Trainer(case.model, case.train, stream, case.recipe_sha256)
    st0 = trainer.initial_state()

    def reference_step():
        trainer.step(st0, "00" * 32, InProcess(1))

    def torch_step():
        train.train(case.model, case.train, case.samples, 1, case.recipe_sha256)

    def torch_build_only():
        train.train(case.model, case.train, case.samples, 0, case.recipe_sha256)

    times = {"reference": [], "torch": [], "torch setup": []}
    fns = {"reference": reference_step, "torch": torch_step, "torch setup": torch_build_only}
    for r in range(args.repeats + 1):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            if r:
                times[name].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    step_torch = med["torch"] - med["torch setup"]
    print(
        f"{args.preset}: load {os.getloadavg()}, torch threads {torch.get_num_threads()}, "
        f"NUMBA_NUM_THREADS={os.environ.get('NUMBA_NUM_THREADS', 'default')}, {args.repeats} repeats"
    )
    print(f"reference step  {med['reference'] * 1e3:8.1f} ms")
    print(f"torch step      {step_torch * 1e3:8.1f} ms  (build + state 0: {med['torch setup'] * 1e3:.1f} ms)")
    print(f"ratio torch/reference: {step_torch / med['reference']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
