"""Implementation variants of the transformer ops, for diagnosis ([conf.diagnosis.r1]).

A transformer op that fails its random cases is usually the spec's algorithm
with one or two things done the way a library does them: a vendor exp, a
SIMD-lane row sum, a division where the spec multiplies by a reciprocal.
Each op is written here once more in plain NumPy float32 (every add and
multiply rounded and flushed by ``fp``), built from ``Parts``: with the
spec's parts it gives the reference's bits (``tests/test_variants.py``
checks this on every committed case), and a ``Deviation`` swaps exactly one
part.  ``explain`` re-evaluates a failing case with every single deviation
and, if none reproduces the kernel, every pair, and names the variants that
reproduce its outputs bit for bit, or else the one that comes closest.

Nothing here is on the normative path: the vendor functions (np.exp, ...)
are the deviations being tested.  So are the C library's expf, logf, tanhf
and coshf (called through ctypes, what a C kernel linked against libm gets)
and the correctly rounded functions (float64 ``np``/``math`` functions
rounded once to binary32): models of what a kernel does, never of what the
spec says.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import hashlib
import itertools
import math
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from ..base import deviant as fp
from . import orders

F32 = np.float32
ONE, HALF = F32(1.0), F32(0.5)
EPS = fp.f32(0x3727C5AC)  # [norm.layer.fwd.c1] the reference's eps, ~1e-5
GELU_S = fp.f32(0x3F4C422A)  # sqrt(2/pi)   [act.gelu.fwd.c1]
GELU_K = fp.f32(0x3D372713)  # 0.044715
GELU_K3 = fp.f32(0x3E095D4F)  # 3 * 0.044715 [act.gelu.bwd.c1]


# ---- binary32 arithmetic, rounded and flushed ([num.flush.c1]) -------------------

add, mul = fp.add, fp.mul


def sub(a, b):
    return fp.add(a, np.negative(np.asarray(b, F32)))


def div(a, b):
    """a / b correctly rounded: a division, which the spec never uses ([num.recip.c1])."""
    with np.errstate(all="ignore"):
        return fp.flush(np.divide(a, b, dtype=F32))


def recip(x):
    return div(ONE, x)


def sqrt(x):
    with np.errstate(all="ignore"):
        return fp.flush(np.sqrt(np.asarray(x, F32)))


def _f64_once(fn, x):
    """fn in float64, rounded once to binary32 (correctly rounded but for rare
    double roundings), flushed."""
    with np.errstate(all="ignore"):
        return fp.flush(fn(np.asarray(x, F32).astype(np.float64)).astype(F32))


def _vendor(fn, x):
    with np.errstate(all="ignore"):
        return fp.flush(fn(np.asarray(x, F32)))


# ---- transcendentals: the spec's and the deviant ones ----------------------------


def _spec(name):
    def fn(x):
        from ...numerics import elementwise

        return getattr(elementwise, name)(np.ascontiguousarray(x, dtype=F32))

    fn.__name__ = f"spec_{name}"
    return fn


spec_exp, spec_log, spec_tanh, spec_sigmoid = (_spec(n) for n in ("exp", "log", "tanh", "sigmoid"))


def vendor_exp(x):
    """np.exp in float32 instead of the algorithm of [num.exp.c1]."""
    return _vendor(np.exp, x)


def rounded_exp(x):
    """exp in float64 rounded to binary32 instead of [num.exp.c1]'s algorithm."""
    return _f64_once(np.exp, x)


def vendor_log(x):
    """np.log in float32 instead of the algorithm of [num.log.c1]."""
    return _vendor(np.log, x)


def rounded_log(x):
    """log in float64 rounded to binary32 instead of [num.log.c1]'s algorithm."""
    return _f64_once(np.log, x)


def vendor_tanh(x):
    """np.tanh in float32 instead of the algorithm of [num.tanh.c1]."""
    return _vendor(np.tanh, x)


def rounded_tanh(x):
    """tanh in float64 rounded to binary32 instead of [num.tanh.c1]'s algorithm."""
    return _f64_once(np.tanh, x)


@functools.lru_cache(maxsize=None)
def _libm(name):
    """The C library's binary32 function ``name`` (float f(float)), or None
    where no libm can be loaded."""
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
        fn = getattr(lib, name)
    except (OSError, AttributeError):
        return None
    fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float]
    return np.frompyfunc(lambda v: fn(float(v)), 1, 1)


_LIBM_MEMO: dict = {}  # (name, shape, digest of the input) -> result: at most 4, of up to 64 MiB each


def _libm_call(name, x):
    """One C call per element (about a microsecond each), so a result is kept
    for the next variant that asks for the same function of the same input
    (a diagnosis evaluates each libm variant alone and in pairs)."""
    x = np.ascontiguousarray(x, F32)
    key = (name, x.shape, hashlib.blake2b(x.data, digest_size=16).digest())
    if key in _LIBM_MEMO:
        return _LIBM_MEMO[key].copy()
    with np.errstate(all="ignore"):
        out = fp.flush(np.asarray(_libm(name)(x.ravel()), dtype=np.float64).astype(F32).reshape(x.shape))
    if out.nbytes <= 64 << 20:
        if len(_LIBM_MEMO) >= 4:
            _LIBM_MEMO.pop(next(iter(_LIBM_MEMO)))
        _LIBM_MEMO[key] = out.copy()
    return out


def libm_exp(x):
    """The C library's expf (glibc's on Linux) instead of the algorithm of [num.exp.c1]."""
    return _libm_call("expf", x)


def libm_log(x):
    """The C library's logf instead of the algorithm of [num.log.c1]."""
    return _libm_call("logf", x)


def libm_tanh(x):
    """The C library's tanhf instead of the algorithm of [num.tanh.c1]."""
    return _libm_call("tanhf", x)


def libm_cosh(x):
    """The C library's coshf (the spec has no cosh: [act.gelu.bwd.c1] forms 1 - tanh^2)."""
    return _libm_call("coshf", x)


def rounded_cosh(x):
    """cosh in float64 rounded to binary32."""
    return _f64_once(np.cosh, x)


def vendor_sigmoid(x):
    """1 / (1 + np.exp(-x)) in float32 instead of [num.sigmoid.c1]'s two-branch algorithm."""
    return div(ONE, add(ONE, vendor_exp(np.negative(np.asarray(x, F32)))))


def rounded_sigmoid(x):
    """1 / (1 + e^-x) in float64 rounded to binary32 instead of [num.sigmoid.c1]."""
    return _f64_once(lambda v: 1.0 / (1.0 + np.exp(-v)), x)


# ---- means, reciprocal square roots, normalisation -------------------------------


def mean_by_recip(total, count):
    """[norm.meanop.c1] [loss.mean.c1] total * recip(f32(count)) (the spec)."""
    return mul(total, recip(F32(count)))


def mean_by_division(total, count):
    """total / count: a division where [norm.meanop.c1] and [loss.mean.c1]
    multiply by recip(f32(count))."""
    return div(total, F32(count))


def recip_of_sqrt(v):
    """[norm.layer.fwd.c1] step 6: recip(sqrt(v)), two roundings (the spec)."""
    return recip(sqrt(v))


def rsqrt_rounded_once(v):
    """1/sqrt(v) rounded once (a correctly rounded rsqrt) where
    [norm.layer.fwd.c1] and [norm.rms.fwd.c1] round sqrt and recip separately."""
    return _f64_once(lambda x: 1.0 / np.sqrt(x), v)


def scale_by_recip(e, s):
    """[softmax.fwd.c1] e * recip(s), recip once per row (the spec)."""
    return mul(e, recip(s)[..., None])


def divide_by_sum(e, s):
    """e / s: a division by the row sum where [softmax.fwd.c1] multiplies by recip(s)."""
    return div(e, s[..., None])


def row_max(x):
    """[softmax.fwd.c1] m = the row maximum (the spec)."""
    return np.max(x, axis=-1)


def no_max_shift(x):
    """m = 0: exp(x) unshifted, where [softmax.fwd.c1] subtracts the row maximum."""
    return np.zeros(x.shape[:-1], F32)


# ---- log-softmax and the per-token loss ---------------------------------------------


def shifted_minus_log(x, m, s, p):
    """[softmax.log.c1] y = (x - m) - log(s) (the spec)."""
    return sub(sub(x, m[..., None]), p.log(s)[..., None])


