"""Catch the arithmetic that ``convert`` cannot see.

``convert`` replaces modules; it cannot see a ``x + y``, a ``torch.matmul``
or a ``F.relu`` written in a ``forward``, nor the additions PyTorch's
autograd makes when a tensor feeds two computations.  ``guard()`` sees them
at run time: inside it, every ATen operation that PyTorch dispatches is
checked, and anything but exact data movement (views, copies,
concatenation, fills, the gradient seed) raises ``Unsupported`` naming the
operation, unless it runs inside a refreplay op.  Wrap one training step
(forward, backward, fold, clip, optimizer) in it once to prove that no
PyTorch kernel decided a bit:

    with refreplay.torch.guard():
        loss = model(x, y); loss.backward()

It uses ``torch.utils._python_dispatch.TorchDispatchMode``, which sees the
operations below autograd on the calling thread (the CPU backward runs
there).  It costs a Python call per operation: a check, not a production
setting.
"""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ._bridge import Unsupported, is_inside

# Exact data movement: no operation here rounds, flushes or adds.
_EXACT = frozenset({
    "alias", "as_strided", "cat", "clone", "contiguous", "copy", "copy_", "detach", "empty", "empty_like",
    "empty_strided", "expand", "fill_", "lift_fresh", "new_empty", "new_empty_strided", "new_zeros",
    "ones_like", "permute", "reshape", "select", "select_backward", "slice", "slice_backward", "split",
    "split_with_sizes", "squeeze", "stack", "t", "transpose", "unbind", "unsafe_split",
    "unsafe_split_with_sizes", "unsqueeze", "view", "_unsafe_view", "zero_", "zeros", "zeros_like",
    "_to_copy", "narrow", "set_", "_has_compatible_shallow_copy_type", "is_same_size", "ones", "full",
    "_record_function_enter", "_record_function_enter_new", "_record_function_exit",  # profiler marks
})


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


class _Guard(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if not is_inside() and (name not in _EXACT or not _exact(name, args, kwargs)):
            raise Unsupported(f"guard: PyTorch operation aten.{name} ran outside refreplay's ops; its bits are "
                              "PyTorch's, not the spec's (use refreplay.torch.functional, fork() for a tensor "
                              "used twice, add() for a residual)")
        return func(*args, **kwargs)


@contextmanager
def guard():
    """Raise ``Unsupported`` on any PyTorch arithmetic outside refreplay's
    ops while the block runs (see the module docstring)."""
    with _Guard():
        yield
