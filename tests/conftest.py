"""Fixtures shared by several test modules."""

import os

import numba
import pytest

try:
    import background
except ImportError:  # this file copied alone into another folder (tests/test_thread_rerun.py)
    background = None


@pytest.fixture(scope="module")
def one_numba_thread():
    """Run a module's kernels on one thread.  Bits never depend on the thread
    count; on a shared 2-core machine, thread start-up would dominate the many
    tiny kernels these modules launch.  Opt in with
    ``pytestmark = pytest.mark.usefixtures("one_numba_thread")``."""
    keep = numba.get_num_threads()
    numba.set_num_threads(1)
    yield
    numba.set_num_threads(keep)


# ---- the README's `pytest -n auto`: how many pytest-xdist workers ----------------------

_WORKER_BYTES = 4 << 30  # the largest tests (live diagnoses at gpt2-124m shapes) take about 3 GB


def _available_bytes() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) << 10
    except (OSError, ValueError, IndexError):
        pass
    return None


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """One worker per CPU this process may run on, at most 4 and at most one
    per 4 GiB of available memory (a worker compiles and holds its own kernels)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    avail = _available_bytes()
    by_memory = cpus if avail is None else max(1, avail // _WORKER_BYTES)
    return max(1, min(cpus, 4, by_memory))


# ---- long subprocesses start early (tests/background.py) --------------------------


def pytest_collection_finish(session):
    if background is not None:
        background.start(session.items)


def pytest_sessionfinish(session, exitstatus):
    if background is not None:
        background.stop()


# ---- thread-invariance tests never compare 1 thread with 1 thread ------------------
#
# A test marked ``threads`` compares one thread with several.  Numba's pool has
# NUMBA_NUM_THREADS workers from import on, so in a process started with
# NUMBA_NUM_THREADS=1 such a test would compare 1 with 1 and assert nothing.
# There the test runs instead in a fresh pytest process with 2 threads, and
# its outcome is this test's outcome.

SUBPROCESS_THREADS = 2


def needs_thread_subprocess(item) -> bool:
    return item.get_closest_marker("threads") is not None and numba.config.NUMBA_NUM_THREADS < SUBPROCESS_THREADS


def pytest_pyfunc_call(pyfuncitem):
    if not needs_thread_subprocess(pyfuncitem):
        return None
    import os
    import subprocess
    import sys

    env = dict(os.environ, NUMBA_NUM_THREADS=str(SUBPROCESS_THREADS), REFREPLAY_THREADS=str(SUBPROCESS_THREADS))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "threads", pyfuncitem.nodeid]
    try:
        r = subprocess.run(cmd, cwd=pyfuncitem.config.rootpath, env=env, capture_output=True, text=True, timeout=1200)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{pyfuncitem.nodeid} with {SUBPROCESS_THREADS} threads: no result in 1200 s")
    if r.returncode != 0 or " passed" not in r.stdout:
        pytest.fail(
            f"{pyfuncitem.nodeid} with NUMBA_NUM_THREADS={SUBPROCESS_THREADS} "
            f"(subprocess, exit {r.returncode}):\n{r.stdout[-6000:]}\n{r.stderr[-2000:]}",
            pytrace=False,
        )
    return True


@pytest.fixture(autouse=True)
def _threads_tests_fix_the_count(request):
    """Inside a ``threads`` test refreplay's default policy (which runs
    kernels on the cores other processes leave free, environ.kernel_threads)
    must not quietly cap the "many threads" side to one on a busy machine:
    the count is fixed to the pool for the test's duration."""
    if request.node.get_closest_marker("threads") is None:
        yield
        return
    from refreplay import environ

    environ.set_threads(many_threads())
    try:
        yield
    finally:
        environ.set_threads(None)


def many_threads() -> int:
    """The thread count a ``threads`` test compares with one: at least 2 where
    the test body runs (see pytest_pyfunc_call)."""
    return max(numba.config.NUMBA_NUM_THREADS, 1)


def set_threads(n: int) -> None:
    """numba.set_num_threads, clamped to the pool (a fixture of a ``threads``
    test still runs in a 1-thread parent before its body moves to the
    subprocess)."""
    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
