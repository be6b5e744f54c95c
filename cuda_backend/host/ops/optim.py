"""AdamW, clipping and the LR schedule (spec chapter 15), as ``refreplay.ops.optim``."""

from __future__ import annotations

import numpy as np
from numba import cuda

from ...ops import optim as OP
from .._common import _dev, _each, _f32, _one_thread, check_state, device_aware, is_device


@device_aware
def adamw_bias_corrections(beta1, beta2, t):
    """[optim.adamw.bias.c1] (recip(1 - beta1^t), recip(1 - beta2^t))."""
    out = cuda.device_array(2, np.float32)
    _one_thread(OP.adamw_bias_corrections_k, np.float32(beta1), np.float32(beta2), int(t), out)
    rbc = out.copy_to_host()  # scalars: always to the host
    return rbc[0], rbc[1]


@device_aware
def adamw_step(params, grads, m, v, *, step, lr, hp=None, no_decay=frozenset()):
    """[optim.adamw.c1] Update ``params``, ``m``, ``v`` (dicts of host or device arrays) in place,
    tensors in sorted name order ([optim.state.c1])."""
    from refreplay.ops import check_scalar_f32
    from refreplay.ops import optim as ref

    hp = ref.AdamW() if hp is None else hp
    check_state(params, grads=grads, m=m, v=v)
    t = ref._check_step(step)
    lr = check_scalar_f32("lr", lr)
    unknown = set(no_decay) - set(params)
    if unknown:
        raise ValueError(f"no_decay names unknown parameters: {sorted(unknown)}")
    rbc1, rbc2 = adamw_bias_corrections(hp.beta1, hp.beta2, t)
    for k in sorted(params):
        wd = np.float32(0.0) if k in no_decay else hp.weight_decay
        dp, dm, dv = (_dev(a[k].reshape(-1)) for a in (params, m, v))
        _each(
            OP.adamw_k,
            params[k].size,
            dp,
            _dev(grads[k].reshape(-1)),
            dm,
            dv,
            lr,
            hp.beta1,
            hp.beta2,
            hp.eps,
            wd,
            rbc1,
            rbc2,
        )
        for a, d in ((params, dp), (m, dm), (v, dv)):
            if not is_device(a[k]):  # a host tensor: the update back into it
                a[k].reshape(-1)[:] = d.copy_to_host()


@device_aware
def adamw_update(p, g, m, v, step, lr, hp=None, decay=True):
    """[optim.adamw.c1] One tensor's AdamW update as new arrays -> (p', m', v')."""
    p2, m2, v2 = p.copy(), m.copy(), v.copy()
    adamw_step(
        {"t": p2},
        {"t": g},
        {"t": m2},
        {"t": v2},
        step=step,
        lr=lr,
        hp=hp,
        no_decay=frozenset() if decay else frozenset({"t"}),
    )
    return p2, m2, v2


@device_aware
def sum_of_squares(g):
    """[optim.clip.c1] step 1: sum over i increasing of g[i]*g[i] (1-D float32)."""
    out = cuda.device_array(1, np.float32)
    _one_thread(OP.sum_of_squares_k, _dev(_f32("g", g, 1)), out, 0)
    return out.copy_to_host()[0]


@device_aware
def clip_coefficient(partials, max_norm):
    """[optim.clip.c1] steps 2-4: (norm, coef) from the per-tensor sums in name order."""
    out = cuda.device_array(2, np.float32)
    _one_thread(OP.clip_coefficient_k, _dev(_f32("partials", partials, 1)), np.float32(max_norm), out)
    r = out.copy_to_host()
    return r[0], r[1]


@device_aware
def clip_grad_norm(grads, max_norm):
    """[optim.clip.c1] Global-norm clipping of ``grads`` (dict of host or device arrays), in place -> (norm, coef)."""
    from refreplay.ops import check_scalar_f32

    check_state(grads)
    max_norm = check_scalar_f32("max_norm", max_norm)
    names = sorted(grads)
    d_grads = {k: _dev(grads[k].reshape(-1)) for k in names}
    partials = cuda.device_array(len(names), np.float32)
    for j, k in enumerate(names):
        _one_thread(OP.sum_of_squares_k, d_grads[k], partials, j)
    out = cuda.device_array(2, np.float32)
    _one_thread(OP.clip_coefficient_k, partials, max_norm, out)
    norm, coef = out.copy_to_host()  # the coefficient decides on the host
    if coef < np.float32(1.0):
        for k in names:
            _each(OP.clip_scale_k, grads[k].size, d_grads[k], coef)
            if not is_device(grads[k]):
                grads[k].reshape(-1)[:] = d_grads[k].copy_to_host()
    return norm, coef


@device_aware
def lr_at(step, warmup, total, lr_max, lr_min, kind="cosine"):
    """[optim.lr.c1] Learning rate of update ``step`` (1-based)."""
    from refreplay.ops import check_scalar_f32
    from refreplay.ops import optim as ref

    t = ref._check_step(step)
    for name, n in (("warmup", warmup), ("total", total)):
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= n <= 1 << 24:
            raise ValueError(f"{name} must be an integer in [0, 2**24], got {n!r}")
    if not warmup < total:
        raise ValueError(f"need warmup < total, got warmup={warmup}, total={total}")
    if kind not in ref.SCHEDULES:
        raise ValueError(f"kind must be one of {ref.SCHEDULES}, got {kind!r}")
    lr_max, lr_min = check_scalar_f32("lr_max", lr_max), check_scalar_f32("lr_min", lr_min)
    out = cuda.device_array(1, np.float32)
    _one_thread(OP.lr_k, t, int(warmup), int(total), lr_max, lr_min, ref.SCHEDULES.index(kind), out)
    return out.copy_to_host()[0]
