"""The CUDA backend in the CUDA simulator: every device kernel equals the
CPU reference bit for bit, and every worked example of the spec that the
device covers gives its stated bits on the device.

The simulator must be switched on before ``numba.cuda`` is first imported, so
the checks (``refreplay.testing.cuda_selfcheck``, small shapes) run once in a
subprocess with ``NUMBA_ENABLE_CUDASIM=1``; each test below reads one
check's result.  In the simulator the shim runs plain NumPy float32
arithmetic in place of the libdevice intrinsics: these tests check the
kernels' loops, orders, flushes and NaN rules; the PTX audit
(``test_cuda_ptx.py``) checks that the GPU build keeps every rounding.

Clauses checked: [num.load.c1] [num.add.c1] [num.mul.c1] [num.nofma.c1]
[num.flush.c1] [num.nan.c1] [num.recip.c1] [num.sqrt.c1] [num.minmax.c1]
[num.rint.c1] [num.sat.c1] [red.sum.c1] [red.rowsum.c1] [red.colsum.c1]
[red.rowmax.c1] [mm.nn.c1] [mm.nt.c1] [mm.tn.c1] [mm.accumulate.c1]
[mm.bias.c1] [mm.i8.c1] [num.exp.c1] [num.log.c1] [num.tanh.c1]
[num.sigmoid.c1] [num.sincos.c1] [rng.philox.c1] [rng.counter.c1] [rng.unit.c1]
[rng.symmetric.c1] [rng.init.c1] [fold.tree.c1] [fold.final.c1]
[fold.ranks.c1] [fold.scale.c1] [norm.meanop.c1] [norm.layer.fwd.c1]
[norm.layer.bwd.c1] [norm.rms.fwd.c1] [norm.rms.bwd.c1] [emb.fwd.c1]
[emb.bwd.c1] [linear.fwd.c1] [linear.bwd.c1] [act.gelu.fwd.c1]
[act.gelu.bwd.c1] [act.silu.fwd.c1] [act.silu.bwd.c1] [act.swiglu.fwd.c1]
[act.swiglu.bwd.c1] [softmax.fwd.c1] [softmax.bwd.c1] [softmax.log.c1]
[softmax.log.bwd.c1] [rope.freq.c1] [rope.fwd.c1] [rope.bwd.c1]
[attn.scores.c1] [attn.mask.c1] [attn.out.c1] [attn.bwd.c1] [attn.batch.c1]
[loss.token.c1] [loss.mean.c1] [loss.bwd.c1] [optim.adamw.bias.c1]
[optim.adamw.c1] [optim.clip.c1] [optim.lr.c1] [quant.granularity.c1]
[quant.step.c1] [quant.quantize.c1] [quant.dequantize.c1] [quant.ste.c1]
[quant.linear.fwd.c1] [quant.linear.bwd.c1].
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import background
import pytest

if importlib.util.find_spec("numba_cuda") is None:
    pytest.skip("numba-cuda is not installed (pip install -e '.[cuda]')", allow_module_level=True)

from refreplay.testing.cuda_selfcheck import CHECKS  # noqa: E402  (imports no numba.cuda)

ROOT = Path(__file__).resolve().parents[1]


# started at collection, in the background (tests/background.py): a minute or more in the simulator
SELFCHECK = background.register(
    "cuda-selfcheck",
    lambda d: [sys.executable, "-m", "refreplay.testing.cuda_selfcheck", "--json", d / "results.json"],
    env=dict(os.environ, NUMBA_ENABLE_CUDASIM="1"),
    timeout=600,
    tests=(
        "test_device_equals_reference",
        "test_selfcheck_exit_status",
        "test_spec_examples_cover_chapters_1_3_4",
    ),
)
SCRIPT = background.register(
    "gpu-selfcheck-script",
    lambda _: [
        sys.executable,
        "scripts/gpu-selfcheck",
        "--simulator",
        "--only",
        "mul_add",
        "--conform-op",
        "max",
        "--sizes",
        "8",
        "--no-train",
    ],
    timeout=600,
    tests=("test_gpu_selfcheck_script_in_simulator",),
)


@pytest.fixture(scope="module")
def results():
    proc = background.result(SELFCHECK)
    out = SELFCHECK.dir / "results.json"
    if not out.exists():
        pytest.fail(f"selfcheck crashed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    by_name = {r["check"]: r for r in json.loads(out.read_text())}
    by_name["_exit"] = proc.returncode
    return by_name


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_device_equals_reference(results, name):
    """One check of refreplay.testing.cuda_selfcheck: every case's output bits equal the reference's."""
    r = results[name]
    assert r["cases"] > 0, f"{name}: no cases ran"
    assert not r["failures"], f"{name}:\n" + "\n".join(r["failures"][:20])


def test_selfcheck_exit_status(results):
    """The command exits 0 exactly when every check passed (a non-zero exit on any mismatch)."""
    assert results["_exit"] == (0 if all(r["ok"] for k, r in results.items() if k != "_exit") else 1)


def test_spec_examples_cover_chapters_1_3_4(results):
    """The device runs the worked examples of the numbers, reductions and matmul chapters."""
    from refreplay.testing.cuda_selfcheck import example_cases

    labels = {label for label, *_ in example_cases()}
    assert {"num.nofma.c1", "num.flush.c1", "num.rint.c1", "red.sum.c1", "mm.nn.c1", "mm.i8.c1"} <= labels
    assert results["spec_examples"]["cases"] >= len(labels)


def test_reference_never_imports_the_backend():
    """refreplay imports cuda_backend only when the cuda kernel or device is asked for."""
    # Every module of the library; one that fails to import is other tests' business.
    code = (
        "import sys, pkgutil, importlib, refreplay\n"
        "for m in pkgutil.walk_packages(refreplay.__path__, 'refreplay.'):\n"
        "    if m.name != 'refreplay.__main__':\n"
        "        try:\n"
        "            importlib.import_module(m.name)\n"
        "        except Exception:\n"
        "            pass\n"
        "print(sorted(n for n in sys.modules if n.startswith(('cuda_backend', 'numba_cuda'))))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"


def _sim_env():
    return dict(os.environ, NUMBA_ENABLE_CUDASIM="1")


def test_selfcheck_fails_when_flush_is_broken():
    """[num.flush.c1] The check can fail: with the shim's flush disabled, mul differs and the exit is 1."""
    code = (
        "import sys\n"
        "from cuda_backend import shim\n"
        "from refreplay.testing import cuda_selfcheck as selfcheck\n"
        "shim.flush = lambda x: x\n"
        "sys.exit(selfcheck.main(['--only', 'mul']))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=_sim_env(), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "products near 2^-126" in proc.stdout and "FAIL" in proc.stdout


def test_gpu_selfcheck_script_in_simulator():
    """scripts/gpu-selfcheck runs end to end in the simulator: kernels, vectors, timing table."""
    proc = background.result(SCRIPT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "mul_add  ok" in out
    assert "verdict: CONFORMANT" in out
    device_row = next(line for line in out.splitlines() if "cuda_backend device" in line)
    assert device_row.split()[-1] == "yes"
    op_rows = [line for line in out.splitlines() if line.strip().startswith(("layernorm", "softmax", "attention"))]
    assert len(op_rows) == 3 and all(row.split()[-1] == "yes" for row in op_rows)
    assert "all device outputs equal the reference" in out


@pytest.mark.slow
def test_every_golden_vector_in_simulator():
    """`refreplay conform cuda` in the simulator: every vector of every covered op
    matches bit for bit (about 7 CPU-minutes; the default run covers `max` through
    test_gpu_selfcheck_script_in_simulator)."""
    proc = subprocess.run(
        [sys.executable, "-m", "refreplay", "conform", "cuda"],
        cwd=ROOT,
        env=_sim_env(),
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "verdict: CONFORMANT" in proc.stdout
