"""The domain a verdict covers ([conf.domain.c1]): per op, each shape letter's
sizes among the cases checked, from the op's calling convention.
"""

from __future__ import annotations

import math
import re

import numpy as np

from ..base.case import Tiled
from ..table import OPS


_TENSOR = re.compile(r"((?:\w+, )*\w+): \w+\[([^\]]*)\]")
_LETTER = re.compile(r"[A-Za-z]\w*|\.\.\.")


def tensor_letters(op) -> dict:
    """("in" | "out", name) -> the shape letters of that tensor, from the op's signature (a bf16
    op: its binary32 op's); a letter that is not a name (a literal size, HS/2) is None, and "..."
    (any shape) counts as the one letter N: its element count."""
    sig = OPS[op].signature
    m = re.search(r"shapes as (\w+)", sig)
    if m and m.group(1) in OPS:
        sig = OPS[m.group(1)].signature
    head, _, tail = sig.partition("->")
    out = {}
    for kind, part in (("in", head), ("out", tail)):
        for names, dims in _TENSOR.findall(part):
            letters = [d.strip() if _LETTER.fullmatch(d.strip()) else None for d in dims.split(",")] if dims else []
            for n in names.split(", "):
                out.setdefault((kind, n), letters)
    return out


def domain(cases) -> dict:
    """op -> {"cases": n, "axes": {letter: sorted sizes}, "max_elements": the most elements (inputs
    and outputs) of one case}: the shapes at which these cases checked each op."""
    out: dict = {}
    letters_of: dict = {}
    for c in cases:
        d = out.setdefault(c.op, {"cases": 0, "axes": {}, "max_elements": 0})
        d["cases"] += 1
        if c.op not in letters_of:
            try:
                letters_of[c.op] = tensor_letters(c.op)
            except KeyError:  # an op this version does not know: its cases still count
                letters_of[c.op] = {}
        tl = letters_of[c.op]
        n = 0
        for kind, ts in (("in", c.inputs), ("out", c.outputs)):
            for name in ts:
                shape = ts.shape(name) if isinstance(ts, Tiled) else ts[name].shape  # a tiled one stays tiled
                size = math.prod(shape)
                n += size
                letters = tl.get((kind, name))
                if letters == ["..."]:
                    d["axes"].setdefault("N", set()).add(int(size))
                elif letters is not None and len(letters) == len(shape):
                    for x, v in zip(letters, shape):
                        if x is not None:
                            d["axes"].setdefault(x, set()).add(int(v))
        d["max_elements"] = max(d["max_elements"], n)
    for d in out.values():
        d["axes"] = {x: sorted(v) for x, v in d["axes"].items()}
    return out


def manifest_domain(manifest) -> dict:
    """``domain`` of a manifest's cases, from the shapes it lists (nothing is read or allocated:
    each tensor is a zero-strided view of its shape)."""
    from types import SimpleNamespace

    from numpy.lib.stride_tricks import as_strided

    one = np.zeros(1, np.uint8)

    def view(shape):
        return as_strided(one, tuple(shape), (0,) * len(shape))

    cases = [
        SimpleNamespace(
            op=c["op"],
            inputs={t["name"]: view(t["shape"]) for t in c["inputs"]},
            outputs={t["name"]: view(t["shape"]) for t in c["outputs"]},
        )
        for c in manifest["cases"]
    ]
    return domain(cases)


def domain_line(op, d) -> str:
    axes = ", ".join(
        f"{x} {v[0]}..{v[-1]} ({len(v)} sizes)" if len(v) > 1 else f"{x} {v[0]}" for x, v in d["axes"].items()
    )
    return f"{op}: {axes or 'no shape letters'}; {d['cases']} cases, up to {d['max_elements']:,} elements a case"
