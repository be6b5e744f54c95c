"""The blocked element-wise kernels equal a simple loop bit for bit.

``numerics.elementwise`` runs each op as a plain loop (small arrays) or as
that loop on blocks of ``BLOCK`` elements in parallel (``*_blocks``); so do
TreeFold's scale ([fold.scale.c1]) and the optimizer's AdamW update and
clipping scale ([optim.adamw.c1], [optim.clip.c1]).  Each naive loop below is
the simple form: one scalar primitive per element, index 0 to N-1, one
thread.  Both paths of every op (and the public function, whichever path it
takes) must give the naive loop's bits for random bit patterns, random
normals, special values (signed zeros, infinities, NaNs with any payload and
sign, subnormals, the extremes, branch points) placed at the start, across
block boundaries and at the end, at sizes around the block and around
PARALLEL_MIN, with 1 and 2 threads ([num.format.c1]: an element's bits never
depend on another element or on the thread count).
"""

from __future__ import annotations

import numba
import numpy as np
import pytest
from conftest import set_threads

from refreplay.training import treefold
from refreplay.numerics import core, elementwise
from refreplay.numerics import transcendental as tr
from refreplay.ops import optim

F32 = np.float32
BLOCK = elementwise.BLOCK
SIZES = [0, 1, 7, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK + 7]
BIG_SIZES = [elementwise.PARALLEL_MIN - 1, elementwise.PARALLEL_MIN, elementwise.PARALLEL_MIN + 5]
THREADS = (1, 2)  # 2: a ``threads`` test, in a 2-thread subprocess where the pool is smaller


def bits(a):
    return np.ascontiguousarray(a, dtype=F32).view(np.uint32)


def assert_same_bits(got, want, what=""):
    g, w = bits(got), bits(want)
    assert g.shape == w.shape, (what, g.shape, w.shape)
    bad = np.flatnonzero(g != w)
    assert bad.size == 0, (
        f"{what}: {bad.size} of {g.size} differ; first at {bad[0]}: {g.flat[bad[0]]:#010x} vs {w.flat[bad[0]]:#010x}"
    )


@pytest.fixture(params=[1, pytest.param(2, marks=pytest.mark.threads)], ids=lambda t: f"threads{t}")
def threads(request):
    keep = numba.get_num_threads()
    set_threads(request.param)
    yield request.param
    numba.set_num_threads(keep)


# ---- inputs ---------------------------------------------------------------------

SPECIAL_BITS = [
    0x00000000,
    0x80000000,  # +-0
    0x7F800000,
    0xFF800000,  # +-inf
    0x7FC00000,
    0xFFC00000,
    0x7F800001,
    0xFFBFFFFF,
    0x7FC12345,  # NaNs: quiet, signalling, payloads
    0x00000001,
    0x80000001,
    0x007FFFFF,
    0x807FFFFF,
    0x00400000,  # subnormals
    0x00800000,
    0x80800000,
    0x7F7FFFFF,
    0xFF7FFFFF,  # smallest normal, largest finite
    0x3F800000,
    0xBF800000,
    0x3F000000,
    0xBF000000,
    0x3F400000,
    0xBF400000,  # +-1, +-0.5, tanh switch
    0x42B17217,
    0x42B17218,
    0xC2B00000,
    0xC2B00001,
    0xC2CFF1B5,  # exp overflow / underflow
    0x4B000000,
    0xCB000000,
    0x4AFFFFFF,
    0x3FC00000,
    0x40200000,  # 2^23, rint ties 1.5, 2.5
    0x46800000,
    0x46800001,
    0xC6800000,  # sin/cos range 2^14
    0x33800000,
    0x1F800000,
    0x5F800000,  # tiny and huge normals
]
SPECIALS = np.array(SPECIAL_BITS, np.uint32).view(F32)


