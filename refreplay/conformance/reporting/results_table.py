"""Published results: conformance reports of several kernels (the JSON of
``refreplay conform --json``) as one table, op by kernel, each cell the
verdict on that op's cases and the diagnosis, in Markdown or HTML.

Reports are input from elsewhere: every field used is type-checked, and a
malformed report is an ``InputError`` naming the file, never a pass.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from pathlib import Path

from ...errors import InputError

MAX_BYTES = 64 << 20  # a report of every case of every op is a few MB
STATUSES = ("pass", "fail", "error", "skip", "xfail", "xpass")


@dataclass
class KernelResult:
    kernel: str
    spec_version: str
    conformant: bool
    ops: dict[str, dict[str, int]]
    findings: dict[str, list[tuple[str, list[str]]]]  # op -> [(message, clauses)]


def _need(cond, path, what):
    if not cond:
        raise InputError(f"{path}: not a `refreplay conform --json` report: {what}")


def read(path) -> KernelResult:
    p = Path(path)
    try:
        with open(p, "rb") as fh:
            data = fh.read(MAX_BYTES + 1)
    except OSError as exc:
        raise InputError(f"cannot read {p}: {exc}") from None
    _need(len(data) <= MAX_BYTES, p, f"larger than {MAX_BYTES} bytes")
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise InputError(f"{p}: not JSON: {str(exc)[:200]}") from None
    _need(isinstance(doc, dict), p, "the top level is not an object")
    for key, typ in (("kernel", str), ("spec_version", str), ("conformant", bool), ("ops", dict), ("diagnosis", list)):
        _need(isinstance(doc.get(key), typ), p, f"'{key}' missing or not a {typ.__name__}")
    ops = {}
    for op, counts in doc["ops"].items():
        _need(
            isinstance(counts, dict)
            and all(
                isinstance(counts.get(s), int) and not isinstance(counts.get(s), bool) and counts[s] >= 0
                for s in STATUSES
            ),
            p,
            f"bad counts for op {op!r}",
        )
        ops[op] = {s: counts[s] for s in STATUSES}
    findings: dict[str, list] = {}
    for f in doc["diagnosis"]:
        _need(
            isinstance(f, dict)
            and isinstance(f.get("op"), str)
            and isinstance(f.get("message"), str)
            and isinstance(f.get("clauses"), list)
            and all(isinstance(c, str) for c in f["clauses"]),
            p,
            "a diagnosis entry is not {op, message, clauses}",
        )
        _need(f["op"] in ops, p, f"a diagnosis names op {f['op']!r}, which the report did not run")
        findings.setdefault(f["op"], []).append((f["message"], f["clauses"]))
    verdict = all(c["fail"] == 0 and c["error"] == 0 and c["skip"] == 0 for c in ops.values()) and bool(ops)
    _need(verdict == doc["conformant"] or not doc["conformant"], p, "it says conformant but its counts show failures")
    return KernelResult(doc["kernel"], doc["spec_version"], doc["conformant"], ops, findings)


def combine(paths) -> list[KernelResult]:
    results = [read(p) for p in paths]
    if not results:
        raise InputError("no reports given")
    versions = sorted({r.spec_version for r in results})
    if len(versions) > 1:
        raise InputError(
            f"the reports are for different spec versions ({', '.join(versions)}): "
            "a table would compare different rules"
        )
    seen: set[str] = set()
    for r in results:
        if r.kernel in seen:
            raise InputError(f"two reports for kernel {r.kernel}")
        seen.add(r.kernel)
    return results


def _ops(results) -> list[str]:
    return list(dict.fromkeys(op for r in results for op in r.ops))


def short(message: str) -> str:
    """A finding's headline: its message up to the first detail."""
    cut = min([i for i in (message.find(sep) for sep in (" (", " — ", ": ", "; ")) if i > 0] or [len(message)])
    return message[:cut]


def _cell(r: KernelResult, op: str, brief: bool) -> tuple[str, str, str]:
    """(verdict, counts, diagnosis) of one kernel on one op; ``brief``: headlines
    of the findings and their clauses once, else every finding in full."""
    c = r.ops.get(op)
    if c is None:
        return "not run", "", ""
    ran = sum(c.values())
    ok = c["fail"] == 0 and c["error"] == 0 and c["skip"] == 0
    counts = f"{c['pass'] + c['xpass']}/{ran}" + (f", {c['xfail']} xfail" if c["xfail"] else "")
    found = r.findings.get(op, [])
    if brief:
        clauses = dict.fromkeys(x for _, cl in found for x in cl)
        why = "; ".join(dict.fromkeys(short(m) for m, _ in found)) + (
            " " + " ".join(f"[{x}]" for x in clauses) if clauses else ""
        )
    else:
        why = "; ".join(m + " " + " ".join(f"[{x}]" for x in cl) for m, cl in found)
    return ("pass" if ok else "FAIL"), counts, why


def _md(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ").replace("<", "&lt;")


def markdown(results: list[KernelResult]) -> str:
    head = "| op | " + " | ".join(_md(r.kernel) for r in results) + " |"
    out = [
        f"Conformance to refreplay spec {_md(results[0].spec_version)}: "
        "cases passing bit for bit, and the diagnosis where an op fails.",
        "",
        head,
        "|---" * (len(results) + 1) + "|",
    ]
    for op in _ops(results):
        cells = []
        for r in results:
            verdict, counts, why = _cell(r, op, brief=True)
            text = f"**{verdict}**" if verdict == "FAIL" else verdict
            cells.append(" ".join(x for x in (text, f"({counts})" if counts else "", why and f"— {_md(why)}") if x))
        out.append(f"| `{_md(op)}` | " + " | ".join(cells) + " |")
    out += [
        "",
        "Verdict: "
        + "; ".join(f"{_md(r.kernel)} {'CONFORMANT' if r.conformant else 'NOT CONFORMANT'}" for r in results),
    ]
    return "\n".join(out) + "\n"


def html_page(results: list[KernelResult]) -> str:
    e = html.escape
    rows = []
    for op in _ops(results):
        cells = []
        for r in results:
            verdict, counts, why = _cell(r, op, brief=False)
            cls = {"pass": "pass", "FAIL": "fail"}.get(verdict, "none")
            cells.append(
                f'<td class="{cls}"><b>{e(verdict)}</b> {e(counts)}'
                + (f"<br><small>{e(why)}</small>" if why else "")
                + "</td>"
            )
        rows.append(f"<tr><th><code>{e(op)}</code></th>{''.join(cells)}</tr>")
    head = "".join(
        f"<th>{e(r.kernel)}<br><small>{'CONFORMANT' if r.conformant else 'NOT CONFORMANT'}</small></th>"
        for r in results
    )
    return (
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>refreplay conformance</title>\n'
        "<style>body{font-family:sans-serif}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
        "padding:4px;vertical-align:top;text-align:left}.pass{background:#e6ffe6}.fail{background:#ffe6e6}"
        ".none{color:#888}</style></head><body>\n"
        f"<h1>Conformance to refreplay spec {e(results[0].spec_version)}</h1>\n"
        f"<table><tr><th>op</th>{head}</tr>\n" + "\n".join(rows) + "\n</table></body></html>\n"
    )
