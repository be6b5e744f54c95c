"""Run cases against a kernel and compare every output bit for bit
([conv.conformance.c1], [conf.runner.c1]): a case passes only if every bit of every output
equals the vector.  Ulp distances are computed only to describe a failure.
"""

from __future__ import annotations

import fnmatch
import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...errors import InputError
from ...numerics.bf16 import as_bits
from ..base import deviant as fp
from ..base.bf16 import widen
from ..base.case import Case, Tiled, dtype_name
from .kernel import Kernel, KernelError, Unsupported

# Ulp-distance histogram buckets (upper bounds, inclusive).
BUCKETS = (0, 1, 2, 4, 16, 256, 65536, 1 << 32)
SIGN_OF_ZERO = "sign of zero"  # the bucket of distance 0: -0 against +0


@dataclass
class Mismatch:
    output: str
    count: int
    total: int
    first_index: tuple
    expected: str
    actual: str
    ulp: int | None  # None: NaN involved
    histogram: dict[str, int] = field(default_factory=dict)
    shape_mismatch: bool = False  # expected/actual then hold dtype[shape]


@dataclass
class Result:
    case: Case
    status: str  # pass, fail, error, skip, xfail, xpass
    message: str = ""
    mismatches: list[Mismatch] = field(default_factory=list)
    actual: dict[str, np.ndarray] = field(default_factory=dict)
    xfail_reason: str = ""

    @property
    def failed(self) -> bool:
        return self.status in ("fail", "error")


def _hex(a: np.ndarray, bf16: bool = False) -> str:
    width = a.dtype.itemsize * 2
    if a.dtype == np.float32:
        return f"0x{int(a.view(np.uint32)):08X}"
    if bf16:
        return f"bf16(0x{int(a):04X})"
    return f"{int(a)} (0x{int(a.astype(np.int64)) & ((1 << (4 * width)) - 1):0{width}X})"


def histogram(d: np.ndarray) -> dict[str, int]:
    """Counts of mismatching elements by ulp distance; 'nan' where a NaN is
    involved (ulp distance undefined); 'sign of zero' where the values are
    equal but the bits are not (-0 against +0)."""
    out = {}
    nan = d < 0
    if nan.any():
        out["nan"] = int(nan.sum())
    d = d[~nan]
    if (d == 0).any():
        out[SIGN_OF_ZERO] = int((d == 0).sum())
    lo = 1
    for hi in BUCKETS[1:]:
        n = int(((d >= lo) & (d <= hi)).sum())
        if n:
            out[str(hi) if lo == hi else f"{lo}-{hi}"] = n
        lo = hi + 1
    return out


def compare(expected: np.ndarray, actual: np.ndarray, name: str, bf16: bool = False) -> Mismatch | None:
    """``bf16``: the tensors hold bf16 bits ([bf16.format.c1]); an ml_dtypes
    bfloat16 ``actual`` is read as its bits, and ulp distances count bf16
    positions."""
    if bf16:
        actual = as_bits(actual)
    if actual.dtype != expected.dtype or actual.shape != expected.shape:
        return Mismatch(
            name,
            expected.size,
            expected.size,
            (),
            f"{'bf16' if bf16 else dtype_name(expected)}{list(expected.shape)}",
            f"{actual.dtype}{list(actual.shape)}",
            None,
            shape_mismatch=True,
        )
    e = expected.reshape(-1)
    a = actual.reshape(-1)
    uint = np.dtype(f"u{e.dtype.itemsize}")
    diff = e.view(uint) != a.view(uint)
    if not diff.any():
        return None
    first = int(np.argmax(diff))
    idx = tuple(int(i) for i in np.unravel_index(first, expected.shape))
    if e.dtype == np.float32 or bf16:
        # [bf16.widen.c1] a bf16 is the binary32 of its bits << 16: one bf16 position is 2^16 binary32 ones
        ew, aw = (widen(e[diff]), widen(a[diff])) if bf16 else (e[diff], a[diff])
        d = fp.ulp_distance(ew, aw)
        d = np.where(d > 0, d >> 16, d) if bf16 else d
        ulp = int(d[0])
        hist = histogram(d)
    else:
        d = np.abs(e[diff].astype(np.int64) - a[diff].astype(np.int64))
        ulp = int(abs(int(e[first]) - int(a[first])))
        hist = histogram(d)
    return Mismatch(
        name, int(diff.sum()), e.size, idx, _hex(e[first], bf16), _hex(a[first], bf16), None if ulp < 0 else ulp, hist
    )


