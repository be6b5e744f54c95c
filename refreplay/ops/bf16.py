"""The ops of the bf16 profile ([bf16.ops.c1], ``spec/08-bf16.txt``).

An op in the profile is its binary32 op between two conversions: each input
the profile makes bf16 arrives as uint16 bits and is loaded and widened
exactly ([bf16.load.c1], [bf16.widen.c1]); the binary32 op runs unchanged;
each output the profile makes bf16 is rounded once ([bf16.round.c1]) and
returned as uint16 bits.  ``PROFILE`` is the table of [bf16.ops.c1]: per op,
one letter per input and per output, ``h`` for bf16, ``f`` for binary32,
``i`` for int32.  ``FP32`` holds the binary32 op each entry wraps, in the
tensors-only calling convention of [conf.vectors.c1] (a scalar is a
length-1 tensor).
"""

from __future__ import annotations

import numpy as np

from .. import linalg
from ..numerics import bf16 as B, core, elementwise
from . import activations, attention, embedding, linear, loss, norms, rope, softmax

# op -> (input kinds, output kinds), in the calling convention's order
PROFILE: dict[str, tuple[str, str]] = {
    "matmul": ("hh", "f"),
    "matmul_nt": ("hh", "f"),
    "matmul_tn": ("hh", "f"),
    "linear_forward": ("hhh", "h"),
    "linear_backward": ("hhh", "hff"),
    "layernorm_forward": ("hhh", "hff"),
    "layernorm_backward": ("hhhff", "hff"),
    "rmsnorm_forward": ("hh", "hf"),
    "rmsnorm_backward": ("hhhf", "hf"),
    "gelu_forward": ("h", "h"),
    "gelu_backward": ("hh", "h"),
    "silu_forward": ("h", "h"),
    "silu_backward": ("hh", "h"),
    "swiglu_forward": ("hh", "h"),
    "swiglu_backward": ("hhh", "hh"),
    "softmax_forward": ("h", "h"),
    "softmax_backward": ("hh", "h"),
    "log_softmax_forward": ("h", "h"),
    "log_softmax_backward": ("hh", "h"),
    "attention_forward": ("hhh", "hf"),
    "attention_backward": ("hhhhf", "hhh"),
    "rope_forward": ("hff", "h"),
    "rope_backward": ("hff", "h"),
    "embedding_forward": ("hi", "h"),
    "embedding_backward": ("hii", "f"),
    "cross_entropy_forward": ("hi", "ff"),
    "cross_entropy_backward": ("hi", "h"),
    "add": ("hh", "h"),
}


def _ce_forward(logits, targets):
    losses, mean, _ = loss.cross_entropy_forward(logits, targets)
    return losses, np.array([mean], np.float32)


FP32 = {
    "matmul": linalg.matmul,
    "matmul_nt": linalg.matmul_nt,
    "matmul_tn": linalg.matmul_tn,
    "linear_forward": linear.linear_forward,
    "linear_backward": lambda dy, x, W: linear.linear_backward(dy, x, W, True),
    "layernorm_forward": norms.layernorm_forward,
    "layernorm_backward": norms.layernorm_backward,
    "rmsnorm_forward": norms.rmsnorm_forward,
    "rmsnorm_backward": norms.rmsnorm_backward,
    "gelu_forward": activations.gelu_forward,
    "gelu_backward": activations.gelu_backward,
    "silu_forward": activations.silu_forward,
    "silu_backward": activations.silu_backward,
    "swiglu_forward": activations.swiglu_forward,
    "swiglu_backward": activations.swiglu_backward,
    "softmax_forward": softmax.softmax_forward,
    "softmax_backward": softmax.softmax_backward,
    "log_softmax_forward": softmax.log_softmax_forward,
    "log_softmax_backward": softmax.log_softmax_backward,
    "attention_forward": attention.attention_forward,
    "attention_backward": attention.attention_backward,
    "rope_forward": rope.rope_forward,
    "rope_backward": rope.rope_backward,
    "embedding_forward": embedding.embedding_forward,
    "embedding_backward": lambda d, tk, vv: embedding.embedding_backward(d, tk, int(vv[0])),
    "cross_entropy_forward": _ce_forward,
    "cross_entropy_backward": loss.cross_entropy_backward,
    "add": elementwise.add,
}


def call(fn, kinds_in: str, kinds_out: str, *inputs):
    """[bf16.ops.c1] Run the binary32 ``fn`` in the profile: widen the ``h``
    inputs (uint16 bits), load the ``f`` inputs, round the ``h`` outputs.
    Returns one array, or a tuple when ``kinds_out`` has several letters."""
    if len(inputs) != len(kinds_in):
        raise ValueError(f"expected {len(kinds_in)} inputs, got {len(inputs)}")
    args = []
    for kind, x in zip(kinds_in, inputs):
        if kind == "h":
            args.append(B.decode(x))
        elif kind == "f":
            args.append(core.load(x))
        else:
            args.append(x)
    out = fn(*args)
    outs = out if isinstance(out, tuple) else (out,)
    if len(outs) != len(kinds_out):
        raise ValueError(f"expected {len(kinds_out)} outputs, got {len(outs)}")
    done = tuple(B.encode(np.ascontiguousarray(o, np.float32)) if k == "h" else o for k, o in zip(kinds_out, outs))
    return done if len(done) > 1 else done[0]


def apply(op: str, *inputs):
    """[bf16.ops.c1] The op ``op`` of the profile on ``inputs`` (bf16 tensors
    as uint16 bits, binary32 as float32, indices as int32)."""
    if op not in PROFILE:
        raise KeyError(f"{op!r} is not an op of the bf16 profile")
    kinds_in, kinds_out = PROFILE[op]
    return call(FP32[op], kinds_in, kinds_out, *inputs)
