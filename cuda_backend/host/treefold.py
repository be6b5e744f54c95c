"""Host entry points of TreeFold (spec chapter 22), as ``refreplay.training.treefold``."""

from __future__ import annotations

import numpy as np
from numba import cuda

from .. import treefold as T
from ._common import THREADS, _array, _dev, _ret, blocks, device_aware
from .numerics import add


@device_aware
def fold_rows(leaves, ranks=1):
    """[fold.tree.c1] [fold.final.c1] [fold.ranks.c1] TreeFold of the M rows of an
    M×N float32 array split over ``ranks`` ranks -> (N,) unscaled sum."""
    X = _array("leaves", leaves, ndim=2)
    M, n = X.shape
    if not isinstance(ranks, (int, np.integer)) or not 1 <= ranks <= M:
        raise ValueError(f"fold_rows: need 1 <= ranks <= M = {M}, got {ranks!r}")
    out = cuda.device_array(n, dtype=np.float32)
    if n:
        T.fold_rows_k[blocks(n), THREADS](_dev(X), int(ranks), out)
    return _ret(out)


@device_aware
def merge(left, right):
    """[fold.tree.c1] One tree node: add(left, right) elementwise (dicts name by name)."""
    if isinstance(left, dict):
        if not isinstance(right, dict) or sorted(left) != sorted(right):
            raise ValueError("merge: leaves must have the same tensor names")
        return {k: merge(left[k], right[k]) for k in sorted(left)}
    return add(_array("left", left), _array("right", right))


@device_aware
def scale(value, m):
    """[fold.scale.c1] Every element times recip(f32(M))."""
    if not isinstance(m, (int, np.integer)) or m < 1:
        raise ValueError(f"scale: micro-batch count must be a positive integer, got {m!r}")
    if isinstance(value, dict):
        return {k: scale(value[k], m) for k in sorted(value)}
    x = _array("value", value)
    flat = x.reshape(-1)
    out = cuda.device_array(flat.size, dtype=np.float32)
    if flat.size:
        T.scale_k[blocks(flat.size), THREADS](_dev(flat), int(m), out)
    return _ret(out).reshape(x.shape)
