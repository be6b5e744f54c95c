"""AdamW, global gradient-norm clipping and the learning-rate schedule on the
device; mirrors ``refreplay.ops.optim`` ([optim.adamw.bias.c1],
[optim.adamw.c1], [optim.clip.c1], [optim.lr.c1]).

The AdamW update and the clip scaling are elementwise (one thread per
element, grid ``blocks(N)``, in place).  The scalars of a step -- bias
corrections, one tensor's sum of squares, the clip coefficient, the learning
rate -- are sequential by definition and run in one thread (grid 1 x 1),
writing to a small output array.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from refreplay.ops.optim import CLIP_EPS, PI

from .. import shim
from .._jit import kernel
from ..linalg import sum_start
from ..transcendental import cos

ONE = np.float32(1.0)
HALF = np.float32(0.5)
_V = "float32[::1]"


@kernel("void(float32, float32, int64, float32[::1])")
def adamw_bias_corrections_k(beta1, beta2, t, out):
    """[optim.adamw.bias.c1] out = (recip(1 - beta1^t), recip(1 - beta2^t)), the
    powers formed by t - 1 sequential multiplications.  One thread."""
    if cuda.grid(1) != 0:
        return
    pow1 = beta1
    pow2 = beta2
    for _ in range(t - 1):
        pow1 = shim.mul(pow1, beta1)
        pow2 = shim.mul(pow2, beta2)
    out[0] = shim.recip(shim.sub(ONE, pow1))
    out[1] = shim.recip(shim.sub(ONE, pow2))


@kernel(f"void({_V}, {_V}, {_V}, {_V}, float32, float32, float32, float32, float32, float32, float32)")
def adamw_k(p, g, m, v, lr, beta1, beta2, eps, wd, rbc1, rbc2):
    """[optim.adamw.c1] steps 1-6 for element i; p, m, v [N] updated in place, g [N] read."""
    i = cuda.grid(1)
    if i >= p.size:
        return
    g_i = g[i]
    m_i = shim.add(shim.mul(beta1, m[i]), shim.mul(shim.sub(ONE, beta1), g_i))
    v_i = shim.add(shim.mul(beta2, v[i]), shim.mul(shim.mul(shim.sub(ONE, beta2), g_i), g_i))
    m_hat = shim.mul(m_i, rbc1)
    v_hat = shim.mul(v_i, rbc2)
    update = shim.mul(m_hat, shim.recip(shim.add(shim.sqrt(v_hat), eps)))
    p_i = p[i]
    p[i] = shim.sub(p_i, shim.mul(lr, shim.add(update, shim.mul(wd, p_i))))
    m[i] = m_i
    v[i] = v_i


@kernel(f"void({_V}, {_V}, int64)")
def sum_of_squares_k(g, partials, k):
    """[optim.clip.c1] step 1: partials[k] = sum over i increasing of g[i]*g[i],
    from the start of [red.sum.c1].  One thread."""
    if cuda.grid(1) != 0:
        return
    s = sum_start(g.size)
    for i in range(g.size):
        s = shim.add(s, shim.mul(g[i], g[i]))
    partials[k] = s


@kernel(f"void({_V}, float32, {_V})")
def clip_coefficient_k(partials, max_norm, out):
    """[optim.clip.c1] steps 2-4: out = (norm, coef), norm = sqrt(sum of partials in
    order), coef = max_norm * recip(norm + 1e-6).  One thread."""
    if cuda.grid(1) != 0:
        return
    total = sum_start(partials.size)
    for k in range(partials.size):
        total = shim.add(total, partials[k])
    norm = shim.sqrt(total)
    out[0] = norm
    out[1] = shim.mul(max_norm, shim.recip(shim.add(norm, CLIP_EPS)))


@kernel(f"void({_V}, float32)")
def clip_scale_k(g, coef):
    """[optim.clip.c1] step 5: g[i] = mul(g[i], coef), in place."""
    i = cuda.grid(1)
    if i < g.size:
        g[i] = shim.mul(g[i], coef)


@kernel("void(int64, int64, int64, float32, float32, int64, float32[::1])")
def lr_k(t, warmup, total, lr_max, lr_min, kind, out):
    """[optim.lr.c1] out[0] = the learning rate of step t; kind 0 cosine, 1 linear,
    2 constant.  One thread."""
    if cuda.grid(1) != 0:
        return
    if t <= warmup:
        out[0] = shim.mul(lr_max, shim.mul(np.float32(t), shim.recip(np.float32(warmup))))
        return
    if kind == 2:
        out[0] = lr_max
        return
    progress = shim.fmin(shim.mul(np.float32(t - warmup), shim.recip(np.float32(total - warmup))), ONE)
    if kind == 0:
        coeff = shim.mul(HALF, shim.add(ONE, cos(shim.mul(PI, progress))))
    else:
        coeff = shim.sub(ONE, progress)
    out[0] = shim.add(lr_min, shim.mul(coeff, shim.sub(lr_max, lr_min)))
