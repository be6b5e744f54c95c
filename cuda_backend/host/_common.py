"""Validation and launch helpers shared by the host entry points.

Checks mirror the reference's public APIs, so a caller sees the same
``TypeError``/``ValueError`` (never a Numba typing traceback).

Where the arrays live: every entry point is ``device_aware``.  NumPy arrays
in -> NumPy arrays out (each call copies its inputs to the device and its
results back, as the reference's drop-in twin).  Any device array in (a
``numba.cuda`` DeviceNDArray, directly or in a dict, list or tuple argument) ->
results stay on the device, device inputs are used where they are and only
host inputs are copied over: the device-resident step (``refreplay.training.backend``)
keeps parameters, activations, gradients and optimizer state there.  Scalars
(a mean loss, a clipping coefficient) always come back to the host.
"""

from __future__ import annotations

import functools
import threading

import numpy as np
from numba import cuda

from .._jit import THREADS, blocks  # noqa: F401  (re-exported to the host modules)


_MODE = threading.local()  # .resident: the current entry point was given a device array


def is_device(x) -> bool:
    """A numba.cuda device array (or the simulator's stand-in)."""
    return bool(getattr(x, "__cuda_ndarray__", False))


def _has_device(x) -> bool:
    if isinstance(x, dict):
        x = list(x.values())
    return is_device(x) or (isinstance(x, (list, tuple)) and any(is_device(v) for v in x))


def device_aware(fn):
    """Run an entry point in device-resident mode when any argument is a device
    array (nested entry points decide for themselves, then restore the mode)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        prev = getattr(_MODE, "resident", False)
        _MODE.resident = any(_has_device(a) for a in args) or any(_has_device(a) for a in kwargs.values())
        try:
            return fn(*args, **kwargs)
        finally:
            _MODE.resident = prev

    return wrapper


def resident() -> bool:
    return getattr(_MODE, "resident", False)


def _dev(x):
    """A kernel argument: a device array as it is, a host array copied over."""
    return x if is_device(x) else cuda.to_device(x)


def _ret(d):
    """A result computed into the device array ``d``: kept there in resident mode,
    else copied to a new host array."""
    return d if resident() else d.copy_to_host()


def _contiguous(x) -> bool:
    return x.is_c_contiguous() if is_device(x) else x.flags.c_contiguous


def check_array(name, a, dtype, ndim):
    """``refreplay.ops.check_array`` that also accepts a device array."""
    if not (isinstance(a, np.ndarray) or is_device(a)):
        raise TypeError(f"{name} must be a numpy array, got {type(a).__name__}")
    if a.dtype != dtype:
        raise TypeError(f"{name} must be {np.dtype(dtype).name}, got {a.dtype}")
    if a.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} axes, got shape {a.shape}")
    if not _contiguous(a):
        raise ValueError(f"{name} must be C-contiguous")
    return a


def check_f32(name, a, ndim):
    return check_array(name, a, np.float32, ndim)


def check_shape(name, a, shape):
    if tuple(a.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(a.shape)}")


def check_state(params, **others):
    """``refreplay.ops.optim._check_state`` that also accepts device arrays."""
    if not isinstance(params, dict):
        raise TypeError("params must be a dict of name -> float32 array")
    for dname, d in (("params", params),) + tuple(others.items()):
        if not isinstance(d, dict) or sorted(d) != sorted(params):
            raise ValueError(f"{dname} must have exactly the names of params")
        for k in sorted(params):
            a = d[k]
            if not (isinstance(a, np.ndarray) or is_device(a)) or a.dtype != np.float32 or not _contiguous(a):
                raise TypeError(f"{dname}[{k!r}] must be a C-contiguous float32 array")
            if tuple(a.shape) != tuple(params[k].shape):
                raise ValueError(f"{dname}[{k!r}] has shape {a.shape}, params has {params[k].shape}")


def _array(name, x, dtype=np.float32, ndim=None):
    if is_device(x):
        return check_array(name, x, dtype, x.ndim if ndim is None else ndim)
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, got {type(x).__name__}")
    if x.dtype != dtype:
        raise TypeError(f"{name} must have dtype {np.dtype(dtype).name}, got {x.dtype}")
    if ndim is not None and x.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {x.shape}")
    return x if x.flags.c_contiguous else np.ascontiguousarray(x)  # keeps a 0-d array 0-d


def _output(out, shape, dtype=np.float32, accumulate=False):
    """``out`` checked, or a new result array: on the device in resident mode."""
    if out is None:
        if accumulate:
            raise ValueError("accumulate=True needs out= (the array to accumulate into)")
        return cuda.device_array(shape, dtype=dtype) if resident() else np.empty(shape, dtype=dtype)
    _array("out", out, dtype, len(shape))
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"out must have shape {shape}, got {out.shape}")
    if not (is_device(out) or (out.flags.c_contiguous and out.flags.writeable)):
        raise ValueError("out must be C-contiguous and writeable")
    return out


def _contracted(what, ka, kb):
    if ka != kb:
        raise ValueError(f"{what}: contracted lengths differ (K = {ka} vs {kb})")


def _scalar_or_array(name, x, dtype=np.float32):
    """An array, or a NumPy scalar (as in the spec's examples) as a 0-d array."""
    if isinstance(x, np.generic):
        x = np.asarray(x)
    return _array(name, x, dtype)


def _same_shape(**arrays):
    """float32 C-contiguous arrays of one shape (refreplay.ops' checks); returns it."""
    shape = None
    for name, a in arrays.items():
        if not (isinstance(a, np.ndarray) or is_device(a)):
            raise TypeError(f"{name} must be a numpy array, got {type(a).__name__}")
        check_array(name, a, np.float32, a.ndim)
        if shape is None:
            shape = a.shape
        elif a.shape != shape:
            raise ValueError(f"{name} has shape {a.shape}, expected {shape}")
    return shape


def _one_thread(kernel, *args):
    """Launch a kernel whose work is one sequential loop (grid 1 x 1)."""
    kernel[1, 1](*args)


def _f32(name, a, ndim=None):
    """A C-contiguous float32 ndarray (with ``ndim`` axes when given), else TypeError/ValueError."""
    if not (isinstance(a, np.ndarray) or is_device(a)) or a.dtype != np.float32:
        raise TypeError(f"{name} must be a float32 ndarray")
    if not _contiguous(a):
        raise ValueError(f"{name} must be C-contiguous")
    if ndim is not None and a.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {a.shape}")
    return a


def _each(kernel, n, *args):
    """Launch a one-thread-per-item kernel over n items (nothing for n = 0)."""
    if n:
        kernel[blocks(n), THREADS](*args)
