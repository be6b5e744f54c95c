"""Linear layer (spec chapter 10) as compositions of the device matmul kernels, as ``refreplay.ops.linear``."""

from __future__ import annotations

from .._common import device_aware
from ..linalg import bias_add, col_sum, matmul, matmul_nt, matmul_tn


@device_aware
def linear_forward(x, W, b=None):
    """[linear.fwd.c1] x [N, C], W [OC, C], b [OC] or None -> y = x·Wᵀ (+ b after the sum)."""
    from .._common import check_f32, check_shape

    check_f32("x", x, 2), check_f32("W", W, 2)
    check_shape("W", W, (W.shape[0], x.shape[1]))
    if b is not None:
        check_f32("b", b, 1), check_shape("b", b, (W.shape[0],))
    y = matmul_nt(x, W)  # [mm.nt.c1]
    return bias_add(y, b) if b is not None else y  # [mm.bias.c1]


@device_aware
def linear_backward(dy, x, W, has_bias=True):
    """[linear.bwd.c1] -> (dx = dy·W, dW = dyᵀ·x, db = col_sum(dy) or None)."""
    from .._common import check_f32, check_shape

    check_f32("dy", dy, 2), check_f32("x", x, 2), check_f32("W", W, 2)
    check_shape("W", W, (W.shape[0], x.shape[1]))
    check_shape("dy", dy, (x.shape[0], W.shape[0]))
    return matmul(dy, W), matmul_tn(dy, x), col_sum(dy) if has_bias else None
