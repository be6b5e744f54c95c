"""Fit the polynomial coefficients of spec chapter 2 and measure the accuracy
of refreplay's transcendentals.  A development tool, not part of the library.

    python scripts/fit_coefficients.py fit              # print fitted coefficients
    python scripts/fit_coefficients.py measure          # mpmath, dense sweep (~1 min)
    python scripts/fit_coefficients.py measure --exhaustive   # every binary32 (slow)

Fitting: each polynomial is fitted in binary64 to the function it replaces
(computed by mpmath at 200 bits) at 400 Chebyshev nodes, by least squares
refined toward minimax with Lawson's iteratively reweighted scheme, then
rounded to binary32.  The weight makes the error that of the final function
(e.g. exp's q(r) enters as r^2 q(r), so it is weighted by r^2 / e^r).

Measuring: ulp error as [num.trans.c1] defines it, |y - v| / 2^(E - 23)
with E = floor(log2 |v|), skipping values below 2^-126.  ``measure`` uses
mpmath on a dense sweep (an even grid over the domain plus random points);
``--exhaustive`` visits every binary32 in the ranges below and compares with
binary64 libm (its own error, < 1 binary64 ulp, is far below 0.001 binary32
ulp), compiled with Numba so that ~10^9 points take minutes.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import mpmath
import numpy as np

F32 = np.float32


# ---- fitting --------------------------------------------------------------------


def lawson_fit(func, lo, hi, degree, weight=None, nodes=400, iterations=60):
    """Coefficients (low to high) of a near-minimax polynomial of ``degree`` for
    func on [lo, hi], minimising max |(p(x) - func(x)) * weight(x)|."""
    t = np.cos(np.pi * (np.arange(nodes) + 0.5) / nodes)
    xs = (lo + hi) / 2 + (hi - lo) / 2 * t
    with mpmath.workprec(200):
        ys = np.array([float(func(mpmath.mpf(float(x)))) for x in xs])
    w = np.ones(nodes) if weight is None else np.array([weight(x) for x in xs])
    a = np.vander(xs, degree + 1, increasing=True)
    lw = np.ones(nodes)
    for _ in range(iterations):
        sw = w * np.sqrt(lw)
        c = np.linalg.lstsq(a * sw[:, None], ys * sw, rcond=None)[0]
        err = np.abs((a @ c - ys) * w)
        lw = lw * err
        lw /= lw.sum()
    return c, float(np.max(np.abs((a @ c - ys) * w)))


def _series_at_zero(f, z0):
    return lambda z: f(z) if z != 0 else mpmath.mpf(z0)


FITS = {
    # name: (function of the polynomial variable, interval, degree, weight, first index)
    "exp C2..C6 (q(r) = (e^r - 1 - r) / r^2)": (
        _series_at_zero(lambda r: (mpmath.exp(r) - 1 - r) / r**2, 0.5),
        (-0.3467, 0.3467),
        4,
        lambda r: r * r / math.exp(r),
        2,
    ),
    "log L1..L4 (R(z)/z, z = s^2)": (
        _series_at_zero(
            lambda z: (
                (mpmath.log((1 + mpmath.sqrt(z)) / (1 - mpmath.sqrt(z))) - 2 * mpmath.sqrt(z)) / mpmath.sqrt(z) / z
            ),
            mpmath.mpf(2) / 3,
        ),
        (0.0, 0.1716**2),
        3,
        None,
        1,
    ),
    "tanh T1..T6 ((tanh(a)/a - 1) / z, a < 0.75)": (
        _series_at_zero(lambda z: (mpmath.tanh(mpmath.sqrt(z)) / mpmath.sqrt(z) - 1) / z, -mpmath.mpf(1) / 3),
        (0.0, 0.75**2),
        5,
        lambda z: z,
        1,
    ),
    "sin S1..S4 ((sin(r)/r - 1) / z)": (
        _series_at_zero(lambda z: (mpmath.sin(mpmath.sqrt(z)) / mpmath.sqrt(z) - 1) / z, -mpmath.mpf(1) / 6),
        (0.0, (math.pi / 4) ** 2 * 1.0001),
        3,
        lambda z: z,
        1,
    ),
    "cos C1..C4 ((cos(r) - 1 + z/2) / z^2)": (
        _series_at_zero(lambda z: (mpmath.cos(mpmath.sqrt(z)) - 1 + z / 2) / z / z, mpmath.mpf(1) / 24),
        (0.0, (math.pi / 4) ** 2 * 1.0001),
        3,
        lambda z: z * z / math.cos(math.sqrt(z)),
        1,
    ),
}


def hex32(v: float) -> str:
    return f"0x{int(np.array([F32(v)]).view(np.uint32)[0]):08X}"


def cmd_fit(_args) -> int:
    for title, (func, (lo, hi), degree, weight, first) in FITS.items():
        coeffs, err = lawson_fit(func, lo, hi, degree, weight)
        print(f"{title}: max weighted error {err:.3g}")
        for i, c in enumerate(coeffs):
            print(f"  {first + i}: {hex32(c)}  ({float(F32(c))!r})")
    return 0


# ---- measuring --------------------------------------------------------------------

FUNCTIONS = ["exp", "log", "tanh", "sigmoid", "sin", "cos"]
SWEEP = {
    "exp": (-87.3, 88.72),
    "log": (0.25, 4.0),
    "tanh": (-9.5, 9.5),
    "sigmoid": (-87.0, 30.0),
    "sin": (-16384.0, 16384.0),
    "cos": (-16384.0, 16384.0),
}
# Exhaustive ranges (bit-pattern ranges are taken of |x| with the sign given);
# outside them the result is exact, trivially accurate (tiny |x|) or flushed.
EXHAUSTIVE = {
    "exp": [(0.0, 88.8), (-0.0, -88.0)],
    "log": [(0.125, 8.0)],
    "tanh": [(2.0**-12, 9.2)],
    "sigmoid": [(2.0**-12, 88.8), (-(2.0**-12), -88.0)],
    "sin": [(2.0**-12, 16384.0)],
    "cos": [(2.0**-12, 16384.0)],
}


def exact(name, x):
    if name == "sigmoid":
        return 1 / (1 + mpmath.exp(-x))
    return getattr(mpmath, name)(x)


def mpmath_max_ulp(name, x):
    from refreplay.numerics import elementwise as ew

    y = getattr(ew, name)(x).astype(np.float64)
    worst, at = 0.0, float("nan")
    with mpmath.workprec(96):
        for xi, yi in zip(x.tolist(), y.tolist()):
            v = exact(name, mpmath.mpf(xi))
            _, e = mpmath.frexp(v)
            big_e = int(e) - 1
            if big_e < -126 or big_e > 127:
                continue
            err = float(abs(mpmath.mpf(yi) - v) * mpmath.mpf(2) ** (23 - big_e))
            if err > worst:
                worst, at = err, xi
    return worst, at


def _exhaustive_runner(name):
    import numba

    from refreplay.numerics import transcendental as tr
    from refreplay.numerics._bits import bits_f32

    fn = getattr(tr, name)
    ref = {"exp": math.exp, "log": math.log, "tanh": math.tanh, "sin": math.sin, "cos": math.cos}.get(name)
    if name == "sigmoid":

        @numba.njit
        def ref(x):
            return 1.0 / (1.0 + math.exp(-x))
    else:
        ref = numba.njit(lambda x, _r=ref: _r(x))

    @numba.njit(parallel=True)
    def run(b0, b1):
        chunks = 64
        worst = np.zeros(chunks)
        where = np.zeros(chunks, dtype=np.uint32)
        for c in numba.prange(chunks):
            lo = b0 + (b1 - b0) * c // chunks
            hi = b0 + (b1 - b0) * (c + 1) // chunks
            for b in range(lo, hi):
                x = bits_f32(np.uint32(b))
                v = ref(np.float64(x))
                a = abs(v)
                if a < 2.0**-126 or a > 3.4028234663852886e38:
                    continue
                m, e = math.frexp(a)
                err = abs(np.float64(fn(x)) - v) / 2.0 ** (e - 24)
                if err > worst[c]:
                    worst[c], where[c] = err, b
        i = np.argmax(worst)
        return worst[i], where[i]

    return run


def cmd_measure(args) -> int:
    rng = np.random.default_rng(2026)
    for name in FUNCTIONS:
        t0 = time.time()
        lo, hi = SWEEP[name]
        x = np.concatenate(
            [
                np.linspace(lo, hi, args.points // 2, dtype=np.float32),
                rng.uniform(lo, hi, args.points // 2).astype(np.float32),
            ]
        )
        if name == "log":  # half of the points anywhere among the positive normals
            x[args.points // 2 :] = rng.integers(
                0x00800000, 0x7F800000, x.size - args.points // 2, dtype=np.uint32
            ).view(np.float32)
        err, at = mpmath_max_ulp(name, x)
        where = f"[{lo}, {hi}]" + (" and all positive normals" if name == "log" else "")
        print(
            f"{name:8s} mpmath, {x.size} points in {where}: max {err:.4f} ulp at x = {at!r} ({time.time() - t0:.0f}s)",
            flush=True,
        )
        if not args.exhaustive:
            continue
        run = _exhaustive_runner(name)
        for lo, hi in EXHAUSTIVE[name]:
            t0 = time.time()
            b0, b1 = sorted(int(np.array([F32(v)]).view(np.uint32)[0]) for v in (lo, hi))
            err, where = run(b0, b1 + 1)
            at = float(np.array([where], dtype=np.uint32).view(np.float32)[0])
            print(
                f"{name:8s} every binary32 in [{lo}, {hi}] vs binary64 libm: max {err:.4f} ulp "
                f"at x = {at!r} ({time.time() - t0:.0f}s)",
                flush=True,
            )
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("fit", help="print fitted coefficients in hex")
    m = sub.add_parser("measure", help="measure max ulp error of each function")
    m.add_argument("--points", type=int, default=100_000, help="mpmath sweep size per function")
    m.add_argument(
        "--exhaustive", action="store_true", help="also every binary32 in each range, against binary64 libm (slow)"
    )
    args = p.parse_args(argv)
    return {"fit": cmd_fit, "measure": cmd_measure}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
