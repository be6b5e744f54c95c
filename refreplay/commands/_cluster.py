"""``--cluster``: the audit's sampled steps, or a replayed segment, as Dask
tasks (``refreplay.verify.cluster``); shared by ``audit`` and ``replay``."""


def add_arguments(p, estimate: bool):
    p.add_argument("--cluster", metavar="SPEC", default=None,
                   help="replay on Dask workers: local:N (N worker processes here, loopback) or "
                        "tcp://HOST:PORT (an existing scheduler; the run directory must be readable by "
                        "every worker at the same path). Default: in this process")
    p.add_argument("--replicas", type=int, default=1, metavar="R",
                   help="with --cluster: replay each step R times; differing results are a disagreement")
    p.add_argument("--retries", type=int, default=2, metavar="N",
                   help="with --cluster: reruns of a task that raised (a killed worker's task is rerun "
                        "by the scheduler in any case)")
    if estimate:
        p.add_argument("--estimate", action="store_true",
                       help="print the predicted cost (cluster-wide with --cluster) and exit without replaying")


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


def print_estimate(args, r, targets) -> int:
    """The cluster-wide cost: every task's steps at the calibrated time per
    step, spread over the workers longest first."""
    from ..training import estimate
    from ..verify import cluster

    c = estimate.estimate(r.recipe.model, r.recipe.train)
    lengths = sorted((cluster.steps_replayed(r.checkpoints, t) for t in targets), reverse=True)
    n = workers_of(args.cluster)
    busy = [0] * n
    for steps in lengths:  # longest task first, to the least busy worker
        busy[busy.index(min(busy))] += steps
    for line in c.lines(None):
        print(line)
    total = sum(lengths)
    print(f"{len(targets)} task(s), {total} step(s) replayed in all: {total * c.seconds:.1f} s in one process")
    print(f"on {n} worker(s): about {max(busy) * c.seconds:.1f} s (each worker one replay at a time, "
          f"{c.seconds:.1f} s per step measured here; the longest task alone {lengths[0] * c.seconds:.1f} s)")
    return 0


def _progress(quiet, total, what):
    """One line for the whole job: done/total and the ETA from the rate so far."""
    import sys
    import time

    if quiet or not sys.stderr.isatty():
        return lambda done: None
    t0 = time.perf_counter()

    def show(done):
        eta = (time.perf_counter() - t0) / done * (total - done) if done else float("nan")
        print(f"\r{what} {done}/{total}  ETA {eta:.0f} s", end="" if done < total else "\n",
              file=sys.stderr, flush=True)
    show(0)
    return show


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
    return client, lc


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
    head = r.head["chain_link"]
    show = _progress(args.quiet, len(steps), "audit: steps settled")
    bad = [0]

    def settled(t, out):
        if t in out.results:
            x = out.results[t]
            cert, path = cluster.certify_and_write(r, t, x["result"], x["platform"], sample, key, auditor,
                                                   out_dir)
            bad[0] += cert["verdict"] != "verified"
            print(f"  step {t}: {cert['verdict'].upper()}  -> {path}  (worker {x['worker']})")
            print_artifacts(x["result"], "  ")
            for line in cert.get("mismatch", {}).get("lines", []):
                print(f"    {line}")
        show(len(out.results) + len(out.failed) + len(out.disagreements) + len(out.errors))

    client, lc = _start(args)
    try:
        out = cluster.run_tasks(client, r.path, head, steps, device=args.device, max_memory=args.max_memory,
                                replicas=args.replicas, retries=args.retries, on_settled=settled)
    finally:
        cluster.close(client, lc)
    _report_unsettled(out, "step")
    print(f"{len(out.results) - bad[0]} of {len(steps)} sampled steps verified"
          + (f"; {len(steps) - len(out.results)} not certified" if len(out.results) < len(steps) else ""))
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
    show = _progress(args.quiet, len(targets), "replay: segments settled")
    bad = [0]

    def settled(t, out):
        if t in out.results:
            res = out.results[t]["result"]
            bad[0] += not res.verified
            print(f"  steps {res.start + 1}..{t}: {'VERIFIED' if res.verified else 'MISMATCH'}"
                  f"  (worker {out.results[t]['worker']})")
            if res.divergence is not None:
                for line in res.divergence.lines():
                    print(f"    {line}")
        show(len(out.results) + len(out.failed) + len(out.disagreements) + len(out.errors))

    if args.cluster is None:
        out = cluster.Outcome()
        for t in targets:
            cluster.settle(t, [cluster.replay_task(str(r.path), head, t, args.device, args.max_memory)], out)
            settled(t, out)
    else:
        client, lc = _start(args)
        try:
            out = cluster.run_tasks(client, r.path, head, targets, device=args.device, max_memory=args.max_memory,
                                    replicas=args.replicas, retries=args.retries, on_settled=settled)
        finally:
            cluster.close(client, lc)
    _report_unsettled(out, "segment ending at step")
    ok = not bad[0] and len(out.results) == len(targets)
    print(f"VERIFIED: steps {first}..{last} reproduce bit for bit" if ok else
          f"NOT VERIFIED: steps {first}..{last} (see above)")
    return _exit(out, bad[0])
