"""Catch the arithmetic that ``convert`` cannot see.

``convert`` replaces modules; it cannot see a ``x + y``, a ``torch.matmul``
or a ``F.relu`` written in a ``forward``, nor the additions PyTorch's
autograd makes when a tensor feeds two computations.  ``guard()`` sees them
at run time: inside it, every ATen operation that PyTorch dispatches is
checked, and anything but exact data movement (views, copies,
concatenation, fills, the gradient seed) is a leak, unless it runs inside
a refreplay op.  Wrap one training step (forward, backward, fold, clip,
optimizer) in it once to prove that no PyTorch kernel decided a bit:

    with refreplay.torch.guard():                      # raises at the first leak
        loss = model(x, y); loss.backward()

    with refreplay.torch.guard(collect=True, model=model) as leaks:
        loss = model(x, y); loss.backward()            # runs on, PyTorch's bits and all
    print(leaks)                                       # every leak: op, forward/backward, module, fix

Each leak names where it happened: in forward, the innermost module whose
forward was running (module hooks); in backward, the autograd node that
was running and the module whose forward made it (a tied weight's two
gradients are summed while the second one arrives; a residual ``+`` is
``aten.add`` in forward).  Module paths are ``model``'s names when it is
given, else class names.

It uses ``torch.utils._python_dispatch.TorchDispatchMode``, which sees the
operations below autograd on the calling thread (the CPU backward runs
there).  It costs a Python call per operation: a check, not a production
setting.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode

from ._bridge import Unsupported, is_inside

# Exact data movement: no operation here rounds, flushes or adds.
_EXACT = frozenset(
    {
        "alias",
        "as_strided",
        "cat",
        "clone",
        "contiguous",
        "copy",
        "copy_",
        "detach",
        "empty",
        "empty_like",
        "empty_strided",
        "expand",
        "fill_",
        "lift_fresh",
        "new_empty",
        "new_empty_strided",
        "new_zeros",
        "ones_like",
        "permute",
        "reshape",
        "select",
        "select_backward",
        "slice",
        "slice_backward",
        "split",
        "split_with_sizes",
        "squeeze",
        "stack",
        "t",
        "transpose",
        "unbind",
        "unsafe_split",
        "unsafe_split_with_sizes",
        "unsqueeze",
        "view",
        "_unsafe_view",
        "zero_",
        "zeros",
        "zeros_like",
        "_to_copy",
        "narrow",
        "set_",
        "_has_compatible_shallow_copy_type",
        "is_same_size",
        "ones",
        "full",
        "_record_function_enter",
        "_record_function_enter_new",
        "_record_function_exit",  # profiler marks
    }
)

_FIX_ADD_FORWARD = (
    "a `+` written in forward (a residual, token + position embeddings): write "
    "refreplay.torch.functional.add(a, b), and fork() the stream it reads twice"
)
_FIX_ADD_BACKWARD = (
    "autograd summed the two gradients of a tensor used twice (a tied weight, a stream "
    "read by two branches) with PyTorch's add: use it through "
    "refreplay.torch.functional.fork(t) in forward, one output per use"
)
_FIXES = {
    "arange": (
        "ids made in forward (position ids): make them once in __init__, "
        "self.register_buffer('pos', torch.arange(T), persistent=False), and slice the buffer"
    ),
    "_scaled_dot_product_flash_attention_for_cpu": (
        "torch.nn.functional.scaled_dot_product_attention: call refreplay.torch.functional."
        "scaled_dot_product_attention (same signature, is_causal=True)"
    ),
    "_scaled_dot_product_attention_math": (
        "torch.nn.functional.scaled_dot_product_attention: call refreplay.torch.functional."
        "scaled_dot_product_attention (same signature, is_causal=True)"
    ),
}


def _exact(name: str, args, kwargs) -> bool:
    """Whether an operation of the allow list moves bits exactly here: a copy
    that changes dtype rounds (float64 -> float32, say), and so does a fill
    with a Python number that is not exactly a binary32."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if name == "_to_copy":
        dt = kwargs.get("dtype")
        return dt is None or not tensors or dt == tensors[0].dtype
    if name in ("copy", "copy_"):
        return len(tensors) < 2 or tensors[0].dtype == tensors[1].dtype
    if name in ("fill_", "full"):
        value = args[1] if len(args) > 1 else kwargs.get("fill_value")
        return not isinstance(value, float) or value != value or float(np.float32(value)) == value
    return True


