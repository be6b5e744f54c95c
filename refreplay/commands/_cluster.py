"""``--cluster``: the audit's sampled steps, or a replayed segment, as Dask
tasks (``refreplay.verify.cluster``); shared by ``audit`` and ``replay``."""


def add_arguments(p, estimate: bool):
    p.add_argument(
        "--cluster",
        metavar="SPEC",
        default=None,
        help="replay on Dask workers: local:N (N worker processes here, loopback) or "
        "tcp://HOST:PORT (an existing scheduler; the run directory must be readable by "
        "every worker at the same path). Default: in this process",
    )
    p.add_argument(
        "--replicas",
        type=int,
        default=1,
        metavar="R",
        help="with --cluster: replay each step R times; differing results are a disagreement",
    )
    p.add_argument(
        "--retries",
        type=int,
        default=2,
        metavar="N",
        help="with --cluster: reruns of a task that raised (a killed worker's task is rerun "
        "by the scheduler in any case)",
    )
    if estimate:
        p.add_argument(
            "--estimate",
            action="store_true",
            help="print the predicted cost (cluster-wide with --cluster) and exit without replaying",
        )


def _check(args):
    from ..errors import InputError

    if not 1 <= args.replicas <= 8:
        raise InputError(f"--replicas must be between 1 and 8, got {args.replicas}")
    if not 0 <= args.retries <= 10:
        raise InputError(f"--retries must be between 0 and 10, got {args.retries}")


def workers_of(spec_text) -> int:
    """How many workers --cluster names (connecting to a scheduler to count)."""
    from ..verify import cluster

    if spec_text is None:
        return 1
    kind, value = cluster.parse_cluster(spec_text)
    if kind == "local":
        return value
    client, _ = cluster.connect(spec_text)
    try:
        return max(1, len(client.scheduler_info().get("workers", {})))
    finally:
        client.close()


def cluster_seconds(checkpoints, targets, workers: int, per_step: float) -> tuple[float, float, int]:
    """(total seconds in one process, predicted wall seconds on ``workers``,
    steps replayed): every task's steps at ``per_step`` seconds, tasks
    placed longest first on the least busy worker."""
    from ..verify import cluster

    lengths = sorted((cluster.steps_replayed(checkpoints, t) for t in targets), reverse=True)
    busy = [0] * max(1, workers)
    for steps in lengths:
        busy[busy.index(min(busy))] += steps
    return sum(lengths) * per_step, max(busy) * per_step, sum(lengths)


def print_estimate(args, r, targets) -> int:
    """The cluster-wide cost, from the calibrated time per step."""
    from ..training import estimate
    from ..verify import cluster

    c = estimate.estimate(r.recipe.model, r.recipe.train)
    n = workers_of(args.cluster)
    serial, wall, total = cluster_seconds(r.checkpoints, targets, n, c.seconds)
    longest = max(cluster.steps_replayed(r.checkpoints, t) for t in targets)
    for line in c.lines(None):
        print(line)
    print(f"{len(targets)} task(s), {total} step(s) replayed in all: {serial:.1f} s in one process")
    print(
        f"on {n} worker(s): about {wall:.1f} s (each worker one replay at a time, "
        f"{c.seconds:.1f} s per step measured here; the longest task alone {longest * c.seconds:.1f} s)"
    )
    return 0


def _progress(quiet, total, what, predict=None, stream=None):
    """One line for the whole job: done/total and the ETA, from the
    estimate (``predict()``: predicted wall seconds, called only when the
    line is shown) until the first task is in, then from the rate so far."""
    import sys
    import time

    stream = sys.stderr if stream is None else stream
    if quiet or not stream.isatty():
        return lambda done: None
    predicted = predict() if predict else None
    t0 = time.perf_counter()

    def show(done):
        elapsed = time.perf_counter() - t0
        if done:
            eta = f"{elapsed / done * (total - done):.0f} s"
        else:
            eta = "?" if predicted is None else f"{max(0.0, predicted - elapsed):.0f} s (estimate)"
        print(f"\r{what} {done}/{total}  ETA {eta}", end="" if done < total else "\n", file=stream, flush=True)

    show(0)
    return show


def _predictor(r, targets, workers):
    def predict():
        from ..training import estimate

        c = estimate.estimate(r.recipe.model, r.recipe.train)
        return cluster_seconds(r.checkpoints, targets, workers, c.seconds)[1]

    return predict


def _start(args):
    from ..verify import cluster

    client, lc = cluster.connect(args.cluster)
    try:
        reports = cluster.prove_fitness(client)
    except BaseException:
        cluster.close(client, lc)
        raise
    for addr, rep in sorted(reports.items()):
        if rep["fit"]:
            print(f"worker {addr}: fit ({cluster.fingerprint_id(rep['platform'])})")
        else:
            print(f"worker {addr}: UNFIT, gets no task: {'; '.join(rep['failed'])}")
    return client, lc, sum(rep["fit"] for rep in reports.values())


