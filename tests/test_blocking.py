"""The matmul's machine-derived block sizes (refreplay/linalg/blocking.py).

No bit may depend on them: for a small cache description, Intel's (48 KiB
L1d, 2 MiB L2), a large one and this machine's, the blocked kernels must
equal the one-output-at-a-time loops (``*_naive``) bit for bit on shapes at,
below and above every size derived (the k block, the column-block threshold,
the column-block width), in all three forms, overwriting and accumulating.
``plan`` (the driver's own decision) is checked to take the path each shape
is meant to exercise, so the shapes cannot silently miss a boundary.
"""

import numpy as np
import pytest

from naive import bits
from refreplay import linalg as L
from refreplay.linalg import _tile, blocking
from refreplay.linalg import mm_fp32 as M
from refreplay.linalg.blocking import Blocks, Caches, blocks_for, machine_caches
from refreplay.numerics import load
from test_linalg import edgy, rand

SMALL = Caches(l1d=16 << 10, l2=256 << 10, l3=0)
INTEL = Caches(l1d=48 << 10, l2=2 << 20, l3=105 << 20)
LARGE = Caches(l1d=64 << 10, l2=4 << 20, l3=256 << 20)
MR, NR = _tile.MM_MR, _tile.MM_NR


def test_tile_shape_matches_the_kernel():
    assert (blocking.MR, blocking.NR) == (_tile.MM_MR, _tile.MM_NR)
    assert blocking.A_ROWS == M.A_ROWS  # the compiled default equals the rule's


