"""The device-resident step (``--device cuda``, issue #17 item 2), in
numba-cuda's simulator: parameters, optimizer state, activations and the
TreeFold's gradient sets stay on the device for a whole step and across
steps, and the step still has the CPU reference's bits.

``_resident_probe.py`` runs in a subprocess under NUMBA_ENABLE_CUDASIM=1
(the simulator must be on before numba.cuda is imported), trains a micro
model (width 4, T = 2, M = 2 micro-batches of one sequence, 2 in-process
ranks) on both devices and counts every host<->device transfer inside each
device step.  What may cross ([step.record.c1]: the state root and the loss):

* to the host: the 3P state tensors (params, adam.m, adam.v) for the state
  hash, plus a few scalars per micro-batch (mean loss, token count, the loss
  gradient's 1/count) and per step (folded loss, clipping coefficient, rate,
  bias corrections);
* to the device: each micro-batch's tokens and targets and its loss for the
  fold, plus the 3P state tensors once, when the state arrives from the host
  (step 1 or a checkpoint), never again across steps.

None of it may grow with the number of layers (a per-op round trip would),
and no host array may reach a kernel (numba.cuda's implicit copy).  This is
evidence from the simulator: untested on a real GPU.

Clauses exercised on the device path: [model.forward.c1] [model.backward.c1]
[fold.tree.c1] [fold.ranks.c1] [fold.scale.c1] [optim.clip.c1]
[optim.adamw.c1] [state.chain.c2].
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import background
import pytest

if importlib.util.find_spec("numba_cuda") is None:
    pytest.skip("numba-cuda is not installed (pip install -e '.[cuda]')", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]
M = 2


def _register(linear: str, tests: tuple[str, ...]) -> background.Job:
    env = dict(
        os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")
    )
    argv = [sys.executable, str(ROOT / "tests" / "_resident_probe.py"), "1:2,2:1", "2", str(M), linear]
    return background.register(f"resident-{linear}", lambda _: argv, env=env, timeout=900, tests=tests)


# started at collection, in the background (tests/background.py): minutes in the simulator
PROBES = {
    "fp32": _register(
        "fp32",
        (
            "test_host_entry_points_follow_their_inputs",
            "test_device_step_has_the_cpu_bits",
            "test_no_host_array_reaches_a_kernel",
            "test_state_stays_on_the_device_across_steps",
            "test_transfers_do_not_grow_with_the_layers",
        ),
    ),
    "int8": _register("int8", ("test_int8_step_is_device_resident_too",)),
}


def _probe(linear="fp32") -> dict:
    proc = background.result(PROBES[linear])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def probe():
    """The probe's JSON: layers 1 over two steps, layers 2 over one step, and the API checks."""
    return _probe()


@pytest.fixture(scope="module")
def runs(probe):
    """Layers 1 over two steps and layers 2 over one step: {layers: result}."""
    return {r["layers"]: r for r in probe["runs"]}


def test_host_entry_points_follow_their_inputs(probe):
    """NumPy in -> NumPy out (refreplay.torch and direct callers unchanged),
    a device array in -> a device array out with the same bits; a host tensor
    among device gradients is still clipped in place; the device's head split
    and merge are the CPU's exact copies."""
    assert probe["api"] == dict.fromkeys(
        ["numpy_in_numpy_out", "device_in_device_out", "same_bits", "mixed_clip", "split_heads", "merge_heads"], True
    )


def test_device_step_has_the_cpu_bits(runs):
    """State roots, chain links and losses of every step equal the CPU's."""
    _same_bits(runs)


def test_no_host_array_reaches_a_kernel(runs):
    for r in runs.values():
        assert all(c["implicit"] == 0 for c in r["counts"]), r["counts"]


def test_state_stays_on_the_device_across_steps(runs):
    """Step 1 uploads the host state once (3P tensors); step 2 starts from the
    device state and uploads only each micro-batch's inputs and loss."""
    _across_steps(runs)


def test_transfers_do_not_grow_with_the_layers(runs):
    """Beyond the state tensors the spec hashes (3P down, plus the re-pinned
    quantizer steps under int8, and 3P up when the state arrives from the
    host), a step's transfers are the same for one and for two layers: no
    per-op round trip."""
    _layer_independent(runs)


@pytest.mark.slow
def test_int8_step_is_device_resident_too():
    """linear = "int8" (QAT linears: step sizes, codes, the transposed weight
    codes and the STE masks on the device): the same four properties."""
    runs = {r["layers"]: r for r in _probe("int8")["runs"]}
    assert all(r["quant_steps"] > 0 for r in runs.values())
    _same_bits(runs)
    assert all(c["implicit"] == 0 for r in runs.values() for c in r["counts"])
    _across_steps(runs)
    _layer_independent(runs)


def _same_bits(runs):
    for r in runs.values():
        assert len(r["cuda"]) == len(r["cpu"]) >= 2
        assert r["cuda"] == r["cpu"], f"layers={r['layers']}"


def _across_steps(runs):
    r = runs[1]
    P = r["param_tensors"]
    step1, step2 = r["counts"]
    assert step1["h2d"] - step2["h2d"] == 3 * P
    assert step2["h2d"] <= 8 * M < P * 3


def _layer_independent(runs):
    per_step = {}
    for layers, r in runs.items():
        P, Q = r["param_tensors"], r["quant_steps"]
        c = r["counts"][0]
        per_step[layers] = (c["h2d"] - 3 * P, c["d2h"] - 3 * P - Q)
    assert runs[2]["param_tensors"] > runs[1]["param_tensors"]
    assert per_step[1] == per_step[2], per_step
    up, down = per_step[1]
    assert up <= 8 * M + 2 and down <= 6 * M + 6, per_step
