"""`audit` and `replay --steps` on a Dask cluster (issue 27): the same
certificates as the serial audit for any number of workers, unfit workers
refused, a killed worker's task rerun, a step failing on every try reported,
disagreeing replicas named.  LocalClusters on loopback, closed in fixtures."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

distributed = pytest.importorskip("distributed")
cloudpickle = pytest.importorskip("cloudpickle")

import auditor_keys  # noqa: E402
from cli_helpers import run_cli  # noqa: E402
from test_doctor import csr_lib  # noqa: E402,F401  (the MXCSR-setting library)
from refreplay.training import presets, train  # noqa: E402
from refreplay.training.launch.inproc import InProcess  # noqa: E402
from refreplay.verify import cluster  # noqa: E402

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the injected tasks travel by value

STEPS, EVERY, K = 12, 4, 3
BEACON = "c0ffee"
TIMEOUT = 300


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    model, tcfg = presets.preset("tiny")
    model = dataclasses.replace(model, layers=1, seq_len=16, mlp_hidden=64)
    tcfg = dataclasses.replace(tcfg, micro_batches=2, micro_batch_size=2, warmup_steps=3)
    path = tmp_path_factory.mktemp("runs") / "r"
    train.train(
        model,
        tcfg,
        steps=STEPS,
        checkpoint_every=EVERY,
        out=path,
        launcher=InProcess(1),
        byte_cap=1 << 16,
        progress=None,
    )
    return path


@pytest.fixture(scope="module")
def keypair(tmp_path_factory):
    return auditor_keys.key_files(tmp_path_factory.mktemp("keys"), "alice")


@pytest.fixture(scope="module")
def key(keypair):
    return keypair[0]


@pytest.fixture
def _audit(run, key):
    def audit(run, out, *extra):
        return run_cli(
            "audit",
            run,
            "--sample",
            K,
            "--beacon",
            BEACON,
            "--auditor",
            "alice",
            "--key",
            key,
            "--out",
            out,
            "--quiet",
            *extra,
        )

    return audit


def _certs(d):
    """step -> certificate without the fields that name the platform (and the signature over it)."""
    out = {}
    for f in sorted(d.glob("cert-*.json")):
        c = json.loads(f.read_text())
        out[c["step"]] = {k: v for k, v in c.items() if k not in ("platform", "signature")}
    return out


@pytest.fixture(scope="module")
def serial(run, key, tmp_path_factory):
    d = tmp_path_factory.mktemp("serial")
    a = run_cli(
        "audit", run, "--sample", K, "--beacon", BEACON, "--auditor", "alice", "--key", key, "--out", d, "--quiet"
    )
    assert a.returncode == 0, a.stdout + a.stderr
    certs = _certs(d)
    assert len(certs) == K and all(c["verdict"] == "verified" for c in certs.values())
    return certs


@pytest.fixture
def local2():
    """A LocalCluster of 2 one-thread worker processes, closed afterwards."""
    lc = distributed.LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address=None,
        env={"NUMBA_NUM_THREADS": "1"},
    )
    try:
        yield lc
    finally:
        lc.close()


@pytest.mark.parametrize("n", [1, 2, pytest.param(3, marks=pytest.mark.slow)])
def test_cluster_audit_writes_the_serial_certificates(run, serial, tmp_path, n, _audit, keypair):
    """[step.verified.r2] Bits and verdicts do not depend on the number of
    workers; the client's signed certificates pass coverage --trust."""
    a = _audit(run, tmp_path, "--cluster", f"local:{n}")
    assert a.returncode == 0, a.stdout + a.stderr
    assert a.stdout.count(": fit (") == n
    assert _certs(tmp_path) == serial
    cov = run_cli("coverage", run, tmp_path, "--trust", keypair[1])
    assert cov.returncode == 0 and "REJECTED" not in cov.stdout, cov.stdout + cov.stderr


