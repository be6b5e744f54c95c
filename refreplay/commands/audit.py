HELP = (
    "audit a published run: your key's signature of (chain head, beacon) picks the steps, replay each, "
    "write one signed certificate per step"
)


def add_arguments(p):
    p.add_argument("run", metavar="RUN", help="published run directory")
    p.add_argument("--sample", type=int, required=True, metavar="K", help="number of steps to certify")
    p.add_argument(
        "--beacon",
        required=True,
        metavar="HEX",
        help="a public random value published AFTER the run's chain head and your key's "
        "registration (e.g. a drand round)",
    )
    p.add_argument(
        "--key",
        required=True,
        metavar="FILE",
        help="your private key (refreplay keygen); it fixes your sample and signs the certificates",
    )
    p.add_argument("--auditor", metavar="ID", help="your name, recorded in certificates (default: key-<fingerprint>)")
    p.add_argument("--out", required=True, metavar="DIR", help="directory for the certificates")
    p.add_argument("--expect-head", metavar="HEX", help="the chain head published out of band")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.add_argument(
        "--max-memory",
        metavar="GIB",
        default=None,
        help="memory budget in GiB: state and gradients in memory-mapped files when a step "
        "would not fit (bits never change)",
    )
    p.add_argument(
        "--no-memory-check",
        action="store_true",
        help="audit even when a step's predicted memory exceeds what this machine has available "
        "(by default such a recipe is refused before anything is allocated)",
    )
    from ..training.backend import add_argument

    add_argument(p)
    from ._cluster import add_arguments as add_cluster_arguments  # issue 27

    add_cluster_arguments(p, estimate=True)


def run(args) -> int:
    import sys
    from pathlib import Path

    from .. import doctor, files
    from ..errors import InputError
    from ..training.backend import describe
    from ..training.run import open_run
    from ..verify import audit, keys
    from ..verify.replay import replay
    from .replay import check_head, memory_for, print_artifacts, progress_printer

    key = keys.load_private(args.key)
    if keys.readable_by_others(args.key):
        print(
            f"warning: {args.key} can be read by other users; anyone who reads it can sign as you "
            f"(chmod 600 {args.key})",
            file=sys.stderr,
        )
    auditor = args.auditor or f"key-{key.public.fingerprint[:16]}"
    if not audit.AUDITOR_RE.fullmatch(auditor):
        raise InputError("--auditor must be 1-64 characters of letters, digits, _ . @ -")
    r = open_run(args.run, strict=False)
    check_head(r, args.expect_head)
    head = r.head["chain_link"]
    sample = audit.draw_sample(key, head, args.beacon, r.recipe.steps, args.sample)
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise files.write_error(exc, out) from None
    print(f"run {args.run}: {r.recipe.steps} steps, chain head {head}")
    print(f"key {key.public.fingerprint} ({auditor})")
    print(f"sampled steps {sample.steps} (beacon {sample.beacon}; fixed by the key, the head and the beacon)")
    if args.cluster is not None or args.estimate:  # issue 27: the steps as Dask tasks
        from ._cluster import audit as audit_on_cluster

        return audit_on_cluster(args, r, sample, key, auditor, out)
    fp = doctor.fingerprint()
    fp["device"] = describe(args.device)
    memory = memory_for(args, r.recipe.model, r.recipe.train)
    bad = 0
    for s in sample.steps:
        res = replay(r, s, progress_printer(args.quiet), args.device, memory)
        cert = audit.certify_step(r, s, res, sample, key, auditor, fp)
        path = audit.write_certificate(out, cert)
        bad += cert["verdict"] != "verified"
        print(f"  step {s}: {cert['verdict'].upper()}  -> {path}")
        print_artifacts(res, "  ")
        for line in cert.get("mismatch", {}).get("lines", []):
            print(f"    {line}")
    print(f"{len(sample.steps) - bad} of {len(sample.steps)} sampled steps verified")
    return 0 if bad == 0 else 1
