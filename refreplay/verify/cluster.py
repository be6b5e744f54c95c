"""Replay and audit on a Dask cluster whose workers can be unfit or fail.

The unit of work is a *task*: replay one target step of a run directory
that every worker can read (a shared filesystem) from the nearest usable
checkpoint before it, exactly as the serial ``replay`` does.  A task is a
plain function submitted with ``client.submit``; the worker returns the
replay evidence (the ``ReplayResult``) and its platform fingerprint, never a
certificate: the client builds, signs and writes the certificates
(``certify_and_write``), so the auditor's private key never leaves the
client.

Fitness before work: a worker plugin runs the ``doctor`` checks on every
worker when it joins (again after a restart), in the worker's task thread
(FTZ/DAZ are per-thread), and compares its refreplay version, source hash
and spec with the client's.  Only a fit worker gets the resource
``refreplay``; every task needs one unit of it, so an unfit worker never
runs a task, and a fit one runs one replay at a time.

Faults: a worker that dies mid-task has its task rerun elsewhere by the
scheduler (``distributed.scheduler.allowed-failures``); a task that raises
is retried (``retries``).  A step whose task fails on every try is reported
by name; a bad run (``InputError``) is not retried.  With ``replicas`` > 1
a step runs as several tasks on different workers, and results that differ are a disagreement
naming both workers' platform fingerprints; the replicas of a step are
pinned to distinct workers (``run_tasks``).  Bits never depend on the
number of workers: each task is the serial replay of its step
([step.verified.r2]).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field

from ..errors import InputError

RESOURCE = "refreplay"  # one unit per fit worker; each task takes one
PLUGIN = "refreplay-fitness"
FETCH_S = 10.0  # seconds to fetch a finished replica's result (a small dict) before it counts as lost


# ---- which steps, in which tasks ---------------------------------------------------


def segment_targets(checkpoints, first: int, last: int) -> list[int]:
    """The target steps that certify every step of first..last: each
    checkpoint step inside the segment, and the last step.  Task t replays
    from the checkpoint before it, so consecutive targets share no step."""
    return sorted({k for k in checkpoints if first <= k < last} | {last})


def steps_replayed(checkpoints, target: int) -> int:
    """How many steps a task for ``target`` recomputes (from the checkpoint before it)."""
    return target - max(k for k in checkpoints if k < target)


# ---- fitness --------------------------------------------------------------------------


def identity() -> dict:
    """What a worker must share with the client: the code and the spec."""
    from .. import __version__, _env, spec

    return {
        "refreplay": __version__,
        "source_sha256": _env.SOURCE_HASH,
        "spec_version": spec.version(),
        "spec_sha256": spec.spec_sha256(),
    }


def fitness(expected: dict) -> dict:
    """The doctor checks in this thread, the identity against the client's
    and usable Numba threads: {"fit", "failed" (details), "platform"}."""
    from numba.core import config

    from .. import doctor

    failed = [f"{f.check}: {f.detail}" for f in doctor.run_checks() if not f.ok]
    mine = identity()
    failed += [f"{k} is {mine[k]}, the client's is {v}" for k, v in expected.items() if mine.get(k) != v]
    threads = int(config.NUMBA_NUM_THREADS)
    if threads < 1:
        failed.append(f"NUMBA_NUM_THREADS is {threads}")
    return {"fit": not failed, "failed": failed, "platform": doctor.fingerprint()}


def fitness_plugin(expected: dict):
    """A Dask worker plugin: prove fitness on joining; only then take work."""
    from distributed import WorkerPlugin

    class Fitness(WorkerPlugin):
        name = PLUGIN

        def __init__(self, expected):
            self.expected = expected

        async def setup(self, worker):
            import asyncio

            pool = worker.executors["default"]  # the task thread: FTZ/DAZ are per thread
            try:
                report = await asyncio.get_running_loop().run_in_executor(pool, fitness, self.expected)
            except Exception as exc:  # a worker that cannot even run the checks is unfit, and says why
                report = {
                    "fit": False,
                    "failed": [f"the fitness checks raised {type(exc).__name__}: {exc}"],
                    "platform": {},
                }
            worker.refreplay_fitness = report
            if report["fit"]:
                await worker.set_resources(**{RESOURCE: 1})

    return Fitness(expected)


def _report(dask_worker):
    return getattr(dask_worker, "refreplay_fitness", None)


def prove_fitness(client, timeout: float = 120.0) -> dict[str, dict]:
    """Register the plugin and wait until every worker has reported;
    address -> report.  ``InputError`` when no worker is fit."""
    client.register_plugin(fitness_plugin(identity()), name=PLUGIN)
    t0 = time.monotonic()
    while True:
        reports = client.run(_report)
        if reports and all(r is not None for r in reports.values()):
            break
        if time.monotonic() - t0 > timeout:
            raise InputError(f"workers did not report fitness within {timeout:.0f} s")
        time.sleep(0.2)
    if not any(r["fit"] for r in reports.values()):
        raise InputError(
            "no worker of the cluster is fit to replay: "
            + "; ".join(f"{a}: {', '.join(r['failed'])}" for a, r in sorted(reports.items()))
        )
    return reports


# ---- the task ------------------------------------------------------------------------------


def _bytes_read() -> int | None:
    try:
        with open("/proc/self/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))
    except (OSError, StopIteration, ValueError):
        return None


def replay_task(run_path: str, head: str, target: int, device=None, max_memory=None) -> dict:
    """On a worker: replay ``target`` of the run at ``run_path`` (which must
    have chain head ``head``); the replay result and this worker's platform."""
    from .. import doctor
    from ..training import budget, estimate
    from ..training.backend import describe
    from ..training.run import open_run
    from .replay import replay

    t0, read0 = time.perf_counter(), _bytes_read()
    out = {"step": target, "worker": _address()}
    try:
        r = open_run(run_path, strict=False)
        if r.head["chain_link"] != head:
            raise InputError(
                f"the run at {run_path} on this worker has chain head {r.head['chain_link']}, not the client's {head}"
            )
        # the step must fit this worker's memory, checked before anything is allocated
        limit = None if max_memory is None else budget.parse_gib(max_memory)
        c = estimate.cost(r.recipe.model, r.recipe.train)
        memory = budget.plan(
            c.peak_ram,
            c.peak_mapped,
            limit,
            budget.available_memory(),
            f"a step of this recipe on worker {out['worker']}",
        )
        memory = memory if limit is not None else None
        platform = doctor.fingerprint()
        platform["device"] = describe(device)
        res = replay(r, target, None, device, memory)
    except InputError as exc:  # the same on every worker: not retried
        return {**out, "error": str(exc)}
    read1 = _bytes_read()
    return {
        **out,
        "result": res,
        "platform": platform,
        "seconds": time.perf_counter() - t0,
        "bytes_read": None if read0 is None or read1 is None else read1 - read0,
    }


