"""Fixed-order reductions and matmul (spec chapters 3 and 4).

Oracles: ``tests/naive.py`` (scalar float32 loops with explicit flush, no
refreplay code) and Python integers for int8.  The fast kernels must also
equal the library's own ``*_naive`` loops bit for bit on shapes around every
block boundary, under 1 and 2 threads and in separate processes.
"""

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import naive
from naive import bits
from refreplay import linalg as L
from refreplay.linalg.blocking import Blocks
from refreplay.numerics import load

EDGE_BITS = np.array(
    [
        0x00000000,
        0x80000000,
        0x3F800000,
        0xBF800000,
        0x7F800000,
        0xFF800000,
        0x7FC00000,
        0x7F7FFFFF,
        0xFF7FFFFF,
        0x00800000,
        0x80800000,
        0x00800001,
        0x3F7FFFFE,
        0x20000000,
        0xA0000000,
        0x5F000000,
        0x3F800800,
        0xBF801000,
        0x33800000,
        0x3F000000,
        0x00000001,
        0x807FFFFF,
        0xFFC12345,
    ],
    dtype=np.uint32,
)  # zeros, ±1, ±inf, NaN, ±max, ±FLT_MIN, tiny products, overflow


def rand(rng, shape, scale=1.0):
    return load((rng.standard_normal(shape) * scale).astype(np.float32))


def edgy(rng, shape, frac=0.3):
    """Random values with a fraction replaced by edge values (loaded, so
    subnormals are zeroed and NaNs canonical, as [num.load.c1] promises)."""
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    pick = rng.random(shape) < frac
    x[pick] = EDGE_BITS[rng.integers(0, EDGE_BITS.size, pick.sum())].view(np.float32)
    return load(x)


def forms(A, B):
    """The three layouts of the same product: (name, fn, args)."""
    return [
        ("nn", L.matmul, (A, B)),
        ("nt", L.matmul_nt, (A, np.ascontiguousarray(B.T))),
        ("tn", L.matmul_tn, (np.ascontiguousarray(A.T), B)),
    ]


# ---- matmul against the scalar oracle -------------------------------------------


@pytest.mark.parametrize("I,K,J", [(1, 1, 1), (3, 5, 7), (17, 35, 23), (40, 61, 37)])
def test_matmul_forms_equal_scalar_oracle(I, K, J):
    """[mm.nn.c1] [mm.nt.c1] [mm.tn.c1] every form equals the sequential-k scalar loop."""
    rng = np.random.default_rng(I * 1000 + K * 10 + J)
    A, B = rand(rng, (I, K)), rand(rng, (K, J))
    want = bits(naive.matmul(A, B))
    for name, fn, args in forms(A, B):
        assert np.array_equal(bits(fn(*args)), want), name


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_matmul_edge_values_equal_scalar_oracle(seed):
    """[mm.nn.c1] ±0, inf, NaN, overflow, flushed products: same bits as the oracle."""
    rng = np.random.default_rng(seed)
    A, B = edgy(rng, (9, 13)), edgy(rng, (13, 19))
    want = bits(naive.matmul(A, B))
    for name, fn, args in forms(A, B):
        assert np.array_equal(bits(fn(*args)), want), name


def test_matmul_large_random_equals_scalar_oracle():
    """[mm.nn.c1] a larger random product, with magnitudes spread over 2^±20."""
    rng = np.random.default_rng(7)
    A = load((rng.standard_normal((24, 150)) * 2.0 ** rng.integers(-20, 20, (24, 150))).astype(np.float32))
    B = rand(rng, (150, 33))
    assert np.array_equal(bits(L.matmul(A, B)), bits(naive.matmul(A, B)))


def test_matmul_empty_sum_is_positive_zero():
    """[red.sum.c1] [mm.nn.c1] K = 0 gives +0 in every form."""
    A, B = np.zeros((3, 0), np.float32), np.zeros((0, 4), np.float32)
    for name, fn, args in forms(A, B):
        assert np.array_equal(bits(fn(*args)), np.zeros((3, 4), np.uint32)), name


