"""Every speed-optimised kernel equals its simple loop version bit for bit.

Each ``*_naive`` kernel below is the simple form the optimised kernel
replaced (one element or row at a time, calling the scalar primitives of
``refreplay.numerics``).  An optimisation only vectorises across independent
outputs, hoists invariant work or removes allocations, so the two must agree
on every bit, for random inputs, special values (signed zeros, infinities,
NaN, subnormal-producing and overflow-producing magnitudes) and edge sizes.
"""

from __future__ import annotations

import naive
import numpy as np
import pytest
from conftest import many_threads
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numba import njit, prange

from refreplay._jit import kernel, parallel_kernel
from refreplay.linalg.common import NEG_ZERO, sum_start
from refreplay.numerics import elementwise
from refreplay.numerics.core import HALF, ONE, ZERO, add, mul, recip, sqrt, sub
from refreplay.numerics.transcendental import exp as tr_exp
from refreplay.numerics.transcendental import log as tr_log
from refreplay.numerics.transcendental import sigmoid as tr_sigmoid
from refreplay.numerics.transcendental import tanh
from refreplay.ops import activations, loss, norms, softmax
from refreplay.ops.rowblock import RB, load_block
from refreplay.ops.softmax import row_max

F32 = np.float32


def bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def assert_same_bits(got, want):
    g, w = bits(got), bits(want)
    bad = np.flatnonzero(g != w)
    assert bad.size == 0, (
        f"{bad.size} of {g.size} differ; first at {bad[0]}: {g.flat[bad[0]]:#010x} vs {w.flat[bad[0]]:#010x}"
    )


def special_values():
    """Signed zeros, infinities, the canonical NaN, the extremes of binary32,
    and the magnitudes around every branch point of GELU's tanh and exp."""
    pats = [
        0x00000000,
        0x80000000,
        0x7F800000,
        0xFF800000,
        0x7FC00000,
        0x00800000,
        0x80800000,
        0x7F7FFFFF,
        0xFF7FFFFF,
        0x3F800000,
        0xBF800000,
        0x3F400000,
        0xBF400000,
        0x42B17217,
        0x42B17218,
        0xC2B00000,
        0xC2B00001,
        0x33800000,
    ]
    x = np.array(pats, np.uint32).view(F32)
    # around the tanh switch |inner| = 0.75 and the exp overflow of 2|inner|
    near = np.concatenate(
        [
            np.linspace(-8, 8, 4001),
            np.linspace(-60, 60, 2001),
            np.geomspace(1e-30, 1e30, 2001),
            -np.geomspace(1e-30, 1e30, 2001),
        ]
    )
    return np.concatenate([x, near.astype(F32)])


def sweep(step=997, start=0, stop=1 << 32):
    """Every step-th bit pattern in [start, stop) (NaNs canonicalised,
    subnormal inputs zeroed as [num.load.c1] leaves operands)."""
    x = np.arange(start, stop, step, dtype=np.uint64).astype(np.uint32).view(F32)
    x = np.where(np.isnan(x), F32(np.nan), x).astype(F32)
    x = np.where(np.abs(x) < F32(1.1754944e-38), np.copysign(F32(0), x), x).astype(F32)
    return x


def inputs(rng):
    return [
        special_values(),
        sweep(),
        (rng.standard_normal(100_003) * 3).astype(F32),  # not a multiple of the block
        rng.standard_normal(1).astype(F32),
        np.zeros(0, F32),
    ]


# ---- GELU: the kernels as they were before vectorisation -------------------------


@parallel_kernel
def gelu_forward_naive(out, x):
    """[act.gelu.fwd.c1] one element per prange index, scalar tanh."""
    for i in prange(x.shape[0]):
        x_i = x[i]
        cube = mul(mul(mul(activations.GELU_CUBE, x_i), x_i), x_i)
        th = tanh(mul(activations.GELU_SCALE, add(x_i, cube)))
        out[i] = mul(mul(HALF, x_i), add(ONE, th))


@parallel_kernel
def gelu_backward_naive(dx, dout, x):
    """[act.gelu.bwd.c1] one element per prange index, scalar tanh."""
    for i in prange(x.shape[0]):
        x_i = x[i]
        cube = mul(mul(mul(activations.GELU_CUBE, x_i), x_i), x_i)
        th = tanh(mul(activations.GELU_SCALE, add(x_i, cube)))
        sech2 = sub(ONE, mul(th, th))
        dinner = mul(activations.GELU_SCALE, add(ONE, mul(mul(activations.GELU_CUBE3, x_i), x_i)))
        local = add(mul(HALF, add(ONE, th)), mul(mul(mul(HALF, x_i), sech2), dinner))
        dx[i] = mul(dout[i], local)


def test_gelu_forward_fast_equals_naive():
    """[act.gelu.fwd.c1] [num.tanh.c1] [num.exp.c1] branch-free lanes == scalar calls."""
    rng = np.random.default_rng(8)
    for x in inputs(rng):
        want = np.empty_like(x)
        gelu_forward_naive(want, x)
        assert_same_bits(activations.gelu_forward(x), want)


