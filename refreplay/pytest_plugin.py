"""pytest plugin (entry point ``pytest11``): the golden vectors as pytest tests.

Inert unless asked for: it only registers its options and a fixture, and
imports nothing heavy until one of them is used.

From the command line, one test per case, named by case id::

    pytest --refreplay-kernel mypkg.kernels --refreplay-op matmul [--refreplay-xfail FILE]

Each test fails with the case's first mismatch (hex, ulp distance or sign of
zero) and the op's diagnosis; an xfail file's entries become xfail; a case
the kernel declines is skipped with its reason.

From a test file, the ``refreplay_conformance`` fixture runs the suite and
fails the test with the report ``refreplay conform`` prints::

    def test_my_matmul(refreplay_conformance):
        refreplay_conformance("mypkg.kernels", ops=["matmul"])
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser):
    g = parser.getgroup("refreplay", "refreplay conformance (golden vectors)")
    g.addoption(
        "--refreplay-kernel",
        action="append",
        default=[],
        metavar="KERNEL",
        help="run the golden vectors against KERNEL (as for `refreplay conform`), one test per case",
    )
    g.addoption(
        "--refreplay-op", action="append", default=[], metavar="OP", help="only this op (repeatable; default: every op)"
    )
    g.addoption("--refreplay-xfail", metavar="FILE", help="expected failures: lines 'PATTERN  REASON'")
    g.addoption("--refreplay-vectors", metavar="DIR", help="vector directory (default: the installed vectors)")
    g.addoption(
        "--refreplay-timeout", type=float, metavar="SECONDS", help="exec: kernels: seconds per case (default 120)"
    )


@pytest.fixture
def refreplay_conformance(request):
    """``check(kernel, ops=None, xfail=None, ...)``: runs the suite and fails
    the test with the CLI's report unless the kernel conforms; returns the
    ``refreplay.conformance.Report``."""
    from .conformance import api

    def check(kernel, ops=None, **kw):
        report = api.check(kernel, ops=ops, **kw)
        if not report.conformant:
            pytest.fail(report.text(), pytrace=False)
        return report

    return check


def pytest_collection_modifyitems(session, config, items):
    kernels_ = config.getoption("refreplay_kernel", default=[])
    if not kernels_:
        return
    for name in kernels_:
        suite = _Suite(config, name)
        items.extend(
            CaseItem.from_parent(
                session, name=f"{name}::{case.id}", nodeid=f"{name}::{case.id}", suite=suite, case=case
            )
            for case in suite.cases
        )


class _Suite:
    """One kernel's cases; each op is run (and diagnosed) the first time one of its cases is asked for."""

    def __init__(self, config, kernel_name):
        from .conformance.running import adapters as kernels
        from .conformance.running import compare as runner
        from .conformance.golden import store
        from .errors import InputError

        try:
            ops = config.getoption("refreplay_op") or None
            directory = config.getoption("refreplay_vectors")
            self.manifest, self.cases = store.load_cases(
                store.VECTOR_DIR if directory is None else directory, set(ops) if ops else None
            )
            missing = sorted(set(ops or ()) - {c.op for c in self.cases})
            if missing:
                raise InputError(f"no vectors for op {', '.join(missing)}")
            xfail = config.getoption("refreplay_xfail")
            self.xfail = runner.read_xfail(xfail) if xfail else []
            self.kernel = kernels.resolve(kernel_name, exec_timeout=config.getoption("refreplay_timeout"))
        except InputError as exc:
            raise pytest.UsageError(f"refreplay: {exc}") from None
        self.name = kernel_name
        self._done: dict[str, tuple[dict, list]] = {}

    def outcome(self, case):
        """(this case's Result, the op's findings)."""
        from .conformance.reporting import report
        from .conformance.running import compare as runner

        if case.op not in self._done:
            cases = [c for c in self.cases if c.op == case.op]
            results = runner.run(self.kernel, cases, self.xfail)
            findings = report.summarize(self.name, self.manifest, results).findings
            self._done[case.op] = ({r.case.id: r for r in results}, findings)
        by_id, findings = self._done[case.op]
        return by_id[case.id], findings


class CaseFailure(Exception):
    """A case failed; the message is the case's report and the op's diagnosis."""


class CaseItem(pytest.Item):
    def __init__(self, *, suite, case, **kw):
        super().__init__(**kw)
        self.suite = suite
        self.case = case

    def runtest(self):
        from .conformance.reporting.report import case_report

        r, findings = self.suite.outcome(self.case)
        text = case_report(r, findings)
        if r.status == "skip":
            pytest.skip(r.message)
        if r.status == "xfail":
            pytest.xfail(r.xfail_reason)
        if r.status == "xpass":
            raise CaseFailure(
                f"unexpected pass: {self.case.id} is listed as an expected failure "
                f"({r.xfail_reason}); remove it from the xfail file"
            )
        if r.status in ("fail", "error"):
            raise CaseFailure(text)

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, CaseFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return "refreplay", None, f"{self.suite.name}::{self.case.id}"