def test_multiply_add_probe_is_unfused_everywhere():
    """[mm.nn.c1] [num.nofma.c1] 1·c + a·a = +0 unfused (2^-24 if fused), in
    every output position of a blocked kernel and at several k offsets."""
    a, c = np.float32(1 + 2**-12), np.float32(-(1 + 2**-11))
    for I, K, J, k0 in [(13, 2, 37, 0), (70, 9, 100, 5), (33, 300, 65, 297)]:
        A = np.zeros((I, K), np.float32)
        B = np.zeros((K, J), np.float32)
        A[:, k0], A[:, k0 + 1] = 1, a
        B[k0, :], B[k0 + 1, :] = c, a
        for name, fn, args in forms(A, B):
            got = bits(fn(*args))
            assert np.array_equal(got, np.zeros((I, J), np.uint32)), (name, I, K, J)


def test_matmul_differs_from_numpy():
    """[mm.order.r1] the order is pinned: BLAS (blocked sums, FMA) gives other bits."""
    rng = np.random.default_rng(11)
    A = rand(rng, (8, 4096))
    B = load((rng.standard_normal((4096, 8)) * 2.0 ** rng.integers(-12, 12, (4096, 8))).astype(np.float32))
    ours = L.matmul(A, B)
    assert np.array_equal(bits(ours[:2]), bits(naive.matmul(A[:2], B)))
    assert not np.array_equal(bits(ours), bits(A @ B))


# ---- accumulate and bias ---------------------------------------------------------


def test_accumulate_adds_full_sum_last():
    """[mm.accumulate.c1] D + S with S formed from -0, in every form."""
    rng = np.random.default_rng(5)
    A, B, D = edgy(rng, (11, 14)), edgy(rng, (14, 6)), edgy(rng, (11, 6))
    S = naive.matmul(A, B)
    want = bits(np.array([[naive.add(D[i, j], S[i, j]) for j in range(6)] for i in range(11)], np.float32))
    for name, fn, args in forms(A, B):
        out = D.copy()
        assert fn(*args, out=out, accumulate=True) is out
        assert np.array_equal(bits(out), want), name


def test_bias_add_after_sum():
    """[mm.bias.c1] C + b per column, in place or into a new array."""
    rng = np.random.default_rng(6)
    C, b = edgy(rng, (7, 10)), edgy(rng, (10,))
    want = bits(np.array([[naive.add(C[i, j], b[j]) for j in range(10)] for i in range(7)], np.float32))
    fresh = L.bias_add(C, b, inplace=False)
    assert np.array_equal(bits(fresh), want) and fresh is not C
    assert L.bias_add(C, b) is C and np.array_equal(bits(C), want)


# ---- reductions --------------------------------------------------------------------


@pytest.mark.parametrize("I,N", [(1, 1), (5, 0), (3, 17), (20, 129)])
def test_reductions_equal_oracle(I, N):
    """[red.sum.c1] [red.rowsum.c1] [red.colsum.c1] [red.rowmax.c1] incl. ±0, inf, NaN."""
    rng = np.random.default_rng(I + N)
    X = edgy(rng, (I, N), frac=0.2)
    assert np.array_equal(bits(L.row_sum(X)), bits(naive.row_sum(X)))
    assert np.array_equal(bits(L.row_max(X)), bits(naive.row_max(X)))
    assert np.array_equal(bits(L.col_sum(X)), bits(naive.col_sum(X)))


def test_reduction_signed_zero_and_nan():
    """[red.sum.c1] [red.rowmax.c1] -0 rows stay -0, +0 beats -0, NaN is canonical."""
    z, nz = np.float32(0.0), np.float32(-0.0)
    X = np.array([[nz, nz, nz], [nz, z, nz], [nz, nz, z]], np.float32)
    assert bits(L.row_sum(X)).tolist() == [0x80000000, 0, 0]
    assert bits(L.row_max(X)).tolist() == [0x80000000, 0, 0]
    assert bits(L.col_sum(X)).tolist() == [0x80000000, 0, 0]
    assert bits(L.col_sum(X[:1])).tolist() == [0x80000000] * 3
    Y = np.array([[1, np.nan], [np.inf, -np.inf]], np.float32)
    assert bits(L.row_sum(Y)).tolist() == [0x7FC00000, 0x7FC00000]
    assert bits(L.row_max(Y)).tolist() == [0x7FC00000, 0x7F800000]


