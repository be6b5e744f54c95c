"""PyTorch's own kernels as the ``torch`` conformance kernel: one function per
op, named after it, under the op table's calling conventions -- the same form
a kernel author's ``package.module`` kernel takes (``adapters.py``).

Negative controls: they are not expected to conform (fused or reordered sums,
vendor exp/tanh, no flushes), except where an op is exact (embedding, the
element-wise IEEE operations).  The ``bf16_`` functions take and return the
bf16 profile's bit patterns ([bf16.ops.c1]): bf16 tensors in, bf16 (or, where
the profile has binary32, the result widened to float32) out, so a bf16
matmul rounds its binary32 accumulator to bf16 and the ops use PyTorch's own
exp, tanh and orders.

Importing this module imports PyTorch; ``adapters.resolve("torch")`` does it
only when the torch kernel is asked for.  The functions shadow the builtins
``sum`` and ``max`` here: nothing in this module calls those builtins.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

_EPS = 1e-5
_BF16 = torch.bfloat16
_t = torch.from_numpy


# ---- conversions -------------------------------------------------------------------------


def _n(*xs):
    """float32 tensors back to arrays (one, or a tuple)."""
    out = tuple(x.detach().numpy() for x in xs)
    return out if len(out) > 1 else out[0]


def _h(x):
    """bf16 bit patterns (uint16) as a bf16 tensor."""
    return torch.from_numpy(np.ascontiguousarray(x).view(np.int16)).view(_BF16)


def _bits(x):
    """A bf16 tensor as its bit patterns (uint16)."""
    return x.detach().contiguous().view(torch.int16).numpy().view(np.uint16)


def _wide(x):
    """A bf16 tensor widened exactly to float32."""
    return x.detach().float().numpy()


def _grad(fn, dout, *xs):
    """Gradients of sum(fn(*xs) * dout) with respect to every x (float32 autograd)."""
    leaves = [_t(x.copy()).requires_grad_(True) for x in xs]
    (fn(*leaves) * _t(dout)).sum().backward()
    return _n(*[leaf.grad for leaf in leaves])


def _bf16_grad(fn, dout, *xs):
    """bf16 gradients of fn(*xs) . dout by PyTorch's bf16 autograd."""
    leaves = [_h(x).clone().requires_grad_(True) for x in xs]
    fn(*leaves).backward(_h(dout))
    out = tuple(_bits(leaf.grad) for leaf in leaves)
    return out if len(out) > 1 else out[0]


def _gelu(x):
    return F.gelu(x, approximate="tanh")


def _swiglu(a, b):
    return F.silu(a) * b


def _rope(X, C, S):
    """Rotary embedding in the table's half-split layout."""
    half = X.shape[-1] // 2
    a, b = X[..., :half], X[..., half:]
    return torch.cat([a * C - b * S, b * C + a * S], -1)


def _causal(T):
    return torch.ones(T, T, dtype=torch.bool).triu(1)


# ---- element-wise operations, reductions, matrix products --------------------------------


def add(a, b):
    return _n(_t(a) + _t(b))


def sub(a, b):
    return _n(_t(a) - _t(b))


def mul(a, b):
    return _n(_t(a) * _t(b))


def recip(x):
    return _n(torch.reciprocal(_t(x)))


def sqrt(x):
    return _n(torch.sqrt(_t(x)))


def fmax(a, b):
    return _n(torch.maximum(_t(a), _t(b)))


def fmin(a, b):
    return _n(torch.minimum(_t(a), _t(b)))


def rint(x):
    return _n(torch.round(_t(x)))


def exp(x):
    return _n(torch.exp(_t(x)))


def log(x):
    return _n(torch.log(_t(x)))


def tanh(x):
    return _n(torch.tanh(_t(x)))


def sigmoid(x):
    return _n(torch.sigmoid(_t(x)))


def sin(x):
    return _n(torch.sin(_t(x)))


def cos(x):
    return _n(torch.cos(_t(x)))


def sum(X):
    return _n(_t(X).sum(1))


def col_sum(X):
    return _n(_t(X).sum(0))


def max(X):
    return _n(_t(X).amax(1))


