"""Reveal a black-box kernel's accumulation tree (the FPRev technique,
[conf.order.c1]).

For a sum of N terms and a pair of positions i < j, feed x[i] = M,
x[j] = -M and ones elsewhere, with M = 2^(25 + ceil(log2 N)) so large that
M plus any partial sum of ones rounds back to M.  Every one that is added
into a partial sum holding M or -M before the two meet is absorbed; every
other one survives exactly.  So the output is N minus the number of leaves
under the lowest common ancestor of i and j in the kernel's summation tree:
one query per pair gives every LCA size, and merging pairs in increasing
LCA size rebuilds the tree (a node may have more than two children, as in a
multi-term adder).  The spec's tree is found the same way by probing the
reference, and both are matched against the named candidate orders.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import InputError
from ..readings import orders
from ..running.kernel import Kernel, KernelError, Unsupported

OPS = ("sum", "dot", "matmul")
MAX_N = 256
CHUNK = 4096  # queries per kernel call


def big(n: int) -> np.float32:
    return np.float32(2.0 ** (25 + max(1, int(np.ceil(np.log2(max(n, 2)))))))


def _pairs(n):
    return [(i, j) for i in range(n) for j in range(i + 1, n)]


def query_rows(n: int, pairs) -> np.ndarray:
    M = big(n)
    X = np.ones((len(pairs), n), np.float32)
    for r, (i, j) in enumerate(pairs):
        X[r, i] = M
        X[r, j] = -M
    return X


def _run(kernel: Kernel, op: str, X: np.ndarray) -> np.ndarray:
    """The kernel's sum of each row of X (one query per row)."""
    n = X.shape[1]
    try:
        if op == "sum":
            parts = (X[r : r + CHUNK].copy() for r in range(0, len(X), CHUNK))
            return np.concatenate([kernel.run("sum", [p], {"out": ("f32", (len(p),))})["out"] for p in parts])
        if op == "matmul":
            ones = np.ones((n, 1), np.float32)
            return np.concatenate(
                [
                    kernel.run("matmul", [X[r : r + CHUNK].copy(), ones], {"C": ("f32", (len(X[r : r + CHUNK]), 1))})[
                        "C"
                    ].reshape(-1)
                    for r in range(0, len(X), CHUNK)
                ]
            )
        ones = np.ones(n, np.float32)
        return np.array(
            [kernel.run("dot", [row.copy(), ones], {"out": ("f32", (1,))})["out"][0] for row in X], dtype=np.float32
        )
    except Unsupported as exc:
        raise InputError(f"the kernel does not implement {op}: {exc}") from None
    except KernelError as exc:
        raise InputError(f"the kernel failed on an order query: {exc}") from None


@dataclass
class Node:
    children: list
    target: int
    leaves: int

    def first(self) -> int:
        c = self.children[0]
        return c if isinstance(c, int) else c.first()


class NotATree(Exception):
    """The outputs are not those of any tree of binary32 additions."""


def lca_sizes(outputs: np.ndarray, n: int) -> np.ndarray:
    out = np.asarray(outputs, dtype=np.float64)
    if not np.all(np.isfinite(out)) or np.any(out != np.round(out)) or np.any(out < 0) or np.any(out > n - 2):
        bad = out[~(np.isfinite(out) & (out == np.round(out)) & (out >= 0) & (out <= n - 2))][:3]
        raise NotATree(
            f"outputs {bad.tolist()} are not counts of surviving ones: the kernel does not sum "
            f"in binary32 (higher-precision or compensated accumulation?)"
        )
    return (n - out).astype(np.int64)


def build_tree(sizes: np.ndarray, pairs, n: int):
    """The tree whose LCA sizes are ``sizes`` (one per pair)."""
    cluster = list(range(n))  # leaf -> its current top node (int for a bare leaf)
    top: dict[int, object] = {i: i for i in range(n)}

    def find(i):
        while cluster[i] != i:
            cluster[i] = cluster[cluster[i]]
            i = cluster[i]
        return i

    def leaves(x):
        return 1 if isinstance(x, int) else x.leaves

    for s, (i, j) in sorted(zip(sizes.tolist(), pairs)):
        ri, rj = find(i), find(j)
        if ri == rj:
            continue
        a, b = top[ri], top[rj]
        if isinstance(a, Node) and a.target == s and a.leaves < s:
            a.children.append(b)
            a.leaves += leaves(b)
            node = a
        elif isinstance(b, Node) and b.target == s and b.leaves < s:
            b.children.append(a)
            b.leaves += leaves(a)
            node = b
        else:
            node = Node([a, b], s, leaves(a) + leaves(b))
        if node.leaves > s:
            raise NotATree(
                f"positions {i} and {j} meet in a sum of {s} terms, but their partial sums already cover {node.leaves}"
            )
        cluster[rj] = ri
        top[ri] = node
    roots = {find(i) for i in range(n)}
    root = top[roots.pop()]
    if roots or leaves(root) != n:
        raise NotATree("the pairwise answers do not join all positions into one tree")
    _check_closed(root)
    return root


def _check_closed(node):
    if isinstance(node, Node):
        if node.leaves != node.target:
            raise NotATree(f"a partial sum of {node.target} terms covers only {node.leaves}")
        for c in node.children:
            _check_closed(c)


def render(node) -> str:
    if isinstance(node, int):
        return str(node)
    kids = sorted(node.children, key=lambda c: c if isinstance(c, int) else c.first())
    return "(" + "+".join(render(c) for c in kids) + ")"


class _OrderKernel(Kernel):
    """A candidate order posing as a sum kernel (to name a recovered tree)."""

    def __init__(self, order):
        self.order = order

    def call(self, op_name, inputs, out_specs):
        return self.order(inputs[0])


def probe(kernel: Kernel, op: str, n: int):
    """(tree, LCA sizes) of the kernel's accumulation for length n."""
    if op not in OPS:
        raise InputError(f"probe-order supports --op {', '.join(OPS)}")
    if not 1 <= n <= MAX_N:
        raise InputError(f"--n must be between 1 and {MAX_N} (the probe makes N(N-1)/2 queries)")
    if n == 1:
        return 0, np.zeros(0, np.int64)
    pairs = _pairs(n)
    sizes = lca_sizes(_run(kernel, op, query_rows(n, pairs)), n)
    return build_tree(sizes, pairs, n), sizes


def tree_name(order_name: str) -> str:
    """A candidate order's name as a tree shape: a tree cannot show where an
    accumulator starts (-0 or +0), so the start value is dropped."""
    for start in (" from -0", " from +0"):
        order_name = order_name.replace(start, "")
    return order_name


def names_for(sizes: np.ndarray, n: int) -> list[str]:
    """Tree shapes (``tree_name``) of the candidate orders whose tree for
    length n has these LCA sizes."""
    if n == 1:
        return ["(a single term)"]
    pairs = _pairs(n)
    X = query_rows(n, pairs)
    out = []
    for cand in orders.candidates(False):
        try:
            s = lca_sizes(cand(X), n)
        except NotATree:
            continue
        if np.array_equal(s, sizes) and tree_name(cand.name) not in out:
            out.append(tree_name(cand.name))
    return out