@dataclass(frozen=True)
class Leak:
    """One PyTorch operation that decided bits outside refreplay's ops."""

    op: str  # "aten.add"
    phase: str  # "forward" or "backward"
    module: str  # module path ("h.0.attn"), "<root>" or "<outside any module>"
    node: str  # in backward: the autograd node that ran ("LinearBackward"), else ""
    fix: str

    def __str__(self):
        where = f"{self.phase} of {self.module}" + (f" (autograd node {self.node})" if self.node else "")
        return f"{self.op} in {where}: {self.fix}"


class Leaks(list):
    """The leaks ``guard(collect=True)`` found, each once, in the order met."""

    def __str__(self):
        if not self:
            return "guard: no PyTorch arithmetic outside refreplay's ops"
        return "\n".join(
            [f"guard: {len(self)} PyTorch operations decided bits outside refreplay's ops:"]
            + [f"  {leak}" for leak in self]
        )


def _fix(name: str, phase: str) -> str:
    if name in ("add", "add_"):
        return _FIX_ADD_BACKWARD if phase == "backward" else _FIX_ADD_FORWARD
    if name in _FIXES:
        return _FIXES[name]
    return (
        "a PyTorch kernel: use the refreplay.torch.functional function of the same name if there is one "
        "(docs/torch.md lists them), else the spec does not define it"
    )


class _Where:
    """The module whose forward is running (a stack kept by global module
    hooks), and in backward the module whose forward made the running node."""

    def __init__(self, model):
        self.names = {} if model is None else {id(m): (n or "<root>") for n, m in model.named_modules()}
        self.stack: list[tuple[str, set]] = []  # (module, its inputs' nodes)
        self.node_module: dict[int, str] = {}
        self.keep: list = []

    def name(self, mod) -> str:
        return self.names.get(id(mod), type(mod).__name__)

    def pre(self, mod, args):
        inputs = {id(t.grad_fn) for t in args if isinstance(t, torch.Tensor) and t.grad_fn is not None}
        self.stack.append((self.name(mod), inputs))

    def post(self, mod, args, out):
        if not self.stack:
            return
        _, inputs = self.stack.pop()
        # Every node this forward made and no inner module claimed is its own:
        # walk back from its outputs to its inputs' nodes.
        todo = [
            t.grad_fn
            for t in (out if isinstance(out, (tuple, list)) else (out,))
            if isinstance(t, torch.Tensor) and t.grad_fn is not None
        ]
        seen = set()
        while todo:
            fn = todo.pop()
            if id(fn) in seen or id(fn) in inputs or type(fn).__name__ == "AccumulateGrad":
                continue
            seen.add(id(fn))
            if id(fn) not in self.node_module:
                self.node_module[id(fn)] = self.name(mod)
                self.keep.append(fn)  # ids stay unique while the step runs
            todo.extend(f for f, _ in fn.next_functions if f is not None)

    def here(self):
        node = torch._C._current_autograd_node()
        if node is not None:
            return "backward", self.node_module.get(id(node), "<outside any module>"), type(node).__name__
        return "forward", (self.stack[-1][0] if self.stack else "<outside any module>"), ""


class _Guard(TorchDispatchMode):
    def __init__(self, where: _Where, leaks: Leaks | None):
        super().__init__()
        self.where, self.leaks, self.seen = where, leaks, set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if not is_inside() and (name not in _EXACT or not _exact(name, args, kwargs)):
            phase, module, node = self.where.here()
            leak = Leak(f"aten.{name}", phase, module, node, _fix(name, phase))
            if self.leaks is None:
                raise Unsupported(
                    f"guard: PyTorch operation {leak}; its bits are PyTorch's, not the spec's "
                    "(guard(collect=True) lists every such operation in one pass)"
                )
            key = (leak.op, phase, module, node)
            if key not in self.seen:
                self.seen.add(key)
                self.leaks.append(leak)
        return func(*args, **kwargs)


@contextmanager
def guard(collect: bool = False, model=None):
    """Inside the block, any PyTorch arithmetic outside refreplay's ops is a
    leak: raised as ``Unsupported`` at the first one, or with
    ``collect=True`` let run and gathered into the ``Leaks`` list the
    ``with`` statement yields (each leak once per op, phase and module).
    ``model`` names module paths (see the module docstring)."""
    where = _Where(model)
    leaks = Leaks() if collect else None
    with ExitStack() as stack:
        stack.enter_context(register_module_forward_pre_hook(where.pre))
        stack.enter_context(register_module_forward_hook(where.post))
        stack.enter_context(_Guard(where, leaks))
        yield leaks
