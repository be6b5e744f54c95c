"""Cached code from different processes links to the right bodies.

Numba names compiled code by qualified name, a per-process counter and the
argument types, and a cached function carries its callees' code under those
names.  When two processes compile in different orders, one name can stand
for two bodies, and a third process that loads both cached callers links
them to one of them.  That happened: the four tile closures of
``mm_fp32._proved`` shared the name ``_proved.<locals>.proved``, and after
two test workers had filled a cold cache, A·Bᵀ ran A·B's tile (wrong bits).
The fixes, both checked here: every kernel has a name of its own in its
module, and each process starts Numba's counter at a random point
(``_jit._process_unique_ids``).  The end-to-end check rebuilds the cache such
a race leaves: two processes compile matmul A·B and A·Bᵀ, the second after
moving its counter on, and a third loads both and must give the
one-output-at-a-time loops' bits.
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import textwrap

import numba
from numba.core.registry import CPUDispatcher

from refreplay import _env


def _kernel_modules():
    for path in _env.kernel_closure():
        rel = path.relative_to(_env.PACKAGE_DIR).with_suffix("")
        parts = [p for p in rel.parts if p != "__init__"]
        yield importlib.import_module(".".join(["refreplay", *parts]))


def test_every_kernel_has_its_own_name():
    seen = {}
    count = 0
    for mod in _kernel_modules():
        for attr, obj in vars(mod).items():
            if isinstance(obj, CPUDispatcher) and obj.py_func.__module__ == mod.__name__:
                count += 1
                key = (mod.__name__, obj.py_func.__qualname__)
                other = seen.setdefault(key, obj)
                assert other is obj, f"{key}: two kernels ({attr} and another) compile under one name"
    assert count > 100, count  # the scan found the kernels


def test_the_check_sees_a_shared_name():
    """The name check has teeth: two kernels from one factory share a qualname."""

    def make(k):
        def f(x):
            return x + k

        return numba.njit(f)

    a, b = make(1), make(2)
    assert a.py_func.__qualname__ == b.py_func.__qualname__


_CHILD_IDS = (
    "import refreplay._jit; from numba.core import bytecode; print(next(bytecode.FunctionIdentity._unique_ids))"
)


def test_each_process_numbers_its_functions_from_a_random_point():
    runs = [
        subprocess.run([sys.executable, "-c", _CHILD_IDS], capture_output=True, text=True, timeout=120, check=True)
        for _ in range(2)
    ]
    first = [int(r.stdout.split()[-1]) for r in runs]
    assert first[0] != first[1]
    assert min(first) > 1 << 20  # not Numba's own count from 1


_COMPILE = textwrap.dedent(
    """
    import sys
    import numba
    import numpy as np
    from refreplay import linalg as L
    form, shift = sys.argv[1], int(sys.argv[2])
    for i in range(shift):  # compile throwaway functions: the counter moves on
        numba.njit(eval(f"lambda x: x + {i}"))(1)
    A = np.ones((9, 40), np.float32)
    B = np.ones((40, 80), np.float32)
    (L.matmul if form == "nn" else L.matmul_nt)(A, B if form == "nn" else np.ascontiguousarray(B.T))
    """
)

_CHECK = textwrap.dedent(
    """
    import numpy as np
    from refreplay import linalg as L
    from refreplay.numerics import load
    rng = np.random.default_rng(3)
    bad = []
    for J in (96, 80, 64, 50):  # last panels 48, 32, 16 and 2 wide
        A = load(rng.standard_normal((19, 70)).astype(np.float32))
        B = load(rng.standard_normal((70, J)).astype(np.float32))
        Bt = np.ascontiguousarray(B.T)
        for name, fast, slow, b in (("nn", L.matmul, L.mm_nn_naive, B), ("nt", L.matmul_nt, L.mm_nt_naive, Bt)):
            want = np.zeros((19, J), np.float32)
            slow(A, b, want)
            if not np.array_equal(fast(A, b).view(np.uint32), want.view(np.uint32)):
                bad.append((name, J))
    print("BAD", bad) if bad else print("OK")
    """
)


def _env_for(cache):
    env = dict(os.environ, REFREPLAY_CACHE_ROOT=str(cache), NUMBA_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_env.PACKAGE_DIR.parent), env.get("PYTHONPATH")]))
    return env


def test_cached_callers_compiled_by_two_processes(tmp_path):
    """Process 1 compiles A·B into one cold cache; process 2, its counter one
    function further on, compiles A·Bᵀ into another; the two caches are put
    together (the first, plus the second's A·Bᵀ entry) as two processes
    sharing one cache leave it when they compile at the same time; a third
    process loads both and must give the loops' bits.  With Numba's counter
    starting at 1 in each process and the tiles' functions sharing a name,
    A·Bᵀ's tiles ran A·B's 8 x 32 tile for the 8 x 48 (measured: "BAD")."""
    caches = [tmp_path / "one", tmp_path / "two"]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _COMPILE, form, str(shift)],
            env=_env_for(cache),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for cache, form, shift in ((caches[0], "nn", 0), (caches[1], "nt", 1))
    ]
    try:
        for p in procs:
            _, err = p.communicate(timeout=600)
            assert p.returncode == 0, err[-2000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    merged = tmp_path / "merged"
    shutil.copytree(caches[0], merged)
    moved = 0
    for f in caches[1].rglob("mm_fp32.mm_nt-*"):
        dst = merged / f.relative_to(caches[1])
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, dst)
        moved += 1
    assert moved >= 2  # the index and its data
    r = subprocess.run(
        [sys.executable, "-c", _CHECK], env=_env_for(merged), capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "OK", r.stdout
