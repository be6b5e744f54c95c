"""Fixed-order fp32 matmul kernels, compiled, for the API and for other kernels.

Every output is the sequential sum of [mm.nn.c1] / [mm.nt.c1] / [mm.tn.c1]:
products and partial sums rounded and flushed one by one, k increasing.
Speed comes only from computing many independent outputs at once; no sum is
split or reordered.  ``mm_fp32_naive.py`` holds the one-output-at-a-time loops
these must equal bit for bit.

Structure (the classic packed GEMM, with nothing reassociated):

* k is cut into blocks of KC, processed in increasing order.  Between blocks
  a tile's partial sums wait in C itself: storing a float32 and loading it
  back changes no bit, so the sum over k stays one sequential chain.
* For each k block, B is packed into panels of MM_NR columns (``Bp[k, j]``
  contiguous along j) and A into row blocks of MM_MR rows (``Ap[k, r]``).
  Packing copies bits (and zero-pads the edges, which feed only lanes that
  are never stored); where it transposes, whole 8 x 8 blocks move by vector
  shuffles (``_tiles.transpose8``), and where it does not, whole rows of a
  panel or strip move as vectors (``_tiles.lanes_copy``).
* Where packed B fits in cache (``b_cached`` floats), each row block runs over
  all the panels.  Where it does not, the panels are taken ``b_block`` floats
  at a time (a column block that stays in L2) and every row block runs its
  tiles over that block before the next: B is read from memory once per k
  block, not once per row block (the LM head's 50,304 × 768 B is 154 MB;
  streaming it per row block ran at a third of the speed).  There A is
  packed ``a_rows`` rows at a time and B a group of column blocks at a
  time (at most as many floats as the A chunk), so a tall operand is never
  packed whole.  The block sizes are run-time arguments, derived from the
  machine's caches by ``blocking.py`` (no bit depends on them).
* ``mm_tile_proved`` (``_tile``) runs one MM_MR × MM_NR tile over the k
  block with its accumulators in vector registers, skipping flushes only
  where the exponent bounds below prove them identities.  Threads claim
  row blocks (independent outputs) one at a time (``_tiles.claim``); the k
  loop never crosses threads.

Call from compiled code (all arrays C-contiguous float32, C not overlapping
A or B): ``mm_nn(A, B, C)`` overwrites C, ``mm_nn(A, B, C, True)`` accumulates
into it ([mm.accumulate.c1]); likewise mm_nt, mm_tn.  They start their own
threads, so call them from serial code, not from inside a ``prange`` (Numba's
default threading layer refuses nested parallel regions).  The serial pieces
(``pack_a``, ``pack_b_panel``, ``rows_exp_min``, ``cols_exp_min``,
``tile_proved``) can be called from inside one: ``ops/attention.py`` runs its
per-head products with them, on its own MR × NR tile (``_tile.py``).
"""

from __future__ import annotations

import numpy as np
import numba
from numba import prange

from .._jit import kernel, parallel_kernel
from .._tiles import claim, interleave4, lanes_copy, stack_lanes, transpose8
from ..numerics._bits import f32_bits
from ..numerics.core import ZERO, add
from ._tile import LANES, MM_MR, MM_NR, MM_NV, MR, NV, tile_variants

# Block sizes: run-time arguments of the driver, chosen per machine from its
# cache sizes by ``blocking.py`` (the API passes them).  These constants are
# only the defaults for compiled callers that pass none (``mm_int8``): the
# sizes ``blocking.py`` derives for its fallback machine (32 KiB L1d / 1 MiB
# L2 / 32 MiB L3, the AMD machine the kernels were first tuned on).
# No block size changes a bit: k blocks meet in C (stored and reloaded
# float32, exact), and which tile runs when is free.
KC = 512  # k block: a row block's packed A strip (KC x MM_MR floats) in half of L1d
B_CACHED = 1 << 21  # floats of packed B (8 MiB) that row blocks can each stream from L3
B_BLOCK = 1 << 17  # floats of packed B (512 KiB) that the row blocks share while in L2
A_ROWS = 4096  # rows of A packed at once where column blocks are used (blocking.A_ROWS)
# Parts a row chunk is cut into in the column-blocked path, one per thread: the
# API passes the running thread count; compiled callers get the most threads a
# process can run.  A run-time argument (a compiled kernel that asked Numba for
# the count itself could not be cached); no bit depends on it.
THREADS = numba.config.NUMBA_NUM_THREADS
# How ``_pack_part`` packs a transposed A, whose rows each hold the strips'
# k-th rows side by side: in tiles of A_KROWS rows (k) by A_GROUP strips, so
# that it reads A a few whole lines of a row at a time and rows in order.
# The A_GROUP strips written are kc * MM_MR floats apart, and A_KROWS rows
# may be a page apart: a cache maps each to one set, and 8 lines in a set fit
# any L1 of 8 ways or more.  Measured on Zen 4 (32 KiB L1d, 8 ways; At of
# 1024 x 1024, kc 512, in L3 / in memory): 0.27-0.34 / 0.48-0.60 ms, against
# 0.35-0.47 / 1.7-1.8 ms for passes of A_GROUP strips over all kc rows (rows
# a page apart, which the hardware prefetcher did not follow); at 2048 x
# 2048, 2.3 / 2.5 ms against 7.9 / 8.3.  (Zen 5, 48 KiB, 12 ways, passes
# over all kc rows: 1 strip a pass 14-17 GB/s, 4 strips 20-26, all strips
# of the chunk 4 GB/s.)
A_GROUP = 4
A_KROWS = 8
EDGE_TILE = MM_MR * MM_NR  # floats of an edge tile's scratch copy (a literal to Numba: a module constant)