def minus_logsumexp(x, m, s, p):
    """y = x - (m + log(s)): the log-sum-exp formed first, where
    [softmax.log.c1] subtracts m and then log(s)."""
    return sub(x, add(m, p.log(s))[..., None])


def log_of_softmax(x, m, s, p):
    """y = log(softmax(x)) where [softmax.log.c1] has (x - m) - log(s)."""
    return p.log(p.normalize(p.exp(sub(x, m[..., None])), s))


def log_s_minus_shifted(lsm, x_y, m, s, e_y, p):
    """[loss.token.c1] loss = log(s) - (x[y] - m) (the spec; lsm, e_y unused)."""
    return sub(p.log(s), sub(x_y, m))


def negated_log_softmax(lsm, x_y, m, s, e_y, p):
    """loss = -(log-softmax at y), where [loss.token.c1] has log(s) - (x[y] - m):
    an exact zero comes out -0 instead of +0."""
    return np.negative(lsm)


def minus_log_probability(lsm, x_y, m, s, e_y, p):
    """loss = -log(e[y] / s), the log of the softmax probability (a division,
    as a C training loop writes it), where [loss.token.c1] has
    log(s) - (x[y] - m): another formula, not another exp."""
    return np.negative(p.log(div(e_y, s)))


# ---- the start of a sum ---------------------------------------------------------------


def minus_zero_start(total):
    """[red.sum.c1] every sum starts from -0, so a sum of -0 terms is -0 (the spec)."""
    return total


def plus_zero_start(total):
    """Every sum started from +0 where [red.sum.c1] starts from -0: a sum
    whose terms are all -0 comes out +0.  In any order this is exactly the
    finished sum plus +0 (a partial sum started from +0 differs from one
    started from -0 only while every term so far is -0)."""
    return add(total, F32(0.0))


# ---- LayerNorm / RMSNorm pieces ----------------------------------------------------------


def two_pass_moments(x, p):
    """[norm.layer.fwd.c1] steps 1-5: mean, then the mean of (x - mean)^2 (the spec)."""
    C = x.shape[-1]
    mean = p.mean(_rows(p, x), C)
    d = sub(x, mean[:, None])
    return mean, p.mean(dot(p, d, d), C)


def one_pass_moments(x, p):
    """var = E[x^2] - E[x]^2 (one pass) where [norm.layer.fwd.c1] step 4
    sums (x - mean)^2."""
    C = x.shape[-1]
    mean = p.mean(_rows(p, x), C)
    return mean, sub(p.mean(dot(p, x, x), C), mul(mean, mean))


def welford_moments(x, p):
    """Welford's running mean and variance (delta / k updates) where
    [norm.layer.fwd.c1] steps 1-5 take two sums and multiply by recip(C)."""
    N, C = x.shape
    mean = np.zeros(N, F32)
    m2 = np.zeros(N, F32)
    for c in range(C):
        delta = sub(x[:, c], mean)
        mean = add(mean, div(delta, F32(c + 1)))
        m2 = madd(p, delta, sub(x[:, c], mean), m2)
    return mean, div(m2, F32(C))


def normalize_then_affine(x, mean, rstd, w, b, p):
    """[norm.layer.fwd.c1] steps 3, 7, 8: ((x - mean) * rstd) * w + b (the spec)."""
    return madd(p, mul(sub(x, mean[:, None]), rstd[:, None]), w, b)


def folded_scale_shift(x, mean, rstd, w, b, p):
    """scale = rstd * w, shift = b - mean * scale, out = x * scale + shift (the
    affine folded into one multiply-add per element, as PyTorch's CPU kernel
    does) where [norm.layer.fwd.c1] steps 3, 7, 8 subtract, scale, weight, add."""
    scale = mul(rstd[:, None], w)
    shift = sub(b, mul(mean[:, None], scale))
    return madd(p, x, scale, shift)


def rms_then_weight(x, rrms, w):
    """[norm.rms.fwd.c1] steps 4, 5: (x * rrms) * w (the spec)."""
    return mul(mul(x, rrms[:, None]), w)


def weight_folded_into_rrms(x, rrms, w):
    """x * (rrms * w) where [norm.rms.fwd.c1] steps 4, 5 compute (x * rrms) * w."""
    return mul(x, mul(rrms[:, None], w))


# ---- activation pieces ------------------------------------------------------------------


def cube_left_to_right(x):
    """[act.gelu.fwd.c1] step 1: K*x*x*x, left to right, as factors (K*x*x, x)."""
    return mul(mul(GELU_K, x), x), x


def cube_then_constant(x):
    """K*(x*x*x) where [act.gelu.fwd.c1] step 1 computes ((K*x)*x)*x; as factors (K, x^3)."""
    return np.broadcast_to(GELU_K, np.shape(x)), mul(mul(x, x), x)


def k3_constant():
    """[act.gelu.bwd.c1] K3 = f32(0x3E095D4F), the binary32 nearest 3*0.044715 (the spec)."""
    return GELU_K3


def k3_as_product():
    """K3 = 3 * K = f32(0x3E095D4E), which [act.gelu.bwd.c1] notes is not the constant."""
    return mul(F32(3.0), GELU_K)


def sech2_from_tanh(u, th, p):
    """[act.gelu.bwd.c1] sech^2 = 1 - th*th (the spec)."""
    return madd(p, np.negative(th), th, ONE)


def sech2_by_libm_cosh(u, th, p):
    """sech^2 = 1 / (coshf(u) * coshf(u)) with the C library's coshf, where
    [act.gelu.bwd.c1] forms 1 - tanh(u)^2."""
    c = libm_cosh(u)
    return div(ONE, mul(c, c))


def sech2_by_rounded_cosh(u, th, p):
    """sech^2 = 1 / (cosh(u) * cosh(u)), cosh correctly rounded, where
    [act.gelu.bwd.c1] forms 1 - tanh(u)^2."""
    c = rounded_cosh(u)
    return div(ONE, mul(c, c))


def silu_by_sigmoid(x, p):
    """[act.silu.fwd.c1] x * sigmoid(x) (the spec)."""
    return mul(x, p.sigmoid(x))


def silu_by_division(x, p):
    """x / (1 + exp(-x)) where [act.silu.fwd.c1] multiplies x by sigmoid(x)."""
    return div(x, add(ONE, p.exp(np.negative(np.asarray(x, F32)))))


def grad_times_local(g, s, t):
    """[act.silu.bwd.c1] g * (s * t), the local derivative formed first (the spec)."""
    return mul(g, mul(s, t))


def grad_times_s_first(g, s, t):
    """(g * s) * t where [act.silu.bwd.c1] step 2 forms local = s * t before
    multiplying by the incoming gradient."""
    return mul(mul(g, s), t)


# ---- attention and linear pieces --------------------------------------------------------


def scale_after_dot(q, k, p):
    """[attn.scores.c1] z = dot(q, k) * recip(sqrt(f32(HS))) (the spec)."""
    return mul(_scores(p, q, k), recip(sqrt(F32(q.shape[-1]))))


def scale_q_first(q, k, p):
    """z = dot(q * scale, k): [attn.scores.c1] says the scale multiplies the
    finished dot product, never q first."""
    return _scores(p, mul(q, recip(sqrt(F32(q.shape[-1])))), k)


def divide_by_sqrt_hs(q, k, p):
    """z = dot(q, k) / sqrt(f32(HS)) where [attn.scores.c1] multiplies by recip(sqrt(HS))."""
    return div(_scores(p, q, k), sqrt(F32(q.shape[-1])))


def dz_times_scale(dz, HS):
    """[attn.bwd.c1] dz = dz * scale, scale = recip(sqrt(f32(HS))) (the spec); dq and dk are their sums."""
    return mul(dz, recip(sqrt(F32(HS)))), lambda g: g


def dz_divided_by_sqrt_hs(dz, HS):
    """dz / sqrt(f32(HS)) (PyTorch's math path) where [attn.bwd.c1] multiplies by the scale."""
    return div(dz, sqrt(F32(HS))), lambda g: g


def scale_after_the_sums(dz, HS):
    """dq and dk summed from the unscaled dz and multiplied by the scale at the
    end (FlashAttention's backward), where [attn.bwd.c1] scales every dz first."""
    scale = recip(sqrt(F32(HS)))
    return dz, lambda g: mul(g, scale)


