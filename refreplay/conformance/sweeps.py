"""Sweep cases ([conf.probes.c1], family ``sweep``): thin-but-long shapes.

A kernel often changes algorithm with shape: split-K above some K, an
online (blocked) softmax at vocabulary sizes, tiles at long sequences.  The
other families stop at K = 1024 or less, so such a kernel would pass them.
A sweep case keeps every dimension but the reduction small, so that a long
reduction costs few bytes: dot products and matmuls with K at powers of two
and their neighbours up to 65,537, sums up to N = 65,537, softmax, log-softmax
and cross-entropy rows up to V = 65,537 (50,257 included), attention up to
T = 1,024, norms up to C = 8,192 and the int8 matmul at its K bound.

Every sweep case of an op that is a sum is checked at generation time
(``builders.check_sweep``): the same sums split into two halves (each summed
in order, then added, the simplest split-K) give other bits on at least one
output; inputs are redrawn until they do (``builders.separating``).
"""
from __future__ import annotations

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
# V = 50,304, F = 6,400) and beyond: reductions (K, V, C) to 65,537 where a case stays under
# 1 MB, rows, tokens and other non-reduced axes to 4,097, element counts to 2^22 + 1.  Element
# counts of 1,024 and more are stored tiled ([conf.vectors.c2]: a 1,031-element pattern repeated),
# so the counts past 2^20 cost kilobytes.  The reason for the sizes: each is just past a switch a
# kernel nobody here wrote was measured to make (issue 31: split-K, blocked norms above C = 8,192,
# LayerNorm dw/db in two row halves above N = 512, a pairwise token mean above 1,024 tokens,
# embedding backward reordered above 4,096 tokens, another AdamW formula above 2^20 elements,
# bf16 accumulation above K = 8,192, a fast path when J and K are multiples of 128).

def around(*centres):
    return tuple(sorted({x for c in centres for x in (c - 1, c, c + 1)}))


ROWS = around(8, 16, 64, 128, 512, 1024) + (4097,)  # rows, tokens, heads: parallel or summed
RED = around(128, 1024, 8192) + (16384, 16385)      # reduction lengths on a thin shape
COUNTS = around(8, 16, 64, 128) + (1024, 1025, 4096, 4097, 65537, 2 ** 20, 2 ** 20 + 1)
BIG_COUNT = 2 ** 22 + 1       # ops also swept past 2^22 elements (tiled)
BIG_COUNT_OPS = ("adamw_update", "add", "mul", "gelu_forward", "bf16_add", "bf16_encode")
TILE_FROM = 4096              # element counts from here on are stored tiled
TILE = 1031                   # the pattern length (a prime: no alignment repeats inside it)
# (I, K, J) with K and J multiples of 128 (a fast path's condition) and beside them, and cubes of
# the alignments 8, 16, 64
ALIGNED_MM = ((8, 8, 8), (16, 16, 16), (64, 64, 64), (1, 128, 128), (2, 256, 128), (1, 129, 128),
              (1, 128, 129), (128, 128, 1))


def _mm_axes(op):
    long = () if op == "matmul" else (65537,)  # matmul's own sweep has K = 65,536 and 65,537
    return {"I": ROWS, "K": RED + long, "J": ROWS}, {"I": 1, "K": 3, "J": 1}


def _axes(op):
    """(letter -> sizes, thin base dims) of ``op`` (a bf16 op: its binary32 op's), or None."""
    base = op[5:] if op.startswith("bf16_") and op not in ("bf16_encode", "bf16_decode") else op
    bf16 = base != op
    if base in ("matmul", "matmul_nt", "matmul_tn"):
        return _mm_axes(base)
    if base == "matmul_i8":
        return {"I": around(128), "J": around(128)}, {"I": 1, "K": 3, "J": 1}
    if base == "dot":
        return {"K": around(8192) + (65537,)}, {"K": 3}
    if base in ("sum", "max"):
        return {"I": ROWS, "N": around(1024, 8192) + (65537,)}, {"I": 1, "N": 3}
    if base == "col_sum":
        return {"N": RED + (65537,), "J": ROWS}, {"N": 3, "J": 1}
    if base in ("linear_forward", "linear_backward"):
        sizes = around(128, 1024) + (4097, 8193)
        return {"N": sizes, "C": sizes, "OC": sizes}, {"N": 1, "C": 2, "OC": 1}
    if base in ("layernorm_forward", "layernorm_backward", "rmsnorm_forward", "rmsnorm_backward"):
        return {"N": ROWS, "C": (8193, 16385) if bf16 else (8191, 8193, 16384, 16385)}, {"N": 1, "C": 2}
    if base in ("softmax_forward", "log_softmax_forward", "cross_entropy_forward", "cross_entropy_backward"):
        return {"N": ROWS, "V": (8191, 8193, 16385) + (() if bf16 else (65537,))}, {"N": 1, "V": 2}
    if base in ("softmax_backward", "log_softmax_backward"):
        return {"N": ROWS, "V": (1025, 8191, 8193, 16385) + (() if bf16 else (65536,))}, {"N": 1, "V": 2}
    if base in ("attention_forward", "attention_backward"):
        return {"NH": (16, 17, 25), "HS": around(64, 128)}, {"B": 1, "NH": 1, "T": 3, "HS": 2}
    if base in ("rope_forward", "rope_backward"):
        return {"T": around(1024) + (4097,), "HS": (62, 64, 66, 126, 128, 130)}, {"B": 1, "NH": 1, "T": 2, "HS": 2}
    if base in ("embedding_forward", "embedding_backward"):
        return ({"T": around(1024, 4096) + (8193,), "C": around(1024), "V": (4097, 50257)},
                {"B": 1, "T": 2, "C": 2, "V": 3})
    from .live import LIVE

    lv = LIVE.get(op)
    if lv is not None and lv.letters == ("N",):  # elementwise ops, the step size, AdamW
        return {"N": COUNTS + ((BIG_COUNT,) if op in BIG_COUNT_OPS else ())}, {"N": 1}
    return None


REDUCED = {"K", "V", "C"}  # letters whose sizes are sum lengths in a summing op ([conf.probes.c1])


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
            dims = {**base, letter: v}
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
