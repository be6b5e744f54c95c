HELP = "reveal a black-box kernel's accumulation tree (FPRev) and print it beside the spec's order"


def add_arguments(p):
    p.add_argument("kernel", metavar="KERNEL", help="as for `refreplay conform`: reference, numpy, torch, "
                                                     "package.module[:function] or exec:COMMAND")
    p.add_argument("--op", required=True, choices=("sum", "dot", "matmul"), help="the reduction to probe")
    p.add_argument("--n", type=int, required=True, help="reduction length N (1..256)")


def _show(label, tree, names, render):
    from ..conformance import orders

    from ..conformance.order_probe import tree_name

    spec_name = tree_name(orders.spec_order(False).name)
    if spec_name in names:  # blocks longer than N etc. are the same tree: name it once
        names = [spec_name + " (the spec's order)"]
    text = render(tree)
    if len(text) > 600:
        text = text[:600] + " ..."
    print(f"{label} {text}")
    print(" " * len(label) + " = " + ("; ".join(names) if names else "none of the named candidate orders"))


def run(args) -> int:
    from ..conformance import kernels, order_probe as P
    from ..conformance.registry import OPS

    kernel = kernels.resolve(args.kernel)
    try:
        tree, sizes = P.probe(kernel, args.op, args.n)
    except P.NotATree as exc:
        print(f"kernel {args.kernel}, op {args.op}, N = {args.n}: {exc}")
        return 1
    spec_tree, spec_sizes = P.probe(kernels.resolve("reference"), args.op, args.n)
    clauses = " ".join(f"[{c}]" for c in OPS[args.op].clauses if c.startswith(("mm.", "red.")))
    print(f"kernel {args.kernel}, op {args.op}, N = {args.n}: {args.n * (args.n - 1) // 2} pairwise queries, "
          f"M = 2^{int(P.big(args.n)).bit_length() - 1}")
    _show("kernel tree:", tree, P.names_for(sizes, args.n), P.render)
    _show("spec tree:  ", spec_tree, P.names_for(spec_sizes, args.n), P.render)
    print(f"             {clauses}")
    print("(a tree shows which partial sums are added, nothing more: not the start value, -0 or +0, "
          "nor fused multiply-adds, flushing or NaN rules; `refreplay conform` checks those)")
    if (sizes == spec_sizes).all():
        print("verdict: the kernel accumulates in the spec's order (its tree shape)")
        return 0
    print("verdict: the kernel's accumulation order DIFFERS from the spec's")
    return 1