def bias_after_sum(x, W, b, p):
    """[mm.bias.c1] y = (sum over c of x*W) + b (the spec)."""
    N, C = x.shape
    return add(dot(p, np.repeat(x, W.shape[0], 0), np.tile(W, (N, 1))).reshape(N, -1), b)


def bias_as_first_term(x, W, b, p):
    """The bias as the sum's first term (its starting value, for the
    sequential order), which [mm.bias.c1] forbids."""
    N, C = x.shape
    OC = W.shape[0]
    a = np.concatenate([np.tile(b, N)[:, None], np.repeat(x, OC, 0)], 1)
    w = np.concatenate([np.ones((N * OC, 1), F32), np.tile(W, (N, 1))], 1)
    return dot(p, a, w).reshape(N, OC)


# ---- backward pieces: softmax, the norms ---------------------------------------------------


def softmax_grad_factored(dy, y, d, p):
    """[softmax.bwd.c1] dx = y * (dy - d) (the spec)."""
    return mul(y, sub(dy, d[..., None]))


def softmax_grad_distributed(dy, y, d, p):
    """dx = y*dy - y*d, the product distributed, where [softmax.bwd.c1]
    multiplies y by the one difference dy - d."""
    return msub(p, y, d[..., None], mul(y, dy))


def ln_grad_from_norm(dout, x, w, mean, rstd, p):
    """[norm.layer.bwd.c1] steps 1-4: rstd * (dnorm - mean(dnorm) - norm * mean(dnorm*norm)) (the spec)."""
    C = x.shape[-1]
    norm = mul(sub(x, mean[:, None]), rstd[:, None])
    dnorm = mul(dout, w)
    a, g = _rows(p, dnorm), dot(p, dnorm, norm)
    return mul(msub(p, norm, p.mean(g, C)[:, None], sub(dnorm, p.mean(a, C)[:, None])), rstd[:, None])


def ln_grad_from_x(dout, x, w, mean, rstd, p):
    """dx = rstd*dnorm + b*x + c with ds = sum(dnorm*x), db = sum(dnorm),
    b = (db*mean - ds)*rstd*rstd*rstd/C and c = -b*mean - db*rstd/C (the
    form of PyTorch's CPU LayerNorm backward), where [norm.layer.bwd.c1]
    differentiates through norm = (x - mean)*rstd."""
    C = x.shape[-1]
    dnorm = mul(dout, w)
    ds, db = dot(p, dnorm, x), _rows(p, dnorm)  # dnorm = dy*gamma
    b = p.mean(mul(mul(mul(madd(p, db, mean, np.negative(ds)), rstd), rstd), rstd), C)
    c = sub(mul(np.negative(b), mean), p.mean(mul(db, rstd), C))
    return add(madd(p, b[:, None], x, mul(mul(rstd[:, None], dout), w)), c[:, None])


def rms_grad_from_norm(dout, x, w, rrms, p):
    """[norm.rms.bwd.c1] steps 1-4: rrms * (dnorm - norm * mean(dnorm*norm)) (the spec)."""
    norm = mul(x, rrms[:, None])
    dnorm = mul(dout, w)
    g = p.mean(dot(p, dnorm, norm), x.shape[-1])
    return mul(msub(p, norm, g[:, None], dnorm), rrms[:, None])


def rms_grad_from_x(dout, x, w, rrms, p):
    """dx = rrms*dnorm - x * (rrms^3 * mean(dnorm*x)) (the analytic
    derivative on x), where [norm.rms.bwd.c1] sums dnorm*norm and subtracts
    norm * mean(...) before one multiplication by rrms."""
    dnorm = mul(dout, w)
    g = p.mean(dot(p, dnorm, x), x.shape[-1])
    k = mul(mul(mul(rrms, rrms), rrms), g)
    return msub(p, x, k[:, None], mul(dnorm, rrms[:, None]))


# ---- AdamW pieces ----------------------------------------------------------------------------

ADAM_B1, ADAM_B2 = fp.f32(0x3F666666), fp.f32(0x3F733333)  # [optim.adamw.c1] the op's fixed values
ADAM_EPS, ADAM_WD = fp.f32(0x322BCC77), fp.f32(0x3DCCCCCD)


def powers_by_products(beta, t):
    """[optim.adamw.bias.c1] beta^t as t - 1 products in binary32, each
    rounded and flushed (the spec); once +0 it stays +0."""
    pw = beta
    for _ in range(int(t) - 1):
        pw = mul(pw, beta)
        if pw == 0:
            break
    return F32(pw)


def powers_in_float64(beta, t):
    """beta^t in float64 rounded once to binary32, where
    [optim.adamw.bias.c1] multiplies t copies of beta in binary32."""
    return F32(fp.flush(np.asarray(float(beta) ** int(t), F32)))


def adamw_spec(p_, g, m, v, t, lr, p):
    """[optim.adamw.c1] steps 1-6 (the spec), parts swapped by ``p``."""
    rbc1 = recip(sub(ONE, p.adam_pow(ADAM_B1, t)))
    rbc2 = recip(sub(ONE, p.adam_pow(ADAM_B2, t)))
    m2 = madd(p, ADAM_B1, m, mul(sub(ONE, ADAM_B1), g))
    v2 = madd(p, ADAM_B2, v, mul(mul(sub(ONE, ADAM_B2), g), g))
    update = p.adam_ratio(mul(m2, rbc1), mul(v2, rbc2))
    return p.adam_decay(p_, update, lr, p), m2, v2


def ratio_by_recip(m_hat, v_hat):
    """[optim.adamw.c1] step 5: m_hat * recip(sqrt(v_hat) + eps) (the spec)."""
    return mul(m_hat, recip(add(sqrt(v_hat), ADAM_EPS)))


def ratio_by_division(m_hat, v_hat):
    """m_hat / (sqrt(v_hat) + eps): a division where [optim.adamw.c1] step 5
    multiplies by a reciprocal."""
    return div(m_hat, add(sqrt(v_hat), ADAM_EPS))


def ratio_eps_inside(m_hat, v_hat):
    """m_hat * recip(sqrt(v_hat + eps)): eps under the root, where
    [optim.adamw.c1] adds it after the square root."""
    return mul(m_hat, recip(sqrt(add(v_hat, ADAM_EPS))))


def decay_decoupled(p_, update, lr, p):
    """[optim.adamw.c1] step 6: p - lr*(update + wd*p) (the spec)."""
    return msub(p, lr, madd(p, ADAM_WD, p_, update), p_)


def decay_then_step(p_, update, lr, p):
    """p*(1 - lr*wd) - lr*update (torch.optim.AdamW's two in-place steps),
    where [optim.adamw.c1] step 6 subtracts lr*(update + wd*p) at once."""
    return msub(p, lr, update, mul(p_, sub(ONE, mul(lr, ADAM_WD))))


def adamw_torch_formula(p_, g, m, v, t, lr, p):
    """torch.optim.AdamW's single-tensor arithmetic (foreach=False), with the
    op's hyper-parameters given as the decimal Python floats 0.9, 0.95,
    1e-8 and 0.1: scalars computed in float64 and rounded to binary32 where
    they meet a tensor; m' = lerp(m, g, 1 - beta1) = fma(w, g - m, m);
    v' = fma((1 - beta2)*g, g, v*beta2); denom = sqrt(v') / sqrt(1 - beta2^t)
    + eps; p' = p*(1 - lr*wd) + ((-lr / (1 - beta1^t)) * m') / denom; IEEE
    subnormals, no flush.  (Reproduces torch 2.x on x86-64 on every
    committed case.)  [optim.adamw.c1] instead forms everything in binary32
    from the binary32 hyper-parameters, multiplies by the reciprocals of the
    bias corrections and subtracts lr*(update + wd*p) at once."""
    b1, b2, eps, wd, lr64 = 0.9, 0.95, 1e-8, 0.1, float(lr)
    with np.errstate(all="ignore"):
        m2 = fp.fma_ieee(F32(1 - b1), np.subtract(g, m, dtype=F32), m)
        v2 = fp.fma_ieee(np.multiply(F32(1 - b2), g, dtype=F32), g, np.multiply(v, F32(b2), dtype=F32))
        denom = np.sqrt(v2, dtype=F32) / F32(math.sqrt(1 - b2**t)) + F32(eps)
        p2 = np.multiply(p_, F32(1 - lr64 * wd), dtype=F32)
        return (p2 + (F32(-lr64 / (1 - b1**t)) * m2) / denom).astype(F32), m2, v2


