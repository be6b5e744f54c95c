"""The data movement under the row kernels: the 8 x 8 transpose, the 4 x 16
interleave of attention's packs, the tile
copies built on it, stack lanes and the prefetch hint (``refreplay/_tiles.py``,
``refreplay/ops/rowblock.py``).  None of them computes, so each must move
every element to its place and nothing else: compared here with numpy's
transpose, element by element, at every width and row count a block can have."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit
from numba.core.errors import TypingError

from refreplay._tiles import interleave4, stack_lanes, transpose8
from refreplay.linalg.mm_fp32 import pack_a
from refreplay.ops.rowblock import RB, load_block, load_chunk, prefetch_block, store_chunk


def patterns(shape, seed=0):
    """Distinct bit patterns (NaN payloads and subnormals included): a copy
    that moved an element through an arithmetic register would change some."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 1 << 32, size=shape, dtype=np.uint64).astype(np.uint32).view(np.float32)


def same(a, b):
    return np.array_equal(np.ascontiguousarray(a).view(np.uint32), np.ascontiguousarray(b).view(np.uint32))


@njit
def _transpose8_at(X, xi, xj, T, ti, tj):
    transpose8(X, xi, xj, T, ti, tj)


def test_transpose8_moves_each_element_once():
    """T[ti + c, tj + r] = X[xi + r, xj + c] for r, c < 8; the rest of T untouched."""
    X = patterns((20, 21), 1)
    for xi, xj, ti, tj in ((0, 0, 0, 0), (3, 5, 9, 2), (12, 13, 0, 11)):
        T = patterns((17, 19), 2)
        want = T.copy()
        want[ti : ti + 8, tj : tj + 8] = X[xi : xi + 8, xj : xj + 8].T
        _transpose8_at(X, xi, xj, T, ti, tj)
        assert same(T, want)


def test_transpose8_on_strided_views_moves_element_by_element():
    """Arrays that are not C-contiguous take the element-wise form, same result."""
    X = patterns((20, 42), 3)
    T = np.zeros((16, 40), np.float32)
    Xs, Ts = X[:, ::2], T[:, ::2]
    _transpose8_at(Xs, 2, 3, Ts, 4, 5)
    want = np.zeros((16, 40), np.float32)
    want[:, ::2][4:12, 5:13] = Xs[2:10, 3:11].T
    assert same(T, want)


@njit
def _interleave4_at(X, xi, xj, out, off):
    interleave4(X, xi, xj, out, off)


def test_interleave4_moves_each_element_once():
    """out[off + 4c + r] = X[xi + r, xj + c] for r < 4, c < 16; the rest of
    out untouched; strided arrays take the element-wise form, same result."""
    X = patterns((11, 40), 4)
    for xi, xj, off in ((0, 0, 0), (7, 24, 5), (3, 9, 130)):
        out = patterns(200, 5)
        want = out.copy()
        want[off : off + 64] = X[xi : xi + 4, xj : xj + 16].T.reshape(-1)
        _interleave4_at(X, xi, xj, out, off)
        assert same(out, want)
    Xs, outs = X[:, ::2], np.zeros(300, np.float32)[::2]
    _interleave4_at(Xs, 2, 3, outs, 7)
    want = np.zeros(150, np.float32)
    want[7:71] = Xs[2:6, 3:19].T.reshape(-1)
    assert same(outs, want)


@pytest.mark.parametrize("kc", [1, 15, 16, 17, 33, 64, 100])
@pytest.mark.parametrize("rows", [1, 3, 4])
def test_pack_a_of_four_rows(kc, rows):
    """mm_fp32.pack_a with MR = 4 (attention's strips; 16 k at a time by
    interleave4, then element by element): Ap[k*4 + r] = A[i0 + r, k0 + k],
    +0 past the last row, at every k length and for a short last block."""
    A = patterns((9, 130), 6)
    i0, k0 = 9 - rows if rows < 4 else 2, 5
    Ap = patterns(kc * 4, 7)
    pack_a(A, False, i0, k0, kc, Ap, 4)
    want = np.zeros((kc, 4), np.float32)
    want[:, :rows] = A[i0 : i0 + rows, k0 : k0 + kc].T
    assert same(Ap, want.reshape(-1))


@pytest.mark.parametrize("width", [1, 7, 8, 9, 16, 23, 64, 77, 256])
@pytest.mark.parametrize("rows", [1, 5, 8, RB - 1, RB])
def test_tile_copies_equal_the_transpose(width, rows):
    """load_chunk / load_block / store_chunk at every chunk width (a multiple
    of 8 and ragged) and row count (a full block and partial ones)."""
    N, C = RB + 11, width + 13
    X = patterns((N, C), width * 100 + rows)
    i0, c0 = 7, 5
    T = patterns((width, RB), 4)
    want = T.copy()
    want[:, :rows] = X[i0 : i0 + rows, c0 : c0 + width].T
    load_chunk(X, i0, rows, c0, T)
    assert same(T, want)  # lanes r >= rows keep what they held

    blk = load_block(X[:, :width].copy(), i0, rows)
    want = np.zeros((width, RB), np.float32)
    want[:, :rows] = X[i0 : i0 + rows, :width].T
    assert same(blk, want)  # lanes r >= rows are +0

    Y = patterns((N, C), 5)
    want = Y.copy()
    want[i0 : i0 + rows, c0 : c0 + width] = T[:, :rows].T
    store_chunk(T, Y, i0, rows, c0)
    assert same(Y, want)


@njit
def _lanes_sum(x):
    acc = stack_lanes(RB)
    for r in range(RB):
        acc[r] = 0.0
    for c in range(x.shape[0]):
        for r in range(RB):
            acc[r] += x[c, r]
    out = np.empty(RB, np.float32)
    for r in range(RB):
        out[r] = acc[r]
    return out


def test_stack_lanes_hold_their_values():
    x = np.arange(5 * RB, dtype=np.float32).reshape(5, RB)
    assert same(_lanes_sum(x), x[0] + x[1] + x[2] + x[3] + x[4])


def test_stack_lanes_need_a_literal_size():
    @njit
    def dynamic(n):
        return stack_lanes(n)[0]

    with pytest.raises(TypingError):
        dynamic(4)


def test_prefetch_block_changes_nothing_and_stops_at_the_end():
    X = patterns((RB + 3, 50), 6)
    before = X.copy()
    for i0 in (0, RB, RB + 3, 2 * RB, 10 * RB):  # a partial block, and blocks past the end
        prefetch_block(X, i0)
    assert same(X, before)