def test_cluster_audit_reports_a_mismatch(run, tmp_path_factory, tmp_path):
    """A tampered checkpoint: the cluster's certificates say mismatch, exit 1."""
    import shutil

    bad = tmp_path_factory.mktemp("bad") / "r"
    shutil.copytree(run, bad)
    ck = bad / "checkpoints" / "step-0000004.safetensors"
    b = bytearray(ck.read_bytes())
    b[-1] ^= 1
    ck.write_bytes(bytes(b))
    a = run_cli("replay", bad, "--steps", f"1:{STEPS}", "--cluster", "local:2", "--quiet")
    assert a.returncode == 1, a.stdout + a.stderr
    assert "MISMATCH" in a.stdout and "NOT VERIFIED" in a.stdout


def test_replay_segment_is_split_at_checkpoints(run):
    assert cluster.segment_targets([0, 4, 8, 12], 2, 11) == [4, 8, 11]
    assert cluster.segment_targets([0, 4, 8, 12], 5, 5) == [5]
    a = run_cli("replay", run, "--steps", f"3:{STEPS}", "--cluster", "local:2", "--quiet")
    assert a.returncode == 0, a.stdout + a.stderr
    assert "3 task(s) ending at [4, 8, 12]" in a.stdout and f"VERIFIED: steps 3..{STEPS}" in a.stdout
    s = run_cli("replay", run, "--steps", "3:5", "--quiet")  # the same plan in this process
    assert s.returncode == 0 and "steps 1..4: VERIFIED" in s.stdout and "steps 5..5: VERIFIED" in s.stdout


@pytest.mark.parametrize("bad", ["local:0", "local:x", "udp://1.2.3.4:5", "tcp://127.0.0.1"])
def test_bad_cluster_spec_is_exit_2(run, tmp_path, bad, _audit):
    a = _audit(run, tmp_path, "--cluster", bad)
    assert a.returncode == 2 and "--cluster" in a.stderr, a.stdout + a.stderr


FTZ_PRELOAD = """
import ctypes
ctypes.CDLL({lib!r}).set_csr_bits(ctypes.c_uint(0x8000))
"""


def _ftz_worker(tmp_path, lib, address):
    pre = tmp_path / "ftz_preload.py"
    pre.write_text(FTZ_PRELOAD.format(lib=str(lib)))
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "distributed.cli.dask_worker",
            address,
            "--no-nanny",
            "--nthreads",
            "1",
            "--host",
            "127.0.0.1",
            "--no-dashboard",
            "--preload",
            str(pre),
            "--death-timeout",
            "60",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "NUMBA_NUM_THREADS": "1"},
    )


def _wait_workers(client, n):
    client.wait_for_workers(n, timeout=TIMEOUT)


def test_unfit_worker_gets_no_task(run, serial, tmp_path, csr_lib, _audit):  # noqa: F811
    """[num.flush.c1] A worker with hardware FTZ on is reported and refused;
    the fit worker certifies every step; with only the unfit one: exit 2."""
    lc = distributed.LocalCluster(n_workers=0, processes=True, host="127.0.0.1", dashboard_address=None)
    proc = None
    try:
        proc = _ftz_worker(tmp_path, csr_lib, lc.scheduler_address)
        with distributed.Client(lc) as client:
            _wait_workers(client, 1)
            a = _audit(run, tmp_path / "none", "--cluster", lc.scheduler_address)
            assert a.returncode == 2 and "no worker of the cluster is fit" in a.stderr, a.stdout + a.stderr
            assert "flush-to-zero" in a.stderr
            lc.scale(1)
            _wait_workers(client, 2)
            a = _audit(run, tmp_path / "c", "--cluster", lc.scheduler_address)
        assert a.returncode == 0, a.stdout + a.stderr
        unfit = [line for line in a.stdout.splitlines() if "UNFIT" in line]
        assert len(unfit) == 1 and "flush-to-zero" in unfit[0]
        bad_addr = unfit[0].split()[1].rstrip(":")
        assert bad_addr not in "".join(line for line in a.stdout.splitlines() if "-> " in line)
        assert _certs(tmp_path / "c") == serial
    finally:
        if proc is not None:
            proc.kill()
            proc.wait(30)
        lc.close()


