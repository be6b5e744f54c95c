"""A deliberately non-conformant Python kernel: sums by a pairwise tree.

Used by the docs and tests to show that `refreplay probe-order` recovers a
tree it was not told about, and that `refreplay conform` names the order:

    PYTHONPATH=examples/python_kernel refreplay probe-order pairwise_sum --op sum --n 8
    PYTHONPATH=examples/python_kernel refreplay conform pairwise_sum --op sum

The module form of a Python kernel: one function per op, named after the op,
taking the op's inputs positionally (docs/conformance.md).  Ops it lacks
are reported as not implemented.
"""

import numpy as np


def _pairwise(X):
    """Sum each row of X (R x N) as (left half) + (right half), recursively;
    the left half has N // 2 terms; a sum of no terms is +0."""
    n = X.shape[1]
    if n == 0:
        return np.zeros(X.shape[0], np.float32)
    if n == 1:
        return X[:, 0].copy()
    h = n // 2
    return (_pairwise(X[:, :h]) + _pairwise(X[:, h:])).astype(np.float32)


def sum(X):  # noqa: A001  (the op is called sum)
    return _pairwise(np.asarray(X, dtype=np.float32))


def dot(x, y):
    return _pairwise((x * y)[None, :]).reshape(1)


def matmul(A, B):
    I, J = A.shape[0], B.shape[1]
    terms = (A[:, None, :] * B.T[None, :, :]).reshape(I * J, -1)
    return _pairwise(terms).reshape(I, J)