def operand(n, rng, kind):
    """An n-element float32 array: random bit patterns or random normals,
    with the special values written at the start, across every block
    boundary (the last few of one block, the first few of the next) and at
    the end."""
    if kind == "bits":
        x = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32).view(F32)
    else:
        x = (rng.standard_normal(n) * 4).astype(F32)
    k = len(SPECIALS)
    starts = [0, n - k] + [b * BLOCK - k // 2 for b in range(1, n // BLOCK + 1)]
    for s in starts:
        s = max(0, min(s, n - k))
        m = min(k, n - s)
        x[s : s + m] = rng.permutation(SPECIALS)[:m]
    return x


def operands(n, rng, kind):
    """(a, b) for a binary op; for small n, b pairs every special with every special."""
    a, b = operand(n, rng, kind), operand(n, rng, kind)
    k = len(SPECIALS)
    if n >= k * k:
        a[: k * k] = np.repeat(SPECIALS, k)
        b[: k * k] = np.tile(SPECIALS, k)
    return a, b


# ---- the simple loops -----------------------------------------------------------


def _binary_naive(f):
    """One element at a time: out[i] = f(a[i], b[i])."""

    @numba.njit
    def naive(a, b):
        out = np.empty_like(a)
        for i in range(a.size):
            out[i] = f(a[i], b[i])
        return out

    return naive


def _unary_naive(f):
    """One element at a time: out[i] = f(x[i])."""

    @numba.njit
    def naive(x):
        out = np.empty_like(x)
        for i in range(x.size):
            out[i] = f(x[i])
        return out

    return naive


# the scalar functions of [num.*] and chapter 2, applied one element at a time
BINARY = {name: _binary_naive(getattr(core, name)) for name in ("add", "sub", "mul", "fmax", "fmin")}
UNARY = {
    **{name: _unary_naive(getattr(core, name)) for name in ("recip", "sqrt", "rint")},
    **{name: _unary_naive(getattr(tr, name)) for name in ("exp", "log", "tanh", "sigmoid", "sin", "cos")},
}


def paths(name):
    """The three ways an op runs: its plain loop, its parallel blocks, and
    the public function (which picks one by size)."""
    loop = getattr(elementwise, f"_{name}_loop")
    blocks = getattr(elementwise, f"_{name}_blocks")
    public = getattr(elementwise, name)

    def kernel_path(k):
        def run(*xs):
            out = np.empty_like(xs[0])
            k(*xs, out)
            return out

        return run

    return {"loop": kernel_path(loop), "blocks": kernel_path(blocks), "public": public}


# ---- numerics.elementwise -----------------------------------------------------


@pytest.mark.parametrize("kind", ["bits", "normal"])
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_blocked_equals_naive(name, kind, threads):
    """[num.add.c1] [num.mul.c1] [num.minmax.c1] each path == the naive loop."""
    rng = np.random.default_rng(100 + threads)
    for n in SIZES:
        a, b = operands(n, rng, kind)
        want = BINARY[name](a, b)
        for path, fn in paths(name).items():
            assert_same_bits(fn(a, b), want, f"{name} {path} n={n}")


@pytest.mark.parametrize("kind", ["bits", "normal"])
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_blocked_equals_naive(name, kind, threads):
    """[num.recip.c1] [num.sqrt.c1] [num.rint.c1] [num.exp.c1] [num.log.c1]
    [num.tanh.c1] [num.sigmoid.c1] [num.sincos.c1] each path == the naive loop."""
    rng = np.random.default_rng(200 + threads)
    for n in SIZES:
        x = operand(n, rng, kind)
        want = UNARY[name](x)
        for path, fn in paths(name).items():
            assert_same_bits(fn(x), want, f"{name} {path} n={n}")


@pytest.mark.parametrize("name", sorted(BINARY) + sorted(UNARY))
def test_public_around_parallel_min(name, threads):
    """[num.format.c1] Below, at and above PARALLEL_MIN (where the public
    function switches from the loop to the blocks), and for a 2-D shape."""
    rng = np.random.default_rng(300 + threads)
    naive, public = {**BINARY, **UNARY}[name], getattr(elementwise, name)
    for n in BIG_SIZES:
        xs = operands(n, rng, "bits") if name in BINARY else (operand(n, rng, "bits"),)
        assert_same_bits(public(*xs), naive(*xs), f"{name} n={n}")
    xs = [operand(512 * 256, rng, "normal").reshape(512, 256) for _ in range(2 if name in BINARY else 1)]
    got = public(*xs)
    assert got.shape == (512, 256)
    assert_same_bits(got.reshape(-1), naive(*(x.reshape(-1) for x in xs)), f"{name} 2-D")


@pytest.mark.threads
def test_one_and_two_threads_agree():
    """[num.format.c1] The same inputs with 1 and with 2 threads: the same bits."""
    rng = np.random.default_rng(7)
    n = elementwise.PARALLEL_MIN + 3 * BLOCK + 7
    a, b = operands(n, rng, "bits")
    keep = numba.get_num_threads()
    try:
        runs = []
        for t in THREADS:
            numba.set_num_threads(t)
            runs.append([elementwise.add(a, b), elementwise.mul(a, b), elementwise.exp(a), elementwise.sin(b)])
    finally:
        numba.set_num_threads(keep)
    for got in runs[1:]:
        for g, w in zip(got, runs[0]):
            assert_same_bits(g, w, "threads")


def test_blocks_cover_every_element():
    """block_range tiles [0, n) exactly, in order, for the sizes above."""
    for n in SIZES + BIG_SIZES:
        ranges = [elementwise.block_range(k, n) for k in range(elementwise.n_blocks(n))]
        assert [i0 for i0, _ in ranges] == list(range(0, n, BLOCK))
        assert all(i1 - i0 == min(BLOCK, n - i0) for i0, i1 in ranges)
        assert (ranges[-1][1] if ranges else 0) == n


# ---- TreeFold scale and the optimizer -------------------------------------------


@numba.njit
def scale_naive(x, s):
    """[fold.scale.c1] mul(x[i], s), one element at a time."""
    out = np.empty_like(x)
    for i in range(x.size):
        out[i] = core.mul(x[i], s)
    return out


@pytest.mark.parametrize("m", [1, 3, 7, 1000])
def test_treefold_scale_equals_naive(m, threads):
    """[fold.scale.c1] treefold.scale and both kernels == the naive loop."""
    rng = np.random.default_rng(400 + m)
    r = F32(core.recip(F32(m)))
    for n in SIZES + BIG_SIZES[1:2]:
        x = operand(n, rng, "bits")
        want = scale_naive(x, r)
        assert_same_bits(treefold.scale(x, m), want, f"scale n={n}")
        for k in (treefold._scale_loop, treefold._scale_blocks):
            out = np.empty_like(x)
            k(x, r, out)
            assert_same_bits(out, want, f"{k.__name__} n={n}")


@numba.njit
def adamw_naive(p, g, m, v, lr, beta1, beta2, eps, wd, rbc1, rbc2):
    """[optim.adamw.c1] The update of one element after another, in place."""
    for i in range(p.size):
        m_i = core.add(core.mul(beta1, m[i]), core.mul(core.sub(core.ONE, beta1), g[i]))
        v_i = core.add(core.mul(beta2, v[i]), core.mul(core.mul(core.sub(core.ONE, beta2), g[i]), g[i]))
        update = core.mul(core.mul(m_i, rbc1), core.recip(core.add(core.sqrt(core.mul(v_i, rbc2)), eps)))
        p[i] = core.sub(p[i], core.mul(lr, core.add(update, core.mul(wd, p[i]))))
        m[i] = m_i
        v[i] = v_i


def adamw_args(n, rng):
    p, g = operand(n, rng, "normal"), operand(n, rng, "bits")
    m, v = operand(n, rng, "normal"), np.abs(operand(n, rng, "normal"))
    hp = optim.AdamW()
    rbc1, rbc2 = (F32(c) for c in optim.adamw_bias_corrections(hp.beta1, hp.beta2, 3))
    return [p, g, m, v], [F32(1e-3), hp.beta1, hp.beta2, hp.eps, hp.weight_decay, rbc1, rbc2]


def test_adamw_blocked_equals_naive(threads):
    """[optim.adamw.c1] adamw_kernel, adamw_blocks and adamw_step == the naive loop."""
    rng = np.random.default_rng(500 + threads)
    for n in SIZES + BIG_SIZES[1:2]:
        arrays, scalars = adamw_args(n, rng)
        want = [a.copy() for a in arrays]
        adamw_naive(*want, *scalars)
        for k in (optim.adamw_kernel, optim.adamw_blocks):
            got = [a.copy() for a in arrays]
            k(*got, *scalars)
            for g, w, what in zip(got, want, "pgmv"):
                assert_same_bits(g, w, f"{k.__name__} {what} n={n}")
        p, g, m, v = (a.copy() for a in arrays)
        optim.adamw_step({"t": p}, {"t": g}, {"t": m}, {"t": v}, step=3, lr=scalars[0])
        for got, w, what in zip((p, g, m, v), want, "pgmv"):
            assert_same_bits(got, w, f"adamw_step {what} n={n}")


def test_clip_scale_blocked_equals_naive(threads):
    """[optim.clip.c1] step 5 (scale_kernel, scale_blocks) == the naive loop."""
    rng = np.random.default_rng(600 + threads)
    coef = F32(0.3)
    for n in SIZES + BIG_SIZES[1:2]:
        g = operand(n, rng, "bits")
        want = scale_naive(g, coef)
        for k in (optim.scale_kernel, optim.scale_blocks):
            got = g.copy()
            k(got, coef)
            assert_same_bits(got, want, f"{k.__name__} n={n}")
