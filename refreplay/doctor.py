"""Is this process able to produce conformant bits?  And on what platform?

The reference computes with the hardware's IEEE binary32 operations and
flushes subnormal results itself, after rounding ([num.flush.c1]).  A process
in which hardware flush-to-zero (FTZ: subnormal results become zero) or
denormals-are-zero (DAZ: subnormal inputs read as zero) is switched on gives
different bits, silently: it happens when any library built with
-ffast-math is loaded (its start-up code sets the x86 MXCSR bits 0x8040).
Intel SVML would replace math functions inside compiled code.  This module
detects both, checks the versions of the compiler stack the reference was
validated with and the compiled-code cache, and describes the platform for
audit certificates (``fingerprint``).

``require_ieee`` is the cheap guard that train, replay and conform call on
entry; ``run_checks`` is the full diagnosis behind ``refreplay doctor``.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import __version__, _env
from ._jit import kernel

# Versions the reference is validated with: [low, high).  Keep equal to the
# dependency ranges of pyproject.toml (a test compares them).
SUPPORTED = {
    "numpy": ((1, 26), (2, 5)),
    "numba": ((0, 60), (0, 69)),
    "llvmlite": ((0, 43), (0, 51)),
}

FLT_MIN_BITS = 0x00800000  # smallest normal binary32
HALF_MIN_BITS = 0x00400000  # FLT_MIN / 2, a subnormal


from .errors import UnfitPlatform  # noqa: E402,F401  (re-exported: callers catch doctor.UnfitPlatform)


@dataclass(frozen=True)
class Finding:
    check: str
    ok: bool
    detail: str


# ---- floating-point environment ----------------------------------------------------


def _f32(bits: int) -> np.ndarray:
    return np.array([bits], dtype=np.uint32).view(np.float32)


def _bits(x) -> int:
    return int(np.asarray(x, dtype=np.float32).reshape(-1).view(np.uint32)[0])


@kernel
def _probe_kernel(x, out):
    """[num.flush.c1] The three probes inside compiled code; x = [FLT_MIN,
    FLT_MIN/2, 0.5, 2.0] arrive as data so that nothing is folded at compile
    time.  out (3) is overwritten with: FLT_MIN * 0.5 (a subnormal unless FTZ),
    (FLT_MIN/2) * 2 (FLT_MIN unless DAZ), FLT_MIN/2 + FLT_MIN/2 (likewise)."""
    out[0] = x[0] * x[2]
    out[1] = x[1] * x[3]
    out[2] = x[1] + x[1]


def _numpy_probe() -> tuple[int, int]:
    """(bits of FLT_MIN * 0.5, bits of (FLT_MIN/2) * 2) computed by NumPy's own
    loops in this thread, which obey this thread's FTZ/DAZ mode."""
    tiny = _f32(FLT_MIN_BITS)
    sub = _f32(HALF_MIN_BITS)
    return _bits(tiny * np.float32(0.5)), _bits(sub * np.float32(2.0))


def _judge(where: str, ftz_bits: int, daz_bits: list[int]) -> list[Finding]:
    out = []
    ok = ftz_bits == HALF_MIN_BITS
    out.append(
        Finding(
            f"flush-to-zero off ({where})",
            ok,
            "FLT_MIN * 0.5 gives the subnormal 0x00400000"
            if ok
            else f"FLT_MIN * 0.5 gives 0x{ftz_bits:08X}, not the subnormal 0x00400000: "
            "hardware flush-to-zero is ON (a library built with -ffast-math was "
            "probably loaded into this process)",
        )
    )
    bad = [b for b in daz_bits if b != FLT_MIN_BITS]
    out.append(
        Finding(
            f"denormals-are-zero off ({where})",
            not bad,
            "a subnormal input is read as itself"
            if not bad
            else f"(FLT_MIN/2) * 2 gives 0x{bad[0]:08X}, not 0x00800000: subnormal inputs "
            "are read as zero, denormals-are-zero is ON",
        )
    )
    return out


def check_float_environment() -> list[Finding]:
    """[num.flush.c1] FTZ and DAZ, probed in NumPy and in a compiled kernel."""
    ftz, daz = _numpy_probe()
    findings = _judge("NumPy", ftz, [daz])
    x = np.array([FLT_MIN_BITS, HALF_MIN_BITS, 0x3F000000, 0x40000000], dtype=np.uint32).view(np.float32)
    out = np.empty(3, dtype=np.float32)
    _probe_kernel(x, out)
    bits = out.view(np.uint32)
    return findings + _judge("compiled kernel", int(bits[0]), [int(bits[1]), int(bits[2])])


_checked = threading.local()


