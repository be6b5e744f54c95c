"""The axis sweeps ([conf.domain.c1], family ``sweep``): for every op with a
live form, each shape letter at aligned sizes and their neighbours with the
other letters thin: rows, tokens, heads and element counts as well as the
reductions, so that a switch on any axis an implementation tiles meets a
case just past it.  (The thin-but-long reductions are ``inputs/long_shapes``.)
"""

from __future__ import annotations

import numpy as np

from ..inputs.separation import reversing_rows, separating
from . import live, long_rows

# ---- axis sweeps ([conf.domain.c1]): every axis an implementation could tile ----------------------
#
# Each op with a live form (``live.py``) lists, per shape letter, the sizes swept with every other
# letter thin (1 to 3), so a case costs about as many elements as the swept size.  Sizes are the
# alignments an implementation may special-case (8, 16, 64, 128, powers of two) with their
# neighbours at -1 and +1, up to the sizes of the largest presets (gpt2-xl: C = 1,600, T = 1,024,
# V = 50,304, F = 6,400) and beyond: reductions (K, V, C) around 128, 1,024 and 8,192 and to
# 16,385 (the sweep cases above reach 65,537 on the same ops; the row ops reach 65,537 as tiled
# single rows, LATER below), rows, tokens and other non-reduced axes to 4,097, element counts to
# 2^22 + 1.
# Element counts of 1,024 and more are stored tiled ([conf.vectors.c2]: a 251-element pattern
# repeated), so the counts past 2^20 cost kilobytes in the files (and the loader keeps them as
# their pattern until the case runs: 2^22 + 1 on every element-wise op, LATER below).
# Size: the vectors grew from 24.5 MB to 37.2 MB, then 38.3 MB with LATER's cases (cap 40 MB), most of
# it the [V, C] and [K, J] tensors of the norms, softmaxes, matmuls and embeddings at 8,193 and
# the manifest's entries for 2,170 cases.  The reason for the sizes: each is just past a switch a
# kernel nobody here wrote was measured to make (issue 31: split-K, blocked norms above C = 8,192,
# LayerNorm dw/db in two row halves above N = 512, a pairwise token mean above 1,024 tokens,
# embedding backward reordered above 4,096 tokens, another AdamW formula above 2^20 elements,
# bf16 accumulation above K = 8,192, a fast path when J and K are multiples of 128).


def around(*centres):
    return tuple(sorted({x for c in centres for x in (c - 1, c, c + 1)}))


ROWS = around(8, 16, 64, 128, 512, 1024) + (4097,)  # rows summed over: column sums, dw/db, tokens
ROWS_PAR = (15, 16, 17, 127, 128, 129, 1025)  # rows computed apart (a kernel may still switch)
RED = around(128, 1024, 8192)  # reduction lengths on a thin shape
COUNTS = around(8, 16, 64, 128) + (1024, 1025, 4096, 4097, 65537)
# past 2^20 and 2^22 elements (tiled, but whole once loaded: 2^22 + 1 elements are 16 MiB a tensor,
# so only the optimizer, whose update is one tensor of a whole model, and the add of a residual)
BIG_COUNTS = {
    "adamw_update": (2**20, 2**20 + 1, 2**22 + 1),
    "add": (2**20 + 1,),
    "mul": (2**20 + 1,),
    "bf16_add": (2**20 + 1,),
}
TILE_FROM = 1024  # element counts from here on are stored tiled
TILE = 251  # the pattern length (a prime: no alignment repeats inside it)
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
    lv = live.LIVE.get(op)
    if lv is not None and lv.letters == ("N",):  # elementwise ops, the step size, AdamW
        return {"N": COUNTS + BIG_COUNTS.get(op, ())}, {"N": 1}
    return None


THINNER = {("embedding_forward", "V"): {"C": 1}, ("embedding_backward", "V"): {"C": 1}}  # [V, C] tables