# ---- rotary embedding ([rope.fwd.c1] [rope.bwd.c1]) -------------------------------------------


def half_split_pairs(x):
    """[rope.fwd.c1] channel i rotates with i + HS/2 (the spec): (first, second, join)."""
    h = x.shape[-1] // 2
    return x[..., :h], x[..., h:], lambda a, b: np.concatenate([a, b], axis=-1)


def interleaved_pairs(x):
    """Channel 2i rotates with 2i + 1 (GPT-J's and Meta's original Llama layout)
    where [rope.fwd.c1] pairs channel i with i + HS/2."""

    def join(a, b):
        out = np.empty(a.shape[:-1] + (2 * a.shape[-1],), F32)
        out[..., 0::2], out[..., 1::2] = a, b
        return out

    return x[..., 0::2], x[..., 1::2], join


def rotate_rounded(a, b, c, s, p):
    """[rope.fwd.c1] (a*c - b*s, b*c + a*s), every product rounded (the spec;
    with p.fma the second product of each is fused into the subtract or add)."""
    return msub(p, b, s, mul(a, c)), madd(p, a, s, mul(b, c))


def _rotate_in(dtype, a, b, c, s):
    """(a*c - b*s, b*c + a*s) in NumPy's IEEE ``dtype`` arithmetic, rounded to binary32."""
    with np.errstate(all="ignore"):
        a, b, c, s = (np.asarray(v, dtype) for v in (a, b, c, s))
        return (a * c - b * s).astype(F32), (b * c + a * s).astype(F32)


def rotate_in_float64(a, b, c, s, p):
    """The rotation in float64 (products and sums exact to 53 bits), rounded once
    and flushed, where [rope.fwd.c1] rounds every product and the add."""
    return tuple(fp.flush(o) for o in _rotate_in(np.float64, a, b, c, s))


def rotate_keeping_subnormals(a, b, c, s, p):
    """IEEE binary32 products and sums, subnormals kept (PyTorch's CPU default),
    where [num.flush.c1] flushes every subnormal result to zero."""
    return _rotate_in(F32, a, b, c, s)


def sin_as_given(s):
    """[rope.fwd.c1] the table's sine as it is (the spec)."""
    return s


def sin_negated(s):
    """The rotation turned the other way (sine negated): the forward kernel uses
    the backward's transposed rotation, or the backward the forward's."""
    return np.negative(np.asarray(s, F32))


# ---- quantization ([quant.step.c1] [quant.quantize.c1] [quant.ste.c1]) ------------------------

Q_RECIP = fp.f32(0x3C010204)  # [quant.step.c1] recip(127)
Q_FLOOR = fp.f32(0x00800000)  # the step floor, 2^-126


def absmax_propagating(x):
    """[quant.step.c1] a = fmax(a, |g|) from +0: a NaN anywhere gives NaN (the spec)."""
    a = np.abs(np.asarray(x, F32)).reshape(-1)
    return F32(np.nan) if np.isnan(a).any() else (a.max() if a.size else F32(0.0))


def absmax_ignoring_nan(x):
    """C's fmaxf (the non-NaN operand wins) where [quant.step.c1]'s fmax
    propagates NaN: NaNs are skipped."""
    a = np.abs(np.asarray(x, F32)).reshape(-1)
    a = a[~np.isnan(a)]
    return a.max() if a.size else F32(0.0)


def step_by_recip(a):
    """[quant.step.c1] s = a * recip(127) (the spec)."""
    return mul(a, Q_RECIP)


def step_by_division(a):
    """s = a / 127 where [quant.step.c1] multiplies by recip(127)."""
    return div(np.asarray(a, F32), F32(127.0))


def step_floored(s):
    """[quant.step.c1] a zero step becomes 2^-126 (the spec)."""
    return Q_FLOOR if s == 0 else s


def step_unfloored(s):
    """No floor: an all-zero tensor gets s = 0, where [quant.step.c1] floors it
    at 2^-126 (PyTorch's x.abs().max() / 127 has neither floor nor recip)."""
    return s


def scaled_by_recip(x, s):
    """[quant.quantize.c1] x * recip(s), recip once per group (the spec)."""
    return mul(x, recip(s))


def scaled_by_division(x, s):
    """x / s where [quant.quantize.c1] multiplies by recip(s)."""
    return div(x, s)


def rint_half_even(v):
    """[num.rint.c1] round half to even (the spec)."""
    return np.rint(v)


def round_half_away(v):
    """C's roundf (half away from zero) where [num.rint.c1] rounds half to even."""
    v = np.asarray(v, F32)
    with np.errstate(invalid="ignore"):
        return np.where(np.abs(v) < 2**23, np.copysign(np.floor(np.abs(v) + F32(0.5)), v), v).astype(F32)


def codes_to_127(v):
    """[num.sat.c1] the code range [-128, 127] (the spec)."""
    return F32(-128.0), F32(127.0)


def nan_code_zero(lo):
    """[num.sat.c1] a NaN becomes code 0 (the spec)."""
    return F32(0.0)


def nan_code_lowest(lo):
    """A NaN becomes the lowest code (a clamp by min and max that lets NaN fall to
    the bottom, as torch.fake_quantize_per_tensor_affine does) where [num.sat.c1]
    maps it to 0."""
    return lo


def codes_symmetric(v):
    """A symmetric code range [-127, 127] where [num.sat.c1] clamps to [-128, 127]."""
    return F32(-127.0), F32(127.0)


def ste_copies(dy, keep):
    """[quant.ste.c1] dy copied where the code is kept, +0 elsewhere (the spec)."""
    return np.where(keep, dy, F32(0.0)).astype(F32)


def ste_times_mask(dy, keep):
    """dy times a 0/1 mask (IEEE products, as PyTorch's autograd forms it): -0 where
    a negative dy is dropped, where [quant.ste.c1] gives +0."""
    with np.errstate(all="ignore"):
        return (dy * keep.astype(F32)).astype(F32)


# ---- the parts an op is built from -----------------------------------------------------

SPEC_ORDER = orders.spec_order(False)


@dataclass(frozen=True)
class Parts:
    """The pieces an op model is built from; the defaults are the spec's."""

    exp: Callable = spec_exp
    log: Callable = spec_log
    tanh: Callable = spec_tanh
    sigmoid: Callable = spec_sigmoid
    order: orders.Order = SPEC_ORDER  # every sum of the op ([red.sum.c1])
    start: Callable = minus_zero_start  # the value every sum starts from ([red.sum.c1])
    fma: bool = False  # contract mul-then-add ([num.nofma.c1])
    mean: Callable = mean_by_recip
    rsqrt: Callable = recip_of_sqrt
    normalize: Callable = scale_by_recip
    shift: Callable = row_max
    log_softmax: Callable = shifted_minus_log
    token_loss: Callable = log_s_minus_shifted
    moments: Callable = two_pass_moments
    ln_affine: Callable = normalize_then_affine
    rms_scale: Callable = rms_then_weight
    gelu_cube: Callable = cube_left_to_right
    gelu_k3: Callable = k3_constant
    sech2: Callable = sech2_from_tanh
    silu: Callable = silu_by_sigmoid
    grad_local: Callable = grad_times_local
    att_scores: Callable = scale_after_dot
    att_dz_scale: Callable = dz_times_scale
    bias: Callable = bias_after_sum
    sm_grad: Callable = softmax_grad_factored
    ln_grad: Callable = ln_grad_from_norm
    rms_grad: Callable = rms_grad_from_norm
    adam_pow: Callable = powers_by_products
    adam_ratio: Callable = ratio_by_recip
    adam_decay: Callable = decay_decoupled
    adamw: Callable = adamw_spec
    rope_pairs: Callable = half_split_pairs
    rope_rotate: Callable = rotate_rounded
    rope_sin: Callable = sin_as_given
    q_absmax: Callable = absmax_propagating
    q_step: Callable = step_by_recip
    q_floor: Callable = step_floored
    q_scale: Callable = scaled_by_recip
    q_round: Callable = rint_half_even
    q_range: Callable = codes_to_127
    q_nan: Callable = nan_code_zero
    q_ste: Callable = ste_copies


SPEC = Parts()