# ---- proving the flushes of a tile are identities ([mm.flush.r1]) -------------------
#
# [num.flush.c1] replaces a subnormal product or partial sum by a signed zero.
# |a| >= 2^(Ea-127) and |b| >= 2^(Eb-127) for their biased exponents Ea, Eb,
# so |a*b| >= 2^(Ea+Eb-254), and so is the rounded product (rounding is
# monotone and powers of two are floats).
# Products: Ea + Eb >= 128 gives |a*b| >= 2^-126, never subnormal, so the
# product flushes are identities (the sums may still need theirs).
# Sums: claim: if every nonzero product A[i,k]*B[k,j] of an output has magnitude
# >= 2^-103, then no product and no partial sum of that output is ever
# subnormal, so skipping the flushes gives the same bits.
#   * Such a product p is normal, and its exponent is >= -103, so p is a
#     multiple of 2^-126 (its last mantissa bit weighs 2^(e-23)).
#   * By induction every partial sum s (starting from -0) is a multiple of
#     2^-126: the exact s + p is; if it is below 2^-102 in magnitude it has at
#     most 24 significant bits above 2^-126 and is exact, otherwise it rounds
#     to a float of exponent >= -102, a multiple of 2^-125.
#   * A nonzero multiple of 2^-126 is at least 2^-126: normal, never
#     subnormal.  Infinities and NaN are never subnormal either, and a sum
#     that reached them stays there.
# Ea + Eb >= 151 guarantees |a*b| >= 2^-103.  The bound must hold over the
# whole k range of the output (a partial sum left by flushed k blocks need
# not be a multiple of 2^-126), so it is checked once per row block of A and
# column panel of B, over all k, before any k block runs.  The minimum
# exponents come from ``rows_exp_min`` / ``cols_exp_min``, or, where one k
# block holds all of K, from the packed strips and panels (``packed_exp_min``).
E_IGNORED = 255  # zeros, infinities and NaNs: their products never need the bound
_E_SUBNORMAL = -22  # a subnormal input (never after [num.load.c1]) is >= 2^-149
_FLUSH_FREE_MIN = 151  # Ea + Eb at or above: no flush needed at all
_PRODUCTS_NORMAL_MIN = 128  # Ea + Eb at or above: products need no flush


@kernel
def exp_floor(x):
    """Biased exponent E with |x| >= 2^(E-127) for nonzero finite x; 255 otherwise."""
    mag = f32_bits(x) & np.uint32(0x7FFFFFFF)
    if mag == 0 or mag >= np.uint32(0x7F800000):
        return E_IGNORED
    e = np.int64(mag >> np.uint32(23))
    return e if e > 0 else _E_SUBNORMAL


# The exponent scans: the minimum exponent is the exponent of the smallest
# nonzero finite magnitude (exp_floor never decreases as |x| grows), found as
# an integer minimum over the bits, which vectorises where exp_floor's
# branches do not.  With key(x) = (bits(x) & 0x7FFFFFFF) - 1 in uint32
# arithmetic, zero wraps to 0xFFFFFFFF and infinities and NaNs give
# KEY_FINITE_END or more, so the smallest key is below KEY_FINITE_END exactly
# when some element is nonzero and finite.  rows_exp_min / cols_exp_min run
# inside a caller's parallel loop (ops/attention.py's heads); the driver's
# ``_prologue`` runs both of its scans in one parallel region from pieces
# (block_exp_min, col_keys_chunk, cols_exp_finish, through scan_share);
# tests/test_exp_scan.py checks all of them against exp_floor taken element
# by element.
KEY_FINITE_END = np.uint32(0x7F7FFFFF)  # key of +inf
NO_KEY = np.uint32(0xFFFFFFFF)  # above every magnitude key (zero's): no nonzero element yet
ROW_CHUNK = 64  # rows per piece of a column scan (_prologue)


@kernel
def mag_key(x):
    """(bits(x) & 0x7FFFFFFF) - 1, wrapping: |x| - 1 ulp-wise for nonzero x."""
    return np.uint32(np.uint32(f32_bits(x) & np.uint32(0x7FFFFFFF)) - np.uint32(1))


