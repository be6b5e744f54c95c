"""Failing kernels for the tests of a bounded diagnosis (test_diagnosis_bounds.py)."""

import numpy as np

from refreplay import numerics
from refreplay.ops import attention as A


def attention_backward(dout, q, k, v, att):
    """The reference's attention backward, except that dv is accumulated in
    float64 and rounded once (a 'higher precision' path), at every T."""
    dout, q, k, v, att = (numerics.load(x) for x in (dout, q, k, v, att))
    dq, dk, _ = A.attention_backward(dout, q, k, v, att)
    a = np.tril(att.astype(np.float64))  # [B, NH, t, s], only s <= t takes part
    return dq, dk, np.einsum("bhts,bhtd->bhsd", a, dout.astype(np.float64)).astype(np.float32)
