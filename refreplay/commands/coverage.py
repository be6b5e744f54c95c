HELP = (
    "combine auditors' certificates for a run: count those signed by trusted keys (one auditor per key), "
    "report coverage and escape probabilities"
)


def add_arguments(p):
    p.add_argument("run", metavar="RUN", help="published run directory")
    p.add_argument("certs", nargs="+", metavar="CERT", help="certificate files (JSON) or directories of them")
    p.add_argument(
        "--trust",
        required=True,
        nargs="+",
        metavar="KEYS",
        help="the auditors' public keys registered before the beacon: PEM files (or lines of hex "
        "DER) or directories of *.pem files; certificates of any other key are rejected",
    )
    p.add_argument("--beacon", metavar="HEX", help="the audit's beacon: certificates sampled with another are rejected")
    p.add_argument(
        "--tampered",
        type=int,
        nargs="+",
        default=None,
        metavar="T",
        help="numbers of tampered steps to quote escape probabilities for (default 1 2 5 10)",
    )
    p.add_argument("--plot", metavar="FILE.png", help="draw steps, certified steps and the loss curve (matplotlib)")


def _load(paths):
    """(name, parsed JSON or a problem text) for every certificate file given
    or found in a given directory; a file that is not a regular file, too
    large or not well-formed JSON is listed with its problem (and rejected)."""
    from pathlib import Path

    from .. import untrusted
    from ..errors import InputError

    out = []
    for p in map(Path, paths):
        if not p.exists():
            raise InputError(f"certificate not found: {p}")
        files = sorted(p.glob("*.json")) if p.is_dir() else [p]
        root = p if p.is_dir() else None  # a link in a directory of certificates must stay inside it
        for f in files:
            try:
                out.append((str(f), untrusted.load_json(f, root, "certificate", CERT_LIMIT)))
            except InputError as exc:
                out.append((str(f), exc))  # rejected by coverage, with this reason
    if not out:
        raise InputError("no certificate files given")
    return out


CERT_LIMIT = 16 << 20  # bytes; a certificate is a few kilobytes


def run(args) -> int:
    from ..training.run import open_run
    from ..verify import audit, keys

    trusted = keys.load_trusted(args.trust)
    r = open_run(args.run)
    n = r.recipe.steps
    cov = audit.coverage(_load(args.certs), audit.run_facts(r), trusted, args.beacon)
    print(f"run {args.run}: {n} steps, chain head {r.head['chain_link']}; {len(trusted)} trusted key(s)")
    for name, problems in cov.rejected:
        print(f"REJECTED {name}: " + "; ".join(problems))
    good = sum(len(v) for v in cov.certified.values())
    names = ", ".join(f"{a} ({fp[:16]})" for fp, a in sorted(cov.auditors.items(), key=lambda x: (x[1], x[0])))
    print(f"{good} valid certificate(s) from {len(cov.auditors)} auditor key(s): {names or '-'}")
    for fp, missing in sorted(cov.incomplete.items()):
        print(
            f"INCOMPLETE sample of {cov.auditors[fp]} ({fp[:16]}): no certificate for sampled steps {missing}; "
            "its steps count as covered, but it is left out of the escape probabilities"
        )
    print(f"certified steps: {sorted(cov.certified)}")
    print(f"coverage: {len(cov.certified)} of {n} steps = {cov.percent:.1f}%")
    for step, who in sorted(cov.disagreements.items()):
        print(f"DISAGREEMENT at step {step}: " + "; ".join(who))
    if cov.mismatched_steps:
        print(f"MISMATCH certified at steps {cov.mismatched_steps}")
    if cov.sample_sizes:
        print(
            f"probability that t tampered steps all escaped the samples of {len(cov.sample_sizes)} distinct "
            "key(s) with complete samples (exact, hypergeometric per key):"
        )
        for t in args.tampered or [1, 2, 5, 10]:
            if 0 < t <= n:
                p = audit.escape_probability(n, cov.sample_sizes, t)
                print(f"  t = {t:3d}: {float(p):.6g}")
    if args.plot:
        from ..verify.plot import plot_coverage

        plot_coverage(args.plot, r, cov)
        print(f"plot written to {args.plot}")
    ok = not cov.rejected and not cov.disagreements and not cov.mismatched_steps and good > 0
    return 0 if ok else 1