def dot(x, y):
    return _n(torch.dot(_t(x), _t(y)).reshape(1))


def matmul(A, B):
    return _n(_t(A) @ _t(B))


def matmul_nt(A, B):
    return _n(_t(A) @ _t(B).T)


def matmul_tn(A, B):
    return _n(_t(A).T @ _t(B))


def matmul_i8(A, B):
    return _n((_t(A).long() @ _t(B).long()).int())


# ---- transformer ops, float32 ------------------------------------------------------------


def linear_forward(x, W, b):
    return _n(F.linear(_t(x), _t(W), _t(b)))


def linear_backward(dy, x, W):
    X, Wl = _t(x.copy()).requires_grad_(True), _t(W.copy()).requires_grad_(True)
    b = torch.zeros(W.shape[0], requires_grad=True)
    F.linear(X, Wl, b).backward(_t(dy))
    return _n(X.grad, Wl.grad, b.grad)


def layernorm_forward(x, w, b):
    X = _t(x)
    mean = X.mean(1)
    rstd = torch.rsqrt(X.var(1, unbiased=False) + _EPS)
    return _n(F.layer_norm(X, (X.shape[1],), _t(w), _t(b), _EPS), mean, rstd)


def layernorm_backward(dout, x, w, mean, rstd):
    """ATen's own LayerNorm backward, given the forward's mean and rstd."""
    W = _t(w)
    out = torch.ops.aten.native_layer_norm_backward(
        _t(dout), _t(x), (x.shape[1],), _t(mean), _t(rstd), W, torch.zeros_like(W), [True, True, True]
    )
    return _n(*out)


def rmsnorm_forward(x, w):
    X = _t(x)
    rrms = torch.rsqrt(X.pow(2).mean(1) + _EPS)
    return _n(X * rrms[:, None] * _t(w), rrms)


def rmsnorm_backward(dout, x, w, rrms):
    """Autograd of F.rms_norm (ATen has no CPU kernel that takes rrms)."""
    return _grad(lambda X, W: F.rms_norm(X, (x.shape[1],), W, _EPS), dout, x, w)


def softmax_forward(x):
    return _n(torch.softmax(_t(x), 1))


def softmax_backward(dy, y):
    return _n(torch.ops.aten._softmax_backward_data(_t(dy), _t(y), 1, torch.float32))


def log_softmax_forward(x):
    return _n(torch.log_softmax(_t(x), 1))


def log_softmax_backward(dy, y):
    return _n(torch.ops.aten._log_softmax_backward_data(_t(dy), _t(y), 1, torch.float32))


def attention_forward(q, k, v):
    """The math attention path: scaled scores, the causal mask, softmax, the weighted sum."""
    Q, K, V = _t(q), _t(k), _t(v)
    s = (Q @ K.transpose(-1, -2)) / float(np.sqrt(Q.shape[-1]))
    att = torch.softmax(s.masked_fill(_causal(Q.shape[-2]), float("-inf")), -1)
    return _n(att @ V, att)


def attention_backward(dout, q, k, v, att):
    """The backward of the math attention path, from the given probabilities."""
    D, Q, K, V, A = _t(dout), _t(q), _t(k), _t(v), _t(att)
    ds = torch.ops.aten._softmax_backward_data(D @ V.transpose(-1, -2), A, -1, torch.float32)
    ds = ds / float(np.sqrt(q.shape[-1]))
    return _n(ds @ K, ds.transpose(-1, -2) @ Q, A.transpose(-1, -2) @ D)


def rope_forward(x, c, s):
    return _n(_rope(_t(x), _t(c), _t(s)))


def rope_backward(dout, c, s):
    return _grad(lambda X: _rope(X, _t(c), _t(s)), dout, np.zeros_like(dout))


def embedding_forward(wte, tokens):
    return _n(F.embedding(_t(tokens).long(), _t(wte)))


def embedding_backward(dout, tokens, V):
    return _n(torch.ops.aten.embedding_dense_backward(_t(dout), _t(tokens).long(), int(V[0]), -1, False))