def _address():
    try:
        from distributed import get_worker

        return get_worker().address
    except (ImportError, ValueError):
        return "local"


# ---- running the tasks -----------------------------------------------------------------------


def fingerprint_id(platform: dict) -> str:
    """A short name for a platform fingerprint: its CPU and a digest."""
    digest = hashlib.sha256(json.dumps(platform, sort_keys=True).encode()).hexdigest()[:12]
    return f"{platform.get('cpu_model', '?')} [{digest}]"


def _evidence(res) -> tuple:
    """What two replays of one step must agree on."""
    div = None if res.divergence is None else (res.divergence.step, res.divergence.kind)
    return res.verified, tuple((c.step, c.state_root, c.chain_link) for c in res.checked), div


@dataclass
class Outcome:
    """Per target step: the results, the steps that failed on every try, the
    steps whose replicas disagreed, and the bad-input errors."""

    results: dict[int, dict] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)
    disagreements: dict[int, list[str]] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)
    task_seconds: list[float] = field(default_factory=list)
    bytes_read: list[int] = field(default_factory=list)
    workers: dict[int, list[str]] = field(default_factory=dict)  # per target: the workers its tries ran on


def fit_workers(client) -> list[str]:
    """Addresses of the workers that hold the ``refreplay`` resource (proved fit), sorted."""
    info = client.scheduler_info(n_workers=-1).get("workers", {})
    return sorted(a for a, w in info.items() if w.get("resources", {}).get(RESOURCE, 0) >= 1)


