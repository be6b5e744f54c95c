"""Validation and launch helpers shared by the host entry points.

Checks mirror the reference's public APIs, so a caller sees the same
``TypeError``/``ValueError`` (never a Numba typing traceback).
"""
from __future__ import annotations

import numpy as np

from .._jit import THREADS, blocks  # noqa: F401  (re-exported to the host modules)


def _array(name, x, dtype=np.float32, ndim=None):
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, got {type(x).__name__}")
    if x.dtype != dtype:
        raise TypeError(f"{name} must have dtype {np.dtype(dtype).name}, got {x.dtype}")
    if ndim is not None and x.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {x.shape}")
    return x if x.flags.c_contiguous else np.ascontiguousarray(x)  # keeps a 0-d array 0-d


def _output(out, shape, dtype=np.float32, accumulate=False):
    if out is None:
        if accumulate:
            raise ValueError("accumulate=True needs out= (the array to accumulate into)")
        return np.empty(shape, dtype=dtype)
    _array("out", out, dtype, len(shape))
    if out.shape != shape:
        raise ValueError(f"out must have shape {shape}, got {out.shape}")
    if not (out.flags.c_contiguous and out.flags.writeable):
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
    from refreplay.ops import check_array
    shape = None
    for name, a in arrays.items():
        if not isinstance(a, np.ndarray):
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
    if not isinstance(a, np.ndarray) or a.dtype != np.float32:
        raise TypeError(f"{name} must be a float32 ndarray")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous")
    if ndim is not None and a.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {a.shape}")
    return a


def _each(kernel, n, *args):
    """Launch a one-thread-per-item kernel over n items (nothing for n = 0)."""
    if n:
        kernel[blocks(n), THREADS](*args)
