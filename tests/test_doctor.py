"""`refreplay doctor`: detection of hardware FTZ/DAZ ([num.flush.c1]), SVML,
versions and cache, and the platform fingerprint."""

import json
import platform
import shutil
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from refreplay import doctor, spec

REPO = Path(__file__).resolve().parent.parent
X86 = platform.machine().lower() in ("x86_64", "amd64", "i686", "i386")
CSR_SOURCE = """
#include <xmmintrin.h>
void set_csr_bits(unsigned int bits) { _mm_setcsr(_mm_getcsr() | bits); }
"""


def run_py(code: str):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=REPO)


@pytest.fixture(scope="module")
def csr_lib(tmp_path_factory):
    """A tiny shared library that sets MXCSR bits, as -ffast-math start-up code does."""
    if not X86:
        pytest.skip(f"MXCSR is x86 only; this machine is {platform.machine()}")
    if shutil.which("gcc") is None:
        pytest.skip("gcc not found: cannot build the MXCSR-setting library")
    d = tmp_path_factory.mktemp("csr")
    (d / "csr.c").write_text(CSR_SOURCE)
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(d / "libcsr.so"), str(d / "csr.c")], check=True)
    return d / "libcsr.so"


def test_doctor_is_fit_here():
    """[num.flush.c1] on an ordinary process every check passes: exit 0."""
    out = subprocess.run([sys.executable, "-m", "refreplay", "doctor", "--json"], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert report["fit"] is True
    assert all(c["ok"] for c in report["checks"])
    assert report["fingerprint"]["spec_sha256"] == spec.spec_sha256()
    # which --device values can run here: the CPU always; cuda says why or why not
    assert report["devices"]["cpu"].startswith("ready") and report["devices"]["cuda"]


@pytest.mark.parametrize(
    "bits,failing",
    [
        (0x8040, {"flush-to-zero", "denormals-are-zero"}),
        (0x8000, {"flush-to-zero"}),
        (0x0040, {"denormals-are-zero"}),
    ],
)
def test_doctor_fails_when_ftz_or_daz_is_on(csr_lib, bits, failing):
    """[num.flush.c1] MXCSR FTZ (0x8000) and DAZ (0x0040) each detected, in NumPy
    and in compiled code, by `refreplay doctor` (exit 1) and by require_ieee."""
    out = run_py(f"""
        import ctypes, sys
        ctypes.CDLL({str(csr_lib)!r}).set_csr_bits(ctypes.c_uint({bits}))
        from refreplay.cli import main
        rc = main(["doctor", "--json"])
        from refreplay import doctor
        try:
            doctor.require_ieee()
        except doctor.UnfitPlatform as exc:
            print("UNFIT", exc, file=sys.stderr)
        sys.exit(rc)
    """)
    assert out.returncode == 1, out.stdout + out.stderr
    report = json.loads(out.stdout)
    assert report["fit"] is False
    failed = {c["check"] for c in report["checks"] if not c["ok"]}
    want = {f"{name} off ({where})" for name in failing for where in ("NumPy", "compiled kernel")}
    assert failed == want
    assert "UNFIT this process cannot produce conformant bits" in out.stderr
    assert ("flush-to-zero is ON" in out.stderr) == ("flush-to-zero" in failing)
    assert ("denormals-are-zero is ON" in out.stderr) == ("denormals-are-zero" in failing)


def test_require_ieee_notices_a_mode_switched_on_after_it_passed(csr_lib):
    """[num.flush.c1] the per-thread cache does not hide a later FTZ switch."""
    out = run_py(f"""
        import ctypes
        from refreplay import doctor
        doctor.require_ieee()
        doctor.require_ieee()
        ctypes.CDLL({str(csr_lib)!r}).set_csr_bits(ctypes.c_uint(0x8000))
        try:
            doctor.require_ieee()
        except doctor.UnfitPlatform as exc:
            print("caught:", exc)
    """)
    assert out.returncode == 0, out.stderr
    assert "caught: this process cannot produce conformant bits" in out.stdout
    assert "flush-to-zero is ON" in out.stdout


def test_require_ieee_passes_here():
    """[num.flush.c1]"""
    doctor.require_ieee()
    doctor.require_ieee()


def test_supported_versions_match_pyproject():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    for name, (low, high) in doctor.SUPPORTED.items():
        spec_line = next(d for d in deps if d.split(">")[0].split("<")[0].strip() == name)
        assert f">={low[0]}.{low[1]}" in spec_line and f"<{high[0]}.{high[1]}" in spec_line, spec_line


def test_versions_outside_the_range_are_unfit():
    good = {"numpy": "2.4.6", "numba": "0.68.1", "llvmlite": "0.50.0"}
    assert all(f.ok for f in doctor.check_versions(good))
    bad = doctor.check_versions({"numpy": "2.4.6", "numba": "0.69.0rc1", "llvmlite": "0.42.0"})
    assert [f.ok for f in bad] == [True, False, False]
    assert "numba 0.69.0rc1 (OUTSIDE >=0.60,<0.69)" in bad[1].detail
    assert not doctor.check_versions({"numpy": "garbage", "numba": "0.68", "llvmlite": "0.50"})[0].ok


def test_unwritable_cache_is_unfit(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    f = doctor.check_cache_dir(blocker / "cache")
    assert not f.ok and "not writable" in f.detail
    assert doctor.check_cache_dir(tmp_path / "cache").ok
    assert doctor.check_cache_dir().ok


def test_svml_in_use_is_unfit(monkeypatch):
    from numba.core import config

    assert doctor.check_svml().ok
    monkeypatch.setattr(config, "USING_SVML", True, raising=False)
    f = doctor.check_svml()
    assert not f.ok and "NUMBA_DISABLE_INTEL_SVML=1" in f.detail


def test_fingerprint_is_json_and_complete():
    fp = doctor.fingerprint()
    assert json.loads(json.dumps(fp)) == fp
    for key in (
        "cpu_model",
        "isa",
        "os",
        "python",
        "numpy",
        "numba",
        "llvmlite",
        "refreplay",
        "spec_version",
        "spec_sha256",
    ):
        assert fp[key] not in (None, ""), key
    assert fp["spec_sha256"] == spec.spec_sha256() and fp["spec_version"] == spec.version()
