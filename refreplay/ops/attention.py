"""Causal multi-head self-attention (``spec/13-ops-attention.txt``).

Shapes (spec letters): q, k, v, out [B, NH, T, HS]; att [B, NH, T, T].
Row t of a head attends to positions s = 0 .. t.  Positions s > t take part
in no arithmetic at all (they are not masked by adding -inf), so a NaN or inf
in the future cannot leak into the past ([attn.mask.c1]).

Each (b, h) pair is computed by one ``prange`` iteration with its own
sequential loops, so a sequence's bits depend only on that sequence
([attn.batch.c1]).
"""
from __future__ import annotations

import numpy as np
from numba import prange

from .._jit import kernel, parallel_kernel
from ..linalg.common import NEG_ZERO
from ..numerics.core import F32, ZERO, canon, flush, mul, recip, sqrt
from .softmax import softmax_row, softmax_row_backward


@kernel
def dot_rows(x, MT, n, acc):
    """[attn.scores.c1] acc[s] = sum over d = 0 .. HS-1, increasing, of
    x[d] * MT[d, s], for s = 0 .. n-1 (acc overwritten): entries of
    linalg.matmul_nt ([mm.nt.c1]), each a chain from -0.

    MT [HS, T] is a key (or value) block stored transposed, so that the s
    loop runs over independent outputs in contiguous memory and vectorises;
    each output still adds its products in increasing d.  Products and sums
    are flushed one by one; NaNs are canonicalised once at the end of the
    chain ([num.nan.c1]).
    """
    a = acc[:n]
    a[:] = NEG_ZERO
    for d in range(x.shape[0]):
        xd = x[d]
        m = MT[d, :n]
        for s in range(n):
            a[s] = flush(a[s] + flush(xd * m[s]))
    for s in range(n):
        a[s] = canon(a[s])


@kernel
def axpy_rows(c, M, n, acc):
    """acc[d] = acc[d] + c[s] * M[s, d] for s = 0 .. n-1 in increasing s and
    every d (acc accumulated into, flushed one by one, NaN left to the
    caller's canon at the end of the chain)."""
    for s in range(n):
        cs = c[s]
        m = M[s]
        for d in range(acc.shape[0]):
            acc[d] = flush(acc[d] + flush(cs * m[d]))


@kernel
def transpose_into(M, MT):
    """MT[d, s] = M[s, d] (bits copied) for M [T, HS]."""
    for s in range(M.shape[0]):
        for d in range(M.shape[1]):
            MT[d, s] = M[s, d]


@kernel
def canon_all(x):
    for i in range(x.shape[0]):
        x[i] = canon(x[i])


@kernel
def attention_scale(HS):
    """[attn.scores.c1] scale = recip(sqrt(f32(HS))), computed once per call."""
    return recip(sqrt(F32(HS)))


@parallel_kernel
def attention_forward_kernel(q, k, v, scale, out, att):
    """q, k, v [B, NH, T, HS] -> out [B, NH, T, HS], att [B, NH, T, T]
    (both overwritten).  For every (b, h) and t = 0 .. T-1:
        att[t, s] = dot(q[t], k[s]) * scale            s = 0 .. t   [attn.scores.c1]
        att[t, :t+1] = softmax_row(att[t, :t+1]); att[t, s>t] = +0  [attn.mask.c1]
        out[t, d] = (-0 + att[t,0]*v[0,d]) + ... + att[t,t]*v[t,d] [attn.out.c1]
    """
    B, NH, T, HS = q.shape
    for bh in prange(B * NH):
        b = bh // NH
        h = bh % NH
        q_bh, v_bh = q[b, h], v[b, h]
        kT = np.empty((HS, T), np.float32)
        transpose_into(k[b, h], kT)
        # Scores go to a scratch row, so softmax_row reads and writes distinct
        # buffers and its exponentials vectorise (the bits are the same).
        z = np.empty(T, np.float32)
        for t in range(T):
            att_t = att[b, h, t]
            n = t + 1
            dot_rows(q_bh[t], kT, n, z)
            zr = z[:n]
            for s in range(n):
                zr[s] = mul(zr[s], scale)
            softmax_row(z, n, att_t)
            att_t[n:] = ZERO
            out_t = out[b, h, t]
            out_t[:] = NEG_ZERO
            axpy_rows(att_t, v_bh, n, out_t)
            canon_all(out_t)


