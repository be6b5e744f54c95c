"""Diagnoses that stay true on real kernels (issue 31, [conf.diagnosis.r1]).
Each kernel below deviates from the reference in known ways, and the
findings must name exactly those: a NaN payload beside a 1-ulp difference
names both; a sum started from +0 is named as such; a variant that explains
only part of the differences is called partial, with counts; a libm tanhf
and a loss computed as -log(e/s) are named; differences that cluster in an
input range are located."""

from __future__ import annotations

import numpy as np
import pytest

import refreplay.conformance as rc
from refreplay.conformance.base import deviant as fp
from refreplay.conformance.base.case import load_inputs
from refreplay.conformance.table import OPS

F32 = np.float32


def _reference(op, *inputs):
    out = OPS[op].reference(*load_inputs([np.ascontiguousarray(x) for x in inputs]))
    return out if isinstance(out, tuple) else (out,)


def _messages(report, op):
    return [d["message"] for d in report.diagnosis if d["op"] == op]


def _x86_nan_and_one_ulp(outs):
    """Every NaN as x86's default NaN 0xFFC00000 and every finite nonzero
    value with an odd last bit moved one ulp away from zero."""
    moved = []
    for o in outs:
        b = fp.bits(o).astype(np.int64)
        bump = np.isfinite(o) & (o != 0) & (b % 2 == 1) & (np.abs(o) < F32(1e30))
        b = np.where(bump, b + 1, b)
        b = np.where(np.isnan(o), 0xFFC00000, b)
        moved.append(b.astype(np.uint32).view(F32))
    return tuple(moved) if len(moved) > 1 else moved[0]


@pytest.mark.parametrize("op", ["adamw_update", "layernorm_backward", "linear_backward"])
def test_a_nan_payload_does_not_hide_a_one_ulp_difference(op):
    report = rc.check(lambda name, *xs: _x86_nan_and_one_ulp(_reference(name, *xs)), ops=[op])
    msgs = _messages(report, op)
    assert any(m.startswith("non-canonical NaN (0xFFC00000") for m in msgs), msgs
    # the 1-ulp moves are reported beside the NaN finding (found with the NaNs set aside, or by the variant
    # finding, which compares NaNs as NaNs); no variant is named, as none explains more than it breaks
    rest = [m for m in msgs if not m.startswith("non-canonical NaN")]
    assert rest and any("median of 1 ulp" in m for m in rest), msgs
    assert not any("closest variant" in m or "reproduced exactly" in m for m in msgs), msgs


def test_nan_payloads_alone_get_only_the_nan_finding():
    """The same kernel without the 1-ulp move: nothing remains to report."""

    def kernel(name, *xs):
        outs = _reference(name, *xs)
        outs = tuple(np.where(np.isnan(o), fp.f32(0xFFC00000), o).astype(F32) for o in outs)
        return outs if len(outs) > 1 else outs[0]

    report = rc.check(kernel, ops=["layernorm_backward"])
    msgs = _messages(report, "layernorm_backward")
    assert len(msgs) == 1 and msgs[0].startswith("non-canonical NaN"), msgs


def _canonical(*outs):
    outs = tuple(np.where(np.isnan(o), fp.f32(fp.CANONICAL_NAN), o).astype(F32) for o in outs)
    return outs if len(outs) > 1 else outs[0]


def _recip(v):
    with np.errstate(all="ignore"):
        return fp.flush(np.divide(F32(1), np.asarray(v, F32), dtype=F32))


def _sqrt(v):
    with np.errstate(all="ignore"):
        return fp.flush(np.sqrt(np.asarray(v, F32)))


def _load(x):
    x = np.asarray(x, F32)
    return np.where(np.isnan(x), fp.f32(fp.CANONICAL_NAN), np.where(fp.is_subnormal(x), x * F32(0), x)).astype(F32)


