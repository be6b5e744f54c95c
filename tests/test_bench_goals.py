"""The benchmarks' yardsticks and goals: peak.py's kernels are what they
claim (the unfused chains never fuse, the FMA reference does where the CPU
has FMA), and bench_scale.py's step goal follows issue 32's rule from the
FMA/unfused peak ratio."""

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    kept = list(sys.path)  # the scripts put benchmarks/ and the checkout first: undone after
    sys.path.insert(0, str(BENCH))
    try:
        yield importlib.import_module("peak"), importlib.import_module("bench_scale")
    finally:
        sys.path[:] = kept


@pytest.mark.parametrize(
    "ratio, goal",
    [
        (None, None),
        (1.0, 1.0),
        (0.95, 1.0),
        (1.05, 1.0),
        (1.06, 1.15 * 1.06),
        (1.16, 1.15 * 1.16),
        (2.0, 2.3),
        (0.5, 1.15 * 0.5),
    ],
)
def test_step_goal_follows_the_peak_ratio(bench, ratio, goal):
    """<= 1.0x PyTorch where the FMA and unfused peaks are equal (within 5 %),
    else within 1.15x of PyTorch's time scaled by the ratio."""
    got, why = bench[1].step_goal(ratio)
    assert (got is None) == (goal is None), why
    if goal is not None:
        assert got == pytest.approx(goal)
        assert f"{ratio:.2f}" in why


def _cpu_has_fma() -> bool:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = next((line for line in text.splitlines() if line.startswith(("flags", "Features"))), "")
    return " fma" in flags or " asimd" in flags  # x86 FMA3, or AArch64 (fused multiply-add in every core)


def test_yardstick_kernels_check_themselves(bench):
    """The unfused chains equal NumPy's multiply-then-add and hold no FMA
    instruction; the FMA reference kernel gives other bits and, on a CPU
    with FMA, is compiled to FMA instructions."""
    peak = bench[0]
    c = peak.check()
    assert c["ok"] and c["bits_equal_numpy_mul_then_add"] and not c["fma_instructions"]
    assert c["lanes_where_fused_differs"] > 0
    if _cpu_has_fma():
        assert c["fma_kernel_fuses"]
    assert peak._fma_instructions("vfmadd231ps %zmm1, %zmm2, %zmm3") == ["vfmadd231ps"]
    assert peak._fma_instructions("vmulps %zmm1, %zmm2, %zmm3\nvaddps %zmm3, %zmm0, %zmm0") == []
    x, b, start = peak.inputs(3)
    fused_one, _ = peak.kernels(fused=True)
    plain_one, _ = peak.kernels()
    f, p = start.copy(), start.copy()
    fused_one(x, b, 1, f)
    plain_one(x, b, 1, p)
    assert not np.array_equal(f.view(np.uint32), p.view(np.uint32))
