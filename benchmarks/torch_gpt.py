"""A PyTorch CPU eager model with refreplay's GPT architecture, for timing only.

Same shapes and the same op sequence as ``refreplay.training.model`` ([model.forward.c1]):
tied token embedding, per block RMSNorm (or LayerNorm) -> fused qkv linear ->
rotary embedding on q and k (rotate-half pairs i, i + HS/2) -> causal softmax
attention with scale 1/sqrt(HS) -> output projection -> residual add ->
RMSNorm -> GELU(tanh) MLP (or SwiGLU) -> residual add; final norm, tied head,
mean cross-entropy.  A step is forward, backward, global-norm clip, AdamW,
like ``refreplay.training.step.Trainer.step`` minus the state hash.

Nothing here checks bits: PyTorch is the speed yardstick, not an oracle.
The benchmarks import it; it never ships in the library.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def rope_tables(T: int, HS: int, theta: float):
    inv = theta ** (-torch.arange(0, HS // 2, dtype=torch.float32) * 2 / HS)
    ang = torch.arange(T, dtype=torch.float32)[:, None] * inv[None, :]
    return torch.cos(ang), torch.sin(ang)


def rope(x, cos, sin):
    """x [B, NH, T, HS]: out[i] = x[i] c - x[i+H2] s; out[i+H2] = x[i+H2] c + x[i] s."""
    h2 = x.shape[-1] // 2
    x1, x2 = x[..., :h2], x[..., h2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class RMSNorm(torch.nn.Module):
    def __init__(self, C: int, eps: float):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(C))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + self.eps) * self.w


class Block(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C, F_, bias = cfg.width, cfg.mlp_hidden, cfg.bias
        norm = (
            (lambda: RMSNorm(C, float(cfg.norm_eps)))
            if cfg.norm == "rms"
            else (lambda: torch.nn.LayerNorm(C, eps=float(cfg.norm_eps)))
        )
        self.ln1, self.ln2 = norm(), norm()
        self.qkv = torch.nn.Linear(C, 3 * C, bias=bias)
        self.proj = torch.nn.Linear(C, C, bias=bias)
        self.swiglu = cfg.mlp == "swiglu"
        if self.swiglu:
            self.gate = torch.nn.Linear(C, F_, bias=bias)
            self.up = torch.nn.Linear(C, F_, bias=bias)
        else:
            self.fc = torch.nn.Linear(C, F_, bias=bias)
        self.mproj = torch.nn.Linear(F_, C, bias=bias)
        self.NH, self.HS = cfg.heads, cfg.width // cfg.heads

    def forward(self, h, cos, sin, mask):
        B, T, C = h.shape
        NH, HS = self.NH, self.HS
        qkv = self.qkv(self.ln1(h)).view(B, T, 3, NH, HS).permute(2, 0, 3, 1, 4)
        q, k, v = rope(qkv[0], cos, sin), rope(qkv[1], cos, sin), qkv[2]
        att = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(HS))
        att = torch.softmax(att.masked_fill(mask, float("-inf")), dim=-1)
        o = (att @ v).transpose(1, 2).reshape(B, T, C)
        h = h + self.proj(o)
        n2 = self.ln2(h)
        g = F.silu(self.gate(n2)) * self.up(n2) if self.swiglu else F.gelu(self.fc(n2), approximate="tanh")
        return h + self.mproj(g)


class TorchGPT(torch.nn.Module):
    """refreplay's GPT for a ``ModelConfig`` (fp32 linears only)."""

    def __init__(self, cfg):
        super().__init__()
        if cfg.linear != "fp32":
            raise ValueError("torch_gpt models fp32 linears only")
        self.cfg = cfg
        self.wte = torch.nn.Embedding(cfg.vocab, cfg.width)
        self.blocks = torch.nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.lnf = (
            RMSNorm(cfg.width, float(cfg.norm_eps))
            if cfg.norm == "rms"
            else torch.nn.LayerNorm(cfg.width, eps=float(cfg.norm_eps))
        )
        self.head = None if cfg.tied else torch.nn.Linear(cfg.width, cfg.vocab, bias=False)
        cos, sin = rope_tables(cfg.seq_len, cfg.head_size, float(cfg.rope_theta))
        self.register_buffer("cos", cos)
        self.register_buffer("sin", sin)
        T = cfg.seq_len
        self.register_buffer("mask", torch.ones(T, T, dtype=torch.bool).triu(1))
        with torch.no_grad():
            for p in self.parameters():
                if p.ndim == 2:
                    p.uniform_(-0.0346, 0.0346)

    def forward(self, tokens, targets):
        h = self.wte(tokens)
        for blk in self.blocks:
            h = blk(h, self.cos, self.sin, self.mask)
        n = self.lnf(h)
        logits = n @ (self.wte.weight if self.head is None else self.head.weight).t()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


class TorchTrainer:
    """forward + backward per micro-batch (gradients summed), mean, clip, AdamW."""

    def __init__(self, model_cfg, train_cfg):
        self.model = TorchGPT(model_cfg)
        self.cfg = train_cfg
        decay = [p for p in self.model.parameters() if p.ndim >= 2]
        no_decay = [p for p in self.model.parameters() if p.ndim < 2]
        self.opt = torch.optim.AdamW(
            [
                {"params": decay, "weight_decay": float(train_cfg.weight_decay)},
                {"params": no_decay, "weight_decay": 0.0},
            ],
            lr=float(train_cfg.lr),
            betas=(float(train_cfg.beta1), float(train_cfg.beta2)),
            eps=float(train_cfg.eps),
            foreach=True,
        )

    def step(self, micro_batches):
        """``micro_batches``: list of (tokens, targets) int64 tensors [B, T]."""
        self.opt.zero_grad(set_to_none=True)
        M = len(micro_batches)
        total = 0.0
        for x, y in micro_batches:
            loss = self.model(x, y) / M
            loss.backward()
            total += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), float(self.cfg.clip_norm))
        self.opt.step()
        return total
