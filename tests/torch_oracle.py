"""Test-only float64 oracles shared by the ops tests: PyTorch autograd,
central finite differences, a normwise relative error, and a few float32
helpers for hand transcriptions.

The library never imports this module (nor torch).  Conventions:

* ``fn`` is a function of float64 torch tensors returning one tensor (the
  op's output in float64, written with torch's own operations);
* ``dout`` is the upstream gradient; a backward is checked as the vector-
  Jacobian product dout·J, the quantity every refreplay ``*_backward`` returns;
* errors are normwise: max|got - want| / max|want| (an elementwise relative
  error is meaningless where the true gradient is near zero).
"""

from __future__ import annotations

import numpy as np
import torch


def t64(a, grad: bool = False) -> torch.Tensor:
    """A float64 tensor holding exactly the values of ``a`` (any float dtype)."""
    return torch.tensor(np.asarray(a, dtype=np.float64), dtype=torch.float64, requires_grad=grad)


def autograd(fn, inputs, dout):
    """Run ``fn`` in float64 on ``inputs`` and back-propagate ``dout``.

    Returns (output as float64 ndarray, [gradient of each input as ndarray]).
    """
    ts = [t64(a, grad=True) for a in inputs]
    out = fn(*ts)
    out.backward(t64(dout))
    return out.detach().numpy(), [t.grad.detach().numpy() for t in ts]


def central_diff(fn, inputs, dout, h: float = 1e-6):
    """dout·J by central differences of the float64 ``fn``, one input element
    at a time: (L(x + h e) - L(x - h e)) / 2h with L = sum(fn(x) * dout).

    Truncation error is O(h^2) and rounding error O(eps64 / h): about 1e-10
    relative for h = 1e-6 on the tiny, well-scaled inputs the tests use.
    """
    base = [np.asarray(a, dtype=np.float64).copy() for a in inputs]
    d = np.asarray(dout, dtype=np.float64)

    def loss(arrs):
        with torch.no_grad():
            return float((fn(*[t64(a) for a in arrs]).numpy() * d).sum())

    grads = []
    for a in base:
        g = np.empty_like(a)
        flat = a.reshape(-1)
        for i in range(flat.size):
            keep = flat[i]
            flat[i] = keep + h
            up = loss(base)
            flat[i] = keep - h
            down = loss(base)
            flat[i] = keep
            g.reshape(-1)[i] = (up - down) / (2 * h)
        grads.append(g)
    return grads


def rel_err(got, want) -> float:
    """Normwise relative error max|got - want| / max|want| (0 if both zero)."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    scale = np.max(np.abs(want)) if want.size else 0.0
    diff = np.max(np.abs(got - want)) if want.size else 0.0
    return float(diff / scale) if scale > 0 else float(diff)


# ---- float32 transcription helpers --------------------------------------------

F32 = np.float32
_FLT_MIN = np.float32(2.0**-126)


def flush32(x):
    """[num.flush.c1] in NumPy: subnormal float32 values become signed zeros;
    NaNs become the canonical NaN ([num.nan.c1])."""
    a = np.array(x, dtype=np.float32, copy=True)
    tiny = np.abs(a) < _FLT_MIN
    a[tiny] = a[tiny] * np.float32(0.0)
    a[np.isnan(a)] = np.uint32(0x7FC00000).view(np.float32)
    return a if np.ndim(x) else a[()]


def f32(bits: int) -> np.float32:
    return np.array([bits], dtype=np.uint32).view(np.float32)[0]


def bits(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float32).view(np.uint32)
