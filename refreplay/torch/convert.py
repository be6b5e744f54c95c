"""Swap the supported submodules of a ``torch.nn.Module`` for their
spec-exact twins, in place, keeping the very same Parameter objects (so an
optimizer built before still holds them).

    torch.nn.Linear            -> refreplay.torch.nn.Linear
    torch.nn.LayerNorm         -> LayerNorm   (affine; eps must be a binary32)
    torch.nn.RMSNorm           -> RMSNorm     (with weight; eps likewise)
    torch.nn.Embedding         -> Embedding   (no padding_idx / max_norm / sparse)
    torch.nn.GELU('tanh')      -> GELU
    torch.nn.SiLU              -> SiLU
    torch.nn.Softmax(-1), LogSoftmax(-1), CrossEntropyLoss(mean, ignore -1)
    Dropout(p=0), Identity     kept (no arithmetic)

Everything else that computes is reported as unsupported, and
``strict=True`` (the default) raises ``ConversionError`` naming each such
submodule: any module with parameters or buffers of its own that is not in
the table (a ``MultiheadAttention``, a ``Conv1d``, a user module with a
bare ``nn.Parameter``), and the parameter-free modules known to compute
(ReLU, Tanh, Dropout with p > 0, GELU('none'), ...).  A module of an
unknown class whose only content is child modules is a container: its
children are converted and it is kept.

What ``convert`` cannot see: arithmetic written in a ``forward`` (``x + y``,
``torch.matmul``, ``F.relu``) and autograd's own sum of the gradients of a
tensor used twice.  Those are found at run time by ``refreplay.torch.guard``
(docs/torch.md); the report says so in ``notes``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from torch import nn

from . import nn as rnn
from ._bridge import Unsupported

_NO_ARITHMETIC = (nn.Identity, nn.Sequential, nn.ModuleList, nn.ModuleDict, nn.Flatten, nn.Unflatten)
_KNOWN_COMPUTING = (nn.ReLU, nn.Tanh, nn.Sigmoid, nn.GELU, nn.SiLU, nn.Softmax, nn.LogSoftmax, nn.Dropout,
                    nn.CrossEntropyLoss, nn.MSELoss, nn.NLLLoss, nn.LeakyReLU, nn.Mish, nn.Hardswish,
                    nn.ELU, nn.Softplus, nn.MultiheadAttention, nn.Transformer, nn.TransformerEncoderLayer,
                    nn.TransformerDecoderLayer, nn.BatchNorm1d, nn.GroupNorm, nn.Conv1d, nn.Conv2d, nn.RNNBase)
_OURS = (rnn.Linear, rnn.LayerNorm, rnn.RMSNorm, rnn.Embedding, rnn.GELU, rnn.SiLU, rnn.Softmax,
         rnn.LogSoftmax, rnn.CrossEntropyLoss, rnn.Residual, rnn.CausalSelfAttention, rnn.MLP)

NOTES = ("convert cannot see arithmetic written in forward() (x + y, torch.matmul, torch.nn.functional "
         "calls) nor autograd's sum of the gradients of a tensor used twice; run one step inside "
         "refreplay.torch.guard() to find them (docs/torch.md)")


class ConversionError(Unsupported):
    """Strict conversion met submodules it cannot replace."""


@dataclass
class ConvertReport:
    replaced: list = field(default_factory=list)  # (name, old class, new class)
    kept: list = field(default_factory=list)  # (name, class, why)
    unsupported: list = field(default_factory=list)  # (name, class, why)
    notes: str = NOTES

    def __str__(self):
        lines = [f"replaced {len(self.replaced)}, kept {len(self.kept)}, unsupported {len(self.unsupported)}"]
        lines += [f"  replaced {n or '<root>'}: {a} -> {b}" for n, a, b in self.replaced]
        lines += [f"  UNSUPPORTED {n or '<root>'}: {c} ({why})" for n, c, why in self.unsupported]
        return "\n".join(lines + [f"note: {self.notes}"])


def _eps(module, round_eps: bool):
    eps = module.eps
    if eps is None:
        return np.float32(2.0**-23)  # torch's "machine epsilon" of float32, exactly a binary32
    if round_eps:
        return np.float32(eps)
    return eps  # checked (exactly a binary32, or refused) by the new module


def _replacement(mod, round_eps: bool):
    """The spec-exact twin of ``mod`` sharing its parameters, or raise
    Unsupported saying why there is none."""
    t = type(mod)
    if t is nn.Linear:
        new = rnn.Linear(mod.in_features, mod.out_features, bias=mod.bias is not None, device="meta")
        new.weight, new.bias = mod.weight, mod.bias
        return new
    if t is nn.LayerNorm:
        if mod.weight is None or mod.bias is None:
            raise Unsupported("LayerNorm without weight or bias is not covered")
        new = rnn.LayerNorm(mod.normalized_shape, eps=_eps(mod, round_eps), device="meta")
        new.weight, new.bias = mod.weight, mod.bias
        return new
    if hasattr(nn, "RMSNorm") and t is nn.RMSNorm:
        if mod.weight is None:
            raise Unsupported("RMSNorm without weight is not covered")
        new = rnn.RMSNorm(mod.normalized_shape, eps=_eps(mod, round_eps), device="meta")
        new.weight = mod.weight
        return new
    if t is nn.Embedding:
        new = rnn.Embedding(mod.num_embeddings, mod.embedding_dim, mod.padding_idx, mod.max_norm,
                            mod.norm_type, mod.scale_grad_by_freq, mod.sparse, device="meta")
        new.weight = mod.weight
        return new
    if t is nn.GELU:
        return rnn.GELU(mod.approximate)
    if t is nn.SiLU:
        return rnn.SiLU(mod.inplace)
    if t is nn.Softmax:
        return rnn.Softmax(-1 if mod.dim in (-1, None) else mod.dim)
    if t is nn.LogSoftmax:
        return rnn.LogSoftmax(-1 if mod.dim in (-1, None) else mod.dim)
    if t is nn.CrossEntropyLoss:
        if mod.weight is not None:
            raise Unsupported("CrossEntropyLoss with class weights is not covered")
        return rnn.CrossEntropyLoss(mod.ignore_index, mod.reduction, mod.label_smoothing)
    raise Unsupported(f"no spec-exact twin of {t.__name__}")


def _keep_reason(mod):
    """Why ``mod`` may stay as it is (no arithmetic of its own), or None."""
    if isinstance(mod, _OURS):
        return "already refreplay.torch"
    if isinstance(mod, nn.Dropout) and mod.p == 0:
        return "dropout with p = 0 (identity)"
    if isinstance(mod, _NO_ARITHMETIC):
        return "no arithmetic"
    own = list(mod.named_parameters(recurse=False)) + list(mod.named_buffers(recurse=False))
    if not own and not isinstance(mod, _KNOWN_COMPUTING):
        return "container: children converted"
    return None


def convert(module: nn.Module, strict: bool = True, round_eps: bool = False) -> ConvertReport:
    """Replace every supported submodule of ``module`` in place (the root
    itself is never replaced) and return the report.  ``round_eps=True``
    takes a norm's Python eps (1e-5, say) as its nearest binary32 instead
    of refusing it.  With ``strict`` (the default) any unsupported
    submodule raises ``ConversionError`` naming it, after nothing was
    changed."""
    report = ConvertReport()
    plan = []  # (parent, attribute, qualified name, new module)

    def visit(mod, name):
        if name and isinstance(mod, _OURS):
            return  # listed as kept by its parent's loop
        for attr, child in mod.named_children():
            qual = f"{name}.{attr}" if name else attr
            try:
                new = _replacement(child, round_eps)
            except Unsupported as exc:
                why = _keep_reason(child)
                if why is None:
                    report.unsupported.append((qual, type(child).__name__, str(exc)))
                else:
                    if why != "container: children converted" or not list(child.children()):
                        report.kept.append((qual, type(child).__name__, why))
                    visit(child, qual)
                continue
            plan.append((mod, attr, qual, child, new))
        if not name:
            own = list(mod.named_parameters(recurse=False))
            if own and not isinstance(mod, _OURS):
                report.unsupported.append(("", type(mod).__name__,
                                           f"own parameters {[n for n, _ in own]} used by a forward that "
                                           "convert cannot read"))

    visit(module, "")
    if strict and report.unsupported:
        names = ", ".join(f"{n or '<root>'} ({c}: {why})" for n, c, why in report.unsupported)
        raise ConversionError(f"convert: cannot make these submodules spec-exact: {names}")
    for parent, attr, qual, old, new in plan:
        new.train(old.training)
        setattr(parent, attr, new)
        report.replaced.append((qual, type(old).__name__, type(new).__name__))
    return report
