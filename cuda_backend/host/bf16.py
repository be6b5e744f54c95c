"""Host entry points of the bf16 conversions (``spec/08-bf16.txt``): the
calling conventions of ``refreplay.numerics.bf16`` (``encode``, ``decode``,
``load``, ``round_f32``, ``round_inplace``), the same TypeErrors, the same
bits.  Device arrays in -> results stay on the device (the device-resident
step rounds its activations with ``round_inplace`` where they live)."""

from __future__ import annotations

import numpy as np
from numba import cuda

from .. import bf16 as K
from ._common import THREADS, _dev, _ret, blocks, device_aware, is_device


def _checked(name, x, dtype):
    if is_device(x):
        if x.dtype != dtype:
            raise TypeError(f"bf16.{name}: expected dtype {np.dtype(dtype).name}, got {x.dtype}")
        if not x.is_c_contiguous():
            raise TypeError(f"bf16.{name}: expected a C-contiguous device array")
        return x
    if isinstance(x, np.ndarray) and x.dtype.name == "bfloat16" and x.dtype.itemsize == 2:
        x = x.view(np.uint16)  # [bf16.format.c1] ml_dtypes' bfloat16 as its bits
    if not isinstance(x, np.ndarray):
        raise TypeError(f"bf16.{name}: expected a numpy array, got {type(x).__name__}")
    if x.dtype != dtype:
        raise TypeError(f"bf16.{name}: expected dtype {np.dtype(dtype).name}, got {x.dtype}")
    return np.ascontiguousarray(x)


def _launch(kern, x, out_dtype):
    n = int(x.size)
    src = _dev(x.reshape(-1) if n else x.reshape(0))
    out = cuda.device_array(n, dtype=out_dtype)
    if n:
        kern[blocks(n), THREADS](src, out)
    return _ret(out).reshape(x.shape)


@device_aware
def encode(x):
    """[bf16.round.c1] float32 -> uint16 bf16 bit patterns."""
    return _launch(K.encode_k, _checked("encode", x, np.float32), np.uint16)


@device_aware
def decode(h):
    """[bf16.load.c1] then [bf16.widen.c1]: uint16 bf16 bits -> float32."""
    return _launch(K.decode_k, _checked("decode", h, np.uint16), np.float32)


@device_aware
def load(h):
    """[bf16.load.c1] subnormals zeroed, NaN canonical (uint16 -> uint16)."""
    return _launch(K.load_k, _checked("load", h, np.uint16), np.uint16)


@device_aware
def round_f32(x):
    """[bf16.round.c1] float32 -> float32 holding the bf16 values (a new array)."""
    return _launch(K.round_k, _checked("round_f32", x, np.float32), np.float32)


def round_inplace(x):
    """[bf16.round.c1] Round a C-contiguous float32 array (host or device) to
    bf16 values in place; returns x."""
    if is_device(x):
        _checked("round_inplace", x, np.float32)
        flat = x.reshape(x.size)
        if x.size:
            K.round_k[blocks(x.size), THREADS](flat, flat)
        return x
    if not (isinstance(x, np.ndarray) and x.dtype == np.float32 and x.flags.c_contiguous and x.flags.writeable):
        raise TypeError("bf16.round_inplace: expected a writeable C-contiguous float32 array")
    flat = x.reshape(-1)
    d = cuda.to_device(flat)
    if flat.size:
        K.round_k[blocks(flat.size), THREADS](d, d)
    d.copy_to_host(flat)
    return x
