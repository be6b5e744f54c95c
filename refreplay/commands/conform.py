HELP = (
    "run the golden vectors against a kernel (reference, numpy, torch, package.module[:function] "
    "or exec:COMMAND) and explain every failure"
)


def add_arguments(p):
    p.add_argument(
        "kernel",
        metavar="KERNEL",
        help="reference | numpy | torch | package.module:function | package.module | exec:COMMAND "
        "(see docs/conformance.md)",
    )
    p.add_argument("--op", action="append", metavar="OP", help="only this op (repeatable); default: every op")
    p.add_argument("--json", metavar="FILE", help="also write the full report as JSON")
    p.add_argument("--junit", metavar="FILE", help="also write JUnit XML")
    p.add_argument("--xfail", metavar="FILE", help="expected failures: lines 'PATTERN  REASON' (reason required)")
    p.add_argument("--vectors", metavar="DIR", help="vector directory (default: the repository's vectors/)")
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help="exec: kernels: seconds per case before the program's whole process group is killed (default: 120)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="list skipped and expected-failing cases too")
    live = p.add_argument_group("live cases (expected bits computed by the reference now, at any shape)")
    live.add_argument(
        "--shape",
        action="append",
        metavar="L=N,...",
        help="a live case of each --op at this shape, in the op's spec letters, e.g. I=4,K=11008,J=4096 (repeatable)",
    )
    live.add_argument(
        "--shapes",
        metavar="PRESET",
        help="live cases at the linear/attention/softmax/norm shapes of a model preset (bf16 "
        "ops too); a shape above --max-elements is not run and the verdict is at best "
        "INCOMPLETE, exit 4",
    )
    live.add_argument("--seed", type=int, default=0, help="seed of the live inputs (default 0)")
    live.add_argument("--save", metavar="DIR", help="also write the live cases as vectors that --vectors DIR replays")
    live.add_argument(
        "--max-elements",
        type=int,
        metavar="E",
        default=None,
        help="bound on the elements of one live case, inputs and outputs (default 2^27)",
    )


def run(args) -> int:
    from pathlib import Path

    from .. import spec
    from ..conformance.running import adapters as kernels
    from ..conformance.running import compare as runner
    from ..conformance.golden import store
    from ..errors import InputError

    if args.shape or args.shapes:
        from .conform_live import run_live

        return run_live(args)
    if args.save:
        raise InputError("--save writes live cases: give --shape or --shapes")
    directory = Path(args.vectors) if args.vectors else store.VECTOR_DIR
    manifest = store.read_manifest(directory)
    if manifest["spec_version"] != spec.version():
        raise InputError(
            f"the vectors in {directory} are for spec {manifest['spec_version']}, this is spec "
            f"{spec.version()}: run `refreplay vectors generate` (or use matching vectors)"
        )
    known = list(dict.fromkeys(c["op"] for c in manifest["cases"]))
    if args.op:
        unknown = [o for o in args.op if o not in known]
        if unknown:
            raise InputError(f"no vectors for op {', '.join(unknown)} (ops: {', '.join(known)})")
    xfail = runner.read_xfail(args.xfail) if args.xfail else []
    kernel = kernels.resolve(args.kernel, exec_timeout=args.timeout)
    manifest, cases = store.load_cases(directory, set(args.op) if args.op else None)
    results = runner.run(kernel, cases, xfail)
    if not args.op:
        # ops the kernel does not implement at all are reported, not held against it
        by_op = {}
        for r in results:
            by_op.setdefault(r.case.op, []).append(r)
        declined = [op for op, rs in by_op.items() if all(r.status == "skip" for r in rs)]
        results = [r for r in results if r.case.op not in declined]
        if declined:
            print(f"(kernel {args.kernel} does not implement: {', '.join(declined)})")
    return 0 if publish(args, manifest, results).conformant else 1


def publish(args, manifest, results, not_run=()):
    """Print the report of ``results`` and write the --json/--junit files;
    returns the summary (committed and live cases alike).  ``not_run``: live
    shapes asked for and not run ([conf.domain.c2]: the verdict is then at best INCOMPLETE)."""
    from ..conformance.reporting import report

    summary = report.summarize(args.kernel, manifest, results)
    summary.not_run = list(not_run)
    print(report.text(summary, args.verbose))
    if args.json:
        report.write_json(summary, args.json)
    if args.junit:
        report.write_junit(summary, args.junit)
    return summary
