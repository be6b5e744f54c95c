"""Sweep cases ([conf.probes.c1], family ``sweep``): thin-but-long shapes.

A kernel often changes algorithm with shape: split-K above some K, an
online (blocked) softmax at vocabulary sizes, tiles at long sequences.  The
other families stop at K = 1024 or less, so such a kernel would pass them.
A sweep case keeps every dimension but the reduction small, so that a long
reduction costs few bytes: dot products and matmuls with K at powers of two
and their neighbours up to 65,537, sums up to N = 65,537, softmax, log-softmax
and cross-entropy rows up to V = 65,537 (50,257 included), attention up to
T = 1,024, norms up to C = 8,192 and the int8 matmul at its K bound.

The axis sweeps (``axis_cases``, [conf.domain.c1]) add, for every op with a
live form, each shape letter at aligned sizes and their neighbours with the
other letters thin: rows, tokens, heads and element counts as well as the
reductions, so that a switch on any axis an implementation tiles meets a
case just past it.

Every sweep case of an op that is a sum whose sums have 64 terms or more is
checked at generation time
(``builders.check_sweep``): the same sums split into two halves (each summed
in order, then added, the simplest split-K) give other bits on at least one
output; inputs are redrawn until they do (``builders.separating``).
"""
from __future__ import annotations

import re

import numpy as np

from . import builders as Bld, values as V

# K, N: powers of two and their neighbours; the long ones on thin shapes.
SHORT_K = tuple(k for p in range(6, 13) for k in (2 ** p - 1, 2 ** p, 2 ** p + 1))  # 63 .. 4097
LONG_K = (8192, 16385, 65536, 65537)
DOT_K = SHORT_K[::3] + (16385, 65536)
SUM_N = SHORT_K[::3] + (8192, 16385, 65536)
THIN_K = (4097, 32769)  # the transposed layouts and column sums: fewer, same reach
V_SWEEP = (1025, 4097, 50257, 65536)
V_BACKWARD = (4097, 50257)
T_SWEEP = (63, 64, 65, 255, 257, 1024)
T_BACKWARD = (64, 257, 300)  # the backward reads att [T, T]: 1,024 would cost 4 MB more
C_SWEEP = (1023, 1024, 1025, 4097, 8192)
I8_K = (131071,)  # [mm.i8.c2] the largest K whose int32 sums cannot overflow


def note(what: str) -> str:
    return f"{what}; a long reduction on a thin shape"


def _spread(rng, shape):
    return V.random_f32(rng, shape, -8, 8)


def _thin(k):
    """(I, J): 2 x 3 outputs up to K = 4097, 1 x 2 up to 16,385, then 1 x 1."""
    return (2, 3) if k <= 4097 else (1, 2) if k <= 16385 else (1, 1)


def matmul_cases(op, rng, to_layout, ks):
    """A: I x K, B: K x J (``_thin``) stored by ``to_layout``."""
    out = []
    for k in ks:
        i, j = _thin(k)
        inputs = Bld.separating(op, lambda: to_layout(_spread(rng, (i, k)), _spread(rng, (k, j))))
        out.append(("sweep", inputs, note(f"I,K,J={i},{k},{j}")))
    return out


def dot_cases(op, rng):
    return [("sweep", Bld.separating(op, lambda k=k: {"x": _spread(rng, k), "y": _spread(rng, k)}), note(f"K={k}"))
            for k in DOT_K]


def sum_cases(op, rng, lengths, shaped):
    """Rows of N terms (2 rows up to N = 4097, then 1), stored by ``shaped``."""
    out = []
    for n in lengths:
        r = 2 if n <= 4097 else 1
        out.append(("sweep", Bld.separating(op, lambda: {"X": shaped(_spread(rng, (r, n)))}),
                    note(f"{r} sums of {n}")))
    return out


# ---- axis sweeps ([conf.domain.c1]): every axis an implementation could tile ----------------------
#
# Each op with a live form (``live.py``) lists, per shape letter, the sizes swept with every other
# letter thin (1 to 3), so a case costs about as many elements as the swept size.  Sizes are the
# alignments an implementation may special-case (8, 16, 64, 128, powers of two) with their
# neighbours at -1 and +1, up to the sizes of the largest presets (gpt2-xl: C = 1,600, T = 1,024,
# V = 50,304, F = 6,400) and beyond: reductions (K, V, C) around 128, 1,024 and 8,192 and to
# 16,385 (the sweep cases above reach 65,537 on the same ops: repeating them would cost
# megabytes), rows, tokens and other non-reduced axes to 4,097, element counts to 2^22 + 1.
# Element counts of 1,024 and more are stored tiled ([conf.vectors.c2]: a 251-element pattern
# repeated), so the counts past 2^20 cost kilobytes in the files (the loader makes them whole:
# 2^22 + 1 only for AdamW).  Size: the vectors grew from 24.5 MB to 37.2 MB (cap 40 MB), most of
# it the [V, C] and [K, J] tensors of the norms, softmaxes, matmuls and embeddings at 8,193 and
# the manifest's entries for 2,170 cases.  The reason for the sizes: each is just past a switch a
# kernel nobody here wrote was measured to make (issue 31: split-K, blocked norms above C = 8,192,
# LayerNorm dw/db in two row halves above N = 512, a pairwise token mean above 1,024 tokens,
# embedding backward reordered above 4,096 tokens, another AdamW formula above 2^20 elements,
# bf16 accumulation above K = 8,192, a fast path when J and K are multiples of 128).

