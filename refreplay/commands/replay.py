HELP = "replay a published step on this machine and verify it bit for bit against the run's hashes"

# Exit status of a replay of an incomplete run ([step.incomplete.r1]; training stopped early: fewer
# records than steps, no head.json) in which every step replayed, all of them
# with whole records, reproduced: not 0, since no chain head vouches for the
# records and the step asked for may have no record at all; not 1, since
# nothing differed.  A mismatch is 1 as always (docs/run-format.md).
EXIT_INCOMPLETE = 4


def add_arguments(p):
    p.add_argument("run", metavar="RUN", help="published run directory")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--step", type=int, metavar="N", help="the step to verify (1..steps)")
    which.add_argument(
        "--steps",
        metavar="A:B",
        help="the segment of steps A..B to verify, split into tasks at checkpoints (with --cluster, on Dask workers)",
    )
    p.add_argument(
        "--expect-head", metavar="HEX", help="the chain head published out of band; the run's head.json must equal it"
    )
    p.add_argument("--quiet", action="store_true", help="no progress line")
    add_budget_arguments(p)
    from ..training.backend import add_argument

    add_argument(p)
    from ._cluster import add_arguments as add_cluster_arguments  # issue 27

    add_cluster_arguments(p, estimate=False)


def add_budget_arguments(p):
    p.add_argument(
        "--max-memory",
        metavar="GIB",
        default=None,
        help="memory budget in GiB: when a step held in RAM would need more, optimizer moments, "
        "gradients and checkpoint tensors are kept in memory-mapped files (bits never change)",
    )
    p.add_argument(
        "--estimate",
        action="store_true",
        help="print FLOPs, bytes moved, predicted peak memory and time (from a few seconds of "
        "kernel calibration) and exit without replaying",
    )
    p.add_argument(
        "--no-memory-check",
        action="store_true",
        help="run even when the predicted memory exceeds what this machine has available "
        "(by default such a recipe is refused before anything is allocated)",
    )


def memory_for(args, model, train, what="a step of this recipe"):
    """The ``budget.Memory`` that ``--max-memory`` asks for (None: no budget),
    after checking, from the configuration alone and before anything is
    allocated, that the step fits this machine's available memory
    (``budget.plan``; ``--no-memory-check`` skips the check)."""
    from ..training import budget, estimate

    limit = None if args.max_memory is None else budget.parse_gib(args.max_memory)
    c = estimate.cost(model, train)
    available = None if getattr(args, "no_memory_check", False) else budget.available_memory()
    memory = budget.plan(c.peak_ram, c.peak_mapped, limit, available, what)
    return memory if limit is not None else None


def print_estimate(args, model, train, steps: int) -> int:
    from ..training import budget, estimate

    limit = None if args.max_memory is None else budget.parse_gib(args.max_memory)
    c = estimate.estimate(model, train)
    for line in c.lines(limit):
        print(line)
    if steps > 1:
        print(f"predicted total {steps * c.seconds:.1f} s for {steps} steps")
    return 0


def check_head(run, expected):
    from ..errors import VerificationFailure

    if expected is not None and run.head is None:
        raise VerificationFailure(
            f"the run has no chain head (it is incomplete), so it is not the run whose head is {expected}"
        )
    if expected is not None and run.head["chain_link"] != expected.strip().lower():
        raise VerificationFailure(
            f"the run's chain head {run.head['chain_link']} is not the expected "
            f"{expected} (another or a re-published run)"
        )


def progress_printer(quiet):
    import sys

    if quiet or not sys.stderr.isatty():
        return None

    import time

    t0 = time.perf_counter()

    def show(i, total, step):
        bar = "#" * (20 * i // total)
        eta = (time.perf_counter() - t0) / i * (total - i)
        print(
            f"\rreplaying step {step} [{bar:<20}] {i}/{total}  ETA {eta:.0f} s",
            end="" if i < total else "\n",
            file=sys.stderr,
            flush=True,
        )

    return show


def run(args) -> int:
    from ..training.backend import describe
    from ..training.run import open_run
    from ..verify.replay import replay

    from ..errors import InputError

    if args.steps is not None:  # issue 27: a segment, as tasks (of a complete run, as audits need)
        from ._cluster import replay_segment

        r = open_run(args.run, strict=False)
        check_head(r, args.expect_head)
        return replay_segment(args, r)
    if args.cluster is not None:
        raise InputError("--cluster replays a segment: use --steps A:B (A:A for one step)")

    r = open_run(args.run, strict=False, incomplete=True)
    check_head(r, args.expect_head)
    if not 1 <= args.step <= r.recipe.steps:
        raise InputError(f"step {args.step} is not a step of this run (1..{r.recipe.steps})")
    target = args.step if r.complete else min(args.step, r.last_step)
    if args.estimate:
        k = max(c for c in r.checkpoints if c < args.step)
        print(f"run {args.run}: step {args.step} replays steps {k + 1}..{args.step} from the checkpoint at step {k}")
        return print_estimate(args, r.recipe.model, r.recipe.train, args.step - k)
    memory = memory_for(args, r.recipe.model, r.recipe.train)
    device = describe(args.device)  # refuses an unusable device before any work
    if not r.complete:
        print(
            f"run {args.run}: INCOMPLETE: no chain head, whole records of steps 0..{r.last_step} of "
            f"{r.recipe.steps} (training stopped early; `refreplay train --resume {args.run}` finishes it)"
        )
    if target < 1:
        print(f"INCOMPLETE: step {args.step} is NOT verified: the run has no record of it")
        return EXIT_INCOMPLETE
    res = replay(r, target, progress_printer(args.quiet), args.device, memory)
    if r.complete:
        print(f"run {args.run}: chain head {r.head['chain_link']}")
    if args.device != "cpu":
        print(f"ops on {device}")
    print(
        f"replayed steps {res.start + 1}..{target} from the checkpoint at step {res.start}"
        + (" (state and gradients in memory-mapped files)" if memory is not None and memory.mapped else "")
    )
    for c in res.checked:
        print(f"  step {c.step}: state {c.state_root[:16]}  link {c.chain_link[:16]}  ok  ({c.seconds:.2f} s)")
    print_artifacts(res)
    if res.divergence is not None:
        for line in res.divergence.lines():
            print(line)
        print(f"MISMATCH: step {args.step} is NOT verified")
        return 1
    last = res.checked[-1]
    if target < args.step:
        print(
            f"INCOMPLETE: step {args.step} is NOT verified: the run has no record of it; the steps "
            f"replayed up to step {target} reproduce bit for bit (state root {last.state_root})"
        )
        return EXIT_INCOMPLETE
    if not r.complete:
        print(
            f"INCOMPLETE: step {args.step} reproduces its record bit for bit (state root {last.state_root}, "
            f"chain link {last.chain_link}), but no chain head vouches for the records of this incomplete run"
        )
        return EXIT_INCOMPLETE
    print(
        f"VERIFIED: step {args.step} reproduces bit for bit (state root {last.state_root}, "
        f"chain link {last.chain_link})"
    )
    return 0


def print_artifacts(res, indent=""):
    """The checkpoints found equal to the replayed state, and the warnings
    (faults of localisation aids, checkpoints passed over) beside the verdict."""
    for a in res.artifacts:
        how = "started from it" if a.role == "start" else "equals the replayed state"
        print(f"{indent}  checked {a.file}: {how} (root {a.state_root[:16]})")
    for w in res.warnings:
        print(f"{indent}  warning: {w}")
