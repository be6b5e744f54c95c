"""Each probe family isolates its property ([conf.diagnosis.r1]): a kernel
with exactly one deviation from the table of docs/conformance.md gets
exactly the diagnosis for it and no other, for every deviation and every
sum-shaped op (matmul, dot, sum).

The kernels are float32 NumPy emulations of the spec's sequential sum
(vectorised across independent outputs only), each with one switch flipped.
"""

import numpy as np
import pytest

from refreplay.conformance.base import deviant as fp
from refreplay.conformance.running import adapters as kernels
from refreplay.conformance.reporting import report
from refreplay.conformance.running import compare as runner
from refreplay.conformance.golden import store

F32 = np.float32
FLT_MIN = F32(2.0**-126)

# deviation -> (what the finding must say, ops whose vectors probe it)
DEVIATIONS = {
    "fma": ("contracts multiply-add", ("matmul", "dot")),
    "order": ("sums in a different order", ("matmul", "dot", "sum")),
    "ftz_before_rounding": ("flushes before rounding", ("matmul", "dot")),
    "ftz_after_rounding": ("flushes the way x86 FTZ", ("matmul", "dot")),
    "flush": ("does not flush subnormal results", ("matmul", "dot", "sum")),
    "input_zeroing": ("does not zero subnormal inputs", ("matmul", "dot", "sum")),
    "nan": ("non-canonical NaN", ("matmul", "dot", "sum")),
    "signed_zero": ("sign of zero", ("matmul", "dot", "sum")),
    "tf32": ("rounds fp32 inputs to TF32", ("matmul", "dot")),
}


def _flush(x, dev):
    return x if dev == "flush" else fp.flush(x)


def _load(x, dev):
    x = np.asarray(x, F32)
    if dev != "input_zeroing":
        x = np.where(fp.is_subnormal(x), x * F32(0), x).astype(F32)
    if dev != "nan":
        x = np.where(np.isnan(x), fp.f32(fp.CANONICAL_NAN), x).astype(F32)
    if dev == "tf32":
        x = fp.round_mantissa(x, 10)
    return x


def _mul(a, b, dev):
    with np.errstate(all="ignore"):
        if dev == "ftz_before_rounding":  # tininess judged on the exact product (ARM FZ)
            exact = a.astype(np.float64) * b.astype(np.float64)
            p = (a * b).astype(F32)
            return np.where(np.abs(exact) < float(FLT_MIN), p * F32(0), p).astype(F32)
        if dev == "ftz_after_rounding":  # tininess judged on the product rounded to 24 bits (x86 FTZ)
            exact = a.astype(np.float64) * b.astype(np.float64)
            m, e = np.frexp(exact)
            rounded = np.ldexp(np.rint(np.ldexp(m, 24)), e - 24)
            p = (a * b).astype(F32)
            return np.where(np.abs(rounded) < float(FLT_MIN), p * F32(0), fp.flush(p)).astype(F32)
        return _flush((a * b).astype(F32), dev)


def _dot_rows(A, B, dev):
    """C[i, j] = sum over k of A[i, k] * B[k, j], the spec's loop with one
    deviation; B None: the row sums of A."""
    I, K = A.shape
    s = np.full((I, 1 if B is None else B.shape[1]), F32(0.0) if dev == "signed_zero" else F32(-0.0), F32)
    ks = range(K - 1, -1, -1) if dev == "order" else range(K)
    with np.errstate(all="ignore"):
        for k in ks:
            a = A[:, k : k + 1]
            if B is None:
                s = _flush((s + a).astype(F32), dev)
            elif dev == "fma":
                s = fp.fma(np.broadcast_to(a, s.shape), np.broadcast_to(B[k : k + 1, :], s.shape), s)
            else:
                s = _flush((s + _mul(a, B[k : k + 1, :], dev)).astype(F32), dev)
    if K == 0:
        s[...] = F32(0.0)  # the empty sum is +0
    if dev != "nan":
        s = np.where(np.isnan(s), fp.f32(fp.CANONICAL_NAN), s).astype(F32)
    return s


def emulated(dev):
    def matmul(A, B):
        return _dot_rows(_load(A, dev), _load(B, dev), dev)

    def dot(x, y):
        return _dot_rows(_load(x, dev)[None, :], _load(y, dev)[:, None], dev).reshape(1)

    def row_sum(X):
        return _dot_rows(_load(X, dev), None, dev).reshape(-1)

    return kernels.Table(f"emulated[{dev}]", {"matmul": matmul, "dot": dot, "sum": row_sum})


def findings(dev, op):
    _, cases = store.load_cases(store.VECTOR_DIR, {op})
    results = runner.run(emulated(dev), cases)
    summary = report.summarize(f"emulated[{dev}]", store.read_manifest(), results)
    return summary, [f.message for f in summary.findings]


