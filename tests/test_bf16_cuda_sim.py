"""The bf16 profile on the CUDA twin, in numba-cuda's simulator.

The device conversions are one check of ``refreplay.testing.cuda_selfcheck`` ("bf16":
edge grids and random bits against ``refreplay.numerics.bf16``), run with
every other check by ``tests/test_cuda_sim.py``; the spec's bf16 examples
run on the device there too (``numerics.bf16.*`` in ``EXAMPLE_FUNCTIONS``).
Here: that check can fail (a truncating encode is caught), and one bf16
micro step trained with every op on the device has the CPU's bits
([bf16.tensors.c1], [bf16.round.c1]).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

if importlib.util.find_spec("numba_cuda") is None:
    pytest.skip("numba-cuda is not installed (pip install -e '.[cuda]')", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]
MICRO = {
    "model": {"width": 8, "layers": 1, "heads": 2, "seq_len": 4, "mlp_hidden": 16, "precision": "bf16"},
    "train": {"micro_batches": 2, "micro_batch_size": 1},
}


def _run(args, sim):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    if sim:
        env["NUMBA_ENABLE_CUDASIM"] = "1"
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


def test_device_bf16_check_fails_on_a_truncating_encode():
    """[bf16.round.c1] with the device encode truncating (no rounding), the check fails."""
    code = (
        "import sys, numpy as np\n"
        "from cuda_backend import bf16\n"
        "from refreplay.testing import cuda_selfcheck as selfcheck\n"
        "bf16.encode1 = lambda x: np.uint16((np.int64(bf16.shim.bits(bf16.shim.finish(x))) "
        "& 0xFFFFFFFF) >> 16)\n"
        "sys.exit(selfcheck.main(['--only', 'bf16']))\n"
    )
    proc = _run(["-c", code], sim=True)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "encode bf16 rounding grid" in proc.stdout and "FAIL" in proc.stdout


@pytest.mark.slow
def test_bf16_step_on_the_device_has_the_cpu_bits(tmp_path):
    """`train --device cuda` of a bf16 micro model (simulator): the chain head
    of the CPU run, and the run replays as verified on the CPU (40-140 s in
    the simulator, hence slow; on a GPU, scripts/gpu-selfcheck part 7 runs the
    golden tiny-bf16 steps with every op on the device)."""
    cfg = tmp_path / "micro.json"
    cfg.write_text(json.dumps(MICRO))
    heads = {}
    for device, sim in (("cuda", True), ("cpu", False)):
        out = tmp_path / device
        proc = _run(
            [
                "-m",
                "refreplay",
                "train",
                "--config",
                str(cfg),
                "--steps",
                "1",
                "--out",
                str(out),
                "--byte-cap",
                "4096",
                "--quiet",
                "--device",
                device,
            ],
            sim,
        )
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        heads[device] = json.loads((out / "head.json").read_text())["chain_link"]
    assert heads["cuda"] == heads["cpu"]
    proc = _run(["-m", "refreplay", "replay", str(tmp_path / "cuda"), "--step", "1"], sim=False)
    assert proc.returncode == 0 and "VERIFIED: step 1" in proc.stdout, proc.stdout + proc.stderr
