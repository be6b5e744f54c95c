"""refreplay._shares.in_shares: every independent call runs exactly once,
shares are balanced by size, a call's exception reaches the caller; and the
two users give the bits of the one-thread loop: gradient clipping's
per-tensor sums ([optim.clip.c1]) and the state hash ([state.root.c1])."""

from __future__ import annotations

import threading

import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refreplay import state
from refreplay._shares import in_shares
from refreplay.ops import optim


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(0, 1000), max_size=40), workers=st.integers(1, 5))
def test_every_call_runs_once(sizes, workers):
    seen = []
    lock = threading.Lock()

    def work(i):
        with lock:
            seen.append(i)

    in_shares(work, sizes, workers)
    assert sorted(seen) == list(range(len(sizes)))


def test_shares_are_balanced_by_size():
    """One large item and many small: the large one gets a thread of its own."""
    where = {}

    def work(i):
        where[i] = threading.current_thread().name

    sizes = [100] + [10] * 10
    in_shares(work, sizes, 2)
    big = where[0]
    assert all(where[i] != big for i in range(1, 11))


def test_an_exception_in_a_call_is_raised_to_the_caller():
    def work(i):
        if i == 3:
            raise ValueError("call 3")

    with pytest.raises(ValueError, match="call 3"):
        in_shares(work, [1] * 8, 2)


def _grads(rng):
    shapes = [(50, 7), (3,), (1000,), (17, 33), (0,), (4, 4, 4), (2048,)]
    return {
        f"t{i}": (rng.standard_normal(s) * rng.choice([1e-3, 1.0, 30.0])).astype(np.float32)
        for i, s in enumerate(shapes)
    }


def _serial_clip(grads, max_norm):
    """[optim.clip.c1] with step 1 one tensor after another, as before."""
    names = sorted(grads)
    partials = np.array([optim.sum_of_squares(grads[k].reshape(-1)) for k in names], np.float32)
    norm, coef = optim.clip_coefficient(partials, max_norm)
    if coef < np.float32(1.0):
        for k in names:
            optim.scale_kernel(grads[k].reshape(-1), coef)
    return np.float32(norm), np.float32(coef)


@pytest.mark.threads
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_clipping_on_threads_has_the_serial_bits(seed):
    rng = np.random.default_rng(seed)
    grads = _grads(rng)
    want = {k: v.copy() for k, v in grads.items()}
    want_nc = _serial_clip(want, np.float32(1.0))
    keep = numba.get_num_threads()
    try:
        for n in sorted({1, numba.config.NUMBA_NUM_THREADS}):
            numba.set_num_threads(n)
            got = {k: v.copy() for k, v in grads.items()}
            nc = optim.clip_grad_norm(got, np.float32(1.0))
            assert np.array([nc]).view(np.uint32).tolist() == np.array([want_nc]).view(np.uint32).tolist()
            for k in grads:
                assert got[k].tobytes() == want[k].tobytes(), (n, k)
    finally:
        numba.set_num_threads(keep)


def test_state_hash_on_threads_has_the_one_thread_root():
    rng = np.random.default_rng(4)
    tensors = {f"p{i}": rng.standard_normal(n).astype(np.float32) for i, n in enumerate([1, 5000, 70000, 3, 0, 12345])}
    one = state.state_hash(tensors, 1)
    for workers in (2, 3, 7):
        assert state.state_hash(tensors, workers).root == one.root
