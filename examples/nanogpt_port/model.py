"""A nanoGPT-style GPT ported to refreplay.torch with the edits of
docs/torch.md, "Porting a model" (each marked ``# port:`` below).

The architecture is nanoGPT's: learned token and position embeddings,
pre-LayerNorm blocks with causal self-attention through
``scaled_dot_product_attention(is_causal=True)``, a 4x GELU MLP, a final
LayerNorm and a head tied to the token embedding.  ``plain=True`` builds
the same model from ``torch.nn`` and ``torch.nn.functional`` (PyTorch's
own kernels, nanoGPT as written): the speed yardstick of
benchmarks/bench_torch.py and the tolerance oracle of the tests.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as TF
from torch import nn

import refreplay.torch as rt
from refreplay.torch import functional as RF


@dataclass
class Config:
    vocab: int = 256
    block: int = 32  # T, the sequence length (nanoGPT's block_size)
    layers: int = 2
    heads: int = 2
    width: int = 64
    bias: bool = True
    gelu: str = "tanh"  # port: "none" (erf, nanoGPT's nn.GELU()) where the spec defines it


class _Ops:
    """The functions a forward calls: refreplay's (spec-exact) or PyTorch's."""

    def __init__(self, plain: bool):
        self.plain = plain
        if plain:
            self.add = torch.add
            self.fork = lambda x: (x, x)
            self.sdpa = TF.scaled_dot_product_attention
            self.embedding = TF.embedding
            self.linear = TF.linear
            self.cross_entropy = lambda logits, y: TF.cross_entropy(logits, y, ignore_index=-1)
        else:
            self.add = RF.add  # port: the residual + is the spec's add
            self.fork = RF.fork  # port: a tensor used twice is forked
            self.sdpa = RF.scaled_dot_product_attention  # port: same signature, is_causal=True
            self.embedding = RF.embedding
            self.linear = RF.linear
            self.cross_entropy = RF.cross_entropy


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: Config, ops: _Ops):
        super().__init__()
        self.ops, self.heads = ops, cfg.heads
        self.c_attn = nn.Linear(cfg.width, 3 * cfg.width, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.width, cfg.width, bias=cfg.bias)
        self.attn_dropout = nn.Dropout(0.0)  # port: p = 0 only (p > 0 is refused)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        k = k.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        v = v.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        y = self.ops.sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.c_fc = nn.Linear(cfg.width, 4 * cfg.width, bias=cfg.bias)
        self.gelu = nn.GELU(approximate=cfg.gelu)
        self.c_proj = nn.Linear(4 * cfg.width, cfg.width, bias=cfg.bias)
        self.dropout = nn.Dropout(0.0)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, cfg: Config, ops: _Ops):
        super().__init__()
        self.ops = ops
        self.ln_1 = nn.LayerNorm(cfg.width, eps=float(np.float32(1e-5)), bias=cfg.bias)  # port: eps a binary32
        self.attn = CausalSelfAttention(cfg, ops)
        self.ln_2 = nn.LayerNorm(cfg.width, eps=float(np.float32(1e-5)), bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x, x_attn = self.ops.fork(x)
        x = self.ops.add(x, self.attn(self.ln_1(x_attn)))
        x, x_mlp = self.ops.fork(x)
        return self.ops.add(x, self.mlp(self.ln_2(x_mlp)))


class GPT(nn.Module):
    def __init__(self, cfg: Config, plain: bool = False, seed: int = 0):
        super().__init__()
        self.cfg, self.ops = cfg, _Ops(plain)
        self.wte = nn.Embedding(cfg.vocab, cfg.width)
        self.wpe = nn.Embedding(cfg.block, cfg.width)
        self.drop = nn.Dropout(0.0)
        self.h = nn.ModuleList([Block(cfg, self.ops) for _ in range(cfg.layers)])
        self.ln_f = nn.LayerNorm(cfg.width, eps=float(np.float32(1e-5)), bias=cfg.bias)
        # port: the position ids are a buffer made once, not an arange in every forward
        self.register_buffer("pos", torch.arange(cfg.block, dtype=torch.int64), persistent=False)
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("bias"):
                    p.zero_()
                elif p.dim() == 2:
                    p.normal_(0.0, 0.02, generator=gen)
                rt.load_(p)  # port: tensors from torch's initialisers are loaded ([num.load.c1])

    def forward(self, idx, targets):
        ops = self.ops
        B, T = idx.shape
        # The head is tied to the token embedding (nanoGPT's
        # ``lm_head.weight = wte.weight``): one Parameter used twice.
        w_emb, w_head = ops.fork(self.wte.weight)  # port: the tied weight is forked
        tok = ops.embedding(idx, w_emb)
        # port: the position rows are gathered per token ([B, T] ids), so their
        # gradient is the embedding's ordered scatter-add, not a broadcast's sum
        pos = ops.embedding(self.pos[:T].expand(B, T).contiguous(), self.wpe.weight)
        x = self.drop(ops.add(tok, pos))
        for block in self.h:
            x = block(x)
        logits = ops.linear(self.ln_f(x), w_head)
        return ops.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def build(cfg: Config, plain: bool = False, seed: int = 0) -> GPT:
    """The model, converted to refreplay.torch unless ``plain``."""
    model = GPT(cfg, plain, seed)
    if not plain:
        rt.convert(model)  # strict: raises naming every blocker
    return model
