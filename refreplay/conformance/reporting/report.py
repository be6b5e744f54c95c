"""The conformance report: a per-op table, every failing case with its first
mismatch in hex, ulp distance and histogram, the diagnosis, and the verdict.
Also JSON (for tools) and JUnit XML (for CI systems)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

from ..diagnosis.diagnose import Finding, diagnose


@dataclass
class Summary:
    kernel: str
    spec_version: str
    generator_version: str
    results: list
    findings: list[Finding]
    # [conf.domain.c2] shapes a live run was asked for and did not run (above the element bound)
    not_run: list[str] = field(default_factory=list)

    @property
    def ops(self) -> list[str]:
        return list(dict.fromkeys(r.case.op for r in self.results))

    def counts(self, op=None) -> dict[str, int]:
        c = {"pass": 0, "fail": 0, "error": 0, "skip": 0, "xfail": 0, "xpass": 0}
        for r in self.results:
            if op is None or r.case.op == op:
                c[r.status] += 1
        return c

    @property
    def conformant(self) -> bool:
        """Every selected case ran and matched (or is an expected failure);
        at least one case ran."""
        return self._clean() and not self.not_run

    def _clean(self) -> bool:
        c = self.counts()
        return c["fail"] == 0 and c["error"] == 0 and c["skip"] == 0 and c["pass"] + c["xpass"] + c["xfail"] > 0

    @property
    def incomplete(self) -> bool:
        """[conf.domain.c2] Every case that ran matched, but shapes asked for were not run."""
        return self._clean() and bool(self.not_run)

    @property
    def verdict(self) -> str:
        return "CONFORMANT" if self.conformant else "INCOMPLETE" if self.incomplete else "NOT CONFORMANT"

    def domain(self) -> dict:
        """[conf.domain.c1] Per op, the shape letters and sizes its cases covered."""
        from ..shapes.domain import domain

        return domain([r.case for r in self.results])


def summarize(kernel, manifest, results) -> Summary:
    findings = []
    ops = list(dict.fromkeys(r.case.op for r in results))
    for op in ops:
        rs = [r for r in results if r.case.op == op]
        if any(r.status in ("fail", "error", "xfail") for r in rs):
            findings.extend(_diagnosed(op, rs))
    return Summary(kernel, manifest["spec_version"], manifest["generator_version"], results, findings)


def _diagnosed(op, rs) -> list[Finding]:
    """[conf.diagnosis.r1] The op's findings, or one that says the diagnosis
    could not be completed and why.  A mismatch always wins: the verdict
    rests on the results alone, so a fault in the diagnosis (running out of
    memory included) never turns a failing kernel into a traceback or an
    internal error; the failing cases are still listed with their
    mismatches."""
    try:
        return diagnose(op, rs)
    except MemoryError as e:  # numpy's _ArrayMemoryError says how much it wanted
        why = f"it ran out of memory ({e})" if str(e) else "it ran out of memory"
    except Exception as e:  # noqa: BLE001  a fault in a diagnostic aid never hides the mismatch
        why = f"it failed: {type(e).__name__}: {e}"
    n = sum(r.status in ("fail", "error", "xfail") for r in rs)
    return [
        Finding(
            op,
            f"diagnosis could not be completed: {why}; the {n} failing case{'s' if n != 1 else ''} "
            f"{'are' if n != 1 else 'is'} listed above with {'their' if n != 1 else 'its'} mismatches",
            ["conf.diagnosis.r1"],
        )
    ]


def _case_lines(r) -> list[str]:
    head = f"{r.status.upper():5s} {r.case.id}  " + " ".join(f"[{c}]" for c in r.case.clauses)
    lines = [head, f"      probes: {r.case.probes}"]
    if r.xfail_reason:
        lines.append(f"      xfail: {r.xfail_reason}")
    if r.message:
        lines.append(f"      {r.message}")
    for m in r.mismatches:
        if m.shape_mismatch:
            lines.append(f"      output {m.output}: expected {m.expected}, got {m.actual}")
            continue
        how = (
            "ulp distance n/a (NaN)"
            if m.ulp is None
            else "sign of zero differs (-0 against +0)"
            if m.ulp == 0 and m.expected.startswith("0x")
            else f"ulp distance {m.ulp}"
        )
        hist = ", ".join(f"{k}: {v}" for k, v in m.histogram.items())
        lines.append(
            f"      output {m.output}: {m.count} of {m.total} elements differ; first at "
            f"{list(m.first_index)}: expected {m.expected}, actual {m.actual}, {how}"
        )
        lines.append(f"      ulp histogram: {hist}")
    return lines


def case_report(r, findings) -> str:
    """One case as the text report shows it, followed by its op's diagnosis."""
    lines = _case_lines(r)
    mine = [f for f in findings if f.op == r.case.op]
    if mine:
        lines += ["Diagnosis:"] + [f"  {f.text()}" for f in mine]
    return "\n".join(lines)