def _elementwise():
    """The element-wise ops with a live form (one letter, N), less AdamW (its own BIG_COUNTS) and
    the bf16 ops that sweep as their binary32 op (``_later``)."""
    return tuple(
        op
        for op, lv in live.LIVE.items()
        if lv.letters == ("N",) and op != "adamw_update" and not (op.startswith("bf16_") and op[5:] in live.LIVE)
    )


# Cases drawn after every case above (so every earlier case keeps its bits):
# - the row ops' reductions to 65,537: one row (N = 1) whose elements are a 251-element pattern
#   repeated, stored tiled ([conf.vectors.c2]), so each costs kilobytes;
# - the linear layers' reductions past the largest preset's (gpt2-xl's MLP projection sums
#   C = 6,400), at 8,193 (0.5 MB for binary32 and bf16 together);
# - element counts past 2^22 on the ops of a training step's largest tensors (the residual add,
#   GELU over the MLP's hidden), then on every other element-wise op and its bf16 twin: the
#   bound of [conf.vectors.c2] is per case (2^26 elements), the reader untiling a case only when
#   it runs, so these cost kilobytes in the files and one case's tensors in memory.
ROW_TILE_FROM = 32768  # a one-row reduction this long is stored tiled
_LONG_ROW = {"C": (65537,)}
_LONG_V = {"V": (65537,)}
LATER = {
    **dict.fromkeys(("layernorm_forward", "rmsnorm_forward", "layernorm_backward", "rmsnorm_backward"), _LONG_ROW),
    **dict.fromkeys(("softmax_forward", "log_softmax_forward", "softmax_backward", "log_softmax_backward"), _LONG_V),
    "cross_entropy_forward": _LONG_V,  # (backward's one-hot term is no pattern: its sweep reaches 65,536)
    **dict.fromkeys(("linear_forward", "linear_backward"), {"C": (8193,), "OC": (8193,)}),
    # element counts past 2^22: the residual add and GELU first, then (once [conf.vectors.c2]
    # bounded each case, not the manifest) every other element-wise op
    **dict.fromkeys(_elementwise(), {"N": (2**22 + 1,)}),
}


# A tiled row must separate the spec's order from the reversed one on some output
# (separation.reversing_rows); for the bf16 log-softmaxes none of 400 draws does (the row's sum
# enters their bf16 outputs through a logarithm or a probability, and 251 distinct elements round
# both orders alike), so their rows are built to sit at a bf16 rounding boundary
# (long_rows.DESIGNED) and drawn after every other case of theirs, at 32,769 and 65,537.
_BF16_LOG_V = {"V": (32769, 65537, 16385)}  # 16,385 stored whole (below ROW_TILE_FROM), built alike
LATER_BF16 = dict.fromkeys(long_rows.DESIGNED, _BF16_LOG_V)

# Attention's sequence length, the axis its reductions run along (the softmax over s <= t, out
# and dq over s <= t, dk and dv over t >= s): the other case families reach T = 1,024 forward
# (257 for bf16) but only 300 backward (130 for bf16), and an attention backward that
# accumulated dv another way above T = 512 was CONFORMANT.  att [T, T] is an input of the
# backward, binary32 in both profiles, the forward's own (a kernel may recompute it from q and k,
# so it is not drawn), stored as its lower triangle ([conf.vectors.c3]): thin otherwise (B = NH =
# 1, HS = 2), T = 512 (aligned) and 513 cost 0.53 MB each, T = 1,025 (past gpt2's 1,024, the
# switches above 512 and at 1,024) 2.1 MB.  The forwards' att from T = 513 is held by its sha256
# ([conf.vectors.c4]), so their long cases cost kilobytes.  The vectors stay under 40 MB.
LATER_T = {
    "attention_backward": {"T": (513, 512, 1025)},
    "bf16_attention_backward": {"T": (257, 513, 1025)},
    "attention_forward": {"T": (1025,)},
    "bf16_attention_forward": {"T": (512, 1024, 1025)},
}