def test_killed_worker_task_runs_again(run, serial, tmp_path, local2, _audit):
    """SIGKILL of the worker replaying a step: the step is certified by the
    other (or the restarted) worker; exactly one certificate per step."""
    addr = local2.scheduler_address
    result = {}
    th = threading.Thread(target=lambda: result.setdefault("a", _audit(run, tmp_path, "--cluster", addr)))
    with distributed.Client(local2) as client:
        client.wait_for_workers(2, timeout=TIMEOUT)
        th.start()
        killed = None
        t0 = time.monotonic()
        while killed is None and time.monotonic() - t0 < TIMEOUT and th.is_alive():
            busy = {w: ks for w, ks in client.processing().items() if any("refreplay-" in str(k) for k in ks)}
            if busy:
                w = sorted(busy)[0]
                pid = client.run(os.getpid, workers=[w])[w]
                os.kill(pid, signal.SIGKILL)
                killed = w
            time.sleep(0.05)
        th.join(TIMEOUT)
    assert killed is not None, "no task was seen running"
    a = result["a"]
    assert a.returncode == 0, a.stdout + a.stderr
    assert len(list(tmp_path.glob("cert-*.json"))) == K
    assert _certs(tmp_path) == serial


def _fails_at_step(bad_step, run_path, head, target, device=None, max_memory=None):
    if target == bad_step:
        raise RuntimeError(f"injected failure at step {target}")
    from refreplay.verify import cluster as c

    return c.replay_task(run_path, head, target, device, max_memory)


def test_step_failing_on_every_try_is_named_and_exit_1(run, serial, tmp_path, monkeypatch, _audit):
    import functools

    bad = sorted(serial)[1]
    monkeypatch.setattr(cluster, "replay_task", functools.partial(_fails_at_step, bad))
    a = _audit(run, tmp_path, "--cluster", "local:2", "--retries", "1")
    assert a.returncode == 1, a.stdout + a.stderr
    assert f"step {bad}: FAILED on every try" in a.stdout and "injected failure" in a.stdout
    assert set(_certs(tmp_path)) == set(serial) - {bad}
    assert "1 not certified" in a.stdout


def _tamper_first(marker, run_path, head, target, device=None, max_memory=None):
    from refreplay.verify import cluster as c
    from refreplay.verify.replay import Divergence

    out = c.replay_task(run_path, head, target, device, max_memory)
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return out
    out["result"].divergence = Divergence(target, "state", "injected")
    out["platform"] = {**out["platform"], "cpu_model": "Injected CPU"}
    return out


def test_disagreeing_replicas_name_both_platforms(run, serial, tmp_path, monkeypatch, _audit):
    import functools

    monkeypatch.setattr(cluster, "replay_task", functools.partial(_tamper_first, str(tmp_path / "marker")))
    a = _audit(run, tmp_path / "c", "--cluster", "local:2", "--replicas", "2")
    assert a.returncode == 1, a.stdout + a.stderr
    assert a.stdout.count("DISAGREEMENT") == 1
    lines = a.stdout.splitlines()
    i = next(i for i, line in enumerate(lines) if "DISAGREEMENT" in line)
    both = " ".join(lines[i + 1 : i + 3])
    assert "VERIFIED on worker" in both and "MISMATCH on worker" in both and "Injected CPU" in both
    assert len(_certs(tmp_path / "c")) == K - 1


def test_estimate_is_cluster_wide(run, tmp_path, _audit):
    a = _audit(run, tmp_path, "--estimate", "--cluster", "local:3")
    assert a.returncode == 0, a.stdout + a.stderr
    assert "on 3 worker(s): about" in a.stdout and "task(s)" in a.stdout
    assert not list(tmp_path.glob("cert-*.json"))


