HELP = "combine auditors' certificates for a run: validate them, report coverage and escape probabilities"


def add_arguments(p):
    p.add_argument("run", metavar="RUN", help="published run directory")
    p.add_argument("certs", nargs="+", metavar="CERT", help="certificate files (JSON) or directories of them")
    p.add_argument("--tampered", type=int, nargs="+", default=None, metavar="T",
                   help="numbers of tampered steps to quote escape probabilities for (default 1 2 5 10)")
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
    from ..verify import audit

    r = open_run(args.run)
    n = r.recipe.steps
    cov = audit.coverage(_load(args.certs), audit.run_facts(r))
    print(f"run {args.run}: {n} steps, chain head {r.head['chain_link']}")
    for name, problems in cov.rejected:
        print(f"REJECTED {name}: " + "; ".join(problems))
    good = sum(len(v) for v in cov.certified.values())
    auditors = sorted({c["auditor"] for cs in cov.certified.values() for c in cs})
    print(f"{good} valid certificate(s) from {len(auditors)} auditor(s): {', '.join(auditors) or '-'}")
    print(f"certified steps: {sorted(cov.certified)}")
    print(f"coverage: {len(cov.certified)} of {n} steps = {cov.percent:.1f}%")
    for step, who in sorted(cov.disagreements.items()):
        print(f"DISAGREEMENT at step {step}: " + "; ".join(who))
    if cov.mismatched_steps:
        print(f"MISMATCH certified at steps {cov.mismatched_steps}")
    if cov.sample_sizes:
        print("probability that t tampered steps all escaped every auditor's sample "
              "(exact, hypergeometric per auditor):")
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