def test_col_sum_accumulates_after_sum():
    """[red.colsum.c1] out + column sum, the column sum formed first."""
    X = np.array([[2**-24], [2**-24]], np.float32)
    out = np.ones(1, np.float32)
    L.col_sum(X, out=out, accumulate=True)
    assert bits(out).tolist() == [0x3F800001]


def test_row_sum_order_is_sequential():
    """[red.sum.c1] 1 + 2^-24 + ... stays 1; a pairwise or reversed order would not."""
    X = np.full((1, 1025), 2**-24, np.float32)
    X[0, 0] = 1
    assert bits(L.row_sum(X)).tolist() == [0x3F800000]
    assert bits(L.row_sum(X[:, ::-1].copy())).tolist() == [0x3F800200]


# ---- fast kernels equal the naive kernels -------------------------------------------

# around the matmul's tile (8 rows × 48 columns; attention's 4 × 64 before it)
# and k block (512 and 1024) sizes, primes, 1
SHAPES = [
    (1, 1, 1),
    (1, 7, 1),
    (2, 3, 50),
    (5, 1, 17),
    (6, 64, 31),
    (7, 33, 32),
    (8, 65, 33),
    (13, 129, 47),
    (31, 16, 64),
    (33, 17, 65),
    (64, 64, 64),
    (65, 100, 97),
    (97, 257, 129),
    (5, 20, 63),
    (4, 1, 128),
    (8, 8, 48),
    (8, 20, 80),  # last panel exactly 32 columns (an 8 x 32 tile on C itself)
    (16, 9, 64),  # ... exactly 16
    (8, 5, 16),
    (9, 40, 112),  # 16 columns left, a ragged row block
    (16, 47, 96),
    (17, 49, 97),
    (23, 511, 49),
    (24, 513, 144),
    (3, 1023, 5),
    (5, 1025, 70),
    (9, 2049, 3),
    # packed B over mm_fp32.B_CACHED: several column blocks of B_BLOCK floats, the last
    # one partial, across k blocks
    (9, 1030, 64 * 33 + 7),
    (5, 2100, 64 * 40),
    (3, 3, 64 * 700 * 16 + 5),
]


@pytest.mark.parametrize("I,K,J", SHAPES)
def test_fast_equals_naive(I, K, J):
    """[mm.nn.c1] [mm.nt.c1] [mm.tn.c1] [mm.accumulate.c1] blocked == one-at-a-time, bit for bit."""
    rng = np.random.default_rng(I * 7919 + K * 31 + J)
    A, B, D = edgy(rng, (I, K), 0.05), edgy(rng, (K, J), 0.05), rand(rng, (I, J))
    At, Bt = np.ascontiguousarray(A.T), np.ascontiguousarray(B.T)
    for fast, slow, a, b in [
        (L.mm_nn, L.mm_nn_naive, A, B),
        (L.mm_nt, L.mm_nt_naive, A, Bt),
        (L.mm_tn, L.mm_tn_naive, At, B),
    ]:
        for acc in (False, True):
            c_fast, c_slow = D.copy(), D.copy()
            fast(a, b, c_fast, acc)
            slow(a, b, c_slow, acc)
            assert np.array_equal(bits(c_fast), bits(c_slow)), (fast, acc)


