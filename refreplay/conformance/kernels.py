"""Kernel adapters: how the runner calls the kernel under test.

KERNEL on the command line is one of
  reference            refreplay's own kernels (must pass every vector)
  numpy, torch         the libraries' own kernels: negative controls
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

from ..errors import InputError
from .cases import as_outputs, load_inputs
from .registry import OPS


class Unsupported(Exception):
    """The kernel does not implement this op."""


class KernelError(Exception):
    """The kernel failed on a case (raised, crashed, or returned garbage)."""


class Kernel:
    name = "kernel"

    def call(self, op_name: str, inputs: list[np.ndarray], out_specs: dict):
        raise NotImplementedError

    def run(self, op_name: str, inputs: list[np.ndarray], out_specs: dict) -> dict[str, np.ndarray]:
        """Outputs of one case.  ``out_specs``: output name -> (dtype, shape)
        the case expects (an external program is told them)."""
        try:
            with np.errstate(all="ignore"):
                result = self.call(op_name, [a.copy() for a in inputs], out_specs)
        except (NotImplementedError, Unsupported) as exc:
            raise Unsupported(str(exc) or f"{self.name} does not implement {op_name}") from None
        except (KernelError, InputError):
            raise
        except Exception as exc:
            raise KernelError(f"{type(exc).__name__}: {exc}") from None
        try:
            return as_outputs(result, OPS[op_name].outputs)
        except (ValueError, TypeError) as exc:
            raise KernelError(f"bad return value: {exc}") from None


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
        "add": np.add, "sub": np.subtract, "mul": np.multiply,
        "recip": lambda x: f32(1) / x, "sqrt": np.sqrt,
        "fmax": np.maximum, "fmin": np.minimum, "rint": np.rint,
        "exp": np.exp, "log": np.log, "tanh": np.tanh, "sin": np.sin, "cos": np.cos,
        "sigmoid": lambda x: f32(1) / (f32(1) + np.exp(-x)),
        "sum": lambda X: X.sum(axis=1), "col_sum": lambda X: X.sum(axis=0),
        "max": lambda X: X.max(axis=1),
        "dot": lambda x, y: np.array([np.dot(x, y)], dtype=np.float32),
        "matmul": lambda A, B: A @ B, "matmul_nt": lambda A, B: A @ B.T,
        "matmul_tn": lambda A, B: A.T @ B,
        "matmul_i8": lambda A, B: (A.astype(np.int64) @ B.astype(np.int64)).astype(np.int32),
    }


def _torch_table():
    import torch

    t = torch.from_numpy

    def n(x):
        return x.numpy()

    return {
        "add": lambda a, b: n(t(a) + t(b)), "sub": lambda a, b: n(t(a) - t(b)),
        "mul": lambda a, b: n(t(a) * t(b)), "recip": lambda x: n(torch.reciprocal(t(x))),
        "sqrt": lambda x: n(torch.sqrt(t(x))), "fmax": lambda a, b: n(torch.maximum(t(a), t(b))),
        "fmin": lambda a, b: n(torch.minimum(t(a), t(b))), "rint": lambda x: n(torch.round(t(x))),
        "exp": lambda x: n(torch.exp(t(x))), "log": lambda x: n(torch.log(t(x))),
        "tanh": lambda x: n(torch.tanh(t(x))), "sigmoid": lambda x: n(torch.sigmoid(t(x))),
        "sin": lambda x: n(torch.sin(t(x))), "cos": lambda x: n(torch.cos(t(x))),
        "sum": lambda X: n(t(X).sum(1)), "col_sum": lambda X: n(t(X).sum(0)),
        "max": lambda X: n(t(X).amax(1)),
        "dot": lambda x, y: n(torch.dot(t(x), t(y)).reshape(1)),
        "matmul": lambda A, B: n(t(A) @ t(B)), "matmul_nt": lambda A, B: n(t(A) @ t(B).T),
        "matmul_tn": lambda A, B: n(t(A).T @ t(B)),
        "matmul_i8": lambda A, B: n((t(A).long() @ t(B).long()).int()),
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


def resolve(spec: str) -> Kernel:
    """A kernel from its command-line name; InputError if it cannot be found."""
    if spec == "reference":
        return Reference()
    if spec == "numpy":
        return Table("numpy", _numpy_table())
    if spec == "torch":
        try:
            return Table("torch", _torch_table())
        except ImportError:
            raise InputError("the torch kernel needs PyTorch (pip install torch)") from None
    if spec == "cuda":
        try:
            from cuda_backend.adapter import conform_op
        except Exception as exc:  # no numba-cuda, no GPU and no simulator
            raise InputError(f"the cuda kernel needs cuda_backend and numba-cuda with a GPU "
                             f"(or NUMBA_ENABLE_CUDASIM=1): {exc}") from None
        return PythonCallable("cuda", conform_op, per_op=False)
    if spec.startswith("exec:"):
        from .execproto import ExecKernel

        command = spec[len("exec:"):].strip()
        if not command:
            raise InputError("exec: needs a command, e.g. exec:./my_kernel")
        return ExecKernel(command)
    module_name, _, fn_name = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InputError(f"kernel {spec!r}: cannot import {module_name} ({exc}); expected reference, "
                         f"numpy, torch, package.module[:function] or exec:COMMAND") from None
    if not fn_name:
        return PythonCallable(spec, module, per_op=True)
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise InputError(f"kernel {spec!r}: {module_name} has no callable {fn_name}")
    if fn_name in OPS:  # a function named after an op implements that op alone
        return PythonCallable(spec, fn, per_op=True, only=fn_name)
    return PythonCallable(spec, fn, per_op=False)