def run_tasks(
    client,
    run_path,
    head,
    targets,
    *,
    device=None,
    max_memory=None,
    replicas=1,
    retries=2,
    on_settled=None,
    task=None,
    poll: float = 0.05,
    rejoin: float = 120.0,
) -> Outcome:
    """Replay every target on the fit workers; ``on_settled(target, outcome)``
    as soon as each target's tries are all in (certificates are written
    then, not at the end).

    With ``replicas`` > 1 the replicas of one step run on different workers:
    each is pinned to one fit worker (``workers=[w]``,
    ``allow_other_workers=False``), the R replicas of a step to R distinct
    ones, so a disagreement always compares two processes.  A pinned worker
    that leaves the cluster (killed; a nanny's restart comes back under a new
    address) has its replica submitted again to a fit worker that none of the
    step's other replicas is pinned to, waiting up to ``rejoin`` seconds for
    one to be fit (a restarted worker proves fitness again first); after
    that the replica is a failed try.  A replica that finished but whose
    result cannot be fetched within FETCH_S (its worker died holding it, or
    the task was cancelled) is run again the same way.  ``InputError`` when
    fewer than R workers are fit."""
    import os

    from distributed import as_completed

    run_path = os.path.abspath(run_path)  # the same path on every worker of a shared filesystem
    fn = task or replay_task
    got: dict[int, list[dict]] = {t: [] for t in targets}
    out = Outcome()

    def done(f, t, value=None):
        if f.status == "error":
            exc = f.exception()
            got[t].append({"failed": f"{type(exc).__name__}: {exc}"})
        else:
            got[t].append(f.result() if value is None else value)
            out.workers.setdefault(t, []).append(got[t][-1].get("worker"))
        f.release()
        if len(got[t]) == replicas:
            settle(t, got[t], out)
            if on_settled:
                on_settled(t, out)

    if replicas == 1:
        futures = {
            client.submit(
                fn,
                str(run_path),
                head,
                t,
                device,
                max_memory,
                key=f"refreplay-{head[:12]}-{t}-0",
                resources={RESOURCE: 1},
                retries=retries,
                pure=False,
            ): t
            for t in targets
        }
        for f in as_completed(list(futures)):
            done(f, futures[f])
        return out

    fit = fit_workers(client)
    if len(fit) < replicas:
        raise InputError(
            f"--replicas {replicas} needs {replicas} fit workers on different processes; "
            f"the cluster has {len(fit)} fit worker(s)"
        )
    pinned: dict = {}  # future -> (target, replica, worker)
    tries: dict[tuple[int, int], int] = {}
    lost: dict = {}  # future -> when its pinned worker was first seen gone
    assigned: dict[tuple[int, int], str] = {}  # (target, replica) -> the worker it is, or was, pinned to

    def submit(t, rep, w):
        n = tries[(t, rep)] = tries.get((t, rep), -1) + 1
        f = client.submit(
            fn,
            str(run_path),
            head,
            t,
            device,
            max_memory,
            key=f"refreplay-{head[:12]}-{t}-{rep}" + (f"-again{n}" if n else ""),
            resources={RESOURCE: 1},
            workers=[w],
            allow_other_workers=False,
            retries=retries,
            pure=False,
        )
        pinned[f] = (t, rep, w)
        assigned[(t, rep)] = w

    for i, t in enumerate(targets):
        for rep in range(replicas):
            submit(t, rep, fit[(i + rep) % len(fit)])  # R consecutive workers: R distinct ones
    last_check = time.monotonic()
    stranded: set = set()  # done, but its result cannot be fetched: it left with its worker, or was cancelled
    while pinned:
        progressed = False
        for f in [f for f in pinned if f.done() and f not in stranded]:
            t, _, w = pinned[f]
            value = None
            if f.status != "error":
                try:  # a finished replica whose worker dies before the fetch waits for that worker forever
                    value = f.result(timeout=FETCH_S)
                except Exception:  # noqa: BLE001 -- timeout, cancelled, lost: run it again (below)
                    stranded.add(f)
                    continue
            pinned.pop(f)
            done(f, t, value)
            progressed = True
        if progressed:
            continue
        time.sleep(poll)
        if time.monotonic() - last_check < 1.0:
            continue
        last_check = time.monotonic()
        alive = set(fit_workers(client))
        for f, (t, rep, w) in list(pinned.items()):
            if w in alive and f not in stranded:
                continue
            others = {w2 for (t2, r2), w2 in assigned.items() if t2 == t and r2 != rep}
            free = sorted(alive - others)
            gone = time.monotonic() - lost.setdefault(f, time.monotonic())
            if not free and gone < rejoin and tries[(t, rep)] < retries + 1:
                continue  # wait for a restarted or new worker to prove fit
            lost.pop(f, None)
            if not free or tries[(t, rep)] >= retries + 1:
                pinned.pop(f)
                stranded.discard(f)
                f.cancel()
                got[t].append(
                    {
                        "failed": f"replica {rep}: its worker {w} left the cluster and no other fit "
                        "worker was free of the step's other replicas"
                    }
                )
                if len(got[t]) == replicas:
                    settle(t, got[t], out)
                    if on_settled:
                        on_settled(t, out)
                continue
            pinned.pop(f)
            stranded.discard(f)
            f.cancel()
            submit(t, rep, free[0])
    return out


