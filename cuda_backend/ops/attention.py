"""Causal multi-head self-attention on the device; mirrors
``refreplay.ops.attention`` ([attn.scores.c1], [attn.mask.c1],
[attn.out.c1], [attn.bwd.c1], [attn.batch.c1]).

Shapes: q, k, v, out, dout, dq, dk, dv [B, NH, T, HS]; att, dz [B, NH, T, T].
Positions s > t take part in no arithmetic.  Every reduction stays inside one
thread ([attn.batch.c1], [attn.order.r1]):

* ``attention_forward_k``: one thread per query row (b, h, t) computes the
  scores, the softmax of the row's first t+1 entries and the weighted sum.
* ``attention_backward_rows_k``: one thread per row (b, h, t) computes
  dp, the softmax backward, dz = ds * scale (kept in ``dz``) and dq[t].
* ``attention_backward_keys_k``: one thread per key entry (b, h, s, d) sums
  dk[s, d] and dv[s, d] over t = s .. T-1 in increasing t from -0 -- the
  order of the spec's single pass over t.

Grids ``blocks(B*NH*T)`` and ``blocks(B*NH*T*HS)``; outputs overwritten.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .. import shim
from .._jit import device, kernel
from ..linalg import NEG_INF, NEG_ZERO
from ..transcendental import exp

ZERO = np.float32(0.0)
_X = "float32[:, :, :, ::1]"


@device
def _dot(a, ia, b, ib, HS):
    """[attn.scores.c1] sum over d increasing of a[ia, d] * b[ib, d], from -0 ([mm.nt.c1])."""
    acc = NEG_ZERO
    for d in range(HS):
        acc = shim.add(acc, shim.mul(a[ia, d], b[ib, d]))
    return acc


@kernel(f"void({_X}, {_X}, {_X}, float32, {_X}, {_X})")
def attention_forward_k(q, k, v, scale, out, att):
    """[attn.scores.c1] [attn.mask.c1] [attn.out.c1] for row (b, h, t):
    att[t, s] = dot(q[t], k[s]) * scale for s <= t; softmax of att[t, 0..t]
    (max from -inf, sum from -0, y = e * recip(sum)); att[t, s > t] = +0;
    out[t, d] = sum over s <= t increasing of att[t, s] * v[s, d], from -0."""
    g = cuda.grid(1)
    B, NH, T, HS = q.shape
    if g >= B * NH * T:
        return
    t = g % T
    h = (g // T) % NH
    b = g // (T * NH)
    q_bh, k_bh, v_bh, a_t = q[b, h], k[b, h], v[b, h], att[b, h, t]
    m = NEG_INF
    for s in range(t + 1):
        z = shim.mul(_dot(q_bh, t, k_bh, s, HS), scale)
        a_t[s] = z
        m = shim.fmax(m, z)
    total = NEG_ZERO
    for s in range(t + 1):
        e = exp(shim.sub(a_t[s], m))
        a_t[s] = e
        total = shim.add(total, e)
    r = shim.recip(total)
    for s in range(t + 1):
        a_t[s] = shim.mul(a_t[s], r)
    for s in range(t + 1, T):
        a_t[s] = ZERO
    for d in range(HS):
        acc = NEG_ZERO
        for s in range(t + 1):
            acc = shim.add(acc, shim.mul(a_t[s], v_bh[s, d]))
        out[b, h, t, d] = acc


@kernel(f"void({_X}, {_X}, {_X}, {_X}, {_X}, float32, {_X}, {_X})")
def attention_backward_rows_k(dout, q, k, v, att, scale, dz, dq):
    """[attn.bwd.c1] for row (b, h, t), s = 0 .. t:
    dp[s] = dot(dout[t], v[s]); c = sum over s of dp[s] * att[t, s] from -0;
    dz[t, s] = (att[t, s] * (dp[s] - c)) * scale;
    dq[t, d] = sum over s increasing of dz[t, s] * k[s, d], from -0."""
    g = cuda.grid(1)
    B, NH, T, HS = q.shape
    if g >= B * NH * T:
        return
    t = g % T
    h = (g // T) % NH
    b = g // (T * NH)
    a_t, dz_t, k_bh = att[b, h, t], dz[b, h, t], k[b, h]
    c = NEG_ZERO
    for s in range(t + 1):
        dp = _dot(dout[b, h], t, v[b, h], s, HS)
        dz_t[s] = dp
        c = shim.add(c, shim.mul(dp, a_t[s]))
    for s in range(t + 1):
        dz_t[s] = shim.mul(shim.mul(a_t[s], shim.sub(dz_t[s], c)), scale)
    for d in range(HS):
        acc = NEG_ZERO
        for s in range(t + 1):
            acc = shim.add(acc, shim.mul(dz_t[s], k_bh[s, d]))
        dq[b, h, t, d] = acc


@kernel(f"void({_X}, {_X}, {_X}, {_X}, {_X}, {_X})")
def attention_backward_keys_k(dout, q, att, dz, dk, dv):
    """[attn.bwd.c1] for key entry (b, h, s, d), t = s .. T-1 increasing, from -0:
    dk[s, d] = dk[s, d] + dz[t, s] * q[t, d];  dv[s, d] = dv[s, d] + att[t, s] * dout[t, d]."""
    g = cuda.grid(1)
    B, NH, T, HS = q.shape
    if g >= B * NH * T * HS:
        return
    d = g % HS
    s = (g // HS) % T
    h = (g // (HS * T)) % NH
    b = g // (HS * T * NH)
    acc_k = NEG_ZERO
    acc_v = NEG_ZERO
    for t in range(s, T):
        acc_k = shim.add(acc_k, shim.mul(dz[b, h, t, s], q[b, h, t, d]))
        acc_v = shim.add(acc_v, shim.mul(att[b, h, t, s], dout[b, h, t, d]))
    dk[b, h, s, d] = acc_k
    dv[b, h, s, d] = acc_v
