HELP = "golden vectors: regenerate them byte for byte, or verify the committed ones against the reference"


def add_arguments(p):
    sub = p.add_subparsers(dest="vectors_command", metavar="ACTION", required=True)
    g = sub.add_parser("generate", help="rebuild every vector file and the manifest from the reference")
    g.add_argument("--dir", default=None, help="output directory (default: the repository's vectors/)")
    v = sub.add_parser(
        "verify", help="regenerate in memory and compare with the files on disk (exit 1 naming every differing case)"
    )
    v.add_argument("--dir", default=None, help="directory to check (default: the repository's vectors/)")
    sub.add_parser("list", help="list the cases of the committed vectors")
    st = sub.add_parser(
        "steps",
        help="recompute the golden training steps (vectors/steps.json) on this "
        "machine and compare every state root, loss, data hash and chain link",
    )
    st.add_argument("--file", default=None, help="steps file (default: the repository's vectors/steps.json)")
    st.add_argument(
        "--ranks",
        type=int,
        nargs="+",
        default=[1, 3],
        metavar="R",
        help="in-process rank counts to compute with (default: 1 3)",
    )
    from ..training.backend import add_argument

    add_argument(st)
    sub.add_parser("ops", help="list every covered op with its calling convention and clauses")


def run(args) -> int:
    from pathlib import Path

    from .. import spec
    from ..conformance.golden import generate
    from ..conformance.golden import store

    directory = Path(args.dir) if getattr(args, "dir", None) else store.VECTOR_DIR
    if args.vectors_command == "ops":
        from ..conformance.table import OPS

        for op in OPS.values():
            print(f"{op.signature}\n    {' '.join('[' + c + ']' for c in op.clauses)}")
        return 0
    if args.vectors_command == "steps":
        return _steps(args, directory)
    if args.vectors_command == "list":
        m = store.read_manifest(directory)
        for c in m["cases"]:
            shapes = ", ".join(f"{t['name']}:{t['dtype']}{t['shape']}" for t in c["inputs"])
            print(f"{c['id']:36s} {' '.join('[' + x + ']' for x in c['clauses'])}  {shapes}")
        print(f"{len(m['cases'])} cases, spec {m['spec_version']}, generator {m['generator_version']}")
        return 0
    from ..conformance.golden import steps

    files = store.encode(generate.build_all(), spec.version(), generate.GENERATOR_VERSION, generate.SEED)
    fresh_steps = steps.generate()  # [conf.steps.c1]
    if args.vectors_command == "generate":
        from .. import files as _files

        store.write(files, directory)
        _files.write_atomic(directory / steps.STEPS_FILE, fresh_steps)
        for stale in directory.glob("*.safetensors"):  # after the new set is whole
            if stale.name not in files:
                try:
                    stale.unlink()
                except OSError as exc:
                    raise _files.write_error(exc, stale) from None
        _files.remove_temporaries(directory)
        total = sum(len(d) for d in files.values()) + len(fresh_steps)
        print(f"wrote {len(files) + 1} files, {total / 1e6:.2f} MB, to {directory}")
        return 0
    from ..conformance.golden import regenerate as verify

    problems = verify.compare(files, directory)
    steps_path = directory / steps.STEPS_FILE
    if not steps_path.is_file():
        problems.append(f"{steps_path}: missing")
    elif steps_path.read_bytes() != fresh_steps:
        _, why = steps.check(steps_path)
        problems += [f"{steps_path}: {line}" for line in why] or [
            f"{steps_path}: differs from a fresh regeneration (configuration, samples or layout)"
        ]
    for line in problems:
        print(line)
    if problems:
        print(
            f"vectors verify: FAILED, {len(problems)} differences (run `refreplay vectors generate` "
            f"if the reference changed on purpose)"
        )
        return 1
    print(f"vectors verify: {len(files) + 1} files identical to a fresh regeneration")
    return 0


def _steps(args, directory) -> int:
    """[conf.steps.c1] Recompute the golden steps; exit 1 naming each differing record."""
    from pathlib import Path

    from ..training.backend import describe
    from ..conformance.golden import steps
    from ..errors import InputError

    if any(r < 1 for r in args.ranks):
        raise InputError("--ranks must be positive integers")
    path = Path(args.file) if args.file else directory / steps.STEPS_FILE
    device = describe(args.device)
    cases = steps.load(path)
    checked, problems = steps.check(path, tuple(args.ranks), args.device)
    for line in problems:
        print(f"MISMATCH {line}")
    names = ", ".join(c.name for c in cases)
    if problems:
        print(f"vectors steps: FAILED, {len(problems)} case/rank combination(s) differ ({device})")
        return 1
    skipped = [f"{c.name} with R = {r}" for c in cases for r in args.ranks if r > c.train.micro_batches]
    print(
        f"vectors steps: {checked} records of {len(cases)} cases ({names}) reproduce bit for bit "
        f"with {' and '.join(map(str, args.ranks))} rank(s), ops on {device}"
        + (f" (skipped, more ranks than micro-batches: {', '.join(skipped)})" if skipped else "")
    )
    return 0