@pytest.mark.parametrize("I,N", [(1, 1), (3, 0), (7, 31), (64, 65), (129, 200), (3, 1100)])
def test_fast_reductions_equal_naive(I, N):
    """[red.rowsum.c1] [red.colsum.c1] [red.rowmax.c1] [mm.bias.c1] fast == naive kernels."""
    rng = np.random.default_rng(I * 3 + N)
    X = edgy(rng, (I, N), 0.1)
    for fast, slow, n_out in [
        (L.row_sum_k, L.row_sum_naive, I),
        (L.row_max_k, L.row_max_naive, I),
        (L.col_sum_k, L.col_sum_naive, N),
    ]:
        o1, o2 = np.empty(n_out, np.float32), np.empty(n_out, np.float32)
        fast(X, o1)
        slow(X, o2)
        assert np.array_equal(bits(o1), bits(o2)), fast
    b = edgy(rng, (N,), 0.1)
    c1, c2 = X.copy(), X.copy()
    L.bias_add_k(c1, b)
    L.bias_add_naive(c2, b)
    assert np.array_equal(bits(c1), bits(c2))


def _f32(x):
    return np.float32(x)


@pytest.mark.parametrize("I,K,J", [(1, 2, 1), (9, 70, 67), (4, 2, 64)])
def test_flush_free_bound_is_exact(I, K, J):
    """[mm.nn.c1] [num.flush.c1] products of 2^-104 scale need the flushes, and get them.

    (1 + 2^-23)·2^-104 - 2^-104 = 2^-127 is subnormal and must become +0.
    The exponents here sum to just below the bound that lets a tile skip its
    flushes (Ea + Eb = 150 < 151), so a bound one lower would output 2^-127.
    """
    A = np.zeros((I, K), np.float32)
    B = np.zeros((K, J), np.float32)
    A[:, K - 2], A[:, K - 1] = _f32(1 + 2**-23), _f32(-1)
    B[K - 2, :], B[K - 1, :] = _f32(2.0**-104), _f32(2.0**-104)
    for name, fn, args in forms(A, B):
        assert np.array_equal(bits(fn(*args)), np.zeros((I, J), np.uint32)), name
    B[K - 2, :], B[K - 1, :] = _f32(2.0**-103), _f32(2.0**-103)  # at the bound: 2^-126, normal
    for name, fn, args in forms(A, B):
        assert np.array_equal(bits(fn(*args)), np.full((I, J), 0x00800000, np.uint32)), name


@pytest.mark.parametrize("I,K,J", [(1, 2, 1), (9, 70, 67)])
def test_product_flush_bound_is_exact(I, K, J):
    """[mm.nn.c1] [num.flush.c1] 1·2^-126 + 0.5·(1.5·2^-126): the second product is
    subnormal and must be flushed (result 2^-126, not 1.75·2^-126).  Its
    exponents sum to 127, just below the bound (128) that skips product flushes."""
    A = np.zeros((I, K), np.float32)
    B = np.zeros((K, J), np.float32)
    A[:, K - 2], A[:, K - 1] = _f32(1), _f32(0.5)
    B[K - 2, :], B[K - 1, :] = _f32(2.0**-126), _f32(1.5 * 2.0**-126)
    for name, fn, args in forms(A, B):
        assert np.array_equal(bits(fn(*args)), np.full((I, J), 0x00800000, np.uint32)), name
    A[:, K - 1] = _f32(1)  # at the bound: both products normal, 2.5·2^-126
    for name, fn, args in forms(A, B):
        assert np.array_equal(bits(fn(*args)), np.full((I, J), 0x01200000, np.uint32)), name


# The driver's paths, for I, K, J = 13, 40, 70: B packed whole (the machine's
# blocks), and column blocks with one k block (the bounds taken from each
# pack) or three (the bounds from the prologue's scans).
_PATHS = {
    "machine": None,
    "blocked-one-k-block": Blocks(kc=64, b_cached=1, b_block=64 * 48),
    "blocked-three-k-blocks": Blocks(kc=16, b_cached=1, b_block=16 * 48),
}


