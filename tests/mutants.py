"""Wrong readings of the spec: plain NumPy transcriptions of clauses, each
with one small change a careful implementer could make.

Every function here is an op kernel in the runner's calling convention
(``refreplay vectors ops``): it takes the stored inputs (subnormals and NaN
payloads included) and returns the op's outputs.  ``CORRECT`` are the
faithful transcriptions the mutants vary (``tests/test_mutants.py`` checks
that each passes its op's vectors, so a killed mutant is killed by its one
change); ``MUTANTS`` maps a mutant's name to (op, kernel, the clause it
misreads, what it does differently).  ``EQUIVALENT`` lists readings that
differ in the text but give the same bits on every input, each with the
argument why (they are not counted as survivors).

Arithmetic is NumPy binary32 (every + and * rounded to nearest-even, never
fused) followed by the spec's flush and NaN rules, written out here; the
transcendental primitives of chapter 2 come from ``naive_numerics`` (an
independent transcription) where a mutant changes them, and from
refreplay's own primitives where an op of chapters 10-16 merely uses them.
"""

from __future__ import annotations

import functools

import numpy as np

import naive_numerics as nn

F32 = np.float32
FLT_MIN = F32(2.0**-126)
CANON = np.array([0x7FC00000], np.uint32).view(F32)[0]


# ---- binary32 arithmetic with the spec's flush and NaN rule ([num.flush.c1], [num.nan.c1]) ----


def bits(x):
    return np.asarray(x, F32).view(np.uint32)


def from_bits(b):
    return np.asarray(b, np.uint32).view(F32)


def finish(r, flush=True, canon=True):
    r = np.asarray(r, F32)
    if flush:
        r = np.where((r != 0) & (np.abs(r) < FLT_MIN), from_bits(bits(r) & 0x80000000), r)
    if canon:
        r = np.where(np.isnan(r), CANON, r)
    return np.asarray(r, F32)


def load(x, zero=True):
    """[num.load.c1] subnormal inputs zeroed, NaNs canonical."""
    x = np.asarray(x)
    if x.dtype != F32:
        return x
    return finish(x, flush=zero)


def add(a, b, **kw):
    with np.errstate(all="ignore"):
        return finish(np.add(np.asarray(a, F32), np.asarray(b, F32)), **kw)


def sub(a, b):
    return add(a, np.negative(np.asarray(b, F32)))


def mul(a, b, **kw):
    with np.errstate(all="ignore"):
        return finish(np.multiply(np.asarray(a, F32), np.asarray(b, F32)), **kw)


def recip(x):
    with np.errstate(all="ignore"):
        return finish(np.divide(F32(1), np.asarray(x, F32)))


def sqrt(x):
    with np.errstate(all="ignore"):
        return finish(np.sqrt(np.asarray(x, F32)))


def fma(a, b, c):
    """a*b + c rounded once (float64 holds a*b exactly; one rounding to binary32
    is exact for these probes' magnitudes)."""
    with np.errstate(all="ignore"):
        return finish((np.asarray(a, np.float64) * np.asarray(b, np.float64) + np.asarray(c, np.float64)).astype(F32))


def fmax(a, b, zero_rule=True, nan_rule=True):
    """[num.minmax.c1] NaN if either is NaN; +0 beats -0; result flushed."""
    a, b = np.asarray(a, F32), np.asarray(b, F32)
    r = np.where(a > b, a, b)
    if zero_rule:
        r = np.where((a == b) & (a == 0), from_bits(bits(a) & bits(b)), r)
    if nan_rule:
        r = np.where(np.isnan(a) | np.isnan(b), CANON, r)
    else:
        r = np.where(np.isnan(a), b, np.where(np.isnan(b), a, r))
    return finish(r)


def seq_rows(X, start=F32(-0.0), empty=F32(0.0)):
    """[red.sum.c1] each row of X summed with n increasing from ``start``; an
    empty row is ``empty``."""
    X = np.asarray(X, F32)
    if X.shape[-1] == 0:
        return np.full(X.shape[:-1], empty, F32)
    acc = np.full(X.shape[:-1], start, F32)
    for n in range(X.shape[-1]):
        acc = add(acc, X[..., n])
    return acc


def split_rows(X, blocks=2):
    """The rows summed in ``blocks`` consecutive blocks, then the block sums."""
    X = np.asarray(X, F32)
    edges = np.linspace(0, X.shape[-1], blocks + 1).astype(int)
    return seq_rows(np.stack([seq_rows(X[..., a:b]) for a, b in zip(edges, edges[1:])], -1))


