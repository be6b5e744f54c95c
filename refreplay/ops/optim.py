"""Optimizer update: AdamW, global gradient-norm clipping and the
learning-rate schedule ([optim.state.c1], [optim.adamw.c1],
[optim.adamw.bias.c1], [optim.clip.c1], [optim.lr.c1]).

A model's state is flat: ``dict[str, np.ndarray]`` of float32 arrays, one
entry per parameter, with gradients and the two AdamW moments in dicts of the
same names and shapes.  Anything that depends on the order of tensors walks
the names in sorted order (Python ``sorted`` on ``str``: by code point).

``adamw_step`` and ``clip_grad_norm`` update their arrays in place (as a
training loop does; ``adamw_step`` writes into given arrays with ``out``);
every other function, ``adamw_update`` included, returns new values.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np
from numba import prange

from .._jit import kernel, parallel_kernel
from .._shares import in_shares
from ..linalg.common import sum_start
from ..numerics.core import F32, HALF, ONE, add, fmin, mul, recip, sqrt, sub
from ..numerics.elementwise import block_range, n_blocks, run_elementwise
from ..numerics.transcendental import cos  # [num.sincos.c1]
from . import check_scalar_f32

CLIP_EPS = np.float32(1e-6)  # f32(0x358637BD), [optim.clip.c1]
PI = np.float32(np.pi)  # f32(0x40490FDB), the binary32 nearest to pi, [optim.lr.c1]
_MAX_STEP = 1 << 24  # a step number converts to binary32 exactly up to 2**24
SCHEDULES = ("cosine", "linear", "constant")


@dataclass(frozen=True)
class AdamW:
    """AdamW hyper-parameters as binary32 ([optim.adamw.c1]).  Defaults:
    beta1 f32(0x3F666666) ~ 0.9, beta2 f32(0x3F733333) ~ 0.95,
    eps f32(0x322BCC77) ~ 1e-8, weight_decay f32(0x3DCCCCCD) ~ 0.1."""

    beta1: np.float32 = np.float32(0.9)
    beta2: np.float32 = np.float32(0.95)
    eps: np.float32 = np.float32(1e-8)
    weight_decay: np.float32 = np.float32(0.1)

    def __post_init__(self):
        for name in ("beta1", "beta2", "eps", "weight_decay"):
            object.__setattr__(self, name, check_scalar_f32(name, getattr(self, name)))


# ---- AdamW -----------------------------------------------------------------


# Scalar kernels carry explicit signatures: a Python float passed to them is
# converted to binary32 first, never evaluated in binary64.
@kernel("UniTuple(float32, 2)(float32, float32, int64)")
def adamw_bias_corrections(beta1, beta2, t):
    """[optim.adamw.bias.c1] (recip(1 - beta1^t), recip(1 - beta2^t)) for step
    t >= 1, the powers formed by t-1 sequential multiplications from beta."""
    pow1 = beta1
    pow2 = beta2
    for _ in range(t - 1):
        pow1 = mul(pow1, beta1)
        pow2 = mul(pow2, beta2)
    return recip(sub(ONE, pow1)), recip(sub(ONE, pow2))


@kernel(inline="always")
def adamw_element(p_i, g_i, m_i, v_i, lr, beta1, beta2, eps, wd, rbc1, rbc2, one_minus_beta1, one_minus_beta2):
    """[optim.adamw.c1] The update of one element: (p', m', v')."""
    m_i = add(mul(beta1, m_i), mul(one_minus_beta1, g_i))
    v_i = add(mul(beta2, v_i), mul(mul(one_minus_beta2, g_i), g_i))
    m_hat = mul(m_i, rbc1)
    v_hat = mul(v_i, rbc2)
    update = mul(m_hat, recip(add(sqrt(v_hat), eps)))
    return sub(p_i, mul(lr, add(update, mul(wd, p_i)))), m_i, v_i


@kernel
def adamw_kernel(p, g, m, v, lr, beta1, beta2, eps, wd, rbc1, rbc2):
    """[optim.adamw.c1] One AdamW update of one tensor, elementwise.

    p, m, v: [N] updated in place; g: [N] read.  lr, beta1, beta2, eps, wd,
    rbc1, rbc2: binary32 scalars.  One thread; ``adamw_blocks`` runs it in
    parallel over blocks (elements are independent).
    """
    one_minus_beta1 = sub(ONE, beta1)
    one_minus_beta2 = sub(ONE, beta2)
    for i in range(p.shape[0]):
        p[i], m[i], v[i] = adamw_element(
            p[i], g[i], m[i], v[i], lr, beta1, beta2, eps, wd, rbc1, rbc2, one_minus_beta1, one_minus_beta2
        )


@kernel
def adamw_into_kernel(p, g, m, v, lr, beta1, beta2, eps, wd, rbc1, rbc2, p_out, m_out, v_out):
    """adamw_kernel with p, m, v only read and the updated values written to
    p_out, m_out, v_out (which must not overlap any input).  A separate loop:
    with out = p the compiler's run-time overlap test fails and the loop runs
    one element at a time (measured: 30x slower than in place)."""
    one_minus_beta1 = sub(ONE, beta1)
    one_minus_beta2 = sub(ONE, beta2)
    for i in range(p.shape[0]):
        p_out[i], m_out[i], v_out[i] = adamw_element(
            p[i], g[i], m[i], v[i], lr, beta1, beta2, eps, wd, rbc1, rbc2, one_minus_beta1, one_minus_beta2
        )


@parallel_kernel
def adamw_blocks(p, g, m, v, lr, beta1, beta2, eps, wd, rbc1, rbc2):
    """[optim.adamw.c1] adamw_kernel in parallel over blocks of
    elementwise.BLOCK elements; same arguments."""
    for k in prange(n_blocks(p.shape[0])):
        i0, i1 = block_range(k, p.shape[0])
        adamw_kernel(p[i0:i1], g[i0:i1], m[i0:i1], v[i0:i1], lr, beta1, beta2, eps, wd, rbc1, rbc2)


@parallel_kernel
def adamw_into_blocks(p, g, m, v, lr, beta1, beta2, eps, wd, rbc1, rbc2, p_out, m_out, v_out):
    """[optim.adamw.c1] adamw_into_kernel in parallel over blocks; same arguments."""
    for k in prange(n_blocks(p.shape[0])):
        i0, i1 = block_range(k, p.shape[0])
        ins = (p[i0:i1], g[i0:i1], m[i0:i1], v[i0:i1])
        adamw_into_kernel(*ins, lr, beta1, beta2, eps, wd, rbc1, rbc2, p_out[i0:i1], m_out[i0:i1], v_out[i0:i1])


def adamw_init(params: dict) -> tuple[dict, dict]:
    """[optim.state.c1] The moments before step 1: (m, v), zeros (+0) shaped
    like each parameter."""
    m = {k: np.zeros_like(params[k]) for k in sorted(params)}
    v = {k: np.zeros_like(params[k]) for k in sorted(params)}
    return m, v


def _check_state(params, **others):
    if not isinstance(params, dict):
        raise TypeError("params must be a dict of name -> float32 array")
    for k in sorted(params):
        a = params[k]
        if not isinstance(a, np.ndarray) or a.dtype != np.float32 or not a.flags.c_contiguous:
            raise TypeError(f"params[{k!r}] must be a C-contiguous float32 array")
    for dname, d in others.items():
        if not isinstance(d, dict) or sorted(d) != sorted(params):
            raise ValueError(f"{dname} must have exactly the names of params")
        for k in sorted(params):
            a = d[k]
            if not isinstance(a, np.ndarray) or a.dtype != np.float32 or not a.flags.c_contiguous:
                raise TypeError(f"{dname}[{k!r}] must be a C-contiguous float32 array")
            if a.shape != params[k].shape:
                raise ValueError(f"{dname}[{k!r}] has shape {a.shape}, params has {params[k].shape}")


def _check_step(step) -> int:
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or not 1 <= step <= _MAX_STEP:
        raise ValueError(f"step must be an integer in [1, 2**24], got {step!r}")
    return int(step)


def adamw_update(p, g, m, v, step: int, lr, hp: AdamW = AdamW(), decay: bool = True):
    """[optim.adamw.c1] One tensor's AdamW update as new arrays:
    (p, g, m, v of one shape) -> (p', m', v').  ``decay=False`` uses weight
    decay +0.  The arithmetic of ``adamw_step``, without the in-place write."""
    p, m, v = (np.ascontiguousarray(a) for a in (p, m, v))  # read only: any layout, as a copy took them
    p2, m2, v2 = (np.empty(a.shape, np.float32) for a in (p, m, v))
    adamw_step(
        {"t": p},
        {"t": g},
        {"t": m},
        {"t": v},
        step=step,
        lr=lr,
        hp=hp,
        no_decay=frozenset() if decay else frozenset({"t"}),
        out=({"t": p2}, {"t": m2}, {"t": v2}),
    )
    return p2, m2, v2


def adamw_step(
    params: dict,
    grads: dict,
    m: dict,
    v: dict,
    *,
    step: int,
    lr,
    hp: AdamW = AdamW(),
    no_decay=frozenset(),
    out: tuple | None = None,
) -> None:
    """[optim.adamw.c1] Update ``params``, ``m``, ``v`` in place from ``grads``,
    or with ``out`` = (params', m', v') write the updated state there (dicts
    of the same names and shapes, every element overwritten) and leave the
    inputs as they are: one pass where a copy and then an update in place
    would be two (a trainer that keeps the old state).

    ``step`` is the 1-based number of this update (t of the bias corrections,
    [optim.adamw.bias.c1]); ``lr`` the binary32 learning rate of this step
    (from ``lr_at``); tensors named in ``no_decay`` use weight decay +0.
    Tensors are updated in sorted name order ([optim.state.c1]).
    """
    _check_state(params, grads=grads, m=m, v=v)
    if out is not None:
        if not isinstance(out, tuple) or len(out) != 3:
            raise TypeError("out must be a tuple (params, m, v) of dicts or None")
        _check_state(params, **dict(zip(("out params", "out m", "out v"), out)))
        _disjoint(out, (params, grads, m, v))
    t = _check_step(step)
    lr = check_scalar_f32("lr", lr)
    if not isinstance(hp, AdamW):
        raise TypeError(f"hp must be an AdamW, got {type(hp).__name__}")
    unknown = set(no_decay) - set(params)
    if unknown:
        raise ValueError(f"no_decay names unknown parameters: {sorted(unknown)}")
    rbc1, rbc2 = adamw_bias_corrections(hp.beta1, hp.beta2, t)
    rbc1, rbc2 = np.float32(rbc1), np.float32(rbc2)  # Numba returns Python floats (exact)
    for k in sorted(params):
        wd = np.float32(0.0) if k in no_decay else hp.weight_decay
        args = [d[k].reshape(-1) for d in (params, grads, m, v)] + [lr, hp.beta1, hp.beta2, hp.eps, wd, rbc1, rbc2]
        if out is None:
            run_elementwise(adamw_kernel, adamw_blocks, params[k].size, *args)
        else:
            outs = [d[k].reshape(-1) for d in out]
            run_elementwise(adamw_into_kernel, adamw_into_blocks, params[k].size, *args, *outs)


def _disjoint(outs, ins) -> None:
    """Refuse output arrays that share memory with an input or with each
    other (the kernel reads its inputs while it writes; an output in another
    tensor's input would change that tensor's update).  The arrays are
    C-contiguous, so each is the byte range [address, address + nbytes);
    the ranges are sorted once and neighbours compared."""
    spans = []
    for kind, group in ((1, outs), (0, ins)):
        for d in group:
            for k in sorted(d):
                a = d[k]
                if a.nbytes:
                    start = a.__array_interface__["data"][0]
                    spans.append((start, start + a.nbytes, kind, k))
    spans.sort()
    reach = None  # the span reaching furthest so far
    for span in spans:
        if reach is not None and span[0] < reach[1] and (span[2] or reach[2]):
            out_k = span[3] if span[2] else reach[3]
            raise ValueError(f"out: the array for {out_k!r} overlaps another input or output array")
        if reach is None or span[1] > reach[1]:
            reach = span


# ---- global gradient-norm clipping -------------------------------------------


@kernel("float32(float32[::1])")
def sum_of_squares(g):
    """[optim.clip.c1] step 1: sum over i increasing of mul(g[i], g[i]) from
    the start of [red.sum.c1].  g: [N] read."""
    s = sum_start(g.shape[0])
    for i in range(g.shape[0]):
        s = add(s, mul(g[i], g[i]))
    return s


@kernel("UniTuple(float32, 2)(float32[::1], float32)")
def clip_coefficient(partials, max_norm):
    """[optim.clip.c1] steps 2-4: partials [M] (one per tensor, sorted name
    order) -> (norm, coef) with norm = sqrt(sum of partials in order) and
    coef = mul(max_norm, recip(add(norm, 1e-6)))."""
    total = sum_start(partials.shape[0])
    for k in range(partials.shape[0]):
        total = add(total, partials[k])
    norm = sqrt(total)
    return norm, mul(max_norm, recip(add(norm, CLIP_EPS)))


@kernel
def scale_kernel(g, coef):
    """[optim.clip.c1] step 5: g[i] = mul(g[i], coef), in place.  g: [N]."""
    for i in range(g.shape[0]):
        g[i] = mul(g[i], coef)


@parallel_kernel
def scale_blocks(g, coef):
    """[optim.clip.c1] scale_kernel in parallel over blocks of elementwise.BLOCK elements."""
    for k in prange(n_blocks(g.shape[0])):
        i0, i1 = block_range(k, g.shape[0])
        scale_kernel(g[i0:i1], coef)


def clip_grad_norm(grads: dict, max_norm) -> tuple[np.float32, np.float32]:
    """[optim.clip.c1] Global-norm clipping of ``grads``, in place.

    Returns (norm, coef) as binary32.  The gradients were scaled by coef if
    and only if coef < 1 (never when the norm is NaN).
    """
    _check_state(grads)
    max_norm = check_scalar_f32("max_norm", max_norm)
    names = sorted(grads)
    flat = [grads[k].reshape(-1) for k in names]
    partials = np.empty(len(names), dtype=np.float32)

    def partial(j):  # one tensor's sum, in its own order; the tensors are independent
        partials[j] = sum_of_squares(flat[j])

    in_shares(partial, [g.size for g in flat], numba.get_num_threads())
    norm, coef = clip_coefficient(partials, max_norm)
    norm, coef = np.float32(norm), np.float32(coef)
    if coef < np.float32(1.0):
        for k in names:
            run_elementwise(scale_kernel, scale_blocks, grads[k].size, grads[k].reshape(-1), coef)
    return norm, coef


# ---- learning-rate schedule ------------------------------------------------------


@kernel("float32(int64, int64, int64, float32, float32, int64)")
def lr_kernel(t, warmup, total, lr_max, lr_min, kind):
    """[optim.lr.c1] The learning rate of step t (1-based).  kind: 0 cosine,
    1 linear, 2 constant.  Integers t, warmup, total; binary32 lr_max, lr_min."""
    if t <= warmup:
        return mul(lr_max, mul(F32(t), recip(F32(warmup))))
    if kind == 2:
        return lr_max
    progress = fmin(mul(F32(t - warmup), recip(F32(total - warmup))), ONE)
    if kind == 0:
        coeff = mul(HALF, add(ONE, cos(mul(PI, progress))))
    else:
        coeff = sub(ONE, progress)
    return add(lr_min, mul(coeff, sub(lr_max, lr_min)))


def lr_at(step: int, warmup: int, total: int, lr_max, lr_min, kind: str = "cosine") -> np.float32:
    """[optim.lr.c1] Learning rate of update ``step`` (1-based) as binary32:
    linear warmup over ``warmup`` steps, then ``kind`` decay ("cosine",
    "linear") from lr_max to lr_min at step ``total``, or "constant"."""
    t = _check_step(step)
    for name, n in (("warmup", warmup), ("total", total)):
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= n <= _MAX_STEP:
            raise ValueError(f"{name} must be an integer in [0, 2**24], got {n!r}")
    if not warmup < total:
        raise ValueError(f"need warmup < total, got warmup={warmup}, total={total}")
    if kind not in SCHEDULES:
        raise ValueError(f"kind must be one of {SCHEDULES}, got {kind!r}")
    lr_max = check_scalar_f32("lr_max", lr_max)
    lr_min = check_scalar_f32("lr_min", lr_min)
    return np.float32(lr_kernel(t, int(warmup), int(total), lr_max, lr_min, SCHEDULES.index(kind)))
