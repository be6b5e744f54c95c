"""A ``threads`` test never compares one thread with one thread: in a process
whose Numba pool has one worker it runs in a 2-thread subprocess, and a
failure there fails it here."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).parent


def _pytest(tmp_path, body, threads):
    (tmp_path / "conftest.py").write_text((HERE / "conftest.py").read_text())
    (tmp_path / "test_probe.py").write_text(textwrap.dedent(body))
    env = dict(os.environ, NUMBA_NUM_THREADS=str(threads))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "test_probe.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


PROBE = """
    import numba, pytest

    @pytest.mark.threads
    def test_sees_two_threads():
        numba.set_num_threads(2)
        assert numba.get_num_threads() == 2
        assert numba.config.NUMBA_NUM_THREADS >= 2
"""


def test_runs_in_a_two_thread_subprocess_when_the_pool_has_one(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    threads: x\n")
    r = _pytest(tmp_path, PROBE, threads=1)
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout + r.stderr


def test_a_failure_in_the_subprocess_fails_the_test(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    threads: x\n")
    r = _pytest(tmp_path, PROBE.replace(">= 2", ">= 3"), threads=1)
    assert r.returncode == 1 and "NUMBA_NUM_THREADS=2" in r.stdout, r.stdout + r.stderr
