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


# ---- kernels with one named deviation at every shape, for the sliced diagnosis (test_diagnosis_slices.py)


def _c(x):
    return np.ascontiguousarray(x)


def matmul(A, B):
    """The sum over k reversed (k decreasing), fast at any shape."""
    from refreplay import linalg

    A, B = numerics.load(A), numerics.load(B)
    return linalg.matmul(_c(A[:, ::-1]), _c(B[::-1]))


def linear_forward(x, W, b):
    """The bias as the sum's first term instead of added after the full sum
    ([mm.bias.c1]): a column of ones before x and b before W's columns."""
    from refreplay import linalg

    x, W, b = numerics.load(x), numerics.load(W), numerics.load(b)
    ones = np.ones((x.shape[0], 1), np.float32)
    return linalg.matmul_nt(_c(np.hstack([ones, x])), _c(np.hstack([b[:, None], W])))


def linear_backward(dy, x, W):
    """Every sum reversed: dx over o decreasing, dW and db over n decreasing."""
    from refreplay import linalg

    dy, x, W = numerics.load(dy), numerics.load(x), numerics.load(W)
    dx = linalg.matmul(_c(dy[:, ::-1]), _c(W[::-1]))
    return dx, linalg.matmul_tn(_c(dy[::-1]), _c(x[::-1])), linalg.col_sum(_c(dy[::-1]))


def layernorm_backward(dout, x, w, mean, rstd):
    """Every sum reversed: the row sums of dx over c decreasing (the
    reference on the columns reversed), dw and db over n decreasing (on the
    rows reversed)."""
    from refreplay.ops import norms

    dout, x, w, mean, rstd = (numerics.load(t) for t in (dout, x, w, mean, rstd))
    dx = norms.layernorm_backward(_c(dout[:, ::-1]), _c(x[:, ::-1]), _c(w[::-1]), mean, rstd)[0][:, ::-1]
    _, dw, db = norms.layernorm_backward(_c(dout[::-1]), _c(x[::-1]), w, _c(mean[::-1]), _c(rstd[::-1]))
    return _c(dx), dw, db


def rmsnorm_backward(dout, x, w, rrms):
    """Every sum reversed, as ``layernorm_backward``."""
    from refreplay.ops import norms

    dout, x, w, rrms = (numerics.load(t) for t in (dout, x, w, rrms))
    dx = norms.rmsnorm_backward(_c(dout[:, ::-1]), _c(x[:, ::-1]), _c(w[::-1]), rrms)[0][:, ::-1]
    _, dw = norms.rmsnorm_backward(_c(dout[::-1]), _c(x[::-1]), w, _c(rrms[::-1]))
    return _c(dx), dw


def _variant(op, dev_name, inputs):
    from refreplay.conformance.readings import transformer as T

    dev = next(d for d in T.deviations(op) if d.name == dev_name)
    return T.evaluate(op, [numerics.load(x) if x.dtype == np.float32 else x for x in inputs], (dev,))


def cross_entropy_forward(logits, targets):
    """The spec's algorithm with the loss as -log(e/s) (the variant model)."""
    return _variant("cross_entropy_forward", "loss as -log(e/s) (the log of the probability)", (logits, targets))


def attention_forward(q, k, v):
    """The spec's algorithm with NumPy's float32 exp (the variant model)."""
    return _variant("attention_forward", "vendor exp (np.exp)", (q, k, v))