@pytest.mark.parametrize("op", ["matmul", "dot", "sum"])
def test_the_emulation_without_deviation_conforms(op):
    summary, found = findings(None, op)
    assert summary.conformant and not found


@pytest.mark.parametrize("dev,op", [(d, op) for d, (_, ops) in DEVIATIONS.items() for op in ops])
def test_one_deviation_gets_exactly_its_diagnosis(dev, op):
    summary, found = findings(dev, op)
    want = DEVIATIONS[dev][0]
    assert not summary.conformant
    assert len(found) == 1 and want in found[0], found


def test_a_plus_zero_start_is_named_sign_of_zero_in_the_report():
    """The +0-start matmul of issue 14: one finding, and its -0/+0 mismatch
    is called a sign-of-zero difference, not "ulp distance 0"."""
    summary, found = findings("signed_zero", "matmul")
    assert len(found) == 1 and "start the sum from -0, not +0" in found[0]
    text = report.text(summary)
    assert "sign of zero differs (-0 against +0)" in text and "ulp distance 0" not in text
    assert "sign of zero: " in text  # the histogram bucket


def test_x86_ftz_and_arm_fz_are_told_apart():
    """[num.flush.c1] Neither hardware flush is the spec's: ARM FZ (tininess on
    the exact product) fails both windows and is named ARM; x86 MXCSR.FTZ
    (tininess on the product rounded with an unbounded exponent) fails only
    the upper window and is named x86, never ARM."""
    _, found = findings("ftz_before_rounding", "matmul")
    assert len(found) == 1 and "ARM's FZ" in found[0] and "x86" not in found[0]
    _, found = findings("ftz_after_rounding", "matmul")
    assert len(found) == 1 and "x86 FTZ" in found[0] and "ARM" not in found[0]
    assert "IEEE and the spec give 0x80800000, x86 FTZ 0x80000000" in found[0] and "not the spec's flush" in found[0]


def test_the_two_windows_separate_the_measured_products():
    """The brief's measurements: 0x00800001 x 0x3F7FFFFE is 0x00800000 on x86
    FTZ and in the spec, 0 on ARM FZ; 0xAB123191 x 0x14E0241F is 0x80800000
    in the spec, 0x80000000 on x86 FTZ."""
    a, b = fp.f32([0x00800001, 0xAB123191]), fp.f32([0x3F7FFFFE, 0x14E0241F])
    assert fp.bits(fp.mul(a, b)).tolist() == [0x00800000, 0x80800000]
    assert fp.bits(fp.mul_ftz_unbounded(a, b)).tolist() == [0x00800000, 0x80000000]
    assert fp.bits(fp.mul_ftz_before(a, b)).tolist() == [0x00000000, 0x80000000]


VENDOR = {
    "exp": np.exp,
    "log": np.log,
    "tanh": np.tanh,
    "sin": np.sin,
    "cos": np.cos,
    "sigmoid": lambda x: F32(1) / (F32(1) + np.exp(-x)),
}


@pytest.mark.parametrize("op", sorted(VENDOR))
def test_a_vendor_transcendental_alone_gets_only_its_diagnosis(op):
    """NumPy's function with the spec's load, flush and NaN rules around it:
    the only deviation is the algorithm, and the only finding names it."""

    def kernel(x):
        with np.errstate(all="ignore"):
            y = fp.flush(VENDOR[op](_load(x, None)).astype(F32))
        return np.where(np.isnan(y), fp.f32(fp.CANONICAL_NAN), y).astype(F32)

    _, cases = store.load_cases(store.VECTOR_DIR, {op})
    results = runner.run(kernels.Table("vendor", {op: kernel}), cases)
    summary = report.summarize("vendor", store.read_manifest(), results)
    found = [f.message for f in summary.findings]
    assert not summary.conformant and len(found) == 1 and f"uses a vendor {op}" in found[0], found


def test_a_multiply_add_only_in_the_k_mod_8_tail_is_named_contraction():
    """A kernel that sums 8-wide blocks unfused and fuses only its scalar tail
    (K >= 64) fails the tail fma probes and is called contracting, not
    another order: its order probes (exact products) all pass."""
    import functools

    import mutants

    kernel = functools.partial(mutants.k_matmul, fused_tail=8)
    _, cases = store.load_cases(store.VECTOR_DIR, {"matmul"})
    results = runner.run(kernels.Table("fused-tail", {"matmul": kernel}), cases)
    failing = {r.case.family for r in results if r.status == "fail"}
    assert "fma" in failing and "order" not in failing, failing
    tail_fma = [r for r in results if r.case.family == "fma" and r.case.inputs["A"].shape[1] in (67, 71, 133)]
    assert tail_fma and all(r.status == "fail" for r in tail_fma)
    summary = report.summarize("fused-tail", store.read_manifest(), results)
    found = [f.message for f in summary.findings]
    assert any("contracts multiply-add" in f for f in found), found
    assert not any("different order" in f for f in found), found
