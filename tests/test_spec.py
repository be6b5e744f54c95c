"""The spec itself: well-formed, every worked example reproduces, every label
cited exists and every normative clause is cited by code and by a test
([conv.labels.c1], [conv.values.c1])."""

import shutil
import subprocess
import sys

import pytest

from refreplay import spec

CLAUSES = spec.parse()
EXAMPLES = [(c.label, line, expr, res) for c in CLAUSES.values() for line, expr, res in c.examples]


def test_spec_has_version_and_clauses():
    assert spec.version()
    assert len(CLAUSES) > 10
    assert all(c.body for c in CLAUSES.values()), "every clause has a body"


@pytest.mark.parametrize("label,line,expr,result", EXAMPLES, ids=[f"{e[0]}:{e[1]}" for e in EXAMPLES])
def test_worked_example(label, line, expr, result):
    ok, msg = spec.run_example(expr, result)
    assert ok, f"[{label}] line {line}: {msg}"


def test_example_that_is_wrong_fails():
    ok, msg = spec.run_example("numerics.add(f32(0x3F800000), f32(0x3F800000))", "f32(0x40000001)")
    assert not ok and "0x40000000" in msg


def test_traceability_check_passes():
    report = spec.check()
    assert report.ok, "\n".join(report.lines())


def test_check_flags_unknown_and_uncited_labels(tmp_path):
    root = tmp_path / "repo"
    shutil.copytree(spec.SPEC_DIR, root / "spec")
    (root / "refreplay").mkdir()
    (root / "tests").mkdir()
    bogus = "num.bogus" + ".c9"  # spelled apart so that this file does not cite it
    (root / "refreplay" / "x.py").write_text(f"# implements [num.add.c1] and [{bogus}]\n")
    (root / "tests" / "test_x.py").write_text("# checks [num.add.c1]\n")
    report = spec.check(root)
    assert not report.ok
    assert bogus in report.unknown
    assert "num.mul.c1" in report.uncited_by_code
    assert "num.mul.c1" in report.uncited_by_tests
    assert "num.add.c1" not in report.uncited_by_code
    # a clause that cross-references a label the spec lacks is flagged too
    with open(root / "spec" / "01-numbers.txt", "a") as fh:
        fh.write(f"\n[{'num.extra' + '.r1'}] Extra\n  see [{'num.gone' + '.c1'}]\n")
    assert "num.gone.c1" in spec.check(root).unknown


def test_cli_show_and_unknown_label():
    run = [sys.executable, "-m", "refreplay", "spec", "show", "num.flush.c1"]
    out = subprocess.run(run, capture_output=True, text=True)
    assert out.returncode == 0 and "[num.flush.c1]" in out.stdout
    bad = subprocess.run(run[:-1] + ["num.nope.c1"], capture_output=True, text=True)
    assert bad.returncode == 2 and "no such clause" in bad.stderr


def test_cli_version_prints_spec_hash():
    out = subprocess.run([sys.executable, "-m", "refreplay", "--version"], capture_output=True, text=True)
    assert out.returncode == 0
    assert spec.spec_sha256() in out.stdout and spec.version() in out.stdout