def pairwise_rows(X):
    X = np.asarray(X, F32)
    n = X.shape[-1]
    if n <= 1:
        return seq_rows(X)
    return add(pairwise_rows(X[..., : n // 2]), pairwise_rows(X[..., n // 2 :]))


def elementwise(fn, *xs):
    """A scalar transcription applied to every element."""
    xs = [np.asarray(x, F32) for x in xs]
    out = np.empty(xs[0].shape, F32)
    for i in np.ndindex(out.shape):
        out[i] = fn(*(F32(x[i]) for x in xs))
    return out


def spec(name):
    """A chapter-2 primitive as refreplay computes it (used, not mutated, by ops)."""
    from refreplay.numerics import elementwise as E

    return lambda x: E.__dict__[name](np.ascontiguousarray(x, dtype=F32))


exp_, log_, tanh_, sigmoid_ = (spec(n) for n in ("exp", "log", "tanh", "sigmoid"))


# ---- chapter 1 and 3: primitives and sums --------------------------------------------------


def k_mul(a, b, flush=True, before_rounding=False):
    a, b = load(a), load(b)
    out = mul(a, b, flush=flush)
    if before_rounding:  # ARM FZ: tininess judged on the exact product
        exact = np.abs(a.astype(np.float64) * b.astype(np.float64))
        out = np.where((exact < 2.0**-126) & (exact > 0), from_bits(bits(out) & 0x80000000), out)
    return out


def k_add(a, b, zero_inputs=True, canon=True):
    a, b = load(a, zero_inputs), load(b, zero_inputs)
    if not canon:
        a, b = np.asarray(a), np.asarray(b)
        with np.errstate(all="ignore"):
            return finish(np.add(a, b), canon=False)
    return add(a, b)


def k_fmax(a, b, **kw):
    return fmax(load(a), load(b), **kw)


def k_sum(X, start=F32(-0.0), empty=F32(0.0), order=seq_rows):
    X = load(X)
    return seq_rows(X, start, empty) if order is seq_rows else order(X)


def k_max(X, empty=F32(-np.inf)):
    X = load(X)
    if X.shape[1] == 0:
        return np.full(X.shape[0], empty, F32)
    m = np.full(X.shape[0], F32(-np.inf))
    for n in range(X.shape[1]):
        m = fmax(m, X[:, n])
    return m


def k_matmul(A, B, fused=False, split_above=None, start=F32(-0.0), fused_tail=None):
    """[mm.nn.c1] C[i, j] = sum over k increasing of A[i, k]*B[k, j], from -0;
    ``split_above``: a split-K kernel (two halves) for K above that;
    ``fused_tail``: blocks of that many terms unfused, the K mod blocks
    remainder through a fused multiply-add (K >= 64 only)."""
    A, B = load(A), load(B)
    I, K = A.shape
    J = B.shape[1]
    if K == 0:
        return np.zeros((I, J), F32)
    P = mul(A[:, :, None], B[None, :, :])  # I x K x J products, each rounded
    if split_above is not None and K > split_above:
        return split_rows(np.moveaxis(P, 1, 2))
    if fused or (fused_tail and K >= 64):
        first_fused = 0 if fused else K - K % fused_tail
        acc = np.full((I, J), start, F32)
        for k in range(K):
            acc = fma(A[:, k, None], B[None, k, :], acc) if k >= first_fused else add(acc, P[:, k, :])
        return acc
    return seq_rows(np.moveaxis(P, 1, 2), start)


def k_rint(x, half_away=False):
    def one(v):
        if not half_away:
            return nn.rint(v)
        if v != v:
            return CANON
        r = F32(np.floor(abs(v) + F32(0.5))) if abs(v) < F32(2**23) else abs(v)
        return nn.neg(r) if nn.bits(v) & 0x80000000 else r

    return elementwise(one, load(x))


def exp_variant(ge_overflow=False, inv_ln2=nn.INV_LN2, le_underflow=False):
    def one(x):
        if x != x:
            return CANON
        if x > nn.EXP_MAX or (ge_overflow and x == nn.EXP_MAX):
            return nn.INF
        if x < nn.EXP_MIN or (le_underflow and x == nn.EXP_MIN):
            return F32(0.0)
        k = nn.rint(nn.mul(x, inv_ln2))
        hi = nn.sub(x, nn.mul(k, nn.LN2_HI))
        lo = nn.mul(k, nn.LN2_LO)
        r = nn.sub(hi, lo)
        p = nn.add(nn.ONE, nn.add(hi, nn.sub(nn.mul(nn.mul(r, r), nn.horner(nn.EXP_C, r)), lo)))
        k1 = int(k) // 2
        return nn.mul(nn.mul(p, nn.pow2(k1)), nn.pow2(int(k) - k1))

    return lambda x: elementwise(nn.quiet(one), load(x))


def log_variant(ge_sqrt2=False, sqrt2=nn.SQRT2):
    def one(x):
        if x != x:
            return CANON
        if abs(x) < nn.MIN_NORMAL:
            return nn.neg(nn.INF)
        if x < 0:
            return CANON
        if x == nn.INF:
            return nn.INF
        b = nn.bits(x)
        e = (b >> 23) - 127
        m = nn.f32((b & 0x007FFFFF) | 0x3F800000)
        if m > sqrt2 or (ge_sqrt2 and m == sqrt2):
            m, e = nn.mul(m, nn.HALF), e + 1
        f = nn.sub(m, nn.ONE)
        s = nn.mul(f, nn.recip(nn.add(nn.TWO, f)))
        z = nn.mul(s, s)
        hfsq = nn.mul(nn.mul(nn.HALF, f), f)
        t = nn.mul(s, nn.add(hfsq, nn.mul(z, nn.horner(nn.LOG_L, z))))
        if e == 0:
            return nn.sub(f, nn.sub(hfsq, t))
        d = F32(e)
        return nn.sub(nn.mul(d, nn.LN2_HI), nn.sub(nn.sub(hfsq, nn.add(t, nn.mul(d, nn.LN2_LO))), f))

    return lambda x: elementwise(nn.quiet(one), load(x))


def tanh_variant(le_branch=False, sign_by_compare=False, small=nn.TANH_SMALL):
    def one(x):
        if x != x:
            return CANON
        a = nn.f32(nn.bits(x) & 0x7FFFFFFF)
        if a < small or (le_branch and a == small):
            z = nn.mul(a, a)
            y = nn.add(a, nn.mul(a, nn.mul(z, nn.horner(nn.TANH_T, z))))
        else:
            y = nn.sub(nn.ONE, nn.mul(nn.TWO, nn.recip(nn.add(nn.exp(nn.add(a, a)), nn.ONE))))
        negative = x < 0 if sign_by_compare else nn.bits(x) & 0x80000000
        return nn.neg(y) if negative else y

    return lambda x: elementwise(nn.quiet(one), load(x))


def sigmoid_variant(one_branch=False, branch_at_positive=False):
    def one(x):
        if x != x:
            return CANON
        if one_branch or x > 0 or (not branch_at_positive and x >= 0):
            return nn.recip(nn.add(nn.ONE, nn.exp(nn.neg(x))))
        t = nn.exp(x)
        return nn.sub(t, nn.mul(t, nn.mul(t, nn.recip(nn.add(nn.ONE, t)))))

    return lambda x: elementwise(nn.quiet(one), load(x))


def sin_variant(closed_domain=False):
    def one(x):
        if x != x or abs(x) > nn.TRIG_MAX or (closed_domain and abs(x) == nn.TRIG_MAX):
            return CANON
        return nn.sin(x)

    return lambda x: elementwise(nn.quiet(one), load(x))


def cos_variant(k_sign_magnitude=False):
    def one(x):
        if x != x or abs(x) > nn.TRIG_MAX:
            return CANON
        sr, cr, n = nn._reduced(x)
        if k_sign_magnitude:
            n = abs(int(nn.rint(nn.mul(x, nn.TWO_OVER_PI)))) & 3
        return (cr, nn.neg(sr), nn.neg(cr), sr)[n]

    return lambda x: elementwise(nn.quiet(one), load(x))


def k_recip_f64(x):
    """1/x in float64, then rounded to binary32 and flushed."""
    with np.errstate(all="ignore"):
        return finish((1.0 / load(x).astype(np.float64)).astype(F32))


def k_sqrt_f64(x):
    with np.errstate(all="ignore"):
        return finish(np.sqrt(load(x).astype(np.float64)).astype(F32))


# ---- chapters 10-13: linear, norms, activations, softmax, attention ----------------------------


def k_linear_forward(x, W, b, bias_first=False, empty=F32(0.0)):
    x, W, b = load(x), load(W), load(b)
    N, C = x.shape
    P = mul(x[:, None, :], W[None, :, :])  # N x OC x C
    if bias_first:
        return seq_rows(np.concatenate([np.broadcast_to(b, (N, W.shape[0]))[..., None], P], -1))
    return add(seq_rows(P, empty=empty), b)


def _mean(total, count, divide=False):
    with np.errstate(all="ignore"):
        return finish(np.divide(total, F32(count))) if divide else mul(total, recip(F32(count)))


EPS = nn.f32(0x3727C5AC)


def k_layernorm_forward(x, w, b, eps_outside=False, unbiased=False, divide=False):
    x, w, b = load(x), load(w), load(b)
    C = x.shape[1]
    mean = _mean(seq_rows(x), C, divide)
    d = sub(x, mean[:, None])
    q = seq_rows(mul(d, d))
    var = _mean(q, C - 1 if unbiased and C > 1 else C, divide)
    rstd = add(recip(sqrt(var)), EPS) if eps_outside else recip(sqrt(add(var, EPS)))
    return add(mul(mul(d, rstd[:, None]), w), b), mean, rstd


def k_rmsnorm_forward(x, w, eps_outside=False, weight_first=False):
    x, w = load(x), load(w)
    ms = _mean(seq_rows(mul(x, x)), x.shape[1])
    rrms = add(recip(sqrt(ms)), EPS) if eps_outside else recip(sqrt(add(ms, EPS)))
    out = mul(x, mul(rrms[:, None], w)) if weight_first else mul(mul(x, rrms[:, None]), w)
    return out, rrms


GELU_S, GELU_K, GELU_K3 = nn.f32(0x3F4C422A), nn.f32(0x3D372713), nn.f32(0x3E095D4F)
HALF, ONE = F32(0.5), F32(1.0)


def _gelu_th(x, cube_last=False):
    cube = mul(GELU_K, mul(mul(x, x), x)) if cube_last else mul(mul(mul(GELU_K, x), x), x)
    return tanh_(mul(GELU_S, add(x, cube)))


def k_gelu_forward(x, cube_last=False, half_last=False):
    x = load(x)
    th = _gelu_th(x, cube_last)
    return mul(HALF, mul(x, add(ONE, th))) if half_last else mul(mul(HALF, x), add(ONE, th))


def k_gelu_backward(dout, x, k3=GELU_K3):
    dout, x = load(dout), load(x)
    th = _gelu_th(x)
    sech2 = sub(ONE, mul(th, th))
    dinner = mul(GELU_S, add(ONE, mul(mul(k3, x), x)))
    local = add(mul(HALF, add(ONE, th)), mul(mul(mul(HALF, x), sech2), dinner))
    return mul(dout, local)


def k_silu_forward(x, division=False):
    x = load(x)
    if division:
        with np.errstate(all="ignore"):
            return finish(np.divide(x, add(ONE, exp_(np.negative(x)))))
    return mul(x, sigmoid_(x))


def k_swiglu_backward(dout, a, b, s_first=False):
    dout, a, b = load(dout), load(a), load(b)
    s = sigmoid_(a)
    silu = mul(a, s)
    dsilu = mul(s, add(ONE, mul(a, sub(ONE, s))))
    da = mul(mul(mul(dout, b), s), add(ONE, mul(a, sub(ONE, s)))) if s_first else mul(mul(dout, b), dsilu)
    return da, mul(dout, silu)


def _softmax_rows(x, shift=True, divide=False, masked_zero=False, blocked_above=None, max_from=None):
    m = seq_max(x, max_from) if shift else np.zeros(x.shape[0], F32)
    V = x.shape[1]
    if blocked_above is not None and V > blocked_above:
        return _online_two_blocks(x)
    e = exp_(sub(x, m[:, None]))
    s = seq_rows(e)
    if divide:
        with np.errstate(all="ignore"):
            y = finish(np.divide(e, s[:, None]))
    else:
        y = mul(e, recip(s)[:, None])
    if masked_zero:
        y = np.where((m == -np.inf)[:, None], F32(0), y).astype(F32)
    return y


def seq_max(x, start=None):
    """The row maximum from -inf; ``start``: a running maximum started at a
    finite sentinel instead (a C library's -10,000)."""
    m = np.full(x.shape[0], F32(-np.inf) if start is None else F32(start))
    for j in range(x.shape[1]):
        m = fmax(m, x[:, j])
    return m


def _online_two_blocks(x):
    """The online softmax of two blocks (flash style): each block's max and
    sum, then s = s1 * exp(m1 - m) + s2 * exp(m2 - m)."""
    h = (x.shape[1] + 1) // 2
    parts = [(seq_max(x[:, a:b]), x[:, a:b]) for a, b in ((0, h), (h, x.shape[1]))]
    m = fmax(parts[0][0], parts[1][0])
    s = np.zeros(x.shape[0], F32)
    for mb, xb in parts:
        s = add(s, mul(seq_rows(exp_(sub(xb, mb[:, None]))), exp_(sub(mb, m))))
    return mul(exp_(sub(x, m[:, None])), recip(s)[:, None])


def k_softmax_forward(x, **kw):
    return _softmax_rows(load(x), **kw)


def k_log_softmax_forward(x, lse_first=False):
    x = load(x)
    m = seq_max(x)
    s = seq_rows(exp_(sub(x, m[:, None])))
    if lse_first:
        return sub(x, add(m, log_(s))[:, None])
    return sub(sub(x, m[:, None]), log_(s)[:, None])


def _ce_losses(lg, targets, negated=False, count_ignored=False, max_from=None):
    m = seq_max(lg, max_from)
    s = seq_rows(exp_(sub(lg, m[:, None])))
    n = np.arange(lg.shape[0])
    y = np.where(targets < 0, lg.shape[1] - 1 if count_ignored else 0, targets)
    x_y = lg[n, y]
    loss = np.negative(sub(sub(x_y, m), log_(s))) if negated else sub(log_(s), sub(x_y, m))
    counted = (targets >= 0) | count_ignored
    return np.where(counted, loss, F32(0)).astype(F32), counted


def k_cross_entropy_forward(
    logits, targets, negated=False, count_ignored=False, empty_nan=False, mean_over_n=False, max_from=None
):
    lg = load(logits)
    losses, counted = _ce_losses(lg, targets, negated, count_ignored, max_from)
    count = lg.shape[0] if mean_over_n else int(counted.sum())
    if count == 0 and not empty_nan:
        return losses, np.zeros(1, F32)
    total = seq_rows(losses[counted][None, :])[0]
    return losses, np.array([mul(total, recip(F32(count)))], F32).reshape(1)


def k_cross_entropy_backward(logits, targets, keep_ignored=False):
    lg = load(logits)
    g = _softmax_rows(lg)
    n = np.flatnonzero(targets >= 0)
    g[n, targets[n]] = sub(g[n, targets[n]], ONE)
    d = mul(g, recip(F32(max(n.size, 1))))
    if not keep_ignored:
        d[targets < 0] = F32(0)
    return d


def k_attention_forward(q, k, v, scale_q=False, mask_bias=False, mask_fill=None):
    """[attn.scores.c1]..[attn.out.c1] per (b, h), row t over s <= t only."""
    q, k, v = load(q), load(k), load(v)
    B, NH, T, HS = q.shape
    scale = recip(sqrt(F32(HS)))
    out = np.empty_like(q)
    att = np.zeros((B, NH, T, T), F32)
    for b in range(B):
        for h in range(NH):
            qq = mul(q[b, h], scale) if scale_q else q[b, h]
            z = seq_rows(mul(qq[:, None, :], k[b, h][None, :, :]))  # T x T dots over HS
            if not scale_q:
                z = mul(z, scale)
            for t in range(T):
                if mask_fill is not None:  # the whole row, s > t replaced by a finite fill
                    row = np.where(np.arange(T) > t, F32(mask_fill), z[t]).astype(F32)
                    p = _softmax_rows(row[None, :])[0]
                    p[t + 1 :] = F32(0)
                elif mask_bias:  # the whole row with -inf added at s > t
                    row = add(z[t], np.where(np.arange(T) > t, F32(-np.inf), F32(0)))
                    p = _softmax_rows(row[None, :])[0]
                    p[t + 1 :] = F32(0)
                else:
                    p = np.concatenate([_softmax_rows(z[t, : t + 1][None, :])[0], np.zeros(T - t - 1, F32)])
                att[b, h, t] = p
                out[b, h, t] = seq_rows(mul(p[: t + 1, None], v[b, h, : t + 1]).T)
    return out, att


# ---- chapters 10, 14-16: embedding, loss, quantization, optimizer ------------------------------


def k_embedding_forward(wte, tokens, raw=False):
    return (np.asarray(wte) if raw else load(wte))[tokens]


def k_embedding_backward(dout, tokens, V, absent_plus_zero=True):
    t = tokens.reshape(-1)
    dout = load(dout).reshape(t.size, dout.shape[-1])  # C = 0 too (reshape(-1, 0) cannot infer)
    dw = np.full((int(V[0]), dout.shape[1]), F32(-0.0))
    for i in range(t.size):
        dw[t[i]] = add(dw[t[i]], dout[i])
    if absent_plus_zero:
        dw[np.setdiff1d(np.arange(int(V[0])), t)] = F32(0.0)
    return dw


RQ = nn.f32(0x3C010204)


def k_step(x, floor=True, floor_only_zero=False, divide=False):
    x = load(x).reshape(-1)
    a = F32(0.0)
    for g in x:
        a = fmax(a, F32(abs(g)))
    with np.errstate(all="ignore"):
        s = finish(np.divide(a, F32(127))) if divide else mul(a, RQ)
    s = F32(s)
    if floor and (s == 0 if not floor_only_zero else a == 0):
        s = FLT_MIN
    return np.array([s], F32)


def _codes(x, s, half_away=False, lo=-128, divide=False):
    with np.errstate(all="ignore"):
        y = finish(np.divide(x, s)) if divide else mul(x, recip(s))
    if half_away:
        v = np.where(np.isnan(y), np.nan, np.sign(y) * np.floor(np.abs(y) + 0.5))
    else:
        v = np.where(np.isnan(y), np.nan, np.rint(y))
    return np.where(np.isnan(v), 0, np.clip(np.nan_to_num(v, posinf=1e9, neginf=-1e9), lo, 127)), v


def k_fake_quantize(x, s, half_away=False, lo=-128, divide=False, float_code=False):
    """The code is an int8 ([num.sat.c1]): it has no -0 (``float_code`` keeps rint's -0)."""
    x, s = load(x), load(s)[0]
    q, _ = _codes(x, s, half_away, lo, divide)
    return mul(q.astype(F32) if float_code else q.astype(np.int32).astype(F32), s)


def k_fake_quantize_backward(dy, x, s, lo=-128, times_one=False, divide=False):
    dy, x, s = load(dy), load(x), load(s)[0]
    _, v = _codes(x, s, divide=divide)
    return np.where((v >= lo) & (v <= 127), mul(dy, ONE) if times_one else dy, F32(0)).astype(F32)


BETA1, BETA2, ADAM_EPS, WD = nn.f32(0x3F666666), nn.f32(0x3F733333), nn.f32(0x322BCC77), nn.f32(0x3DCCCCCD)


def k_adamw(p, g, m, v, step, lr, powers=0, eps_inside=False, coupled=False):
    p, g, m, v, lr = load(p), load(g), load(m), load(v), load(lr)[0]
    t = int(step[0])
    pow1, pow2 = BETA1, BETA2
    for _ in range(t - 1 + powers):
        if pow1 == 0 and pow2 == 0:  # flushed powers stay +0 ([optim.adamw.bias.c1]): the rest changes nothing
            break
        pow1, pow2 = F32(mul(pow1, BETA1)), F32(mul(pow2, BETA2))
    rbc1, rbc2 = recip(sub(ONE, pow1)), recip(sub(ONE, pow2))
    if coupled:
        g = add(g, mul(WD, p))
    m2 = add(mul(BETA1, m), mul(sub(ONE, BETA1), g))
    v2 = add(mul(BETA2, v), mul(mul(sub(ONE, BETA2), g), g))
    mh, vh = mul(m2, rbc1), mul(v2, rbc2)
    den = sqrt(add(vh, ADAM_EPS)) if eps_inside else add(sqrt(vh), ADAM_EPS)
    upd = mul(mh, recip(den))
    wd = F32(0) if coupled else WD
    return sub(p, mul(lr, add(upd, mul(wd, p)))), m2, v2


# ---- chapter 5: Philox and the draws built on it ----------------------------------------------

M0, M1, W0, W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85
MASK = 0xFFFFFFFF


def philox(c, k, rounds=10, bump_first=False):
    c0, c1, c2, c3 = (int(w) for w in c)
    k0, k1 = (int(w) for w in k)
    for r in range(rounds):
        if r or bump_first:
            k0, k1 = (k0 + W0) & MASK, (k1 + W1) & MASK
        p0, p1 = M0 * c0, M1 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & MASK, (p0 >> 32) ^ c3 ^ k1, p0 & MASK
    return [c0, c1, c2, c3]


def k_philox(counter, key, **kw):
    return np.array([philox(c, k, **kw) for c, k in zip(counter, key)], np.uint32).reshape(-1, 4)


def word(key, ids, q, swap_ids=False):
    stream, sub_ = int(ids[0]), int(ids[1])
    if swap_ids:
        stream, sub_ = sub_, stream
    b = q // 4
    return philox([b & MASK, b >> 32, sub_, stream], key)[q % 4]


def k_words(key, ids, start, count, swap_ids=False):
    return np.array([word(key, ids, int(start[0]) + i, swap_ids) for i in range(int(count[0]))], np.uint32)


def k_unit(w, scale_32=False):
    w = np.asarray(w, np.uint32)
    if scale_32:  # f32(w) * 2^-32: the conversion rounds
        return mul(w.astype(F32), F32(2.0**-32))
    return mul((w >> 8).astype(F32), F32(2.0**-24))


def k_symmetric_via_unit(w, a):
    return mul(sub(mul(F32(2), k_unit(w)), ONE), load(a)[0])


def k_symmetric(w, a, shift9=False):
    s = (np.asarray(w, np.uint32) >> (9 if shift9 else 8)).astype(np.int64) - ((1 << 22) if shift9 else (1 << 23))
    return mul(mul(s.astype(F32), F32(2.0 ** (-22 if shift9 else -23))), load(a)[0])


def draws(key, ids, q, bounds, modulo=False, n1_free=False):
    vals = []
    for n in (int(b) for b in bounds):
        if n1_free and n == 1:
            vals.append(0)
            continue
        t = ((1 << 32) - n) % n
        while True:
            w = word(key, ids, q)
            q += 1
            if modulo:
                vals.append(w % n)
                break
            mm = w * n
            if mm & MASK >= t:
                vals.append(mm >> 32)
                break
    return vals, q


def k_bounded(key, ids, start, bounds, **kw):
    vals, q = draws(key, ids, int(start[0]), bounds, **kw)
    return np.array(vals, np.int64), np.array([q], np.int64)


def k_permutation(key, ids, start, n, ascending=False):
    N = int(n[0])
    p = list(range(N))
    q = int(start[0])
    for i in range(N - 1) if ascending else range(N - 1, 0, -1):
        if ascending:  # draws in [i, N)
            (j,), q = draws(key, ids, q, [N - i])
            j += i
        else:
            (j,), q = draws(key, ids, q, [i + 1])
        p[i], p[j] = p[j], p[i]
    return np.array(p, np.int64)


# ---- the tables ------------------------------------------------------------------------------

P = functools.partial

CORRECT = {
    "mul": k_mul,
    "add": k_add,
    "fmax": k_fmax,
    "sum": k_sum,
    "max": k_max,
    "matmul": k_matmul,
    "rint": k_rint,
    "exp": exp_variant(),
    "log": log_variant(),
    "tanh": tanh_variant(),
    "sigmoid": sigmoid_variant(),
    "sin": sin_variant(),
    "cos": cos_variant(),
    "linear_forward": k_linear_forward,
    "layernorm_forward": k_layernorm_forward,
    "rmsnorm_forward": k_rmsnorm_forward,
    "gelu_forward": k_gelu_forward,
    "gelu_backward": k_gelu_backward,
    "silu_forward": k_silu_forward,
    "swiglu_backward": k_swiglu_backward,
    "softmax_forward": k_softmax_forward,
    "log_softmax_forward": k_log_softmax_forward,
    "cross_entropy_forward": k_cross_entropy_forward,
    "cross_entropy_backward": k_cross_entropy_backward,
    "attention_forward": k_attention_forward,
    "embedding_forward": k_embedding_forward,
    "embedding_backward": k_embedding_backward,
    "quant_step_size": k_step,
    "fake_quantize": k_fake_quantize,
    "fake_quantize_backward": k_fake_quantize_backward,
    "adamw_update": k_adamw,
    "rng_philox": k_philox,
    "rng_words": k_words,
    "rng_unit": k_unit,
    "rng_symmetric": k_symmetric,
    "rng_bounded": k_bounded,
    "rng_permutation": k_permutation,
}

# name: (op, kernel, clause misread, what it does)
MUTANTS = {
    "mul, no flush": ("mul", P(k_mul, flush=False), "num.flush.c1", "keeps subnormal products"),
    "mul, flush before rounding": (
        "mul",
        P(k_mul, before_rounding=True),
        "num.flush.c1",
        "flushes when the exact product is below 2^-126 (ARM FZ)",
    ),
    "add, no input zeroing": ("add", P(k_add, zero_inputs=False), "num.load.c1", "keeps subnormal inputs"),
    "add, NaN payload kept": ("add", P(k_add, canon=False), "num.nan.c1", "lets NumPy's NaN out"),
    "fmax(-0, +0) is the first": ("fmax", P(k_fmax, zero_rule=False), "num.minmax.c1", "a > b ? a : b only"),
    "fmax ignores NaN": ("fmax", P(k_fmax, nan_rule=False), "num.minmax.c1", "IEEE maxNum: NaN loses"),
    "sum from +0": ("sum", P(k_sum, start=F32(0.0)), "red.sum.c1", "starts every sum from +0"),
    "empty sum is -0": ("sum", P(k_sum, empty=F32(-0.0)), "red.sum.c1", "returns the -0 start for N = 0"),
    "sum pairwise": ("sum", P(k_sum, order=pairwise_rows), "red.sum.c1", "recursive halves"),
    "sum split above 8192": (
        "sum",
        P(k_sum, order=lambda X: seq_rows(X) if X.shape[1] <= 8192 else split_rows(X)),
        "red.sum.c1",
        "sequential up to 8192 terms, two halves above",
    ),
    "empty max is +0": ("max", P(k_max, empty=F32(0.0)), "red.rowmax.c1", "an empty row gives +0"),
    "matmul fused": ("matmul", P(k_matmul, fused=True), "num.nofma.c1", "acc = fma(a, b, acc)"),
    "matmul fused in the K mod 8 tail": (
        "matmul",
        P(k_matmul, fused_tail=8),
        "num.nofma.c1",
        "8-wide blocks unfused, the scalar tail fused, for K >= 64",
    ),
    "matmul split-K above 4096": (
        "matmul",
        P(k_matmul, split_above=4096),
        "mm.nn.c1",
        "exact up to K = 4096, split-K in two above",
    ),
    "rint half away": ("rint", P(k_rint, half_away=True), "num.rint.c1", "round half away from zero"),
    "exp overflows at >=": ("exp", exp_variant(ge_overflow=True), "num.exp.c1", "x >= 0x42B17217 gives +inf"),
    "exp INV_LN2 one ulp up": ("exp", exp_variant(inv_ln2=nn.f32(0x3FB8AA3C)), "num.exp.c1", "INV_LN2 = 0x3FB8AA3C"),
    "log halves at m >= SQRT2": ("log", log_variant(ge_sqrt2=True), "num.log.c1", "m >= SQRT2 instead of >"),
    "tanh branch at 0.74999": (
        "tanh",
        tanh_variant(small=nn.f32(0x3F3FFF58)),
        "num.tanh.c1",
        "the threshold written 0.74999 (0x3F3FFF58, 168 ulps low)",
    ),
    "log halves at m > 1.4142": (
        "log",
        log_variant(sqrt2=nn.f32(0x3FB50481)),
        "num.log.c1",
        "SQRT2 written 1.4142 (0x3FB50481, 114 ulps low)",
    ),
    "tanh sign by x < 0": ("tanh", tanh_variant(sign_by_compare=True), "num.tanh.c1", "tanh(-0) = +0"),
    "sigmoid one branch": (
        "sigmoid",
        sigmoid_variant(one_branch=True),
        "num.sigmoid.c1",
        "recip(1 + exp(-x)) for every x",
    ),
    "sin domain closed": ("sin", sin_variant(closed_domain=True), "num.sincos.c1", "NaN at |x| = 2^14"),
    "cos quadrant of |k|": ("cos", cos_variant(k_sign_magnitude=True), "num.sincos.c1", "n = |k| mod 4"),
    "linear bias first": (
        "linear_forward",
        P(k_linear_forward, bias_first=True),
        "mm.bias.c1",
        "the bias is the sum's starting value",
    ),
    "linear empty sum -0": ("linear_forward", P(k_linear_forward, empty=F32(-0.0)), "red.sum.c1", "C = 0 gives -0 + b"),
    "layernorm eps outside sqrt": (
        "layernorm_forward",
        P(k_layernorm_forward, eps_outside=True),
        "norm.layer.fwd.c1",
        "recip(sqrt(var)) + eps",
    ),
    "layernorm unbiased variance": (
        "layernorm_forward",
        P(k_layernorm_forward, unbiased=True),
        "norm.layer.fwd.c1",
        "divides by C - 1",
    ),
    "layernorm mean by division": (
        "layernorm_forward",
        P(k_layernorm_forward, divide=True),
        "norm.meanop.c1",
        "sum / C",
    ),
    "rmsnorm eps outside sqrt": (
        "rmsnorm_forward",
        P(k_rmsnorm_forward, eps_outside=True),
        "norm.rms.fwd.c1",
        "recip(sqrt(ms)) + eps",
    ),
    "rmsnorm x*(rrms*w)": (
        "rmsnorm_forward",
        P(k_rmsnorm_forward, weight_first=True),
        "norm.rms.fwd.c1",
        "x * (rrms * w)",
    ),
    "gelu cube as K*(x*x*x)": ("gelu_forward", P(k_gelu_forward, cube_last=True), "act.gelu.fwd.c1", "K*(x^3)"),
    "gelu 0.5*(x*(1+th))": ("gelu_forward", P(k_gelu_forward, half_last=True), "act.gelu.fwd.c1", "halves last"),
    "gelu K3 = 3*K": (
        "gelu_backward",
        P(k_gelu_backward, k3=F32(mul(F32(3), GELU_K))),
        "act.gelu.bwd.c1",
        "K3 = 0x3E095D4E",
    ),
    "silu by division": ("silu_forward", P(k_silu_forward, division=True), "act.silu.fwd.c1", "x / (1 + exp(-x))"),
    "swiglu gradient times s first": (
        "swiglu_backward",
        P(k_swiglu_backward, s_first=True),
        "act.swiglu.bwd.c1",
        "((dout*b)*s)*(1 + a(1 - s))",
    ),
    "softmax no max shift": ("softmax_forward", P(k_softmax_forward, shift=False), "softmax.fwd.c1", "exp(x)"),
    "softmax max from -10000": (
        "softmax_forward",
        P(k_softmax_forward, max_from=-10000.0),
        "softmax.fwd.c1",
        "running maximum started at -10,000 (a C library's)",
    ),
    "softmax divides": ("softmax_forward", P(k_softmax_forward, divide=True), "softmax.fwd.c1", "e / s"),
    "softmax masked rows zero": (
        "softmax_forward",
        P(k_softmax_forward, masked_zero=True),
        "softmax.fwd.c1",
        "an all -inf row gives 0, not NaN",
    ),
    "softmax online above V=4096": (
        "softmax_forward",
        P(k_softmax_forward, blocked_above=4096),
        "softmax.fwd.c1",
        "two-block online softmax above V = 4096",
    ),
    "log-softmax x - (m + log s)": (
        "log_softmax_forward",
        P(k_log_softmax_forward, lse_first=True),
        "softmax.log.c1",
        "log-sum-exp first",
    ),
    "loss negated log-softmax": (
        "cross_entropy_forward",
        P(k_cross_entropy_forward, negated=True),
        "loss.token.c1",
        "-((x - m) - log s): an exact zero is -0",
    ),
    "ignore index not ignored": (
        "cross_entropy_forward",
        P(k_cross_entropy_forward, count_ignored=True),
        "loss.mean.c1",
        "target -1 counted (as the last class)",
    ),
    "loss max from -10000": (
        "cross_entropy_forward",
        P(k_cross_entropy_forward, max_from=-10000.0),
        "loss.token.c1",
        "running maximum started at -10,000",
    ),
    "loss mean over N": (
        "cross_entropy_forward",
        P(k_cross_entropy_forward, mean_over_n=True),
        "loss.mean.c1",
        "divides by every token, ignored included",
    ),
    "empty loss mean NaN": (
        "cross_entropy_forward",
        P(k_cross_entropy_forward, empty_nan=True),
        "loss.mean.c1",
        "count 0 gives 0 * recip(0)",
    ),
    "loss gradient on ignored rows": (
        "cross_entropy_backward",
        P(k_cross_entropy_backward, keep_ignored=True),
        "loss.bwd.c1",
        "ignored rows keep softmax * c",
    ),
    "attention q scaled first": (
        "attention_forward",
        P(k_attention_forward, scale_q=True),
        "attn.scores.c1",
        "dot(q * scale, k)",
    ),
    "attention mask as -inf bias": (
        "attention_forward",
        P(k_attention_forward, mask_bias=True),
        "attn.mask.c1",
        "z + (-inf) at s > t over the whole row",
    ),
    "attention mask filled with -1e9": (
        "attention_forward",
        P(k_attention_forward, mask_fill=-1e9),
        "attn.mask.c1",
        "z[s] = -1e9 at s > t over the whole row",
    ),
    "embedding raw copy": (
        "embedding_forward",
        P(k_embedding_forward, raw=True),
        "num.load.c1",
        "copies NaN payloads and subnormals",
    ),
    "embedding absent ids -0": (
        "embedding_backward",
        P(k_embedding_backward, absent_plus_zero=False),
        "emb.bwd.c1",
        "absent ids keep the -0 start",
    ),
    "step without floor": ("quant_step_size", P(k_step, floor=False), "quant.step.c1", "s = a * RQ"),
    "step floor only for zero input": (
        "quant_step_size",
        P(k_step, floor_only_zero=True),
        "quant.step.c1",
        "floors a = 0 but not a flushed a * RQ",
    ),
    "step a / 127": ("quant_step_size", P(k_step, divide=True), "quant.step.c1", "divides by 127"),
    "quantize half away": (
        "fake_quantize",
        P(k_fake_quantize, half_away=True),
        "quant.quantize.c1",
        "round half away from zero",
    ),
    "quantize clamp at -127": (
        "fake_quantize",
        P(k_fake_quantize, lo=-127),
        "quant.quantize.c1",
        "symmetric clamp [-127, 127]",
    ),
    "quantize code kept as a float": (
        "fake_quantize",
        P(k_fake_quantize, float_code=True),
        "quant.quantize.c1",
        "rint's -0 survives: -0.4 comes back as -0, not +0",
    ),
    "quantize x / s": ("fake_quantize", P(k_fake_quantize, divide=True), "quant.quantize.c1", "x / s"),
    "STE range [-127, 127]": (
        "fake_quantize_backward",
        P(k_fake_quantize_backward, lo=-127),
        "quant.ste.c1",
        "blocks code -128",
    ),
    "STE mask from x / s": (
        "fake_quantize_backward",
        P(k_fake_quantize_backward, divide=True),
        "quant.ste.c1",
        "x / s instead of x * recip(s): a code at 127.5 or -128.5 moves across the bound",
    ),
    "AdamW bias powers t + 1": ("adamw_update", P(k_adamw, powers=1), "optim.adamw.bias.c1", "beta^(t+1)"),
    "AdamW bias powers t - 1": ("adamw_update", P(k_adamw, powers=-1), "optim.adamw.bias.c1", "beta^(t-1)"),
    "AdamW eps inside sqrt": ("adamw_update", P(k_adamw, eps_inside=True), "optim.adamw.c1", "sqrt(v_hat + eps)"),
    "AdamW coupled decay": ("adamw_update", P(k_adamw, coupled=True), "optim.adamw.c1", "L2: wd*p in the gradient"),
    "Philox 7 rounds": ("rng_philox", P(k_philox, rounds=7), "rng.philox.c1", "Philox4x32-7"),
    "Philox key bumped first": (
        "rng_philox",
        P(k_philox, bump_first=True),
        "rng.philox.c1",
        "the key is bumped before round 1",
    ),
    "stream and sub swapped": ("rng_words", P(k_words, swap_ids=True), "rng.counter.c1", "counter = (.., stream, sub)"),
    "unit as f32(w) * 2^-32": ("rng_unit", P(k_unit, scale_32=True), "rng.unit.c1", "all 32 bits, rounded"),
    "symmetric from 23 bits": (
        "rng_symmetric",
        P(k_symmetric, shift9=True),
        "rng.symmetric.c1",
        "(w >> 9) - 2^22, times 2^-22",
    ),
    "bounded by modulo": ("rng_bounded", P(k_bounded, modulo=True), "rng.bounded.c1", "w mod n, no rejection"),
    "bounded n = 1 is free": ("rng_bounded", P(k_bounded, n1_free=True), "rng.bounded.c1", "n = 1 consumes no word"),
    "permutation ascending": (
        "rng_permutation",
        P(k_permutation, ascending=True),
        "rng.permutation.c1",
        "for i = 0 .. N-2, j in [i, N)",
    ),
}

# Readings that differ in the text but not in the bits: (op, kernel, the argument).
EQUIVALENT = {
    "exp underflows at x <= -88": (
        "exp",
        exp_variant(le_underflow=True),
        "[num.exp.c1] e^-88 < 2^-126, so the algorithm's result at x = -88 is "
        "subnormal and flushes to +0: both branches give +0",
    ),
    "tanh polynomial at a <= 0.75": (
        "tanh",
        tanh_variant(le_branch=True),
        "[num.tanh.c1] the branches differ only at a = 0.75 exactly, where the "
        "polynomial and 1 - 2 recip(exp(1.5) + 1) both give f32(0x3F22991F)",
    ),
    "tanh branch one ulp low": (
        "tanh",
        tanh_variant(small=nn.f32(0x3F3FFFFF)),
        "[num.tanh.c1] a < 0x3F3FFFFF moves one input, a = 0x3F3FFFFF, to the exp form, "
        "which gives the polynomial's bits there",
    ),
    "sigmoid branch at x > 0": (
        "sigmoid",
        sigmoid_variant(branch_at_positive=True),
        "[num.sigmoid.c1] the branches differ only at x = +-0, where recip(1 + exp(-0)) "
        "and 1 - 1*(1*recip(2)) are both exactly 0.5",
    ),
    "recip via float64": (
        "recip",
        k_recip_f64,
        "[num.recip.c1] 1/x rounded to binary64 then to binary32 is correctly rounded: double "
        "rounding of a quotient is innocuous when 53 >= 2*24 + 2 (Figueroa 1995)",
    ),
    "sqrt via float64": ("sqrt", k_sqrt_f64, "[num.sqrt.c1] the same double-rounding argument for square roots"),
    "symmetric as (2 unit(w) - 1) a": (
        "rng_symmetric",
        k_symmetric_via_unit,
        "[rng.symmetric.c1] 2 unit(w) = (w >> 8) 2^-23 and the subtraction of 1 "
        "are exact (24-bit integers times 2^-23), so only the product by a rounds",
    ),
    "STE passes dy * 1": (
        "fake_quantize_backward",
        P(k_fake_quantize_backward, times_one=True),
        "[quant.ste.c1] dy * 1 is exact for every loaded dy (-0, inf, canonical NaN; subnormals are zeroed on loading)",
    ),
}


# ---- the bf16 profile (spec/08-bf16.txt): transcriptions and wrong readings ------------------------


def h_load(h, zero=True, canon=True):
    """[bf16.load.c1] [bf16.widen.c1] bf16 bits -> binary32: subnormals zeroed, NaN canonical."""
    h = np.asarray(h, np.uint16)
    e, f = h & 0x7F80, h & 0x007F
    if zero:
        h = np.where(e == 0, h & 0x8000, h)
    if canon:
        h = np.where((e == 0x7F80) & (f != 0), 0x7FC0, h)
    return from_bits(np.asarray(h, np.uint32) << 16)


def h_round(x, mode="even", nan=0x7FC0):
    """[bf16.round.c1] binary32 -> bf16 bits; ``mode`` even (the spec), trunc or away;
    ``nan`` None keeps the upper half of the NaN's bits."""
    u = bits(finish(x, canon=nan is not None)).astype(np.uint64)
    step = {"even": 0x7FFF + ((u >> 16) & 1), "trunc": 0, "away": 0x8000}[mode]
    r = ((u + step) >> 16).astype(np.uint16)
    if nan is not None:
        r = np.where(np.isnan(np.asarray(x, F32)), np.uint16(nan), r)
    return r.astype(np.uint16)


def k_bf16_encode(x, mode="even", nan=0x7FC0):
    return h_round(load(x) if nan is not None else np.asarray(x, F32), mode, nan)


def k_bf16_decode(x, zero=True, canon=True):
    return h_load(x, zero, canon)


def k_bf16_add(a, b, mode="even", zero=True):
    return h_round(add(h_load(a, zero), h_load(b, zero)), mode)


def k_bf16_matmul(A, B, acc_bf16=False, zero=True, fused=False):
    """[bf16.matmul.c1] exact products summed in binary32, k increasing from -0;
    ``acc_bf16``: the accumulator rounded to bf16 after every addition;
    ``fused``: a*b + acc rounded once ([num.nofma.c1], [bf16.exact.r1])."""
    A, B = h_load(A, zero), h_load(B, zero)  # not k_matmul: its [num.load.c1] would zero them again
    acc = np.full((A.shape[0], B.shape[1]), F32(-0.0))
    for k in range(A.shape[1]):
        a, b = A[:, k : k + 1], B[k : k + 1, :]
        acc = fma(a, b, acc) if fused else add(acc, mul(a, b))
        acc = h_load(h_round(acc)) if acc_bf16 else acc
    return np.where(np.asarray(A.shape[1] == 0), F32(0), acc).astype(F32)


def k_bf16_linear_forward(x, W, b, round_product=False, mode="even"):
    """[bf16.ops.c1] y = round(x·Wᵀ + b), one rounding; ``round_product``: x·Wᵀ
    rounded to bf16 before the bias is added."""
    y = k_linear_forward(h_load(x), h_load(W), np.full(np.shape(b), F32(-0.0)))  # + (-0): the bare sum
    if round_product:
        y = h_load(h_round(y))
    return h_round(add(y, h_load(b)), mode)


def k_bf16_softmax_forward(x, round_exp=False):
    """[bf16.ops.c1] softmax of the widened row, rounded once; ``round_exp``: the
    exponentials rounded to bf16 before they are summed and scaled."""
    x = h_load(x)
    if not round_exp:
        return h_round(_softmax_rows(x))
    m = seq_max(x)
    e = h_load(h_round(exp_(sub(x, m[:, None]))))
    return h_round(mul(e, recip(seq_rows(e))[:, None]))


def k_bf16_attention_forward(q, k, v, round_p=False):
    """[bf16.ops.c1] attention of the widened q, k, v: out rounded once, att binary32;
    ``round_p``: the probabilities rounded to bf16 before att·v (flash style)."""
    q, k, v = h_load(q), h_load(k), h_load(v)
    out, att = k_attention_forward(q, k, v)
    if round_p:
        p = h_load(h_round(att))
        T = att.shape[-1]
        for t in range(T):
            out[..., t, :] = seq_rows(
                np.swapaxes(mul(p[..., t, : t + 1, None], v[..., : t + 1, :]), -1, -2).reshape(-1, t + 1)
            ).reshape(out[..., t, :].shape)
    return h_round(out), att


def k_bf16_linear_backward(dy, x, W, dw_bf16=False):
    """[bf16.ops.c1] refreplay's binary32 linear_backward between the
    conversions (the op is used, not mutated); ``dw_bf16``: dW kept in bf16,
    where [bf16.tensors.c1] keeps the gradients of parameters binary32."""
    from refreplay.ops import linear

    dx, dW, db = linear.linear_backward(h_load(dy), h_load(x), h_load(W), True)
    return h_round(dx), (h_load(h_round(dW)) if dw_bf16 else dW), db


CORRECT.update(
    {
        "bf16_encode": k_bf16_encode,
        "bf16_decode": k_bf16_decode,
        "bf16_add": k_bf16_add,
        "bf16_matmul": k_bf16_matmul,
        "bf16_linear_forward": k_bf16_linear_forward,
        "bf16_softmax_forward": k_bf16_softmax_forward,
        "bf16_attention_forward": k_bf16_attention_forward,
        "bf16_linear_backward": k_bf16_linear_backward,
    }
)
MUTANTS.update(
    {
        "bf16 encode by truncation": (
            "bf16_encode",
            P(k_bf16_encode, mode="trunc"),
            "bf16.round.c1",
            "drops the low 16 bits",
        ),
        "bf16 encode ties away": (
            "bf16_encode",
            P(k_bf16_encode, mode="away"),
            "bf16.round.c1",
            "rounds half away from zero",
        ),
        "bf16 encode NaN 0xFFC0": (
            "bf16_encode",
            P(k_bf16_encode, nan=0xFFC0),
            "bf16.round.c1",
            "x86's default NaN, upper half",
        ),
        "bf16 encode NaN payload kept": (
            "bf16_encode",
            P(k_bf16_encode, nan=None),
            "bf16.round.c1",
            "the upper half of the NaN's bits",
        ),
        "bf16 decode keeps subnormals": (
            "bf16_decode",
            P(k_bf16_decode, zero=False),
            "bf16.load.c1",
            "no input zeroing",
        ),
        "bf16 decode keeps NaN payloads": (
            "bf16_decode",
            P(k_bf16_decode, canon=False),
            "bf16.load.c1",
            "NaN inputs widened as they are",
        ),
        "bf16 add by truncation": ("bf16_add", P(k_bf16_add, mode="trunc"), "bf16.round.c1", "drops the low 16 bits"),
        "bf16 add ties away": ("bf16_add", P(k_bf16_add, mode="away"), "bf16.round.c1", "rounds half away from zero"),
        "bf16 matmul keeps subnormals": (
            "bf16_matmul",
            P(k_bf16_matmul, zero=False),
            "bf16.load.c1",
            "bf16 subnormal inputs not zeroed",
        ),
        "bf16 matmul fused multiply-add": (
            "bf16_matmul",
            P(k_bf16_matmul, fused=True),
            "num.nofma.c1",
            "exact bf16 products, but a product below 2^-126 is added unflushed",
        ),
        "bf16 matmul accumulates in bf16": (
            "bf16_matmul",
            P(k_bf16_matmul, acc_bf16=True),
            "bf16.matmul.c1",
            "the accumulator rounded to bf16 after every addition",
        ),
        "bf16 linear rounds x·Wᵀ before the bias": (
            "bf16_linear_forward",
            P(k_bf16_linear_forward, round_product=True),
            "bf16.ops.c1",
            "two roundings: the product, then the sum",
        ),
        "bf16 linear ties away": (
            "bf16_linear_forward",
            P(k_bf16_linear_forward, mode="away"),
            "bf16.round.c1",
            "rounds half away from zero",
        ),
        "bf16 softmax rounds exponentials": (
            "bf16_softmax_forward",
            P(k_bf16_softmax_forward, round_exp=True),
            "bf16.ops.c1",
            "exp(x - m) stored in bf16 before the sum",
        ),
        "bf16 attention rounds probabilities": (
            "bf16_attention_forward",
            P(k_bf16_attention_forward, round_p=True),
            "bf16.ops.c1",
            "att rounded to bf16 before att·v",
        ),
        "bf16 linear backward keeps dW in bf16": (
            "bf16_linear_backward",
            P(k_bf16_linear_backward, dw_bf16=True),
            "bf16.tensors.c1",
            "dW rounded to bf16",
        ),
    }
)


# ---- wrong readings of the step clauses (chapters 15, 22, 23) ---------------------------------
#
# These are not op kernels: each replaces one function of the reference's trainer (a
# monkeypatch, undone after the test) so that `refreplay vectors steps` computes whole steps
# with one clause misread.  ``tests/test_golden_steps.py`` checks that every one fails the
# committed golden steps, and names the case that catches it.  The readings in NumPy below
# use this file's binary32 arithmetic (every operation rounded, then the spec's flush).

CLIP_EPS = from_bits(0x358637BD)  # the binary32 nearest 1e-6, [optim.clip.c1]


def s_bottom_up(self):
    """[fold.final.c1] misread: the stack folded from the bottom up,
    ((P_1 + P_2) + P_3) instead of P_1 + (P_2 + P_3)."""
    acc = self.entries[0].value
    for block in self.entries[1:]:
        acc = self.node(acc, block.value)
    return acc


def s_divide(value, m):
    """[fold.scale.c1] misread: the folded sum divided by M, not multiplied by recip(M)."""
    if isinstance(value, dict):
        return {k: s_divide(value[k], m) for k in sorted(value)}
    with np.errstate(all="ignore"):
        return finish(np.asarray(value, F32) / F32(m))


def s_identity_scale(value, m):
    """The mean already taken per micro-batch (with ``s_fold_scaled_leaves``)."""
    return value


def s_fold_scaled_leaves(self, leaf, m, merge=None):
    """[fold.scale.c1] misread: every micro-batch's gradients and loss times
    recip(M) before the fold (gradient accumulation of loss / M), not the
    folded sum once after it (``s_identity_scale`` drops the later scaling)."""
    from refreplay.training import treefold

    r = recip(F32(m))
    return treefold.treefold([{k: mul(v, r) for k, v in sorted(leaf(i).items())} for i in range(m)])


def s_loss_in_order(self, leaf, m, merge=None):
    """[step.loss.c1] misread: the gradients folded by the tree, the loss
    summed left to right over the micro-batches."""
    from refreplay.training import treefold
    from refreplay.training.step import LOSS

    leaves = [leaf(i) for i in range(m)]
    out = treefold.treefold([{k: v for k, v in x.items() if k != LOSS} for x in leaves])
    total = leaves[0][LOSS]
    for x in leaves[1:]:
        total = add(total, x[LOSS])
    out[LOSS] = total
    return out


def s_no_clip(grads, max_norm):
    """[optim.clip.c1] misread: no clipping at all."""
    return F32(0), F32(1)


def s_clip_coefficient_no_eps(partials, max_norm):
    """[optim.clip.c1] step 4 misread: coef = max_norm * recip(norm), without the 1e-6."""
    total = F32(-0.0)
    for p in partials:
        total = add(total, p)
    norm = sqrt(total)
    return norm, mul(max_norm, recip(norm))


def s_clip_one_sum(grads, max_norm):
    """[optim.clip.c1] steps 1-2 misread: one sequential sum of squares over
    the elements of all tensors (name order), not a sum per tensor and then a
    sum of the per-tensor sums."""
    squares = np.concatenate([mul(grads[k].reshape(-1), grads[k].reshape(-1)) for k in sorted(grads)])
    total = np.add.accumulate(np.concatenate([[F32(-0.0)], squares]).astype(F32))[-1]  # sequential, rounded
    norm = sqrt(total)
    coef = mul(max_norm, recip(add(norm, CLIP_EPS)))
    if coef < 1:
        for k in sorted(grads):
            grads[k][...] = mul(grads[k], coef)
    return F32(norm), F32(coef)


# name: (patches [(module, attribute path, replacement)], clause misread, what it does)
STEP_MUTANTS = {
    "bottom-up final fold": (
        [("refreplay.training.treefold", "FoldStack.result", s_bottom_up)],
        "fold.final.c1",
        "the stack of blocks folded from the bottom up",
    ),
    "division by M": (
        [("refreplay.training.treefold", "scale", s_divide)],
        "fold.scale.c1",
        "the folded sum divided by M",
    ),
    "mean per micro-batch": (
        [
            ("refreplay.training.launch.inproc", "InProcess.fold", s_fold_scaled_leaves),
            ("refreplay.training.treefold", "scale", s_identity_scale),
        ],
        "fold.scale.c1",
        "each micro-batch times recip(M) before the fold",
    ),
    "loss summed in order": (
        [("refreplay.training.launch.inproc", "InProcess.fold", s_loss_in_order)],
        "step.loss.c1",
        "the loss summed left to right, not folded by the tree",
    ),
    "no clipping": ([("refreplay.ops.optim", "clip_grad_norm", s_no_clip)], "optim.clip.c1", "gradients never clipped"),
    "clip without the 1e-6": (
        [("refreplay.ops.optim", "clip_coefficient", s_clip_coefficient_no_eps)],
        "optim.clip.c1",
        "coef = max_norm * recip(norm)",
    ),
    "clip norm as one sum": (
        [("refreplay.ops.optim", "clip_grad_norm", s_clip_one_sum)],
        "optim.clip.c1",
        "one sequential sum of squares over every element",
    ),
}
# ---- issue 31: readings that passed every vector, and the bf16 twins of every reading ---------------


def k_linear_forward_mm(x, W, b, start=F32(-0.0), fused_tail=None):
    """[linear.fwd.c1] y = (x·Wᵀ, [mm.nt.c1] through k_matmul) + b ([mm.bias.c1]);
    ``start``: the sums' starting value; ``fused_tail``: as k_matmul's."""
    return add(k_matmul(x, np.ascontiguousarray(np.asarray(W).T), start=start, fused_tail=fused_tail), load(b))


def k_linear_backward(dy, x, W, start=F32(-0.0), fused_tail=None):
    """[linear.bwd.c1] dx = dy·W, dW = dyᵀ·x (n increasing), db = column sums of dy."""
    dy_t = np.ascontiguousarray(np.asarray(dy).T)
    dx = k_matmul(dy, W, start=start, fused_tail=fused_tail)
    dW = k_matmul(dy_t, x, start=start, fused_tail=fused_tail)
    return dx, dW, seq_rows(load(dy_t), start)


def plus_zero_sums(fn, which):
    """A kernel whose sums giving the outputs ``which`` (indices) start from
    +0: a sum from +0 differs from one from -0 only where every term is -0,
    so exactly the -0 results of those outputs become +0 ([red.sum.c1])."""

    def kernel(*xs):
        out = list(fn(*(load(x) for x in xs)))
        for i in which:
            o = np.asarray(out[i], F32)
            out[i] = np.where((o == 0) & np.signbit(o), F32(0.0), o).astype(F32)
        return tuple(out)

    return kernel


def _ref_op(module, name):
    def fn(*xs):
        import importlib

        return getattr(importlib.import_module(f"refreplay.ops.{module}"), name)(*xs)

    return fn


def k_log_softmax_from(x, max_from=None):
    """[softmax.log.c1] (x - m) - log(s); ``max_from``: the running maximum's start."""
    x = load(x)
    m = seq_max(x, max_from)
    s = seq_rows(exp_(sub(x, m[:, None])))
    return sub(sub(x, m[:, None]), log_(s)[:, None])


def k_adamw_f64_powers(p, g, m, v, step, lr, f64=True):
    """k_adamw with beta^t computed in float64 and rounded (and flushed) once."""
    if not f64:
        return k_adamw(p, g, m, v, step, lr)
    t = int(step[0])
    pow1, pow2 = (F32(finish(np.array([float(beta) ** t], np.float64).astype(F32))[0]) for beta in (BETA1, BETA2))
    rbc = (recip(sub(ONE, pow1)), recip(sub(ONE, pow2)))
    p, g, m, v, lr = load(p), load(g), load(m), load(v), load(lr)[0]
    m2 = add(mul(BETA1, m), mul(sub(ONE, BETA1), g))
    v2 = add(mul(BETA2, v), mul(mul(sub(ONE, BETA2), g), g))
    upd = mul(mul(m2, rbc[0]), recip(add(sqrt(mul(v2, rbc[1])), ADAM_EPS)))
    return sub(p, mul(lr, add(upd, mul(WD, p)))), m2, v2


def k_attention_backward_recomputed(dout, q, k, v, att, mask_fill=None):
    """[attn.bwd.c1] refreplay's backward (used, not mutated) on probabilities
    recomputed from q and k by the transcription above, not the att given:
    a flash-style backward; ``mask_fill`` as k_attention_forward's."""
    from refreplay.ops import attention

    dout, q, k, v = load(dout), load(q), load(k), load(v)
    return attention.attention_backward(dout, q, k, v, k_attention_forward(q, k, v, mask_fill=mask_fill)[1])


def k_attention_backward_binary64_scale(dout, q, k, v, att):
    """[attn.bwd.c1] [num.flush.c1] misread: dz = ds * scale formed in binary64 (the scale
    passed as a double), flushed while still below 2^-126 and only then rounded to
    binary32; refreplay's own kernel before session 27 did this.  It fails
    attention_backward-edge-07 alone (test_mutants.test_binary64_scale_fails_one_edge_case),
    its bf16 twin the bf16 case built by inputs.model.dz_rounds_up_to_normal_bf16."""
    from refreplay.ops import attention

    dout, q, k, v, att = (load(x) for x in (dout, q, k, v, att))
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    scale = float(attention.attention_scale(q.shape[3]))
    attention.attention_backward_kernel(dout, q, k, v, att, scale, dq, dk, dv, 1, np.empty(0, np.float32))
    return dq, dk, dv


def k_cross_entropy_plus_zero_terms(logits, targets):
    """[loss.mean.c1] misread: every ignored token adds a +0 term to the total."""
    lg = load(logits)
    losses, counted = _ce_losses(lg, targets)
    count = int(counted.sum())
    if count == 0:
        return losses, np.zeros(1, F32)
    total = seq_rows(losses[None, :])[0]
    return losses, np.array([mul(total, recip(F32(count)))], F32).reshape(1)


_layernorm_backward = _ref_op("norms", "layernorm_backward")
_rmsnorm_backward = _ref_op("norms", "rmsnorm_backward")

CORRECT.update(
    {
        "linear_backward": k_linear_backward,
        "attention_backward": k_attention_backward_recomputed,
        "layernorm_backward": lambda *xs: _layernorm_backward(*(load(x) for x in xs)),
        "rmsnorm_backward": lambda *xs: _rmsnorm_backward(*(load(x) for x in xs)),
    }
)

# name: (op, kernel, clause, what); the readings of issue 31 (items 3 and 6) that passed every vector
EDGE_MUTANTS = {
    "linear sums from +0": (
        "linear_forward",
        P(k_linear_forward_mm, start=F32(0.0)),
        "red.sum.c1",
        "y = (+0 + x·Wᵀ) + b: x = -0, W > 0, b = -0 gives +0",
    ),
    "linear fused in the C mod 8 tail": (
        "linear_forward",
        P(k_linear_forward_mm, fused_tail=8),
        "num.nofma.c1",
        "8-wide blocks unfused, the scalar tail fused, for C >= 64",
    ),
    "linear backward sums from +0": (
        "linear_backward",
        P(k_linear_backward, start=F32(0.0)),
        "red.sum.c1",
        "dx, dW, db from +0",
    ),
    "linear backward fused in the K mod 8 tail": (
        "linear_backward",
        P(k_linear_backward, fused_tail=8),
        "num.nofma.c1",
        "dx and dW fuse their K mod 8 tail, K >= 64",
    ),
    "layernorm backward dw, db from +0": (
        "layernorm_backward",
        plus_zero_sums(_layernorm_backward, (1, 2)),
        "red.sum.c1",
        "the column sums dw and db start from +0",
    ),
    "rmsnorm backward dw from +0": (
        "rmsnorm_backward",
        plus_zero_sums(_rmsnorm_backward, (1,)),
        "red.sum.c1",
        "the column sum dw starts from +0",
    ),
    "log-softmax max from -10000": (
        "log_softmax_forward",
        P(k_log_softmax_from, max_from=-10000.0),
        "softmax.log.c1",
        "running maximum started at -10,000",
    ),
    "AdamW bias powers in float64": (
        "adamw_update",
        k_adamw_f64_powers,
        "optim.adamw.bias.c1",
        "beta^t in float64, rounded once",
    ),
    "attention backward recomputes att, mask -1e9": (
        "attention_backward",
        P(k_attention_backward_recomputed, mask_fill=-1e9),
        "attn.mask.c1",
        "flash-style: att recomputed with a -1e9 fill",
    ),
}
MUTANTS.update(EDGE_MUTANTS)
MUTANTS["attention backward scale in binary64"] = (
    "attention_backward",
    k_attention_backward_binary64_scale,
    "num.flush.c1",
    "dz = ds * scale formed in binary64, flushed before its rounding",
)
EQUIVALENT.update(
    {
        "loss ignored tokens as +0 terms": (
            "cross_entropy_forward",
            k_cross_entropy_plus_zero_terms,
            "[loss.mean.c1] a counted loss is never -0 ([loss.token.c1]: log(s) - a with log(s) >= +0 and a <= 0; "
            "an exact zero is +0, a subnormal difference flushes to +0, and a = -0 only when another element "
            "holds the maximum, so s >= 2), hence every partial sum after the first counted term is not -0 and "
            "adding +0 changes nothing; before it, -0 + +0 = +0 and +0 + loss = -0 + loss",
        ),
    }
)


# ---- the bf16 twin of every reading ([bf16.ops.c1]: the binary32 op between the conversions) --------


def bf16_twin(op, fn):
    """``fn`` (a kernel of the binary32 ``op``) as the bf16 op: h inputs
    widened ([bf16.load.c1]), h outputs rounded once ([bf16.round.c1])."""
    from refreplay.ops import bf16

    kin, kout = bf16.PROFILE[op]
    return lambda *xs: bf16.call(fn, kin, kout, *xs)


def _raw_add(a, b):
    """bf16 add keeping NaN payloads: widened without canonicalising, added
    by NumPy, the upper half of a NaN's bits kept."""
    with np.errstate(all="ignore"):
        r = np.add(h_load(a, canon=False), h_load(b, canon=False))
    return h_round(finish(r, canon=False), nan=None)


# the readings of [num.load.c1] are done by the twin's own widening, so their twin reads bf16 loading wrong
BF16_LOAD_TWINS = {
    "add, no input zeroing": P(k_bf16_add, zero=False),
    "add, NaN payload kept": _raw_add,
    "embedding raw copy": lambda wte, tokens: np.asarray(wte, np.uint16)[tokens],
}


def bf16_twins():
    """name -> (bf16 op, kernel) for every binary32 reading whose op is in the profile."""
    from refreplay.ops import bf16

    out = {}
    for name, (op, fn, *_) in MUTANTS.items():
        if op in bf16.PROFILE:
            out[name] = (f"bf16_{op}", BF16_LOAD_TWINS.get(name) or bf16_twin(op, fn))
    return out