def madd(p, a, b, c):
    """a*b + c: two roundings, or one with p.fma ([num.nofma.c1])."""
    return fp.fma(a, b, c) if p.fma else add(mul(a, b), c)


def msub(p, a, b, c):
    """c - a*b: two roundings, or one with p.fma ([num.nofma.c1])."""
    return fp.fma(np.negative(np.asarray(a, F32)), b, c) if p.fma else sub(c, mul(a, b))


def dot(p, a, b):
    """Row sums of the products a*b (a, b: [R, N]) in p's order, fused with p.fma;
    an empty sum is +0 ([red.sum.c1])."""
    if np.shape(a)[-1] == 0:
        return np.zeros(np.shape(a)[0], F32)
    return p.start(orders.Order(p.order.name, p.order.fn, fused=p.fma)(a, b))


def _scores(p, q, k):
    """q·kᵀ per (b, h): [B, NH, T, T], every entry a dot over HS in p's order."""
    *lead, T, HS = q.shape
    a = np.broadcast_to(q[..., :, None, :], (*lead, T, T, HS)).reshape(-1, HS)
    b = np.broadcast_to(k[..., None, :, :], (*lead, T, T, HS)).reshape(-1, HS)
    return dot(p, a, b).reshape(*lead, T, T)


def _rows(p, x):
    """Row sums of x [R, N] in p's order."""
    if x.shape[-1] == 0:
        return np.zeros(x.shape[:-1], F32)
    return p.start(p.order(np.ascontiguousarray(x).reshape(-1, x.shape[-1]))).reshape(x.shape[:-1])


# ---- the op models: (inputs..., p) -> outputs -------------------------------------------


def _exp_rows(x, p):
    m = p.shift(x)
    e = p.exp(sub(x, m[..., None]))
    return m, e, _rows(p, e)


def softmax_forward(x, p):
    """[softmax.fwd.c1] y = exp(x - m) * recip(s)."""
    _, e, s = _exp_rows(x, p)
    return p.normalize(e, s)


def softmax_backward(dy, y, p):
    """[softmax.bwd.c1] d = sum of dy*y; dx = y * (dy - d)."""
    return p.sm_grad(dy, y, dot(p, dy, y), p)


def log_softmax_backward(dy, y, p):
    """[softmax.log.bwd.c1] g = sum of dy; dx = dy - exp(y)*g."""
    return msub(p, p.exp(y), _rows(p, dy)[..., None], dy)


def log_softmax_forward(x, p):
    """[softmax.log.c1] y = (x - m) - log(s)."""
    m, _, s = _exp_rows(x, p)
    return p.log_softmax(x, m, s, p)


def cross_entropy_forward(logits, targets, p):
    """[loss.token.c1] [loss.mean.c1] (losses, mean)."""
    m, e, s = _exp_rows(logits, p)
    n = np.arange(logits.shape[0])
    y = np.where(targets < 0, 0, targets)
    x_y = logits[n, y]
    lsm = p.log_softmax(logits, m, s, p)[n, y]
    losses = np.where(targets < 0, F32(0), p.token_loss(lsm, x_y, m, s, e[n, y], p)).astype(F32)
    counted = losses[targets >= 0]
    mean = p.mean(_rows(p, counted[None, :])[0], counted.size) if counted.size else F32(0)
    return losses, np.array([mean], F32).reshape(1)


def cross_entropy_backward(logits, targets, p):
    """[loss.bwd.c1] dlogits = (softmax - onehot) * recip(f32(count))."""
    g = softmax_forward(logits, p).copy()
    n = np.flatnonzero(targets >= 0)
    g[n, targets[n]] = sub(g[n, targets[n]], ONE)
    d = p.mean(g, max(n.size, 1))
    d[targets < 0] = F32(0)
    return d


def layernorm_forward(x, w, b, p):
    """[norm.layer.fwd.c1] (out, mean, rstd)."""
    mean, var = p.moments(x, p)
    rstd = p.rsqrt(add(var, EPS))
    return p.ln_affine(x, mean, rstd, w, b, p), mean, rstd


def layernorm_backward(dout, x, w, mean, rstd, p):
    """[norm.layer.bwd.c1] (dx, dw, db): dw, db the column sums over n of dout*norm and dout."""
    norm = mul(sub(x, mean[:, None]), rstd[:, None])
    dt, nt = np.ascontiguousarray(dout.T), np.ascontiguousarray(norm.T)
    return p.ln_grad(dout, x, w, mean, rstd, p), dot(p, dt, nt), _rows(p, dt)


def rmsnorm_backward(dout, x, w, rrms, p):
    """[norm.rms.bwd.c1] (dx, dw)."""
    nt = np.ascontiguousarray(mul(x, rrms[:, None]).T)
    return p.rms_grad(dout, x, w, rrms, p), dot(p, np.ascontiguousarray(dout.T), nt)


def adamw_update(p_, g, m, v, step, lr, p):
    """[optim.adamw.c1] [optim.adamw.bias.c1] (p', m', v') at t = step[0] with the op's fixed hyper-parameters."""
    return p.adamw(p_, g, m, v, int(np.asarray(step).reshape(-1)[0]), F32(np.asarray(lr).reshape(-1)[0]), p)


def rmsnorm_forward(x, w, p):
    """[norm.rms.fwd.c1] (out, rrms)."""
    rrms = p.rsqrt(add(p.mean(dot(p, x, x), x.shape[-1]), EPS))
    return p.rms_scale(x, rrms, w), rrms


def _gelu_u(x, p):
    a, b = p.gelu_cube(x)
    return mul(GELU_S, madd(p, a, b, x))


def _gelu_th(x, p):
    return p.tanh(_gelu_u(x, p))


def gelu_forward(x, p):
    """[act.gelu.fwd.c1] 0.5*x*(1 + tanh(S*(x + K*x^3)))."""
    return mul(mul(HALF, x), add(ONE, _gelu_th(x, p)))


def gelu_backward(dout, x, p):
    """[act.gelu.bwd.c1] dout * gelu'(x)."""
    u = _gelu_u(x, p)
    th = p.tanh(u)
    sech2 = p.sech2(u, th, p)
    dinner = mul(GELU_S, madd(p, mul(p.gelu_k3(), x), x, ONE))
    local = madd(p, mul(mul(HALF, x), sech2), dinner, mul(HALF, add(ONE, th)))
    return mul(dout, local)


def silu_forward(x, p):
    """[act.silu.fwd.c1] x * sigmoid(x)."""
    return p.silu(x, p)


def _dsilu_tail(x, s, p):
    return madd(p, x, sub(ONE, s), ONE)  # 1 + x*(1 - s)


def silu_backward(dout, x, p):
    """[act.silu.bwd.c1] dout * s*(1 + x*(1 - s))."""
    s = p.sigmoid(x)
    return p.grad_local(dout, s, _dsilu_tail(x, s, p))


def swiglu_forward(a, b, p):
    """[act.swiglu.fwd.c1] silu(a) * b."""
    return mul(p.silu(a, p), b)


def swiglu_backward(dout, a, b, p):
    """[act.swiglu.bwd.c1] (da, db) = ((dout*b) * silu'(a), dout * silu(a))."""
    s = p.sigmoid(a)
    return p.grad_local(mul(dout, b), s, _dsilu_tail(a, s, p)), mul(dout, p.silu(a, p))


def attention_forward(q, k, v, p):
    """[attn.scores.c1] [attn.mask.c1] [attn.out.c1] (out, att).  Masked
    positions become exp = +0 terms of a full-length row: every order but
    the length-dependent pairwise ones gives the prefix's bits."""
    T = q.shape[-2]
    z = p.att_scores(q, k, p)
    future = np.triu(np.ones((T, T), bool), 1)
    zm = np.where(future, F32(-np.inf), z).astype(F32)
    m = p.shift(zm)
    e = np.where(future, F32(0), p.exp(sub(zm, m[..., None]))).astype(F32)
    att = np.where(future, F32(0), p.normalize(e, _rows(p, e))).astype(F32)
    *lead, _, HS = v.shape
    # future terms are absent ([attn.mask.c1]): as -0 * +0 = -0 they change no sum in any order,
    # and no inf or NaN of a later v reaches an earlier row
    a = np.broadcast_to(np.where(future, F32(-0.0), att)[..., :, None, :], (*lead, T, HS, T)).reshape(-1, T)
    vt = np.swapaxes(v, -1, -2)
    b = np.where(future[:, None, :], F32(0), np.broadcast_to(vt[..., None, :, :], (*lead, T, HS, T)))
    return dot(p, a, b.reshape(-1, T)).reshape(v.shape), att