def cross_entropy_forward(logits, targets):
    y = _t(targets).long()
    losses = F.cross_entropy(_t(logits), y, ignore_index=-1, reduction="none")
    return _n(losses, F.cross_entropy(_t(logits), y, ignore_index=-1).reshape(1))


def cross_entropy_backward(logits, targets):
    L = _t(logits.copy()).requires_grad_(True)
    F.cross_entropy(L, _t(targets).long(), ignore_index=-1).backward()
    return _n(L.grad)


def gelu_forward(x):
    return _n(_gelu(_t(x)))


def gelu_backward(dout, x):
    return _grad(_gelu, dout, x)


def silu_forward(x):
    return _n(F.silu(_t(x)))


def silu_backward(dout, x):
    return _grad(F.silu, dout, x)


def swiglu_forward(a, b):
    return _n(_swiglu(_t(a), _t(b)))


def swiglu_backward(dout, a, b):
    return _grad(_swiglu, dout, a, b)


def quant_step_size(x):
    return _n((_t(x).abs().max() / 127 if x.size else torch.zeros(())).reshape(1))


def _fake_quantize(X, s):
    return torch.fake_quantize_per_tensor_affine(X, float(s[0]), 0, -128, 127)


def fake_quantize(x, s):
    return _n(_fake_quantize(_t(x), s))


def fake_quantize_backward(dy, x, s):
    return _grad(lambda X: _fake_quantize(X, s), dy, x)


def adamw_update(p, g, m, v, step, lr):
    """torch.optim's single-tensor AdamW with the op's default hyper-parameters."""
    from torch.optim.adamw import adamw

    P, M, Vv = _t(p.copy()), _t(m.copy()), _t(v.copy())
    adamw(
        [P],
        [_t(g)],
        [M],
        [Vv],
        [],
        [torch.tensor(float(step[0]) - 1)],
        foreach=False,
        amsgrad=False,
        beta1=0.9,
        beta2=0.95,
        lr=float(lr[0]),
        weight_decay=0.1,
        eps=1e-8,
        maximize=False,
    )
    return _n(P, M, Vv)


# ---- the bf16 profile's ops ([bf16.ops.c1]) ----------------------------------------------


def bf16_encode(x):
    return _bits(torch.from_numpy(x).to(_BF16))


def bf16_decode(x):
    return _wide(_h(x))


def bf16_add(a, b):
    return _bits(_h(a) + _h(b))


def bf16_matmul(A, B):
    return _wide(_h(A) @ _h(B))


def bf16_matmul_nt(A, B):
    return _wide(_h(A) @ _h(B).T)


def bf16_matmul_tn(A, B):
    return _wide(_h(A).T @ _h(B))


def bf16_linear_forward(x, W, b):
    return _bits(F.linear(_h(x), _h(W), _h(b)))


def bf16_linear_backward(dy, x, W):
    """PyTorch keeps dW and db in bf16 (the profile: binary32)."""
    X, Wl = _h(x).clone().requires_grad_(True), _h(W).clone().requires_grad_(True)
    b = torch.zeros(W.shape[0], dtype=_BF16, requires_grad=True)
    F.linear(X, Wl, b).backward(_h(dy))
    return _bits(X.grad), _wide(Wl.grad), _wide(b.grad)


def bf16_layernorm_forward(x, w, b):
    out, mean, rstd = torch.native_layer_norm(_h(x), (x.shape[1],), _h(w), _h(b), _EPS)
    return _bits(out), _wide(mean).reshape(-1), _wide(rstd).reshape(-1)


def bf16_layernorm_backward(dout, x, w, mean, rstd):
    """ATen's bf16 LayerNorm backward (it takes mean and rstd in bf16)."""
    dx, dw, db = torch.ops.aten.native_layer_norm_backward(
        _h(dout),
        _h(x),
        (x.shape[1],),
        torch.from_numpy(mean).to(_BF16),
        torch.from_numpy(rstd).to(_BF16),
        _h(w),
        torch.zeros(w.shape, dtype=_BF16),
        [True, True, True],
    )
    return _bits(dx), _wide(dw), _wide(db)


def bf16_rmsnorm_forward(x, w):
    out, rstd = torch.ops.aten._fused_rms_norm(_h(x), [x.shape[1]], _h(w), _EPS)
    return _bits(out), _wide(rstd).reshape(-1)


