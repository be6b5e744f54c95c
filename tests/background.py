"""Subprocesses the suite starts early and reads late.

The CUDA simulator's checks run in subprocesses (the simulator must be on
before ``numba.cuda`` is imported) that take minutes, mostly on one core: the
simulator runs every CUDA thread as a Python thread under one GIL.  A test
module registers such a command when it is imported (``register``); once
collection is over, ``tests/conftest.py`` starts the commands whose tests
were selected, one at a time in the order their tests will run, in a
background thread, while the rest of the suite runs in the main process (the
CI machine has two cores).  The test that needs one calls ``result``: it
waits for the command, or runs it itself when it has not started yet.  What a
test asserts on the result is unchanged; only when the command runs moves.

``REFREPLAY_TEST_BACKGROUND=0`` turns this off: every command then runs when
its test asks for it.  So does a pytest-xdist worker (``-n``): its tests
already run beside another worker's, and every worker collects the whole
suite, so each would start every command.  At the end of the session every
command still running is killed with its process group, and every scratch
folder removed.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Job:
    key: str
    argv: list[str]
    env: dict[str, str]
    timeout: float
    module: str  # the registering test module's file
    tests: tuple[str, ...] | None  # the test functions that read it (None: any in the module)
    dir: Path  # the command's own scratch folder
    state: str = "new"  # new -> queued -> running -> done
    result: subprocess.CompletedProcess | None = None
    proc: subprocess.Popen | None = None
    done: threading.Event = field(default_factory=threading.Event)


_JOBS: dict[str, Job] = {}
_QUEUE: list[Job] = []
_LOCK = threading.Lock()
_STOP = threading.Event()
_RUNNER: threading.Thread | None = None


def enabled() -> bool:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return False
    return os.environ.get("REFREPLAY_TEST_BACKGROUND", "1") != "0"


def register(
    key: str,
    argv: Callable[[Path], list[str]],
    *,
    env: dict[str, str] | None = None,
    timeout: float = 900,
    tests: tuple[str, ...] | None = None,
) -> Job:
    """Declare the command ``argv(scratch_dir)`` (run from the repository
    root with ``env``, default this process's), read by ``tests`` of the
    calling module (default: any of them).  Registering a key twice keeps
    the first."""
    module = os.path.realpath(sys._getframe(1).f_globals["__file__"])
    with _LOCK:
        if key not in _JOBS:
            folder = Path(tempfile.mkdtemp(prefix=f"refreplay-bg-{key}-"))
            _JOBS[key] = Job(
                key, [str(a) for a in argv(folder)], dict(env or os.environ), timeout, module, tests, folder
            )
        return _JOBS[key]


def start(items) -> None:
    """Queue the commands whose tests are among the selected ``items``, in the
    order of their first test, and start the background runner."""
    global _RUNNER
    if not enabled():
        return
    order = []
    with _LOCK:
        for item in items:
            path = os.path.realpath(str(item.path))
            name = getattr(item, "originalname", None) or item.name
            for job in _JOBS.values():
                if job.state == "new" and job.module == path and (job.tests is None or name in job.tests):
                    job.state = "queued"
                    order.append(job)
        _QUEUE.extend(order)
    if order and _RUNNER is None:
        _RUNNER = threading.Thread(target=_run_queue, name="refreplay-test-background", daemon=True)
        _RUNNER.start()


def _run_queue(queue: list[Job] | None = None) -> None:
    """Run the jobs of ``queue`` (default: the session's) one after another."""
    queue = _QUEUE if queue is None else queue
    while not _STOP.is_set():
        with _LOCK:
            if not queue:
                return
            job = queue.pop(0)
            job.state = "running"
        _execute(job)


def _execute(job: Job) -> None:
    try:
        job.proc = subprocess.Popen(
            job.argv,
            cwd=ROOT,
            env=job.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its own process group: killed whole on timeout or at the end
        )
        try:
            out, err = job.proc.communicate(timeout=job.timeout)
        except subprocess.TimeoutExpired:
            _kill(job.proc)
            out, err = job.proc.communicate()
            err += f"\n[background] {job.key}: no result in {job.timeout:.0f} s, killed"
        job.result = subprocess.CompletedProcess(job.argv, job.proc.returncode, out, err)
    except Exception as exc:  # a command that cannot start is the test's failure, not the runner's
        job.result = subprocess.CompletedProcess(job.argv, -1, "", f"[background] {job.key}: {job.argv}: {exc!r}")
    finally:
        job.state = "done"
        job.done.set()


def result(job: Job) -> subprocess.CompletedProcess:
    """The command's outcome: waits while it runs, runs it here when it has
    not started (not selected at collection, or the background is off)."""
    with _LOCK:
        mine = job.state in ("new", "queued")
        if mine:
            if job in _QUEUE:
                _QUEUE.remove(job)
            job.state = "running"
    if mine:
        _execute(job)
    elif not job.done.wait(job.timeout + 60):
        raise TimeoutError(f"background command {job.key} gave no result")
    return job.result


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def stop() -> None:
    """Kill what still runs, drop what is queued, remove every scratch folder."""
    _STOP.set()
    with _LOCK:
        _QUEUE.clear()
        jobs = list(_JOBS.values())
    for job in jobs:
        if job.proc is not None and job.proc.poll() is None:
            _kill(job.proc)
    if _RUNNER is not None:
        _RUNNER.join(timeout=30)
    for job in jobs:
        shutil.rmtree(job.dir, ignore_errors=True)
