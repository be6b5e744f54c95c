"""Run on each architecture by scripts/check-aarch64: print a JSON object
mapping a check name to the SHA-256 of its output bits.

The reference's checks must hash identically on every architecture; the
negative controls (NumPy's own matmul and exp) are expected to differ between
x86-64 and AArch64, which proves the comparison can fail.
"""

import hashlib
import json
import sys

import numpy as np


def _h(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def inputs(seed=2026, n=96):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    x = np.linspace(-20, 20, 4099, dtype=np.float32)
    return a, b, x


def reference_checks():
    from refreplay import linalg
    from refreplay.numerics import elementwise as ew

    a, b, x = inputs()
    out = {
        "reference matmul": lambda: linalg.matmul(a, b),
        "reference matmul_nt": lambda: linalg.matmul_nt(a, b),
        "reference matmul_tn": lambda: linalg.matmul_tn(a, b),
        "reference row_sum": lambda: linalg.row_sum(a),
    }
    for name in ("exp", "log", "tanh", "sigmoid", "sin", "cos"):
        fn = getattr(ew, name)
        arg = np.abs(x) if name == "log" else x
        out[f"reference {name}"] = lambda fn=fn, arg=arg: fn(arg)
    return out


def negative_controls():
    a, b, x = inputs()
    rng = np.random.default_rng(7)
    p = rng.standard_normal((64, 1000)).astype(np.float32)
    q = rng.standard_normal((1000, 48)).astype(np.float32)
    return {
        "control numpy.matmul": lambda: a @ b,
        "control numpy.matmul K=1000": lambda: p @ q,
        "control numpy.exp": lambda: np.exp(x),
    }


def main():
    result = {}
    for table in (reference_checks(), negative_controls()):
        for name, fn in table.items():
            try:
                result[name] = _h(fn())
            except Exception as exc:  # report, never hide: the caller fails on it
                result[name] = f"error: {type(exc).__name__}: {exc}"
    json.dump(result, sys.stdout, indent=1, sort_keys=True)
    print()


if __name__ == "__main__":
    main()