@parallel_kernel
def attention_backward_kernel(dout, q, k, v, att, scale, dq, dk, dv):
    """dout, q, k, v [B, NH, T, HS], att [B, NH, T, T] -> dq, dk, dv
    [B, NH, T, HS] (overwritten).  For every (b, h), t = 0 .. T-1 in
    increasing order, s = 0 .. t  [attn.bwd.c1]:
        dp[s]  = dot(dout[t], v[s])
        ds[s]  = softmax_row_backward(dp, att[t])[s]     (dot over s increasing)
        dz[s]  = ds[s] * scale
        dq[t,d] = (-0 + dz[0]*k[0,d]) + ... + dz[t]*k[t,d]
        dk[s,d] = dk[s,d] + dz[s]*q[t,d]        (so dk sums over t increasing)
        dv[s,d] = dv[s,d] + att[t,s]*dout[t,d]  (so dv sums over t increasing)
    dk and dv start at -0 ([red.sum.c1]).
    """
    B, NH, T, HS = q.shape
    for bh in prange(B * NH):
        b = bh // NH
        h = bh % NH
        q_bh, k_bh = q[b, h], k[b, h]
        dq_bh, dk_bh, dv_bh = dq[b, h], dk[b, h], dv[b, h]
        dk_bh[:, :] = NEG_ZERO
        dv_bh[:, :] = NEG_ZERO
        vT = np.empty((HS, T), np.float32)
        transpose_into(v[b, h], vT)
        dp = np.empty(T, np.float32)
        dz = np.empty(T, np.float32)
        for t in range(T):
            n = t + 1
            att_t = att[b, h, t]
            dout_t = dout[b, h, t]
            q_t = q_bh[t]
            dot_rows(dout_t, vT, n, dp)
            softmax_row_backward(dp, att_t, n, dz)
            for s in range(n):
                dz[s] = mul(dz[s], scale)
            dq_t = dq_bh[t]
            dq_t[:] = NEG_ZERO
            axpy_rows(dz, k_bh, n, dq_t)
            canon_all(dq_t)
            for s in range(n):
                z = dz[s]
                p = att_t[s]
                dk_s = dk_bh[s]
                dv_s = dv_bh[s]
                for d in range(HS):
                    dk_s[d] = flush(dk_s[d] + flush(z * q_t[d]))
                    dv_s[d] = flush(dv_s[d] + flush(p * dout_t[d]))
        for s in range(T):
            canon_all(dk_bh[s])
            canon_all(dv_bh[s])


# ---- public API ------------------------------------------------------------------


def _check(names_arrays, shape=None):
    for name, a in names_arrays:
        if not isinstance(a, np.ndarray) or a.dtype != np.float32:
            raise TypeError(f"{name} must be a float32 ndarray")
        if not a.flags.c_contiguous:
            raise ValueError(f"{name} must be C-contiguous")
        if a.ndim != 4:
            raise ValueError(f"{name} must be [B, NH, T, HS], got shape {a.shape}")
        shape = shape or a.shape
        if a.shape != shape:
            raise ValueError(f"{name} has shape {a.shape}, expected {shape}")
    if min(shape) < 1:
        raise ValueError(f"empty attention shape {shape}")
    return shape


def attention_forward(q, k, v):
    """[attn.scores.c1] [attn.out.c1] Causal attention.

    q, k, v [B, NH, T, HS] -> (out [B, NH, T, HS], att [B, NH, T, T]); att
    holds the probabilities (+0 above the diagonal) that the backward needs.
    """
    B, NH, T, HS = _check([("q", q), ("k", k), ("v", v)])
    out = np.empty_like(q)
    att = np.empty((B, NH, T, T), np.float32)
    attention_forward_kernel(q, k, v, attention_scale(HS), out, att)
    return out, att


def attention_backward(dout, q, k, v, att):
    """[attn.bwd.c1] -> (dq, dk, dv), each [B, NH, T, HS], new arrays."""
    B, NH, T, HS = _check([("dout", dout), ("q", q), ("k", k), ("v", v)])
    _check([("att", att)], (B, NH, T, T))
    dq, dk, dv = np.empty_like(q), np.empty_like(k), np.empty_like(v)
    attention_backward_kernel(dout, q, k, v, att, attention_scale(HS), dq, dk, dv)
    return dq, dk, dv
