HELP = "read the specification: list clauses, show one for citing, check traceability, run the worked examples"


def add_arguments(p):
    sub = p.add_subparsers(dest="spec_command", metavar="ACTION", required=True)
    ls = sub.add_parser("list", help="list clause labels and titles")
    ls.add_argument("--normative", action="store_true", help="only normative (.cN) clauses")
    show = sub.add_parser("show", help="print clauses, ready to cite")
    show.add_argument("labels", nargs="+", metavar="LABEL")
    sub.add_parser(
        "check",
        help="exit 1 if code/tests/vectors cite unknown labels or a normative clause is cited by no code or no test",
    )
    sub.add_parser("examples", help="run every worked example of the spec against the reference")


def run(args) -> int:
    from .. import spec
    from ..errors import InputError

    try:
        clauses = spec.parse()
    except spec.SpecError as exc:
        raise InputError(f"malformed spec: {exc}") from None
    if args.spec_command == "list":
        for c in clauses.values():
            if args.normative and not c.normative:
                continue
            print(f"[{c.label}]  {c.title}")
        return 0
    if args.spec_command == "show":
        missing = [lb.strip("[]") for lb in args.labels if lb.strip("[]") not in clauses]
        if missing:
            raise InputError("no such clause: " + ", ".join(missing) + " (see `refreplay spec list`)")
        print(f"refreplay spec {spec.version()} (sha256:{spec.spec_sha256()[:16]})\n")
        for lb in args.labels:
            c = clauses[lb.strip("[]")]
            print(f"-- {c.file}:{c.line}")
            print(c.text())
        return 0
    if args.spec_command == "check":
        from ..resources import installed

        if installed():
            raise InputError(
                "spec check traces labels through the source, tests and vectors of a "
                "repository checkout; this is an installed copy without tests/ "
                "(run it in a checkout; `refreplay spec examples` works here)"
            )
        report = spec.check()
        for line in report.lines():
            print(line)
        n = sum(1 for c in clauses.values() if c.normative)
        print(f"spec check: {n} normative clauses, {len(report.lines())} problems")
        return 0 if report.ok else 1
    if args.spec_command == "examples":
        failed = total = 0
        for c in clauses.values():
            for line, expr, result in c.examples:
                total += 1
                ok, msg = spec.run_example(expr, result)
                if not ok:
                    failed += 1
                    print(f"FAIL [{c.label}] {c.file}:{line}: {expr} = {result}: {msg}")
        print(f"spec examples: {total - failed} passed, {failed} failed")
        return 0 if failed == 0 else 1
    return 2