def layernorm_plus_zero(x, w, b):
    """[norm.layer.fwd.c1] step by step, written out here (sequential sums,
    recip(C), recip(sqrt(var + eps))), but both sums start from +0."""
    x, w, b = _load(x), _load(w), _load(b)
    N, C = x.shape
    inv = _recip(F32(C))
    s = np.zeros(N, F32)
    for c in range(C):
        s = fp.add(s, x[:, c])
    mean = fp.mul(s, inv)
    q = np.zeros(N, F32)
    for c in range(C):
        d = fp.add(x[:, c], -mean)
        q = fp.add(q, fp.mul(d, d))
    rstd = _recip(_sqrt(fp.add(fp.mul(q, inv), fp.f32(0x3727C5AC))))
    norm = fp.mul(fp.add(x, -mean[:, None]), rstd[:, None])
    return _canonical(fp.add(fp.mul(norm, w), b), mean, rstd)


def test_a_layernorm_sum_started_from_plus_zero_is_named():
    """Not "sums NumPy pairwise" (which also starts from +0 on short rows):
    the passing random rows rule the pairwise sum out."""
    report = rc.check(lambda op, *xs: layernorm_plus_zero(*xs), ops=["layernorm_forward"])
    assert report.ops["layernorm_forward"]["fail"] > 0
    msgs = _messages(report, "layernorm_forward")
    assert len(msgs) == 1, msgs
    assert msgs[0].startswith("reproduced exactly by the spec's algorithm with sums started from +0 (not -0) ("), msgs
    assert "NumPy" not in msgs[0]


def test_a_variant_that_explains_some_elements_is_partial_with_counts():
    """linear_forward contracting the multiply-add in odd output columns and
    summing the even ones in reverse: no variant reproduces both, so the
    closest is reported as partial, with counts, never as the cause."""
    from refreplay.conformance.readings import transformer as V

    by_name = {d.name: d for d in V.DEVIATIONS}

    def kernel(op, x, W, b):
        inputs = load_inputs([np.ascontiguousarray(v) for v in (x, W, b)])
        (fma,), (rev,) = (V.evaluate(op, inputs, (by_name[n],)) for n in ("fused multiply-add", "sums reversed"))
        odd = np.arange(fma.shape[-1]) % 2 == 1
        return np.where(odd, fma, rev).astype(F32)

    report = rc.check(kernel, ops=["linear_forward"])
    msgs = _messages(report, "linear_forward")
    assert report.ops["linear_forward"]["fail"] > 0
    assert not any(m.startswith("reproduced exactly") for m in msgs), msgs
    part = [m for m in msgs if m.startswith("partial: closest variant ") and " explains " in m]
    assert part, msgs
    explained, of = (int(w) for w in part[0].split(" explains ")[1].split(" differing")[0].split(" of "))
    assert 0 < explained < of, part[0]


def _c_libm(name):
    """The C library's binary32 function, called element by element (what a C kernel gets)."""
    import ctypes
    import ctypes.util

    lib = ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")
    fn = getattr(lib, name)
    fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float]
    return lambda x: fp.flush(np.array([fn(float(v)) for v in np.ravel(x)], F32).reshape(np.shape(x)))


GK, GS = fp.f32(0x3D372713), fp.f32(0x3F4C422A)  # 0.044715, sqrt(2/pi) as [act.gelu.fwd.c1]


def gelu_with_libm_tanhf(x):
    """0.5*x*(1 + tanhf(S*(x + K*x*x*x))) as a C training loop writes it, with the C library's tanhf."""
    x = _load(x)
    u = fp.mul(GS, fp.add(x, fp.mul(fp.mul(fp.mul(GK, x), x), x)))
    return _canonical(fp.mul(fp.mul(F32(0.5), x), fp.add(F32(1), _c_libm("tanhf")(u))))


def test_a_libm_tanhf_is_named():
    pytest.importorskip("ctypes.util")
    report = rc.check(lambda op, x: gelu_with_libm_tanhf(x), ops=["gelu_forward"])
    assert report.ops["gelu_forward"]["fail"] > 0
    msgs = _messages(report, "gelu_forward")
    assert len(msgs) == 1 and msgs[0].startswith(
        "reproduced exactly by the spec's algorithm with libm tanhf (the C library's tanh) ("
    ), msgs


