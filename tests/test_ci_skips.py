"""scripts/check-skips: CI fails on a skip whose reason is not allowlisted."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parent.parent / "scripts" / "check-skips"

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="3">
<testcase classname="tests.test_a" name="test_ok"/>
<testcase classname="tests.test_mpi" name="test_ranks">
<skipped type="pytest.skip" message="mpi4py is not installed: pip install 'mpi4py&gt;=4'"/></testcase>
{extra}
</testsuite></testsuites>
"""


def check(tmp_path, extra=""):
    (tmp_path / "junit.xml").write_text(JUNIT.format(extra=extra))
    return subprocess.run([sys.executable, SCRIPT, tmp_path / "junit.xml"], capture_output=True, text=True)


def test_allowed_skips_pass(tmp_path):
    r = check(tmp_path)
    assert r.returncode == 0 and "1 skipped, 0 not on" in r.stdout, r.stdout


def test_a_skipped_oracle_fails_ci(tmp_path):
    r = check(
        tmp_path,
        '<testcase classname="tests.test_rng" name="test_kat">'
        '<skipped type="pytest.skip" message="/work/shared/data/kat.txt not present"/></testcase>',
    )
    assert r.returncode == 1 and "NOT ALLOWED: tests.test_rng::test_kat" in r.stdout, r.stdout


def test_an_unreadable_report_is_a_usage_error(tmp_path):
    (tmp_path / "junit.xml").write_text("<testsuites")
    r = subprocess.run([sys.executable, SCRIPT, tmp_path / "junit.xml"], capture_output=True, text=True)
    assert r.returncode == 2
