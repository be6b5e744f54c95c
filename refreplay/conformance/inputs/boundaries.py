"""Where each elementwise clause of chapters 1 and 2 changes branch, and
where its rounding ties lie: the inputs of the per-op "edge" case
"branch boundaries" ([conf.probes.c1]).

Each function returns float32 inputs: the boundary values the clause names
(thresholds, special-case limits, constants whose neighbours take the other
branch) with their neighbours at +-1 and +-2 ulp, and inputs at which a
rounding inside the algorithm is an exact tie.  A kernel that moves a
threshold by one ulp, takes ">" for ">=", or rounds a tie the other way gives
other bits on one of them.  Tie points are found in float64 at generation
time (exact IEEE arithmetic, the same bits everywhere).
"""

from __future__ import annotations

import math

import numpy as np

from . import values as V

LN2 = math.log(2.0)


def _both_signs(patterns):
    return list(patterns) + [p ^ 0x80000000 for p in patterns]


def _ties(step, ks):
    """Binary32 inputs nearest to (k + 1/2) * step: where rint(x / step) is a tie."""
    return V.nearest([(k + 0.5) * step for k in ks])


def recip():
    return V.neighbours(
        _both_signs(
            [0x7E800000, 0x7E7FFFFF, 0x00800000, 0x3F800000, 0x7F7FFFFF, 0x00000000, 0x7F800000, 0x3F000000, 0x7E000000]
        )
    )


def sqrt():
    return V.neighbours(
        [
            0x00000000,
            0x80000000,
            0x00800000,
            0x3F800000,
            0x40800000,
            0x7F7FFFFF,
            0x7F800000,
            0x80800000,
            0xBF800000,
            0xFF800000,
            0x00000001,
        ]
    )


def rint():
    halves = V.nearest([k + 0.5 for k in range(-6, 6)] + [2.0**22 + 0.5, 2.0**23 - 0.5, -(2.0**23 - 0.5)])
    return V.neighbours(_both_signs(halves + [0x4B000000, 0x3EFFFFFF, 0x3F000000, 0x00000000, 0x7F800000]))


def exp():
    limits = [
        0x42B17217,
        0xC2B00000,
        0xC2AEAC4F,
        0xC2AEAC50,
        0x00000000,
        0x80000000,
        0x00800000,
        0x80800000,
        0x7F800000,
        0xFF800000,
        0x33800000,
        0xB3800000,
    ]
    return V.neighbours(limits + _ties(LN2, range(-127, 128)), 1)


# Where two formulas meet (tanh's polynomial and its exp form, log's two
# ranges of m), they agree on most inputs near the split: a moved threshold
# shows only where they differ, so these get 200 neighbours either side.
WIDE = 200


def log():
    sqrt2 = [(e << 23) | 0x3504F3 for e in (1, 100, 126, 128, 129, 200, 254)]
    return np.concatenate(
        [
            V.neighbours(
                sqrt2
                + [
                    0x3F800000,
                    0x3F3504F3,
                    0x00800000,
                    0x7F7FFFFF,
                    0x7F800000,
                    0x80800000,
                    0x00000000,
                    0x80000000,
                    0x402DF854,
                    0x40000000,
                    0x3F000000,
                ]
            ),
            V.neighbours([0x3FB504F3], WIDE),
        ]
    )


def tanh():
    return np.concatenate(
        [
            V.neighbours(
                _both_signs(
                    [0x42317217, 0x42317218, 0x41133333, 0x39800000, 0x00800000, 0x00000000, 0x7F800000, 0x41200000]
                )
            ),
            V.neighbours(_both_signs([0x3F400000]), WIDE),
        ]
    )


def sigmoid():
    return V.neighbours(
        _both_signs([0x00000000, 0x00800000, 0x42B00000, 0x42B17217, 0x3F800000, 0x7F800000, 0x41A00000, 0x3EFCE5C8])
    )


def sincos():
    half_pi = math.pi / 2
    ks = list(range(-8, 9)) + [1000, 4095, 10430, -10430]
    return V.neighbours(
        _both_signs(
            [0x46800000, 0x00000000, 0x7F800000, 0x40490FDB, 0x3FC90FDB, 0x3F490FDB]
            + _ties(half_pi, ks)
            + V.nearest([k * half_pi for k in ks])
        ),
        1,
    )
