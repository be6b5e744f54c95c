"""Candidate summation orders: the ways a kernel commonly reorders a sum.

Used three ways: (1) generating order probes (inputs on which every candidate
below except the spec's own order gives different bits), (2) diagnosing a
failure (which candidate reproduces the kernel's output), (3) naming the tree
that ``probe-order`` recovers.  The spec's order for every fp32 sum and matmul
is the sequential one ([red.sum.c1], [red.rowsum.c1], [mm.nn.c1]): start from
-0, add the terms with n (or k) increasing.

Every candidate evaluates many independent sums at once: ``a`` is (R, N), one
row per sum; with ``b`` the terms are the products a*b, each rounded (or, with
``fused``, contracted into the accumulation, a*b + acc rounded once).  All
arithmetic is binary32 with the spec's flush after rounding, so a candidate
differs from the spec only in the property it names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..base import deviant as fp

NEG_ZERO = np.float32(-0.0)


class _Terms:
    """The N terms of R sums, and how one is folded into an accumulator."""

    def __init__(self, a, b=None, fused=False):
        self.a = np.asarray(a, dtype=np.float32)
        self.b = None if b is None else np.asarray(b, dtype=np.float32)
        self.fused = fused and b is not None
        self.n = self.a.shape[1]

    def value(self, k):
        return self.a[:, k] if self.b is None else fp.mul(self.a[:, k], self.b[:, k])

    def fold(self, acc, k):
        if self.fused:
            return fp.fma(self.a[:, k], self.b[:, k], acc)
        return fp.add(acc, self.value(k))

    def chain(self, idx, start=NEG_ZERO):
        acc = np.full(self.a.shape[0], start, dtype=np.float32)
        for k in idx:
            acc = self.fold(acc, k)
        return acc


def _sequential(t, start=NEG_ZERO):
    return t.chain(range(t.n), start)


def _reversed(t):
    return t.chain(range(t.n - 1, -1, -1))


def _pairwise(t, lo=0, hi=None):
    """Recursive halving: sum(lo..hi) = sum(lo..mid) + sum(mid..hi), mid = lo + n//2."""
    hi = t.n if hi is None else hi
    if hi - lo == 1:
        return t.chain([lo])
    if hi - lo == 0:
        return np.zeros(t.a.shape[0], np.float32)
    mid = lo + (hi - lo) // 2
    return fp.add(_pairwise(t, lo, mid), _pairwise(t, mid, hi))


def _blocked(t, block):
    """Split-k: each block of ``block`` consecutive terms summed sequentially,
    then the block partials summed sequentially."""
    acc = np.full(t.a.shape[0], NEG_ZERO, dtype=np.float32)
    for k0 in range(0, t.n, block):
        acc = fp.add(acc, t.chain(range(k0, min(k0 + block, t.n))))
    return acc


def _strided(t, lanes):
    """SIMD lanes or a warp: lane l sums terms l, l+L, l+2L, ... sequentially,
    then the lanes are combined by a butterfly (lane l += lane l + L/2, then
    L/4, ...), as a warp shuffle reduction does."""
    vals = [t.chain(range(l, t.n, lanes)) for l in range(lanes)]
    width = lanes
    while width > 1:
        width //= 2
        vals = [fp.add(vals[l], vals[l + width]) for l in range(width)]
    return vals[0]


def _numpy_pairwise_block(t, lo, n):
    if n < 8:
        return t.chain(range(lo, lo + n), np.float32(0.0))
    if n <= 128:
        r = [t.chain([lo + j]) for j in range(8)]
        i = 8
        while i < n - (n % 8):
            r = [t.fold(r[j], lo + i + j) for j in range(8)]
            i += 8
        res = fp.add(fp.add(fp.add(r[0], r[1]), fp.add(r[2], r[3])), fp.add(fp.add(r[4], r[5]), fp.add(r[6], r[7])))
        for k in range(lo + i, lo + n):
            res = t.fold(res, k)
        return res
    n2 = n // 2
    n2 -= n2 % 8
    return fp.add(_numpy_pairwise_block(t, lo, n2), _numpy_pairwise_block(t, lo + n2, n - n2))


def _numpy_sum(t):
    """NumPy's float32 add.reduce along a contiguous row: its pairwise sum
    (sequential below 8 terms; 8 accumulators up to 128; halves kept
    multiples of 8 above)."""
    return _numpy_pairwise_block(t, 0, t.n)


@dataclass(frozen=True)
class Order:
    name: str
    fn: Callable
    spec: bool = False  # the order the spec prescribes
    fused: bool = False
    plus_zero: bool = False  # starts an accumulator from +0: also changes the sign of zero sums

    def __call__(self, a, b=None) -> np.ndarray:
        return self.fn(_Terms(a, b, self.fused))


PLUS_ZERO = ("sequential from +0", "NumPy pairwise (8 accumulators, blocks of 128)")


def _unfused_orders() -> list[tuple[str, Callable, bool]]:
    out = [
        ("sequential k increasing from -0", _sequential, True),
        ("sequential from +0", lambda t: _sequential(t, np.float32(0.0)), False),
        ("reversed", _reversed, False),
        ("pairwise tree (recursive halves)", _pairwise, False),
    ]
    out += [
        (f"blocked/split-k, blocks of {b}", (lambda t, b=b: _blocked(t, b)), False)
        for b in (2, 4, 8, 16, 32, 64, 128, 256)
    ]
    out += [
        (f"{lanes} strided lanes + butterfly (SIMD/warp)", (lambda t, L=lanes: _strided(t, L)), False)
        for lanes in (2, 4, 8, 16, 32)
    ]
    out += [("NumPy pairwise (8 accumulators, blocks of 128)", _numpy_sum, False)]
    return out


def candidates(products: bool) -> list[Order]:
    """Every candidate order; with ``products`` also each one with the
    products contracted into the accumulation (fused multiply-add)."""
    out = [Order(n, f, spec=s, plus_zero=n in PLUS_ZERO) for n, f, s in _unfused_orders()]
    if products:
        out += [
            Order(n + ", fused multiply-add", f, fused=True, plus_zero=n in PLUS_ZERO)
            for n, f, s in _unfused_orders()
            if "pairwise tree" not in n
        ]
    return out


def spec_order(products: bool) -> Order:
    return next(o for o in candidates(products) if o.spec)