def _later(op):
    """The LATER sizes of ``op``; a bf16 op has its binary32 op's."""
    return LATER_BF16.get(op) or LATER.get(op) or LATER.get(op.removeprefix("bf16_"), {})


def _latest(op):
    """Sizes drawn after every other case of ``op`` (LATER_T)."""
    return LATER_T.get(op, {})


def axis_cases(op, rng):
    """[conf.domain.c1] The axis sweep of ``op``: ``(family, inputs, note, tiles, separate)``
    tuples.  ``tiles``: tensor key -> pattern length ([conf.vectors.c2]); ``separate``: the case
    must tell the spec's sum from a split in two (``separation.check_sweep``), asked of every
    case of a summing op whose summed length is 64 or more."""
    spec = _axes(op.name)
    if spec is None:
        return []
    sizes, base = spec
    out = [_axis_case(op, rng, base, letter, v) for letter, values in sizes.items() for v in values]
    for i, k, j in ALIGNED_MM if sizes.keys() >= {"I", "K", "J"} else ():
        dims = {"I": i, "K": k, "J": j}
        lv = live.LIVE[op.name]

        def draw(dims=dims):
            return lv.make(live.NumpySource(rng), dims)

        out.append(
            (
                "sweep",
                separating(op, draw) if op.terms is not None else draw(),
                f"aligned I,K,J = {i},{k},{j}",
                {},
                op.terms is not None,
            )
        )
    out += [_axis_case(op, rng, base, letter, v) for letter, values in _later(op.name).items() for v in values]
    out += [_axis_case(op, rng, base, letter, v) for letter, values in _latest(op.name).items() for v in values]
    return [c for c in out if c is not None]


def _axis_case(op, rng, base, letter, v):
    """One sweep case: ``letter`` = ``v``, the other letters thin; None where the live form
    refuses the shape.  Element counts from TILE_FROM, and one-row reductions from
    ROW_TILE_FROM, are drawn as a TILE-element pattern repeated ([conf.vectors.c2])."""
    lv = live.LIVE[op.name]
    dims = {**base, **THINNER.get((op.name.removeprefix("bf16_"), letter), {}), letter: v}
    if lv.check is not None and lv.check(dims):
        return None
    others = int(np.prod([d for x, d in dims.items() if x != letter]))
    tiled = v >= TILE_FROM if lv.letters == ("N",) else (v >= ROW_TILE_FROM and others == 1)
    make_dims = {**dims, letter: TILE} if tiled else dims
    summed = _summed(op.name, dims)
    separate = op.terms is not None and summed >= 64

    def draw():
        inputs = lv.make(live.NumpySource(rng), make_dims)
        if tiled:  # every tensor of the pattern's length is the pattern repeated to the swept size
            inputs = {
                k: (np.resize(a, tuple(v if s == TILE else s for s in a.shape)) if a.size == TILE else a)
                for k, a in inputs.items()
            }
        return inputs

    built = op.name in long_rows.DESIGNED and letter == "V" and v in _BF16_LOG_V["V"]
    if built:  # built rows, not drawn ones
        draw = long_rows.DESIGNED[op.name](rng, v)
    if separate:
        inputs = separating(op, draw)
    elif built or (tiled and lv.letters != ("N",)):  # a tiled row: its order must show on some output
        inputs = reversing_rows(op, draw, v)
    else:
        inputs = draw()
    tiles = {f"in/{k}": TILE for k, a in inputs.items() if tiled and a.size == v}
    return ("sweep", inputs, f"axis {letter} = {v}: {_fmt(dims)}; thin on the other axes", tiles, separate)


def _summed(op, dims):
    base = op[5:] if op.startswith("bf16_") else op
    if base in ("matmul", "matmul_nt", "matmul_tn", "dot"):
        return dims["K"]
    if base in ("sum", "col_sum"):
        return dims["N"]
    return 0


def _fmt(dims):
    return ",".join(f"{x}={v}" for x, v in dims.items())
