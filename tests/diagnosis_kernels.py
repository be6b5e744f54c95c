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


def sm_grad_distributed(op, *inputs):
    """A dispatcher implementing attention_backward alone: the spec's algorithm
    with one deviation, the softmax gradient as y*dy - y*d (the variant model
    evaluated one (b, h) pair at a time, so any shape fits in memory)."""
    if op != "attention_backward":
        raise NotImplementedError(op)
    from refreplay.conformance.readings import transformer as T

    dev = next(d for d in T.deviations(op) if d.name == "softmax gradient as y*dy - y*d")
    dout, q, k, v, att = (numerics.load(x) for x in inputs)
    B, NH = q.shape[:2]
    outs = [np.empty_like(q), np.empty_like(k), np.empty_like(v)]
    for b in range(B):
        for h in range(NH):
            one = [x[b : b + 1, h : h + 1] for x in (dout, q, k, v, att)]
            for o, got in zip(outs, T.evaluate(op, one, (dev,))):
                o[b : b + 1, h : h + 1] = got
    return tuple(outs)
