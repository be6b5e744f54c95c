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


def _torch_table():
    import torch

    t = torch.from_numpy

    def n(x):
        return x.numpy()

    return {
        "add": lambda a, b: n(t(a) + t(b)),
        "sub": lambda a, b: n(t(a) - t(b)),
        "mul": lambda a, b: n(t(a) * t(b)),
        "recip": lambda x: n(torch.reciprocal(t(x))),
        "sqrt": lambda x: n(torch.sqrt(t(x))),
        "fmax": lambda a, b: n(torch.maximum(t(a), t(b))),
        "fmin": lambda a, b: n(torch.minimum(t(a), t(b))),
        "rint": lambda x: n(torch.round(t(x))),
        "exp": lambda x: n(torch.exp(t(x))),
        "log": lambda x: n(torch.log(t(x))),
        "tanh": lambda x: n(torch.tanh(t(x))),
        "sigmoid": lambda x: n(torch.sigmoid(t(x))),
        "sin": lambda x: n(torch.sin(t(x))),
        "cos": lambda x: n(torch.cos(t(x))),
        "sum": lambda X: n(t(X).sum(1)),
        "col_sum": lambda X: n(t(X).sum(0)),
        "max": lambda X: n(t(X).amax(1)),
        "dot": lambda x, y: n(torch.dot(t(x), t(y)).reshape(1)),
        "matmul": lambda A, B: n(t(A) @ t(B)),
        "matmul_nt": lambda A, B: n(t(A) @ t(B).T),
        "matmul_tn": lambda A, B: n(t(A).T @ t(B)),
        "matmul_i8": lambda A, B: n((t(A).long() @ t(B).long()).int()),
        **_torch_model_ops(torch),
        **_torch_bf16_ops(torch),
    }


