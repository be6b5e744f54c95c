"""`refreplay conform KERNEL --op OP --shape ...` / `--shapes PRESET`: live
cases, reported exactly like the committed vectors (``conform.py`` hands
over here when a shape is given)."""

from __future__ import annotations

from ..errors import InputError

HARD_MAX_ELEMENTS = 1 << 31


def max_elements(value) -> int:
    from ..conformance.shapes import live

    if value is None:
        return live.MAX_ELEMENTS
    if not 1 <= value <= HARD_MAX_ELEMENTS:
        raise InputError(f"--max-elements must be in [1, 2^31], got {value}")
    return value


def check_seed(seed: int) -> int:
    if not 0 <= seed < 1 << 64:
        raise InputError(f"--seed must be in [0, 2^64), got {seed}")
    return seed


def _wanted(args, bound, not_run=None) -> list[tuple[str, dict, str]]:
    """The live shapes to run; a preset's shapes above the bound are appended to ``not_run``
    ([conf.domain.c2]: said in the report, and the verdict is INCOMPLETE, exit 4)."""
    from ..conformance.shapes import live

    out = []
    not_run = [] if not_run is None else not_run
    if args.shape:
        if not args.op:
            raise InputError("--shape needs --op: shape letters are the op's (e.g. --op matmul --shape I=4,K=64,J=8)")
        for op in dict.fromkeys(args.op):
            out += [(op, live.parse_shape(op, text, bound), "") for text in args.shape]
    if args.shapes:
        table = live.preset_shapes(args.shapes)
        ops = list(dict.fromkeys(args.op)) if args.op else list(table)
        for op in ops:
            live.live_op(op)
            if op not in table:
                raise InputError(f"preset {args.shapes} gives no shapes for {op} (it does for: {', '.join(table)})")
            for label, dims in table[op]:
                try:
                    out.append((op, live.validate(op, dims, bound), f"{args.shapes} {label}"))
                except InputError as exc:  # a shape of a large model above the bound: said, not hidden
                    print(f"(not run: {exc}; raise --max-elements to run it)")
                    not_run.append(
                        f"{op} {args.shapes} {label} {live.format_dims(dims)}: above the bound of {bound:,} elements"
                    )
        if not out:
            raise InputError(f"every shape of preset {args.shapes} for {', '.join(ops)} is above the bound")
    return out


def run_live(args) -> int:
    from .. import spec
    from ..conformance.running import adapters as kernels
    from ..conformance.shapes import live
    from ..conformance.golden import live_save
    from ..conformance.running import compare as runner
    from .conform import publish

    if args.vectors:
        raise InputError("--vectors replays stored cases; --shape/--shapes build live ones: give one or the other")
    seed = check_seed(args.seed)
    not_run: list[str] = []
    wanted = _wanted(args, max_elements(args.max_elements), not_run)
    if args.save:
        live_save.check_save_target(args.save)
    xfail = runner.read_xfail(args.xfail) if args.xfail else []
    kernel = kernels.resolve(args.kernel, exec_timeout=args.timeout)
    live.require_fit()
    cases, results, index = [], [], {}
    for op, dims, label in wanted:
        case = live.build(op, dims, seed, index.setdefault(op, 0), label)
        index[op] += 1
        cases.append(case)
        results += runner.run(kernel, [case], xfail)
    manifest = {"spec_version": spec.version(), "generator_version": live.GENERATOR_VERSION}
    summary = publish(args, manifest, results, not_run)
    if args.save:
        live_save.save(cases, args.save, seed)
        print(f"saved {len(cases)} live cases to {args.save} (replay: refreplay conform KERNEL --vectors {args.save})")
    # [conf.domain.c2] never CONFORMANT with a shape not run: INCOMPLETE is exit 4, as for replay
    return 0 if summary.conformant else 4 if summary.incomplete else 1