def require_ieee() -> None:
    """Raise ``UnfitPlatform`` unless this thread computes with IEEE subnormals.

    The full check (NumPy and compiled code) runs once per thread: FTZ/DAZ are
    per-thread modes.  Later calls in the thread repeat only the NumPy probe
    (about a microsecond), because loading a -ffast-math library later would
    switch the mode on silently.
    """
    if getattr(_checked, "ok", False):
        ftz, daz = _numpy_probe()
        if ftz == HALF_MIN_BITS and daz == FLT_MIN_BITS:
            return
        _checked.ok = False
    bad = [f for f in check_float_environment() if not f.ok]
    if bad:
        raise UnfitPlatform(
            "this process cannot produce conformant bits: "
            + "; ".join(dict.fromkeys(f.detail for f in bad))
            + " (run `refreplay doctor` for a full report)"
        )
    _checked.ok = True


# ---- compiler stack and cache ---------------------------------------------------------


def check_svml() -> Finding:
    """Intel SVML would replace math calls in compiled code with vector routines."""
    from numba.core import config

    using = bool(getattr(config, "USING_SVML", False))
    return Finding(
        "Intel SVML not used by Numba",
        not using,
        "SVML disabled"
        if not using
        else "Numba uses Intel SVML: set NUMBA_DISABLE_INTEL_SVML=1 before numba is imported "
        "(importing refreplay first does this)",
    )


def _version_tuple(text: str) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def check_versions(installed: dict[str, str] | None = None) -> list[Finding]:
    """Each package of ``SUPPORTED`` within its validated range."""
    if installed is None:
        installed = {name: importlib.metadata.version(name) for name in SUPPORTED}
    out = []
    for name, (low, high) in SUPPORTED.items():
        version = installed.get(name, "missing")
        v = _version_tuple(version)
        ok = v is not None and low <= v < high
        allowed = f">={low[0]}.{low[1]},<{high[0]}.{high[1]}"
        out.append(Finding(f"{name} version", ok, f"{name} {version} ({'within' if ok else 'OUTSIDE'} {allowed})"))
    return out


def check_cache_dir(path: Path | None = None) -> Finding:
    """The compiled-code cache is the source-keyed directory and is writable."""
    from numba.core import config

    path = Path(_env.CACHE_DIR if path is None else path)
    if path == _env.CACHE_DIR and Path(config.CACHE_DIR or ".").resolve() != path.resolve():
        return Finding(
            "compiled-code cache",
            False,
            f"Numba caches in {config.CACHE_DIR!r}, not the source-keyed {path}: "
            "numba was imported before refreplay; stale code could be reused",
        )
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".doctor-"):
            pass
    except OSError as exc:
        return Finding("compiled-code cache", False, f"{path} is not writable ({exc.strerror or exc})")
    return Finding("compiled-code cache", True, f"{path} (writable)")


def run_checks() -> list[Finding]:
    """Everything ``refreplay doctor`` checks; fit iff every finding is ok."""
    return check_float_environment() + [check_svml()] + check_versions() + [check_cache_dir()]


# ---- platform fingerprint ----------------------------------------------------------------

# CPU features worth recording: the vector and FMA extensions whose presence
# explains performance, and whose absence proves nothing about bits (the
# reference never relies on them).
_ISA_OF_INTEREST = (
    "sse2",
    "sse4.2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512bf16",
    "avx512fp16",
    "amx-tile",
    "neon",
    "fp-armv8",
    "fullfp16",
    "bf16",
    "sve",
    "sve2",
    "altivec",
    "vsx",
)


def _cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    for key in ("model name", "Hardware", "cpu model", "Processor"):
        m = re.search(rf"^{key}\s*:\s*(.+)$", text, re.M)
        if m:
            return m.group(1).strip()
    return platform.processor() or "unknown"


def fingerprint() -> dict:
    """The platform, as recorded in audit certificates (JSON-serialisable)."""
    import llvmlite
    import llvmlite.binding as llvm
    import numba
    from numba.core import config

    from . import spec

    features = llvm.get_host_cpu_features()
    return {
        "cpu_model": _cpu_model(),
        "cpu_llvm_name": llvm.get_host_cpu_name(),
        "isa": sorted(f for f in _ISA_OF_INTEREST if features.get(f, False)),
        "machine": platform.machine(),
        "os": platform.platform(),
        "cpu_count": os.cpu_count(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "numpy": np.__version__,
        "numba": numba.__version__,
        "llvmlite": llvmlite.__version__,
        "numba_threads": int(config.NUMBA_NUM_THREADS),
        "refreplay": __version__,
        "source_sha256": _env.SOURCE_HASH,
        "spec_version": spec.version(),
        "spec_sha256": spec.spec_sha256(),
    }
