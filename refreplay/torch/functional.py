"""Spec-exact functions on torch tensors: each a ``torch.autograd.Function``
whose forward and backward are the reference ops of ``refreplay.ops`` (CPU
tensors) or their CUDA twins (CUDA tensors), see ``_bridge``.

    function                  forward / backward clauses
    linear                    [linear.fwd.c1] [linear.bwd.c1]
    qlinear (int8 QAT)        [quant.linear.fwd.c1] [quant.linear.bwd.c1]
    layer_norm, rms_norm      [norm.layer.fwd.c1] [norm.layer.bwd.c1]
                              [norm.rms.fwd.c1] [norm.rms.bwd.c1]
    embedding                 [emb.fwd.c1] [emb.bwd.c1]
    gelu (tanh form), silu,   [act.gelu.fwd.c1] [act.gelu.bwd.c1] [act.silu.fwd.c1]
    swiglu                    [act.silu.bwd.c1] [act.swiglu.fwd.c1] [act.swiglu.bwd.c1]
    rope_tables, rope         [rope.freq.c1] [rope.fwd.c1] [rope.bwd.c1]
    causal_attention          [attn.scores.c1] [attn.out.c1] [attn.bwd.c1]
    softmax, log_softmax      [softmax.fwd.c1] [softmax.bwd.c1]
                              [softmax.log.c1] [softmax.log.bwd.c1]
    cross_entropy             [loss.token.c1] [loss.mean.c1] [loss.bwd.c1]
    add, fork                 [model.residual.c1]: the residual addition, and
                              the explicit branch point whose backward is the
                              spec's gradient sum (PyTorch's autograd would
                              otherwise add the two gradients of a reused
                              tensor with its own kernel)

Signatures follow ``torch.nn.functional`` where one exists, so a call site
changes only its module; an argument value the spec does not cover (a
non-tanh GELU, reduction="sum", label smoothing, a mask, dropout, a softmax
over another axis, ...) raises ``Unsupported``.  Defaults that differ from
PyTorch's are the spec's: GELU is the tanh form, eps is f32(0x3727C5AC)
(the binary32 nearest 1e-5; a Python 1e-5 is refused as not exactly a
binary32), the cross-entropy ignore index is -1 ([loss.token.c1]).

Backward passes are ``once_differentiable``: double backward is not covered
and raises.  Every public function runs eagerly inside ``torch.compile``
(a graph break): Dynamo would otherwise trace the NumPy plumbing into
PyTorch kernels.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.autograd.function import once_differentiable

from ._bridge import Unsupported, backend_of, eager, f32_scalar, from_numpy, inside_reference, to_numpy, tokens_to_numpy

EPS = np.float32(1e-5)  # f32(0x3727C5AC), the reference's default norm eps
IGNORE_INDEX = -1  # [loss.token.c1]


def _softmax_ops(ops):
    """The softmax module of a backend (``refreplay.training.backend`` bundles none)."""
    if ops.name == "cpu":
        from ..ops import softmax
    else:
        from cuda_backend.host.ops import softmax
    return softmax


def _last_axis(name: str, x: torch.Tensor, normalized_shape) -> int:
    C = x.shape[-1] if x.dim() else 0
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    if tuple(normalized_shape) != (C,):
        raise Unsupported(
            f"{name}: only normalisation over the last axis is covered; normalized_shape "
            f"{tuple(normalized_shape)} does not equal ({C},)"
        )
    return C


def _refuse(name: str, **args) -> None:
    """Raise for every argument whose value is not the one the spec covers:
    args maps an argument name to (given value, covered value)."""
    for arg, (given, covered) in args.items():
        if given is covered or given == covered:
            continue
        raise Unsupported(f"{name}: {arg}={given!r} is not covered by the spec (only {covered!r})")


# ---- linear -----------------------------------------------------------------------


class Linear(torch.autograd.Function):
    """[linear.fwd.c1] [linear.bwd.c1] y = x·Wᵀ (+ b): x [..., C], W [OC, C]."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ops = backend_of(x, weight, bias)
        with inside_reference():
            x2 = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
            xn, wn = to_numpy("input", x2), to_numpy("weight", weight)
            bn = None if bias is None else to_numpy("bias", bias)
            y = ops.linear.linear_forward(xn, wn, bn)
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return from_numpy(y, x).reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        ops = backend_of(x, weight, dy)
        with inside_reference():
            dyn = to_numpy("grad_output", dy.reshape(-1, dy.shape[-1]))
            xn = to_numpy("input", x.reshape(-1, x.shape[-1]), False)
            dx, dw, db = ops.linear.linear_backward(dyn, xn, to_numpy("weight", weight, False), ctx.has_bias)
        return (
            from_numpy(dx, x).reshape(x.shape),
            from_numpy(dw, weight),
            None if db is None else from_numpy(db, weight),
        )


