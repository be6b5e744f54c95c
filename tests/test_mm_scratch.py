"""The matmul's reused scratch (``linalg.api``): one per Python thread, taken
by the compiled driver for its packs (``mm_fp32.pack_sizes``), never a
source of bits: whatever it held, whichever thread, whether it is big
enough or not, every output is the one-at-a-time loops'."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from refreplay import _scratch
from refreplay.linalg import api, mm_fp32 as M
from refreplay.linalg.blocking import Blocks, machine_blocks
from refreplay.linalg.mm_fp32_naive import mm_nn_naive, mm_nt_naive, mm_tn_naive

F32 = np.float32
FORMS = (
    (api.matmul, mm_nn_naive, lambda I, K, J: ((I, K), (K, J))),
    (api.matmul_nt, mm_nt_naive, lambda I, K, J: ((I, K), (J, K))),
    (api.matmul_tn, mm_tn_naive, lambda I, K, J: ((K, I), (K, J))),
)
# small blocks, so that small shapes take the column-blocked path (packed A in the scratch too)
SMALL = Blocks(kc=16, b_cached=2 * 16 * M.MM_NR, b_block=16 * M.MM_NR, a_rows=2 * M.MM_MR)


def _want(naive, A, B, I, J):
    C = np.empty((I, J), F32)
    naive(A, B, C)
    return C.view(np.uint32)


@pytest.mark.parametrize("form", range(3))
@pytest.mark.parametrize("blocks", [None, SMALL])
def test_scratch_left_full_of_nan_changes_no_bit(form, blocks):
    """A scratch that an earlier call left holding NaN everywhere gives the
    same bits: every pack overwrites what it reads (zero padding included)."""
    fn, naive, shapes = FORMS[form]
    rng = np.random.default_rng(form)
    api.release_scratch()
    for I, K, J in ((37, 53, 101), (8, 16, 48), (1, 70, 3), (130, 33, 97)):
        A, B = (rng.standard_normal(s).astype(F32) for s in shapes(I, K, J))
        fn(A, B, blocks=blocks)
        _scratch.held("matmul")[:] = np.nan
        assert np.array_equal(fn(A, B, blocks=blocks).view(np.uint32), _want(naive, A, B, I, J))


def test_one_scratch_is_kept_and_grown():
    """The thread keeps one buffer: a smaller product reuses it, a larger one
    replaces it, release_scratch() drops it."""
    rng = np.random.default_rng(1)
    api.release_scratch()
    b = machine_blocks().args()
    A, B = rng.standard_normal((64, 96)).astype(F32), rng.standard_normal((96, 200)).astype(F32)
    api.matmul(A, B)
    first = _scratch.held("matmul")
    assert first.shape[0] >= M.scratch_floats(64, 200, 96, *b) > 0
    api.matmul(A[:8], np.ascontiguousarray(B[:, :40]))
    assert _scratch.held("matmul") is first
    A2, B2 = rng.standard_normal((64, 400)).astype(F32), rng.standard_normal((400, 300)).astype(F32)
    api.matmul(A2, B2)
    assert _scratch.held("matmul").shape[0] >= M.scratch_floats(64, 300, 400, *b) > first.shape[0]
    api.release_scratch()
    assert _scratch.held("matmul") is None


def test_a_product_above_the_cap_keeps_no_scratch(monkeypatch):
    """Past MAX_FLOATS floats the driver allocates its own packs (the same
    bits) and the thread keeps nothing."""
    rng = np.random.default_rng(2)
    api.release_scratch()
    monkeypatch.setattr(_scratch, "MAX_FLOATS", 100)
    A, B = rng.standard_normal((40, 30)).astype(F32), rng.standard_normal((30, 50)).astype(F32)
    for blocks in (None, SMALL):
        assert np.array_equal(api.matmul(A, B, blocks=blocks).view(np.uint32), _want(mm_nn_naive, A, B, 40, 50))
    assert _scratch.held("matmul") is None


@pytest.mark.parametrize("n", [0, 3])
def test_a_scratch_too_small_is_not_used(n):
    """The compiled driver given a scratch below scratch_floats allocates
    instead of writing past it."""
    rng = np.random.default_rng(3)
    A, B = rng.standard_normal((33, 70)).astype(F32), rng.standard_normal((70, 90)).astype(F32)
    guard = np.full(n + 16, np.nan, F32)
    C = np.empty((33, 90), F32)
    M.mm_nn(A, B, C, False, *SMALL.args(), 2, guard[:n])
    assert np.isnan(guard[n:]).all()
    assert np.array_equal(C.view(np.uint32), _want(mm_nn_naive, A, B, 33, 90))


def test_threads_keep_scratches_of_their_own():
    """Python threads calling at once each use their own scratch: every
    result is the naive one's."""
    rng = np.random.default_rng(4)
    cases = [tuple(rng.standard_normal(s).astype(F32) for s in ((50 + i, 40), (40, 60 + 7 * i))) for i in range(4)]
    wants = [_want(mm_nn_naive, A, B, A.shape[0], B.shape[1]) for A, B in cases]
    bad, seen = [], []

    def work(i):
        A, B = cases[i]
        for _ in range(20):
            if not np.array_equal(api.matmul(A, B, blocks=SMALL).view(np.uint32), wants[i]):
                bad.append(i)
        seen.append(id(_scratch.held("matmul")))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not bad and len(set(seen)) == 4