@pytest.mark.parametrize("path", sorted(_PATHS))
@pytest.mark.parametrize("seed", range(4))
def test_tiny_products_and_cancellation_equal_naive(seed, path):
    """[mm.nn.c1] [num.flush.c1] magnitudes around 2^-52 (products near 2^-104) in
    pairs that cancel to a few ulps, so partial sums fall below 2^-126; with
    odd seeds most tiles are scaled up (flush-free), and one tiny entry puts
    one row block back on the flushing path, another one column panel."""
    rng = np.random.default_rng(100 + seed)
    I, K, J = 13, 40, 70
    mant = lambda shape: (1 + rng.integers(0, 8, shape) * 2.0**-23) * rng.choice([-1, 1], shape)
    A = (mant((I, K)) * 2.0 ** rng.integers(-54, -49, (I, K))).astype(np.float32)
    B = (mant((K, J)) * 2.0 ** rng.integers(-54, -49, (K, J))).astype(np.float32)
    nudge = rng.integers(-3, 4, (I, K // 2)).astype(np.int32)
    A[:, 1::2] = -(A[:, 0::2].view(np.int32) + nudge).view(np.float32)  # cancel to a few ulps
    B[1::2, :] = B[0::2, :]
    if seed % 2:
        A, B = A * np.float32(2.0**40), B * np.float32(2.0**10)  # most tiles flush-free
        A[5] = 0
        A[5, 3] = np.float32(2.0**-90)  # ... but not the row block of row 5: 2^-90·B[3, j] is subnormal
        B[:, 60] = 0
        B[7, 60] = np.float32(2.0**-120)  # ... nor the panel of column 60: A[i, 7]·2^-120 is subnormal
    want = bits(naive.matmul(A, B))
    for name, fn, args in forms(A, B):
        assert np.array_equal(bits(fn(*args, blocks=_PATHS[path])), want), name
    # the data is sensitive: gradual underflow would give other bits
    assert not np.array_equal(bits(naive.matmul(A, B, flush_results=False)), want)


def test_matmul_kernels_have_no_fma_and_vectorise():
    """[num.nofma.c1] [mm.nn.c1] the compiled matmul kernels contain no fused
    multiply-add, and the tile loop runs on SIMD vectors."""
    import platform
    import re

    import numba
    from refreplay._jit import _BASE
    from refreplay.linalg import mm_fp32, mm_fp32_naive

    fresh = dict(_BASE, cache=False)  # cached code cannot be inspected
    packed = numba.njit(parallel=True, **fresh)(mm_fp32._mm_packed.py_func)
    simple = numba.njit(**fresh)(mm_fp32_naive.mm_nn_naive.py_func)
    A = np.ones((8, 8), np.float32)
    packed(A, A, np.empty((8, 8), np.float32), False, False)
    simple(A, A, np.empty((8, 8), np.float32), False)
    asm = packed.inspect_asm(packed.signatures[0]) + simple.inspect_asm(simple.signatures[0])
    if platform.machine() in ("x86_64", "AMD64"):
        assert re.search(r"vmulps\s[^\n]*%[yz]mm", asm) and re.search(r"vaddps\s[^\n]*%[yz]mm", asm)
        if "%zmm" in asm:  # AVX-512: A's values reach the multiplies as broadcast memory operands (_tile._opaque)
            folded = len(re.findall(r"vmulps\s+-?\d*\(%[^)]*\)\{1to16\}", asm))
            in_registers = len(re.findall(r"vbroadcastss\s+-?\d*\(%[^)]*\),\s*%zmm", asm))
            assert folded >= 2 * in_registers, (folded, in_registers)  # measured 320 / 41; unfolded 80 / 169
        fused = re.findall(r"\bv?f(?:n)?m(?:add|sub)\w*", asm)
    else:
        fused = re.findall(r"\b(?:fmla|fmls|fmadd|fmsub|fnmadd|fnmsub)\b", asm)
    assert not fused, sorted(set(fused))


# ---- threads and processes ---------------------------------------------------------------

_HASH_SCRIPT = """
import hashlib, numpy as np
from refreplay import linalg as L
from refreplay.linalg.blocking import Blocks
from refreplay.numerics import load
rng = np.random.default_rng(99)
A = load(rng.standard_normal((157, 211)).astype(np.float32))
B = load(rng.standard_normal((211, 173)).astype(np.float32))
h = hashlib.sha256()
for x in (L.matmul(A, B), L.matmul_nt(A, np.ascontiguousarray(B.T)),
          L.matmul_tn(np.ascontiguousarray(A.T), B), L.row_sum(A), L.col_sum(A), L.row_max(A)):
    h.update(x.tobytes())
print(h.hexdigest())
"""


def _hash_in_subprocess(threads):
    env = dict(os.environ, NUMBA_NUM_THREADS=str(threads))
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parent.parent), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", _HASH_SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_same_bits_with_1_and_2_threads_and_across_processes():
    """[red.order.r1] [mm.order.r1] bits depend on the shapes only, not on threads or process."""
    local = {}
    exec(_HASH_SCRIPT.replace("print(h.hexdigest())", "result = h.hexdigest()"), local)
    one, two = _hash_in_subprocess(1), _hash_in_subprocess(2)
    assert one == two == local["result"]
    assert len(one) == 64 and int(one, 16) != int(hashlib.sha256(b"").hexdigest(), 16)


# ---- int8 --------------------------------------------------------------------------------


@pytest.mark.parametrize("I,K,J", [(1, 1, 1), (3, 5, 7), (17, 35, 23), (9, 300, 40), (3, 2100, 70), (5, 0, 3)])
def test_matmul_i8_exact(I, K, J):
    """[mm.i8.c1] int8 products summed exactly, equal to Python integers."""
    rng = np.random.default_rng(K)
    A = rng.integers(-128, 128, (I, K), dtype=np.int8)
    B = rng.integers(-128, 128, (K, J), dtype=np.int8)
    C = L.matmul_i8(A, B)
    assert C.dtype == np.int32
    assert np.array_equal(C.astype(np.int64), naive.matmul_i8(A, B))
    C2 = np.empty_like(C)
    L.mm_i8_naive(A, B, C2)
    assert np.array_equal(C, C2)


def test_matmul_i8_overflow_bound():
    """[mm.i8.c2] K = 2^17 - 1 of (-128)(-128) is exact; K = 2^17 is refused."""
    K = 131071
    A = np.full((1, K), -128, np.int8)
    B = np.full((K, 2), -128, np.int8)
    B[:, 1] = 127
    assert L.matmul_i8(A, B).tolist() == [[K * 16384, -K * 16256]]
    assert K * 16384 == 2**31 - 2**14
    with pytest.raises(ValueError, match="131071"):
        L.matmul_i8(np.zeros((1, K + 1), np.int8), np.zeros((K + 1, 1), np.int8))


# ---- validation --------------------------------------------------------------------------


def test_validation_errors_are_clear():
    """Public functions reject bad dtypes, ranks, layouts and shapes before compiled code."""
    A = np.zeros((3, 4), np.float32)
    with pytest.raises(TypeError, match="float32"):
        L.matmul(A.astype(np.float64), A.T.copy())
    with pytest.raises(ValueError, match="2-D"):
        L.matmul(A[0], A.T.copy())
    with pytest.raises(ValueError, match="contiguous"):
        L.matmul(A, A.T)
    with pytest.raises(ValueError, match="K = 4 vs 3"):
        L.matmul(A, A[:, :3].copy())
    with pytest.raises(ValueError, match="shape"):
        L.matmul(A, A.T.copy(), out=np.zeros((4, 4), np.float32))
    with pytest.raises(ValueError, match="out="):
        L.matmul_nt(A, A, accumulate=True)
    with pytest.raises(ValueError, match="length"):
        L.bias_add(A, np.zeros(3, np.float32))
    with pytest.raises(TypeError, match="int8"):
        L.matmul_i8(A, A.T.copy())
    with pytest.raises(TypeError, match="ndarray"):
        L.row_sum([[1.0]])
    S = np.zeros((4, 4), np.float32)
    with pytest.raises(ValueError, match="overlap"):
        L.matmul(S, S, out=S)
