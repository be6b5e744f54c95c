"""How parallel regions share out their items (``_tiles.claim``) and where
their scratch starts (``_scratch.aligned``): every item is claimed by
exactly one part whatever the part count, and every scratch array starts
on a cache line."""

from __future__ import annotations

import numba
import numpy as np
import pytest
from numba import prange

from refreplay import _scratch
from refreplay._jit import parallel_kernel
from refreplay._tiles import claim


@parallel_kernel
def _claim_all(n, parts, owner, seen):
    """Every part claims items until none of n is left; owner[i] the part
    that took item i, seen[p] the claims part p made (the last one past n).
    (The counter is read only inside the region: read after it, Numba
    handed back the zero it was made with.)"""
    taken = np.zeros(1, np.int64)
    for p in prange(parts):
        i = claim(taken)
        while i < n:
            owner[i] = p
            seen[p] += 1
            i = claim(taken)
        seen[p] += 1


@pytest.mark.parametrize("n", [0, 1, 2, 7, 1000, 100_000])
@pytest.mark.parametrize("parts", [1, 2, 3, 8])
def test_every_item_claimed_once(n, parts):
    owner = np.full(n, -1, np.int64)
    seen = np.zeros(parts, np.int64)
    _claim_all(n, parts, owner, seen)
    assert (owner >= 0).all() and (owner < parts).all()  # every item taken by a part
    # each claim returned a distinct count: items plus one refusal per part
    assert seen.sum() == n + parts
    assert np.bincount(owner, minlength=parts).tolist() == (seen - 1).tolist()


def test_claim_is_a_fetch_and_add():
    """From serial code: each call returns the count before it and adds one."""

    @numba.njit
    def three(c):
        return claim(c), claim(c), claim(c)

    c = np.array([5], np.int64)
    assert three(c) == (5, 6, 7) and c[0] == 8


@pytest.mark.parametrize("n", [1, 3, 16, 17, 1000, 1 << 20])
def test_scratch_starts_on_a_cache_line(n):
    a = _scratch.aligned(n)
    assert a.dtype == np.float32 and a.shape == (n,) and a.flags.c_contiguous and a.flags.writeable
    assert a.ctypes.data % _scratch.ALIGN == 0
    held = _scratch.get(f"test-align-{n}", n)
    assert held.ctypes.data % _scratch.ALIGN == 0 and held.shape[0] >= n
    _scratch.release()
