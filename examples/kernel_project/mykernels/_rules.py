"""The number rules every op applies (refreplay spec chapter 1)."""

import numpy as np

F32 = np.float32
FLT_MIN = F32(2.0**-126)
CANONICAL_NAN = np.array([0x7FC00000], np.uint32).view(F32)[0]


def load(x):
    """[num.load.c1] subnormal inputs become zeros of the same sign; NaNs become canonical."""
    x = np.asarray(x, F32)
    x = np.where(np.abs(x) < FLT_MIN, x * F32(0), x)
    return np.where(np.isnan(x), CANONICAL_NAN, x).astype(F32)


def flush(x):
    """[num.flush.c1] a result that is subnormal after rounding becomes a zero of the same sign."""
    with np.errstate(invalid="ignore"):
        return np.where(np.abs(x) < FLT_MIN, x * F32(0), x).astype(F32)


def canonical(x):
    """[num.nan.c1] every NaN that leaves an op is 0x7FC00000."""
    return np.where(np.isnan(x), CANONICAL_NAN, x).astype(F32)


def row_sum(X, start):
    """Each row summed k = 0, 1, ... in order, every addition rounded and flushed ([red.sum.c1]).
    Vectorised across rows only: the order within a row is the loop's."""
    X = load(X)
    s = np.full(X.shape[0], start, F32)
    with np.errstate(all="ignore"):
        for k in range(X.shape[1]):
            s = flush(s + X[:, k])
    if X.shape[1] == 0:
        s[:] = F32(0.0)  # the empty sum is +0
    return canonical(s)