def _run(args, r, targets, settled, what):
    """Start or reach the cluster, prove fitness, run the tasks, close."""
    from ..errors import InputError
    from ..verify import cluster

    try:
        client, lc, fit = _start(args)
        try:
            show = _progress(args.quiet, len(targets), what, _predictor(r, targets, fit))

            def on_settled(t, out):
                settled(t, out)
                show(len(out.results) + len(out.failed) + len(out.disagreements) + len(out.errors))

            return cluster.run_tasks(
                client,
                r.path,
                r.head["chain_link"],
                targets,
                device=args.device,
                max_memory=args.max_memory,
                replicas=args.replicas,
                retries=args.retries,
                on_settled=on_settled,
            )
        finally:
            cluster.close(client, lc)
    except (OSError, TimeoutError) as exc:  # distributed's CommClosedError is an OSError
        raise InputError(f"the Dask cluster {args.cluster} failed: {type(exc).__name__}: {exc}") from None


def _report_unsettled(out, name):
    for t, lines in sorted(out.disagreements.items()):
        print(f"  {name} {t}: DISAGREEMENT between workers")
        for line in lines:
            print(f"    {line}")
    for t, why in sorted(out.failed.items()):
        print(f"  {name} {t}: FAILED on every try, not certified: {why}")
    for t, why in sorted(out.errors.items()):
        print(f"  {name} {t}: cannot be replayed: {why}")


def _exit(out, bad) -> int:
    if bad or out.failed or out.disagreements:
        return 1
    return 2 if out.errors else 0


def audit(args, r, sample, key, auditor, out_dir) -> int:
    """``audit --cluster``: the sampled steps as tasks; the client writes the certificates."""
    from ..verify import cluster
    from .replay import print_artifacts

    _check(args)
    steps = sample.steps
    if getattr(args, "estimate", False):
        return print_estimate(args, r, steps)
    bad = [0]

    def settled(t, out):
        if t in out.results:
            x = out.results[t]
            cert, path = cluster.certify_and_write(r, t, x["result"], x["platform"], sample, key, auditor, out_dir)
            bad[0] += cert["verdict"] != "verified"
            print(f"  step {t}: {cert['verdict'].upper()}  -> {path}  (worker {x['worker']})")
            print_artifacts(x["result"], "  ")
            for line in cert.get("mismatch", {}).get("lines", []):
                print(f"    {line}")

    out = _run(args, r, steps, settled, "audit: steps settled")
    _report_unsettled(out, "step")
    print(
        f"{len(out.results) - bad[0]} of {len(steps)} sampled steps verified"
        + (f"; {len(steps) - len(out.results)} not certified" if len(out.results) < len(steps) else "")
    )
    return _exit(out, bad[0])


def parse_steps(text, n_steps):
    from ..errors import InputError

    a, sep, b = text.partition(":")
    if not sep or not a.isdigit() or not b.isdigit() or not 1 <= int(a) <= int(b) <= n_steps:
        raise InputError(f"--steps must be A:B with 1 <= A <= B <= {n_steps}, got {text!r}")
    return int(a), int(b)


def replay_segment(args, r) -> int:
    """``replay --steps A:B``: the segment split at checkpoints, one task per
    piece, on the cluster or (no --cluster) one after another here."""
    from ..verify import cluster

    _check(args)
    first, last = parse_steps(args.steps, r.recipe.steps)
    targets = cluster.segment_targets(r.checkpoints, first, last)
    head = r.head["chain_link"]
    print(f"run {args.run}: steps {first}..{last} in {len(targets)} task(s) ending at {targets}")
    if args.estimate:
        return print_estimate(args, r, targets)
    bad = [0]

    def settled(t, out):
        if t in out.results:
            res = out.results[t]["result"]
            bad[0] += not res.verified
            print(
                f"  steps {res.start + 1}..{t}: {'VERIFIED' if res.verified else 'MISMATCH'}"
                f"  (worker {out.results[t]['worker']})"
            )
            if res.divergence is not None:
                for line in res.divergence.lines():
                    print(f"    {line}")

    if args.cluster is None:
        show = _progress(args.quiet, len(targets), "replay: segments settled", _predictor(r, targets, 1))
        out = cluster.Outcome()
        for t in targets:
            cluster.settle(t, [cluster.replay_task(str(r.path), head, t, args.device, args.max_memory)], out)
            settled(t, out)
            show(len(out.results) + len(out.errors))
    else:
        out = _run(args, r, targets, settled, "replay: segments settled")
    _report_unsettled(out, "segment ending at step")
    ok = not bad[0] and len(out.results) == len(targets)
    print(
        f"VERIFIED: steps {first}..{last} reproduce bit for bit"
        if ok
        else f"NOT VERIFIED: steps {first}..{last} (see above)"
    )
    return _exit(out, bad[0])
