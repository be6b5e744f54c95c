"""LayerNorm and RMSNorm (spec chapter 11), as ``refreplay.ops.norms``."""

from __future__ import annotations

import numpy as np
from numba import cuda

from ...ops import norms as NORM
from .._common import _dev, _each, _ret, device_aware


def _f32_args(**arrays):
    """Validate named float32 arrays with their expected shapes (refreplay.ops' checks)."""
    from .._common import check_f32, check_shape

    for name, (a, shape) in arrays.items():
        check_f32(name, a, len(shape))
        check_shape(name, a, shape)


def _norm_rows(x):
    from .._common import check_f32

    check_f32("x", x, 2)
    N, C = x.shape
    if C < 1 or C > 1 << 24:
        raise ValueError(f"x must have 1 <= C <= 2**24 channels, got {C}")
    return N, C


def _eps(eps):
    from refreplay.ops import check_scalar_f32

    return check_scalar_f32("eps", eps)


@device_aware
def layernorm_forward(x, w, b, eps=np.float32(1e-5)):
    """[norm.layer.fwd.c1] x [N, C], w, b [C] -> (out [N, C], mean [N], rstd [N])."""
    N, C = _norm_rows(x)
    _f32_args(w=(w, (C,)), b=(b, (C,)))
    eps = _eps(eps)
    out, mean, rstd = (cuda.device_array(s, np.float32) for s in ((N, C), N, N))
    _each(NORM.layernorm_forward_k, N, out, mean, rstd, _dev(x), _dev(w), _dev(b), eps)
    return _ret(out), _ret(mean), _ret(rstd)


@device_aware
def layernorm_backward(dout, x, w, mean, rstd):
    """[norm.layer.bwd.c1] -> (dx [N, C], dw [C], db [C])."""
    N, C = _norm_rows(x)
    _f32_args(dout=(dout, (N, C)), w=(w, (C,)), mean=(mean, (N,)), rstd=(rstd, (N,)))
    d_dout, d_x, d_mean, d_rstd = (_dev(a) for a in (dout, x, mean, rstd))
    dx, dw, db = (cuda.device_array(s, np.float32) for s in ((N, C), C, C))
    _each(NORM.layernorm_backward_dx_k, N, dx, d_dout, d_x, _dev(w), d_mean, d_rstd)
    _each(NORM.layernorm_backward_dwdb_k, C, dw, db, d_dout, d_x, d_mean, d_rstd)
    return _ret(dx), _ret(dw), _ret(db)


@device_aware
def rmsnorm_forward(x, w, eps=np.float32(1e-5)):
    """[norm.rms.fwd.c1] x [N, C], w [C] -> (out [N, C], rrms [N])."""
    N, C = _norm_rows(x)
    _f32_args(w=(w, (C,)))
    eps = _eps(eps)
    out, rrms = cuda.device_array((N, C), np.float32), cuda.device_array(N, np.float32)
    _each(NORM.rmsnorm_forward_k, N, out, rrms, _dev(x), _dev(w), eps)
    return _ret(out), _ret(rrms)


@device_aware
def rmsnorm_backward(dout, x, w, rrms):
    """[norm.rms.bwd.c1] -> (dx [N, C], dw [C])."""
    N, C = _norm_rows(x)
    _f32_args(dout=(dout, (N, C)), w=(w, (C,)), rrms=(rrms, (N,)))
    d_dout, d_x, d_rrms = (_dev(a) for a in (dout, x, rrms))
    dx, dw = cuda.device_array((N, C), np.float32), cuda.device_array(C, np.float32)
    _each(NORM.rmsnorm_backward_dx_k, N, dx, d_dout, d_x, _dev(w), d_rrms)
    _each(NORM.rmsnorm_backward_dw_k, C, dw, d_dout, d_x, d_rrms)
    return _ret(dx), _ret(dw)
