HELP = "golden vectors: regenerate them byte for byte, or verify the committed ones against the reference"


def add_arguments(p):
    sub = p.add_subparsers(dest="vectors_command", metavar="ACTION", required=True)
    g = sub.add_parser("generate", help="rebuild every vector file and the manifest from the reference")
    g.add_argument("--dir", default=None, help="output directory (default: the repository's vectors/)")
    v = sub.add_parser("verify", help="regenerate in memory and compare with the files on disk "
                                      "(exit 1 naming every differing case)")
    v.add_argument("--dir", default=None, help="directory to check (default: the repository's vectors/)")
    sub.add_parser("list", help="list the cases of the committed vectors")
    sub.add_parser("ops", help="list every covered op with its calling convention and clauses")


def run(args) -> int:
    from pathlib import Path

    from .. import spec
    from ..conformance import generate, store

    directory = Path(args.dir) if getattr(args, "dir", None) else store.VECTOR_DIR
    if args.vectors_command == "ops":
        from ..conformance.registry import OPS

        for op in OPS.values():
            print(f"{op.signature}\n    {' '.join('[' + c + ']' for c in op.clauses)}")
        return 0
    if args.vectors_command == "list":
        m = store.read_manifest(directory)
        for c in m["cases"]:
            shapes = ", ".join(f"{t['name']}:{t['dtype']}{t['shape']}" for t in c["inputs"])
            print(f"{c['id']:36s} {' '.join('[' + x + ']' for x in c['clauses'])}  {shapes}")
        print(f"{len(m['cases'])} cases, spec {m['spec_version']}, generator {m['generator_version']}")
        return 0
    files = store.encode(generate.build_all(), spec.version(), generate.GENERATOR_VERSION, generate.SEED)
    if args.vectors_command == "generate":
        directory.mkdir(parents=True, exist_ok=True)
        for stale in directory.glob("*.safetensors"):
            if stale.name not in files:
                stale.unlink()
        store.write(files, directory)
        total = sum(len(d) for d in files.values())
        print(f"wrote {len(files)} files, {total / 1e6:.2f} MB, to {directory}")
        return 0
    from ..conformance import verify

    problems = verify.compare(files, directory)
    for line in problems:
        print(line)
    if problems:
        print(f"vectors verify: FAILED, {len(problems)} differences (run `refreplay vectors generate` "
              f"if the reference changed on purpose)")
        return 1
    print(f"vectors verify: {len(files)} files identical to a fresh regeneration")
    return 0