def test_cluster_seconds_places_longest_tasks_first():
    from refreplay.commands import _cluster

    # targets 4, 7, 12 with checkpoints every 4: tasks of 4, 3 (from 4) and 4 (from 8) steps
    assert _cluster.cluster_seconds([0, 4, 8, 12], [4, 7, 12], 2, 2.0) == (22.0, 14.0, 11)
    assert _cluster.cluster_seconds([0, 4, 8, 12], [4, 7, 12], 1, 2.0) == (22.0, 22.0, 11)
    assert _cluster.cluster_seconds([0, 4, 8, 12], [4, 7, 12], 8, 2.0)[1] == 8.0


class _Tty:
    def __init__(self):
        self.text = ""

    def isatty(self):
        return True

    def write(self, s):
        self.text += s

    def flush(self):
        pass


def test_one_progress_line_with_eta_from_the_estimate():
    from refreplay.commands import _cluster

    tty = _Tty()
    show = _cluster._progress(False, 3, "audit: steps settled", lambda: 120.0, stream=tty)
    assert tty.text.startswith("\raudit: steps settled 0/3  ETA 120 s (estimate)")
    show(1)
    show(3)
    assert tty.text.count("\n") == 1 and tty.text.endswith("3/3  ETA 0 s\n")
    assert "\raudit: steps settled 1/3  ETA " in tty.text
    quiet = _Tty()
    _cluster._progress(True, 3, "x", lambda: 1 / 0, stream=quiet)(1)  # quiet: nothing, no estimate
    assert quiet.text == ""


def test_a_task_refuses_another_run_at_the_path(run):
    """The worker checks the head the client opened; an InputError comes
    back as the step's error (not retried), never as a result."""
    out = cluster.replay_task(str(run), "0" * 64, 2)
    assert "error" in out and "result" not in out and "not the client's" in out["error"]
    good = cluster.replay_task(str(run), run_cli("replay", run, "--step", 1).stdout.split("chain head ")[1][:64], 2)
    assert good["result"].verified and good["bytes_read"] > 0


def test_settle_never_drops_a_step():
    """Every combination of tries ends in exactly one of: result, failed,
    disagreement, error."""
    import itertools
    from types import SimpleNamespace

    def ok(root):
        res = SimpleNamespace(
            verified=root == "a",
            checked=[SimpleNamespace(step=1, state_root=root, chain_link="l")],
            divergence=None if root == "a" else SimpleNamespace(step=1, kind="state"),
        )
        return {"result": res, "platform": {"cpu_model": root}, "worker": root, "seconds": 1.0, "bytes_read": 1}

    kinds = [ok("a"), ok("b"), {"failed": "KilledWorker: x"}, {"step": 1, "error": "bad run"}]
    for n in (1, 2, 3):
        for tries in itertools.product(kinds, repeat=n):
            out = cluster.Outcome()
            cluster.settle(1, list(tries), out)
            where = [1 in d for d in (out.results, out.failed, out.disagreements, out.errors)]
            assert sum(where) == 1, tries
            results = [t for t in tries if "result" in t]
            if not any("error" in t for t in tries) and len({t["worker"] for t in results}) > 1:
                assert 1 in out.disagreements, tries  # two different replays of one step
            if 1 in out.results:
                assert len(results) == n and len({t["worker"] for t in results}) == 1


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "local:",
        "local:-1",
        "local:999",
        "tcp://",
        "tcp://h:p",
        "tcp://a:1:2",
        "local:1x",
        "tcp://" + "a" * 400 + ":1",
        "\x00",
    ],
)
def test_parse_cluster_refuses_bad_specs(bad):
    from refreplay.errors import InputError

    with pytest.raises(InputError):
        cluster.parse_cluster(bad)


@pytest.mark.parametrize("bad", ["", "3", "3:", ":3", "0:3", "3:2", "1:13", "a:b", "1:2:3", "-1:2"])
def test_parse_steps_refuses_bad_segments(bad):
    from refreplay.commands import _cluster
    from refreplay.errors import InputError

    with pytest.raises(InputError):
        _cluster.parse_steps(bad, STEPS)
    assert _cluster.parse_steps("3:12", STEPS) == (3, 12)


