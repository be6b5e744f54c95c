"""Static PTX audit of the CUDA backend (no GPU needed).

Every kernel of ``cuda_backend`` is compiled by NVVM, and relinked by
nvJitLink with link-time optimisation, for several compute capabilities; the
PTX must hold no fused multiply-add ([num.nofma.c1]), no flush-to-zero
modifier ([num.flush.c1]), no approximate instruction, no rounding mode other
than to nearest ([num.format.c1]) and no float64.  Planted kernels written the
plain way show the audit catches what it claims to.

Needs the ``cuda`` extra (numba-cuda with NVVM and nvJitLink from PyPI).
"""

from __future__ import annotations

import importlib.util
import math
import os

import pytest

if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    pytest.skip("NUMBA_ENABLE_CUDASIM=1: the simulator compiles no PTX", allow_module_level=True)
if importlib.util.find_spec("numba_cuda") is None:
    pytest.skip("numba-cuda is not installed (pip install -e '.[cuda]')", allow_module_level=True)


def _nvvm_problem():
    """Why NVVM/nvJitLink cannot compile here, or None."""
    try:
        from cuda_backend.ptx_audit import compile_kernel

        def probe(out):
            out[0] = out[0]

        compile_kernel(probe, "void(float32[::1])", (7, 5), "lto")
    except Exception as exc:  # any failure to load NVVM or nvJitLink
        return f"NVVM/nvJitLink unavailable: {type(exc).__name__}: {exc}".splitlines()[0]
    return None


_PROBLEM = _nvvm_problem()
if _PROBLEM:
    pytest.skip(_PROBLEM, allow_module_level=True)

from numba import cuda  # noqa: E402

from cuda_backend import ptx_audit  # noqa: E402

SIG3 = "void(float32[::1], float32[::1], float32[::1], float32[::1])"
CCS = ((7, 5), (9, 0))  # the full set of ptx_audit.COMPUTE_CAPABILITIES runs under -m slow


def planted_fma(a, b, c, out):
    """a*b + c written plainly: NVVM contracts it into fma.rn.f32."""
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a[i] * b[i] + c[i]


def planted_float64(a, b, c, out):
    """A Python float constant promotes the product to float64."""
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a[i] * 0.1 + c[i] * b[i]


def planted_divide_sqrt(a, b, c, out):
    """Plain division and square root: correctly rounded unless fastmath."""
    i = cuda.grid(1)
    if i < out.size:
        out[i] = math.sqrt(a[i] / b[i])


def planted_add(a, b, c, out):
    """A plain float add: NVVM emits add.f32 without .rn, which ptxas may fuse."""
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a[i] + b[i]


def _rules(findings):
    return {r.split(" [")[0] for f in findings for r in f.rules}


# ---- the instruction rules, on PTX text --------------------------------------


@pytest.mark.parametrize(
    "instruction, rule",
    [
        ("fma.rn.f32 %f4, %f2, %f1, %f3", "fused multiply-add"),
        ("fma.rn.ftz.f32 %f4, %f2, %f1, %f3", "fused multiply-add"),
        ("mad.rn.f32 %f4, %f2, %f1, %f3", "fused multiply-add"),
        ("add.f32 %f3, %f1, %f2", "float add/sub/mul without .rn: ptxas may fuse it"),
        ("mul.f32 %f3, %f1, %f2", "float add/sub/mul without .rn: ptxas may fuse it"),
        ("add.rn.ftz.f32 %f3, %f1, %f2", "flush-to-zero modifier (.ftz)"),
        ("setp.lt.ftz.f32 %p1, %f1, %f2", "flush-to-zero modifier (.ftz)"),
        ("rcp.approx.ftz.f64 %fd1, %fd2", "approximate instruction"),
        ("sqrt.approx.f32 %f2, %f1", "approximate instruction"),
        ("ex2.approx.f32 %f2, %f1", "approximate instruction"),
        ("div.full.f32 %f3, %f1, %f2", "approximate instruction"),
        ("add.rz.f32 %f3, %f1, %f2", "rounding mode other than round-to-nearest-even"),
        ("cvt.rzi.s32.f32 %r1, %f1", "rounding mode other than round-to-nearest-even"),
        ("cvt.rmi.f32.f32 %f2, %f1", "rounding mode other than round-to-nearest-even"),
        ("add.rn.f64 %fd3, %fd1, %fd2", "float64 arithmetic (a Python float constant?)"),
        ("cvt.f64.f32 %fd1, %f1", "float64 arithmetic (a Python float constant?)"),
    ],
)
def test_rule_rejects(instruction, rule):
    """Each rule of the audit names the instruction it rejects."""
    assert rule in [r.split(" [")[0] for r in ptx_audit.check_instruction(instruction)]