def cross_entropy_minus_log_p(logits, targets):
    """The spec's row maximum, exp, sequential sum and log ([num.exp.c1],
    [num.log.c1]), but the loss as -log(e[y] / s)."""
    from refreplay.numerics import elementwise as E

    x = _load(logits)
    N, V = x.shape
    m = np.max(x, axis=1) if V else np.zeros(N, F32)
    e = E.exp(np.ascontiguousarray(fp.add(x, -m[:, None]), F32))
    s = np.full(N, F32(-0.0))
    for v in range(V):
        s = fp.add(s, e[:, v])
    y = np.where(targets < 0, 0, targets)
    with np.errstate(all="ignore"):
        p = fp.flush(np.divide(e[np.arange(N), y], s, dtype=F32))
    losses = np.where(targets < 0, F32(0), -E.log(np.ascontiguousarray(p))).astype(F32)
    total = F32(-0.0)
    for v in losses[targets >= 0]:
        total = fp.add(total, v)
    count = int((targets >= 0).sum())
    mean = fp.mul(total, _recip(F32(count))) if count else F32(0)
    return _canonical(losses, np.array([mean], F32).reshape(1))


def test_a_loss_as_minus_log_probability_is_not_called_a_vendor_exp():
    report = rc.check(lambda op, *xs: cross_entropy_minus_log_p(*xs), ops=["cross_entropy_forward"])
    assert report.ops["cross_entropy_forward"]["fail"] > 0
    msgs = _messages(report, "cross_entropy_forward")
    assert len(msgs) == 1 and "loss as -log(e/s)" in msgs[0] and "exp" not in msgs[0].split(" (")[0], msgs
    assert msgs[0].startswith("reproduced exactly"), msgs


def test_an_exp_that_gives_zero_below_minus_87_is_located():
    def kernel(x):
        (y,) = _reference("exp", x)
        return np.where(_load(x) < F32(-87), F32(0), y).astype(F32)

    report = rc.check(lambda op, x: kernel(x), ops=["exp"])
    msgs = _messages(report, "exp")
    assert report.ops["exp"]["fail"] > 0 and len(msgs) == 1, msgs
    assert "the differences lie only where x < -87 (" in msgs[0] and "none elsewhere" in msgs[0], msgs


def test_a_gelu_wrong_for_large_inputs_is_located():
    """GELU in float64 where |x| > 5: for x > 5 it rounds to the spec's bits,
    for x < -5 it does not, and the finding says exactly that."""

    def kernel(x):
        (y,) = _reference("gelu_forward", x)
        x = _load(x)
        with np.errstate(all="ignore"):
            w = x.astype(np.float64)
            z = fp.flush((0.5 * w * (1 + np.tanh(0.7978845608028654 * (w + 0.044715 * w**3)))).astype(F32))
        return _canonical(np.where(np.abs(x) > F32(5), z, y).astype(F32))

    report = rc.check(lambda op, x: kernel(x), ops=["gelu_forward"])
    msgs = _messages(report, "gelu_forward")
    assert report.ops["gelu_forward"]["fail"] > 0 and len(msgs) == 1, msgs
    assert "the differences lie only where x < -5 (" in msgs[0], msgs
    assert not msgs[0].startswith("reproduced exactly"), msgs


def test_differences_in_the_later_rows_are_located():
    """rmsnorm_backward one ulp off in rows 4 and above only (a kernel that
    switches path after a row block)."""

    def kernel(dout, x, w, rrms):
        dx, dw = _reference("rmsnorm_backward", dout, x, w, rrms)
        later = (np.arange(dx.shape[0])[:, None] >= 4) & np.isfinite(dx) & (dx != 0)
        return np.where(later, (fp.bits(dx).astype(np.int64) + 1).astype(np.uint32).view(F32), dx), dw

    report = rc.check(lambda op, *xs: kernel(*xs), ops=["rmsnorm_backward"])
    msgs = _messages(report, "rmsnorm_backward")
    assert len(msgs) == 1 and "the differences lie only in rows 4 and above" in msgs[0], msgs


def test_differences_everywhere_are_not_located():
    report = rc.check(lambda op, *xs: _x86_nan_and_one_ulp(_reference(op, *xs)), ops=["rmsnorm_backward"])
    msgs = _messages(report, "rmsnorm_backward")
    assert msgs and not any("the differences lie" in m for m in msgs), msgs