def around(*centres):
    return tuple(sorted({x for c in centres for x in (c - 1, c, c + 1)}))


ROWS = around(8, 16, 64, 128, 512, 1024) + (4097,)  # rows summed over: column sums, dw/db, tokens
ROWS_PAR = (15, 16, 17, 127, 128, 129, 1025)        # rows computed apart (a kernel may still switch)
RED = around(128, 1024, 8192)                       # reduction lengths on a thin shape
COUNTS = around(8, 16, 64, 128) + (1024, 1025, 4096, 4097, 65537)
# past 2^20 and 2^22 elements (tiled, but whole once loaded: 2^22 + 1 elements are 16 MiB a tensor,
# so only the optimizer, whose update is one tensor of a whole model, and the add of a residual)
BIG_COUNTS = {"adamw_update": (2 ** 20, 2 ** 20 + 1, 2 ** 22 + 1), "add": (2 ** 20 + 1,), "mul": (2 ** 20 + 1,),
              "bf16_add": (2 ** 20 + 1,)}
TILE_FROM = 1024              # element counts from here on are stored tiled
TILE = 251                    # the pattern length (a prime: no alignment repeats inside it)
# (I, K, J) with K and J multiples of 128 (a fast path's condition) and beside it, and cubes of
# the alignments 8, 16, 64
ALIGNED_MM = ((8, 8, 8), (16, 16, 16), (64, 64, 64), (1, 128, 128), (2, 256, 128), (1, 128, 127))


def _mm_axes(op):
    # matmul's own sweep has every K from 63 to 4097 and 8192 to 65,537; the others reach
    # K = 4097 and 32,769 there
    k = (8191, 8193) if op == "matmul" else RED
    return {"I": ROWS_PAR, "K": k, "J": ROWS_PAR}, {"I": 1, "K": 3, "J": 1}


def _axes(op):
    """(letter -> sizes, thin base dims) of ``op`` (a bf16 op: its binary32 op's), or None."""
    base = op[5:] if op.startswith("bf16_") and op not in ("bf16_encode", "bf16_decode") else op
    bf16 = base != op
    if base in ("matmul", "matmul_nt", "matmul_tn"):
        return _mm_axes(base)
    if base == "matmul_i8":
        return {"I": around(128), "J": around(128)}, {"I": 1, "K": 3, "J": 1}
    if base == "dot":
        return {"K": around(8192)}, {"K": 3}  # DOT_K reaches 65,536
    if base in ("sum", "max"):  # SUM_N reaches 65,536 for sum; max has rows to 4,099 otherwise
        return {"I": ROWS_PAR, "N": around(1024, 8192) + ((16385,) if base == "max" else ())}, {"I": 1, "N": 3}
    if base == "col_sum":
        return {"N": RED, "J": ROWS_PAR}, {"N": 3, "J": 1}
    if base in ("linear_forward", "linear_backward"):
        sizes = (128, 129, 1024, 1025, 4097)
        return {"N": sizes, "C": sizes, "OC": sizes}, {"N": 1, "C": 2, "OC": 1}
    if base in ("layernorm_backward", "rmsnorm_backward"):  # dw (and db) sum the rows
        return {"N": ROWS, "C": (8193,)}, {"N": 1, "C": 2}
    if base in ("layernorm_forward", "rmsnorm_forward"):
        return {"N": ROWS_PAR, "C": (8193,) if bf16 else (8193, 16385)}, {"N": 1, "C": 2}
    if base in ("softmax_forward", "log_softmax_forward", "cross_entropy_backward"):
        return {"N": ROWS_PAR, "V": (8191, 8193)}, {"N": 1, "V": 2}  # the sweep's own reach 65,536
    if base == "cross_entropy_forward":  # the mean sums the tokens
        return {"N": ROWS, "V": (8191, 8193)}, {"N": 1, "V": 2}
    if base in ("softmax_backward", "log_softmax_backward"):
        return {"N": ROWS_PAR, "V": (8191, 8193) + (() if bf16 else (16385,))}, {"N": 1, "V": 2}
    if base in ("attention_forward", "attention_backward"):
        return {"NH": (16, 17, 25), "HS": around(64, 128)}, {"B": 1, "NH": 1, "T": 3, "HS": 2}
    if base in ("rope_forward", "rope_backward"):
        return {"T": (1023, 1024, 1025), "HS": (62, 64, 66, 126, 128, 130)}, {"B": 1, "NH": 1, "T": 2, "HS": 2}
    if base == "embedding_forward":
        return {"C": around(1024), "V": (50257,)}, {"B": 1, "T": 2, "C": 2, "V": 3}
    if base == "embedding_backward":  # the tokens are summed
        return {"T": around(1024, 4096) + (8193,), "V": (50257,)}, {"B": 1, "T": 2, "C": 2, "V": 3}
    from .live import LIVE

    lv = LIVE.get(op)
    if lv is not None and lv.letters == ("N",):  # elementwise ops, the step size, AdamW
        return {"N": COUNTS + BIG_COUNTS.get(op, ())}, {"N": 1}
    return None


