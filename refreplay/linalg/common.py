"""Pieces every fixed-order reduction shares: the starting value of a sum."""

from __future__ import annotations

import numpy as np

from .._jit import kernel
from ..numerics.core import ZERO

NEG_ZERO = np.float32(-0.0)  # 0x80000000
NEG_INF = np.float32(-np.inf)  # 0xFF800000, the starting value of a max


@kernel
def sum_start(n):
    """[red.sum.c1] The value a sum of n terms starts from.

    -0 is the identity of IEEE addition under round-to-nearest (-0 + x = x for
    every x, including +0 and -0), so starting from -0 equals starting from
    the first term.  The empty sum (n = 0) is +0.
    """
    return NEG_ZERO if n > 0 else ZERO
