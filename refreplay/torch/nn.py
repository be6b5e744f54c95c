"""Drop-in ``torch.nn`` modules whose forward and backward are the spec's
(``refreplay.torch.functional``).  Parameters keep PyTorch's names
(``weight``, ``bias``) and shapes, so state dicts, optimizers and
``convert`` treat them like the modules they replace.

Initial values come from PyTorch's own initialisers (the user's choice, as
in any run: the published state 0 pins them); call ``refreplay.torch.load_``
on a tensor that may hold subnormals before it enters an op.

Shapes (spec letters): activations [B, T, C]; heads [B, NH, T, HS].
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from . import functional as F
from ._bridge import Unsupported, f32_scalar

QUANT = (None, "int8")


class Linear(nn.Linear):
    """[linear.fwd.c1] y = x·Wᵀ (+ b); with quant="int8" the int8
    quantization-aware linear of [quant.linear.fwd.c1] (input [B, T, C])."""

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None, quant=None):
        if quant not in QUANT:
            raise Unsupported(f"Linear: quant must be one of {QUANT}, got {quant!r}")
        super().__init__(in_features, out_features, bias, device, dtype)
        self.quant = quant

    def forward(self, x):
        if self.quant == "int8":
            return F.qlinear(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self):
        return super().extra_repr() + (f", quant={self.quant!r}" if self.quant else "")


class LayerNorm(nn.LayerNorm):
    """[norm.layer.fwd.c1] over the last axis with a weight, and a bias
    unless ``bias=False`` (then the bias -0, [norm.layer.nobias.c1]);
    ``elementwise_affine=False`` has neither (the weight 1 and the bias -0,
    [norm.layer.noaffine.c1]: the normalised rows themselves, bit for bit).
    eps is a binary32 (default f32(0x3727C5AC))."""

    def __init__(self, normalized_shape, eps=F.EPS, elementwise_affine=True, bias=True, device=None, dtype=None):
        eps = f32_scalar("eps", eps)
        super().__init__(normalized_shape, float(eps), bool(elementwise_affine), bool(bias), device, dtype)
        if len(self.normalized_shape) != 1:
            raise Unsupported(f"LayerNorm: only the last axis is covered, got {self.normalized_shape}")

    def forward(self, x):
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


class RMSNorm(nn.Module):
    """[norm.rms.fwd.c1] over the last axis with a weight; eps a binary32."""

    def __init__(self, normalized_shape, eps=F.EPS, device=None, dtype=None):
        super().__init__()
        if isinstance(normalized_shape, int):
            normalized_shape = (normalized_shape,)
        if len(normalized_shape) != 1:
            raise Unsupported(f"RMSNorm: only the last axis is covered, got {tuple(normalized_shape)}")
        self.normalized_shape = tuple(normalized_shape)
        self.eps = float(f32_scalar("eps", np.float32(2.0**-23) if eps is None else eps))
        self.weight = nn.Parameter(torch.ones(self.normalized_shape, device=device, dtype=dtype))

    def forward(self, x):
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self):
        return f"{self.normalized_shape}, eps={self.eps}"


class Embedding(nn.Embedding):
    """[emb.fwd.c1] A row gather; its backward is the ordered scatter-add of
    [emb.bwd.c1].  padding_idx, max_norm and sparse are not covered."""

    def __init__(
        self,
        num_embeddings,
        embedding_dim,
        padding_idx=None,
        max_norm=None,
        norm_type=2.0,
        scale_grad_by_freq=False,
        sparse=False,
        _weight=None,
        _freeze=False,
        device=None,
        dtype=None,
    ):
        F._refuse(
            "Embedding",
            padding_idx=(padding_idx, None),
            max_norm=(max_norm, None),
            norm_type=(norm_type, 2.0),
            scale_grad_by_freq=(scale_grad_by_freq, False),
            sparse=(sparse, False),
        )
        super().__init__(num_embeddings, embedding_dim, None, None, 2.0, False, False, _weight, _freeze, device, dtype)

    def forward(self, tokens):
        return F.embedding(tokens, self.weight)


class GELU(nn.Module):
    """[act.gelu.fwd.c1] the tanh form only; the erf form is refused
    naming the tanh form ([why.gelu.erf.r1])."""

    def __init__(self, approximate="tanh"):
        super().__init__()
        F._refuse_erf_gelu("GELU", approximate)
        self.approximate = approximate

    def forward(self, x):
        return F.gelu(x)


class SiLU(nn.Module):
    """[act.silu.fwd.c1]"""

    def __init__(self, inplace=False):
        super().__init__()
        F._refuse("SiLU", inplace=(inplace, False))

    def forward(self, x):
        return F.silu(x)


class Softmax(nn.Module):
    """[softmax.fwd.c1] over the last axis."""

    def __init__(self, dim=-1):
        super().__init__()
        if dim != -1:
            raise Unsupported(f"Softmax: only dim=-1 is covered, got {dim!r}")
        self.dim = dim

    def forward(self, x):
        return F.softmax(x, -1)


class LogSoftmax(nn.Module):
    """[softmax.log.c1] over the last axis."""

    def __init__(self, dim=-1):
        super().__init__()
        if dim != -1:
            raise Unsupported(f"LogSoftmax: only dim=-1 is covered, got {dim!r}")
        self.dim = dim

    def forward(self, x):
        return F.log_softmax(x, -1)


class CrossEntropyLoss(nn.Module):
    """[loss.mean.c1] mean cross-entropy of logits [N, V], ignore index -1."""

    def __init__(self, ignore_index=F.IGNORE_INDEX, reduction="mean", label_smoothing=0.0):
        super().__init__()
        F._refuse(
            "CrossEntropyLoss",
            ignore_index=(ignore_index, F.IGNORE_INDEX),
            reduction=(reduction, "mean"),
            label_smoothing=(label_smoothing, 0.0),
        )

    def forward(self, logits, targets):
        return F.cross_entropy(logits, targets)


class Residual(nn.Module):
    """[model.residual.c1] x -> add(x, branch(x)), the residual stream on the
    left; the stream is forked, so its gradient is add(g_stream, g_branch)."""

    def __init__(self, branch: nn.Module):
        super().__init__()
        self.branch = branch

    def forward(self, x):
        skip, inner = F.fork(x)
        return F.add(skip, self.branch(inner))


class CausalSelfAttention(nn.Module):
    """[model.forward.c1] steps 3-5: qkv = Linear(C, 3C)(x); q, k, v are the
    three C-wide parts, split into NH heads of HS channels (exact copies);
    rotary on q and k ([rope.fwd.c1]) unless ``rope=False`` (a model with
    learned positions, [model.pos.c1]: no rotation, rope_theta unused);
    causal attention ([attn.out.c1]); heads merged back to [B, T, C];
    proj = Linear(C, C).  x: [B, T, C] with T = seq_len."""

    def __init__(
        self, width, heads, seq_len, rope_theta=np.float32(10000.0), bias=False, quant=None, device=None, rope=True
    ):
        super().__init__()
        if not isinstance(rope, bool):
            raise Unsupported(f"CausalSelfAttention: rope must be True or False, got {rope!r}")
        if width % heads or (rope and (width // heads) % 2):
            raise Unsupported(
                f"CausalSelfAttention: width {width} must split into {heads} heads"
                + (" of even size (rotary pairs)" if rope else "")
            )
        self.heads, self.head_size, self.seq_len, self.rope = heads, width // heads, int(seq_len), rope
        self.qkv = Linear(width, 3 * width, bias=bias, device=device, quant=quant)
        self.proj = Linear(width, width, bias=bias, device=device, quant=quant)
        if rope:
            cos, sin = F.rope_tables(seq_len, self.head_size, rope_theta, device or "cpu")
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)
        else:
            self.rope_cos = self.rope_sin = None

    def forward(self, x):
        B, T, C = x.shape
        NH, HS = self.heads, self.head_size
        if T != self.seq_len:
            raise Unsupported(f"CausalSelfAttention: sequence length {T}, the module was built for {self.seq_len}")
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, NH, HS).transpose(1, 2)
        k = k.view(B, T, NH, HS).transpose(1, 2)
        if self.rope:
            q = F.rope(q, self.rope_cos, self.rope_sin)
            k = F.rope(k, self.rope_cos, self.rope_sin)
        v = v.view(B, T, NH, HS).transpose(1, 2)
        o = F.causal_attention(q, k, v)
        return self.proj(o.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    """[model.forward.c1] step 7: proj(gelu(fc(x))) for kind="gelu";
    proj(swiglu(gate(x), up(x))) for kind="swiglu", x forked so that its
    gradient is add(from gate, from up) ([model.backward.c1])."""

    def __init__(self, width, hidden, kind="gelu", bias=False, quant=None, device=None):
        super().__init__()
        if kind not in ("gelu", "swiglu"):
            raise Unsupported(f"MLP: kind must be 'gelu' or 'swiglu', got {kind!r}")
        self.kind = kind
        if kind == "gelu":
            self.fc = Linear(width, hidden, bias=bias, device=device, quant=quant)
        else:
            self.gate = Linear(width, hidden, bias=bias, device=device, quant=quant)
            self.up = Linear(width, hidden, bias=bias, device=device, quant=quant)
        self.proj = Linear(hidden, width, bias=bias, device=device, quant=quant)

    def forward(self, x):
        if self.kind == "gelu":
            return self.proj(F.gelu(self.fc(x)))
        xg, xu = F.fork(x)
        return self.proj(F.swiglu(self.gate(xg), self.up(xu)))
