"""The sample kernel project (examples/kernel_project) uses the pytest plugin
and the Python API: the conformant kernel passes case by case, the +0-start
sum fails exactly its sign-of-zero case with the diagnosis as the failure
text, an xfail file turns that into an expected failure; the API's report is
the CLI's ([conf.runner.c1], [conf.diagnosis.r1], [red.sum.c1])."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from refreplay import cli
from refreplay.conformance import api

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "kernel_project"


def _forget_mykernels():
    """Other tests write their own `mykernels` module: never reuse one across tests."""
    for name in [n for n in sys.modules if n == "mykernels" or n.startswith("mykernels.")]:
        del sys.modules[name]


@pytest.fixture
def project(tmp_path, monkeypatch):
    dest = tmp_path / "kernel_project"
    shutil.copytree(EXAMPLE, dest, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    _forget_mykernels()
    monkeypatch.syspath_prepend(str(dest))
    yield dest
    _forget_mykernels()


def pytest_in(project, *args):
    """pytest run in the project with this checkout's refreplay and its plugin
    (entry points off, so an installed refreplay elsewhere is not loaded)."""
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "refreplay.pytest_plugin",
            "-q",
            "-rfExs",
            "-p",
            "no:cacheprovider",
            *args,
        ],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_conformant_kernel_passes_case_by_case(project):
    p = pytest_in(
        project, "--refreplay-kernel", "mykernels.conformant", "--refreplay-op", "add", "--refreplay-op", "sum", "-rA"
    )
    assert p.returncode == 0, p.stdout[-3000:]
    assert "PASSED mykernels.conformant::sum-signed_zero-00" in p.stdout
    assert "PASSED mykernels.conformant::add-edge-00" in p.stdout
    assert "PASSED tests/test_conformance.py::test_conformant_kernels" in p.stdout  # the API tests too


def test_plus_zero_start_fails_with_the_diagnosis(project):
    p = pytest_in(project, "--refreplay-kernel", "mykernels.plus_zero_start", "--refreplay-op", "sum")
    assert p.returncode == 1
    failed = [line for line in p.stdout.splitlines() if line.startswith("FAILED")]
    assert failed == [f for f in failed if "::sum-signed_zero-" in f] and failed
    assert "sign of zero differs (-0 against +0)" in p.stdout
    assert "start the sum from -0, not +0" in p.stdout  # the diagnosis is the failure text
    assert "Traceback" not in p.stdout


def test_xfail_file_is_honoured(project):
    p = pytest_in(
        project,
        "--refreplay-kernel",
        "mykernels.plus_zero_start",
        "--refreplay-op",
        "sum",
        "--refreplay-xfail",
        "xfail.txt",
    )
    assert p.returncode == 0 and "1 xfailed" in p.stdout and "fix tracked in issue 7" in p.stdout
    p = pytest_in(
        project, "--refreplay-kernel", "mykernels.conformant", "--refreplay-op", "sum", "--refreplay-xfail", "xfail.txt"
    )
    assert p.returncode == 1 and "unexpected pass" in p.stdout


def test_bad_options_are_usage_errors(project):
    p = pytest_in(project, "--refreplay-kernel", "mykernels.conformant", "--refreplay-op", "nosuch")
    assert p.returncode == 4 and "no vectors for op nosuch" in p.stderr


def test_plugin_is_inert_without_its_options(tmp_path):
    (tmp_path / "test_x.py").write_text("def test_x():\n    pass\n")
    p = pytest_in(tmp_path, "--co")
    assert p.returncode == 0 and "1 test collected" in p.stdout
    code = "import sys, refreplay.pytest_plugin; print('numpy' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert out.stdout.strip() == "False"


def test_api_report_is_the_cli_report(project, capsys):
    from mykernels import plus_zero_start

    report = api.check("mykernels.plus_zero_start", ops=["sum"])
    assert cli.main(["conform", "mykernels.plus_zero_start", "--op", "sum"]) == 1
    assert capsys.readouterr().out.rstrip("\n") == report.text()
    with pytest.raises(api.NotConformant) as exc:
        report.assert_conformant()
    assert str(exc.value) == report.text()
    assert report.counts["fail"] >= 1 and report.ops["sum"]["fail"] == report.counts["fail"]
    # a module object and the name give the same verdicts
    again = api.check(plus_zero_start, ops="sum")
    assert [c["status"] for c in again.cases] == [c["status"] for c in report.cases]


def test_api_declines_and_bad_input(project):
    from refreplay.errors import InputError

    report = api.check("mykernels.conformant")
    assert report.conformant and "matmul" in report.declined and set(report.ops) == {"add", "sum"}
    with pytest.raises(InputError):
        api.check("mykernels.conformant", ops=["nosuch"])
    with pytest.raises(InputError):
        api.check(42)
