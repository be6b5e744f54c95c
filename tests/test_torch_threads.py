"""Threads that never fight (refreplay._env, refreplay.torch._bridge):
the OpenMP pool sleeps between kernels, a pool that was loaded spinning
(``import torch`` first) sends Numba to its workqueue layer, and each
refreplay.torch op runs on PyTorch's intra-op thread count, one thread
when it is small, restoring the caller's count.  Bits never depend on any
of it (tests/test_torch_gpt.py runs the model at 1 and 2 threads).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numba
import numpy as np
import pytest
import torch

from refreplay.ops import activations
from refreplay.torch import _bridge
from refreplay.torch import functional as F

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _fresh(code: str, **env) -> dict:
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "NUMBA_THREADING_LAYER")}
    base.update(env, PYTHONPATH=REPO)
    out = subprocess.run([sys.executable, "-c", code], env=base, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


_REPORT = "import os, json, numba; print(json.dumps([os.environ.get('OMP_WAIT_POLICY'), numba.config.THREADING_LAYER]))"


def test_refreplay_first_makes_the_openmp_pool_sleep_and_keeps_numbas_layer():
    policy, layer = _fresh("import refreplay, torch; " + _REPORT)
    assert policy == "PASSIVE" and layer == "default"


def _numba_runtime_first() -> str:
    """Code that loads the OpenMP runtime Numba's omp layer links to, so that
    its waiting policy is fixed (spinning) before refreplay is imported."""
    from pathlib import Path

    from refreplay import _env

    pools = sorted(Path(numba.__file__).parent.joinpath("np", "ufunc").glob("omppool*"))
    names = [n for p in pools[:1] for n in _env._needed(p) if "omp" in n]
    if not names:
        pytest.skip("this Numba has no OpenMP pool")
    return f"import ctypes; ctypes.CDLL({names[0]!r}); "


def test_a_spinning_pool_loaded_first_sends_numba_to_the_workqueue():
    policy, layer = _fresh(_numba_runtime_first() + "import refreplay; " + _REPORT)
    assert layer == "workqueue"


def test_torch_first_keeps_numbas_own_sleeping_pool():
    """A PyTorch wheel brings a private libgomp: Numba's pool is another, loaded later, PASSIVE."""
    shared = _fresh(
        "import torch, refreplay, json; from refreplay import _env; print(json.dumps(_env._numba_omp_shared()))"
    )
    if shared:
        pytest.skip("here torch and Numba share one OpenMP runtime")
    policy, layer = _fresh("import torch, refreplay; " + _REPORT)
    assert policy == "PASSIVE" and layer == "default"


@pytest.mark.parametrize("env", [{"OMP_WAIT_POLICY": "ACTIVE"}, {"NUMBA_THREADING_LAYER": "omp"}])
def test_the_users_own_choice_is_kept(env):
    policy, layer = _fresh("import torch, refreplay; " + _REPORT, **env)
    if "OMP_WAIT_POLICY" in env:
        assert policy == "ACTIVE" and layer == "default"
    else:
        assert layer == "omp"


@pytest.fixture
def idle(monkeypatch):
    """The policy's view of the load: nobody else busy on 64 CPUs, no fixed count."""
    from refreplay import environ

    monkeypatch.delenv(environ.THREADS_ENV, raising=False)
    monkeypatch.setattr(environ, "_FIXED", None)
    monkeypatch.setattr(environ, "affinity", lambda: list(range(64)))
    monkeypatch.setattr(environ, "_running_now", lambda: 0.0)
    monkeypatch.setattr(environ, "_cpu_ticks", lambda cpus: None)  # every sample asks _running_now
    monkeypatch.setattr(environ, "_LOAD", environ._Load())
    # what earlier ops left in the bridge's view of PyTorch's pool (``given``
    # equal to the patched count would read as refreplay's own setting)
    monkeypatch.setattr(_bridge, "_POOL", _bridge._TorchPool())


def test_kernel_threads_follow_torch_and_small_ops_run_on_one(monkeypatch, idle):
    cap = numba.config.NUMBA_NUM_THREADS
    assert _bridge.kernel_threads(_bridge.SMALL_WORK - 1) == 1
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert _bridge.kernel_threads(1 << 24) == 1
    monkeypatch.setattr(torch, "get_num_threads", lambda: 64)
    assert _bridge.kernel_threads(1 << 24) == cap


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs 2 Numba threads")
@pytest.mark.parametrize("n", [64, 1024])
def test_an_op_runs_on_the_chosen_count_and_restores_the_callers(n, monkeypatch, idle):
    seen = []
    real = activations.gelu_forward

    def spy(x):
        seen.append(numba.get_num_threads())
        return real(x)

    monkeypatch.setattr(activations, "gelu_forward", spy)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    numba.set_num_threads(1)
    try:
        x = torch.linspace(-3, 3, n * n).reshape(n, n)
        y = F.gelu(x)
        assert numba.get_num_threads() == 1  # the caller's count, restored
    finally:
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    assert seen == [1 if n * n < _bridge.SMALL_WORK else 2]
    assert np.array_equal(y.numpy().view(np.uint32), real(x.numpy()).view(np.uint32))


@pytest.mark.parametrize("first", ["workqueue", "torch"])
def test_ops_from_several_python_threads_give_the_same_bits(first):
    """Under the workqueue (Numba's runtime loaded first) ops take turns; under
    Numba's own OpenMP pool (torch first) they run side by side."""
    pre = _numba_runtime_first() if first == "workqueue" else ""
    code = (
        pre
        + """
import torch, refreplay, json, threading
import refreplay.torch.functional as F
x = torch.linspace(-3, 3, 512 * 512).reshape(512, 512)
ref = F.gelu(x)
out = []
ts = [threading.Thread(target=lambda: out.append(bool(torch.equal(F.gelu(x), ref)))) for _ in range(4)]
[t.start() for t in ts]; [t.join(60) for t in ts]
import numba; print(json.dumps([numba.threading_layer(), out]))
"""
    )
    layer, out = _fresh(code)
    assert out == [True] * 4
    if first == "workqueue":
        assert layer == "workqueue"