def bf16_rmsnorm_backward(dout, x, w, rrms):
    """bf16 autograd of F.rms_norm; dw comes back in bf16 (the profile: binary32)."""
    X, W = _h(x).clone().requires_grad_(True), _h(w).clone().requires_grad_(True)
    F.rms_norm(X, (x.shape[1],), W, _EPS).backward(_h(dout))
    return _bits(X.grad), _wide(W.grad)


def bf16_softmax_forward(x):
    return _bits(torch.softmax(_h(x), 1))


def bf16_softmax_backward(dy, y):
    return _bits(torch.ops.aten._softmax_backward_data(_h(dy), _h(y), 1, _BF16))


def bf16_log_softmax_forward(x):
    return _bits(torch.log_softmax(_h(x), 1))


def bf16_log_softmax_backward(dy, y):
    return _bits(torch.ops.aten._log_softmax_backward_data(_h(dy), _h(y), 1, _BF16))


def bf16_attention_forward(q, k, v):
    """SDPA's causal output; the probabilities from the math path, in float32."""
    Q, K, V = _h(q), _h(k), _h(v)
    out = F.scaled_dot_product_attention(Q, K, V, is_causal=True)
    s = (Q @ K.transpose(-1, -2)).float() / float(np.sqrt(Q.shape[-1]))
    att = torch.softmax(s.masked_fill(_causal(Q.shape[-2]), float("-inf")), -1)
    return _bits(out), _wide(att)


def bf16_attention_backward(dout, q, k, v, att):
    """The math attention path's backward in bf16, from the given probabilities."""
    D, Q, K, V, A = _h(dout), _h(q), _h(k), _h(v), torch.from_numpy(att).to(_BF16)
    ds = torch.ops.aten._softmax_backward_data(D @ V.transpose(-1, -2), A, -1, _BF16) / float(np.sqrt(q.shape[-1]))
    return _bits(ds @ K), _bits(ds.transpose(-1, -2) @ Q), _bits(A.transpose(-1, -2) @ D)


def bf16_rope_forward(x, c, s):
    """Rotary embedding of a bf16 tensor with the tables converted to bf16."""
    return _bits(_rope(_h(x), torch.from_numpy(c).to(_BF16), torch.from_numpy(s).to(_BF16)))


def bf16_rope_backward(dout, c, s):
    X = torch.zeros(dout.shape, dtype=_BF16, requires_grad=True)
    _rope(X, torch.from_numpy(c).to(_BF16), torch.from_numpy(s).to(_BF16)).backward(_h(dout))
    return _bits(X.grad)


def bf16_embedding_forward(wte, tokens):
    return _bits(F.embedding(torch.from_numpy(tokens).long(), _h(wte)))


def bf16_embedding_backward(dout, tokens, V):
    return _wide(
        torch.ops.aten.embedding_dense_backward(_h(dout), torch.from_numpy(tokens).long(), int(V[0]), -1, False)
    )


def bf16_cross_entropy_forward(logits, targets):
    y = torch.from_numpy(targets).long()
    losses = F.cross_entropy(_h(logits), y, ignore_index=-1, reduction="none")
    return _wide(losses), _wide(F.cross_entropy(_h(logits), y, ignore_index=-1).reshape(1))


def bf16_cross_entropy_backward(logits, targets):
    L = _h(logits).clone().requires_grad_(True)
    F.cross_entropy(L, torch.from_numpy(targets).long(), ignore_index=-1).backward()
    return _bits(L.grad)


def bf16_gelu_forward(x):
    return _bits(_gelu(_h(x)))


def bf16_gelu_backward(dout, x):
    return _bf16_grad(_gelu, dout, x)


def bf16_silu_forward(x):
    return _bits(F.silu(_h(x)))


def bf16_silu_backward(dout, x):
    return _bf16_grad(F.silu, dout, x)


def bf16_swiglu_forward(a, b):
    return _bits(_swiglu(_h(a), _h(b)))


def bf16_swiglu_backward(dout, a, b):
    return _bf16_grad(_swiglu, dout, a, b)
