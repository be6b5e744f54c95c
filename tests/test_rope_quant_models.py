"""The variant models of rotary embedding and quantization ([conf.diagnosis.r1],
issue 31): kernels written here, not from the models, that deviate in one
known way get exactly that finding, and the spec's own form is no variant."""

from __future__ import annotations

import numpy as np

import refreplay.conformance as rc
from refreplay.conformance.base import deviant as fp
from refreplay.conformance.base.case import load_inputs
from refreplay.conformance.table import OPS


def _ref(op, *xs):
    out = OPS[op].reference(*load_inputs([np.ascontiguousarray(x) for x in xs]))
    return out if isinstance(out, tuple) else (out,)


def _finding(kernel, op):
    report = rc.check(lambda name, *xs: kernel(*xs), ops=[op])
    assert report.ops[op]["fail"] > 0, op
    msgs = [d["message"] for d in report.diagnosis if d["op"] == op]
    return " | ".join(msgs)


def _interleave(op):
    """The spec's rotation on channel pairs (2i, 2i+1): the reference run on the
    channels permuted to half-split order, and the result permuted back."""

    def kernel(x, cos_t, sin_t):
        HS = x.shape[-1]
        perm = np.r_[0:HS:2, 1:HS:2]
        (out,) = _ref(op, np.ascontiguousarray(x[..., perm]), cos_t, sin_t)
        back = np.empty_like(out)
        back[..., perm] = out
        return back

    return kernel


def test_interleaved_rope_is_named():
    for op in ("rope_forward", "rope_backward"):
        msg = _finding(_interleave(op), op)
        assert msg.startswith("reproduced exactly by the spec's algorithm with interleaved pairs (2i, 2i+1)"), msg


def test_the_other_rotation_is_named():
    """A backward that applies the forward's rotation (sine not negated)."""

    def kernel(dout, cos_t, sin_t):
        return _ref("rope_forward", dout, cos_t, sin_t)

    msg = _finding(kernel, "rope_backward")
    assert msg.startswith("reproduced exactly by the spec's algorithm with rotation the other way (sine negated)"), msg


def test_round_half_away_from_zero_is_named():
    """fake_quantize with C's roundf: codes at k + 1/2 go away from zero."""

    def kernel(x, s):
        x = load_inputs([np.ascontiguousarray(x)])[0]
        r = np.float32(1.0) / np.float32(s[0])  # recip: correctly rounded ([num.recip.c1])
        v = fp.mul(x, np.float32(r))
        with np.errstate(invalid="ignore"):
            a = np.where(np.abs(v) < 2**23, np.copysign(np.floor(np.abs(v) + np.float32(0.5)), v), v)
            q = np.where(np.isnan(a), 0, np.clip(a, -128, 127)).astype(np.float32) + np.float32(0)
        return fp.mul(q, s[0])

    msg = _finding(kernel, "fake_quantize")
    assert msg.startswith("reproduced exactly by the spec's algorithm with round half away from zero (C roundf)"), msg


def test_a_mask_from_x_over_s_is_named():
    """fake_quantize_backward whose mask takes the code from x / s (a correctly
    rounded division) instead of x * recip(s): the edge cases at 127.5 s and
    -128.5 s move a code across the saturation bound."""

    def kernel(dy, x, s):
        dy, x = load_inputs([np.ascontiguousarray(dy), np.ascontiguousarray(x)])
        with np.errstate(invalid="ignore", divide="ignore"):
            v = np.rint(np.divide(x, np.float32(s[0]), dtype=np.float32))
            return np.where((v >= -128) & (v <= 127), dy, np.float32(0)).astype(np.float32)

    msg = _finding(kernel, "fake_quantize_backward")
    assert msg.startswith("reproduced exactly by the spec's algorithm with x divided by the step"), msg


def test_a_step_by_division_without_floor_is_the_pair():
    """quant_step_size as max|x| / 127 with no floor (PyTorch's formula, NaN
    propagated): the pair of the two deviations, neither alone."""

    def kernel(x):
        a = np.abs(np.asarray(x, np.float32)).reshape(-1)
        if np.isnan(a).any():
            return np.array([np.nan], np.float32)
        m = a.max() if a.size else np.float32(0)
        return fp.flush(np.array([m / np.float32(127)], np.float32))

    msg = _finding(kernel, "quant_step_size")
    assert msg.startswith("reproduced exactly by the spec's algorithm with step as absmax / 127 + no step floor"), msg


def test_the_spec_form_is_no_variant():
    for op in ("rope_forward", "rope_backward", "quant_step_size", "fake_quantize", "fake_quantize_backward"):
        report = rc.check(lambda name, *xs, op=op: _ref(op, *xs), ops=[op])
        assert report.ops[op]["fail"] == 0 and not report.diagnosis, op
