"""A GPT written in ordinary PyTorch style from refreplay.torch modules.

With the configuration of a refreplay preset it computes exactly the
reference model of spec/20-model.txt, so a run of it replays bit for bit
(tests/test_torch_gpt.py checks vectors/steps.json).  Nothing here is
refreplay-specific beyond the imports: swap ``rnn`` for ``torch.nn`` and
``F`` for ``torch.nn.functional`` and it is a plain nanoGPT-style model,
with three differences that the spec needs:

* ``F.fork`` where a tensor feeds two computations (the residual stream,
  a tied embedding, the SwiGLU input), and ``F.add`` for the residual
  addition, so that the gradient sums and the residual sums are the spec's
  ([model.residual.c1]) and not autograd's own ``+``;
* the head split keeps the spec's layout (q, k, v each C wide);
* parameter names map onto the reference's by ``reference_name``, because
  the state hash and the clipping order use names ([step.state.c1]).

With ``pos="learned"`` and ``norm="layer"`` (``nanogpt_config``) it is
nanoGPT's architecture: a learned position table ``wpe`` added to the
token rows (no rotary), LayerNorm with or without bias, tanh GELU, the
head tied to ``wte`` ([model.pos.c1], [norm.layer.nobias.c1]).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from refreplay.torch import functional as F
from refreplay.torch import nn as rnn


def _norm(cfg):
    if cfg.norm == "rms":
        return rnn.RMSNorm(cfg.width, eps=cfg.norm_eps)
    return rnn.LayerNorm(cfg.width, eps=cfg.norm_eps, bias=cfg.norm_bias)  # bias=False: [norm.layer.nobias.c1]


def nanogpt_config(base, bias: bool = True):
    """nanoGPT's architecture at ``base``'s shape: learned positions,
    LayerNorm, GELU (tanh), tied head; linear and norm biases both on or
    both off (nanoGPT's ``bias`` flag)."""
    return dataclasses.replace(
        base, norm="layer", mlp="gelu", tied=True, pos="learned", bias=bias, norm_bias=bias
    ).validate()


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        quant = "int8" if cfg.linear == "int8" else None
        self.ln1 = _norm(cfg)
        self.attn = rnn.CausalSelfAttention(
            cfg.width, cfg.heads, cfg.seq_len, cfg.rope_theta, cfg.bias, quant, rope=cfg.pos == "rope"
        )
        self.ln2 = _norm(cfg)
        self.mlp = rnn.MLP(cfg.width, cfg.mlp_hidden, cfg.mlp, cfg.bias, quant)

    def forward(self, x):
        x, x_attn = F.fork(x)
        x = F.add(x, self.attn(self.ln1(x_attn)))
        x, x_mlp = F.fork(x)
        return F.add(x, self.mlp(self.ln2(x_mlp)))


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.wte = rnn.Embedding(cfg.vocab, cfg.width)
        if cfg.pos == "learned":  # [model.pos.c1]: wpe [T, C] and the ids p[b, t] = t, made once
            self.wpe = rnn.Embedding(cfg.seq_len, cfg.width)
            self.register_buffer("pos_ids", torch.arange(cfg.seq_len, dtype=torch.int32), persistent=False)
        self.h = nn.ModuleDict({f"{i:02d}": Block(cfg) for i in range(cfg.layers)})
        self.lnf = _norm(cfg)
        self.head = None if cfg.tied else rnn.Linear(cfg.width, cfg.vocab, bias=False)

    def forward(self, idx, targets):
        if self.cfg.tied:
            w_emb, w_head = F.fork(self.wte.weight)  # embedding's gradient on the left
            x = F.embedding(idx, w_emb)
        else:
            x = self.wte(idx)
        if self.cfg.pos == "learned":
            # nanoGPT's tok_emb + pos_emb: the position rows gathered per token
            # ([B, T] ids), so their gradient is [emb.bwd.c1]'s sum over b, and the
            # spec's add with the token rows on the left
            B, T = idx.shape
            x = F.add(x, self.wpe(self.pos_ids[:T].expand(B, T)))
        for block in self.h.values():
            x = block(x)
        x = self.lnf(x)
        logits = F.linear(x, w_head) if self.cfg.tied else self.head(x)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))


def reference_name(torch_name: str) -> str:
    """``h.00.attn.qkv.weight`` -> ``h.00.attn.qkv.w``; ``wte.weight`` -> ``wte``
    (the names of [model.params.c1])."""
    if torch_name in ("wte.weight", "wpe.weight"):
        return torch_name[:3]
    for suffix, short in ((".weight", ".w"), (".bias", ".b")):
        if torch_name.endswith(suffix):
            return torch_name[: -len(suffix)] + short
    raise ValueError(f"unexpected parameter {torch_name!r}")


def named_state(model: GPT) -> dict:
    """{reference name: parameter}: what the fold, clipping and the state use."""
    return {reference_name(n): p for n, p in model.named_parameters()}


def quant_names(model: GPT) -> list[str]:
    """The int8 weights whose re-pinned step sizes the state holds ([model.quant.c1])."""
    return sorted(
        reference_name(f"{n}.weight")
        for n, m in model.named_modules()
        if isinstance(m, rnn.Linear) and m.quant == "int8"
    )
