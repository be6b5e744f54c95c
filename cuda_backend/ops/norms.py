"""LayerNorm and RMSNorm on the device, forward and backward; mirrors
``refreplay.ops.norms`` ([norm.layer.fwd.c1], [norm.layer.bwd.c1],
[norm.rms.fwd.c1], [norm.rms.bwd.c1]).

Shapes: x, out, dout, dx [N, C]; w, b, dw, db [C]; mean, rstd, rrms [N].
Row kernels give each row n one thread (grid ``blocks(N)``), which runs the
row's sums over c in increasing order; the dw/db kernels give each channel c
one thread (grid ``blocks(C)``), which sums over n in increasing order.
inv_C = recip(f32(C)) is the same value in every thread ([norm.meanop.c1]).
The backward recomputes norm with the forward's operations (same bits).
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .. import shim
from .._jit import kernel
from ..linalg import sum_start

_ROWS = "float32[:, ::1]"
_VEC = "float32[::1]"


@kernel(f"void({_ROWS}, {_VEC}, {_VEC}, {_ROWS}, {_VEC}, {_VEC}, float32)")
def layernorm_forward_k(out, mean, rstd, x, w, b, eps):
    """[norm.layer.fwd.c1] out [N, C], mean, rstd [N] (overwritten) from x [N, C],
    w, b [C], eps.  One thread per row."""
    n = cuda.grid(1)
    N, C = x.shape
    if n >= N:
        return
    inv_C = shim.recip(np.float32(C))  # [norm.meanop.c1]
    s = sum_start(C)
    for c in range(C):
        s = shim.add(s, x[n, c])
    mean_n = shim.mul(s, inv_C)
    v = sum_start(C)
    for c in range(C):
        d = shim.sub(x[n, c], mean_n)
        v = shim.add(v, shim.mul(d, d))
    rstd_n = shim.recip(shim.sqrt(shim.add(shim.mul(v, inv_C), eps)))
    for c in range(C):
        norm_c = shim.mul(shim.sub(x[n, c], mean_n), rstd_n)
        out[n, c] = shim.add(shim.mul(norm_c, w[c]), b[c])
    mean[n] = mean_n
    rstd[n] = rstd_n


@kernel(f"void({_ROWS}, {_ROWS}, {_ROWS}, {_VEC}, {_VEC}, {_VEC})")
def layernorm_backward_dx_k(dx, dout, x, w, mean, rstd):
    """[norm.layer.bwd.c1] steps 1-4: dx [N, C] (overwritten).  One thread per row."""
    n = cuda.grid(1)
    N, C = x.shape
    if n >= N:
        return
    inv_C = shim.recip(np.float32(C))
    mean_n = mean[n]
    rstd_n = rstd[n]
    s_dnorm = sum_start(C)
    s_dnorm_norm = sum_start(C)
    for c in range(C):
        norm_c = shim.mul(shim.sub(x[n, c], mean_n), rstd_n)  # forward steps 3, 7
        dnorm_c = shim.mul(dout[n, c], w[c])  # out = norm*w + b
        s_dnorm = shim.add(s_dnorm, dnorm_c)
        s_dnorm_norm = shim.add(s_dnorm_norm, shim.mul(dnorm_c, norm_c))
    dnorm_mean = shim.mul(s_dnorm, inv_C)
    dnorm_norm_mean = shim.mul(s_dnorm_norm, inv_C)
    for c in range(C):
        norm_c = shim.mul(shim.sub(x[n, c], mean_n), rstd_n)
        dnorm_c = shim.mul(dout[n, c], w[c])
        t = shim.sub(shim.sub(dnorm_c, dnorm_mean), shim.mul(norm_c, dnorm_norm_mean))
        dx[n, c] = shim.mul(t, rstd_n)


@kernel(f"void({_VEC}, {_VEC}, {_ROWS}, {_ROWS}, {_VEC}, {_VEC})")
def layernorm_backward_dwdb_k(dw, db, dout, x, mean, rstd):
    """[norm.layer.bwd.c1] step 5: dw[c] = sum over n of mul(dout[n,c], norm[n,c]),
    db[c] = sum over n of dout[n,c], n increasing.  dw, db [C] (overwritten).
    One thread per channel."""
    c = cuda.grid(1)
    N, C = x.shape
    if c >= C:
        return
    sw = sum_start(N)
    sb = sum_start(N)
    for n in range(N):
        norm = shim.mul(shim.sub(x[n, c], mean[n]), rstd[n])
        sw = shim.add(sw, shim.mul(dout[n, c], norm))
        sb = shim.add(sb, dout[n, c])
    dw[c] = sw
    db[c] = sb


@kernel(f"void({_ROWS}, {_VEC}, {_ROWS}, {_VEC}, float32)")
def rmsnorm_forward_k(out, rrms, x, w, eps):
    """[norm.rms.fwd.c1] out [N, C], rrms [N] (overwritten).  One thread per row."""
    n = cuda.grid(1)
    N, C = x.shape
    if n >= N:
        return
    inv_C = shim.recip(np.float32(C))
    q = sum_start(C)
    for c in range(C):
        q = shim.add(q, shim.mul(x[n, c], x[n, c]))
    rrms_n = shim.recip(shim.sqrt(shim.add(shim.mul(q, inv_C), eps)))
    for c in range(C):
        out[n, c] = shim.mul(shim.mul(x[n, c], rrms_n), w[c])
    rrms[n] = rrms_n


@kernel(f"void({_ROWS}, {_ROWS}, {_ROWS}, {_VEC}, {_VEC})")
def rmsnorm_backward_dx_k(dx, dout, x, w, rrms):
    """[norm.rms.bwd.c1] steps 1-4: dx [N, C] (overwritten).  One thread per row."""
    n = cuda.grid(1)
    N, C = x.shape
    if n >= N:
        return
    inv_C = shim.recip(np.float32(C))
    rrms_n = rrms[n]
    g = sum_start(C)
    for c in range(C):
        norm_c = shim.mul(x[n, c], rrms_n)  # forward step 4
        dnorm_c = shim.mul(dout[n, c], w[c])  # out = norm*w
        g = shim.add(g, shim.mul(dnorm_c, norm_c))
    dnorm_norm_mean = shim.mul(g, inv_C)
    for c in range(C):
        norm_c = shim.mul(x[n, c], rrms_n)
        dnorm_c = shim.mul(dout[n, c], w[c])
        dx[n, c] = shim.mul(shim.sub(dnorm_c, shim.mul(norm_c, dnorm_norm_mean)), rrms_n)


@kernel(f"void({_VEC}, {_ROWS}, {_ROWS}, {_VEC})")
def rmsnorm_backward_dw_k(dw, dout, x, rrms):
    """[norm.rms.bwd.c1] step 5: dw[c] = sum over n of mul(dout[n,c], norm[n,c]),
    n increasing.  dw [C] (overwritten).  One thread per channel."""
    c = cuda.grid(1)
    N, C = x.shape
    if c >= C:
        return
    s = sum_start(N)
    for n in range(N):
        s = shim.add(s, shim.mul(dout[n, c], shim.mul(x[n, c], rrms[n])))
    dw[c] = s