def test_last_panel_widths():
    """The last panel's tile is as narrow as whole vectors allow: 48, 32 or 16."""
    assert _tile.MM_NR == 3 * _tile.LANES  # the driver dispatches on these three widths
    for J in range(1, 5 * NR):
        nj = (J + NR - 1) // NR
        for jp in range(nj):
            w = M.panel_width(J, jp)
            cols = min(NR, J - jp * NR)
            assert w == (NR if jp < nj - 1 else -(-cols // _tile.LANES) * _tile.LANES), (J, jp)
            assert w in (16, 32, 48) and cols <= w


def test_rule_on_known_descriptions():
    assert blocks_for(SMALL) == Blocks(kc=256, b_cached=1 << 15, b_block=1 << 15)
    assert blocks_for(INTEL) == Blocks(kc=512, b_cached=1 << 18, b_block=1 << 18)
    assert blocks_for(LARGE) == Blocks(kc=1024, b_cached=1 << 19, b_block=1 << 19)
    # the machine the constants were tuned on keeps them (kc, column block)
    tuned = blocks_for(blocking.FALLBACK)
    assert (tuned.kc, tuned.b_block) == (M.KC, M.B_BLOCK)
    # nonsense sizes give small but valid blocks
    tiny = blocks_for(Caches(l1d=0, l2=0))
    assert tiny.kc >= blocking.KC_MIN and tiny.b_cached > 0 and tiny.b_block > 0


def _fake_sysfs(root, entries):
    for i, (level, kind, size) in enumerate(entries):
        d = root / f"index{i}"
        d.mkdir(parents=True)
        for name, text in (("level", level), ("type", kind), ("size", size)):
            if text is not None:
                (d / name).write_text(text + "\n")
    return str(root)


def test_sysfs_reading(tmp_path):
    root = _fake_sysfs(
        tmp_path / "a",
        [("1", "Data", "48K"), ("1", "Instruction", "32K"), ("2", "Unified", "2048K"), ("3", "Unified", "105M")],
    )
    assert machine_caches(root) == Caches(48 << 10, 2 << 20, 105 << 20, source=root)
    # a missing or garbled level takes the fallback's size; no file at all: the fallback
    root = _fake_sysfs(tmp_path / "b", [("1", "Data", "lots"), ("2", "Unified", None)])
    assert machine_caches(root) == blocking.FALLBACK
    root = _fake_sysfs(tmp_path / "c", [("1", "Data", "16K"), ("2", "Unified", "junk")])
    c = machine_caches(root)
    assert (c.l1d, c.l2, c.l3) == (16 << 10, blocking.FALLBACK.l2, 0)
    assert machine_caches(str(tmp_path / "absent")) == blocking.FALLBACK


def test_api_blocks_argument():
    A = np.ones((3, 4), np.float32)
    with pytest.raises(TypeError):
        L.matmul(A, A.T.copy(), blocks=(1024, 1, 1))
    with pytest.raises(ValueError):
        L.matmul(A, A.T.copy(), blocks=Blocks(0, 1, 1))
    with pytest.raises(ValueError):
        L.matmul(A, A.T.copy(), blocks=Blocks(64, 1, 1, a_rows=0))
    assert Blocks(64, 1, 1).args() == (64, 1, 1, blocking.A_ROWS)


def boundary_shapes(b: Blocks):
    """(I, K, J, blocked?) at, below and above each of b's sizes."""
    kc = b.kc
    out = []
    for K in (kc - 1, kc, kc + 1, 2 * kc + 1):
        width = min(kc, K) * NR  # floats of one packed panel in a k block
        thr = b.b_cached // width  # most panels that stay unblocked
        nb = max(1, b.b_block // width)  # panels per column block
        # around the threshold: whole and partial last panels; beyond it, a
        # partial last column block (2nb + 1 panels) and whole ones (3nb)
        edge = [(thr, 0), (thr, 5), (thr + 1, 0), (thr + 1, 5)] if K != 2 * kc + 1 else [(thr + 1, 5)]
        for panels, short in edge + [(max(1, thr - 1), 5), (2 * nb + 1, 5), (3 * nb, 0)]:
            if panels * NR - short >= 1:  # one whole row block and a ragged one
                out.append((MR + 3, K, panels * NR - short))
    return sorted(set(out))


def _cases():
    cases = []
    for label, desc in (("small", SMALL), ("intel", INTEL), ("large", LARGE), ("machine", machine_caches())):
        b = blocks_for(desc)
        cases += [
            pytest.param(b, shape, id=f"{label}-{shape[0]}x{shape[1]}x{shape[2]}") for shape in boundary_shapes(b)
        ]
    return cases


def test_shapes_cross_every_boundary():
    """The shapes take both paths, and more than one k block and column block."""
    for desc in (SMALL, INTEL, LARGE):
        b = blocks_for(desc)
        paths, kblocks, cblocks = set(), set(), set()
        for _, K, J in boundary_shapes(b):
            nj = (J + NR - 1) // NR
            KB, blocked = M.plan(nj, K, b.kc, b.b_cached)
            paths.add(bool(blocked))
            kblocks.add((K + KB - 1) // KB)
            if blocked:
                cblocks.add(
                    (nj + M.panels_per_block(min(KB, K), b.b_block) - 1) // M.panels_per_block(min(KB, K), b.b_block)
                )
        assert paths == {False, True}, desc
        assert {1, 2, 3} <= kblocks, desc
        assert len(cblocks) >= 2 and max(cblocks) >= 3, desc


def _three_forms(shape, seed):
    """The operands of one I x K x J case in each form: [(API function,
    kernel, one-output loops, a, b)] for A·B, A·Bᵀ, Aᵀ·B, and a C to
    accumulate into."""
    I, K, J = shape
    rng = np.random.default_rng(seed)
    A, B, D = edgy(rng, (I, K), 0.05), edgy(rng, (K, J), 0.05), rand(rng, (I, J))
    At, Bt = np.ascontiguousarray(A.T), np.ascontiguousarray(B.T)
    return [
        (L.matmul, M.mm_nn, L.mm_nn_naive, A, B),
        (L.matmul_nt, M.mm_nt, L.mm_nt_naive, A, Bt),
        (L.matmul_tn, M.mm_tn, L.mm_tn_naive, At, B),
    ], D


@pytest.mark.parametrize("blocks,shape", _cases())
def test_blocked_equals_naive(blocks, shape):
    """[mm.nn.c1] [mm.nt.c1] [mm.tn.c1] [mm.accumulate.c1] the same bits whatever the blocks."""
    I, K, J = shape
    forms, D = _three_forms(shape, I * 7919 + K * 31 + J)
    for api, _, slow, a, b in forms:
        for acc in (False, True):
            c_fast, c_slow = D.copy(), D.copy()
            api(a, b, out=c_fast, accumulate=acc, blocks=blocks)
            slow(a, b, c_slow, acc)
            assert np.array_equal(bits(c_fast), bits(c_slow)), (api.__name__, acc)


# Row chunks: small a_rows, so that a few rows already make several chunks of
# the column-blocked path (b_cached 1: every shape is column-blocked); I at,
# below and above one and two chunks, a_rows not a multiple of MR (chunks of
# one row block), and more than one k block and column block.
CHUNKED = [Blocks(kc=64, b_cached=1, b_block=2 * 64 * NR, a_rows=a) for a in (MR, 2 * MR, 3 * MR - 5)]


def _chunk_shapes(b: Blocks):
    step = max(MR, b.a_rows // MR * MR)
    return [(I, K, 5 * NR - 7) for I in (step - 1, step, step + 1, 2 * step + 3) for K in (b.kc, 2 * b.kc + 1)]


@pytest.mark.parametrize(
    "blocks,shape",
    [pytest.param(b, s, id=f"a_rows{b.a_rows}-{s[0]}x{s[1]}") for b in CHUNKED for s in _chunk_shapes(b)],
)
def test_row_chunks_equal_naive(blocks, shape):
    """[mm.nn.c1] [mm.nt.c1] [mm.tn.c1] the same bits however A is cut into row chunks."""
    I, K, J = shape
    KB, blocked = M.plan((J + NR - 1) // NR, K, blocks.kc, blocks.b_cached)
    assert blocked and (K + KB - 1) // KB >= 1
    test_blocked_equals_naive(blocks, shape)


@pytest.mark.parametrize(
    "blocks,shape",
    [pytest.param(b, s, id=f"a_rows{b.a_rows}-{s[0]}x{s[1]}x{s[2]}") for b in CHUNKED[:2] for s in _chunk_shapes(b)[:4]]
    + [pytest.param(CHUNKED[1], (3 * MR + 1, 70, NR - 5), id="fewer-panels-than-parts")]
    # a part packs several groups of a transposed A's strips, k blocks of no multiple of A_KROWS rows
    + [pytest.param(Blocks(kc=21, b_cached=1, b_block=2 * 21 * NR), (11 * MR + 3, 47, 2 * NR + 7), id="tiled-At")]
    # B packed whole (no column blocks): one k block, and three (B packed again between them)
    + [
        pytest.param(Blocks(kc=64, b_cached=1 << 30, b_block=1 << 17), (7 * MR + 3, k, 2 * NR + 7), id=f"whole-B-K{k}")
        for k in (61, 150)
    ],
)
def test_thread_parts_equal_naive(blocks, shape):
    """[mm.nn.c1] [mm.nt.c1] [mm.tn.c1] the same bits for any count of parts:
    the parts claim row blocks (with column blocks, a row block of a column
    block) one at a time and share a group's panels out (the ``threads``
    argument; a part can get no panel, a group of one, or more parts than
    rows, and then claims nothing)."""
    I, K, J = shape
    forms, D = _three_forms(shape, I * 13 + K * 7 + J)
    for _, fast, slow, a, b in forms:
        for acc in (False, True):
            c_slow = D.copy()
            slow(a, b, c_slow, acc)
            for threads in (1, 2, 3, 5, 64):
                c_fast = D.copy()
                fast(a, b, c_fast, acc, *blocks.args(), threads)
                assert np.array_equal(bits(c_fast), bits(c_slow)), (fast.__name__, acc, threads)


def test_group_panels_fit_the_pack():
    """A group is all of B where it fits the pack, else whole column blocks,
    and never more panels than the driver's Bp holds (g * kc floats of kc x NR)."""
    for nj in (1, 2, 5, 47, 48, 49, 200):
        for kc_max, K in ((64, 64), (64, 65), (64, 200), (512, 768), (512, 300)):
            for b_block in (1, 64 * NR, 5 * 64 * NR, 1 << 17):
                for a_rows in (MR, 3 * MR - 5, 4096):
                    KBK = min(kc_max, K)
                    gp = min(nj, max(M.panels_per_block(KBK, b_block), a_rows // NR))
                    cap = min(nj * KBK, max(gp * KBK, b_block // NR + KBK))  # Bp's floats / NR
                    for k0 in range(0, K, kc_max):
                        kc = min(kc_max, K - k0)
                        nb = M.panels_per_block(kc, b_block)
                        g = M.group_panels(nj, gp * KBK // kc, nb)
                        assert min(g, nj) * kc <= cap, (nj, kc_max, K, b_block, a_rows)
                        assert g == nj if gp * KBK // kc >= nj else g % nb == 0 and g >= nb
    assert M.group_panels(48, 48, 5) == 48  # qkv at kc: one group, not 45 + 3 panels
    assert M.group_panels(48, 47, 5) == 45


def test_machine_blocks_are_the_default():
    """The API without blocks= runs with blocking.machine_blocks() (same bits as any)."""
    rng = np.random.default_rng(5)
    A = load(rng.standard_normal((9, 70)).astype(np.float32))
    B = load(rng.standard_normal((70, 130)).astype(np.float32))
    assert np.array_equal(bits(L.matmul(A, B)), bits(L.matmul(A, B, blocks=blocking.machine_blocks())))


# ---- the packs: bit copies, zero padding, for both tile shapes ---------------------------


def _pack_a_expected(A, a_trans, i0, k0, kc, mr):
    out = np.zeros(kc * mr, np.uint32)
    src = bits(A.T if a_trans else A)
    for k in range(kc):
        for r in range(min(mr, src.shape[0] - i0)):
            out[k * mr + r] = src[i0 + r, k0 + k]
    return out


def _pack_b_expected(B, b_trans, j0, k0, kc, nr):
    out = np.zeros(kc * nr, np.uint32)
    src = bits(B.T if b_trans else B)  # K x J
    for k in range(kc):
        for j in range(min(nr, src.shape[1] - j0)):
            out[k * nr + j] = src[k0 + k, j0 + j]
    return out


@pytest.mark.parametrize("mr", [_tile.MR, _tile.MM_MR])
@pytest.mark.parametrize("trans", [False, True])
def test_pack_a_copies_bits(mr, trans):
    """pack_a (its 8 x 8 shuffled blocks and the element-wise rest) is a
    copy with +0 past the last row, over every ragged row count and k length
    around 8 and with a stale buffer."""
    rng = np.random.default_rng(mr * 2 + trans)
    for rows in range(1, mr + 1):
        for kc in (1, 7, 8, 9, 16, 23):
            for k0 in (0, 3):
                I, K = 3 + rows, k0 + kc + 2
                A = edgy(rng, (K, I) if trans else (I, K), 0.1)
                Ap = np.full(kc * mr + 5, np.float32(np.nan))
                M.pack_a(A, trans, 3, k0, kc, Ap, mr)
                assert np.array_equal(bits(Ap[: kc * mr]), _pack_a_expected(A, trans, 3, k0, kc, mr))
                assert np.isnan(Ap[kc * mr :]).all()  # nothing past the strip


@pytest.mark.parametrize("nr", [_tile.NR, _tile.MM_NR])
@pytest.mark.parametrize("trans", [False, True])
def test_pack_b_panel_copies_bits(nr, trans):
    """pack_b_panel likewise, for whole and ragged panels at an offset."""
    rng = np.random.default_rng(nr * 2 + trans)
    for cols in (1, 8, nr - 1, nr):
        for kc in (1, 7, 8, 9, 16, 23):
            J, K, j0, k0, off = 5 + cols, kc + 4, 5, 2, 11
            B = edgy(rng, (J, K) if trans else (K, J), 0.1)
            Bp = np.full(off + kc * nr + 5, np.float32(np.nan))
            M.pack_b_panel(B, trans, j0, k0, kc, Bp, off, nr)
            assert np.array_equal(bits(Bp[off : off + kc * nr]), _pack_b_expected(B, trans, j0, k0, kc, nr))
            assert np.isnan(Bp[:off]).all() and np.isnan(Bp[off + kc * nr :]).all()


@pytest.mark.parametrize("bounds", [False, True])
def test_pack_part_tiles_a_transposed_strips(bounds):
    """_pack_part packs a transposed A in tiles of A_KROWS rows by A_GROUP
    strips: every strip of a part's range (more strips than a group, a last
    group of fewer, a ragged last strip after them), every k of a k block
    that is no multiple of A_KROWS, the same bits as pack_a strip by strip,
    and with ``bounds`` each strip's exponent bound taken from its whole
    pack (a strip whose bound were left unset, or taken from a tile of rows,
    would differ: one tiny value sits in the last rows of strip 5)."""
    rng = np.random.default_rng(5)
    strips = 2 * M.A_GROUP + 2  # whole strips, and one ragged after them
    K, I = 3 * M.A_KROWS + 9, strips * MR + 5
    At = edgy(rng, (K, I), 0.1)
    At[K - 2, 5 * MR + 3] = np.float32(2.0**-140)
    for k0, kc in ((0, K), (4, K - 4 - 3), (2, M.A_KROWS - 3)):
        for c0, a_lo, a_hi in ((0, 0, strips + 1), (1, 1, strips + 1), (0, 2, strips - 1)):
            Ap = np.full((strips + 2) * kc * MR, np.float32(np.nan))
            ea = np.full(strips + 1, -999, np.int64)
            eb = np.zeros(1, np.int64)
            Bp = np.empty(1, np.float32)
            M._pack_part(At, At, True, False, 1, k0, kc, Ap, c0, a_lo, a_hi, Bp, 0, 0, 0, bounds, ea, eb)
            for ib in range(a_lo, a_hi):
                o = (ib - c0) * kc * MR
                assert np.array_equal(bits(Ap[o : o + kc * MR]), _pack_a_expected(At, True, ib * MR, k0, kc, MR)), ib
                assert ea[ib] == (M.packed_exp_min(Ap, o, kc * MR) if bounds else -999), ib
            written = (a_hi - c0) * kc * MR
            assert np.isnan(Ap[: (a_lo - c0) * kc * MR]).all() and np.isnan(Ap[written:]).all()
            assert (ea[:a_lo] == -999).all() and (ea[a_hi:] == -999).all()
