"""The device kernels with the reference's calling conventions: host NumPy
arrays in, host arrays out, the same bits as the reference function of the
same name.

Every public function of ``cuda_backend.host`` is available here under its
reference name (``add``, ``matmul``, ``words``, ``layernorm_forward``, ...).
Each validates its arguments as the reference's API does, copies them to the
device, launches the kernels and copies the results back.  Inputs are used
as given; like the reference's, callers pass tensors that went through
[num.load.c1] (``load`` does that on the device).

``OPS`` maps the conformance registry's op names to these functions,
``conform_op`` is the entry of ``refreplay conform cuda``, and
``EXAMPLE_FUNCTIONS`` maps the reference names used in the spec's worked
examples (``numerics.add``, ``linalg.matmul``, ``ops.norms.layernorm_forward``, ...).
"""

from __future__ import annotations

import numpy as np

from .host import bf16 as _bf16
from .host import linalg as _linalg
from .host import numerics as _numerics
from .host import rng as _rng
from .host import treefold as _treefold
from .host.ops import (
    activations as _activations,
    attention as _attention,
    embedding as _embedding,
    linear as _linear,
    loss as _loss,
    norms as _norms,
    optim as _optim,
    quant as _quant,
    rope as _rope,
    softmax as _softmax,
)

# Where each reference module's functions live on the host side of the device.
_MODULES = {
    "numerics": _numerics,
    "linalg": _linalg,
    "rng": _rng,
    "treefold": _treefold,
    "ops.embedding": _embedding,
    "ops.linear": _linear,
    "ops.norms": _norms,
    "ops.activations": _activations,
    "ops.softmax": _softmax,
    "ops.rope": _rope,
    "ops.attention": _attention,
    "ops.loss": _loss,
    "ops.optim": _optim,
    "ops.quant": _quant,
}


def _public(module):
    """The module's own public functions, by name."""
    return {
        name: f
        for name, f in vars(module).items()
        if callable(f) and not name.startswith("_") and getattr(f, "__module__", None) == module.__name__
    }


_FUNCTIONS = {name: f for module in _MODULES.values() for name, f in _public(module).items()}
globals().update(_FUNCTIONS)  # adapter.matmul, adapter.layernorm_forward, ...
__all__ = sorted(_FUNCTIONS) + ["EXAMPLE_FUNCTIONS", "OPS", "conform_op"]

# Reference function name (relative to ``refreplay``) -> device function.
EXAMPLE_FUNCTIONS = {
    f"{prefix}.{name}": f for prefix, module in _MODULES.items() for name, f in _public(module).items()
}
EXAMPLE_FUNCTIONS.update({f"numerics.elementwise.{name}": f for name, f in _public(_numerics).items()})
# the bf16 conversions ([bf16.round.c1]): by their full name only (``load`` is also numerics.load)
EXAMPLE_FUNCTIONS.update({f"numerics.bf16.{name}": f for name, f in _public(_bf16).items()})


def _dot(x, y):
    """The conformance op ``dot``: the 1 x K x 1 matmul of [mm.nn.c1]."""
    return _linalg.matmul(x[None, :], np.ascontiguousarray(y[:, None])).reshape(1)


# Conformance registry op name -> device function, same positional inputs and
# outputs (inputs already loaded, [num.load.c1]).
OPS = {
    **{
        name: _FUNCTIONS[name]
        for name in (
            "add",
            "sub",
            "mul",
            "recip",
            "sqrt",
            "fmax",
            "fmin",
            "rint",
            "exp",
            "log",
            "tanh",
            "sigmoid",
            "sin",
            "cos",
            "matmul",
            "matmul_nt",
            "matmul_tn",
            "matmul_i8",
            "col_sum",
        )
    },
    "sum": _linalg.row_sum,
    "max": _linalg.row_max,
    "dot": _dot,
}


def conform_op(op_name, *inputs):
    """The conformance runner's entry (``refreplay conform cuda``).

    Inputs arrive as stored in the vectors; float32 ones are loaded on the
    device first ([num.load.c1]: subnormals zeroed, NaN canonical), as the
    reference does.  An op the device does not cover raises
    ``NotImplementedError`` (the runner reports its cases as skipped).
    """
    fn = OPS.get(op_name)
    if fn is None:
        raise NotImplementedError(f"cuda_backend has no kernel for {op_name}")
    return fn(*[_numerics.load(x) if x.dtype == np.float32 else x for x in inputs])
