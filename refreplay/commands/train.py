HELP = "train a recipe on R ranks (in-process or MPI) and publish a run directory with per-step hashes"


def add_arguments(p):
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--resume",
        metavar="RUN",
        help="continue the crashed run RUN from its last complete checkpoint, to exactly the files "
        "an uninterrupted run writes (its recipe decides everything; only --device, "
        "--max-memory, --threads and --quiet apply)",
    )
    src.add_argument("--preset", metavar="NAME", help="a named preset: tiny, small, gpt2-124m or gpt2-xl")
    src.add_argument(
        "--config",
        metavar="FILE",
        help='a JSON file {"preset": NAME (optional base), "model": {...}, "train": {...}} '
        "whose fields override the base preset (or the defaults)",
    )
    p.add_argument("--steps", type=int, default=None, metavar="N", help="training steps to run (required)")
    p.add_argument("--ranks", type=int, default=1, metavar="R", help="data-parallel ranks (default 1)")
    p.add_argument(
        "--launcher",
        choices=("inproc", "mpi"),
        default="inproc",
        help="inproc: R simulated ranks in this process (default); mpi: R processes via mpiexec",
    )
    p.add_argument(
        "--checkpoint-every",
        type=int,
        default=None,
        metavar="K",
        help="save the state every K steps (step 0 and the last step are always saved)",
    )
    p.add_argument(
        "--out", default=None, metavar="RUN", help="run directory to create (required; must not exist or be empty)"
    )
    p.add_argument("--seed", type=int, default=None, metavar="S", help="override the recipe's seed")
    p.add_argument(
        "--precision",
        choices=("fp32", "bf16"),
        default=None,
        help="override the model's precision: fp32 (binary32, the default) or bf16 (the "
        "mixed-precision profile of spec chapter 8: bf16 working weights, activations "
        "and activation gradients; fp32 masters, moments and parameter gradients)",
    )
    data_src = p.add_mutually_exclusive_group()
    data_src.add_argument(
        "--data",
        nargs="+",
        metavar="FILE",
        default=None,
        help="build the byte corpus from these files (in order) instead of the Python standard library",
    )
    data_src.add_argument(
        "--tokens",
        nargs="+",
        metavar="FILE",
        default=None,
        help="pre-tokenized files, in order: llm.c .bin (256 x int32 header, magic 20240520) "
        'or flat uint16/uint32 with a sidecar FILE.json {"dtype", "vocab"}; '
        "the model's vocabulary becomes theirs, padded to a multiple of 64",
    )
    p.add_argument(
        "--vocab",
        type=int,
        default=None,
        metavar="V",
        help="the token files' vocabulary size, when no sidecar gives it (GPT-2: 50257)",
    )
    p.add_argument(
        "--byte-cap", type=int, default=None, metavar="BYTES", help="corpus size cap in bytes (default 1048576)"
    )
    p.add_argument(
        "--threads", type=int, default=None, metavar="N", help="compute threads per process (bits never depend on it)"
    )
    p.add_argument("--quiet", action="store_true", help="no progress line")
    from .replay import add_budget_arguments

    add_budget_arguments(p)
    from ..training.backend import add_argument

    add_argument(p)


def _argv(args) -> list[str]:
    """The command line again, for re-running under mpiexec."""
    out = ["train", "--steps", str(args.steps), "--ranks", str(args.ranks), "--launcher", "mpi", "--out", str(args.out)]
    out += ["--preset", args.preset] if args.preset else ["--config", str(args.config)]
    for flag, value in (
        ("--checkpoint-every", args.checkpoint_every),
        ("--seed", args.seed),
        ("--precision", args.precision),
        ("--max-memory", args.max_memory),
        ("--byte-cap", args.byte_cap),
        ("--threads", args.threads),
        ("--device", args.device),
    ):
        if value is not None:
            out += [flag, str(value)]
    if args.vocab is not None:
        out += ["--vocab", str(args.vocab)]
    if args.data:
        out += ["--data", *args.data]
    if args.tokens:
        out += ["--tokens", *args.tokens]
    if args.quiet:
        out.append("--quiet")
    return out


def _configs(args):
    import dataclasses
    from pathlib import Path

    from .. import untrusted
    from ..training import presets
    from ..errors import InputError

    explicit_schedule = False
    if args.preset:
        model, train = presets.preset(args.preset)
        name = args.preset
    else:
        path = Path(args.config)
        obj = untrusted.load_json(path, what="config file", limit=1 << 20)
        if not isinstance(obj, dict) or set(obj) - {"preset", "model", "train"}:
            raise InputError(f"{path}: expected an object with keys preset, model, train")
        name = obj.get("preset")
        if name is not None and not isinstance(name, str):
            raise InputError(f"{path}: preset must be a name")
        base_m, base_t = presets.preset(name) if name else (presets.ModelConfig(), presets.TrainConfig())
        model = presets.model_from_json(obj.get("model", {}), f"{path}: model", partial=True, base=base_m)
        train = presets.train_from_json(obj.get("train", {}), f"{path}: train", partial=True, base=base_t)
        explicit_schedule = "schedule_steps" in obj.get("train", {})
    if args.seed is not None:
        train = dataclasses.replace(train, seed=args.seed)
    if args.precision is not None:  # [bf16.precision.c1]
        model = dataclasses.replace(model, precision=args.precision)
    # the learning rate decays over the run's length unless the config says otherwise
    if not explicit_schedule and args.steps > train.warmup_steps:
        train = dataclasses.replace(train, schedule_steps=args.steps)
    return name, model.validate(), train.validate()


