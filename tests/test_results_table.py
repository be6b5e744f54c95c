"""`refreplay report`: conformance reports of several kernels as one table;
malformed or contradictory reports are refused (exit 2), never tabulated
([conf.runner.c1], [conf.diagnosis.r1])."""

import json
import subprocess
from pathlib import Path

import pytest

from refreplay import cli
from refreplay.conformance import api

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    d = tmp_path_factory.mktemp("reports")
    paths = {}
    for k in ("reference", "numpy"):
        paths[k] = d / f"{k}.json"
        paths[k].write_text(json.dumps(api.check(k, ops=["add", "sum"]).to_json()))
    return paths


def report(*args):
    return cli.main(["report", *map(str, args)])


def test_markdown_table(reports, capsys):
    assert report(reports["reference"], reports["numpy"], "--markdown") == 0
    out = capsys.readouterr().out
    assert "| op | reference | numpy |" in out
    row = next(line for line in out.splitlines() if line.startswith("| `sum` |"))
    ref, np_ = row.split(" | ")[1:3]
    assert ref.startswith("pass (") and np_.startswith("**FAIL**")
    assert "sums in a different order" in np_ and "[red.sum.c1]" in np_
    assert "Verdict: reference CONFORMANT; numpy NOT CONFORMANT" in out


def test_html_page_escapes(reports, tmp_path, capsys):
    doc = json.loads(reports["numpy"].read_text())
    doc["kernel"] = "<script>alert(1)</script>|x"
    evil = tmp_path / "evil.json"
    evil.write_text(json.dumps(doc))
    assert report(reports["reference"], evil, "--html", "-o", tmp_path / "t.html") == 0
    page = (tmp_path / "t.html").read_text()
    assert "<script>" not in page and "&lt;script&gt;" in page and 'class="fail"' in page
    assert report(reports["reference"], evil) == 0
    md = capsys.readouterr().out
    assert "<script>" not in md and "\\|x" in md  # a pipe in a name cannot open a column


def _mutated(tmp_path, reports, edit):
    doc = json.loads(reports["numpy"].read_text())
    edit(doc)
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(doc))
    return p


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d.__setitem__("conformant", True),  # says conformant, counts say not
        lambda d: d["ops"]["sum"].__setitem__("fail", -1),
        lambda d: d["ops"]["sum"].__setitem__("fail", "3"),
        lambda d: d["ops"]["sum"].pop("pass"),
        lambda d: d.__setitem__("kernel", 7),
        lambda d: d.pop("ops"),
        lambda d: d["diagnosis"].append({"op": "matmul", "message": "x", "clauses": []}),  # op not run
        lambda d: d["diagnosis"].append({"op": "sum", "message": 3, "clauses": []}),
    ],
)
def test_malformed_reports_are_refused(tmp_path, reports, edit, capsys):
    assert report(reports["reference"], _mutated(tmp_path, reports, edit)) == 2
    assert "not a `refreplay conform --json` report" in capsys.readouterr().err


def test_unreadable_and_inconsistent_sets_are_refused(tmp_path, reports, capsys):
    (tmp_path / "junk.json").write_text("[" * 100000)
    assert report(tmp_path / "junk.json") == 2
    assert report(tmp_path / "missing.json") == 2
    assert report(reports["numpy"], reports["numpy"]) == 2  # the same kernel twice
    other = _mutated(tmp_path, reports, lambda d: d.__setitem__("spec_version", "9.9"))
    assert report(reports["reference"], other) == 2
    err = capsys.readouterr().err
    assert "different spec versions" in err and "two reports for kernel numpy" in err
    assert "Traceback" not in err


@pytest.mark.slow
def test_readme_table_is_generated():
    """The README's published table is what the three kernels give now."""
    p = subprocess.run(
        ["bash", "scripts/conformance-table", "--check"], cwd=REPO, capture_output=True, text=True, timeout=1800
    )
    assert p.returncode == 0, p.stdout + p.stderr
