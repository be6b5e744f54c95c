"""TreeFold ([fold.leaves.c1], [fold.tree.c1], [fold.final.c1], [fold.ranks.c1],
[fold.scale.c1]) against an oracle written from the spec text: a recursive
evaluation of the tree in float64-free NumPy float32 arithmetic."""

import numpy as np
import pytest

from refreplay.training import treefold

F32 = np.float32


pytestmark = pytest.mark.usefixtures("one_numba_thread")


def _oracle_add(a, b):
    # IEEE binary32 add (NumPy float32 is correctly rounded); the leaves below
    # never produce subnormals, so no flush is needed.
    return (a.astype(F32) + b.astype(F32)).astype(F32)


def _balanced(leaves, lo, n):
    """Value of the aligned block [lo, lo+n), n a power of two: its two halves
    combined, earlier on the left."""
    if n == 1:
        return leaves[lo]
    h = n // 2
    return _oracle_add(_balanced(leaves, lo, h), _balanced(leaves, lo + h, h))


def _spec_tree(leaves, lo, n):
    """[fold.final.c1] read recursively: the largest power-of-two block first,
    on the left of the fold of the rest."""
    p = 1 << (n.bit_length() - 1)
    if p == n:
        return _balanced(leaves, lo, n)
    return _oracle_add(_balanced(leaves, lo, p), _spec_tree(leaves, lo + p, n - p))


def _leaves(m, n=5, seed=0):
    rng = np.random.default_rng(seed + m)
    # Mixed magnitudes make the grouping visible in the bits.
    mag = F32(2.0) ** rng.integers(-12, 12, size=(m, n)).astype(F32)
    return (rng.standard_normal((m, n)).astype(F32) * mag).astype(F32)


@pytest.mark.parametrize("m", range(1, 65))
def test_fold_equals_spec_tree(m):
    """[fold.tree.c1] [fold.final.c1] TreeFold of M leaves = the spec's tree, M = 1..64."""
    leaves = _leaves(m)
    got = treefold.treefold([leaves[i].copy() for i in range(m)])
    want = _spec_tree(leaves, 0, m)
    assert got.view(np.uint32).tolist() == want.view(np.uint32).tolist()


def test_oracle_can_tell_orders_apart():
    """The leaves are chosen so that a different order gives different bits:
    the tests above could fail."""
    diffs = 0
    for m in range(3, 65):
        leaves = _leaves(m)
        seq = leaves[0]
        for i in range(1, m):
            seq = _oracle_add(seq, leaves[i])
        p, lo, parts = m, 0, []  # the stack, then folded bottom-up instead
        while p:
            s = 1 << (p.bit_length() - 1)
            parts.append(_balanced(leaves, lo, s))
            lo, p = lo + s, p - s
        bottom_up = parts[0]
        for part in parts[1:]:
            bottom_up = _oracle_add(bottom_up, part)
        want = _spec_tree(leaves, 0, m).view(np.uint32)
        diffs += (seq.view(np.uint32) != want).any() + (bottom_up.view(np.uint32) != want).any()
    assert diffs > 40


def test_fold_top_down_worked_example():
    """[fold.final.c1] 2^24 + (1 + 1) for M = 7, not (2^24 + 1) + 1."""
    rows = np.zeros((7, 1), dtype=F32)
    rows[0, 0], rows[4, 0], rows[6, 0] = 2.0**24, 1.0, 1.0
    assert treefold.fold_rows(rows).view(np.uint32).tolist() == [0x4B800001]


@pytest.mark.parametrize("m", range(1, 65))
def test_accumulator_bound(m):
    """[fold.tree.c1] One device holds at most floor(log2 M) + 1 blocks; the
    bound is reached when M is a power of two."""
    stack = treefold.FoldStack()
    for i in range(m):
        stack.push(np.full(1, i, dtype=F32))
    bound = m.bit_length()  # floor(log2 M) + 1
    assert stack.depth_max <= bound
    if m & (m - 1) == 0:
        assert stack.depth_max == bound
    assert len(stack.blocks()) == bin(m).count("1")


@pytest.mark.parametrize("m", list(range(1, 33)) + [47, 64])
def test_rank_split_equivalence(m):
    """[fold.ranks.c1] Every R <= 8 (R <= M) gives the bits of one device."""
    leaves = _leaves(m, seed=7)
    want = _spec_tree(leaves, 0, m).view(np.uint32).tolist()
    for r in range(1, min(8, m) + 1):
        got = treefold.fold_rows(leaves, r)
        assert got.view(np.uint32).tolist() == want, f"M={m} R={r}"


