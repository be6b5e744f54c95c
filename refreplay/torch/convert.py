"""Swap the supported submodules of a ``torch.nn.Module`` for their
spec-exact twins, in place, keeping the very same Parameter objects (so an
optimizer built before still holds them).

    torch.nn.Linear            -> refreplay.torch.nn.Linear
    torch.nn.LayerNorm         -> LayerNorm   (weight and bias, or not; eps a binary32)
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

Every blocker goes into one report with its cause and fix: besides the
modules above, bare Parameters of a user module, a Parameter held by two
modules (a tied weight: fork it), and the arithmetic a user class's
``forward`` writes, read from its source (``torch`` / ``F`` calls, tensor
operators, ``torch.arange`` ids).  What ``convert`` cannot see: code it
has no source for, a tensor used twice inside one forward, and autograd's
own sum of the gradients of such a tensor.  Those are found at run time by
``refreplay.torch.guard`` (docs/torch.md); the report says so in ``notes``.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as TF
from torch import nn

from . import nn as rnn
from ._bridge import Unsupported

_NO_ARITHMETIC = (nn.Identity, nn.Sequential, nn.ModuleList, nn.ModuleDict, nn.Flatten, nn.Unflatten)
_KNOWN_COMPUTING = (
    nn.ReLU,
    nn.Tanh,
    nn.Sigmoid,
    nn.GELU,
    nn.SiLU,
    nn.Softmax,
    nn.LogSoftmax,
    nn.Dropout,
    nn.CrossEntropyLoss,
    nn.MSELoss,
    nn.NLLLoss,
    nn.LeakyReLU,
    nn.Mish,
    nn.Hardswish,
    nn.ELU,
    nn.Softplus,
    nn.MultiheadAttention,
    nn.Transformer,
    nn.TransformerEncoderLayer,
    nn.TransformerDecoderLayer,
    nn.BatchNorm1d,
    nn.GroupNorm,
    nn.Conv1d,
    nn.Conv2d,
    nn.RNNBase,
)
_OURS = (
    rnn.Linear,
    rnn.LayerNorm,
    rnn.RMSNorm,
    rnn.Embedding,
    rnn.GELU,
    rnn.SiLU,
    rnn.Softmax,
    rnn.LogSoftmax,
    rnn.CrossEntropyLoss,
    rnn.Residual,
    rnn.CausalSelfAttention,
    rnn.MLP,
)

NOTES = (
    "convert reads forward() sources but cannot see code without source, a tensor used twice in one "
    "forward, nor autograd's sum of the gradients of a tensor used twice; run one step inside "
    "refreplay.torch.guard() to find them (docs/torch.md)"
)


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


# Twins to suggest for a user module named like a covered one.
_TWIN_HINTS = (
    ("layernorm", "nn.LayerNorm(C, eps=...) (or refreplay.torch.nn.LayerNorm)"),
    ("rmsnorm", "nn.RMSNorm(C, eps=...) (or refreplay.torch.nn.RMSNorm)"),
    ("linear", "nn.Linear (or refreplay.torch.nn.Linear)"),
    ("embedding", "nn.Embedding (or refreplay.torch.nn.Embedding)"),
)


def _bare_parameters(mod, own) -> str:
    """Cause and fix for a user module with parameters of its own."""
    lower = type(mod).__name__.lower()
    twin = next((hint for key, hint in _TWIN_HINTS if key in lower), None)
    fix = (
        f"build it as {twin}, which convert swaps"
        if twin
        else "build it from modules convert swaps (nn.Linear, nn.LayerNorm, nn.Embedding, ...), or write its "
        "forward with refreplay.torch.functional and pass its class in convert(keep=...)"
    )
    return (
        f"bare nn.Parameter(s) {own} used by a forward convert cannot read (its arithmetic would be "
        f"PyTorch's); fix: {fix}"
    )


def _tied(module, skip) -> list:
    """(names, why) for each Parameter held by two or more modules."""
    owners: dict[int, list[str]] = {}
    for mname, mod in module.named_modules(remove_duplicate=False):
        if any(mname == s or mname.startswith(s + ".") for s in skip):
            continue
        for pname, p in mod.named_parameters(recurse=False):
            names = owners.setdefault(id(p), [])
            full = f"{mname}.{pname}" if mname else pname
            if full not in names:
                names.append(full)
    out = []
    for names in owners.values():
        if len(names) > 1:
            out.append(
                (
                    " = ".join(names),
                    "Parameter",
                    "one Parameter in two modules (a tied weight): autograd would add its two gradients "
                    "with PyTorch's add; fix: keep it in one module only (drop the second module or "
                    f"the `{names[1].rsplit('.', 1)[0]}.weight = ...` assignment) and in forward take "
                    "`w_a, w_b = refreplay.torch.functional.fork(weight)`, one output per use "
                    "(F.embedding(idx, w_a), F.linear(x, w_b))",
                )
            )
    return out


# Functions a forward may call that compute nothing (shapes, ids, dtypes).
_HARMLESS = {
    "is_tensor",
    "numel",
    "no_grad",
    "is_grad_enabled",
    "device",
    "Size",
    "cat",
    "stack",
    "split",
    "chunk",
    "flatten",
    "reshape",
    "transpose",
    "permute",
    "squeeze",
    "unsqueeze",
    "narrow",
}
_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.MatMult: "@", ast.Pow: "**"}


def _resolve(node, env):
    """The object a dotted name ``a.b.c`` denotes in ``env``, or None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in env:
        return None
    obj = env[node.id]
    for part in reversed(parts):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _shape_like(node, sizes) -> bool:
    """An expression that is a Python number, not a tensor: a constant, a
    name bound from ``x.size()`` / ``x.shape``, a ``len``, ``.size()``,
    ``.shape`` or ``math`` call."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.Name):
        return node.id in sizes
    if isinstance(node, ast.Attribute):
        return node.attr in ("shape", "ndim") or _shape_like(node.value, sizes)
    if isinstance(node, ast.Subscript):
        return _shape_like(node.value, sizes)
    if isinstance(node, ast.Call):
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
        return name in ("size", "len", "dim", "numel", "int", "float", "sqrt") or (
            isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "math"
        )
    if isinstance(node, ast.BinOp):
        return _shape_like(node.left, sizes) and _shape_like(node.right, sizes)
    if isinstance(node, ast.UnaryOp):
        return _shape_like(node.operand, sizes)
    return False


def _forward_findings(cls) -> list:
    """(line, what, fix) for the PyTorch arithmetic a class's forward
    writes: torch / torch.nn.functional calls and tensor operators."""
    try:
        src = textwrap.dedent(inspect.getsource(cls.forward))
        first = inspect.getsourcelines(cls.forward)[1]
    except (OSError, TypeError):
        return []
    tree = ast.parse(src)
    env = dict(getattr(cls.forward, "__globals__", {}))
    sizes = set()
    for node in ast.walk(tree):  # names bound from shapes: B, T, C = x.size()
        if isinstance(node, ast.Assign) and _shape_like(node.value, set()):
            for tgt in node.targets:
                for n in ast.walk(tgt):
                    if isinstance(n, ast.Name):
                        sizes.add(n.id)
    found = []
    for node in ast.walk(tree):
        line = first + getattr(node, "lineno", 1) - 1
        if isinstance(node, ast.Call):
            fn = _resolve(node.func, env)
            mod = getattr(fn, "__module__", None) or ""
            name = getattr(fn, "__name__", "")
            if fn is None or name in _HARMLESS or mod.startswith("refreplay"):
                continue
            if fn is torch.arange:
                found.append(
                    (
                        line,
                        "torch.arange in forward",
                        "make the ids once in __init__: self.register_buffer('pos', torch.arange(T), persistent=False)",
                    )
                )
            elif getattr(TF, name, None) is fn or (
                getattr(torch, name, None) is fn and callable(fn) and not isinstance(fn, type)
            ):
                from . import functional as RF

                twin = f"refreplay.torch.functional.{name}" if hasattr(RF, name) else None
                found.append(
                    (
                        line,
                        f"{'torch.nn.functional' if getattr(TF, name, None) is fn else 'torch'}."
                        f"{name}(...) runs PyTorch's kernel",
                        f"call {twin} (same signature)" if twin else "the spec does not define it",
                    )
                )
        elif isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in _OPS:
            left = node.left if isinstance(node, ast.BinOp) else node.target
            right = node.right if isinstance(node, ast.BinOp) else node.value
            if _shape_like(left, sizes) or _shape_like(right, sizes):
                continue
            sym = _OPS[type(node.op)]
            fix = (
                "refreplay.torch.functional.add(a, b), with fork() for a tensor read twice"
                if sym == "+"
                else "the refreplay.torch.functional op that computes it, if covered"
            )
            found.append((line, f"tensor operator `{ast.unparse(node)}` runs PyTorch's kernel", fix))
    return sorted(set(found))


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
        new = rnn.LayerNorm(
            mod.normalized_shape,
            eps=_eps(mod, round_eps),
            elementwise_affine=mod.weight is not None,
            bias=mod.bias is not None,
            device="meta",
        )  # [norm.layer.noaffine.c1]
        new.weight, new.bias = mod.weight, mod.bias
        return new
    if hasattr(nn, "RMSNorm") and t is nn.RMSNorm:
        if mod.weight is None:
            raise Unsupported("RMSNorm without weight is not covered")
        new = rnn.RMSNorm(mod.normalized_shape, eps=_eps(mod, round_eps), device="meta")
        new.weight = mod.weight
        return new
    if t is nn.Embedding:
        new = rnn.Embedding(
            mod.num_embeddings,
            mod.embedding_dim,
            mod.padding_idx,
            mod.max_norm,
            mod.norm_type,
            mod.scale_grad_by_freq,
            mod.sparse,
            device="meta",
        )
        new.weight = mod.weight
        return new
    if t is nn.GELU:
        return rnn.GELU(mod.approximate)
    if isinstance(mod, nn.Dropout) and mod.p > 0:
        raise Unsupported(
            f"dropout with p = {mod.p} > 0: the spec defines no random dropout; fix: "
            "nn.Dropout(0.0) (kept as the identity) or remove it"
        )
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


def convert(module: nn.Module, strict: bool = True, round_eps: bool = False, keep=()) -> ConvertReport:
    """Replace every supported submodule of ``module`` in place (the root
    itself is never replaced) and return the report.  ``round_eps=True``
    takes a norm's Python eps (1e-5, say) as its nearest binary32 instead
    of refusing it.  ``keep``: classes of your own whose forward you wrote
    with refreplay.torch.functional (kept as they are; guard() checks them
    at run time).  The report lists every blocker at once, each with its
    cause and fix: modules without a twin, bare Parameters, a Parameter
    held by two modules (a tied weight), and the PyTorch arithmetic each
    user class's forward writes (torch / torch.nn.functional calls, tensor
    operators: read from its source).  With ``strict`` (the default) any
    blocker raises ``ConversionError`` listing them all, after nothing was
    changed."""
    keep = tuple(keep)
    report = ConvertReport()
    scanned = set()

    def scan(mod, name):
        cls = type(mod)
        if cls in scanned or isinstance(mod, _OURS + keep) or cls.__module__.startswith("torch."):
            return
        scanned.add(cls)
        for line, what, fix in _forward_findings(cls):
            report.unsupported.append(
                (f"{name or '<root>'} ({cls.__name__}.forward, line {line})", what, f"fix: {fix}")
            )

    plan = []  # (parent, attribute, qualified name, new module)

    def visit(mod, name):
        if name and isinstance(mod, _OURS + keep):
            return  # listed as kept by its parent's loop
        scan(mod, name)
        for attr, child in mod.named_children():
            qual = f"{name}.{attr}" if name else attr
            if isinstance(child, keep):
                report.kept.append((qual, type(child).__name__, "kept on request (convert(keep=...))"))
                continue
            try:
                new = _replacement(child, round_eps)
            except Unsupported as exc:
                why = _keep_reason(child)
                if why is None:
                    own = [n for n, _ in child.named_parameters(recurse=False)]
                    cause = (
                        _bare_parameters(child, own)
                        if own
                        and not isinstance(child, _KNOWN_COMPUTING)
                        and not type(child).__module__.startswith("torch.")
                        else str(exc)
                    )
                    report.unsupported.append((qual, type(child).__name__, cause))
                    scan(child, qual)
                else:
                    if why != "container: children converted" or not list(child.children()):
                        report.kept.append((qual, type(child).__name__, why))
                    visit(child, qual)
                continue
            plan.append((mod, attr, qual, child, new))
        if not name:
            own = list(mod.named_parameters(recurse=False))
            if own and not isinstance(mod, _OURS + keep):
                report.unsupported.append(("", type(mod).__name__, _bare_parameters(mod, [n for n, _ in own])))

    visit(module, "")
    report.unsupported += _tied(module, [n for n, _, why in report.kept if "convert(keep" in why])
    if strict and report.unsupported:
        lines = "\n".join(f"  {n or '<root>'}: {c}: {why}" for n, c, why in report.unsupported)
        raise ConversionError(f"convert: {len(report.unsupported)} blocker(s), nothing was changed:\n{lines}")
    for parent, attr, qual, old, new in plan:
        new.train(old.training)
        setattr(parent, attr, new)
        report.replaced.append((qual, type(old).__name__, type(new).__name__))
    return report
