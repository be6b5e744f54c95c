HELP = ("audit a published run: pick steps from a public beacon and your secret, replay each, "
        "write one certificate per step")


def add_arguments(p):
    p.add_argument("run", metavar="RUN", help="published run directory")
    p.add_argument("--sample", type=int, required=True, metavar="K", help="number of steps to certify")
    p.add_argument("--beacon", required=True, metavar="HEX",
                   help="a public random value published AFTER the run's chain head (e.g. a drand round)")
    p.add_argument("--auditor", required=True, metavar="ID", help="your name or key id, recorded in certificates")
    p.add_argument("--secret", metavar="HEX",
                   help="your secret (hex); default: 16 fresh random bytes. It is revealed in the "
                        "certificates so that anyone can re-check which steps it selected")
    p.add_argument("--out", required=True, metavar="DIR", help="directory for the certificates")
    p.add_argument("--expect-head", metavar="HEX", help="the chain head published out of band")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.add_argument("--max-memory", metavar="GIB", default=None,
                   help="memory budget in GiB: state and gradients in memory-mapped files when a step "
                        "would not fit (bits never change)")
    from ..training.backend import add_argument

    add_argument(p)
    from ._cluster import add_arguments as add_cluster_arguments  # issue 27

    add_cluster_arguments(p, estimate=True)


def run(args) -> int:
    import json
    import os
    from pathlib import Path

    from .. import __version__, doctor, spec
    from ..verify import audit
    from ..errors import InputError
    from ..training.backend import describe
    from ..training.run import open_run
    from ..verify.replay import replay
    from .replay import check_head, memory_for, print_artifacts, progress_printer

    if not audit.AUDITOR_RE.fullmatch(args.auditor):
        raise InputError("--auditor must be 1-64 characters of letters, digits, _ . @ -")
    r = open_run(args.run, strict=False)
    check_head(r, args.expect_head)
    head = r.head["chain_link"]
    secret = args.secret or os.urandom(16).hex()
    steps = audit.sample_steps(head, args.beacon, secret, r.recipe.steps, args.sample)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"run {args.run}: {r.recipe.steps} steps, chain head {head}")
    print(f"sampled steps {steps} (beacon {args.beacon}, secret {secret})")
    if args.cluster is not None or args.estimate:  # issue 27: the steps as Dask tasks
        from ._cluster import audit as audit_on_cluster

        return audit_on_cluster(args, r, steps, secret, out)
    fp = doctor.fingerprint()
    fp["device"] = describe(args.device)
    memory = memory_for(args, r.recipe.model, r.recipe.train)
    bad = 0
    for s in steps:
        res = replay(r, s, progress_printer(args.quiet), args.device, memory)
        pub = r.records[s]
        published = {"state_root": pub.state_root, "data_hash": pub.data_hash, "chain_link": pub.chain_link}
        if res.verified:
            replayed, verdict, mismatch = dict(published), "verified", None
        else:
            bad += 1
            verdict = "mismatch"
            replayed = {"state_root": None, "data_hash": None, "chain_link": None}
            mismatch = {"step": res.divergence.step, "kind": res.divergence.kind,
                        "lines": res.divergence.lines()}
        cert = audit.make_certificate(
            run={"chain_head": head, "recipe_sha256": r.recipe_sha256, "steps": r.recipe.steps},
            step=s, verdict=verdict, replayed=replayed, published=published,
            sampling={"beacon": args.beacon, "secret": secret, "k": args.sample, "steps": steps},
            auditor=args.auditor, spec_version=spec.version(), spec_sha256=spec.spec_sha256(),
            refreplay_version=__version__, platform=fp, mismatch=mismatch,
            checked=audit.replay_evidence(res),
            warnings=res.warnings)
        path = out / f"cert-{args.auditor}-step-{s:07d}.json"
        path.write_text(json.dumps(cert, indent=1, sort_keys=True) + "\n")
        print(f"  step {s}: {verdict.upper()}  -> {path}")
        print_artifacts(res, "  ")
        if mismatch:
            for line in mismatch["lines"]:
                print(f"    {line}")
    print(f"{len(steps) - bad} of {len(steps)} sampled steps verified")
    return 0 if bad == 0 else 1
