"""What the runner says when no diagnostic probe isolates a failure and the op
has no variant model ([conf.diagnosis.r1]): a sign of zero alone, the special
inputs every difference sits on, or the size of the differences.  Each
wrong kernel below deviates from the reference in one known way, and the
finding must name that way (and not another)."""

from __future__ import annotations

import numpy as np
import pytest

import refreplay.conformance as rc
from refreplay.conformance.base import deviant as fp
from refreplay.conformance.base.case import load_inputs
from refreplay.conformance.table import OPS


def _reference(op, *inputs):
    out = OPS[op].reference(*load_inputs([np.ascontiguousarray(x) for x in inputs]))
    return out if isinstance(out, tuple) else (out,)


def _messages(report, op):
    return [d["message"] for d in report.diagnosis if d["op"] == op]


def test_a_sum_started_from_plus_zero_is_named():
    """embedding_backward with every -0 result turned into +0: the spec's -0
    comes out +0, which a sum started from +0 gives."""

    def kernel(dout, tokens, V):
        (dwte,) = _reference("embedding_backward", dout, tokens, V)
        return np.where(fp.bits(dwte) == np.uint32(0x80000000), np.float32(0), dwte)

    report = rc.check(lambda op, *xs: kernel(*xs), ops=["embedding_backward"])
    assert report.ops["embedding_backward"]["fail"] > 0
    (msg,) = _messages(report, "embedding_backward")
    # embedding_backward has a variant model now (issue 31): its +0-start variant is named
    assert msg.startswith("reproduced exactly by the spec's algorithm with sums started from +0 (not -0) (")


# An op taken out of the variant models for the fallback's tests: rotary embedding had none until
# issue 31 gave it one (and quantization); an op without a model (sin, cos, the element-wise ops)
# takes the same path.
UNMODELLED = "rope_backward"


@pytest.fixture
def unmodelled(monkeypatch):
    from refreplay.conformance.readings import transformer

    for op in (UNMODELLED, "fake_quantize"):
        monkeypatch.delitem(transformer.MODELS, op)


def test_a_sum_started_from_plus_zero_is_named_without_a_model(unmodelled):
    """rope_backward (no variant model) with every -0 result turned into
    +0: the fallback says the spec's -0 comes out +0."""
    from refreplay.conformance.readings import transformer

    assert UNMODELLED not in transformer.MODELS

    def kernel(*xs):
        outs = _reference(UNMODELLED, *xs)
        return tuple(np.where(fp.bits(o) == np.uint32(0x80000000), np.float32(0), o) for o in outs)

    report = rc.check(lambda op, *xs: kernel(*xs), ops=[UNMODELLED])
    assert report.ops[UNMODELLED]["fail"] > 0
    (msg,) = _messages(report, UNMODELLED)
    assert msg.startswith("the spec's -0 comes out +0") and "started from +0" in msg


def _nan_to_lowest_code(x, s):
    (out,) = _reference("fake_quantize", x, s)
    return np.where(np.isnan(x), np.float32(-128) * s[0], out).astype(np.float32)


def test_a_nan_code_is_named_by_the_quant_model():
    """fake_quantize mapping a NaN to the code -128 (what PyTorch does) where
    [num.sat.c1] maps it to 0: the quantization model names it exactly."""
    report = rc.check(lambda op, *xs: _nan_to_lowest_code(*xs), ops=["fake_quantize"])
    (msg,) = _messages(report, "fake_quantize")
    assert msg.startswith("reproduced exactly by the spec's algorithm with NaN as the lowest code (-128) ("), msg


def test_a_nan_code_is_located_at_nan_inputs(unmodelled):
    """The same kernel without the model: every difference sits on a NaN input."""
    report = rc.check(lambda op, *xs: _nan_to_lowest_code(*xs), ops=["fake_quantize"])
    msgs = _messages(report, "fake_quantize")
    assert any(m.startswith("differs only where the input x is NaN") for m in msgs), msgs
    assert not any("subnormal" in m for m in msgs), msgs


@pytest.mark.parametrize("ulps, words", [(1, "median of 1 ulp"), (4096, "more than rounding")])
def test_the_size_of_unexplained_differences_is_measured(unmodelled, ulps, words):
    """rope_backward with dx moved by a fixed number of ulp away from
    zero: a few ulp read as another order or fused arithmetic, thousands as
    another formula."""

    def kernel(*xs):
        dx, *rest = _reference(UNMODELLED, *xs)
        b = fp.bits(dx).astype(np.int64)
        finite = np.isfinite(dx) & (dx != 0)
        moved = np.where(finite, b + ulps, b).astype(np.uint32).view(np.float32)
        return (np.where(np.isfinite(moved), moved, dx), *rest)

    report = rc.check(lambda op, *xs: kernel(*xs), ops=[UNMODELLED])
    assert report.ops[UNMODELLED]["fail"] > 0
    (msg,) = _messages(report, UNMODELLED)
    assert msg.startswith("differs by a median of") and "in its random cases" in msg and words in msg, msg
    assert "median of 1 ulp" not in msg or ulps == 1


def test_torch_backward_ops_are_negative_controls():
    """PyTorch's own backward kernels and optimizer (ATen's LayerNorm, softmax
    and embedding backwards, autograd of RMSNorm, attention's math path,
    torch.optim's AdamW, fake quantization) fail the vectors, each with a
    finding; none errors out."""
    pytest.importorskip("torch")
    ops = [
        "linear_backward",
        "layernorm_backward",
        "rmsnorm_backward",
        "softmax_backward",
        "log_softmax_backward",
        "attention_backward",
        "rope_backward",
        "embedding_backward",
        "quant_step_size",
        "fake_quantize",
        "fake_quantize_backward",
        "adamw_update",
        "bf16_layernorm_backward",
        "bf16_rmsnorm_forward",
        "bf16_rmsnorm_backward",
        "bf16_softmax_backward",
        "bf16_attention_backward",
        "bf16_rope_forward",
        "bf16_embedding_backward",
    ]
    report = rc.check("torch", ops=ops)
    assert not report.conformant
    for op in ops:
        assert report.ops[op]["fail"] > 0 and report.ops[op]["error"] == 0, (op, report.ops[op])
        assert _messages(report, op), op
    assert any("NaN as the lowest code (-128)" in m for m in _messages(report, "fake_quantize"))
