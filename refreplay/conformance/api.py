"""The Python API of the conformance suite: run the golden vectors against a
kernel from a kernel project's own code or tests ([conf.runner.c1]).

    import refreplay.conformance as rc

    report = rc.check("mypkg.kernels", ops=["matmul"])
    report.counts            # {"pass": 34, "fail": 0, ...}
    report.assert_conformant()   # raises NotConformant with the CLI's report

``check`` does what ``refreplay conform`` does and ``Report`` holds what its
``--json`` writes: counts per op, every case's status and mismatches, and
the diagnosis.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path
from types import ModuleType
from typing import Any

from ..errors import InputError
from .running import adapters as kernels
from .running import kernel as kernel_api
from .reporting import report
from .running import compare as runner
from .golden import store

KernelLike = str | ModuleType | Callable[..., Any] | kernel_api.Kernel


class NotConformant(AssertionError):
    """A kernel failed the suite; the message is the report ``refreplay conform`` prints."""


@dataclass
class Report:
    """The outcome of ``check``: the same content as ``refreplay conform --json``."""

    summary: report.Summary
    declined: list[str] = field(default_factory=list)  # ops the kernel implements not at all

    @property
    def kernel(self) -> str:
        return self.summary.kernel

    @property
    def conformant(self) -> bool:
        return self.summary.conformant

    @property
    def verdict(self) -> str:
        """ "CONFORMANT", "INCOMPLETE" (a live shape not run, [conf.domain.c2]) or "NOT CONFORMANT"."""
        return self.summary.verdict

    @property
    def domain(self) -> dict:
        """[conf.domain.c1] Per op, the shape letters and sizes the verdict covers:
        ``{"cases", "axes": {letter: [sizes]}, "max_elements"}``."""
        return self.summary.domain()

    @property
    def counts(self) -> dict[str, int]:
        """Cases per status: pass, fail, error, skip, xfail, xpass."""
        return self.summary.counts()

    @property
    def ops(self) -> dict[str, dict[str, int]]:
        return {op: self.summary.counts(op) for op in self.summary.ops}

    @property
    def diagnosis(self) -> list[dict]:
        """Findings: ``{"op", "message", "clauses"}``, why the kernel fails."""
        return self.to_json()["diagnosis"]

    @property
    def cases(self) -> list[dict]:
        """Every case: id, op, family, clauses, status, message, mismatches."""
        return self.to_json()["cases"]

    @property
    def results(self) -> list[runner.Result]:
        return self.summary.results

    def to_json(self) -> dict:
        return report.to_json(self.summary)

    def text(self, verbose: bool = False) -> str:
        """The report ``refreplay conform`` prints."""
        head = f"(kernel {self.kernel} does not implement: {', '.join(self.declined)})\n" if self.declined else ""
        return head + report.text(self.summary, verbose)

    def assert_conformant(self) -> None:
        """Raise ``NotConformant`` (an AssertionError) whose text is the CLI's report."""
        if not self.conformant:
            raise NotConformant(self.text())


def _kernel(kernel: KernelLike, exec_timeout: float | None) -> kernel_api.Kernel:
    if isinstance(kernel, kernel_api.Kernel):
        return kernel
    if isinstance(kernel, str):
        return kernels.resolve(kernel, exec_timeout=exec_timeout)
    if isinstance(kernel, ModuleType):
        return kernels.PythonCallable(kernel.__name__, kernel, per_op=True)
    if callable(kernel):
        name = getattr(kernel, "__name__", type(kernel).__name__)
        from .table import OPS

        if name in OPS:  # named after an op: implements that op alone
            return kernels.PythonCallable(name, kernel, per_op=True, only=name)
        return kernels.PythonCallable(name, kernel, per_op=False)
    raise InputError(f"kernel must be a name, a module, a callable or a Kernel, not {type(kernel).__name__}")


def check(
    kernel: KernelLike,
    ops: Iterable[str] | None = None,
    vectors: str | PathLike | None = None,
    xfail: str | PathLike | Sequence[tuple[str, str]] | None = None,
    exec_timeout: float | None = None,
) -> Report:
    """Run the golden vectors against ``kernel`` and compare every output bit
    for bit ([conv.conformance.c1]).

    kernel: what ``refreplay conform`` accepts as a string (``"reference"``,
        ``"numpy"``, ``"mypkg.kernels"``, ``"mypkg.kernels:matmul"``,
        ``"exec:./prog"``), a module with one function per op, a function
        named after an op, a dispatcher ``fn(op, *inputs)``, or a ``Kernel``.
    ops: only these ops; default every op, where ops the kernel does not
        implement at all are listed in ``Report.declined`` instead.
    vectors: a vector directory (default: the installed golden vectors).
    xfail: an xfail file (``PATTERN  REASON`` lines) or (pattern, reason) pairs.
    exec_timeout: seconds per case for an ``exec:`` kernel (default 120).

    Raises ``refreplay.errors.InputError`` on bad input (unknown op, vectors of
    another spec version, a kernel that cannot be found).
    """
    from .. import spec

    directory = Path(vectors) if vectors is not None else store.VECTOR_DIR
    manifest = store.read_manifest(directory)
    if manifest["spec_version"] != spec.version():
        raise InputError(
            f"the vectors in {directory} are for spec {manifest['spec_version']}, this is spec {spec.version()}"
        )
    known = list(dict.fromkeys(c["op"] for c in manifest["cases"]))
    ops = [ops] if isinstance(ops, str) else list(ops) if ops is not None else None
    if ops is not None:
        unknown = [o for o in ops if o not in known]
        if unknown or not ops:
            raise InputError(f"no vectors for op {', '.join(unknown) or '(none given)'} (ops: {', '.join(known)})")
    if xfail is None:
        entries = []
    elif isinstance(xfail, (str, PathLike)):
        entries = runner.read_xfail(str(xfail))
    else:
        entries = [(str(p), str(r)) for p, r in xfail]
    k = _kernel(kernel, exec_timeout)
    manifest, cases = store.load_cases(directory, set(ops) if ops else None)
    results = runner.run(k, cases, entries)
    declined: list[str] = []
    if ops is None:
        by_op: dict[str, list] = {}
        for r in results:
            by_op.setdefault(r.case.op, []).append(r)
        declined = [op for op, rs in by_op.items() if all(r.status == "skip" for r in rs)]
        results = [r for r in results if r.case.op not in declined]
    name = kernel if isinstance(kernel, str) else k.name
    return Report(report.summarize(name, manifest, results), declined)
