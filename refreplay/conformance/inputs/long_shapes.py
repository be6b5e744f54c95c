"""Sweep cases ([conf.probes.c1], family ``sweep``): thin-but-long shapes.

A kernel often changes algorithm with shape: split-K above some K, an
online (blocked) softmax at vocabulary sizes, tiles at long sequences.  The
other families stop at K = 1024 or less, so such a kernel would pass them.
A sweep case keeps every dimension but the reduction small, so that a long
reduction costs few bytes: dot products and matmuls with K at powers of two
and their neighbours up to 65,537, sums up to N = 65,537, softmax, log-softmax
and cross-entropy rows up to V = 65,537 (50,257 included), attention up to
T = 1,024, norms up to C = 8,192 and the int8 matmul at its K bound.

The axis sweeps over every letter of the ops' shapes are ``shapes/axes.py``.

Every sweep case of an op that is a sum whose sums have 64 terms or more is
checked at generation time
(``separation.check_sweep``): the same sums split into two halves (each summed
in order, then added, the simplest split-K) give other bits on at least one
output; inputs are redrawn until they do (``separation.separating``).
"""

from __future__ import annotations

from .separation import separating
from . import values as V

# K, N: powers of two and their neighbours; the long ones on thin shapes.
SHORT_K = tuple(k for p in range(6, 13) for k in (2**p - 1, 2**p, 2**p + 1))  # 63 .. 4097
LONG_K = (8192, 16385, 65536, 65537)
DOT_K = SHORT_K[::3] + (16385, 65536)
SUM_N = SHORT_K[::3] + (8192, 16385, 65536)
THIN_K = (4097, 32769)  # the transposed layouts and column sums: fewer, same reach
V_SWEEP = (1025, 4097, 50257, 65536)
V_BACKWARD = (4097, 50257)
T_SWEEP = (63, 64, 65, 255, 257, 1024)
T_BACKWARD = (64, 257, 300)  # the backward reads att [T, T]: the axis sweep (axes.LATER_T) goes on
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
        inputs = separating(op, lambda: to_layout(_spread(rng, (i, k)), _spread(rng, (k, j))))
        out.append(("sweep", inputs, note(f"I,K,J={i},{k},{j}")))
    return out


def dot_cases(op, rng):
    return [
        ("sweep", separating(op, lambda k=k: {"x": _spread(rng, k), "y": _spread(rng, k)}), note(f"K={k}"))
        for k in DOT_K
    ]


def sum_cases(op, rng, lengths, shaped):
    """Rows of N terms (2 rows up to N = 4097, then 1), stored by ``shaped``."""
    out = []
    for n in lengths:
        r = 2 if n <= 4097 else 1
        out.append(("sweep", separating(op, lambda: {"X": shaped(_spread(rng, (r, n)))}), note(f"{r} sums of {n}")))
    return out