def test_gelu_backward_fast_equals_naive():
    """[act.gelu.bwd.c1] branch-free lanes == scalar calls, dout with specials too."""
    rng = np.random.default_rng(9)
    for x in inputs(rng):
        dout = rng.standard_normal(x.size).astype(F32)
        if x.size > 4:
            dout[:4] = np.array([0x80000000, 0x7F800000, 0x7FC00000, 0x00000000], np.uint32).view(F32)
        want = np.empty_like(x)
        gelu_backward_naive(want, dout, x)
        assert_same_bits(activations.gelu_backward(dout, x), want)


def test_gelu_tanh_lane_equals_scalar_tanh_on_a_sweep():
    """[num.tanh.c1] the lane form through the whole GELU agrees on an inner
    argument sweep: x chosen so that inner covers both sides of 0.75 densely."""
    x = np.linspace(-1.2, 1.2, 200_001).astype(F32)
    want = np.empty_like(x)
    gelu_forward_naive(want, x)
    assert_same_bits(activations.gelu_forward(x), want)


@pytest.mark.slow
def test_gelu_exhaustive():
    """[act.gelu.fwd.c1] [act.gelu.bwd.c1] every binary32 input (loaded form)."""
    for lo in range(0, 1 << 32, 1 << 24):
        x = sweep(1, lo, lo + (1 << 24))
        want = np.empty_like(x)
        gelu_forward_naive(want, x)
        assert_same_bits(activations.gelu_forward(x), want)
        dout = np.ones_like(x)
        gelu_backward_naive(want, dout, x)
        assert_same_bits(activations.gelu_backward(dout, x), want)


# ---- softmax_row: exponentials in lanes, then the ordered sum ----------------------


@kernel
def softmax_row_naive(x, n, y):
    """[softmax.fwd.c1] the row kernel before vectorisation: exp, store and
    add in one loop."""
    m = row_max(x, n)
    s = NEG_ZERO
    for j in range(n):
        e = tr_exp(sub(x[j], m))
        y[j] = e
        s = add(s, e)
    r = recip(s)
    for j in range(n):
        y[j] = mul(y[j], r)


@parallel_kernel
def softmax_naive(x, y):
    for i in prange(x.shape[0]):
        softmax_row_naive(x[i], x.shape[1], y[i])


def softmax_rows(rng):
    """Rows of several lengths (1 .. 300, the lane tail included) with random
    logits at several scales, and rows holding +-inf, NaN, -0 and huge values."""
    out = []
    for V in (1, 2, 7, 8, 9, 31, 128, 256, 300):
        for scale in (0.01, 1.0, 30.0, 200.0):
            out.append((rng.standard_normal((17, V)) * scale).astype(F32))
        sp = np.resize(special_values(), 9 * V).reshape(9, V).astype(F32)
        out.append(np.ascontiguousarray(sp))
    return out