def _masked_sums(p, a, b, mask):
    """out[..., i, j] = the sum over n of a[..., i, n] * b[..., n, j] in p's
    order, terms where mask[i, n] absent (-0 * +0 products, which change no
    sum in any order but the length-dependent pairwise ones)."""
    *lead, I, N = a.shape
    J = b.shape[-1]
    am = np.broadcast_to(np.where(mask, F32(-0.0), a)[..., :, None, :], (*lead, I, J, N))
    bt = np.swapaxes(b, -1, -2)  # [..., J, N]
    bm = np.where(mask[:, None, :], F32(0), np.broadcast_to(bt[..., None, :, :], (*lead, I, J, N)))
    return dot(p, am.reshape(-1, N), bm.reshape(-1, N)).reshape(*lead, I, J)


def attention_backward(dout, q, k, v, att, p):
    """[attn.bwd.c1] (dq, dk, dv): dp = dout·vᵀ; dz = the softmax backward of
    dp with y = att ([softmax.bwd.c1]), times the scale; dq = dz·k over
    s <= t; dk = dzᵀ·q and dv = attᵀ·dout over t >= s, t increasing."""
    T, HS = q.shape[-2], q.shape[-1]
    future = np.triu(np.ones((T, T), bool), 1)  # [t, s]: s > t, no term anywhere
    dp = np.where(future, F32(-0.0), _scores(p, dout, v)).astype(F32)
    a = np.where(future, F32(0), att).astype(F32)
    c = dot(p, dp.reshape(-1, T), a.reshape(-1, T)).reshape(dp.shape[:-1])
    dz, post = p.att_dz_scale(p.sm_grad(dp, a, c, p), HS)
    dz = np.where(future, F32(0), dz).astype(F32)
    dq = post(_masked_sums(p, dz, k, future))
    dk = post(_masked_sums(p, np.swapaxes(dz, -1, -2), q, future.T))
    dv = _masked_sums(p, np.swapaxes(a, -1, -2), dout, future.T)
    return dq, dk, dv


def linear_forward(x, W, b, p):
    """[linear.fwd.c1] [mm.bias.c1] y = x·Wᵀ + b."""
    return p.bias(x, W, b, p)


def linear_backward(dy, x, W, p):
    """[linear.bwd.c1] dx = dy·W (o increasing), dW = dyᵀ·x and db = the
    column sums of dy (n increasing), every sum from -0."""
    N, OC = dy.shape
    C = x.shape[1]
    dx = dot(p, np.repeat(dy, C, 0), np.tile(np.ascontiguousarray(W.T), (N, 1))).reshape(N, C)
    dyt = np.ascontiguousarray(dy.T)
    dW = dot(p, np.repeat(dyt, C, 0), np.tile(np.ascontiguousarray(x.T), (OC, 1))).reshape(OC, C)
    return dx, dW, _rows(p, dyt)


def embedding_backward(dout, tokens, V, p):
    """[emb.bwd.c1] dwte[v] = the sum of dout at the positions of id v in
    increasing flat index; an id that never occurs gets +0."""
    C = dout.shape[-1]
    t = np.asarray(tokens).reshape(-1)
    d = dout.reshape(t.size, C)
    out = np.zeros((int(np.asarray(V).reshape(-1)[0]), C), F32)
    for v in np.unique(t) if C else ():
        idx = np.flatnonzero(t == v)
        out[v] = _rows(p, np.ascontiguousarray(d[idx].T))
    return out


def rope_forward(x, cos_t, sin_t, p):
    """[rope.fwd.c1] the rotation of each channel pair by the table's angle."""
    a, b, join = p.rope_pairs(np.asarray(x, F32))
    return join(*p.rope_rotate(a, b, cos_t, p.rope_sin(sin_t), p))


def rope_backward(dout, cos_t, sin_t, p):
    """[rope.bwd.c1] the transposed rotation: the forward's with the sine negated."""
    a, b, join = p.rope_pairs(np.asarray(dout, F32))
    return join(*p.rope_rotate(a, b, cos_t, np.negative(p.rope_sin(sin_t)), p))


def quant_step_size(x, p):
    """[quant.step.c1] s = max |x| * recip(127), floored."""
    return np.array([p.q_floor(p.q_step(p.q_absmax(x)))], F32)


def _codes(x, s, p):
    """[quant.quantize.c1] the unsaturated codes v = rint(x * recip(s)) and the range."""
    with np.errstate(all="ignore"):
        v = p.q_round(p.q_scale(np.asarray(x, F32), np.asarray(s, F32).reshape(-1)[0]))
    return v, p.q_range(v)


def fake_quantize(x, s, p):
    """[quant.quantize.c1] [quant.dequantize.c1] f32(saturate_i8(v)) * s."""
    v, (lo, hi) = _codes(x, s, p)
    q = np.where(np.isnan(v), p.q_nan(lo), np.clip(v, lo, hi)).astype(F32) + F32(0.0)  # an int8 code has no -0
    return mul(q, np.asarray(s, F32).reshape(-1)[0])


def fake_quantize_backward(dy, x, s, p):
    """[quant.ste.c1] dy where lo <= v <= hi, +0 elsewhere (NaN v included)."""
    v, (lo, hi) = _codes(x, s, p)
    with np.errstate(invalid="ignore"):
        keep = (v >= lo) & (v <= hi)
    return p.q_ste(np.asarray(dy, F32), keep)


@dataclass(frozen=True)
class Model:
    fn: Callable
    parts: tuple[str, ...]  # the Parts fields the op's spec algorithm reads
    pair_only: tuple[str, ...] = ()  # fields read only by a deviant part: tried in pairs only


# "start" only where a sum of the spec's algorithm can be -0 (a sum of x, of x*W, of att*v): a sum of
# exps, squares or losses never is, and a +0 start changes no bit there
_SOFTMAX = ("exp", "order", "normalize", "shift")
MODELS = {
    "softmax_forward": Model(softmax_forward, _SOFTMAX),
    "log_softmax_forward": Model(log_softmax_forward, ("exp", "log", "order", "shift", "log_softmax")),
    "cross_entropy_forward": Model(
        cross_entropy_forward, ("exp", "log", "order", "shift", "token_loss", "mean"), pair_only=("log_softmax",)
    ),
    "cross_entropy_backward": Model(cross_entropy_backward, _SOFTMAX + ("mean",)),
    "layernorm_forward": Model(layernorm_forward, ("order", "start", "fma", "mean", "rsqrt", "moments", "ln_affine")),
    "rmsnorm_forward": Model(rmsnorm_forward, ("order", "fma", "mean", "rsqrt", "rms_scale")),
    "gelu_forward": Model(gelu_forward, ("tanh", "fma", "gelu_cube")),
    "gelu_backward": Model(gelu_backward, ("tanh", "fma", "gelu_cube", "gelu_k3", "sech2")),
    "silu_forward": Model(silu_forward, ("sigmoid", "silu"), pair_only=("exp",)),
    "silu_backward": Model(silu_backward, ("sigmoid", "fma", "grad_local")),
    "swiglu_forward": Model(swiglu_forward, ("sigmoid", "silu"), pair_only=("exp",)),
    "swiglu_backward": Model(swiglu_backward, ("sigmoid", "fma", "silu", "grad_local"), pair_only=("exp",)),
    "attention_forward": Model(attention_forward, _SOFTMAX + ("start", "fma", "att_scores")),
    "attention_backward": Model(attention_backward, ("order", "start", "fma", "sm_grad", "att_dz_scale")),
    "linear_forward": Model(linear_forward, ("order", "start", "fma", "bias")),
    "linear_backward": Model(linear_backward, ("order", "start", "fma")),
    "embedding_backward": Model(embedding_backward, ("order", "start")),
    "softmax_backward": Model(softmax_backward, ("order", "start", "fma", "sm_grad")),
    "log_softmax_backward": Model(log_softmax_backward, ("exp", "order", "start", "fma")),
    "layernorm_backward": Model(layernorm_backward, ("order", "start", "fma", "mean", "ln_grad")),
    "rmsnorm_backward": Model(rmsnorm_backward, ("order", "start", "fma", "mean", "rms_grad")),
    "adamw_update": Model(adamw_update, ("fma", "adam_pow", "adam_ratio", "adam_decay", "adamw")),
    "rope_forward": Model(rope_forward, ("fma", "rope_pairs", "rope_rotate", "rope_sin")),
    "rope_backward": Model(rope_backward, ("fma", "rope_pairs", "rope_rotate", "rope_sin")),
    "quant_step_size": Model(quant_step_size, ("q_absmax", "q_step", "q_floor")),
    "fake_quantize": Model(fake_quantize, ("q_scale", "q_round", "q_range", "q_nan")),
    # x / s in the mask: the edge cases at 127.5 s and -128.5 s separate it ([quant.ste.c1])
    "fake_quantize_backward": Model(fake_quantize_backward, ("q_scale", "q_round", "q_range", "q_ste")),
}