def test_ragged_splits():
    """[fold.ranks.c1] Arbitrary contiguous cuts (not only floor(q*M/R)) give
    the same bits: each rank sends its maximal aligned blocks."""
    rng = np.random.default_rng(3)
    for _ in range(150):
        m = int(rng.integers(1, 65))
        leaves = _leaves(m, seed=11)
        want = _spec_tree(leaves, 0, m).view(np.uint32).tolist()
        ncut = int(rng.integers(0, min(7, m - 1) + 1))
        cuts = sorted(rng.choice(np.arange(1, m), size=ncut, replace=False).tolist()) if ncut else []
        bounds = [0] + cuts + [m]
        blocks = []
        for a, b in zip(bounds[:-1], bounds[1:]):
            local = treefold.fold_local(a, [leaves[i].copy() for i in range(a, b)])
            assert [(x.start, x.size) for x in local] == treefold.aligned_blocks(a, b)
            assert len(local) <= 2 * max(1, (b - a).bit_length())
            blocks += local
        got = treefold.fold_blocks(blocks)
        assert got.view(np.uint32).tolist() == want, bounds


def test_rank_ranges_and_aligned_blocks():
    """[fold.ranks.c1] rank q holds [floor(qM/R), floor((q+1)M/R)); maximal
    aligned blocks by the definition."""
    assert treefold.rank_ranges(8, 3) == [(0, 2), (2, 5), (5, 8)]
    assert treefold.aligned_blocks(3, 13) == [(3, 1), (4, 4), (8, 4), (12, 1)]
    assert treefold.aligned_blocks(0, 7) == [(0, 4), (4, 2), (6, 1)]
    for a in range(0, 40):
        for b in range(a, 41):
            blocks = treefold.aligned_blocks(a, b)
            pos = a
            for s, n in blocks:
                assert s == pos and s % n == 0 and n & (n - 1) == 0
                # maximal: doubling would misalign or overrun
                assert s % (2 * n) != 0 or s + 2 * n > b
                pos += n
            assert pos == b
    with pytest.raises(ValueError):
        treefold.rank_ranges(2, 3)


def test_dict_leaves_merge_name_by_name():
    """[fold.leaves.c1] A gradient dict folds tensor by tensor."""
    m = 6
    a, b = _leaves(m, 3, seed=1), _leaves(m, 4, seed=2)
    leaves = [{"w": a[i].copy(), "b": b[i].reshape(2, 2).copy()} for i in range(m)]
    got = treefold.treefold(leaves)
    assert got["w"].view(np.uint32).tolist() == _spec_tree(a, 0, m).view(np.uint32).tolist()
    assert got["b"].reshape(-1).view(np.uint32).tolist() == _spec_tree(b, 0, m).view(np.uint32).tolist()
    with pytest.raises(ValueError, match="same tensor names"):
        treefold.merge({"w": a[0]}, {"v": a[0]})


def test_merge_flushes_and_canonicalises():
    """[fold.leaves.c1] combine is num.add: flush after rounding, canonical NaN."""
    left = np.array([0x00C00000, 0x7F800000, 0x80000000], dtype=np.uint32).view(F32)
    right = np.array([0x80800000, 0xFF800000, 0x00000000], dtype=np.uint32).view(F32)
    got = treefold.merge(left, right).view(np.uint32).tolist()
    assert got == [0x00000000, 0x7FC00000, 0x00000000]


def test_scale_is_multiply_by_reciprocal():
    """[fold.scale.c1] g = S * recip(f32(M)): 41 * recip(41) = 0x3F7FFFFF."""
    for m in (1, 3, 7, 41, 64):
        x = _leaves(1, 9, seed=m)[0]
        want = (x * (F32(1.0) / F32(m))).astype(F32)
        assert treefold.scale(x, m).view(np.uint32).tolist() == want.view(np.uint32).tolist()
    assert treefold.scale(np.full(1, 41, dtype=F32), 41).view(np.uint32).tolist() == [0x3F7FFFFF]


def test_bad_input_is_rejected_clearly():
    with pytest.raises(TypeError, match="float32"):
        treefold.merge(np.zeros(2), np.zeros(2))
    with pytest.raises(ValueError, match="shapes differ"):
        treefold.merge(np.zeros(2, F32), np.zeros(3, F32))
    with pytest.raises(ValueError, match="aligned"):
        treefold.FoldStack(1).push(np.zeros(1, F32), 2)
    with pytest.raises(ValueError, match="does not follow"):
        treefold.fold_blocks([treefold.Block(1, 1, np.zeros(1, F32))])