def test_softmax_row_fast_equals_naive():
    """[softmax.fwd.c1] [num.exp.c1] lane exponentials then the ordered sum ==
    the one-loop form, on whole rows and on causal prefixes (attention's use),
    in place (y aliasing x) and out of place."""
    rng = np.random.default_rng(10)
    for x in softmax_rows(rng):
        want = np.empty_like(x)
        softmax_naive(x, want)
        assert_same_bits(softmax.softmax_forward(x), want)
        V = x.shape[1]
        for n in sorted({1, V // 2 + 1, V}):
            got = x.copy()
            ref = x.copy()
            for r in range(x.shape[0]):
                softmax.softmax_row(got[r], n, got[r])
                softmax_row_naive(ref[r], n, ref[r])
            assert_same_bits(got, ref)


MAX_PATTERNS = [
    0x00000000,
    0x80000000,
    0x00000001,
    0x80000001,
    0x007FFFFF,
    0x807FFFFF,
    0x00800000,
    0x80800000,
    0x3F800000,
    0xBF800000,
    0x7F7FFFFF,
    0xFF7FFFFF,
    0x7F800000,
    0xFF800000,
    0x7FC00000,
    0xFFC00001,
    0x7F800001,
    0x7FBFFFFF,
]  # +-0, +-subnormals, +-smallest normal, +-1, +-max, +-inf, quiet / signalling NaNs of both signs


def row_max_chain(x):
    """[red.rowmax.c1] m = -inf, m = flush(fmax(m, x[j])) in order, in plain
    Python on the bits (tests/naive.py's fmax, no library code)."""
    m = F32(-np.inf)
    for v in x:
        m = naive.flush(naive.fmax(m, v))
    return m


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(st.sampled_from(MAX_PATTERNS), st.integers(0, 2**32 - 1)), max_size=150))
def test_row_max_equals_the_fmax_chain(pats):
    """[red.rowmax.c1] [num.minmax.c1] softmax.row_max (ordering keys, any
    order) gives the chain's bits: NaN anywhere gives the canonical NaN, +0
    beats -0, a subnormal maximum is flushed to the zero of its sign, and the
    empty row gives -inf; every prefix length is checked."""
    x = np.array(pats, np.uint32).view(F32)
    for n in sorted({0, len(x) // 2, max(len(x) - 1, 0), len(x)}):
        assert_same_bits(F32(row_max(x, n)), row_max_chain(x[:n]))


def test_row_max_picks_each_rule():
    """The cases a wrong ordering key would get wrong, one by one."""
    cases = [
        ([], 0xFF800000),
        ([0xFF800000], 0xFF800000),
        ([0x80000000, 0x00000000], 0x00000000),
        ([0x00000000, 0x80000000], 0x00000000),
        ([0x80000000, 0x80000001], 0x80000000),
        ([0x80000001], 0x80000000),
        ([0x00000001, 0x80000000], 0x00000000),
        ([0xBF800000, 0xC0000000], 0xBF800000),
        ([0xFF7FFFFF, 0xFF800000], 0xFF7FFFFF),
        ([0x3F800000, 0x7F800000, 0xFFC00001], 0x7FC00000),
        ([0x7F800001, 0x3F800000], 0x7FC00000),
        ([0x3F800000] * 70 + [0xFFC00001], 0x7FC00000),
    ]
    for pats, want in cases:
        x = np.array(pats, np.uint32).view(F32)
        assert bits(F32(row_max(x, len(x))))[()] == want, (pats, hex(want))


def test_exp_lane_equals_exp():
    """[num.exp.c1] the lane form equals the scalar exp on specials and a sweep."""
    for x in (special_values(), sweep(), np.linspace(-100, 100, 100_001).astype(F32)):
        assert_same_bits(lane_exp_array(x), elementwise.exp(x))


@parallel_kernel
def lane_exp_array(x):
    out = np.empty_like(x)
    for i in prange(x.shape[0]):
        out[i] = elementwise.exp_lane(x[i])
    return out


# (attention's tiled kernels against the row-at-a-time ones: tests/test_attention_tiles.py)


# ---- SiLU and SwiGLU: sigmoid in lane form -------------------------------------------


@parallel_kernel
def silu_naive(out, dx, dout, x):
    """[act.silu.fwd.c1] [act.silu.bwd.c1] one element per index, scalar sigmoid."""
    for i in prange(x.shape[0]):
        x_i = x[i]
        s = tr_sigmoid(x_i)
        out[i] = mul(x_i, s)
        dx[i] = mul(dout[i], mul(s, add(ONE, mul(x_i, sub(ONE, s)))))


@parallel_kernel
def swiglu_naive(out, da, db, dout, a, b):
    """[act.swiglu.fwd.c1] [act.swiglu.bwd.c1] one element per index, scalar sigmoid."""
    for i in prange(a.shape[0]):
        a_i = a[i]
        s = tr_sigmoid(a_i)
        silu_a = mul(a_i, s)
        out[i] = mul(silu_a, b[i])
        dsilu = mul(s, add(ONE, mul(a_i, sub(ONE, s))))
        da[i] = mul(mul(dout[i], b[i]), dsilu)
        db[i] = mul(dout[i], silu_a)


def test_silu_swiglu_fast_equal_naive():
    """[act.silu.fwd.c1] [act.silu.bwd.c1] [act.swiglu.fwd.c1] [act.swiglu.bwd.c1]
    [num.sigmoid.c1] lane sigmoid == scalar sigmoid through all four kernels."""
    rng = np.random.default_rng(12)
    for x in inputs(rng):
        dout = rng.standard_normal(x.size).astype(F32)
        b = rng.permutation(x)
        want = [np.empty_like(x) for _ in range(5)]
        silu_naive(want[0], want[1], dout, x)
        swiglu_naive(want[2], want[3], want[4], dout, x, b)
        assert_same_bits(activations.silu_forward(x), want[0])
        assert_same_bits(activations.silu_backward(dout, x), want[1])
        assert_same_bits(activations.swiglu_forward(x, b), want[2])
        da, db = activations.swiglu_backward(dout, x, b)
        assert_same_bits(da, want[3])
        assert_same_bits(db, want[4])


# ---- log-softmax and cross-entropy: exponentials in lanes into scratch ---------------


@kernel
def logsumexp_parts_naive(x, n):
    """[softmax.log.c1] exp and add in one loop (the form before scratch)."""
    m = row_max(x, n)
    s = NEG_ZERO
    for j in range(n):
        s = add(s, tr_exp(sub(x[j], m)))
    return m, tr_log(s)


@parallel_kernel
def log_softmax_naive(x, y):
    for i in prange(x.shape[0]):
        m, ls = logsumexp_parts_naive(x[i], x.shape[1])
        for j in range(x.shape[1]):
            y[i, j] = sub(sub(x[i, j], m), ls)


@parallel_kernel
def log_softmax_backward_naive(dy, y, dx):
    """[softmax.log.bwd.c1] scalar exp per element."""
    for i in prange(y.shape[0]):
        g = NEG_ZERO
        for j in range(y.shape[1]):
            g = add(g, dy[i, j])
        for j in range(y.shape[1]):
            dx[i, j] = sub(dy[i, j], mul(tr_exp(y[i, j]), g))


@parallel_kernel
def cross_entropy_naive(logits, targets, losses):
    """[loss.token.c1] with the one-loop logsumexp (no ignored tokens)."""
    for n in prange(logits.shape[0]):
        m, ls = logsumexp_parts_naive(logits[n], logits.shape[1])
        losses[n] = sub(ls, sub(logits[n, targets[n]], m))


def test_log_softmax_and_cross_entropy_fast_equal_naive():
    """[softmax.log.c1] [softmax.log.bwd.c1] [loss.token.c1] lane exponentials
    into scratch, then the ordered sum == the one-loop form."""
    rng = np.random.default_rng(13)
    for x in softmax_rows(rng):
        want = np.empty_like(x)
        log_softmax_naive(x, want)
        y = softmax.log_softmax_forward(x)
        assert_same_bits(y, want)
        dy = rng.standard_normal(x.shape).astype(F32)
        log_softmax_backward_naive(dy, y, want)
        assert_same_bits(softmax.log_softmax_backward(dy, y), want)
        tgt = rng.integers(0, x.shape[1], size=x.shape[0]).astype(np.int32)
        losses = np.empty(x.shape[0], F32)
        cross_entropy_naive(x, tgt, losses)
        assert_same_bits(loss.cross_entropy_forward(x, tgt)[0], losses)


# ---- row blocks: RB rows' sums side by side in SIMD lanes ------------------------------
# The kernels below are the row ops as they were before rowblock.py: one row
# per prange index, each sum one loop over the row.  The block kernels keep
# every row's sum in that order ([red.sum.c1]) and only run RB rows at once.


@parallel_kernel
def softmax_backward_naive(dy, y, dx):
    """[softmax.bwd.c1] one row per index."""
    for i in prange(y.shape[0]):
        d = NEG_ZERO
        for j in range(y.shape[1]):
            d = add(d, mul(dy[i, j], y[i, j]))
        for j in range(y.shape[1]):
            dx[i, j] = mul(y[i, j], sub(dy[i, j], d))


@parallel_kernel
def cross_entropy_full_naive(logits, targets, ignore_index, losses):
    """[loss.token.c1] one row per index, ignored tokens +0."""
    for n in prange(logits.shape[0]):
        if targets[n] == ignore_index:
            losses[n] = ZERO
        else:
            m, ls = logsumexp_parts_naive(logits[n], logits.shape[1])
            losses[n] = sub(ls, sub(logits[n, targets[n]], m))


@parallel_kernel
def cross_entropy_backward_naive(logits, targets, ignore_index, c, dlogits):
    """[loss.bwd.c1] one row per index: softmax, minus one at the target, times c."""
    N, V = logits.shape
    for n in prange(N):
        d_n = dlogits[n]
        y = targets[n]
        if y == ignore_index:
            for j in range(V):
                d_n[j] = ZERO
        else:
            softmax_row_naive(logits[n], V, d_n)
            d_n[y] = sub(d_n[y], ONE)
            for j in range(V):
                d_n[j] = mul(d_n[j], c)


@parallel_kernel
def layernorm_forward_naive(out, mean, rstd, x, w, b, eps):
    """[norm.layer.fwd.c1] one row per index."""
    N, C = x.shape
    inv_C = recip(F32(C))
    for n in prange(N):
        x_n = x[n]
        s = sum_start(C)
        for c in range(C):
            s = add(s, x_n[c])
        mean_n = mul(s, inv_C)
        v = sum_start(C)
        for c in range(C):
            d = sub(x_n[c], mean_n)
            v = add(v, mul(d, d))
        var_n = mul(v, inv_C)
        rstd_n = recip(sqrt(add(var_n, eps)))
        for c in range(C):
            norm_c = mul(sub(x_n[c], mean_n), rstd_n)
            out[n, c] = add(mul(norm_c, w[c]), b[c])
        mean[n] = mean_n
        rstd[n] = rstd_n


@parallel_kernel
def layernorm_backward_dx_naive(dx, dout, x, w, mean, rstd):
    """[norm.layer.bwd.c1] steps 1-4, one row per index."""
    N, C = x.shape
    inv_C = recip(F32(C))
    for n in prange(N):
        s_dnorm = sum_start(C)
        s_dnorm_norm = sum_start(C)
        for c in range(C):
            norm_c = mul(sub(x[n, c], mean[n]), rstd[n])
            dnorm_c = mul(dout[n, c], w[c])
            s_dnorm = add(s_dnorm, dnorm_c)
            s_dnorm_norm = add(s_dnorm_norm, mul(dnorm_c, norm_c))
        dnorm_mean = mul(s_dnorm, inv_C)
        dnorm_norm_mean = mul(s_dnorm_norm, inv_C)
        for c in range(C):
            norm_c = mul(sub(x[n, c], mean[n]), rstd[n])
            dnorm_c = mul(dout[n, c], w[c])
            t = sub(sub(dnorm_c, dnorm_mean), mul(norm_c, dnorm_norm_mean))
            dx[n, c] = mul(t, rstd[n])


@kernel
def layernorm_backward_dwdb_naive(dw, db, dout, x, mean, rstd):
    """[norm.layer.bwd.c1] step 5, one column at a time, every operation
    canonicalising (the kernel canonicalises each column's chain at its end)."""
    N, C = x.shape
    for c in range(C):
        sw = sum_start(N)
        sb = sum_start(N)
        for n in range(N):
            norm_c = mul(sub(x[n, c], mean[n]), rstd[n])
            sw = add(sw, mul(dout[n, c], norm_c))
            sb = add(sb, dout[n, c])
        dw[c] = sw
        db[c] = sb


@parallel_kernel
def rmsnorm_forward_naive(out, rrms, x, w, eps):
    """[norm.rms.fwd.c1] one row per index."""
    N, C = x.shape
    inv_C = recip(F32(C))
    for n in prange(N):
        ss = sum_start(C)
        for c in range(C):
            ss = add(ss, mul(x[n, c], x[n, c]))
        rrms_n = recip(sqrt(add(mul(ss, inv_C), eps)))
        for c in range(C):
            out[n, c] = mul(mul(x[n, c], rrms_n), w[c])
        rrms[n] = rrms_n


@parallel_kernel
def rmsnorm_backward_dx_naive(dx, dout, x, w, rrms):
    """[norm.rms.bwd.c1] steps 1-4, one row per index."""
    N, C = x.shape
    inv_C = recip(F32(C))
    for n in prange(N):
        s = sum_start(C)
        for c in range(C):
            s = add(s, mul(mul(dout[n, c], w[c]), mul(x[n, c], rrms[n])))
        dnorm_norm_mean = mul(s, inv_C)
        for c in range(C):
            norm_c = mul(x[n, c], rrms[n])
            dnorm_c = mul(dout[n, c], w[c])
            dx[n, c] = mul(sub(dnorm_c, mul(norm_c, dnorm_norm_mean)), rrms[n])


def row_specials():
    """special_values() plus subnormals (kept: both forms see the same operand)
    and values whose squares and sums overflow or underflow."""
    pats = [
        0x00000001,
        0x80000001,
        0x007FFFFF,
        0x807FFFFF,
        0x00400000,
        0x7F000000,
        0xFF000000,
        0x5F800000,
        0xDF800000,
        0x1F800000,
        0x9F800000,
        0x20000000,
    ]
    return np.concatenate([special_values(), np.array(pats, np.uint32).view(F32)])


def row_tensors(rng):
    """[N, V] tensors: N = 1, 3, 33, 70 (one, part of one and several blocks,
    the last partial), V = 1, 3, 17, 256, 257; random at three scales, the
    same with ~3 % of entries replaced by specials (some rows stay finite),
    and all specials."""
    assert RB not in (1, 3, 33, 70) and 70 % RB
    sp = row_specials()
    for N in (1, 3, 33, 70):
        for V in (1, 3, 17, 256, 257):
            for scale in (0.01, 3.0, 1e18):
                yield (rng.standard_normal((N, V)) * scale).astype(F32)
            x = rng.standard_normal((N, V)).astype(F32)
            hit = rng.random((N, V)) < 0.03
            x[hit] = rng.choice(sp, size=int(hit.sum()))
            yield x
            yield np.ascontiguousarray(rng.choice(sp, size=(N, V)).astype(F32))


def test_row_blocks_softmax_family_equal_naive():
    """[softmax.fwd.c1] [softmax.bwd.c1] [softmax.log.c1] [softmax.log.bwd.c1]
    [red.sum.c1] RB rows in lanes == one row at a time, every output bit."""
    rng = np.random.default_rng(14)
    for x in row_tensors(rng):
        dy = rng.standard_normal(x.shape).astype(F32)
        dy.flat[::7] = rng.choice(row_specials(), size=dy.flat[::7].size)
        want = np.empty_like(x)
        softmax_naive(x, want)
        y = softmax.softmax_forward(x)
        assert_same_bits(y, want)
        softmax_backward_naive(dy, y, want)
        assert_same_bits(softmax.softmax_backward(dy, y), want)
        log_softmax_naive(x, want)
        ly = softmax.log_softmax_forward(x)
        assert_same_bits(ly, want)
        log_softmax_backward_naive(dy, ly, want)
        assert_same_bits(softmax.log_softmax_backward(dy, ly), want)


def test_row_blocks_cross_entropy_equal_naive():
    """[loss.token.c1] [loss.bwd.c1] blocks == rows, with ignored tokens
    (first, last and random rows) and several count denominators."""
    rng = np.random.default_rng(15)
    for x in row_tensors(rng):
        N, V = x.shape
        tgt = rng.integers(0, V, size=N).astype(np.int32)
        tgt[rng.random(N) < 0.2] = loss.IGNORE_INDEX
        tgt[-1] = loss.IGNORE_INDEX
        losses = np.empty(N, F32)
        cross_entropy_full_naive(x, tgt, loss.IGNORE_INDEX, losses)
        assert_same_bits(loss.cross_entropy_forward(x, tgt)[0], losses)
        counted = int(np.count_nonzero(tgt != loss.IGNORE_INDEX))
        for dloss, count in ((ONE, None), (F32(-3.0), counted + 5)):
            c = mul(F32(dloss), recip(F32(count or counted))) if (count or counted) else ZERO
            want = np.empty_like(x)
            cross_entropy_backward_naive(x, tgt, loss.IGNORE_INDEX, F32(c), want)
            assert_same_bits(loss.cross_entropy_backward(x, tgt, dloss, count), want)


def test_row_blocks_norms_equal_naive():
    """[norm.layer.fwd.c1] [norm.layer.bwd.c1] [norm.rms.fwd.c1] [norm.rms.bwd.c1]
    [norm.meanop.c1] blocks == rows: out, the statistics and dx bit for bit
    (dw, db are column sums, unchanged, compared too)."""
    rng = np.random.default_rng(16)
    eps = F32(1e-5)
    for x in row_tensors(rng):
        N, C = x.shape
        w = rng.standard_normal(C).astype(F32)
        b = rng.standard_normal(C).astype(F32)
        w[0] = F32(-0.0)
        dout = rng.standard_normal((N, C)).astype(F32)
        dout.flat[::5] = rng.choice(row_specials(), size=dout.flat[::5].size)
        for e in (eps, F32(0.0)):  # eps = 0: var + eps may round to 0, rstd = +inf
            want = [np.empty_like(x), np.empty(N, F32), np.empty(N, F32)]
            layernorm_forward_naive(*want, x, w, b, e)
            got = norms.layernorm_forward(x, w, b, e)
            for g, wv in zip(got, want):
                assert_same_bits(g, wv)
            dx_want = np.empty_like(x)
            layernorm_backward_dx_naive(dx_want, dout, x, w, want[1], want[2])
            dx, dw, db = norms.layernorm_backward(dout, x, w, want[1], want[2])
            assert_same_bits(dx, dx_want)
            dw_want, db_want = np.empty(C, F32), np.empty(C, F32)
            layernorm_backward_dwdb_naive(dw_want, db_want, dout, x, want[1], want[2])
            assert_same_bits(dw, dw_want)
            assert_same_bits(db, db_want)
            rwant = [np.empty_like(x), np.empty(N, F32)]
            rmsnorm_forward_naive(*rwant, x, w, e)
            for g, wv in zip(norms.rmsnorm_forward(x, w, e), rwant):
                assert_same_bits(g, wv)
            rmsnorm_backward_dx_naive(dx_want, dout, x, w, rwant[1])
            assert_same_bits(norms.rmsnorm_backward(dout, x, w, rwant[1])[0], dx_want)


def layernorm_scale_cases(rng):
    """(x, w, b, dout) at [70, 77] (three blocks, the last partial) whose
    blocks take either form of layernorm's element-wise passes: ordinary
    values (flush-free), and scales where a result is subnormal unless it is
    flushed: tiny x (x - mean and norm*w underflow), tiny w, b or dout,
    constant rows (mean exact, var 0), a tiny value in one row of one block
    only, and rows of huge values (rstd tiny)."""
    N, C = 70, 77

    def gen(x_scale=1.0, w_scale=1.0, b_scale=1.0, d_scale=1.0):
        x = (rng.standard_normal((N, C)) * x_scale).astype(F32)
        w = (rng.standard_normal(C) * w_scale).astype(F32)
        b = (rng.standard_normal(C) * b_scale).astype(F32)
        d = (rng.standard_normal((N, C)) * d_scale).astype(F32)
        return x, w, b, d

    yield gen()
    yield gen(x_scale=1e-36)
    yield gen(w_scale=1e-37)
    yield gen(w_scale=1e-37, b_scale=0.0)  # out = norm*w: some subnormal before the flush
    yield gen(w_scale=1e-30, b_scale=1e-38)
    yield gen(d_scale=1e-37)
    yield gen(d_scale=1e-20, w_scale=1e-19)
    yield gen(x_scale=1e30)
    x, w, b, d = gen()
    x[40] = F32(3.0)
    x[41, :] = F32(1e-38)
    x[45, 3] = F32(-2e-38)
    yield x, w, b, d
    x, w, b, d = gen()
    x[::9] *= F32(1e-34)  # some rows of every block tiny
    d[1::5] *= F32(1e-36)
    yield x, w, b, d
    x, w, b, d = gen()
    x[33:40] = (1.0 + rng.integers(-3, 4, size=(7, C)) * 2.0**-23).astype(F32)  # x - mean a few ulp
    yield x, w, b, d
    yield sum_flush_case(rng)
    yield dwdb_flush_case(rng)


def _flush_matters_in_sum(v):
    """v = (1.5 * 2^-126, -2^-126, u): the second partial sum is the
    subnormal 2^-127 (flushed, 0); u's last bit is odd and 2^-127 is half
    its ulp, so the third sum rounds to u flushed and to u + 2^-126 unflushed."""
    v[:3] = [1.5 * 2.0**-126, -(2.0**-126), 2.0**-103 * (1 + 2.0**-23)]


def sum_flush_case(rng):
    """(x, w, b, dout) at [70, 77] whose row sums and column chains meet a
    subnormal partial result that a flush changes, one of each kind among
    ordinary rows: the forward's mean sum (row 2), its sum of squared
    deviations (row 35: d*d subnormal, +-2^-70 beside +-2^-60, mean exactly
    0) and the backward's sum of dnorm (dout's row 66)."""
    N, C = 70, 77
    x = rng.standard_normal((N, C)).astype(F32)
    d = rng.standard_normal((N, C)).astype(F32)
    w, b = np.ones(C, F32), rng.standard_normal(C).astype(F32)
    x[2] = 0.0
    _flush_matters_in_sum(x[2])
    x[35] = 0.0
    x[35, :4] = [2.0**-60 * (1 + 3 * 2.0**-23), -(2.0**-60) * (1 + 3 * 2.0**-23), 2.0**-70 * 1.25, -(2.0**-70) * 1.25]
    d[66] = 0.0
    _flush_matters_in_sum(d[66])
    return x, w, b, d


def dwdb_flush_case(rng):
    """(x, w, b, dout) at [70, 77] whose db chain down column 5 meets a
    subnormal partial sum that a flush changes (rows 40-42, dout tiny
    there), while every other bound of that block holds: w = 2^30 keeps
    dnorm and dx normal, so only step 5's own bound can send the block to
    the flushed form."""
    N, C = 70, 77
    x = rng.standard_normal((N, C)).astype(F32)
    d = rng.standard_normal((N, C)).astype(F32)
    w, b = np.full(C, 2.0**30, F32), rng.standard_normal(C).astype(F32)
    d[:, 5] = 0.0
    _flush_matters_in_sum(d[40:43, 5])
    return x, w, b, d


def _layernorm_both(x, w, b, d, eps, threads):
    import numba

    numba.set_num_threads(threads)
    try:
        out = norms.layernorm_forward(x, w, b, eps)
        return out, norms.layernorm_backward(d, x, w, out[1], out[2])
    finally:
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)


@pytest.mark.threads
def test_layernorm_flush_free_forms_equal_naive():
    """[norm.layer.fwd.c1] [norm.layer.bwd.c1] [mm.flush.r1] each block's
    flush-free or flushed form, with the one-pass backward (one thread) and
    the dx + dw/db kernels (all threads): every bit as the naive kernels."""
    rng = np.random.default_rng(18)
    cases = list(layernorm_scale_cases(rng))
    for x, w, b, d in cases:
        N, C = x.shape
        for e in (F32(1e-5), F32(0.0)):
            want = [np.empty_like(x), np.empty(N, F32), np.empty(N, F32)]
            layernorm_forward_naive(*want, x, w, b, e)
            dx_want = np.empty_like(x)
            layernorm_backward_dx_naive(dx_want, d, x, w, want[1], want[2])
            dw_want, db_want = np.empty(C, F32), np.empty(C, F32)
            layernorm_backward_dwdb_naive(dw_want, db_want, d, x, want[1], want[2])
            for threads in (1, many_threads()):
                fwd, bwd = _layernorm_both(x, w, b, d, e, threads)
                for g, wv in zip(fwd + bwd, want + [dx_want, dw_want, db_want]):
                    assert_same_bits(g, wv)


def _without_flush_bounds(fn, **callees):
    """fn (a compiled layernorm kernel) rebuilt with a bound that every block
    passes: the flush-free form everywhere, a wrong reading of [mm.flush.r1].
    ``callees``: global names of fn to replace (by rebuilt kernels)."""
    import types

    import numba

    f = fn.py_func
    g = dict(f.__globals__, _MIN_NORMAL=-(1 << 40), **callees)
    return numba.njit(error_model="numpy")(types.FunctionType(f.__code__, g, f.__name__))


def test_layernorm_without_its_flush_bounds_fails():
    """The bounds decide bits: a kernel that always takes the flush-free form
    differs from the naive kernels on the tiny-scale cases (and agrees on the
    ordinary one), forward and backward."""
    rng = np.random.default_rng(18)
    cases = list(layernorm_scale_cases(rng))
    fwd_mutant = _without_flush_bounds(norms.layernorm_forward_kernel)
    bwd_mutant = _without_flush_bounds(
        norms.layernorm_backward_dx_kernel,
        layernorm_backward_block=_without_flush_bounds(norms.layernorm_backward_block),
    )
    e = F32(1e-5)
    fwd_differs = bwd_differs = stats_differ = 0
    for i, (x, w, b, d) in enumerate(cases):
        N, C = x.shape
        want = [np.empty_like(x), np.empty(N, F32), np.empty(N, F32)]
        layernorm_forward_naive(*want, x, w, b, e)
        got = [np.empty_like(x), np.empty(N, F32), np.empty(N, F32)]
        fwd_mutant(*got, x, w, b, e)
        dx_want, dx_got = np.empty_like(x), np.empty_like(x)
        layernorm_backward_dx_naive(dx_want, d, x, w, want[1], want[2])
        bwd_mutant(dx_got, d, x, w, want[1], want[2])
        f_same = np.array_equal(bits(got[0]), bits(want[0]))
        b_same = np.array_equal(bits(dx_got), bits(dx_want))
        if i == 0:
            assert f_same and b_same  # ordinary values: the flush-free form is right
        fwd_differs += not f_same
        bwd_differs += not b_same
        stats_differ += not (
            np.array_equal(bits(got[1]), bits(want[1])) and np.array_equal(bits(got[2]), bits(want[2]))
        )
    assert fwd_differs >= 1 and bwd_differs >= 2, (fwd_differs, bwd_differs)
    assert stats_differ >= 1  # the row sums' own bounds: mean, rstd come from them alone
    # the backward in one pass: its dw/db chains take the flush-free form only where they are proved too
    one_pass_mutant = _without_flush_bounds(
        norms.layernorm_backward_one_pass_kernel,
        layernorm_backward_block=_without_flush_bounds(norms.layernorm_backward_block),
    )
    x, w, b, d = cases[-1]  # dwdb_flush_case
    N, C = x.shape
    want = [np.empty_like(x), np.empty(N, F32), np.empty(N, F32)]
    layernorm_forward_naive(*want, x, w, b, e)
    db_want, dw_want = np.empty(C, F32), np.empty(C, F32)
    layernorm_backward_dwdb_naive(dw_want, db_want, d, x, want[1], want[2])
    got = [np.empty_like(x), np.empty(C, F32), np.empty(C, F32)]
    one_pass_mutant(*got, d, x, w, want[1], want[2])
    assert bits(got[2][5]) != bits(db_want[5])


@njit
def _ln_sum_forms(x, dout, w, rows):
    """Both forms of each LayerNorm row sum on the first block of x, dout:
    (means, squared-deviation sums, dnorm sums, dnorm*norm sums), each as
    [2, RB] (the flush-free form, the flushed one)."""
    C = x.shape[1]
    inv_C = recip(F32(C))
    start = sum_start(C)
    X = load_block(x, 0, rows)
    D = load_block(dout, 0, rows)
    m = np.empty((2, RB), np.float32)
    q = np.empty((2, RB), np.float32)
    a = np.empty((2, RB), np.float32)
    g = np.empty((2, RB), np.float32)
    norms._ln_means_exact(X, m[0], rows, start, inv_C)
    norms._ln_means_flushed(X, m[1], rows, start, inv_C)
    norms._ln_dev_pass(X, m[1], q[0], start, False)
    norms._ln_dev_pass(X, m[1], q[1], start, True)
    rstd = np.empty(RB, np.float32)
    for r in range(RB):
        rstd[r] = recip(sqrt(add(mul(q[1, r], inv_C), F32(1e-5)))) if r < rows else ZERO
    norms._ln_grad_exact(X, D, w, m[1], rstd, a[0], g[0], start)
    norms._ln_grad_flushed(X, D, w, m[1], rstd, a[1], g[1], start)
    return m, q, a, g


def test_layernorm_sum_forms_differ_where_a_flush_matters():
    """[norm.layer.fwd.c1] [norm.layer.bwd.c1] [mm.flush.r1] the row sums'
    flush-free forms (vector lanes, ``_tiles.lanes_add``) equal the flushed
    ones on ordinary rows and differ on the rows built so that a flush
    changes a bit (sum_flush_case): so the bounds are what keeps the
    kernels right there (test_layernorm_flush_free_forms_equal_naive holds
    the kernels to the naive ones on that case)."""
    x, w, b, d = sum_flush_case(np.random.default_rng(3))
    rows = [2, 35, 66, 0, 1, 40]  # three built rows, three ordinary ones
    xs, ds = np.ascontiguousarray(x[rows]), np.ascontiguousarray(d[rows])
    m, q, a, g = _ln_sum_forms(xs, ds, w, len(rows))
    differs = [not np.array_equal(bits(s[0, : len(rows)]), bits(s[1, : len(rows)])) for s in (m, q, a)]
    assert differs == [True, True, True]
    assert bits(m[0, 0]) != bits(m[1, 0]) and bits(q[0, 1]) != bits(q[1, 1]) and bits(a[0, 2]) != bits(a[1, 2])
    for s in (m, q, a, g):
        assert_same_bits(s[0, 3:6], s[1, 3:6])


@pytest.mark.threads
def test_row_blocks_do_not_depend_on_threads():
    """[red.order.r1] a block never splits a row: 1 thread == all threads."""
    import numba

    rng = np.random.default_rng(17)
    x = rng.standard_normal((70, 257)).astype(F32)
    w = rng.standard_normal(257).astype(F32)
    tgt = rng.integers(0, 257, size=70).astype(np.int32)
    runs = []
    for threads in (1, many_threads()):
        numba.set_num_threads(threads)
        try:
            out, mean, rstd = norms.layernorm_forward(x, w, w)
            runs.append(
                [
                    softmax.softmax_forward(x),
                    out,
                    *norms.layernorm_backward(x, x, w, mean, rstd),
                    norms.rmsnorm_forward(x, w)[0],
                    loss.cross_entropy_backward(x, tgt),
                ]
            )
        finally:
            numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    for a, b in zip(*runs):
        assert_same_bits(a, b)