def _bf16_model(op: str, model: Model) -> Model:
    """[bf16.ops.c1] bf16_<op>: the binary32 model between the conversions
    (bf16 inputs widened after loading, bf16 outputs rounded and held in
    binary32), so every deviation of the binary32 op is tried in the profile."""
    from ...ops.bf16 import PROFILE
    from ..base.bf16 import loaded, round_f32

    kin, kout = PROFILE[op]

    def fn(*args):
        *inputs, p = args
        out = model.fn(*[loaded(x) if k == "h" else x for k, x in zip(kin, inputs)], p)
        outs = tuple(
            round_f32(np.asarray(o, F32)) if k == "h" else o
            for k, o in zip(kout, out if isinstance(out, tuple) else (out,))
        )
        return outs if len(outs) > 1 else outs[0]

    return Model(fn, model.parts, model.pair_only)


def _bf16_models() -> dict:
    from ...ops.bf16 import PROFILE

    return {f"bf16_{op}": _bf16_model(op, m) for op, m in MODELS.items() if op in PROFILE}


MODELS.update(_bf16_models())


# ---- deviations: one part swapped ---------------------------------------------------------


@dataclass(frozen=True)
class Deviation:
    name: str
    part: str
    value: object
    clauses: tuple[str, ...]


ORDER_NAMES = (
    "reversed",
    "pairwise tree (recursive halves)",
    "blocked/split-k, blocks of 4",
    "blocked/split-k, blocks of 8",
    "blocked/split-k, blocks of 16",
    "4 strided lanes + butterfly (SIMD/warp)",
    "8 strided lanes + butterfly (SIMD/warp)",
    "16 strided lanes + butterfly (SIMD/warp)",
    "NumPy pairwise (8 accumulators, blocks of 128)",
)


def _fn(name, part, value, *clauses):
    return Deviation(name, part, value, clauses)


def _deviations() -> list[Deviation]:
    out = [
        _fn("vendor exp (np.exp)", "exp", vendor_exp, "num.exp.c1"),
        _fn("correctly rounded exp", "exp", rounded_exp, "num.exp.c1"),
        _fn("vendor log (np.log)", "log", vendor_log, "num.log.c1"),
        _fn("correctly rounded log", "log", rounded_log, "num.log.c1"),
        _fn("vendor tanh (np.tanh)", "tanh", vendor_tanh, "num.tanh.c1"),
        _fn("correctly rounded tanh", "tanh", rounded_tanh, "num.tanh.c1"),
        _fn("vendor sigmoid 1/(1 + np.exp(-x))", "sigmoid", vendor_sigmoid, "num.sigmoid.c1"),
        _fn("correctly rounded sigmoid", "sigmoid", rounded_sigmoid, "num.sigmoid.c1"),
        _fn("fused multiply-add", "fma", True, "num.nofma.c1"),
        _fn("means divided by the count", "mean", mean_by_division, "norm.meanop.c1", "loss.mean.c1"),
        _fn("rsqrt rounded once", "rsqrt", rsqrt_rounded_once, "num.sqrt.c1", "num.recip.c1"),
        _fn("division by the row sum", "normalize", divide_by_sum, "softmax.fwd.c1", "num.recip.c1"),
        _fn("no max subtraction", "shift", no_max_shift, "softmax.fwd.c1"),
        _fn("log-softmax as x - (m + log s)", "log_softmax", minus_logsumexp, "softmax.log.c1"),
        _fn("log-softmax as log(softmax)", "log_softmax", log_of_softmax, "softmax.log.c1"),
        _fn("loss as the negated log-softmax", "token_loss", negated_log_softmax, "loss.token.c1"),
        _fn(
            "loss as -log(e/s) (the log of the probability)",
            "token_loss",
            minus_log_probability,
            "loss.token.c1",
            "num.recip.c1",
        ),
        _fn("sech² as 1/cosh² (correctly rounded cosh)", "sech2", sech2_by_rounded_cosh, "act.gelu.bwd.c1"),
        _fn("variance as E[x²] - E[x]²", "moments", one_pass_moments, "norm.layer.fwd.c1"),
        _fn("Welford mean and variance", "moments", welford_moments, "norm.layer.fwd.c1", "norm.meanop.c1"),
        _fn("affine folded into x*scale + shift", "ln_affine", folded_scale_shift, "norm.layer.fwd.c1"),
        _fn("x*(rrms*w)", "rms_scale", weight_folded_into_rrms, "norm.rms.fwd.c1"),
        _fn("cube as K*(x*x*x)", "gelu_cube", cube_then_constant, "act.gelu.fwd.c1"),
        _fn("K3 = 3*K", "gelu_k3", k3_as_product, "act.gelu.bwd.c1"),
        _fn("SiLU as x / (1 + exp(-x))", "silu", silu_by_division, "act.silu.fwd.c1"),
        _fn("gradient times s first", "grad_local", grad_times_s_first, "act.silu.bwd.c1"),
        _fn("q scaled before the dot", "att_scores", scale_q_first, "attn.scores.c1"),
        _fn("scores divided by sqrt(HS)", "att_scores", divide_by_sqrt_hs, "attn.scores.c1", "num.recip.c1"),
        _fn("dz divided by sqrt(HS)", "att_dz_scale", dz_divided_by_sqrt_hs, "attn.bwd.c1", "num.recip.c1"),
        _fn(
            "scale applied to dq and dk after their sums (FlashAttention's form)",
            "att_dz_scale",
            scale_after_the_sums,
            "attn.bwd.c1",
        ),
        _fn("bias as the sum's first term", "bias", bias_as_first_term, "mm.bias.c1"),
        _fn("sums started from +0 (not -0)", "start", plus_zero_start, "red.sum.c1", "red.start.r1"),
        _fn("softmax gradient as y*dy - y*d", "sm_grad", softmax_grad_distributed, "softmax.bwd.c1"),
        _fn(
            "LayerNorm dx from x (PyTorch's CPU form rstd*dnorm + b*x + c)",
            "ln_grad",
            ln_grad_from_x,
            "norm.layer.bwd.c1",
        ),
        _fn("RMSNorm dx from x: rrms*dnorm - x*(rrms^3*mean(dnorm*x))", "rms_grad", rms_grad_from_x, "norm.rms.bwd.c1"),
        _fn("beta^t in float64, rounded once", "adam_pow", powers_in_float64, "optim.adamw.bias.c1"),
        _fn("update as m_hat / (sqrt(v_hat) + eps)", "adam_ratio", ratio_by_division, "optim.adamw.c1", "num.recip.c1"),
        _fn("eps inside the square root", "adam_ratio", ratio_eps_inside, "optim.adamw.c1"),
        _fn("weight decay as p*(1 - lr*wd) before the step", "adam_decay", decay_then_step, "optim.adamw.c1"),
        _fn("torch.optim.AdamW's formula", "adamw", adamw_torch_formula, "optim.adamw.c1", "optim.adamw.bias.c1"),
        _fn("interleaved pairs (2i, 2i+1) (GPT-J's layout)", "rope_pairs", interleaved_pairs, "rope.fwd.c1"),
        _fn("rotation in float64, rounded once", "rope_rotate", rotate_in_float64, "rope.fwd.c1", "rope.bwd.c1"),
        _fn("subnormals kept (no flush)", "rope_rotate", rotate_keeping_subnormals, "num.flush.c1"),
        _fn("rotation the other way (sine negated)", "rope_sin", sin_negated, "rope.fwd.c1", "rope.bwd.c1"),
        _fn("absmax by C fmaxf (NaNs skipped)", "q_absmax", absmax_ignoring_nan, "quant.step.c1", "num.minmax.c1"),
        _fn("step as absmax / 127", "q_step", step_by_division, "quant.step.c1", "num.recip.c1"),
        _fn("no step floor (an all-zero tensor gets s = 0)", "q_floor", step_unfloored, "quant.step.c1"),
        _fn("x divided by the step", "q_scale", scaled_by_division, "quant.quantize.c1", "num.recip.c1"),
        _fn("round half away from zero (C roundf)", "q_round", round_half_away, "quant.quantize.c1", "num.rint.c1"),
        _fn("symmetric codes [-127, 127]", "q_range", codes_symmetric, "quant.quantize.c1", "num.sat.c1"),
        _fn("NaN as the lowest code (-128)", "q_nan", nan_code_lowest, "quant.quantize.c1", "num.sat.c1"),
        _fn("gradient times a 0/1 mask", "q_ste", ste_times_mask, "quant.ste.c1"),
    ]
    if _libm("expf") is not None:  # the C library's functions, where one can be loaded
        out += [
            _fn("libm expf (the C library's exp)", "exp", libm_exp, "num.exp.c1"),
            _fn("libm logf (the C library's log)", "log", libm_log, "num.log.c1"),
            _fn("libm tanhf (the C library's tanh)", "tanh", libm_tanh, "num.tanh.c1"),
            _fn("sech² as 1/coshf² (the C library's coshf)", "sech2", sech2_by_libm_cosh, "act.gelu.bwd.c1"),
        ]
    by_name = {o.name: o for o in orders.candidates(False)}
    out += [_fn(f"sums {'in ' if n[0].isdigit() else ''}{n}", "order", by_name[n], "red.sum.c1") for n in ORDER_NAMES]
    return out


