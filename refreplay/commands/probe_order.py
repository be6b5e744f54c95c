HELP = "reveal a black-box kernel's accumulation tree (FPRev) and print it beside the spec's order"


def add_arguments(p):
    p.add_argument(
        "kernel",
        metavar="KERNEL",
        help="as for `refreplay conform`: reference, numpy, torch, package.module[:function] or exec:COMMAND",
    )
    p.add_argument("--op", required=True, choices=("sum", "dot", "matmul"), help="the reduction to probe")
    p.add_argument(
        "--n",
        required=True,
        metavar="N[,N...]",
        help="reduction length N (1..256), or several separated by commas (e.g. 16,64,256): a kernel "
        "may sum in another tree at each length, and each tree found is reported",
    )


def _lengths(text):
    from ..errors import InputError

    try:
        ns = [int(t) for t in str(text).split(",") if t.strip()]
    except ValueError:
        raise InputError(f"--n takes lengths separated by commas, not {text!r}") from None
    if not ns:
        raise InputError("--n takes at least one length")
    return list(dict.fromkeys(ns))


def _names(names):
    from ..conformance.readings import orders
    from ..conformance.diagnosis.order_probe import tree_name

    spec_name = tree_name(orders.spec_order(False).name)
    if spec_name in names:  # blocks longer than N etc. are the same tree: name it once
        return [spec_name + " (the spec's order)"]
    return names


def _show(label, tree, names, render):
    text = render(tree)
    if len(text) > 600:
        text = text[:600] + " ..."
    print(f"{label} {text}")
    print(" " * len(label) + " = " + ("; ".join(names) if names else "none of the named candidate orders"))


def _probe_one(args, n, kernels, P, clauses):
    """Print one length's trees; (kernel tree's names, same as the spec's), or None if not a tree."""
    kernel = kernels.resolve(args.kernel)
    try:
        tree, sizes = P.probe(kernel, args.op, n)
    except P.NotATree as exc:
        print(f"kernel {args.kernel}, op {args.op}, N = {n}: {exc}")
        return None
    spec_tree, spec_sizes = P.probe(kernels.resolve("reference"), args.op, n)
    print(
        f"kernel {args.kernel}, op {args.op}, N = {n}: {n * (n - 1) // 2} pairwise queries, "
        f"M = 2^{int(P.big(n)).bit_length() - 1}"
    )
    names = _names(P.names_for(sizes, n))
    _show("kernel tree:", tree, names, P.render)
    _show("spec tree:  ", spec_tree, _names(P.names_for(spec_sizes, n)), P.render)
    print(f"             {clauses}")
    return names, bool((sizes == spec_sizes).all())


def run(args) -> int:
    from ..conformance.running import adapters as kernels
    from ..conformance.diagnosis import order_probe as P
    from ..conformance.table import OPS

    ns = _lengths(args.n)
    for n in ns:  # every length checked before the first query
        if not 1 <= n <= P.MAX_N:
            P.probe(None, args.op, n)  # raises the usage error
    clauses = " ".join(f"[{c}]" for c in OPS[args.op].clauses if c.startswith(("mm.", "red.")))
    found = {}
    for i, n in enumerate(ns):
        if i:
            print()
        got = _probe_one(args, n, kernels, P, clauses)
        if got is None:
            return 1
        found[n] = got
    print(
        "(a tree shows which partial sums are added, nothing more: not the start value, -0 or +0, "
        "nor fused multiply-adds, flushing or NaN rules; `refreplay conform` checks those)"
    )
    if len(ns) > 1:
        print(
            "trees by length: "
            + "; ".join(
                f"N = {n}: " + (" or ".join(names) if names else "a tree none of the named orders gives")
                for n, (names, _) in found.items()
            )
        )
        kinds = {tuple(names) for names, _ in found.values()}
        if len(kinds) > 1 or any(not names for names, _ in found.values()):
            print("the kernel's tree changes with N: each length above is a separate finding")
    differ = [n for n, (_, same) in found.items() if not same]
    if not differ:
        print(
            "verdict: the kernel accumulates in the spec's order (its tree shape)"
            + (f" at every N probed ({', '.join(map(str, ns))})" if len(ns) > 1 else "")
        )
        return 0
    print(
        "verdict: the kernel's accumulation order DIFFERS from the spec's"
        + (f" at N = {', '.join(map(str, differ))}" if len(ns) > 1 else "")
    )
    return 1
