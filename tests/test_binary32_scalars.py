"""No compiled kernel runs with a binary64 scalar through the public API
([num.mul.c1] [num.flush.c1]: every operation is binary32, rounded, then
flushed).

Numba hands a compiled float32 result to Python as a float.  Passed on to
another kernel as one, it types that kernel's arithmetic as binary64: the
product is formed exactly, flushed while it is still below 2^-126, and only
then rounded to binary32, so a result that binary32 rounds up to the
smallest normal became 0 (attention's scale and cross-entropy's gradient
coefficient did this; test_attention_tiles and test_ops_b hold the
constructed inputs).  Here a fresh process calls every public op and the
training-step helpers that compute a scalar in one kernel and use it in
another (and, in the slow test, the reference on every golden vector: every
op of the suite, the bf16 profile's included), then lists every compiled
signature of every refreplay kernel: none may take a float64 scalar.  A
fresh process, because signatures are global to a process and tests call
the primitives with binary64 on purpose.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SCRIPT = r"""
import json, sys
import numpy as np
from numba.core import types
from numba.core.registry import CPUDispatcher
from refreplay.ops import activations as AC, attention as A, loss as L, norms as N, optim as O
from refreplay.ops import quant as Q, rope as R, softmax as S
from refreplay.training import treefold as TF
from refreplay.training.model import init_scale

rng = np.random.default_rng(5)
f = lambda *s: rng.standard_normal(s).astype(np.float32)
q, k, v, do = (f(1, 2, 9, 8) for _ in range(4))
o, att = A.attention_forward(q, k, v)
A.attention_backward(do, q, k, v, att)
lg, tg = f(6, 11), np.array([0, 3, -1, 10, 2, 5], np.int32)
L.cross_entropy_forward(lg, tg)
L.cross_entropy_backward(lg, tg, dloss=np.float32(0.5), count=7)
S.softmax_backward(lg, S.softmax_forward(lg))
x, w, b = f(4, 16), f(16), f(16)
out, mean, rstd = N.layernorm_forward(x, w, b)
N.layernorm_backward(f(4, 16), x, w, mean, rstd)
out, rr = N.rmsnorm_forward(x, w)
N.rmsnorm_backward(f(4, 16), x, w, rr)
AC.gelu_backward(AC.gelu_forward(x), x)
AC.silu_backward(AC.silu_forward(x), x)
AC.swiglu_backward(AC.swiglu_forward(x, out), x, out)
cs, sn = R.rope_tables(9, 8)
R.rope_backward(R.rope_forward(q, cs, sn), cs, sn)
Q.step_size(x)
Q.step_size_rows(x)
wq = f(6, 16)
Q.qlinear_forward(x[None], wq, f(6))
Q.qlinear_backward(f(1, 4, 6), x[None], wq)
grads = {"a": f(7), "b": f(3, 5)}
O.clip_grad_norm(grads, np.float32(1.0))
params = {"a": f(7), "b": f(3, 5)}
m, vv = O.adamw_init(params)
O.adamw_update(params["a"], grads["a"], m["a"], vv["a"], 1, np.float32(1e-3))
O.adamw_step(params, grads, m, vv, step=2, lr=O.lr_at(2, 1, 10, np.float32(1e-3), np.float32(1e-4)))
TF.scale(f(5), 3)
init_scale(np.float32(0.02))
if "--vectors" in sys.argv:  # every op of the golden vectors (the bf16 profile's too) through the reference
    from refreplay.conformance.golden import store
    from refreplay.conformance.running import adapters, compare
    manifest, cases = store.load_cases(store.VECTOR_DIR)
    compare.run(adapters.resolve("reference"), cases)
    assert len(cases) > 1000, len(cases)

bad = []
for name, mod in list(sys.modules.items()):
    if not name.startswith("refreplay"):
        continue
    for attr, obj in vars(mod).items():
        if isinstance(obj, CPUDispatcher):
            for sig in obj.signatures:
                if any(a == types.float64 for a in sig):
                    bad.append(f"{name}.{attr}{sig}")
print(json.dumps(sorted(set(bad))))
"""


def _binary64_signatures(*args):
    env = dict(os.environ, NUMBA_NUM_THREADS="1")
    cmd = [sys.executable, "-c", SCRIPT, *args]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_no_kernel_takes_a_binary64_scalar():
    bad = _binary64_signatures()
    assert bad == [], "kernels compiled with a binary64 scalar:\n" + "\n".join(bad)


@pytest.mark.slow
def test_no_kernel_takes_a_binary64_scalar_on_the_golden_vectors():
    bad = _binary64_signatures("--vectors")
    assert bad == [], "kernels compiled with a binary64 scalar:\n" + "\n".join(bad)