DEVIATIONS = _deviations()


def deviations(op: str, pair_only=False) -> list[Deviation]:
    """The single deviations that touch a part the op's spec algorithm reads
    (with ``pair_only``: a part only a deviant part reads)."""
    used = MODELS[op].pair_only if pair_only else MODELS[op].parts
    return [d for d in DEVIATIONS if d.part in used]


def parts(devs) -> Parts:
    return replace(SPEC, **{d.part: d.value for d in devs})


def evaluate(op: str, inputs, devs=()) -> tuple[np.ndarray, ...]:
    """The op's outputs on loaded inputs with the deviations applied."""
    with np.errstate(all="ignore"):
        out = MODELS[op].fn(*inputs, parts(devs))
    # every NaN canonical ([num.nan.c1]): a variant changes arithmetic, not the NaN rule
    return tuple(
        np.where(np.isnan(o), fp.f32(fp.CANONICAL_NAN), o).astype(F32)
        for o in (np.asarray(o, F32) for o in (out if isinstance(out, tuple) else (out,)))
    )


def variants(op: str, pairs=True):
    """Every single deviation, then (with ``pairs``) every pair touching two
    parts, pair-only deviations included."""
    singles = deviations(op)
    yield from ((d,) for d in singles)
    if pairs:
        both = singles + deviations(op, pair_only=True)
        yield from ((a, b) for a, b in itertools.combinations(both, 2) if a.part != b.part)


# ---- explaining a kernel's outputs -------------------------------------------------------


def differing(outputs, actual) -> np.ndarray | None:
    """Per element of every float32 output (concatenated): True where the
    bits differ (two NaNs agree); None if a shape or dtype differs.  An
    ``actual`` of None is an output not held, and not compared."""
    masks = []
    for e, a in zip(outputs, actual):
        if a is None:  # an output the case does not hold (a slice of a larger case)
            continue
        e, a = np.asarray(e, F32).ravel(), np.asarray(a).ravel()
        if a.dtype != F32 or a.shape != e.shape:
            return None
        masks.append((fp.bits(e) != fp.bits(a)) & ~(np.isnan(e) & np.isnan(a)))
    return np.concatenate(masks) if masks else np.zeros(0, bool)


@dataclass
class Tally:
    """How far one variant goes towards a kernel's outputs."""

    explained: int  # elements where the spec's algorithm differs from the kernel and the variant does not
    spec_differ: int  # elements where the spec's algorithm differs from the kernel
    differ: int  # elements where the variant differs from the kernel
    max_ulp: int  # the largest ulp distance among those (2^32: NaN against a number)

    @property
    def exact(self) -> bool:
        return self.differ == 0


def tally(op: str, cases, variant=()) -> Tally:
    """``cases``: [(loaded inputs, kernel outputs)]; the variant scored element by element."""
    explained = spec_differ = differ = worst = 0
    for inputs, actual in cases:
        ref = evaluate(op, inputs)
        var = evaluate(op, inputs, variant) if variant else ref
        s, v = differing(ref, actual), differing(var, actual)
        if s is None or v is None:
            return Tally(0, 1 << 62, 1 << 62, 1 << 32)
        explained += int((s & ~v).sum())
        spec_differ += int(s.sum())
        differ += int(v.sum())
        worst = max(worst, distance(var, actual)[1])
    return Tally(explained, spec_differ, differ, worst)


def distance(outputs, actual) -> tuple[int, int]:
    """(elements whose bits differ, max ulp distance among them; NaN vs
    non-NaN counts as 2^32) over every float32 output."""
    n, worst = 0, 0
    for e, a in zip(outputs, actual):
        if a is None:  # an output the case does not hold
            continue
        e, a = np.asarray(e, F32).ravel(), np.asarray(a).ravel()
        if a.dtype != F32 or a.shape != e.shape:
            return 1 << 62, 1 << 32
        diff = (fp.bits(e) != fp.bits(a)) & ~(np.isnan(e) & np.isnan(a))
        n += int(diff.sum())
        if diff.any():
            d = fp.ulp_distance(e[diff], a[diff])
            worst = max(worst, int(np.where(d < 0, 1 << 32, d).max()))
    return n, worst


@dataclass
class Explanation:
    matches: list[tuple[Deviation, ...]]  # variants reproducing every case exactly
    closest: tuple[Deviation, ...] | None  # else the nearest variant, if nearer than the spec
    differ: int  # the closest variant's differing elements
    max_ulp: int
    spec_differ: int  # the spec's own algorithm's
    total: int  # elements compared
    cases: int


def name(variant) -> str:
    return " + ".join(d.name for d in variant)


def explain(op: str, cases) -> Explanation:
    """``cases``: [(loaded inputs, kernel outputs)].  Every single deviation is
    scored on every case; pairs only if no single reproduces them all.  With
    no exact match, the closest variant ([conf.diagnosis.r1]) is the one
    with the fewest differing elements (the
    most explained on a tie), and only if that is fewer than the spec's
    algorithm leaves (it explains more than it breaks); None if there is none."""
    spec_masks = [differing(evaluate(op, i), a) for i, a in cases]

    def score(v):
        n = worst = explained = 0
        for (i, a), s in zip(cases, spec_masks):
            out = evaluate(op, i, v)
            d, u = distance(out, a)
            m = differing(out, a)
            n, worst = n + d, max(worst, u)
            explained += 0 if m is None or s is None else int((s & ~m).sum())
        return n, worst, explained

    total = sum(int(sum(np.size(a) for a in act if a is not None)) for _, act in cases)
    spec = score(())
    if spec[0] == 0:  # the spec's algorithm itself reproduces them: nothing to explain
        return Explanation([], None, 0, 0, 0, total, len(cases))
    scored = []
    for pairs in (False, True):
        scored += [(score(v), v) for v in variants(op, pairs) if len(v) == 1 + pairs]
        exact = [v for s, v in scored if s[0] == 0]
        if exact:
            return Explanation(exact, None, 0, 0, spec[0], total, len(cases))
    # a variant that changes more of the kernel's right elements than it explains is nearer to nothing
    nearer = [sv for sv in scored if sv[0][2] > 0 and sv[0][0] < spec[0]]
    (differ, ulp, explained), best = min(nearer, key=lambda sv: (sv[0][0], -sv[0][2]), default=(spec, None))
    if best is None:
        return Explanation([], None, spec[0], spec[1], spec[0], total, len(cases))
    return Explanation([], best, differ, ulp, spec[0], total, len(cases))
