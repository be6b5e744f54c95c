"""add and sum as refreplay's spec has them: the module form of a kernel
(one function per op, named after the op)."""

import numpy as np

from ._rules import F32, canonical, flush, load, row_sum


def add(a, b):
    """[num.add.c1] IEEE addition, rounded to nearest even, then flushed."""
    with np.errstate(all="ignore"):
        return canonical(flush(load(a) + load(b)))


def sum(X):  # noqa: A001  (the op is called sum)
    """[red.sum.c1] sequential, from -0."""
    return row_sum(X, F32(-0.0))
