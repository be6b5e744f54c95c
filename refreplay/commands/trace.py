HELP = (
    "publisher side: write the op-level trace of a step into RUN/traces/ so that a diverging replay "
    "can name the first differing operation"
)


def add_arguments(p):
    p.add_argument("run", metavar="RUN", help="published run directory")
    p.add_argument("--step", type=int, nargs="+", required=True, metavar="N", help="steps to trace")
    p.add_argument(
        "--no-memory-check",
        action="store_true",
        help="trace even when the predicted memory exceeds what this machine has available",
    )


def run(args) -> int:
    import json

    from ..errors import InputError
    from ..training.run import open_run
    from ..verify.trace import TRACE_DIR, step_trace, trace_path

    from .. import files
    from ..training import budget, estimate

    r = open_run(args.run)
    c = estimate.cost(r.recipe.model, r.recipe.train)
    budget.plan(
        c.peak_ram,
        c.peak_mapped,
        None,
        None if args.no_memory_check else budget.available_memory(),
        "tracing a step of this recipe",
    )
    try:
        (r.path / TRACE_DIR).mkdir(exist_ok=True)
    except OSError as exc:
        raise files.write_error(exc, r.path / TRACE_DIR) from None
    for n in sorted(set(args.step)):
        if not 1 <= n <= r.recipe.steps:
            raise InputError(f"step {n} is not a step of this run (1..{r.recipe.steps})")
        k = max(c for c in r.checkpoints if c < n)
        st = r.load_checkpoint(k)
        for s in range(k + 1, n):  # bring the state to step n-1, checking each step on the way
            st, rec = r.replay_step(st)
            if rec.state_root != r.records[s].state_root:
                raise InputError(f"cannot trace step {n}: step {s} does not replay to its published state")
        t = step_trace(r.trainer(), st)
        files.write_atomic(trace_path(r, n), json.dumps(t, separators=(",", ":")) + "\n")
        print(f"step {n}: {sum(len(m) for m in t['micro_batches'])} op outputs traced -> {trace_path(r, n)}")
    return 0