def _with_data_vocab(args, model):
    """The model with the vocabulary its data will give it ([data.vocab.c1]),
    read from the token files' sidecars or --vocab without reading tokens."""
    import dataclasses

    from ..training import data, tokens

    v = tokens.peek_vocab(args.tokens, args.vocab) if args.tokens else data.VOCAB
    return dataclasses.replace(model, vocab=tokens.padded_vocab(v))


def run(args) -> int:
    import sys
    import traceback

    from ..errors import InputError
    from ..training.launch import mpi as mpi_launch

    if args.resume is not None:
        return _resume(args)
    if args.out is None:
        raise InputError("--out RUN is required (or --resume RUN to continue a crashed run)")
    if args.steps is None or args.steps < 1:
        raise InputError("--steps must be a positive integer")
    if args.ranks < 1:
        raise InputError("--ranks must be a positive integer")
    if args.checkpoint_every is not None and args.checkpoint_every < 1:
        raise InputError("--checkpoint-every must be a positive integer")
    if args.vocab is not None and not args.tokens:
        raise InputError("--vocab applies to --tokens files only")
    if args.threads is not None and args.threads < 1:
        raise InputError("--threads must be a positive integer")
    name, model, train_cfg = _configs(args)
    from .replay import memory_for, print_estimate

    if args.estimate:
        return print_estimate(args, _with_data_vocab(args, model), train_cfg, args.steps)
    memory = memory_for(args, _with_data_vocab(args, model), train_cfg)
    if args.launcher == "mpi" and not mpi_launch.under_mpi():
        return mpi_launch.relaunch(args.ranks, _argv(args))

    if args.threads is not None:
        import numba

        from .. import environ

        numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
        environ.set_threads(args.threads)  # fixed: the trainer's load policy keeps it
    from ..training import data, launch
    from ..training.train import train

    from ..training.backend import describe

    device = describe(args.device)  # refuses an unusable device before any work
    launcher = launch.get(args.launcher, args.ranks)
    try:
        summary = train(
            model,
            train_cfg,
            steps=args.steps,
            checkpoint_every=args.checkpoint_every or args.steps,
            out=args.out,
            launcher=launcher,
            launcher_name=args.launcher,
            preset=name,
            corpus_files=args.data,
            byte_cap=args.byte_cap or data.DEFAULT_BYTE_CAP,
            progress=None if args.quiet else sys.stderr,
            device=args.device,
            token_files=args.tokens,
            vocab=args.vocab,
            memory=memory,
        )
    except Exception as exc:
        if launcher.size > 1 and hasattr(launcher, "abort"):
            # One MPI rank failing must not leave the others waiting for its
            # messages: report once, then end every rank with the exit code.
            code = 2 if isinstance(exc, InputError) else 3
            if launcher.is_root or code == 3:
                if code == 2:
                    print(f"refreplay train: error: {exc}", file=sys.stderr)
                else:
                    traceback.print_exc()
            sys.stderr.flush()
            launcher.abort(code)
        raise
    launcher.close()
    if launcher.is_root:
        print(
            f"run {args.out}: {summary.steps} steps on {args.ranks} rank(s) ({args.launcher}), "
            f"ops on {device}, {summary.seconds:.1f} s"
        )
        print(f"recipe sha256 {summary.recipe_sha256}")
        print(f"chain head    {summary.head}")
    return 0


def _resume(args) -> int:
    """``train --resume RUN``: the recipe in RUN decides every bit; flags that
    would change it are refused rather than ignored."""
    import sys

    from ..errors import InputError
    from ..training.train import resume

    given = (
        [
            flag
            for flag, value in (
                ("--steps", args.steps),
                ("--out", args.out),
                ("--seed", args.seed),
                ("--precision", args.precision),
                ("--data", args.data),
                ("--tokens", args.tokens),
                ("--vocab", args.vocab),
                ("--byte-cap", args.byte_cap),
                ("--checkpoint-every", args.checkpoint_every),
            )
            if value is not None
        ]
        + (["--ranks"] if args.ranks != 1 else [])
        + (["--launcher"] if args.launcher != "inproc" else [])
        + (["--estimate"] if args.estimate else [])
    )
    if given:
        raise InputError(f"--resume takes the run's recipe as it is; {', '.join(given)} cannot be combined with it")
    if args.threads is not None:
        if args.threads < 1:
            raise InputError("--threads must be a positive integer")
        import numba

        from .. import environ

        numba.set_num_threads(min(args.threads, numba.config.NUMBA_NUM_THREADS))
        environ.set_threads(args.threads)  # fixed: the trainer's load policy keeps it
    from ..training.backend import describe
    from ..training.train import open_for_resume
    from .replay import memory_for

    recipe = open_for_resume(args.resume).recipe
    memory = memory_for(args, recipe.model, recipe.train)
    device = describe(args.device)
    summary, start = resume(args.resume, progress=None if args.quiet else sys.stderr, device=args.device, memory=memory)
    print(
        f"run {args.resume}: resumed from step {start}, steps {start + 1}..{summary.steps} on {device}, "
        f"{summary.seconds:.1f} s"
    )
    print(f"recipe sha256 {summary.recipe_sha256}")
    print(f"chain head    {summary.head}")
    return 0