def run_case(kernel: Kernel, case: Case) -> Result:
    out_specs = {n: (case.dtype(f"out/{n}"), case.shape(f"out/{n}")) for n in case.outputs}
    try:
        actual = kernel.run(case.op, list(case.inputs.values()), out_specs, case.id)
    except Unsupported as exc:
        return Result(case, "skip", str(exc))
    except KernelError as exc:
        return Result(case, "error", str(exc))
    mism = [m for n in case.outputs if (m := _output_mismatch(case, n, np.asarray(actual[n])))]
    if not mism and (case.tiles or case.causal or case.hashed):  # [conf.vectors.c2-c4] the same bits: as stored
        actual = case.outputs
    return Result(case, "fail" if mism else "pass", mismatches=mism, actual=actual)


def _output_mismatch(case: Case, n: str, got: np.ndarray) -> Mismatch | None:
    """``compare`` of output ``n``; a hashed output ([conf.vectors.c4]) matches by its sha256
    alone, and only a mismatch recomputes the expected elements to locate it: if that fails,
    the mismatch stands, shown by the two hashes."""
    bf16 = f"out/{n}" in case.bf16
    if f"out/{n}" not in case.hashed or not isinstance(case.outputs, Tiled):  # (a generated case: whole)
        return compare(case.outputs[n], got, n, bf16)
    want = case.outputs.sha256(n)
    a = as_bits(got) if bf16 else got
    dtype = np.dtype(np.uint16) if bf16 else np.dtype(case.outputs.dtype(n))
    le = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))
    have = hashlib.sha256(le.tobytes()).hexdigest()
    if a.dtype == dtype and a.shape == case.shape(f"out/{n}") and have == want:
        return None
    try:
        expected = case.outputs[n]
    except InputError as exc:
        size = int(np.prod(case.shape(f"out/{n}")))
        return Mismatch(
            n, size, size, (), f"sha256 {want[:16]}... ({exc})", f"{a.dtype}{list(a.shape)}, sha256 {have[:16]}...",
            None, shape_mismatch=True,
        )  # fmt: skip
    return compare(expected, got, n, bf16)


def read_xfail(path: str) -> list[tuple[str, str]]:
    """xfail file: one entry per line, ``PATTERN  REASON``; PATTERN is a case
    id, an op name or a shell-style glob over case ids; REASON is required.
    Blank lines and lines starting with # are ignored."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise InputError(f"cannot read xfail file {path}: {exc}") from None
    entries = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 1)
        if len(parts) < 2 or not parts[1].strip():
            raise InputError(
                f"{path}:{n}: xfail entry {parts[0]!r} has no reason "
                f"(write: PATTERN  why this case is expected to fail)"
            )
        entries.append((parts[0], parts[1].strip()))
    return entries


def _xfail_reason(case: Case, entries) -> str:
    for pattern, reason in entries:
        if case.op == pattern or fnmatch.fnmatchcase(case.id, pattern):
            return reason
    return ""


def run(kernel: Kernel, cases: list[Case], xfail=(), progress=None) -> list[Result]:
    results = []
    for case in cases:
        r = run_case(kernel, case)
        reason = _xfail_reason(case, xfail)
        if reason:
            r.xfail_reason = reason
            if r.status in ("fail", "error"):
                r.status = "xfail"
            elif r.status == "pass":
                r.status = "xpass"
        results.append(r)
        if progress:
            progress(r)
    return results
