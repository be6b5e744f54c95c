"""refreplay.torch's CUDA path, as far as a machine without a GPU can check
it: every function of ``refreplay.torch.functional``, routed to the CUDA
twin (``cuda_backend.host``) in numba-cuda's simulator, gives the CPU
reference's bits, forward and backward.

With a CPU-only PyTorch there are no CUDA tensors, so the check routes CPU
tensors to the ``cuda`` backend (``backend_of`` patched in a subprocess with
``NUMBA_ENABLE_CUDASIM=1``): it covers the calls into the twin (names,
arguments, shapes, saved statistics), not the device copies of a real CUDA
tensor, which stay untested here (docs/torch.md, "Limits").
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

CHILD = r"""
import json, sys
import numpy as np, torch
sys.path.insert(0, "tests")
import test_torch_functional as T
from refreplay import backend as backends
from refreplay.torch import functional as rF
cuda = backends.get("cuda")
assert cuda.name == "cuda" and cuda.linear.__name__.startswith("cuda_backend.")
calls = []
_fwd = cuda.linear.linear_forward
cuda.linear.linear_forward = lambda *a, **k: calls.append(1) or _fwd(*a, **k)
out = {}
for name in sorted(T.CASES):
    make, n_diff, ours, *_ = T.CASES[name]
    rng = np.random.default_rng(sum(map(ord, name)))
    inputs = make(rng, None)
    dout = None
    res = {}
    for device in ("cpu", "cuda"):
        rF.backend_of = (lambda *t: cuda) if device == "cuda" else T._bridge.backend_of
        if dout is None:
            dout = T.rand(rng, np.shape(T.CASES[name][3](*inputs)))
        y, grads = T._run_ours(name, inputs, dout)
        res[device] = [T.bits(y).tolist()] + [T.bits(g).tolist() for g in grads]
    out[name] = res["cpu"] == res["cuda"]
out["twin linear_forward calls"] = len(calls)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def results():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    r = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_every_function_through_the_cuda_twin_gives_the_cpu_bits(results):
    import test_torch_functional as T

    assert results.pop("twin linear_forward calls") == 2  # the two linear cases ran on the twin
    assert sorted(results) == sorted(T.CASES)
    assert [name for name, ok in sorted(results.items()) if not ok] == []