@kernel
def key_exp(key):
    """exp_floor of the magnitude whose key is the smallest ``key`` (E_IGNORED if none is finite and nonzero)."""
    if key >= KEY_FINITE_END:
        return E_IGNORED
    e = np.int64((key + np.uint32(1)) >> np.uint32(23))
    return e if e > 0 else _E_SUBNORMAL


@kernel
def block_exp_min(X, q, block):
    """min of exp_floor over rows q*block .. q*block+block-1 of X (all
    columns), as the smallest magnitude key (above) of the block."""
    m = NO_KEY
    for i in range(q * block, min((q + 1) * block, X.shape[0])):
        x = X[i]
        for k in range(x.shape[0]):
            m = min(m, mag_key(x[k]))
    return key_exp(m)


@kernel
def rows_exp_min(X, n_blocks, block):
    """out[q] = block_exp_min(X, q, block) for every block q of rows."""
    out = np.empty(n_blocks, dtype=np.int64)
    for q in range(n_blocks):
        out[q] = block_exp_min(X, q, block)
    return out


@kernel
def cols_exp_min(X, n_blocks, block):
    """out[q] = min of exp_floor over columns q*block .. q*block+block-1 of X
    (all rows), as the smallest magnitude key of each block."""
    cols = np.full(X.shape[1], NO_KEY, dtype=np.uint32)
    for k in range(X.shape[0]):
        x = X[k]
        for j in range(x.shape[0]):
            cols[j] = min(cols[j], mag_key(x[j]))
    out = np.full(n_blocks, E_IGNORED, dtype=np.int64)
    for j in range(X.shape[1]):
        out[j // block] = min(out[j // block], key_exp(cols[j]))
    return out


@kernel
def col_keys_chunk(X, c, acc):
    """acc[j] = min(acc[j], mag_key(X[k, j])) over the rows k of chunk c
    (ROW_CHUNK rows), read along X's rows."""
    for k in range(c * ROW_CHUNK, min((c + 1) * ROW_CHUNK, X.shape[0])):
        x = X[k]
        for j in range(X.shape[1]):
            acc[j] = min(acc[j], mag_key(x[j]))


@kernel
def packed_exp_min(X, off, n):
    """min of exp_floor over X[off .. off+n-1] (a packed strip or panel), as
    the smallest magnitude key: the bound of a row block or panel whose pack
    holds every k of the product (its +0 padding never decides it)."""
    x = X[off : off + n]  # indices from 0 (a loop from off did not vectorise)
    m = NO_KEY
    for i in range(x.shape[0]):
        m = min(m, mag_key(x[i]))
    return key_exp(m)


@kernel
def col_chunks(X):
    """Chunks of ROW_CHUNK rows in X (the pieces of a column scan)."""
    return (X.shape[0] + ROW_CHUNK - 1) // ROW_CHUNK


@kernel
def cols_exp_finish(part, n_blocks, block):
    """The column scan's result from its chunks' minima part[c, j]: the
    minimum over c of every column, then over each block's columns (a
    minimum is the same in any order)."""
    nc, ncols = part.shape
    out = np.full(n_blocks, E_IGNORED, dtype=np.int64)
    for j in range(ncols):
        m = NO_KEY
        for c in range(nc):
            m = min(m, part[c, j])
        q = j // block
        out[q] = min(out[q], key_exp(m))
    return out


def _proved(name, mr, nv, doc, strided=False):
    """The mr x (nv * LANES) tile that runs only the flushes e does not prove
    identities, compiled under its own ``name``.  Each tile's function must
    have a name of its own: Numba names compiled code by the function's
    qualified name, a per-process counter and the argument types, so four
    closures named ``_proved.<locals>.proved`` with the same argument types
    got the same symbol in different processes for different tiles, and a
    process that loaded two cached callers (matmul A·B and A·Bᵀ, compiled by
    two earlier processes) linked both to one tile's code (A·Bᵀ gave wrong
    bits).  ``tests/test_cache_symbols.py`` holds the names unique.  Not
    cached on its own: its closure's tile intrinsics differ in every process,
    so its entries would never be found again, only pile up; its callers
    carry its code in their own cache entries.  With ``strided`` the tile
    takes ``lda`` after ``ap_off`` (``_tile``)."""
    plain, flush_sums, flush_all = tile_variants(mr, nv, strided)

    if strided:

        def proved(e, Ap, ap_off, lda, Bp, bp_off, kc, C, c_off, ldc, load_c):
            if e >= _FLUSH_FREE_MIN:
                plain(Ap, ap_off, lda, Bp, bp_off, kc, C, c_off, ldc, load_c)
            elif e >= _PRODUCTS_NORMAL_MIN:
                flush_sums(Ap, ap_off, lda, Bp, bp_off, kc, C, c_off, ldc, load_c)
            else:
                flush_all(Ap, ap_off, lda, Bp, bp_off, kc, C, c_off, ldc, load_c)

    else:

        def proved(e, Ap, ap_off, Bp, bp_off, kc, C, c_off, ldc, load_c):
            if e >= _FLUSH_FREE_MIN:
                plain(Ap, ap_off, Bp, bp_off, kc, C, c_off, ldc, load_c)
            elif e >= _PRODUCTS_NORMAL_MIN:
                flush_sums(Ap, ap_off, Bp, bp_off, kc, C, c_off, ldc, load_c)
            else:
                flush_all(Ap, ap_off, Bp, bp_off, kc, C, c_off, ldc, load_c)

    proved.__name__ = proved.__qualname__ = name
    proved.__doc__ = doc
    return kernel(proved, cache=False)


tile_proved = _proved(
    "tile_proved",
    MR,
    NV,
    """One MR × NR tile (``_tile``, same arguments) with only the flushes that
e = Ea + Eb does not prove identities; e must bound, as above, every
product of the tile's outputs over their whole k range ([mm.flush.r1]).""",
)
tile_strided_proved = _proved(
    "tile_strided_proved",
    MR,
    NV,
    """tile_proved with A read as Ap[ap_off + k*lda + r]: MR floats from each
of kc rows lda apart (attention's key sums read att and dz in place).""",
    True,
)
mm_tile_proved = _proved("mm_tile_proved", MM_MR, MM_NV, "tile_proved on the matmul's MM_MR × MM_NR tile.")
mm2_tile_proved = _proved("mm2_tile_proved", MM_MR, 2, "tile_proved on an MM_MR × 32 last panel.")
mm1_tile_proved = _proved("mm1_tile_proved", MM_MR, 1, "tile_proved on an MM_MR × 16 last panel.")


# ---- packing (copies bits; never changes an order) --------------------------------------


@kernel
def pack_a(A, a_trans, i0, k0, kc, Ap, mr):
    """Ap[k*mr + r] = A[i0+r, k0+k] (or A[k0+k, i0+r] when a_trans), 0 past the last row."""
    I = A.shape[1] if a_trans else A.shape[0]
    rows = min(mr, I - i0)
    if a_trans and rows == MM_MR and mr == MM_MR:  # a row of the strip per k, as one vector
        for k in range(kc):
            lanes_copy(Ap[k * MM_MR :], A[k0 + k, i0:], MM_MR)
    elif a_trans:
        for k in range(kc):
            src = A[k0 + k]
            dst = Ap[k * mr : (k + 1) * mr]
            for r in range(rows):
                dst[r] = src[i0 + r]
    else:
        done = 0
        if rows == 8 and mr == 8:  # whole 8 x 8 blocks by vector shuffles
            done = kc - kc % 8
            At = Ap[: kc * 8].reshape(kc, 8)
            for k in range(0, done, 8):
                transpose8(A, i0, k0 + k, At, k, 0)
        elif rows == 4 and mr == 4:  # attention's strips (MR = 4): 16 k at a time by vector shuffles
            done = kc - kc % 16
            for k in range(0, done, 16):
                interleave4(A, i0, k0 + k, Ap, k * 4)
        for k in range(done, kc):
            dst = Ap[k * mr : (k + 1) * mr]
            for r in range(rows):
                dst[r] = A[i0 + r, k0 + k]
    if rows < mr:  # the last row block of A: its missing rows are +0
        for k in range(kc):
            Ap[k * mr + rows : (k + 1) * mr] = ZERO


@kernel
def pack_b_panel(B, b_trans, j0, k0, kc, Bp, off, nr):
    """Bp[off + k*nr + j] = B[k0+k, j0+j] (or B[j0+j, k0+k] when b_trans), 0 past the last column."""
    J = B.shape[0] if b_trans else B.shape[1]
    cols = min(nr, J - j0)
    panel = Bp[off : off + kc * nr]
    if cols < nr:
        panel[:] = ZERO
    if not b_trans and cols == nr and nr % LANES == 0:  # whole panel rows, a vector at a time
        for k in range(kc):
            src, dst = B[k0 + k, j0:], panel[k * nr :]
            for v in range(0, nr, LANES):
                lanes_copy(dst[v:], src[v:], LANES)
        return
    if not b_trans:
        for k in range(kc):
            src = B[k0 + k]
            dst = panel[k * nr : k * nr + cols]
            for j in range(cols):
                dst[j] = src[j0 + j]
        return
    done = 0
    if cols == nr and nr % 8 == 0:  # whole 8 x 8 blocks by vector shuffles
        done = kc - kc % 8
        Pt = panel.reshape(kc, nr)
        for j in range(0, nr, 8):  # 8 rows of B at a time along k: 8 lines in a cache set, not nr
            for k in range(0, done, 8):
                transpose8(B, j0 + j, k0 + k, Pt, k, j)
    for j in range(cols):
        src = B[j0 + j]
        for k in range(done, kc):
            panel[k * nr + j] = src[k0 + k]


# ---- the driver ------------------------------------------------------------------------


@kernel
def plan(nj, K, kc_max, b_cached):
    """(k block length, column-blocked?) for nj panels of B over K: column
    blocks where packed B (nj panels of min(kc, K) x MM_NR floats) exceeds b_cached."""
    KB = max(1, kc_max)
    return KB, nj * min(KB, K) * MM_NR > b_cached


@kernel
def panel_width(J, jp):
    """Columns packed for panel jp of J: MM_NR, or the last panel's columns
    rounded up to whole vectors (its tile is that wide)."""
    cols = min(MM_NR, J - jp * MM_NR)
    return min(MM_NR, (cols + LANES - 1) // LANES * LANES)


@kernel
def panels_per_block(kc, b_block):
    """Panels of kc x MM_NR floats per column block of b_block floats (at least 1)."""
    return max(1, b_block // (kc * MM_NR))


@kernel
def scan_share(X, by_cols, block, out, part, lo, hi):
    """Pieces lo .. hi-1 of X's exponent scan: blocks of ``block`` rows
    (out[q] = block_exp_min), or with by_cols chunks of ROW_CHUNK rows
    (part[c] = their column minima, finished by cols_exp_finish)."""
    for i in range(lo, hi):
        if by_cols:
            col_keys_chunk(X, i, part[i])
        else:
            out[i] = block_exp_min(X, i, block)


@parallel_kernel
def _prologue(A, a_trans, B, b_trans, ni, nj, threads, Bp, kc, J, pack_b, whole=False):
    """(ea, eb): the exponent bounds of A's row blocks and B's panels (as
    rows_exp_min / cols_exp_min of op(A), op(B)), and with pack_b
    the panels of B's first k block (kc long) packed into Bp as the driver
    packs them, all in one parallel region: each region wakes the sleeping
    workers, which costs 40-140 us under a hypervisor (benchmarks/README.md),
    as long as a 256 x 256 x 256 product takes on two threads.  Each part
    takes an even share of each kind of work.  With ``whole`` (and pack_b:
    the k block is all of K) nothing is scanned: eb comes from the packed
    panels themselves, and ea is left E_IGNORED for the driver to take
    from each packed strip of A (packed_exp_min), in cache either way."""
    pa = 0 if whole else (col_chunks(A) if a_trans else ni)
    pb = 0 if whole else (nj if b_trans else col_chunks(B))
    ea = np.full(ni, E_IGNORED, dtype=np.int64)
    eb = np.full(nj, E_IGNORED, dtype=np.int64)
    part_a = np.full((pa if a_trans else 0, A.shape[1]), NO_KEY, dtype=np.uint32)
    part_b = np.full((0 if b_trans else pb, B.shape[1]), NO_KEY, dtype=np.uint32)
    parts = max(1, threads)
    for t in prange(parts):
        scan_share(A, a_trans, MM_MR, ea, part_a, share(pa, parts, t), share(pa, parts, t + 1))
        scan_share(B, not b_trans, MM_NR, eb, part_b, share(pb, parts, t), share(pb, parts, t + 1))
        if pack_b:
            for jp in range(share(nj, parts, t), share(nj, parts, t + 1)):
                pack_b_panel(B, b_trans, jp * MM_NR, 0, kc, Bp, jp * kc * MM_NR, panel_width(J, jp))
                if whole:
                    eb[jp] = packed_exp_min(Bp, jp * kc * MM_NR, kc * panel_width(J, jp))
    if a_trans and not whole:
        ea = cols_exp_finish(part_a, ni, MM_MR)
    if not b_trans and not whole:
        eb = cols_exp_finish(part_b, nj, MM_NR)
    return ea, eb


@kernel
def pack_sizes(I, J, K, kc_max, b_cached, b_block, a_rows):
    """(k block, column-blocked?, panels per packed group of B, floats of
    packed B, floats of packed A) of _mm_packed's packs for C: I×J over K
    (groups and packed A only where column blocks are used; elsewhere B is
    packed whole and each thread packs one strip of A of its own)."""
    ni = (I + MM_MR - 1) // MM_MR
    nj = (J + MM_NR - 1) // MM_NR
    KB, blocked = plan(nj, K, kc_max, b_cached)
    KBK = min(KB, K)
    if not blocked:
        return KB, blocked, nj, nj * KBK * MM_NR, 0
    # Bp holds any k block's group: g * kc <= gp * KBK, or one column block (nb * kc <= b_block / MM_NR + kc)
    gp = min(nj, max(panels_per_block(KBK, b_block), a_rows // MM_NR))
    ci = max(1, a_rows // MM_MR)
    return KB, blocked, gp, min(nj * KBK, max(gp * KBK, b_block // MM_NR + KBK)) * MM_NR, min(ci, ni) * KBK * MM_MR


@kernel
def scratch_floats(I, J, K, kc_max, b_cached, b_block, a_rows):
    """Floats of scratch that spare _mm_packed its allocations (its packs)."""
    _, _, _, nbp, nap = pack_sizes(I, J, K, kc_max, b_cached, b_block, a_rows)
    return nbp + nap


@kernel
def scratch_part(scratch, off, n):
    """scratch[off .. off+n-1] where the scratch holds it, else a new array."""
    if scratch.shape[0] >= off + n:
        return scratch[off : off + n]
    return np.empty(n, dtype=np.float32)


@parallel_kernel
def _mm_packed(
    A,
    B,
    C,
    a_trans,
    b_trans,
    kc_max=KC,
    b_cached=B_CACHED,
    b_block=B_BLOCK,
    a_rows=A_ROWS,
    threads=THREADS,
    scratch=None,
):
    """C = op(A)·op(B), overwriting C (I×J), NaNs canonical.  op transposes when
    the flag is set: A is I×K (K×I if a_trans), B is K×J (J×K if b_trans).
    kc_max: the k block; b_cached: the floats of packed B above which column
    blocks are used; b_block: the floats of packed B per column block;
    a_rows: the rows of A packed at once where column blocks are used;
    threads: the parts the row blocks (or a row chunk of them, with column
    blocks) are cut into, one per thread; scratch: a float32 array the packs
    are taken from when it holds scratch_floats (else they are allocated:
    fresh packs cost a page fault per 4 KiB written on every call wherever
    the allocator maps them anew)."""
    I, J = C.shape
    K = A.shape[0] if a_trans else A.shape[1]
    if K == 0:
        C[:] = ZERO  # [red.sum.c1] the empty sum is +0
        return
    ni = (I + MM_MR - 1) // MM_MR
    nj = (J + MM_NR - 1) // MM_NR
    Cf = C.reshape(-1)
    KB, blocked, gp, nbp, nap = pack_sizes(I, J, K, kc_max, b_cached, b_block, a_rows)
    sc = np.empty(0, dtype=np.float32) if scratch is None else scratch
    Bp = scratch_part(sc, 0, nbp)
    whole = K <= KB  # one k block: the bounds come from the packs, no scan reads A or B
    if not blocked:  # B stays in cache: packed whole; each row block packs its A (in L1) and runs every panel
        # B's first k block packed there too
        ea, eb = _prologue(A, a_trans, B, b_trans, ni, nj, threads, Bp, min(KB, K), J, True, whole)
        for k0 in range(0, K, KB):  # k blocks in increasing order, never in parallel
            kc = min(KB, K - k0)
            if k0 > 0:
                for jp in prange(nj):
                    pack_b_panel(B, b_trans, jp * MM_NR, k0, kc, Bp, jp * kc * MM_NR, panel_width(J, jp))
            parts = max(1, min(threads, ni))
            taken = np.zeros(1, dtype=np.int64)  # row blocks claimed so far
            for _part in prange(parts):  # each part claims row blocks until none is left, one strip buffer for all
                Ai = np.empty(kc * MM_MR, dtype=np.float32)
                ib = claim(taken)
                while ib < ni:
                    pack_a(A, a_trans, ib * MM_MR, k0, kc, Ai, MM_MR)
                    e_i = packed_exp_min(Ai, 0, kc * MM_MR) if whole else ea[ib]
                    _row_block_tiles(Ai, 0, ib, Bp, 0, 0, nj, kc, C, Cf, e_i, eb, k0 > 0)
                    ib = claim(taken)
        return
    if whole:
        ea = np.full(ni, E_IGNORED, dtype=np.int64)
        eb = np.full(nj, E_IGNORED, dtype=np.int64)
    else:
        ea, eb = _prologue(A, a_trans, B, b_trans, ni, nj, threads, Cf[:0], 0, J, False)
    # Column blocks of nb panels (b_block floats, in L2) that every row block
    # of a row chunk runs over before the next: B is read from memory once
    # per k block and row chunk instead of once per row block.  A row chunk
    # (ci row blocks, a_rows rows) is packed once per k block, and B a group
    # of column blocks at a time (at most a_rows x kc floats, as the chunk),
    # so neither pack holds a whole tall operand (the LM head's packed B or
    # A would be 103 MB: a fresh mapping and 25,000 page faults per call);
    # a product whose packs fit keeps one pack of A per k block and packs B
    # in one group (else a group is whole column blocks).  Which tile runs
    # when changes no bit.
    ci = max(1, a_rows // MM_MR)
    KBK = min(KB, K)
    Ap = scratch_part(sc, nbp, nap)
    for k0 in range(0, K, KB):  # k blocks in increasing order, never in parallel
        kc = min(KB, K - k0)
        nb = panels_per_block(kc, b_block)
        g = group_panels(nj, gp * KBK // kc, nb)
        for c0 in range(0, ni, ci):
            c1 = min(ni, c0 + ci)
            na = c1 - c0
            parts = max(1, min(threads, na))
            for g0 in range(0, nj, g):
                g1 = min(nj, g0 + g)
                # Two parallel regions per group, not one per column block (each
                # region wakes the sleeping threads, which can take as long as a
                # column block's tiles): one packs the group's panels of B (with the
                # first group the chunk's strips of A too), one runs the tiles,
                # each part claiming a row block of a column block at a time.
                for t in prange(parts):
                    a_lo = c0 + share(na, parts, t)
                    a_hi = c0 + share(na, parts, t + 1) if g0 == 0 else a_lo
                    b_lo, b_hi = g0 + share(g1 - g0, parts, t), g0 + share(g1 - g0, parts, t + 1)
                    _pack_part(A, B, a_trans, b_trans, J, k0, kc, Ap, c0, a_lo, a_hi, Bp, g0, b_lo, b_hi, whole, ea, eb)
                taken = np.zeros(1, dtype=np.int64)  # (column block, row block) items claimed so far
                for _part in prange(parts):
                    _column_blocks(Ap, c0, na, Bp, g0, g1, nb, kc, C, Cf, ea, eb, k0 > 0, taken)


@kernel
def _pack_part(A, B, a_trans, b_trans, J, k0, kc, Ap, c0, a_lo, a_hi, Bp, g0, b_lo, b_hi, bounds, ea, eb):
    """For the k block at k0: row blocks a_lo .. a_hi-1 of A (block ib packed
    at Ap[(ib - c0) * kc * MM_MR:]) and panels b_lo .. b_hi-1 of B (panel jp
    at Bp[(jp - g0) * kc * MM_NR:]).  With ``bounds`` (the k block is all of
    K) ea[ib] and eb[jp] are taken from each strip and panel just packed,
    while it is in cache (packed_exp_min); a transposed A's strips, packed
    a tile of rows at a time, once all of them are."""
    if a_trans:  # a row of A holds the strips' k-th rows side by side: tiles of A_KROWS rows x A_GROUP strips
        whole = max(a_lo, min(a_hi, A.shape[1] // MM_MR))  # blocks of MM_MR rows of op(A)
        for kb in range(0, kc, A_KROWS):
            ke = min(kc, kb + A_KROWS)
            for s0 in range(a_lo, whole, A_GROUP):
                s1 = min(whole, s0 + A_GROUP)
                for k in range(kb, ke):
                    src = A[k0 + k]
                    for ib in range(s0, s1):
                        lanes_copy(Ap[((ib - c0) * kc + k) * MM_MR :], src[ib * MM_MR :], MM_MR)
        for ib in range(a_lo, whole if bounds else a_lo):
            ea[ib] = packed_exp_min(Ap, (ib - c0) * kc * MM_MR, kc * MM_MR)
        a_lo = whole  # what is left: the last, partial block
    for ib in range(a_lo, a_hi):
        o = (ib - c0) * kc * MM_MR
        pack_a(A, a_trans, ib * MM_MR, k0, kc, Ap[o : o + kc * MM_MR], MM_MR)
        if bounds:
            ea[ib] = packed_exp_min(Ap, o, kc * MM_MR)
    for jp in range(b_lo, b_hi):
        o = (jp - g0) * kc * MM_NR
        pack_b_panel(B, b_trans, jp * MM_NR, k0, kc, Bp, o, panel_width(J, jp))
        if bounds:
            eb[jp] = packed_exp_min(Bp, o, kc * panel_width(J, jp))


@kernel
def _column_blocks(Ap, c0, na, Bp, g0, g1, nb, kc, C, Cf, ea, eb, load_c, taken):
    """One part's tiles of row blocks c0 .. c0+na-1 over panels g0 .. g1-1
    (packed as in _pack_part), a column block of nb panels at a time: the
    items (column block, row block) are claimed one by one from ``taken``,
    column block by column block, so every part runs over one block before
    the next, which so stays in L2, and a part whose core runs slower
    claims fewer (a fixed share of row blocks per part waited for the
    slowest).  Each item writes its own tiles of C."""
    n = (g1 - g0 + nb - 1) // nb * na
    item = claim(taken)
    while item < n:
        jb = g0 + item // na * nb
        ib = c0 + item % na
        _row_block_tiles(Ap, (ib - c0) * kc * MM_MR, ib, Bp, g0, jb, min(jb + nb, g1), kc, C, Cf, ea[ib], eb, load_c)
        item = claim(taken)


@kernel
def share(n, parts, t):
    """Where part t of ``parts`` near-equal parts of n items starts."""
    return t * n // parts


@kernel
def group_panels(nj, fit, nb):
    """Panels of B packed per group: all nj where ``fit`` (the panels the
    pack holds at this k block's length) covers them, else whole column
    blocks of nb panels, as many as fit (at least one block)."""
    if fit >= nj:
        return nj
    return max(nb, fit // nb * nb)


@kernel
def _row_block_tiles(Ap, ap_off, ib, Bp, bp_first, jp0, jp1, kc, C, Cf, ea_i, eb, load_c):
    """The tiles of row block ib (packed at Ap[ap_off:]) and column panels
    jp0 .. jp1-1 for one k block (panel jp packed at Bp[(jp - bp_first) * kc * MM_NR:])."""
    I, J = C.shape
    i0 = ib * MM_MR
    rows = min(MM_MR, I - i0)
    edge = stack_lanes(EDGE_TILE)  # on the stack: a heap array here was an allocation per call
    for jp in range(jp0, jp1):
        j0 = jp * MM_NR
        cols = min(MM_NR, J - j0)
        w = panel_width(J, jp)  # the tile's width: MM_NR, 32 or 16
        full = rows == MM_MR and cols == w
        if not full:  # edge tile: run the tile in a scratch copy, keep the valid part
            for r in range(rows):
                for j in range(cols):
                    edge[r * w + j] = C[i0 + r, j0 + j]
        out, off, ld = (Cf, i0 * J + j0, J) if full else (edge, 0, w)
        e, bp_off = ea_i + eb[jp], (jp - bp_first) * kc * MM_NR
        if w == MM_NR:
            mm_tile_proved(e, Ap, ap_off, Bp, bp_off, kc, out, off, ld, load_c)
        elif w == 2 * LANES:
            mm2_tile_proved(e, Ap, ap_off, Bp, bp_off, kc, out, off, ld, load_c)
        else:
            mm1_tile_proved(e, Ap, ap_off, Bp, bp_off, kc, out, off, ld, load_c)
        if not full:
            for r in range(rows):
                for j in range(cols):
                    C[i0 + r, j0 + j] = edge[r * w + j]


@parallel_kernel
def _add_into(C, S):
    """[mm.accumulate.c1] C[i,j] = add(C[i,j], S[i,j])."""
    for i in prange(C.shape[0]):
        c, s = C[i], S[i]
        for j in range(c.shape[0]):
            c[j] = add(c[j], s[j])


@kernel
def _mm(A, B, C, accumulate, a_trans, b_trans, kc_max, b_cached, b_block, a_rows, threads, scratch):
    if accumulate:
        S = np.empty_like(C)
        _mm_packed(A, B, S, a_trans, b_trans, kc_max, b_cached, b_block, a_rows, threads, scratch)
        _add_into(C, S)
    else:
        _mm_packed(A, B, C, a_trans, b_trans, kc_max, b_cached, b_block, a_rows, threads, scratch)


@kernel
def mm_nn(
    A,
    B,
    C,
    accumulate=False,
    kc_max=KC,
    b_cached=B_CACHED,
    b_block=B_BLOCK,
    a_rows=A_ROWS,
    threads=THREADS,
    scratch=None,
):
    """[mm.nn.c1] C = A·B.  A: I×K, B: K×J, C: I×J; overwritten, or accumulated
    into with ``accumulate`` ([mm.accumulate.c1]).  Threads over row blocks.
    The block sizes (``blocking.Blocks``; bits never depend on them) default
    to the constants above.  ``scratch``: a float32 array of at least
    scratch_floats that the packs are taken from (else they are allocated)."""
    _mm(A, B, C, accumulate, False, False, kc_max, b_cached, b_block, a_rows, threads, scratch)


@kernel
def mm_nt(
    A,
    B,
    C,
    accumulate=False,
    kc_max=KC,
    b_cached=B_CACHED,
    b_block=B_BLOCK,
    a_rows=A_ROWS,
    threads=THREADS,
    scratch=None,
):
    """[mm.nt.c1] C = A·Bᵀ.  A: I×K, B: J×K, C: I×J; overwritten or accumulated."""
    _mm(A, B, C, accumulate, False, True, kc_max, b_cached, b_block, a_rows, threads, scratch)


@kernel
def mm_tn(
    A,
    B,
    C,
    accumulate=False,
    kc_max=KC,
    b_cached=B_CACHED,
    b_block=B_BLOCK,
    a_rows=A_ROWS,
    threads=THREADS,
    scratch=None,
):
    """[mm.tn.c1] C = Aᵀ·B.  A: K×I, B: K×J, C: I×J; overwritten or accumulated."""
    _mm(A, B, C, accumulate, True, False, kc_max, b_cached, b_block, a_rows, threads, scratch)


@parallel_kernel
def bias_add_k(C, b):
    """[mm.bias.c1] C[i,j] = add(C[i,j], b[j]) in place.  C: I×J, b: J."""
    I, J = C.shape
    for i in prange(I):
        c = C[i]
        for j in range(J):
            c[j] = add(c[j], b[j])