THINNER = {("embedding_forward", "V"): {"C": 1}, ("embedding_backward", "V"): {"C": 1}}  # [V, C] tables


def axis_cases(op, rng):
    """[conf.domain.c1] The axis sweep of ``op``: ``(family, inputs, note, tiles, separate)``
    tuples.  ``tiles``: tensor key -> pattern length ([conf.vectors.c2]); ``separate``: the case
    must tell the spec's sum from a split in two (``builders.check_sweep``), asked of every
    case of a summing op whose summed length is 64 or more."""
    from . import live

    spec = _axes(op.name)
    if spec is None:
        return []
    sizes, base = spec
    lv = live.LIVE[op.name]
    out = []
    for letter, values in sizes.items():
        for v in values:
            dims = {**base, **THINNER.get((op.name.removeprefix("bf16_"), letter), {}), letter: v}
            if lv.check is not None and lv.check(dims):
                continue
            tiled = lv.letters == ("N",) and v >= TILE_FROM
            make_dims = {**dims, "N": TILE} if tiled else dims
            summed = _summed(op.name, dims)
            separate = op.terms is not None and summed >= 64

            def draw(make_dims=make_dims, dims=dims, tiled=tiled):
                inputs = lv.make(live.NumpySource(rng), make_dims)
                if tiled:
                    inputs = {k: (np.resize(a, dims["N"]) if a.shape == (TILE,) else a) for k, a in inputs.items()}
                return inputs

            inputs = Bld.separating(op, draw) if separate else draw()
            tiles = {f"in/{k}": TILE for k, a in inputs.items() if tiled and a.shape == (v,)}
            out.append(("sweep", inputs, f"axis {letter} = {v}: {_fmt(dims)}; thin on the other axes",
                        tiles, separate))
    for i, k, j in (ALIGNED_MM if _axes(op.name)[0].keys() >= {"I", "K", "J"} else ()):
        dims = {"I": i, "K": k, "J": j}

        def draw(dims=dims):
            return lv.make(live.NumpySource(rng), dims)

        out.append(("sweep", Bld.separating(op, draw) if op.terms is not None else draw(),
                    f"aligned I,K,J = {i},{k},{j}", {}, op.terms is not None))
    return out


def _summed(op, dims):
    base = op[5:] if op.startswith("bf16_") else op
    if base in ("matmul", "matmul_nt", "matmul_tn", "dot"):
        return dims["K"]
    if base in ("sum", "col_sum"):
        return dims["N"]
    return 0


def _fmt(dims):
    return ",".join(f"{x}={v}" for x, v in dims.items())


# ---- the domain a verdict covers ([conf.domain.c1]) ------------------------------------------

_TENSOR = re.compile(r"((?:\w+, )*\w+): \w+\[([^\]]*)\]")
_LETTER = re.compile(r"[A-Za-z]\w*|\.\.\.")


def tensor_letters(op) -> dict:
    """("in" | "out", name) -> the shape letters of that tensor, from the op's signature (a bf16
    op: its binary32 op's); a letter that is not a name (a literal size, HS/2) is None, and "..."
    (any shape) counts as the one letter N: its element count."""
    from .registry import OPS

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
            for name, a in ts.items():
                n += a.size
                letters = tl.get((kind, name))
                if letters == ["..."]:
                    d["axes"].setdefault("N", set()).add(int(a.size))
                elif letters is not None and len(letters) == a.ndim:
                    for x, v in zip(letters, a.shape):
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

    cases = [SimpleNamespace(op=c["op"], inputs={t["name"]: view(t["shape"]) for t in c["inputs"]},
                             outputs={t["name"]: view(t["shape"]) for t in c["outputs"]}) for c in manifest["cases"]]
    return domain(cases)


def domain_line(op, d) -> str:
    axes = ", ".join(f"{x} {v[0]}..{v[-1]} ({len(v)} sizes)" if len(v) > 1 else f"{x} {v[0]}"
                     for x, v in d["axes"].items())
    return f"{op}: {axes or 'no shape letters'}; {d['cases']} cases, up to {d['max_elements']:,} elements a case"
