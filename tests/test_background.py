"""tests/background.py: the suite's early-started subprocesses give the same
outcome as running the command in the test, time out, and never outlive the
session."""

from __future__ import annotations

import sys
import threading
import time

import background


class _Item:  # what start() reads of a collected test: this file's test_x
    path = __file__
    originalname = name = "test_x"


def _job(key, code, timeout=60):
    return background.register(key, lambda d: [sys.executable, "-c", code, str(d)], timeout=timeout)


def test_a_command_not_started_runs_when_its_test_asks():
    job = _job("bg-selftest-sync", "import sys; print('out', sys.argv[1]); sys.exit(3)")
    assert job.state == "new"  # registered inside a test: after collection, never queued
    r = background.result(job)
    assert r.returncode == 3 and r.stdout.strip() == f"out {job.dir}"
    assert background.result(job) is r  # read again: the same outcome, not a second run


def test_a_queued_command_runs_in_the_background():
    """A runner takes a queued command without its test asking (a queue of
    this test's own: the session's runner may be busy with the simulator)."""
    job = _job("bg-selftest-queued", "import time; time.sleep(0.5); print('done')")
    job.state = "queued"
    runner = threading.Thread(target=background._run_queue, args=([job],), daemon=True)
    runner.start()
    for _ in range(200):
        if job.state != "queued":
            break
        time.sleep(0.05)
    assert job.state in ("running", "done")  # the runner took it; the test did not
    assert background.result(job).stdout.strip() == "done"
    runner.join(30)
    assert not runner.is_alive()


def test_start_queues_only_the_selected_tests_commands(monkeypatch):
    monkeypatch.setattr(background, "enabled", lambda: True)  # also in an xdist worker
    monkeypatch.setattr(background, "_QUEUE", [])
    monkeypatch.setattr(background, "_RUNNER", object())  # as if running: start() queues, spawns nothing
    mine = background.register("bg-selftest-mine", lambda d: ["true"], tests=("test_x",))
    other = background.register("bg-selftest-other", lambda d: ["true"], tests=("test_y",))

    background.start([_Item()])
    assert background._QUEUE == [mine] and mine.state == "queued" and other.state == "new"
    background._QUEUE.clear()
    assert background.result(mine).returncode == 0  # not started: runs here


def test_a_command_past_its_timeout_is_killed_and_fails():
    job = _job("bg-selftest-timeout", "import time; time.sleep(60)", timeout=1)
    t = time.monotonic()
    r = background.result(job)
    assert time.monotonic() - t < 30
    assert r.returncode != 0 and "no result in 1 s, killed" in r.stderr


def test_a_command_that_cannot_start_is_a_failed_result():
    job = background.register("bg-selftest-missing", lambda d: [str(d / "no-such-program")])
    r = background.result(job)
    assert r.returncode == -1 and "no-such-program" in r.stderr


def test_off_when_asked_and_in_an_xdist_worker(monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.delenv("REFREPLAY_TEST_BACKGROUND", raising=False)
    assert background.enabled()
    monkeypatch.setenv("REFREPLAY_TEST_BACKGROUND", "0")
    assert not background.enabled()
    monkeypatch.delenv("REFREPLAY_TEST_BACKGROUND")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    assert not background.enabled()
    monkeypatch.setattr(background, "_QUEUE", [])
    job = background.register("bg-selftest-worker", lambda d: ["true"], tests=("test_x",))

    background.start([_Item()])
    assert background._QUEUE == [] and job.state == "new"  # left to its test
    assert background.result(job).returncode == 0


def test_xdist_auto_workers_follow_cpus_and_memory(monkeypatch):
    import conftest

    monkeypatch.setattr(conftest.os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    for avail, want in ((64 << 30, 4), (9 << 30, 2), (1 << 30, 1), (None, 4)):
        monkeypatch.setattr(conftest, "_available_bytes", lambda a=avail: a)
        assert conftest.pytest_xdist_auto_num_workers(None) == want, avail
    monkeypatch.setattr(conftest.os, "sched_getaffinity", lambda pid: {0}, raising=False)
    monkeypatch.setattr(conftest, "_available_bytes", lambda: 64 << 30)
    assert conftest.pytest_xdist_auto_num_workers(None) == 1
