"""Packaging: spec/ and vectors/ stay top-level directories of the repository
and are mapped into the wheel at build time (setup.py), so an installed
refreplay works from any directory.  The fast test inspects a wheel built
with the installed setuptools; the slow one (scripts/check-wheel, also run by
.ci/run) installs the wheel and the sdist into fresh venvs and runs the
commands from an unrelated directory."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from refreplay import resources, spec
from refreplay.conformance.golden import store

REPO = Path(__file__).resolve().parent.parent


def test_a_checkout_reads_its_top_level_directories():
    assert not resources.installed()
    assert spec.SPEC_DIR == REPO / "spec" and store.VECTOR_DIR == REPO / "vectors"


def _tracked_copy(dest: Path):
    files = (
        subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True, capture_output=True
        )
        .stdout.decode()
        .split("\0")
    )
    for f in filter(None, files):
        if (REPO / f).is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / f, dest / f)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs a git checkout (the wheel is built from the tracked files)")
    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"setuptools {setuptools.__version__} is older than the build's requirement (>=77)")
    src = tmp_path_factory.mktemp("src")
    _tracked_copy(src)
    out = tmp_path_factory.mktemp("dist")
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            str(out),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    (whl,) = out.glob("refreplay-*.whl")
    return zipfile.ZipFile(whl)


def test_the_wheel_carries_spec_and_vectors(wheel):
    names = set(wheel.namelist())
    for d in ("spec", "vectors"):
        tracked = subprocess.run(["git", "ls-files", d], cwd=REPO, capture_output=True, text=True).stdout.split()
        assert tracked
        for f in tracked:
            assert f"refreplay/_data/{f}" in names, f"{f} is missing from the wheel"
    assert wheel.read("refreplay/_data/spec/VERSION") == (REPO / "spec" / "VERSION").read_bytes()
    assert "refreplay/py.typed" in names and "refreplay/pytest_plugin.py" in names


def test_the_wheel_metadata(wheel):
    info = next(n.rsplit("/", 1)[0] for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    meta = wheel.read(f"{info}/METADATA").decode()
    assert "License-Expression: Apache-2.0" in meta and "Classifier: Framework :: Pytest" in meta
    assert "# refreplay" in meta  # the README is the long description
    assert any(n.startswith(f"{info}/licenses/LICENSE") for n in wheel.namelist())
    eps = wheel.read(f"{info}/entry_points.txt").decode()
    assert "[pytest11]" in eps and "refreplay = refreplay.pytest_plugin" in eps
    assert "refreplay = refreplay.cli:main" in eps


@pytest.mark.slow
def test_wheel_and_sdist_work_from_an_unrelated_directory():
    p = subprocess.run(["bash", "scripts/check-wheel"], cwd=REPO, capture_output=True, text=True, timeout=3600)
    assert p.returncode == 0 and "check-wheel: OK" in p.stdout, p.stdout[-3000:] + p.stderr[-3000:]
