"""Training and replay with the ops on the CUDA twin (``--device cuda``).

A step computed by ``cuda_backend`` must have the bits of the CPU reference:
a run trained with ``--device cuda`` verifies when replayed on the CPU, a run
trained on the CPU verifies when replayed with ``--device cuda``, and both
runs of one recipe have the same chain head (the device is not part of the
recipe).  Without a GPU these run in numba-cuda's simulator, which runs every
GPU thread as a Python thread, so the model is a micro one (width 8, one
layer, T = 4) and one step; the `gpu` test trains the `tiny` preset on a GPU.

Clauses exercised end to end on the device: [model.forward.c1]
[model.backward.c1] [model.residual.c1] [fold.tree.c1] [fold.ranks.c1]
[fold.scale.c1] [optim.clip.c1] [optim.adamw.c1] [model.init.c1]
[state.chain.c2].
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import auditor_keys
import background

ROOT = Path(__file__).resolve().parents[1]
HAVE_NUMBA_CUDA = importlib.util.find_spec("numba_cuda") is not None
needs_numba_cuda = pytest.mark.skipif(not HAVE_NUMBA_CUDA, reason="numba-cuda is not installed")

MICRO = {
    "model": {"width": 8, "layers": 1, "heads": 2, "seq_len": 4, "mlp_hidden": 16},
    "train": {"micro_batches": 2, "micro_batch_size": 1},
}


def _env(sim: bool) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    if sim:
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    return env


def cli(*args, sim=False, timeout=900):
    return subprocess.run(
        [sys.executable, "-m", "refreplay", *map(str, args)],
        cwd=ROOT,
        env=_env(sim),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _gpu_present() -> bool:
    if not HAVE_NUMBA_CUDA:
        return False
    probe = subprocess.run(
        [sys.executable, "-c", "from numba import cuda; print(cuda.is_available())"],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"},
    )
    return probe.stdout.strip() == "True"


@pytest.fixture(scope="module")
def micro_config(tmp_path_factory):
    path = tmp_path_factory.mktemp("device") / "micro.json"
    path.write_text(json.dumps(MICRO))
    return path


def _train_args(config, out, *extra):
    """`refreplay train` of the micro model: one step, two ranks."""
    return [
        "train",
        "--config",
        config,
        "--steps",
        1,
        "--ranks",
        2,
        "--out",
        out,
        "--byte-cap",
        4096,
        "--quiet",
        *extra,
    ]


def _trained(proc, out):
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads((Path(out) / "head.json").read_text())["chain_link"], proc.stdout


def _train(config, out, *extra, sim=False):
    return _trained(cli(*_train_args(config, out, *extra), sim=sim), out)


def _cuda_train_argv(folder: Path) -> list:
    (folder / "micro.json").write_text(json.dumps(MICRO))
    return [sys.executable, "-m", "refreplay", *_train_args(folder / "micro.json", folder / "cuda", "--device", "cuda")]


# started at collection, in the background (tests/background.py): most of a minute in the simulator
CUDA_TRAIN = background.register(
    "device-train-cuda",
    _cuda_train_argv,
    env=_env(sim=True),
    timeout=900,
    tests=("test_step_trained_on_cuda_verifies_on_cpu",) if HAVE_NUMBA_CUDA else (),
)


def test_unknown_device_is_a_usage_error(tmp_path):
    proc = cli("train", "--preset", "tiny", "--steps", 1, "--out", tmp_path / "r", "--device", "tpu")
    assert proc.returncode == 2 and "--device" in proc.stderr


@needs_numba_cuda
def test_cuda_without_a_gpu_is_refused_clearly(tmp_path, micro_config):
    """No GPU and no simulator: exit 2 with what to do, before any work and
    without a traceback, for train, replay and audit."""
    if _gpu_present():
        pytest.skip("this machine has a usable GPU")
    proc = cli("train", "--config", micro_config, "--steps", 1, "--out", tmp_path / "r", "--device", "cuda")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no usable CUDA GPU" in proc.stderr and "NUMBA_ENABLE_CUDASIM=1" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "r").exists()
    _train(micro_config, tmp_path / "cpu")
    for cmd in (
        ["replay", tmp_path / "cpu", "--step", 1],
        [
            "audit",
            tmp_path / "cpu",
            "--sample",
            1,
            "--beacon",
            "ab" * 16,
            "--auditor",
            "t",
            "--key",
            auditor_keys.key_files(tmp_path / "keys")[0],
            "--out",
            tmp_path / "certs",
        ],
    ):
        proc = cli(*cmd, "--device", "cuda")
        assert proc.returncode == 2 and "no usable CUDA GPU" in proc.stderr, proc.stdout + proc.stderr
        assert "VERIFIED" not in proc.stdout


@needs_numba_cuda
def test_step_trained_on_cuda_verifies_on_cpu(tmp_path, micro_config):
    """`train --device cuda` (simulator, 2 ranks: the TreeFold merges run on
    the device too) publishes the CPU reference's bits: the run replays and
    verifies on the CPU, and its chain head equals the CPU-trained run's."""
    cuda_run = CUDA_TRAIN.dir / "cuda"
    head_cuda, out = _trained(background.result(CUDA_TRAIN), cuda_run)
    assert "ops on cuda (numba-cuda simulator)" in out
    head_cpu, out = _train(micro_config, tmp_path / "cpu")
    assert "ops on cpu" in out
    assert head_cuda == head_cpu
    proc = cli("replay", cuda_run, "--step", 1)
    assert proc.returncode == 0 and "VERIFIED: step 1" in proc.stdout, proc.stdout + proc.stderr


@needs_numba_cuda
@pytest.mark.slow
def test_step_trained_on_cpu_verifies_on_cuda(tmp_path, micro_config):
    """`replay --device cuda` and `audit --device cuda` (simulator) of a CPU-trained run."""
    _train(micro_config, tmp_path / "cpu")
    proc = cli("replay", tmp_path / "cpu", "--step", 1, "--device", "cuda", sim=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ops on cuda (numba-cuda simulator)" in proc.stdout and "VERIFIED: step 1" in proc.stdout
    proc = cli(
        "audit",
        tmp_path / "cpu",
        "--sample",
        1,
        "--beacon",
        "ab" * 16,
        "--auditor",
        "t",
        "--key",
        auditor_keys.key_files(tmp_path / "keys")[0],
        "--out",
        tmp_path / "certs",
        "--device",
        "cuda",
        sim=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cert = json.loads(next((tmp_path / "certs").glob("cert-*.json")).read_text())
    assert cert["verdict"] == "verified"
    assert cert["platform"]["device"] == "cuda (numba-cuda simulator)"


@pytest.mark.gpu
def test_gpu_selfcheck_training_part():
    """On a GPU: `tiny` trained on the GPU verifies on the CPU and vice versa."""
    proc = subprocess.run(
        [sys.executable, "scripts/gpu-selfcheck", "--no-conform", "--only", "mul_add", "--sizes", "64"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    assert "chain heads of the two runs are equal" in proc.stdout