def test_an_order_that_fits_only_some_probes_is_partial():
    """A row sum that is reversed for odd lengths and pairwise for even ones:
    no candidate order reproduces every failing order probe, and the finding
    says how many the closest one reproduces instead of naming it."""
    from refreplay.conformance.readings import orders

    by = {o.name: o for o in orders.candidates(False)}

    def row_sum(X):
        X = _load(X)
        if X.shape[1] < 2:
            return by["sequential k increasing from -0"](X) if X.shape[1] else np.zeros(X.shape[0], F32)
        return by["reversed" if X.shape[1] % 2 else "pairwise tree (recursive halves)"](X)

    report = rc.check(lambda op, X: _canonical(row_sum(X)), ops=["sum"])
    msgs = [m for m in _messages(report, "sum") if m.startswith("sums in a different order")]
    assert len(msgs) == 1 and "partial: the closest candidate, " in msgs[0], _messages(report, "sum")
    assert "output matches" not in msgs[0]


def test_a_plus_zero_start_beside_another_difference_is_still_said():
    """embedding_backward whose -0 sums come out +0 and whose other results
    are one ulp off: the size of the differences and the +0 start, both."""

    def kernel(dout, tokens, V):
        (d,) = _reference("embedding_backward", dout, tokens, V)
        b = fp.bits(d).astype(np.int64)
        moved = np.where(np.isfinite(d) & (d != 0), b + 1, b).astype(np.uint32).view(F32)
        return np.where(fp.bits(d) == np.uint32(0x80000000), F32(0), moved).astype(F32)

    report = rc.check(lambda op, *xs: kernel(*xs), ops=["embedding_backward"])
    msgs = _messages(report, "embedding_backward")
    assert len(msgs) == 1 and "a median of 1 ulp" in msgs[0] and not msgs[0].startswith("reproduced"), msgs
    assert "are the spec's -0 come out +0 (a sum started from +0" in msgs[0], msgs


def _bf16_nan_and_one_ulp(outs, move=True):
    """bf16 outputs with every NaN as 0xFFC0 (x86's default NaN, narrowed) and,
    with ``move``, every finite nonzero value with an odd last bit moved one
    bf16 ulp away from zero."""
    moved = []
    for o in outs:
        if o.dtype != np.uint16:
            moved.append(o)
            continue
        b = o.astype(np.int64)
        mag = b & 0x7FFF
        nan = mag > 0x7F80
        if move:
            b = np.where(~nan & (mag > 0) & (mag < 0x7F00) & (b % 2 == 1), b + 1, b)
        moved.append(np.where(nan, 0xFFC0, b).astype(np.uint16))
    return tuple(moved) if len(moved) > 1 else moved[0]


def test_a_bf16_nan_payload_does_not_hide_a_one_ulp_difference():
    """[bf16.round.c1] [conf.diagnosis.r1] The bf16 profile too: the bf16 NaN
    finding comes first, and what the NaNs hid is reported after it."""
    report = rc.check(lambda name, *xs: _bf16_nan_and_one_ulp(_reference(name, *xs)), ops=["bf16_add"])
    msgs = _messages(report, "bf16_add")
    assert any(m.startswith("non-canonical bf16 NaN (0xFFC0") for m in msgs), msgs
    assert any(m.startswith("with NaN payloads set aside: ") for m in msgs), msgs


def test_bf16_nan_payloads_alone_get_only_the_nan_finding():
    report = rc.check(lambda name, *xs: _bf16_nan_and_one_ulp(_reference(name, *xs), move=False), ops=["bf16_add"])
    msgs = _messages(report, "bf16_add")
    assert len(msgs) == 1 and msgs[0].startswith("non-canonical bf16 NaN"), msgs