def _torch_bf16_ops(torch):
    """PyTorch's native bfloat16 ops under the bf16 profile's calling
    conventions ([bf16.ops.c1]): bf16 tensors in, bf16 (or, where the
    profile has binary32, the result widened to float32) out.  Negative
    controls: a bf16 matmul rounds its binary32 accumulator to bf16, the
    ops use PyTorch's own exp/tanh and orders."""
    import torch.nn.functional as F

    bf = torch.bfloat16

    def h(x):
        return torch.from_numpy(np.ascontiguousarray(x).view(np.int16)).view(bf)

    def bits(x):
        return x.detach().contiguous().view(torch.int16).numpy().view(np.uint16)

    def f(x):
        return x.detach().float().numpy()

    def mm(a, b):
        return f(a @ b)

    def layernorm(x, w, b):
        out, mean, rstd = torch.native_layer_norm(h(x), (x.shape[1],), h(w), h(b), 1e-5)
        return bits(out), f(mean).reshape(-1), f(rstd).reshape(-1)

    def attention(q, k, v):
        Q, K, V = h(q), h(k), h(v)
        T = Q.shape[-2]
        out = F.scaled_dot_product_attention(Q, K, V, is_causal=True)
        s = (Q @ K.transpose(-1, -2)).float() / float(np.sqrt(Q.shape[-1]))
        att = torch.softmax(s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")), -1)
        return bits(out), f(att)

    def cross_entropy(logits, targets):
        y = torch.from_numpy(targets).long()
        losses = F.cross_entropy(h(logits), y, ignore_index=-1, reduction="none")
        return f(losses), f(F.cross_entropy(h(logits), y, ignore_index=-1).reshape(1))

    def cross_entropy_backward(logits, targets):
        L = h(logits).clone().requires_grad_(True)
        F.cross_entropy(L, torch.from_numpy(targets).long(), ignore_index=-1).backward()
        return bits(L.grad)

    def grad(fn, dout, *xs):
        """bf16 gradients of fn(*xs) . dout by PyTorch's bf16 autograd."""
        leaves = [h(x).clone().requires_grad_(True) for x in xs]
        fn(*leaves).backward(h(dout))
        out = tuple(bits(leaf.grad) for leaf in leaves)
        return out if len(out) > 1 else out[0]

    def linear_backward(dy, x, W):
        """PyTorch keeps dW and db in bf16 (the profile: binary32)."""
        X, Wl = h(x).clone().requires_grad_(True), h(W).clone().requires_grad_(True)
        b = torch.zeros(W.shape[0], dtype=bf, requires_grad=True)
        F.linear(X, Wl, b).backward(h(dy))
        return bits(X.grad), f(Wl.grad), f(b.grad)

    def layernorm_backward(dout, x, w, mean, rstd):
        """ATen's bf16 LayerNorm backward (it takes mean and rstd in bf16)."""
        dx, dw, db = torch.ops.aten.native_layer_norm_backward(
            h(dout),
            h(x),
            (x.shape[1],),
            torch.from_numpy(mean).to(bf),
            torch.from_numpy(rstd).to(bf),
            h(w),
            torch.zeros(w.shape, dtype=bf),
            [True, True, True],
        )
        return bits(dx), f(dw), f(db)

    def rmsnorm(x, w):
        out, rstd = torch.ops.aten._fused_rms_norm(h(x), [x.shape[1]], h(w), 1e-5)
        return bits(out), f(rstd).reshape(-1)

    def rmsnorm_backward(dout, x, w, rrms):
        """bf16 autograd of F.rms_norm; dw comes back in bf16 (the profile: binary32)."""
        X, W = h(x).clone().requires_grad_(True), h(w).clone().requires_grad_(True)
        F.rms_norm(X, (x.shape[1],), W, 1e-5).backward(h(dout))
        return bits(X.grad), f(W.grad)

    def attention_backward(dout, q, k, v, att):
        """The math attention path's backward in bf16, from the given probabilities."""
        D, Q, K, V, A = h(dout), h(q), h(k), h(v), torch.from_numpy(att).to(bf)
        ds = torch.ops.aten._softmax_backward_data(D @ V.transpose(-1, -2), A, -1, bf) / float(np.sqrt(q.shape[-1]))
        return bits(ds @ K), bits(ds.transpose(-1, -2) @ Q), bits(A.transpose(-1, -2) @ D)

    def rope(X, c, s):
        """Rotary embedding of a bf16 tensor with the tables converted to bf16."""
        C, S = torch.from_numpy(c).to(bf), torch.from_numpy(s).to(bf)
        half = X.shape[-1] // 2
        a, b = X[..., :half], X[..., half:]
        return torch.cat([a * C - b * S, b * C + a * S], -1)

    def rope_backward(dout, c, s):
        X = torch.zeros(dout.shape, dtype=bf, requires_grad=True)
        rope(X, c, s).backward(h(dout))
        return bits(X.grad)

    gelu = lambda x: F.gelu(x, approximate="tanh")  # noqa: E731
    swiglu = lambda a, b: F.silu(a) * b  # noqa: E731
    return {
        "bf16_layernorm_backward": layernorm_backward,
        "bf16_rmsnorm_forward": rmsnorm,
        "bf16_rmsnorm_backward": rmsnorm_backward,
        "bf16_softmax_backward": lambda dy, y: bits(torch.ops.aten._softmax_backward_data(h(dy), h(y), 1, bf)),
        "bf16_log_softmax_backward": lambda dy, y: bits(torch.ops.aten._log_softmax_backward_data(h(dy), h(y), 1, bf)),
        "bf16_attention_backward": attention_backward,
        "bf16_rope_forward": lambda x, c, s: bits(rope(h(x), c, s)),
        "bf16_rope_backward": rope_backward,
        "bf16_embedding_backward": lambda dout, tokens, V: f(
            torch.ops.aten.embedding_dense_backward(h(dout), torch.from_numpy(tokens).long(), int(V[0]), -1, False)
        ),
        "bf16_matmul": lambda A, B: mm(h(A), h(B)),
        "bf16_matmul_nt": lambda A, B: mm(h(A), h(B).T),
        "bf16_matmul_tn": lambda A, B: mm(h(A).T, h(B)),
        "bf16_linear_forward": lambda x, W, b: bits(F.linear(h(x), h(W), h(b))),
        "bf16_layernorm_forward": layernorm,
        "bf16_gelu_forward": lambda x: bits(gelu(h(x))),
        "bf16_gelu_backward": lambda dout, x: grad(gelu, dout, x),
        "bf16_silu_forward": lambda x: bits(F.silu(h(x))),
        "bf16_silu_backward": lambda dout, x: grad(F.silu, dout, x),
        "bf16_swiglu_forward": lambda a, b: bits(swiglu(h(a), h(b))),
        "bf16_swiglu_backward": lambda dout, a, b: grad(swiglu, dout, a, b),
        "bf16_linear_backward": linear_backward,
        "bf16_softmax_forward": lambda x: bits(torch.softmax(h(x), 1)),
        "bf16_log_softmax_forward": lambda x: bits(torch.log_softmax(h(x), 1)),
        "bf16_attention_forward": attention,
        "bf16_cross_entropy_forward": cross_entropy,
        "bf16_cross_entropy_backward": cross_entropy_backward,
        "bf16_embedding_forward": lambda wte, tokens: bits(F.embedding(torch.from_numpy(tokens).long(), h(wte))),
        "bf16_add": lambda a, b: bits(h(a) + h(b)),
        "bf16_encode": lambda x: bits(torch.from_numpy(x).to(bf)),
        "bf16_decode": lambda x: f(h(x)),
    }


def _torch_model_ops(torch):
    """PyTorch's own transformer ops under the registry's calling conventions:
    what a kernel author would naturally compare with.  Negative controls:
    they are not expected to conform (fused or reordered sums, vendor
    exp/tanh, no flushes), except where the op is exact (embedding)."""
    import torch.nn.functional as F

    t = torch.from_numpy
    eps = 1e-5

    def n(*xs):
        out = tuple(x.detach().numpy() for x in xs)
        return out if len(out) > 1 else out[0]

    def grad(fn, dout, *xs):
        """Gradients of sum(fn(*xs) * dout) with respect to every x (autograd)."""
        leaves = [t(x.copy()).requires_grad_(True) for x in xs]
        (fn(*leaves) * t(dout)).sum().backward()
        return n(*[leaf.grad for leaf in leaves])

    def layernorm(x, w, b):
        X = t(x)
        mean = X.mean(1)
        rstd = torch.rsqrt(X.var(1, unbiased=False) + eps)
        return n(F.layer_norm(X, (X.shape[1],), t(w), t(b), eps), mean, rstd)

    def rmsnorm(x, w):
        X = t(x)
        rrms = torch.rsqrt(X.pow(2).mean(1) + eps)
        return n(X * rrms[:, None] * t(w), rrms)

    def attention(q, k, v):
        Q, K, V = t(q), t(k), t(v)
        T, HS = Q.shape[-2], Q.shape[-1]
        s = (Q @ K.transpose(-1, -2)) / float(np.sqrt(HS))
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        att = torch.softmax(s, -1)
        return n(att @ V, att)

    def rope_t(X, C, S):
        h = X.shape[-1] // 2
        a, b = X[..., :h], X[..., h:]
        return torch.cat([a * C - b * S, b * C + a * S], -1)

    def cross_entropy(logits, targets):
        y = t(targets).long()
        losses = F.cross_entropy(t(logits), y, ignore_index=-1, reduction="none")
        return n(losses, F.cross_entropy(t(logits), y, ignore_index=-1).reshape(1))

    def cross_entropy_backward(logits, targets):
        y = t(targets).long()
        L = t(logits.copy()).requires_grad_(True)
        F.cross_entropy(L, y, ignore_index=-1).backward()
        return n(L.grad)

    def linear_backward(dy, x, W):
        X, Wl = t(x.copy()).requires_grad_(True), t(W.copy()).requires_grad_(True)
        b = torch.zeros(W.shape[0], requires_grad=True)
        F.linear(X, Wl, b).backward(t(dy))
        return n(X.grad, Wl.grad, b.grad)

    def layernorm_backward(dout, x, w, mean, rstd):
        """ATen's own LayerNorm backward, given the forward's mean and rstd."""
        return n(
            *torch.ops.aten.native_layer_norm_backward(
                t(dout), t(x), (x.shape[1],), t(mean), t(rstd), t(w), torch.zeros_like(t(w)), [True, True, True]
            )
        )

    def rmsnorm_backward(dout, x, w, rrms):
        """Autograd of F.rms_norm (ATen has no CPU kernel that takes rrms)."""
        return grad(lambda X, W: F.rms_norm(X, (x.shape[1],), W, eps), dout, x, w)

    def attention_backward(dout, q, k, v, att):
        """The backward of the math attention path, from the given probabilities."""
        D, Q, K, V, A = t(dout), t(q), t(k), t(v), t(att)
        ds = torch.ops.aten._softmax_backward_data(D @ V.transpose(-1, -2), A, -1, torch.float32)
        ds = ds / float(np.sqrt(q.shape[-1]))
        return n(ds @ K, ds.transpose(-1, -2) @ Q, A.transpose(-1, -2) @ D)

    def fake_quantize(x, s):
        return n(torch.fake_quantize_per_tensor_affine(t(x), float(s[0]), 0, -128, 127))

    def adamw_update(p, g, m, v, step, lr):
        """torch.optim's single-tensor AdamW with the op's default hyper-parameters."""
        from torch.optim.adamw import adamw

        P, M, Vv = t(p.copy()), t(m.copy()), t(v.copy())
        adamw(
            [P],
            [t(g)],
            [M],
            [Vv],
            [],
            [torch.tensor(float(step[0]) - 1)],
            foreach=False,
            amsgrad=False,
            beta1=0.9,
            beta2=0.95,
            lr=float(lr[0]),
            weight_decay=0.1,
            eps=1e-8,
            maximize=False,
        )
        return n(P, M, Vv)

    gelu = lambda x: F.gelu(x, approximate="tanh")  # noqa: E731
    swiglu = lambda a, b: F.silu(a) * b  # noqa: E731
    return {
        "linear_backward": linear_backward,
        "layernorm_backward": layernorm_backward,
        "rmsnorm_backward": rmsnorm_backward,
        "softmax_backward": lambda dy, y: n(torch.ops.aten._softmax_backward_data(t(dy), t(y), 1, torch.float32)),
        "log_softmax_backward": lambda dy, y: n(
            torch.ops.aten._log_softmax_backward_data(t(dy), t(y), 1, torch.float32)
        ),
        "attention_backward": attention_backward,
        "rope_backward": lambda dout, c, s: grad(lambda X: rope_t(X, t(c), t(s)), dout, np.zeros_like(dout)),
        "embedding_backward": lambda dout, tokens, V: n(
            torch.ops.aten.embedding_dense_backward(t(dout), t(tokens).long(), int(V[0]), -1, False)
        ),
        "quant_step_size": lambda x: n((t(x).abs().max() / 127 if x.size else torch.zeros(())).reshape(1)),
        "fake_quantize": fake_quantize,
        "fake_quantize_backward": lambda dy, x, s: grad(
            lambda X: torch.fake_quantize_per_tensor_affine(X, float(s[0]), 0, -128, 127), dy, x
        ),
        "adamw_update": adamw_update,
        "gelu_forward": lambda x: n(gelu(t(x))),
        "gelu_backward": lambda dout, x: grad(gelu, dout, x),
        "silu_forward": lambda x: n(F.silu(t(x))),
        "silu_backward": lambda dout, x: grad(F.silu, dout, x),
        "swiglu_forward": lambda a, b: n(swiglu(t(a), t(b))),
        "swiglu_backward": lambda dout, a, b: grad(swiglu, dout, a, b),
        "linear_forward": lambda x, W, b: n(F.linear(t(x), t(W), t(b))),
        "layernorm_forward": layernorm,
        "rmsnorm_forward": rmsnorm,
        "softmax_forward": lambda x: n(torch.softmax(t(x), 1)),
        "log_softmax_forward": lambda x: n(torch.log_softmax(t(x), 1)),
        "attention_forward": attention,
        "rope_forward": lambda x, c, s: n(rope_t(t(x), t(c), t(s))),
        "embedding_forward": lambda wte, tokens: n(F.embedding(t(tokens).long(), t(wte))),
        "cross_entropy_forward": cross_entropy,
        "cross_entropy_backward": cross_entropy_backward,
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
            return Table("torch", _torch_table())
        except ImportError:
            raise InputError("the torch kernel needs PyTorch (pip install torch)") from None
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
