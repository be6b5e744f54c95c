"""Kernel adapters: how the runner calls the kernel under test.

KERNEL on the command line is one of
  reference            refreplay's own kernels (must pass every vector)
  numpy, torch         the libraries' own kernels: negative controls (torch's,
                       one function per op, in ``torch_kernels.py``)
  cuda                 cuda_backend's device kernels (a GPU, or the CUDA simulator)
  package.module:fn    a Python callable: if fn is named after an op (matmul,
                       sum, ...) it implements that op and is called
                       fn(*inputs); otherwise it is called fn(op, *inputs)
  package.module       a module with one function per op, called op(*inputs)
  exec:COMMAND         an external program (any language); see execproto.py

Inputs come in the order of the op's calling convention (``registry.py``),
as C-contiguous little-endian NumPy arrays exactly as stored in the vectors
(subnormals and NaN payloads included: zeroing and canonicalising them is
the kernel's job, [num.load.c1]).  A kernel returns one array or a tuple in
the order of the op's outputs.  Raising ``NotImplementedError`` declines an
op: its cases are reported as skipped.
"""

from __future__ import annotations

import importlib

import numpy as np

from ...errors import InputError
from ..base.case import load_inputs
from ..table import OPS
from .kernel import Kernel, Unsupported


class Reference(Kernel):
    name = "reference"

    def call(self, op_name, inputs, out_specs):
        return OPS[op_name].reference(*load_inputs(inputs))


class Table(Kernel):
    def __init__(self, name, table):
        self.name = name
        self.table = table

    def call(self, op_name, inputs, out_specs):
        if op_name not in self.table:
            raise Unsupported(f"{self.name} has no {op_name}")
        return self.table[op_name](*inputs)


def _numpy_table():
    f32 = np.float32
    return {
        "add": np.add,
        "sub": np.subtract,
        "mul": np.multiply,
        "recip": lambda x: f32(1) / x,
        "sqrt": np.sqrt,
        "fmax": np.maximum,
        "fmin": np.minimum,
        "rint": np.rint,
        "exp": np.exp,
        "log": np.log,
        "tanh": np.tanh,
        "sin": np.sin,
        "cos": np.cos,
        "sigmoid": lambda x: f32(1) / (f32(1) + np.exp(-x)),
        "sum": lambda X: X.sum(axis=1),
        "col_sum": lambda X: X.sum(axis=0),
        "max": lambda X: X.max(axis=1),
        "dot": lambda x, y: np.array([np.dot(x, y)], dtype=np.float32),
        "matmul": lambda A, B: A @ B,
        "matmul_nt": lambda A, B: A @ B.T,
        "matmul_tn": lambda A, B: A.T @ B,
        "matmul_i8": lambda A, B: (A.astype(np.int64) @ B.astype(np.int64)).astype(np.int32),
    }


class PythonCallable(Kernel):
    """``per_op``: the target is a module with one function per op, or (with
    ``only``) a single op's function; otherwise a dispatcher fn(op, *inputs)."""

    def __init__(self, spec: str, target, per_op: bool, only: str | None = None):
        self.name = spec
        self.target = target
        self.per_op = per_op
        self.only = only

    def call(self, op_name, inputs, out_specs):
        if self.only is not None:
            if op_name != self.only:
                raise Unsupported(f"{self.name} implements {self.only} only")
            return self.target(*inputs)
        if self.per_op:
            fn = getattr(self.target, op_name, None)
            if fn is None:
                raise Unsupported(f"{self.name} has no function {op_name}")
            return fn(*inputs)
        return self.target(op_name, *inputs)


def resolve(spec: str, exec_timeout: float | None = None) -> Kernel:
    """A kernel from its command-line name; InputError if it cannot be found.
    ``exec_timeout``: seconds per case for an ``exec:`` kernel (default
    ``execproto.TIMEOUT_S``)."""
    if spec == "reference":
        return Reference()
    if spec == "numpy":
        return Table("numpy", _numpy_table())
    if spec == "torch":
        try:
            from . import torch_kernels
        except ImportError:
            raise InputError("the torch kernel needs PyTorch (pip install torch)") from None
        return PythonCallable("torch", torch_kernels, per_op=True)
    if spec == "cuda":
        try:
            from cuda_backend.adapter import conform_op
        except Exception as exc:  # no numba-cuda, no GPU and no simulator
            raise InputError(
                f"the cuda kernel needs cuda_backend and numba-cuda with a GPU (or NUMBA_ENABLE_CUDASIM=1): {exc}"
            ) from None
        return PythonCallable("cuda", conform_op, per_op=False)
    if spec.startswith("exec:"):
        from .execproto import ExecKernel

        command = spec[len("exec:") :].strip()
        if not command:
            raise InputError("exec: needs a command, e.g. exec:./my_kernel")
        return ExecKernel(command) if exec_timeout is None else ExecKernel(command, exec_timeout)
    module_name, _, fn_name = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InputError(
            f"kernel {spec!r}: cannot import {module_name} ({exc}); expected reference, "
            f"numpy, torch, package.module[:function] or exec:COMMAND"
        ) from None
    if not fn_name:
        return PythonCallable(spec, module, per_op=True)
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise InputError(f"kernel {spec!r}: {module_name} has no callable {fn_name}")
    if fn_name in OPS:  # a function named after an op implements that op alone
        return PythonCallable(spec, fn, per_op=True, only=fn_name)
    return PythonCallable(spec, fn, per_op=False)