def test_torch_adamw_is_named_as_its_own_formula():
    """torch.optim.AdamW (real code, not written here) fails adamw_update; the
    variant model of its arithmetic (float64 scalars, lerp as an fma, IEEE
    subnormals) is named and explains nearly every differing element (what
    remains sits on subnormal inputs, which the model sees loaded)."""
    pytest.importorskip("torch")
    import re

    report = rc.check("torch", ops=["adamw_update"])
    msgs = [m.removeprefix("with NaN payloads set aside: ") for m in _messages(report, "adamw_update")]
    hit = [m for m in msgs if "torch.optim.AdamW's formula" in m]
    assert hit, msgs
    m = re.search(r"explains (\d+) of (\d+) differing elements", hit[0])
    assert hit[0].startswith("reproduced exactly") or (m and int(m.group(1)) >= 0.99 * int(m.group(2))), hit


@pytest.mark.parametrize(
    "op, variant",
    [
        ("softmax_backward", "softmax gradient as y*dy - y*d"),
        ("layernorm_backward", "LayerNorm dx from x (PyTorch's CPU form rstd*dnorm + b*x + c)"),
        ("rmsnorm_backward", "RMSNorm dx from x: rrms*dnorm - x*(rrms^3*mean(dnorm*x))"),
        ("adamw_update", "eps inside the square root"),
        ("attention_backward", "dz divided by sqrt(HS)"),
        ("attention_backward", "scale applied to dq and dk after their sums (FlashAttention's form)"),
    ],
)
def test_backward_and_optimizer_kernels_written_independently_are_named(op, variant):
    """Kernels written here in plain float32 NumPy (not through the models'
    parts) that make one known change: the diagnosis names that change."""

    def kernel(name, *xs):
        xs = load_inputs([np.ascontiguousarray(x) for x in xs])
        with np.errstate(all="ignore"):
            outs = _INDEPENDENT[name, variant](*xs)
        return tuple(np.where(np.isnan(o), fp.f32(fp.CANONICAL_NAN), o).astype(F32) for o in outs)

    report = rc.check(kernel, ops=[op])
    assert report.ops[op]["fail"] > 0
    msgs = _messages(report, op)
    assert any(m.startswith(f"reproduced exactly by the spec's algorithm with {variant} (") for m in msgs), msgs


def _flushed(x):
    return fp.flush(np.asarray(x, F32))


def _softmax_bwd_distributed(dy, y):
    d = _rows_seq(_flushed(dy * y))
    return (_flushed(_flushed(y * dy) - _flushed(y * d[:, None])),)


def _rows_seq(a):
    s = np.full(a.shape[0], F32(-0.0))
    for j in range(a.shape[1]):
        s = _flushed(s + a[:, j])
    return s


def _inv(c):
    return _flushed(F32(1) / F32(c))


def _ln_bwd_from_x(dout, x, w, mean, rstd):
    C = x.shape[1]
    dnorm = _flushed(dout * w)
    ds, db = _rows_seq(_flushed(dnorm * x)), _rows_seq(dnorm)
    b = _flushed(_flushed(db * mean) - ds)
    for _ in range(3):
        b = _flushed(b * rstd)
    b = _flushed(b * _inv(C))
    c = _flushed(_flushed(-b * mean) - _flushed(_flushed(db * rstd) * _inv(C)))
    dx = _flushed(_flushed(_flushed(_flushed(rstd[:, None] * dout) * w) + _flushed(b[:, None] * x)) + c[:, None])
    norm = _flushed(_flushed(x - mean[:, None]) * rstd[:, None])
    return dx, _rows_seq(_flushed(dout * norm).T), _rows_seq(dout.T)


def _rms_bwd_from_x(dout, x, w, rrms):
    dnorm = _flushed(dout * w)
    g = _flushed(_rows_seq(_flushed(dnorm * x)) * _inv(x.shape[1]))
    k = _flushed(_flushed(_flushed(_flushed(rrms * rrms) * rrms)) * g)
    dx = _flushed(_flushed(dnorm * rrms[:, None]) - _flushed(x * k[:, None]))
    norm = _flushed(x * rrms[:, None])
    return dx, _rows_seq(_flushed(dout * norm).T)


