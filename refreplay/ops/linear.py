"""Linear layer y = x·Wᵀ + b, forward and backward ([linear.fwd.c1],
[linear.bwd.c1]), composed from the fixed-order kernels of ``linalg``.

Shapes: x, dx [N, C]; W, dW [OC, C]; b, db [OC]; y, dy [N, OC].  N = B*T
rows (tokens), C input width, OC output width.
"""

from __future__ import annotations

from .. import linalg
from . import check_f32, check_out, check_outs, check_shape


def linear_forward(x, W, b=None, out=None):
    """[linear.fwd.c1] x [N, C], W [OC, C], b [OC] or None -> y [N, OC] (new,
    or ``out``: float32 [N, OC], C-contiguous, overlapping no input; every
    element is overwritten).

    y[n, o] = sum over c increasing of mul(x[n, c], W[o, c])   ([mm.nt.c1])
    y[n, o] = add(y[n, o], b[o])     after the full sum      ([mm.bias.c1])
    """
    check_f32("x", x, 2)
    check_f32("W", W, 2)
    N, C = x.shape
    OC = W.shape[0]
    check_shape("W", W, (OC, C))
    if b is not None:
        check_f32("b", b, 1)
        check_shape("b", b, (OC,))
    if out is not None:
        check_out("out", out, (N, OC), (x, W, b))
    y = linalg.matmul_nt(x, W, out=out)
    if b is not None:
        linalg.bias_add(y, b)
    return y


def linear_backward(dy, x, W, has_bias=True, out=None):
    """[linear.bwd.c1] dy [N, OC], x [N, C], W [OC, C] -> (dx [N, C],
    dW [OC, C], db [OC] or None), all new; or, with ``out = (dx, dW, db)``,
    written into those arrays (any of them None: that one new).  Each must
    be float32, C-contiguous, of its result's shape and overlap no input and
    no other output; its old contents never matter (every kernel below
    overwrites its output, none accumulates into it).

    dx[n, c]  = sum over o increasing of mul(dy[n, o], W[o, c])  ([mm.nn.c1])
                (differentiates y = x·Wᵀ with respect to x)
    dW[o, c]  = sum over n increasing of mul(dy[n, o], x[n, c])  ([mm.tn.c1])
                (with respect to W: one term per token, tokens in order)
    db[o]     = sum over n increasing of dy[n, o]              ([red.colsum.c1])
                (with respect to b, added once per token)
    """
    check_f32("dy", dy, 2)
    check_f32("x", x, 2)
    check_f32("W", W, 2)
    N, C = x.shape
    OC = W.shape[0]
    check_shape("W", W, (OC, C))
    check_shape("dy", dy, (N, OC))
    o_dx, o_dw, o_db = _outs(out, has_bias, ((N, C), (OC, C), (OC,)), (dy, x, W))
    dx = linalg.matmul(dy, W, out=o_dx)
    dW = linalg.matmul_tn(dy, x, out=o_dw)
    db = linalg.col_sum(dy, out=o_db) if has_bias else None
    return dx, dW, db


def _outs(out, has_bias, shapes, inputs):
    """The checked ``out`` triple of ``linear_backward`` ((None,) * 3 if none)."""
    outs = check_outs(out, ("dx", "dW", "db"), shapes, inputs)
    if outs[2] is not None and not has_bias:
        raise ValueError("out: db given but has_bias is False")
    return outs
