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

import background
import pytest

if importlib.util.find_spec("numba_cuda") is None:
    pytest.skip("numba-cuda is not installed (pip install -e '.[cuda]')", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys
import numpy as np, torch
sys.path.insert(0, "tests")
import test_torch_functional as T
from refreplay.training import backend as backends
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

# the step's tail on the twin: fold of 3 micro-batch leaves, clip, AdamW
from refreplay.torch import GradFold, fold as rfold, optim as ropt
def tail(backend):
    rfold.backend_of = ropt.backend_of = backend
    rng = np.random.default_rng(3)
    named = {"b": torch.nn.Parameter(torch.from_numpy(T.rand(rng, (5,)))),
             "w": torch.nn.Parameter(torch.from_numpy(T.rand(rng, (5, 4))))}
    opt = ropt.AdamW([{"params": [named["w"]]}, {"params": [named["b"]], "weight_decay": 0.0}], lr=np.float32(0.01))
    fold = GradFold(named)
    for m in range(3):
        for k, p in named.items():
            p.grad = torch.from_numpy(T.rand(rng, tuple(p.shape), 3))
        fold.push(torch.tensor(np.float32(m + 0.25)))
    loss = fold.mean()
    ropt.clip_grad_norm_(named, np.float32(1.0))
    opt.step()
    return [int(np.float32(loss).view(np.uint32))] + [T.bits(p).tolist() for _, p in sorted(named.items())]
out["fold, clip and AdamW"] = tail(T._bridge.backend_of) == tail(lambda *t: cuda)
print(json.dumps(out))
"""


# started at collection, in the background (tests/background.py)
CHILD_JOB = background.register(
    "torch-cuda-twin",
    lambda _: [sys.executable, "-c", CHILD],
    env=dict(os.environ, NUMBA_ENABLE_CUDASIM="1"),
    timeout=900,
    tests=("test_every_function_through_the_cuda_twin_gives_the_cpu_bits",),
)


@pytest.fixture(scope="module")
def results():
    r = background.result(CHILD_JOB)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_every_function_through_the_cuda_twin_gives_the_cpu_bits(results):
    import test_torch_functional as T

    assert results.pop("twin linear_forward calls") == 2  # the two linear cases ran on the twin
    assert results.pop("fold, clip and AdamW") is True
    assert sorted(results) == sorted(T.CASES)
    assert [name for name, ok in sorted(results.items()) if not ok] == []


MICRO_BATCH = r"""
import importlib.util, json, sys
import numpy as np, torch
from refreplay.training import backend as backends
from refreplay.conformance.golden import steps as golden
from refreplay.training.data import inputs_targets
from refreplay.training.model import Model, init_params
from refreplay.torch import functional as rF
cuda = backends.get("cuda")
rF.backend_of = lambda *t: cuda
spec = importlib.util.spec_from_file_location("tg", "examples/torch_gpt/train.py")
T = importlib.util.module_from_spec(spec)
spec.loader.exec_module(T)
out = {}
for case in golden.load("vectors/steps.json"):
    x, y = inputs_targets(case.samples[:case.train.micro_batch_size])
    model, named, _, _ = T.build(case.model, case.train)
    loss = model(torch.from_numpy(x), torch.from_numpy(y))
    loss.backward()
    ref = Model(case.model).loss_and_grads(init_params(case.model, case.train.seed), x, y)
    out[case.name] = bool(loss.detach().numpy().view(np.uint32) == np.float32(ref.loss).view(np.uint32)) and all(
        np.array_equal(p.grad.numpy().view(np.uint32), ref.grads[k].view(np.uint32)) for k, p in named.items())
print(json.dumps(out))
"""


@pytest.mark.slow
def test_the_torch_gpt_on_the_twin_gives_the_reference_models_micro_batch_bits():
    """[model.forward.c1] [model.backward.c1] One micro-batch of each golden
    case, the whole torch GPT on the CUDA twin in the simulator: loss and
    every gradient equal the CPU reference model's (minutes: 6 for both on a
    loaded 2-core machine)."""
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    r = subprocess.run(
        [sys.executable, "-c", MICRO_BATCH], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {"tiny": True, "layer-swiglu-int8": True}
