"""Host entry points of the elementwise primitives and transcendentals (spec chapters 1-2).

Any shape (binary ops: equal shapes); a NumPy scalar in gives a NumPy scalar out.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from .. import numerics as N
from .. import transcendental as TR
from ._common import THREADS, _dev, _ret, _scalar_or_array, blocks, device_aware


def _elementwise(k, out_dtype, *xs):
    """Launch an elementwise kernel over same-shape inputs; a 0-d result is a scalar."""
    shape = xs[0].shape
    for x in xs[1:]:
        if x.shape != shape:
            raise ValueError(f"shapes differ: {shape} vs {x.shape}")
    flat = [_dev(x.reshape(-1)) for x in xs]
    n = int(np.prod(shape, dtype=np.int64))
    out = cuda.device_array(n, dtype=out_dtype)
    if n:
        k[blocks(n), THREADS](*flat, out)
    res = _ret(out).reshape(shape)
    return res[()] if res.ndim == 0 else res


def _unary(kernel, name, doc, out_dtype=np.float32):
    @device_aware
    def op(x):
        return _elementwise(kernel, out_dtype, _scalar_or_array("x", x))

    op.__name__, op.__doc__ = name, doc
    return op


def _binary(kernel, name, doc):
    @device_aware
    def op(a, b):
        return _elementwise(kernel, np.float32, _scalar_or_array("a", a), _scalar_or_array("b", b))

    op.__name__, op.__doc__ = name, doc
    return op


load = _unary(N.load_k, "load", "[num.load.c1] subnormals zeroed (sign kept), NaN canonical.")
add = _binary(N.add_k, "add", "[num.add.c1] a + b elementwise.")
sub = _binary(N.sub_k, "sub", "[num.add.c1] a - b elementwise.")
mul = _binary(N.mul_k, "mul", "[num.mul.c1] a * b elementwise.")
fmax = _binary(N.fmax_k, "fmax", "[num.minmax.c1] max elementwise.")
fmin = _binary(N.fmin_k, "fmin", "[num.minmax.c1] min elementwise.")
recip = _unary(N.recip_k, "recip", "[num.recip.c1] 1/x elementwise.")
sqrt = _unary(N.sqrt_k, "sqrt", "[num.sqrt.c1] square root elementwise.")
rint = _unary(N.rint_k, "rint", "[num.rint.c1] nearest integer, ties to even.")
saturate_i8 = _unary(N.saturate_i8_k, "saturate_i8", "[num.sat.c1] integral float32 -> int8.", np.int8)


exp = _unary(TR.exp_k, "exp", "[num.exp.c1] e^x elementwise, by the spec's algorithm.")
log = _unary(TR.log_k, "log", "[num.log.c1] natural logarithm elementwise.")
tanh = _unary(TR.tanh_k, "tanh", "[num.tanh.c1] tanh elementwise.")
sigmoid = _unary(TR.sigmoid_k, "sigmoid", "[num.sigmoid.c1] logistic sigmoid elementwise.")
sin = _unary(TR.sin_k, "sin", "[num.sincos.c1] sine elementwise (|x| <= 2^14, NaN outside).")
cos = _unary(TR.cos_k, "cos", "[num.sincos.c1] cosine elementwise (|x| <= 2^14, NaN outside).")


@device_aware
def mul_add(a, b, c):
    """[num.nofma.c1] add(mul(a, b), c) elementwise: two roundings."""
    return _elementwise(
        N.mul_add_k, np.float32, _scalar_or_array("a", a), _scalar_or_array("b", b), _scalar_or_array("c", c)
    )