@eager
def linear(input, weight, bias=None):
    """[linear.fwd.c1] torch.nn.functional.linear, spec-exact."""
    return Linear.apply(input, weight, bias)


class QLinear(torch.autograd.Function):
    """[quant.linear.fwd.c1] [quant.linear.bwd.c1] int8 quantization-aware
    linear: x [B, T, C] (one re-pinned step per sequence b), W [OC, C]."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ops = backend_of(x, weight, bias)
        if x.dim() != 3:
            raise Unsupported(
                f"qlinear: input must be [B, T, C] (steps are per sequence, "
                f"[quant.granularity.c1]), got shape {tuple(x.shape)}"
            )
        with inside_reference():
            bn = None if bias is None else to_numpy("bias", bias)
            y = ops.quant.qlinear_forward(to_numpy("input", x), to_numpy("weight", weight), bn)
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return from_numpy(y, x)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        ops = backend_of(x, weight, dy)
        with inside_reference():
            dx, dw, db = ops.quant.qlinear_backward(
                to_numpy("grad_output", dy),
                to_numpy("input", x, False),
                to_numpy("weight", weight, False),
                ctx.has_bias,
            )
        return from_numpy(dx, x), from_numpy(dw, weight), None if db is None else from_numpy(db, weight)


@eager
def qlinear(input, weight, bias=None):
    """[quant.linear.fwd.c1] int8-QAT linear of [B, T, C] activations."""
    return QLinear.apply(input, weight, bias)


# ---- norms --------------------------------------------------------------------------


class LayerNorm(torch.autograd.Function):
    """[norm.layer.fwd.c1] [norm.layer.bwd.c1] over the last axis of x [..., C];
    bias None is the bias -0 of [norm.layer.nobias.c1] and weight None the
    weight 1 of [norm.layer.noaffine.c1] (neither then has a gradient)."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        ops = backend_of(x, weight, bias)
        c = x.shape[-1]
        with inside_reference():
            xn = to_numpy("input", x.reshape(-1, c))
            w = np.ones(c, np.float32) if weight is None else to_numpy("weight", weight)  # [norm.layer.noaffine.c1]
            b = (
                np.full(c, -0.0, np.float32)
                if bias is None  # [norm.layer.nobias.c1]
                else to_numpy("bias", bias)
            )
            out, mean, rstd = ops.norms.layernorm_forward(xn, w, b, eps)
        ctx.save_for_backward(x, weight)
        ctx.stats = (mean, rstd)
        ctx.has_bias = bias is not None
        return from_numpy(out, x).reshape(x.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        x, weight = ctx.saved_tensors
        ops = backend_of(x, weight, dout)
        c = x.shape[-1]
        with inside_reference():
            w = np.ones(c, np.float32) if weight is None else to_numpy("weight", weight, False)
            dx, dw, db = ops.norms.layernorm_backward(
                to_numpy("grad_output", dout.reshape(-1, c)), to_numpy("input", x.reshape(-1, c), False), w, *ctx.stats
            )
        dw = None if weight is None else from_numpy(dw, weight)
        db = from_numpy(db, x) if ctx.has_bias else None
        return from_numpy(dx, x).reshape(x.shape), dw, db, None


@eager
def layer_norm(input, normalized_shape, weight=None, bias=None, eps=EPS):
    """[norm.layer.fwd.c1] torch.nn.functional.layer_norm over the last axis;
    bias=None is LayerNorm without a bias, the bias -0 ([norm.layer.nobias.c1]:
    bitwise the result of omitting the add), and weight=None LayerNorm without
    a weight, the weight 1 ([norm.layer.noaffine.c1]: bitwise the result of
    omitting the multiply)."""
    _last_axis("layer_norm", input, normalized_shape)
    return LayerNorm.apply(input, weight, bias, f32_scalar("eps", eps))


class RMSNorm(torch.autograd.Function):
    """[norm.rms.fwd.c1] [norm.rms.bwd.c1] over the last axis of x [..., C]."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        ops = backend_of(x, weight)
        with inside_reference():
            xn = to_numpy("input", x.reshape(-1, x.shape[-1]))
            out, rrms = ops.norms.rmsnorm_forward(xn, to_numpy("weight", weight), eps)
        ctx.save_for_backward(x, weight)
        ctx.rrms = rrms
        return from_numpy(out, x).reshape(x.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        x, weight = ctx.saved_tensors
        ops = backend_of(x, weight, dout)
        with inside_reference():
            dx, dw = ops.norms.rmsnorm_backward(
                to_numpy("grad_output", dout.reshape(-1, x.shape[-1])),
                to_numpy("input", x.reshape(-1, x.shape[-1]), False),
                to_numpy("weight", weight, False),
                ctx.rrms,
            )
        return from_numpy(dx, x).reshape(x.shape), from_numpy(dw, weight), None


@eager
def rms_norm(input, normalized_shape, weight=None, eps=EPS):
    """[norm.rms.fwd.c1] torch.nn.functional.rms_norm over the last axis;
    weight is required.  eps=None (PyTorch's "machine epsilon") is taken as
    2^-23, which is exactly a binary32."""
    _last_axis("rms_norm", input, normalized_shape)
    if weight is None:
        raise Unsupported("rms_norm: weight is required (the spec's RMSNorm has a weight)")
    eps = np.float32(2.0**-23) if eps is None else eps
    return RMSNorm.apply(input, weight, f32_scalar("eps", eps))


# ---- embedding ----------------------------------------------------------------------


class Embedding(torch.autograd.Function):
    """[emb.fwd.c1] [emb.bwd.c1] rows of wte [V, C] gathered by integer ids
    of any shape; the backward sums rows in increasing flat index."""

    @staticmethod
    def forward(ctx, tokens, weight):
        ops = backend_of(tokens, weight)
        with inside_reference():
            ids = tokens_to_numpy("input", tokens).reshape(1, -1)
            out = ops.embedding.embedding_forward(to_numpy("weight", weight), ids)
        ctx.ids = ids
        ctx.save_for_backward(weight)
        return from_numpy(out, weight).reshape(*tokens.shape, weight.shape[1])

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        (weight,) = ctx.saved_tensors
        ops = backend_of(weight, dout)
        V, C = weight.shape
        with inside_reference():
            dn = to_numpy("grad_output", dout.reshape(1, -1, C))
            dw = ops.embedding.embedding_backward(dn, ctx.ids, V)
        return None, from_numpy(dw, weight)


@eager
def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False, sparse=False):
    """[emb.fwd.c1] torch.nn.functional.embedding; the optional behaviours
    (padding row, renormalisation, frequency scaling, sparse gradients) are
    not covered."""
    _refuse(
        "embedding",
        padding_idx=(padding_idx, None),
        max_norm=(max_norm, None),
        norm_type=(norm_type, 2.0),
        scale_grad_by_freq=(scale_grad_by_freq, False),
        sparse=(sparse, False),
    )
    return Embedding.apply(input, weight)


# ---- activations --------------------------------------------------------------------


def _unary_forward(ctx, x, op):
    ops = backend_of(x)
    with inside_reference():
        out = getattr(ops.activations, f"{op}_forward")(to_numpy("input", x))
    ctx.save_for_backward(x)
    return from_numpy(out, x)


def _unary_backward(ctx, dout, op):
    (x,) = ctx.saved_tensors
    ops = backend_of(x, dout)
    with inside_reference():
        dx = getattr(ops.activations, f"{op}_backward")(to_numpy("grad_output", dout), to_numpy("input", x, False))
    return from_numpy(dx, x)


class GELU(torch.autograd.Function):
    """[act.gelu.fwd.c1] [act.gelu.bwd.c1] the tanh form, elementwise."""

    @staticmethod
    def forward(ctx, x):
        return _unary_forward(ctx, x, "gelu")

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        return _unary_backward(ctx, dout, "gelu")


class SiLU(torch.autograd.Function):
    """[act.silu.fwd.c1] [act.silu.bwd.c1] elementwise."""

    @staticmethod
    def forward(ctx, x):
        return _unary_forward(ctx, x, "silu")

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        return _unary_backward(ctx, dout, "silu")


@eager
def gelu(input, approximate="tanh"):
    """[act.gelu.fwd.c1] GELU in the spec's tanh form.  approximate="none"
    (PyTorch's default, the erf form) is not specified and is refused,
    naming the form to use ([why.gelu.erf.r1])."""
    _refuse_erf_gelu("gelu", approximate)
    return GELU.apply(input)


def _refuse_erf_gelu(name: str, approximate) -> None:
    if approximate == "none":
        raise Unsupported(
            f"{name}: approximate='none' (the exact erf GELU, PyTorch's default) is not defined "
            "by the spec ([why.gelu.erf.r1]); use the tanh form: nn.GELU(approximate='tanh') "
            "or F.gelu(x, approximate='tanh'), within 4.8e-4 of the erf form"
        )
    _refuse(name, approximate=(approximate, "tanh"))


@eager
def silu(input, inplace=False):
    """[act.silu.fwd.c1] x * sigmoid(x); in-place is not covered."""
    _refuse("silu", inplace=(inplace, False))
    return SiLU.apply(input)


class SwiGLU(torch.autograd.Function):
    """[act.swiglu.fwd.c1] [act.swiglu.bwd.c1] silu(gate) * up."""

    @staticmethod
    def forward(ctx, gate, up):
        ops = backend_of(gate, up)
        with inside_reference():
            out = ops.activations.swiglu_forward(to_numpy("gate", gate), to_numpy("up", up))
        ctx.save_for_backward(gate, up)
        return from_numpy(out, gate)

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        gate, up = ctx.saved_tensors
        ops = backend_of(gate, up, dout)
        with inside_reference():
            da, db = ops.activations.swiglu_backward(
                to_numpy("grad_output", dout), to_numpy("gate", gate, False), to_numpy("up", up, False)
            )
        return from_numpy(da, gate), from_numpy(db, up)


@eager
def swiglu(gate, up):
    """[act.swiglu.fwd.c1] silu(gate) * up, elementwise, same shapes."""
    return SwiGLU.apply(gate, up)


# ---- rotary embedding ---------------------------------------------------------------


@eager
def rope_tables(T: int, HS: int, theta=np.float32(10000.0), device="cpu"):
    """[rope.freq.c1] (cos, sin), each [T, HS/2] float32, on ``device``."""
    dev = torch.device(device)
    ops = backend_of(torch.empty(0, device=dev))
    with inside_reference():
        cos_t, sin_t = ops.rope.rope_tables(T, HS, f32_scalar("theta", theta))
    like = torch.empty(0, device=dev)
    return from_numpy(cos_t, like), from_numpy(sin_t, like)


class Rope(torch.autograd.Function):
    """[rope.fwd.c1] [rope.bwd.c1] half-split rotation of x [B, NH, T, HS]."""

    @staticmethod
    def forward(ctx, x, cos_t, sin_t):
        ops = backend_of(x, cos_t, sin_t)
        if x.dim() != 4:
            raise Unsupported(f"rope: input must be [B, NH, T, HS], got shape {tuple(x.shape)}")
        with inside_reference():
            tables = (to_numpy("cos", cos_t), to_numpy("sin", sin_t))
            out = ops.rope.rope_forward(to_numpy("input", x), *tables)
        ctx.tables = tables
        return from_numpy(out, x)

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        ops = backend_of(dout)
        with inside_reference():
            dx = ops.rope.rope_backward(to_numpy("grad_output", dout), *ctx.tables)
        return from_numpy(dx, dout), None, None


@eager
def rope(x, cos, sin):
    """[rope.fwd.c1] Rotary embedding of q or k [B, NH, T, HS] with the
    tables of ``rope_tables`` (no gradient flows into the tables)."""
    if cos.requires_grad or sin.requires_grad:
        raise Unsupported("rope: gradients with respect to the tables are not covered")
    return Rope.apply(x, cos, sin)


# ---- attention ----------------------------------------------------------------------


class CausalAttention(torch.autograd.Function):
    """[attn.scores.c1] [attn.out.c1] [attn.bwd.c1] q, k, v [B, NH, T, HS]."""

    @staticmethod
    def forward(ctx, q, k, v):
        ops = backend_of(q, k, v)
        for name, t in (("q", q), ("k", k), ("v", v)):
            if t.dim() != 4 or t.shape != q.shape:
                raise Unsupported(f"causal_attention: {name} must be [B, NH, T, HS] like q, got {tuple(t.shape)}")
        with inside_reference():
            qn, kn, vn = to_numpy("q", q), to_numpy("k", k), to_numpy("v", v)
            out, att = ops.attention.attention_forward(qn, kn, vn)
        ctx.save_for_backward(q, k, v)
        ctx.att = att
        return from_numpy(out, q)

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        q, k, v = ctx.saved_tensors
        ops = backend_of(q, dout)
        with inside_reference():
            dq, dk, dv = ops.attention.attention_backward(
                to_numpy("grad_output", dout),
                to_numpy("q", q, False),
                to_numpy("k", k, False),
                to_numpy("v", v, False),
                ctx.att,
            )
        return from_numpy(dq, q), from_numpy(dk, k), from_numpy(dv, v)


@eager
def causal_attention(q, k, v):
    """[attn.scores.c1] Causal softmax(q·kᵀ·recip(sqrt(HS)))·v per head."""
    return CausalAttention.apply(q, k, v)


@eager
def scaled_dot_product_attention(
    query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
):
    """torch.nn.functional.scaled_dot_product_attention restricted to what
    the spec covers: is_causal=True, no mask, no dropout, the default scale,
    no grouped heads."""
    _refuse(
        "scaled_dot_product_attention",
        attn_mask=(attn_mask, None),
        dropout_p=(dropout_p, 0.0),
        is_causal=(is_causal, True),
        scale=(scale, None),
        enable_gqa=(enable_gqa, False),
    )
    return causal_attention(query, key, value)


# ---- softmax ------------------------------------------------------------------------


def _softmax_forward(ctx, x, op):
    ops = backend_of(x)
    with inside_reference():
        y = getattr(_softmax_ops(ops), f"{op}_forward")(to_numpy("input", x))
    ctx.y = y  # the backward takes the forward output
    return from_numpy(y, x)


def _softmax_backward(ctx, dy, op):
    ops = backend_of(dy)
    with inside_reference():
        dx = getattr(_softmax_ops(ops), f"{op}_backward")(to_numpy("grad_output", dy), ctx.y)
    return from_numpy(dx, dy)


class Softmax(torch.autograd.Function):
    """[softmax.fwd.c1] [softmax.bwd.c1] over the last axis."""

    @staticmethod
    def forward(ctx, x):
        return _softmax_forward(ctx, x, "softmax")

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        return _softmax_backward(ctx, dy, "softmax")


class LogSoftmax(torch.autograd.Function):
    """[softmax.log.c1] [softmax.log.bwd.c1] over the last axis."""

    @staticmethod
    def forward(ctx, x):
        return _softmax_forward(ctx, x, "log_softmax")

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        return _softmax_backward(ctx, dy, "log_softmax")


def _softmax_args(name, x, dim, dtype):
    if dim is None or (dim != -1 and dim != x.dim() - 1):
        raise Unsupported(f"{name}: only the last axis is covered (dim=-1), got dim={dim!r}")
    _refuse(name, dtype=(dtype, None))


@eager
def softmax(input, dim=-1, dtype=None):
    """[softmax.fwd.c1] Softmax over the last axis."""
    _softmax_args("softmax", input, dim, dtype)
    return Softmax.apply(input)


@eager
def log_softmax(input, dim=-1, dtype=None):
    """[softmax.log.c1] Log-softmax over the last axis."""
    _softmax_args("log_softmax", input, dim, dtype)
    return LogSoftmax.apply(input)


# ---- loss ---------------------------------------------------------------------------


class CrossEntropy(torch.autograd.Function):
    """[loss.token.c1] [loss.mean.c1] [loss.bwd.c1] mean cross-entropy of
    logits [N, V] against int targets [N]; ignore index -1."""

    @staticmethod
    def forward(ctx, logits, targets):
        ops = backend_of(logits, targets)
        with inside_reference():
            ln, y = to_numpy("input", logits), tokens_to_numpy("target", targets)
            _, mean, _ = ops.loss.cross_entropy_forward(ln, y)
        ctx.save_for_backward(logits)
        ctx.y = y
        return from_numpy(np.array(mean, np.float32), logits)

    @staticmethod
    @once_differentiable
    def backward(ctx, dloss):
        (logits,) = ctx.saved_tensors
        ops = backend_of(logits, dloss)
        with inside_reference():
            g = to_numpy("grad_output", dloss).reshape(())
            dlogits = ops.loss.cross_entropy_backward(to_numpy("input", logits, False), ctx.y, dloss=np.float32(g))
        return from_numpy(dlogits, logits), None


@eager
def cross_entropy(
    input,
    target,
    weight=None,
    size_average=None,
    ignore_index=IGNORE_INDEX,
    reduce=None,
    reduction="mean",
    label_smoothing=0.0,
):
    """[loss.mean.c1] torch.nn.functional.cross_entropy for logits [N, V]
    and class-index targets [N], mean reduction, ignore index -1 only."""
    _refuse(
        "cross_entropy",
        weight=(weight, None),
        size_average=(size_average, None),
        ignore_index=(ignore_index, IGNORE_INDEX),
        reduce=(reduce, None),
        reduction=(reduction, "mean"),
        label_smoothing=(label_smoothing, 0.0),
    )
    if input.dim() != 2 or target.dim() != 1:
        raise Unsupported(
            f"cross_entropy: logits [N, V] and targets [N] are covered, got "
            f"{tuple(input.shape)} and {tuple(target.shape)}"
        )
    if target.is_floating_point():
        raise Unsupported("cross_entropy: class-probability targets are not covered (class indices only)")
    return CrossEntropy.apply(input, target)


# ---- residual additions -------------------------------------------------------------


class Add(torch.autograd.Function):
    """[model.residual.c1] a + b elementwise ([num.add.c1]); both gradients
    are the incoming gradient unchanged."""

    @staticmethod
    def forward(ctx, a, b):
        ops = backend_of(a, b)
        if a.shape != b.shape:
            raise Unsupported(f"add: broadcasting is not covered, shapes {tuple(a.shape)} and {tuple(b.shape)}")
        with inside_reference():
            out = ops.elementwise.add(to_numpy("a", a), to_numpy("b", b))
        return from_numpy(out, a)

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        return g, g


@eager
def add(a, b):
    """[model.residual.c1] The residual addition a + b, a on the left."""
    return Add.apply(a, b)


class Fork(torch.autograd.Function):
    """[model.residual.c1] [model.backward.c1] x -> (x, x): a tensor used
    twice.  The backward is add(g_first, g_second), the first output's
    gradient on the left, as the spec's gradient sums are written."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x), x.view_as(x)

    @staticmethod
    @once_differentiable
    def backward(ctx, g0, g1):
        if g0 is None or g1 is None:
            return g1 if g0 is None else g0
        ops = backend_of(g0, g1)
        with inside_reference():
            out = ops.elementwise.add(to_numpy("grad_first", g0), to_numpy("grad_second", g1))
        return from_numpy(out, g0)


@eager
def fork(x):
    """[model.residual.c1] Two uses of x whose gradients the backward adds
    with the spec's add, first use on the left.  Use it wherever a tensor
    feeds two computations (the residual stream, a tied weight, a SwiGLU
    input): autograd would otherwise sum them with PyTorch's own add, which
    neither flushes subnormals nor makes NaNs canonical ([num.add.c1])."""
    return Fork.apply(x)