def text(s: Summary, verbose=False) -> str:
    out = [
        f"refreplay conform {s.kernel} — spec {s.spec_version}, vectors generator {s.generator_version}, "
        f"{len(s.results)} cases",
        "",
    ]
    w = max([14] + [len(op) for op in s.ops])
    out.append(f"{'op':{w}s} {'pass':>5s} {'fail':>5s} {'error':>5s} {'xfail':>5s} {'xpass':>5s} {'skip':>5s}")
    for op in s.ops:
        c = s.counts(op)
        counts = " ".join(f"{c[k]:5d}" for k in ("pass", "fail", "error", "xfail", "xpass", "skip"))
        out.append(f"{op:{w}s} {counts}")
    shown = [r for r in s.results if r.status in ("fail", "error", "xpass") or (verbose and r.status != "pass")]
    if shown:
        out += ["", "Cases not passing:" if not verbose else "Cases:"]
        for r in shown:
            out += _case_lines(r)
    skipped = {}
    for r in s.results:
        if r.status == "skip" and not verbose:  # verbose lists them case by case
            skipped.setdefault(r.message, []).append(r.case.id)
    if skipped:
        out += ["", "Skipped (counted against conformance):"]
        for why, ids in skipped.items():
            out.append(f"  {len(ids)} cases: {why}" if len(ids) > 1 else f"  {ids[0]}: {why}")
    xp = [r for r in s.results if r.status == "xpass"]
    if xp:
        out += [
            "",
            f"Unexpected passes ({len(xp)}): "
            + ", ".join(r.case.id for r in xp)
            + " — remove them from the xfail file",
        ]
    if s.findings:
        out += ["", "Diagnosis:"] + [f"  {f.text()}" for f in s.findings]
    c = s.counts()
    out += ["", "Domain (the shapes these cases covered; the verdict holds for them only, [conf.domain.c1]):"]
    from ..shapes.domain import domain_line

    out += [f"  {domain_line(op, d)}" for op, d in s.domain().items()]
    if s.not_run:
        out += ["", f"Not run ({len(s.not_run)} shapes, so not covered by this verdict, [conf.domain.c2]):"]
        out += [f"  {x}" for x in s.not_run]
    out.append("")
    if s.incomplete:
        out.append(
            f"verdict: INCOMPLETE — {c['pass']} cases match bit for bit, {len(s.not_run)} shapes asked for "
            f"were not run (exit 4)"
        )
    elif s.conformant:
        out.append(
            f"verdict: CONFORMANT — {c['pass']} cases match bit for bit"
            + (f" ({c['xfail']} expected failures)" if c["xfail"] else "")
        )
    else:
        out.append(
            f"verdict: NOT CONFORMANT — {c['fail']} failed, {c['error']} errors, {c['skip']} skipped, "
            f"{c['pass']} passed"
        )
    return "\n".join(out)


def to_json(s: Summary) -> dict:
    return {
        "kernel": s.kernel,
        "spec_version": s.spec_version,
        "generator_version": s.generator_version,
        "conformant": s.conformant,
        "verdict": s.verdict,
        "not_run": list(s.not_run),
        "counts": s.counts(),
        "domain": s.domain(),
        "ops": {op: s.counts(op) for op in s.ops},
        "diagnosis": [{"op": f.op, "message": f.message, "clauses": f.clauses} for f in s.findings],
        "cases": [
            {
                "id": r.case.id,
                "op": r.case.op,
                "family": r.case.family,
                "clauses": r.case.clauses,
                "status": r.status,
                "message": r.message,
                "xfail_reason": r.xfail_reason,
                "mismatches": [
                    {
                        "output": m.output,
                        "count": m.count,
                        "total": m.total,
                        "first_index": list(m.first_index),
                        "expected": m.expected,
                        "actual": m.actual,
                        "ulp": m.ulp,
                        "histogram": m.histogram,
                    }
                    for m in r.mismatches
                ],
            }
            for r in s.results
        ],
    }


def to_junit(s: Summary) -> bytes:
    root = ET.Element("testsuites", name=f"refreplay conform {s.kernel}")
    for op in s.ops:
        rs = [r for r in s.results if r.case.op == op]
        c = s.counts(op)
        suite = ET.SubElement(
            root,
            "testsuite",
            name=op,
            tests=str(len(rs)),
            failures=str(c["fail"]),
            errors=str(c["error"]),
            skipped=str(c["skip"] + c["xfail"]),
        )
        for r in rs:
            tc = ET.SubElement(suite, "testcase", classname=f"refreplay.conform.{op}", name=r.case.id)
            detail = "\n".join(_case_lines(r))
            if r.status == "fail":
                m = r.mismatches[0]
                ET.SubElement(
                    tc,
                    "failure",
                    message=f"{m.output}[{','.join(map(str, m.first_index))}]: "
                    f"expected {m.expected}, actual {m.actual}",
                ).text = detail
            elif r.status == "error":
                ET.SubElement(tc, "error", message=r.message).text = detail
            elif r.status in ("skip", "xfail"):
                ET.SubElement(tc, "skipped", message=r.message or f"xfail: {r.xfail_reason}")
    diag = ET.SubElement(root, "properties")
    for f in s.findings:
        ET.SubElement(diag, "property", name=f"diagnosis.{f.op}", value=f.text())
    return ET.tostring(root, encoding="utf-8", xml_declaration=True)


def write_json(s: Summary, path):
    from ... import files

    files.write_atomic(path, json.dumps(to_json(s), indent=1) + "\n")  # synced, renamed; errors are exit 2


def write_junit(s: Summary, path):
    from ... import files

    files.write_atomic(path, to_junit(s))
