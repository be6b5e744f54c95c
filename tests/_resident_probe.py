"""Run by ``test_device_resident.py`` in a subprocess with NUMBA_ENABLE_CUDASIM=1:
train steps of a micro model on the CPU and on the CUDA twin (2 in-process
ranks) and count every host<->device transfer inside each device step.

Counted: ``cuda.to_device`` (host -> device), ``copy_to_host`` (device ->
host), ``copy_to_device`` from a host array, and a host array handed to a
kernel (the implicit copy in and back that numba.cuda makes).  Prints JSON:
per layer count, the records of both devices and the counts of every step.
"""

from __future__ import annotations

import json
import sys

import numpy as np
from numba import cuda
from numba.cuda.simulator import kernel as simkernel
from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

from refreplay.conformance.golden.steps import recipe_sha256
from refreplay.training.data import Batching, Stream
from refreplay.training.launch.inproc import InProcess
from refreplay.training.model import linear_names, param_shapes
from refreplay.training.presets import ModelConfig, TrainConfig
from refreplay.training.step import Trainer

COUNTS = {"h2d": 0, "d2h": 0, "implicit": 0}


def _counting():
    to_device, copy_to_host, copy_to_device = cuda.to_device, FakeCUDAArray.copy_to_host, FakeCUDAArray.copy_to_device
    in_out = simkernel.InOut

    def h2d(*a, **k):
        COUNTS["h2d"] += 1
        return to_device(*a, **k)

    def d2h(self, *a, **k):
        COUNTS["d2h"] += 1
        return copy_to_host(self, *a, **k)

    def d2d_or_h2d(self, ary, *a, **k):
        if not isinstance(ary, FakeCUDAArray):
            COUNTS["h2d"] += 1
        return copy_to_device(self, ary, *a, **k)

    class ImplicitInOut(in_out):
        def __init__(self, *a, **k):
            COUNTS["implicit"] += 1
            super().__init__(*a, **k)

    cuda.to_device = h2d
    FakeCUDAArray.copy_to_host = d2h
    FakeCUDAArray.copy_to_device = d2d_or_h2d
    simkernel.InOut = ImplicitInOut


def run(layers: int, device: str, steps: int, ranks: int, M: int, linear: str) -> tuple[list, list]:
    model = ModelConfig(width=4, layers=layers, heads=2, seq_len=2, mlp_hidden=4, linear=linear)
    train = TrainConfig(micro_batches=M, micro_batch_size=1, warmup_steps=1, schedule_steps=4)
    samples = np.random.default_rng(7).integers(0, 256, size=(2 * M * steps, 3), dtype=np.uint8)
    stream = Stream(samples, train.seed, Batching(M, 1))
    trainer = Trainer(model, train, stream, recipe_sha256(model, train, samples), device)
    st = trainer.initial_state()
    rec = trainer.initial_record(st)
    records, counts = [[rec.state_root]], []
    launcher = InProcess(ranks)
    for _ in range(steps):
        before = dict(COUNTS)
        st, rec = trainer.step(st, rec.chain_link, launcher)
        counts.append({k: COUNTS[k] - before[k] for k in COUNTS})
        records.append([rec.state_root, rec.chain_link, rec.loss_hex()])
    return records, counts


def api_checks() -> dict:
    """Where results land: NumPy in -> NumPy out, device in -> device out, same
    bits; a host tensor in a dict of device gradients is still clipped in place;
    the device head split/merge equals the CPU's copies."""
    from cuda_backend.host import arrays, numerics
    from cuda_backend.host._common import is_device
    from cuda_backend.host.ops import optim
    from refreplay.training import arrays as cpu_arrays
    from refreplay.ops import optim as cpu_optim

    g = np.random.default_rng(3)
    a, b = (g.standard_normal(6).astype(np.float32) for _ in range(2))
    host, dev = numerics.add(a, b), numerics.add(cuda.to_device(a), b)
    out = {
        "numpy_in_numpy_out": isinstance(host, np.ndarray),
        "device_in_device_out": is_device(dev),
        "same_bits": dev.copy_to_host().tobytes() == host.tobytes(),
    }
    ref = {"a": np.full(4, 10, np.float32), "b": np.full(4, -3, np.float32)}
    mixed = {"a": ref["a"].copy(), "b": cuda.to_device(ref["b"])}
    cpu_optim.clip_grad_norm(ref, np.float32(1.0))
    optim.clip_grad_norm(mixed, np.float32(1.0))
    out["mixed_clip"] = (
        mixed["a"].tobytes() == ref["a"].tobytes() and mixed["b"].copy_to_host().tobytes() == ref["b"].tobytes()
    )
    B, T, NH, HS = 2, 3, 2, 2
    qkv = g.standard_normal((B * T, 3 * NH * HS)).astype(np.float32)
    parts = [cpu_arrays.split_heads(qkv, j, B, T, NH, HS) for j in range(3)]
    dparts = [arrays.split_heads(cuda.to_device(qkv), j, B, T, NH, HS) for j in range(3)]
    out["split_heads"] = all(p.tobytes() == d.copy_to_host().tobytes() for p, d in zip(parts, dparts))
    out["merge_heads"] = (
        arrays.merge_heads(dparts, B, T, NH, HS).copy_to_host().tobytes()
        == cpu_arrays.merge_heads(parts, B, T, NH, HS).tobytes()
        == qkv.tobytes()
    )
    return out


def main(argv):
    """argv: LAYERS:STEPS[,LAYERS:STEPS...] RANKS M [LINEAR]"""
    runs = [tuple(int(v) for v in x.split(":")) for x in argv[1].split(",")]
    linear = argv[4] if len(argv) > 4 else "fp32"
    ranks, M = int(argv[2]), int(argv[3])
    # the attention scale recip(sqrt(HS)) is computed on the device once per process and
    # head size (cached), like the rotary tables at model construction: not per step
    from cuda_backend.host.ops.attention import attention_scale

    attention_scale(2)
    _counting()
    out = []
    for layers, steps in runs:
        cpu, _ = run(layers, "cpu", steps, ranks, M, linear)
        dev, counts = run(layers, "cuda", steps, ranks, M, linear)
        cfg = ModelConfig(width=4, layers=layers, heads=2, seq_len=2, mlp_hidden=4, linear=linear)
        hashed = len(linear_names(cfg)) if linear == "int8" else 0  # + the re-pinned quantizer steps
        out.append(
            {
                "layers": layers,
                "param_tensors": len(param_shapes(cfg)),
                "quant_steps": hashed,
                "cpu": cpu,
                "cuda": dev,
                "counts": counts,
            }
        )
    print(json.dumps({"runs": out, "api": api_checks()}))


if __name__ == "__main__":
    main(sys.argv)