@pytest.mark.parametrize(
    "instruction",
    [
        "add.rn.f32 %f3, %f1, %f2",
        "sub.rn.f32 %f3, %f1, %f2",
        "mul.rn.f32 %f3, %f1, %f2",
        "rcp.rn.f32 %f2, %f1",
        "sqrt.rn.f32 %f2, %f1",
        "div.rn.f32 %f3, %f1, %f2",
        "cvt.rni.s32.f32 %r1, %f1",
        "cvt.rn.f32.s32 %f1, %r1",
        "abs.f32 %f2, %f1",
        "neg.f32 %f2, %f1",
        "setp.nan.f32 %p1, %f1, %f1",
        "selp.f32 %f1, 0f7FC00000, %f2, %p1",
        "mad.lo.s32 %r1, %r2, %r3, %r4",
        "add.s64 %rd1, %rd2, %rd3",
        "mul.wide.s32 %rd1, %r1, %r2",
    ],
)
def test_rule_accepts(instruction):
    """Exact or correctly rounded instructions pass."""
    assert ptx_audit.check_instruction(instruction) == ()


def test_instructions_skip_directives_and_comments():
    ptx = "\n".join(
        [
            ".visible .entry k(",
            ".param .u64 p",
            ")",
            "{",
            "// fma.rn.f32 in a comment",
            "$L__BB0_1:",
            "@%p1 bra $L__BB0_2;",
            "fma.rn.f32 %f1, %f2, %f3, %f4; // x",
            "}",
        ]
    )
    assert [t for _, t in ptx_audit.instructions(ptx)] == ["bra $L__BB0_2", "fma.rn.f32 %f1, %f2, %f3, %f4"]
    assert [f.line for f in ptx_audit.audit_ptx(ptx)] == [8]


# ---- planted kernels: the audit catches the plain way of writing arithmetic ---


@pytest.mark.parametrize("path", ptx_audit.PATHS)
@pytest.mark.parametrize("cc", CCS)
def test_planted_fma_is_flagged(cc, path):
    """[num.nofma.c1] Plain a*b + c compiles to fma.rn.f32 on both paths; the audit says so."""
    ptx = ptx_audit.compile_kernel(planted_fma, SIG3, cc, path)
    found = ptx_audit.audit_ptx(ptx)
    assert "fused multiply-add" in _rules(found)
    assert any(f.instruction.startswith("fma.rn.f32") for f in found)


def test_planted_float64_is_flagged():
    ptx = ptx_audit.compile_kernel(planted_float64, SIG3, (8, 0), "ptx")
    assert "float64 arithmetic (a Python float constant?)" in _rules(ptx_audit.audit_ptx(ptx))


def test_plain_add_is_flagged():
    """[num.nofma.c1] Without an explicit .rn, ptxas is free to contract the add."""
    ptx = ptx_audit.compile_kernel(planted_add, SIG3, (8, 0), "ptx")
    assert "float add/sub/mul without .rn: ptxas may fuse it" in _rules(ptx_audit.audit_ptx(ptx))


def test_fastmath_is_flagged():
    """fastmath turns on .ftz and approximate division and square root; without
    it the same code (division and sqrt correctly rounded) is clean."""
    fast, _ = cuda.compile_ptx(planted_divide_sqrt, SIG3, cc=(8, 0), fastmath=True)
    rules = _rules(ptx_audit.audit_ptx(fast))
    assert "flush-to-zero modifier (.ftz)" in rules
    assert "approximate instruction" in rules
    exact = ptx_audit.compile_kernel(planted_divide_sqrt, SIG3, (8, 0), "ptx")
    assert ptx_audit.audit_ptx(exact) == []


@pytest.mark.parametrize("path", ptx_audit.PATHS)
def test_shim_multiply_add_survives_lto(path):
    """[num.nofma.c1] The shim's mul then add stay two rounded instructions after LTO."""
    k = next(k for k in ptx_audit.kernels() if k.name.endswith(".mul_add_k"))
    ptx = ptx_audit.compile_kernel(k.pyfunc, k.signatures[0], (9, 0), path)
    ops = [t.split(None, 1)[0] for _, t in ptx_audit.instructions(ptx)]
    assert ops.count("mul.rn.f32") >= 1 and "add.rn.f32" in ops
    assert ptx_audit.audit_ptx(ptx) == []


# ---- the whole package -------------------------------------------------------


def _audit_all(ccs):
    reports = list(ptx_audit.audit(ccs=ccs))
    assert reports, "no kernels registered"
    bad = [r for r in reports if r.findings or r.instructions == 0]
    assert not bad, "\n".join(f"{r.kernel} {r.signature} sm{r.cc} {r.path}: {r.findings[:3]}" for r in bad)
    names = {r.kernel for r in reports}
    assert len(names) == len(ptx_audit.kernels())


def test_every_kernel_is_clean():
    """[num.nofma.c1] [num.flush.c1] Every registered kernel, both paths, for sm_90
    (all five capabilities: -m slow, or python -m cuda_backend.ptx_audit)."""
    _audit_all(((9, 0),))


@pytest.mark.slow
def test_every_kernel_is_clean_all_capabilities():
    _audit_all(ptx_audit.COMPUTE_CAPABILITIES)