def settle(t: int, tries: list[dict], out: Outcome) -> None:
    ok = [x for x in tries if "result" in x]
    for x in tries:
        if "error" in x:
            out.errors[t] = x["error"]
            return
    if not ok:
        out.failed[t] = "; ".join(x["failed"] for x in tries)
        return
    for x in ok:
        out.task_seconds.append(x["seconds"])
        if x["bytes_read"] is not None:
            out.bytes_read.append(x["bytes_read"])
    first = ok[0]
    differ = [x for x in ok[1:] if _evidence(x["result"]) != _evidence(first["result"])]
    if differ:
        out.disagreements[t] = [
            f"{'VERIFIED' if x['result'].verified else 'MISMATCH'} on worker {x['worker']}, "
            f"platform {fingerprint_id(x['platform'])}"
            for x in [first] + differ
        ]
        return
    if len(ok) < len(tries):
        out.failed[t] = "; ".join(x["failed"] for x in tries if "failed" in x)
        return
    out.results[t] = first


# ---- certificates (the client's side) ---------------------------------------------------------


def certify_and_write(run, step: int, res, platform: dict, sample, key, auditor: str, out_dir):
    """The seam to the certificate API: the client signs and writes one
    step's certificate through the serial audit's one certificate maker and
    writer (``audit.certify_step``, ``audit.write_certificate``), from a
    worker's replay result and platform.  Returns (cert, path)."""
    from . import audit

    cert = audit.certify_step(run, step, res, sample, key, auditor, platform)
    return cert, audit.write_certificate(out_dir, cert)


# ---- the cluster itself -----------------------------------------------------------------------


def parse_cluster(text: str):
    """``local:N`` -> ("local", N); ``tcp://HOST:PORT`` -> ("tcp", address)."""
    if text.startswith("local:"):
        n = text[len("local:") :]
        if not n.isdigit() or not 1 <= int(n) <= 256:
            raise InputError(f"--cluster local:N needs N between 1 and 256, got {text!r}")
        return "local", int(n)
    if text.startswith("tcp://") and len(text) <= 300 and text.count(":") == 2 and text.rsplit(":", 1)[1].isdigit():
        return "tcp", text
    raise InputError(f"--cluster must be local:N or tcp://HOST:PORT, got {text!r}")


def connect(spec_text: str, timeout: float = 60.0):
    """(client, cluster or None): a LocalCluster of N one-thread worker
    processes on loopback, or a client of an existing scheduler."""
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise InputError("--cluster needs Dask: pip install 'refreplay[cluster]'") from None
    kind, value = parse_cluster(spec_text)
    if kind == "tcp":
        try:
            return Client(value, timeout=timeout), None
        except (OSError, TimeoutError) as exc:
            raise InputError(f"cannot reach the Dask scheduler at {value}: {exc}") from None
    cluster = LocalCluster(
        n_workers=value,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address=None,
        env={"NUMBA_NUM_THREADS": "1"},
    )
    return Client(cluster, timeout=timeout), cluster


def close(client, cluster) -> None:
    client.close()
    if cluster is not None:
        cluster.close()