def _where(slow, run_path, head, target, device=None, max_memory=None):
    """A stand-in task: which worker ran it (the ``slow`` one takes longer, so an unpinned
    schedule would let the other worker take both replicas of a step)."""
    import types

    from distributed import get_worker

    w = get_worker().address
    if w == slow:
        time.sleep(0.2)
    return {
        "step": target,
        "worker": w,
        "platform": {},
        "seconds": 0.0,
        "bytes_read": None,
        "result": types.SimpleNamespace(verified=True, checked=[], divergence=None),
    }


def test_replicas_run_on_different_workers(local2, monkeypatch):
    """--replicas R pins the R replicas of a step to R distinct fit workers; fewer fit
    workers than R is refused; pinning both to one worker is what the check catches."""
    import functools

    from refreplay.errors import InputError

    with distributed.Client(local2) as client:
        client.wait_for_workers(2, timeout=TIMEOUT)
        cluster.prove_fitness(client, timeout=TIMEOUT)
        fit = cluster.fit_workers(client)
        assert len(fit) == 2
        task = functools.partial(_where, fit[1])
        targets = list(range(1, 7))

        def placed(out):
            assert sorted(out.results) == targets and not out.failed
            return {t: sorted(ws) for t, ws in out.workers.items()}

        where = placed(cluster.run_tasks(client, "/no/run", "h" * 64, targets, replicas=2, task=task))
        assert all(len(set(ws)) == 2 for ws in where.values()), where
        with pytest.raises(InputError, match="--replicas 3 needs 3 fit workers"):
            cluster.run_tasks(client, "/no/run", "h" * 64, targets, replicas=3, task=task)
        # the control: with one worker offered twice, both replicas of each step share it
        monkeypatch.setattr(cluster, "fit_workers", lambda c: [fit[0], fit[0]])
        where = placed(cluster.run_tasks(client, "/no/run", "g" * 64, targets, replicas=2, task=task))
        assert all(len(set(ws)) == 1 for ws in where.values()), where


def test_the_docs_slurm_example_builds_its_cluster_and_job_script():
    """docs/cluster.md's dask-jobqueue example, up to cluster construction: the
    SLURMCluster line as written (its scheduler held to loopback by configuration) and
    the job script it would submit.  ``scale`` needs sbatch and is not run here."""
    import re
    from pathlib import Path

    import dask

    dask_jobqueue = pytest.importorskip("dask_jobqueue")  # in the test extra
    text = (Path(__file__).resolve().parents[1] / "docs" / "cluster.md").read_text()
    block = re.search(r"```python\n(from dask_jobqueue import SLURMCluster\n.*?)```", text, re.S).group(1)
    build = block[: block.index("cluster.scale(")]
    assert "SLURMCluster(" in build and "NUMBA_NUM_THREADS" in build
    ns = {}
    with dask.config.set(
        {
            "jobqueue.slurm.scheduler-options": {
                "host": "127.0.0.1",
                "dashboard": False,
                "dashboard_address": "127.0.0.1:0",
            }
        }
    ):
        exec(compile(build, "docs/cluster.md", "exec"), ns)
    c = ns["cluster"]
    try:
        assert isinstance(c, dask_jobqueue.SLURMCluster)
        script = c.job_script()
        assert c.scheduler_address.startswith("tcp://127.0.0.1:")
        assert "#SBATCH" in script and "#SBATCH -t 04:00:00" in script
        assert "export NUMBA_NUM_THREADS=8" in script
        assert re.search(r"distributed\.cli\.dask_worker tcp://127\.0\.0\.1:\d+ .*--nthreads 8", script), script
        assert "--memory-limit" in script and "#SBATCH --mem=60G" in script, script
    finally:
        c.close()


