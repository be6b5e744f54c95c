"""Softmax and log-softmax over the last axis on the device, forward and
backward; mirrors ``refreplay.ops.softmax`` ([softmax.fwd.c1],
[softmax.bwd.c1], [softmax.log.c1], [softmax.log.bwd.c1]).

Shapes: x, y, dy, dx [N, V] (the caller flattens leading axes into N).  Each
row gets one thread (grid ``blocks(N)``) that runs the row's max, its sum
from -0 over j increasing, and the outputs, exactly as the reference's row
kernels; outputs are overwritten.
"""

from __future__ import annotations

from numba import cuda

from .. import shim
from .._jit import kernel
from ..linalg import NEG_INF, NEG_ZERO
from ..transcendental import exp, log

_M = "float32[:, ::1]"


@kernel(f"void({_M}, {_M})")
def softmax_forward_k(x, y):
    """[softmax.fwd.c1] m = fmax over j from -inf; e[j] = exp(x[j] - m);
    s = sum of e[j] from -0, j increasing; r = recip(s); y[j] = e[j] * r."""
    i = cuda.grid(1)
    N, V = x.shape
    if i >= N:
        return
    m = NEG_INF
    for j in range(V):
        m = shim.fmax(m, x[i, j])
    s = NEG_ZERO
    for j in range(V):
        e = exp(shim.sub(x[i, j], m))
        y[i, j] = e
        s = shim.add(s, e)
    r = shim.recip(s)
    for j in range(V):
        y[i, j] = shim.mul(y[i, j], r)


@kernel(f"void({_M}, {_M})")
def log_softmax_forward_k(x, y):
    """[softmax.log.c1] y[j] = (x[j] - m) - log(s), m and s as in softmax."""
    i = cuda.grid(1)
    N, V = x.shape
    if i >= N:
        return
    m = NEG_INF
    for j in range(V):
        m = shim.fmax(m, x[i, j])
    s = NEG_ZERO
    for j in range(V):
        s = shim.add(s, exp(shim.sub(x[i, j], m)))
    ls = log(s)
    for j in range(V):
        y[i, j] = shim.sub(shim.sub(x[i, j], m), ls)


@kernel(f"void({_M}, {_M}, {_M})")
def softmax_backward_k(dy, y, dx):
    """[softmax.bwd.c1] d = sum of dy[j]*y[j] from -0; dx[j] = y[j] * (dy[j] - d)."""
    i = cuda.grid(1)
    N, V = y.shape
    if i >= N:
        return
    d = NEG_ZERO
    for j in range(V):
        d = shim.add(d, shim.mul(dy[i, j], y[i, j]))
    for j in range(V):
        dx[i, j] = shim.mul(y[i, j], shim.sub(dy[i, j], d))


@kernel(f"void({_M}, {_M}, {_M})")
def log_softmax_backward_k(dy, y, dx):
    """[softmax.log.bwd.c1] g = sum of dy[j] from -0; dx[j] = dy[j] - exp(y[j]) * g."""
    i = cuda.grid(1)
    N, V = y.shape
    if i >= N:
        return
    g = NEG_ZERO
    for j in range(V):
        g = shim.add(g, dy[i, j])
    for j in range(V):
        dx[i, j] = shim.sub(dy[i, j], shim.mul(exp(y[i, j]), g))
