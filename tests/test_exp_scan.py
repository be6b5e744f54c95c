"""The exponent scans (rows_exp_min, cols_exp_min, and the pieces the
driver's threaded prologue runs them from: scan_share over block_exp_min or
col_keys_chunk, then cols_exp_finish; refreplay/linalg/mm_fp32.py) give
exactly what exp_floor taken element by element gives: the minimum exponents that decide which
flushes a tile may skip ([mm.flush.r1]).  A wrong minimum would let a tile
skip a flush it needs, so every kind of element is drawn: signed zeros,
subnormals, the smallest and largest normals, infinities and NaNs of every
payload, in every position of a block, for the block sizes the driver uses
and shapes around them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refreplay.linalg import mm_fp32 as M
from refreplay.linalg._tile import MR, NR

pytestmark = pytest.mark.usefixtures("one_numba_thread")

EDGE_BITS = [
    0x00000000,
    0x80000000,
    0x00000001,  # smallest subnormal
    0x807FFFFF,  # largest subnormal
    0x00800000,  # smallest normal
    0x80800001,
    0x3F800000,
    0x7F7FFFFF,  # largest finite
    0xFF7FFFFF,
    0x7F800000,  # +inf
    0xFF800000,
    0x7F800001,  # NaN, smallest payload
    0x7FC00000,
    0xFFFFFFFF,
]


def _elements():
    edge = st.sampled_from(EDGE_BITS)
    normal = st.integers(0x00800000, 0x7F7FFFFF)
    any_bits = st.integers(0, 0xFFFFFFFF)
    sign = st.sampled_from([0, 0x80000000])
    return st.one_of(edge, st.tuples(normal, sign).map(lambda t: t[0] | t[1]), any_bits)


@st.composite
def matrices(draw):
    """Up to 70 x 140: every element drawn (small ones), or one value with up
    to 12 drawn elements placed anywhere."""
    rows, cols = draw(st.integers(0, 70)), draw(st.integers(0, 140))
    n = rows * cols
    if 0 < n <= 64 and draw(st.booleans()):
        bits = np.array(draw(st.lists(_elements(), min_size=n, max_size=n)), np.uint32)
    else:
        bits = np.full(n, draw(st.sampled_from(EDGE_BITS)), np.uint32)
        for i in draw(st.lists(st.integers(0, max(n - 1, 0)), max_size=12 if n else 0)):
            bits[i] = draw(_elements())
    return bits.view(np.float32).reshape(rows, cols)


def _blocks(n, block):
    return (n + block - 1) // block


def _exp_floors(X):
    """exp_floor of every element, in NumPy from its definition: the biased
    exponent, -22 for a subnormal, 255 for zeros, infinities and NaNs."""
    mag = np.ascontiguousarray(X).view(np.uint32) & np.uint32(0x7FFFFFFF)
    e = (mag >> np.uint32(23)).astype(np.int64)
    e[e == 0] = M._E_SUBNORMAL
    e[(mag == 0) | (mag >= np.uint32(0x7F800000))] = M.E_IGNORED
    return e


def _block_mins(e, block):
    n = e.shape[0]
    return np.array(
        [e[q * block : (q + 1) * block].min(initial=M.E_IGNORED) for q in range(_blocks(n, block))], np.int64
    )


def _pieces(X, by_cols, block, lo_hi=None):
    """A scan made of the prologue's pieces: scan_share over all pieces (or
    over the given (lo, hi) shares in turn), then cols_exp_finish for columns."""
    n = M.col_chunks(X) if by_cols else _blocks(X.shape[0], block)
    out = np.full(n, M.E_IGNORED, np.int64)
    part = np.full((n if by_cols else 0, X.shape[1]), M.NO_KEY, np.uint32)
    for lo, hi in lo_hi or [(0, n)]:
        M.scan_share(X, by_cols, block, out, part, lo, hi)
    return M.cols_exp_finish(part, _blocks(X.shape[1], block), block) if by_cols else out


def _same(X, block):
    """Serial scans and the prologue's pieces, rows and columns, against the
    element-wise floors (and exp_floor itself on every element)."""
    rows, cols = X.shape
    e = _exp_floors(X)
    if X.size:
        assert [M.exp_floor(x) for x in X.ravel()[:64]] == list(e.ravel()[:64])
    want_rows = _block_mins(e.min(axis=1, initial=M.E_IGNORED), block)
    want_cols = _block_mins(e.min(axis=0, initial=M.E_IGNORED), block)
    for got in (_pieces(X, False, block), M.rows_exp_min(X, _blocks(rows, block), block)):
        assert np.array_equal(got, want_rows)
    for got in (_pieces(X, True, block), M.cols_exp_min(X, _blocks(cols, block), block)):
        assert np.array_equal(got, want_cols)


@settings(max_examples=150, deadline=None)
@given(X=matrices(), block=st.sampled_from([MR, NR, 1, 3]))
def test_scans_equal_the_element_floors(X, block):
    _same(X, block)


@pytest.mark.parametrize("bits", EDGE_BITS)
@pytest.mark.parametrize("shape", [(1, 1), (MR + 1, NR + 1), (M.ROW_CHUNK + 1, 3), (2 * M.ROW_CHUNK, NR)])
def test_one_edge_value_among_ones_and_among_nans(bits, shape):
    """The element that decides the minimum in the last row and column, among
    ones (it wins only when it is a smaller nonzero finite) and among NaNs (it
    wins unless it is itself zero or non-finite)."""
    for background in (0x3F800000, 0x7FC00000):
        X = np.full(shape, background, np.uint32)
        X[-1, -1] = bits
        for block in (MR, NR):
            _same(X.view(np.float32), block)


def test_shares_change_no_result():
    """Cut into any number of shares (one per thread in the prologue), the
    pieces give the one-piece result."""
    rng = np.random.default_rng(5)
    X = (rng.standard_normal((3 * M.ROW_CHUNK + 5, 2 * NR + 7)) * 1e-20).astype(np.float32)
    X[7, 9] = np.uint32(0x00000003).view(np.float32)
    for by_cols, block in ((False, MR), (True, NR)):
        n = M.col_chunks(X) if by_cols else _blocks(X.shape[0], block)
        whole = _pieces(X, by_cols, block)
        assert whole.min() == M._E_SUBNORMAL
        for parts in (2, 3, 7):
            shares = [(M.share(n, parts, t), M.share(n, parts, t + 1)) for t in range(parts)]
            assert np.array_equal(_pieces(X, by_cols, block, shares), whole)


@settings(max_examples=80, deadline=None)
@given(
    X=matrices(),
    Y=matrices(),
    a_trans=st.booleans(),
    b_trans=st.booleans(),
    threads=st.sampled_from([1, 2, 3, 7]),
    whole=st.booleans(),
)
def test_driver_prologue_scans_and_packs(X, Y, a_trans, b_trans, threads, whole):
    """The matmul driver's one-region prologue: the bounds of op(A)'s row
    blocks and op(B)'s panels are the element floors' minima whatever the
    share of each thread, and B's first k block is packed as pack_b_panel
    packs it.  With ``whole`` (one k block holds all of K) B's bounds come
    from its packed panels and A's from each packed strip, as the driver
    takes them (packed_exp_min), and are the same minima."""
    MMR, MNR = M.MM_MR, M.MM_NR
    e_a, e_b = _exp_floors(X), _exp_floors(Y)
    I = X.shape[1] if a_trans else X.shape[0]
    J, K = (Y.shape[0], Y.shape[1]) if b_trans else (Y.shape[1], Y.shape[0])
    ni, nj = _blocks(I, MMR), _blocks(J, MNR)
    want_a = _block_mins(e_a.min(axis=0 if a_trans else 1, initial=M.E_IGNORED), MMR)
    want_b = _block_mins(e_b.min(axis=1 if b_trans else 0, initial=M.E_IGNORED), MNR)
    whole = whole and K > 0
    kc = K if whole else min(K, 5)
    Bp = np.full(nj * kc * MNR + 3, np.float32(np.nan))
    ea, eb = M._prologue(X, a_trans, Y, b_trans, ni, nj, threads, Bp, kc, J, kc > 0, whole)
    if whole:  # the driver's bounds of A: one per strip packed over all of A's k
        KA = X.shape[0] if a_trans else X.shape[1]
        Ai = np.full(KA * MMR, np.float32(np.nan))
        ea = [M.pack_a(X, a_trans, ib * MMR, 0, KA, Ai, MMR) or M.packed_exp_min(Ai, 0, KA * MMR) for ib in range(ni)]
    assert np.array_equal(ea, want_a) and np.array_equal(eb, want_b)
    want_p = np.full_like(Bp, np.float32(np.nan))
    for jp in range(nj if kc else 0):
        M.pack_b_panel(Y, b_trans, jp * MNR, 0, kc, want_p, jp * kc * MNR, M.panel_width(J, jp))
    assert np.array_equal(Bp.view(np.uint32), want_p.view(np.uint32))