def _adamw_eps_inside(p, g, m, v, step, lr):
    b1, b2, eps, wd = fp.f32(0x3F666666), fp.f32(0x3F733333), fp.f32(0x322BCC77), fp.f32(0x3DCCCCCD)
    pw1, pw2 = b1, b2
    for _ in range(int(step[0]) - 1):
        pw1, pw2 = _flushed(pw1 * b1), _flushed(pw2 * b2)
        if pw1 == 0 and pw2 == 0:  # flushed: they stay +0
            break
    r1, r2 = _inv(_flushed(F32(1) - pw1)), _inv(_flushed(F32(1) - pw2))
    m2 = _flushed(_flushed(b1 * m) + _flushed(_flushed(F32(1) - b1) * g))
    v2 = _flushed(_flushed(b2 * v) + _flushed(_flushed(_flushed(F32(1) - b2) * g) * g))
    upd = _flushed(_flushed(m2 * r1) * _flushed(F32(1) / _flushed(np.sqrt(_flushed(_flushed(v2 * r2) + eps)))))
    p2 = _flushed(p - _flushed(lr[0] * _flushed(upd + _flushed(wd * p))))
    return p2, m2, v2


def _attention_bwd(dout, q, k, v, att, form="spec"):
    """[attn.bwd.c1] one query row t at a time, with the scale of dz as the
    spec has it, divided by sqrt(HS) ("divide"), or applied to the finished
    dq and dk ("flash")."""
    B, NH, T, HS = q.shape
    scale = _inv(np.sqrt(F32(HS)))
    dq = np.zeros(q.shape, F32)
    dk, dv = np.full(k.shape, F32(-0.0)), np.full(v.shape, F32(-0.0))
    for b in range(B):
        for h in range(NH):
            o, Q, K, V, A = dout[b, h], q[b, h], k[b, h], v[b, h], att[b, h]
            for t in range(T):
                y = A[t, : t + 1]
                dp = _rows_seq(_flushed(o[t][None, :] * V[: t + 1]))
                c = _rows_seq(_flushed(dp * y)[None, :])[0]
                dz = _flushed(y * _flushed(dp - c))
                if form == "spec":
                    dz = _flushed(dz * scale)
                elif form == "divide":
                    dz = _flushed(dz / np.sqrt(F32(HS)))
                dq[b, h, t] = _rows_seq(_flushed(dz[:, None] * K[: t + 1]).T)
                dk[b, h, : t + 1] = _flushed(dk[b, h, : t + 1] + _flushed(dz[:, None] * Q[t][None, :]))
                dv[b, h, : t + 1] = _flushed(dv[b, h, : t + 1] + _flushed(y[:, None] * o[t][None, :]))
    if form == "flash":
        dq, dk = _flushed(dq * scale), _flushed(dk * scale)
    return dq, dk, dv


_INDEPENDENT = {
    ("softmax_backward", "softmax gradient as y*dy - y*d"): _softmax_bwd_distributed,
    ("layernorm_backward", "LayerNorm dx from x (PyTorch's CPU form rstd*dnorm + b*x + c)"): _ln_bwd_from_x,
    ("rmsnorm_backward", "RMSNorm dx from x: rrms*dnorm - x*(rrms^3*mean(dnorm*x))"): _rms_bwd_from_x,
    ("adamw_update", "eps inside the square root"): _adamw_eps_inside,
    ("attention_backward", "dz divided by sqrt(HS)"): lambda *xs: _attention_bwd(*xs, form="divide"),
    ("attention_backward", "scale applied to dq and dk after their sums (FlashAttention's form)"): (
        lambda *xs: _attention_bwd(*xs, form="flash")
    ),
}


def test_the_independent_attention_backward_passes_in_the_spec_form():
    """The transcription above is right: with the spec's scale it passes every vector."""

    def kernel(op, *xs):
        xs = load_inputs([np.ascontiguousarray(x) for x in xs])
        with np.errstate(all="ignore"):
            outs = _attention_bwd(*xs)
        return tuple(np.where(np.isnan(o), fp.f32(fp.CANONICAL_NAN), o).astype(F32) for o in outs)

    report = rc.check(kernel, ops=["attention_backward"])
    assert report.ops["attention_backward"]["fail"] == 0 and report.ops["attention_backward"]["pass"] > 0