def _slow_where(run_path, head, target, device=None, max_memory=None):
    import types

    from distributed import get_worker

    time.sleep(1.0)
    return {
        "step": target,
        "worker": get_worker().address,
        "platform": {},
        "seconds": 1.0,
        "bytes_read": None,
        "result": types.SimpleNamespace(verified=True, checked=[], divergence=None),
    }


def test_a_replica_whose_worker_dies_runs_on_another_worker(local2):
    """SIGKILL of a worker holding pinned replicas: the nanny restarts it under a new
    address, it proves fitness again, and the lost replicas run there, still on a
    different worker from each step's other replica."""
    targets = list(range(1, 5))
    result = {}
    with distributed.Client(local2) as client:
        client.wait_for_workers(2, timeout=TIMEOUT)
        cluster.prove_fitness(client, timeout=TIMEOUT)
        before = set(cluster.fit_workers(client))
        victim = sorted(before)[0]
        pid = client.run(os.getpid, workers=[victim])[victim]
        th = threading.Thread(
            target=lambda: result.setdefault(
                "out",
                cluster.run_tasks(client, "/no/run", "k" * 64, targets, replicas=2, task=_slow_where, rejoin=TIMEOUT),
            )
        )
        th.start()
        time.sleep(1.5)  # the first replicas are running
        os.kill(pid, signal.SIGKILL)
        th.join(TIMEOUT)
        assert not th.is_alive(), "run_tasks did not finish after the worker was killed"
    out = result["out"]
    assert sorted(out.results) == targets and not out.failed, (out.results, out.failed)
    assert all(len(set(ws)) == 2 for ws in out.workers.values()), out.workers
    ran = {w for ws in out.workers.values() for w in ws}
    assert ran - before, f"no replica ran on the restarted worker: {out.workers}"  # resubmitted there


class _Future:
    """A Dask future stand-in, done: its result, or (value None) a result that
    left with its dead worker and can never be fetched."""

    def __init__(self, value=None):
        self.value, self.status = value, "finished"

    def done(self):
        return True

    def result(self, timeout=None):
        if self.value is None:  # Dask would wait for the dead worker: forever without a timeout
            raise TimeoutError(f"no result within {timeout} s" if timeout else "waited forever")
        return self.value

    def cancel(self):
        self.status = "cancelled"

    def release(self):
        pass


def test_a_finished_replica_lost_with_its_worker_runs_again(monkeypatch):
    """The race behind a hang seen in CI: replica 0 of step 1 finished on
    worker a, which died before its result was fetched (Dask then waits for a,
    the replica being pinned there).  run_tasks must not wait: it runs the
    replica again on the worker that replaced a, still apart from replica 1."""
    import types

    fit = ["tcp://a", "tcp://b"]
    monkeypatch.setattr(cluster, "fit_workers", lambda client: list(fit))
    submitted = []

    class Client:
        def submit(self, fn, run_path, head, t, device, max_memory, *, key, workers, **kw):
            (w,) = workers
            submitted.append((key, w))
            if key == "refreplay-kkkkkkkkkkkk-1-0":
                fit[:] = ["tcp://b", "tcp://c"]  # a dies holding the result; its nanny brings it back as c
                return _Future()
            verdict = types.SimpleNamespace(verified=True, checked=[], divergence=None)
            return _Future(
                {"step": t, "worker": w, "platform": {}, "seconds": 1.0, "bytes_read": None, "result": verdict}
            )

    out = cluster.run_tasks(Client(), "/no/run", "k" * 64, [1], replicas=2, task=_slow_where, poll=0.01, rejoin=5)
    assert not out.failed and sorted(out.results) == [1], (out.failed, submitted)
    assert submitted == [
        ("refreplay-kkkkkkkkkkkk-1-0", "tcp://a"),
        ("refreplay-kkkkkkkkkkkk-1-1", "tcp://b"),
        ("refreplay-kkkkkkkkkkkk-1-0-again1", "tcp://c"),
    ], submitted
    assert sorted(out.workers[1]) == ["tcp://b", "tcp://c"], out.workers
