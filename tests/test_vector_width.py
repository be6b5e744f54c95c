"""The vector width of Numba's vectorised loops changes no bit (refreplay._jit:
512-bit vectors on an x86-64 CPU with AVX-512, where LLVM's tuning would
prefer 256).

Two child processes run the element-wise and row ops on the same adversarial
inputs (subnormals, signed zeros, infinities, NaNs with payloads, values
around every branch point), one with LLVM's 256-bit preference turned off
and one with it on; their outputs must be the same bytes.  On a CPU with
AVX-512 the children also show that the setting reaches the machine code:
a loop compiled in the first uses zmm registers, in the second none.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from numba.core import config

from refreplay import _jit

CHILD = textwrap.dedent(
    """
    import hashlib, json, re, sys
    import numpy as np
    from numba import njit
    from numba.core import config
    from refreplay.ops import activations as act, norms, softmax, loss, optim

    rng = np.random.default_rng(7)

    def values(n):
        x = (rng.standard_normal(n) * rng.choice([1e-3, 1.0, 3.0, 12.0, 100.0], n)).astype(np.float32)
        special = np.array([0x00000001, 0x80000001, 0x007FFFFF, 0x00800000, 0x80000000, 0, 0x7F800000,
                            0xFF800000, 0x7FC00001, 0xFFC12345, 0x3F400000, 0xBF400000, 0x42B00000,
                            0xC2B00000, 0x7F7FFFFF, 0xFF7FFFFF], dtype=np.uint32).view(np.float32)
        s = n // special.size
        x[: special.size * s : s] = special
        return x

    out = {}
    def record(name, *results):
        h = hashlib.sha256()
        todo = list(results)
        while todo:
            a = todo.pop(0)
            if isinstance(a, tuple):
                todo[:0] = a
            else:
                h.update(np.ascontiguousarray(a).tobytes())
        out[name] = h.hexdigest()

    x, d = values(4099), values(4099)
    y = np.empty_like(x); act.gelu_forward_kernel(y, x); record("gelu", y)
    y = np.empty_like(x); act.gelu_backward_kernel(y, d, x); record("gelu_bwd", y)
    y = np.empty_like(x); act.silu_forward_kernel(y, x); record("silu", y)
    y = np.empty_like(x); act.silu_backward_kernel(y, d, x); record("silu_bwd", y)
    X = values(37 * 131).reshape(37, 131)
    w, b = values(131), values(131)
    record("layernorm", *norms.layernorm_forward(X, w, b))
    record("rmsnorm", *norms.rmsnorm_forward(X, w))
    record("softmax", softmax.softmax_forward(X))
    record("log_softmax", softmax.log_softmax_forward(X))
    Z = (rng.standard_normal((37, 131)) * 4).astype(np.float32)
    t = rng.integers(0, 131, 37).astype(np.int32)
    record("cross_entropy", loss.cross_entropy_forward(Z, t))
    record("cross_entropy_bwd", loss.cross_entropy_backward(Z, t))
    p, g = values(4099), values(4099)
    m, v = np.zeros_like(p), np.zeros_like(p)
    optim.adamw_update(p, g, m, v, 3, np.float32(1e-3))
    record("adamw", p, m, v)

    @njit(cache=False, error_model="numpy")
    def loop(o, a):
        for i in range(a.shape[0]):
            o[i] = act.gelu_lane(a[i])
    loop(y, x)
    asm = "".join(loop.inspect_asm().values())
    json.dump({"hashes": out, "features": config.CPU_FEATURES, "zmm": len(re.findall("zmm", asm))}, sys.stdout)
    """
)


def _child(features: str) -> dict:
    env = dict(os.environ, NUMBA_CPU_FEATURES=features)
    env.pop("NUMBA_CPU_NAME", None)
    r = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def _host_features():
    import llvmlite.binding as ll

    return ll.get_host_cpu_features()


@pytest.mark.skipif(not _jit.x86_64(), reason="x86-64 only")
def test_512_and_256_bit_loops_give_the_same_bits():
    host = _host_features()
    wide = _child(host.flatten() + ",-prefer-256-bit")
    narrow = _child(host.flatten() + ",+prefer-256-bit")
    assert wide["features"].endswith("-prefer-256-bit") and narrow["features"].endswith("+prefer-256-bit")
    assert len(wide["hashes"]) == 11
    assert wide["hashes"] == narrow["hashes"]
    if host.get("avx512f"):  # the setting reaches the machine code
        assert wide["zmm"] > 0 and narrow["zmm"] == 0, (wide["zmm"], narrow["zmm"])


class _Features(dict):
    def flatten(self):
        return ",".join(("+" if on else "-") + k for k, on in self.items())


def _decide(monkeypatch, machine="x86_64", environ=(), features=None, name=None, feats=None, made=False):
    monkeypatch.setattr(_jit.platform, "machine", lambda: machine)
    monkeypatch.setattr(_jit, "_codegen_made", lambda: made)
    monkeypatch.setattr(config, "CPU_NAME", name)
    monkeypatch.setattr(config, "CPU_FEATURES", feats)
    import llvmlite.binding as ll

    monkeypatch.setattr(ll, "get_host_cpu_features", lambda: _Features(features or {"avx512f": True, "avx2": True}))
    return _jit._full_width_vectors(dict(environ))


def test_the_host_features_plus_the_flag_on_avx512(monkeypatch):
    got = _decide(monkeypatch, features={"avx2": True, "avx512f": True, "sse2": True})
    assert got == "+avx2,+avx512f,+sse2,-prefer-256-bit"


@pytest.mark.parametrize(
    "case",
    [
        dict(machine="aarch64"),
        dict(features={"avx2": True, "avx512f": False}),
        dict(features={"avx2": True}),
        dict(environ={"NUMBA_CPU_NAME": "generic"}),
        dict(environ={"NUMBA_CPU_FEATURES": "+avx2"}),
        dict(environ={"NUMBA_ENABLE_AVX": "0"}),
        dict(name="skylake-avx512"),
        dict(feats=""),
        dict(made=True),
    ],
    ids=[
        "arm",
        "avx512-off",
        "avx2",
        "user-cpu-name",
        "user-features",
        "user-avx",
        "config-name",
        "config-features",
        "codegen-made",
    ],
)
def test_left_alone(monkeypatch, case):
    assert _decide(monkeypatch, **case) is None


def test_this_process_got_the_setting():
    """The code generator Numba made in this process compiles with the setting."""
    from numba.core.registry import cpu_target

    features = cpu_target.target_context.codegen()._tm_features
    host = _host_features()
    user = any(k in os.environ for k in _jit.USER_CPU_VARS)
    if _jit.x86_64() and host.get("avx512f") and not user:
        assert features == host.flatten() + ",-prefer-256-bit"
    else:
        assert not features.endswith(",-prefer-256-bit")
