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

import hashlib
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..base import deviant as fp

NEG_ZERO = np.float32(-0.0)


def _add(a, b):
    """a + b rounded to binary32 and flushed ([num.flush.c1]); the caller holds
    ``np.errstate(all="ignore")`` (``Order.__call__``): this runs once per term."""
    s = np.add(a, b, dtype=np.float32)
    return np.copysign(np.float32(0), s, out=s, where=np.abs(s) < fp.FLT_MIN)


class _Terms:
    """The N terms of R sums, and how they are folded into accumulators.

    The terms are held transposed, ``[N, R]``, so term k of every sum is one
    contiguous row; rounded products (unfused) are formed once, element-wise,
    which gives the same bits as forming each where it is added.  ``fold``
    takes one term index, or an array of them for many independent chains at
    once (an accumulator per chain and sum): every element still sees exactly
    the additions of its own chain, in its own order."""

    def __init__(self, a, b=None, fused=False):
        a = np.asarray(a, dtype=np.float32)
        self.rows = a.shape[0]
        self.n = a.shape[1]
        self.fused = fused and b is not None
        at = np.ascontiguousarray(a.T)
        if b is None:
            self.terms, self.b = at, None
        elif self.fused:
            self.terms, self.b = at, np.ascontiguousarray(np.asarray(b, dtype=np.float32).T)
        else:
            self.terms, self.b = fp.mul(at, np.ascontiguousarray(np.asarray(b, dtype=np.float32).T)), None

    def fold(self, acc, k):
        if self.fused:
            return fp.fma(self.terms[k], self.b[k], acc)
        return _add(acc, self.terms[k])

    def chain(self, idx, start=NEG_ZERO):
        acc = np.full(self.rows, start, dtype=np.float32)
        for k in idx:
            acc = self.fold(acc, k)
        return acc

    def chains(self, starts, step, counts, start=NEG_ZERO):
        """Chain c folds terms starts[c], starts[c] + step, ... (counts[c] of
        them) into an accumulator from ``start``: all chains together, [C, R]."""
        starts, counts = np.asarray(starts), np.asarray(counts)
        acc = np.full((starts.size, self.rows), start, dtype=np.float32)
        for j in range(int(counts.max(initial=0))):
            k = starts + step * j
            live = counts > j
            if live.all():
                acc = self.fold(acc, k)
            else:
                acc[live] = self.fold(acc[live], k[live])
        return acc


def _sequential(t, start=NEG_ZERO):
    return t.chain(range(t.n), start)


def _reversed(t):
    return t.chain(range(t.n - 1, -1, -1))


def _pairwise(t):
    """Recursive halving: sum(lo..hi) = sum(lo..mid) + sum(mid..hi), mid = lo + n//2.
    Evaluated level by level from the deepest: a node's children are
    consecutive in the level below, in order."""
    if t.n == 0:
        return np.zeros(t.rows, np.float32)
    levels = [(np.array([0]), np.array([t.n]))]
    while True:
        lo, hi = levels[-1]
        inner = hi - lo > 1
        if not inner.any():
            break
        lo, hi = lo[inner], hi[inner]
        mid = lo + (hi - lo) // 2
        levels.append((np.stack([lo, mid], 1).ravel(), np.stack([mid, hi], 1).ravel()))
    below = None
    for lo, hi in reversed(levels):
        vals = np.empty((lo.size, t.rows), np.float32)
        leaf = hi - lo == 1
        vals[leaf] = t.chains(lo[leaf], 1, np.ones(int(leaf.sum()), int))
        if below is not None:
            vals[~leaf] = _add(below[0::2], below[1::2])
        below = vals
    return below[0]


def _blocked(t, block):
    """Split-k: each block of ``block`` consecutive terms summed sequentially,
    then the block partials summed sequentially."""
    starts = np.arange(0, t.n, block)
    partials = t.chains(starts, 1, np.minimum(block, t.n - starts))
    acc = np.full(t.rows, NEG_ZERO, dtype=np.float32)
    for p in partials:
        acc = _add(acc, p)
    return acc


def _strided(t, lanes):
    """SIMD lanes or a warp: lane l sums terms l, l+L, l+2L, ... sequentially,
    then the lanes are combined by a butterfly (lane l += lane l + L/2, then
    L/4, ...), as a warp shuffle reduction does."""
    lane = np.arange(lanes)
    vals = t.chains(lane, lanes, np.maximum(0, (t.n - lane + lanes - 1) // lanes))
    width = lanes
    while width > 1:
        width //= 2
        vals = _add(vals[:width], vals[width : 2 * width])
    return vals[0]


def _numpy_pairwise_block(t, lo, n):
    if n < 8:
        return t.chain(range(lo, lo + n), np.float32(0.0))
    if n <= 128:
        whole = n - n % 8
        r = t.chains(lo + np.arange(8), 8, np.full(8, whole // 8))
        res = _add(_add(_add(r[0], r[1]), _add(r[2], r[3])), _add(_add(r[4], r[5]), _add(r[6], r[7])))
        for k in range(lo + whole, lo + n):
            res = t.fold(res, k)
        return res
    n2 = n // 2
    n2 -= n2 % 8
    return _add(_numpy_pairwise_block(t, lo, n2), _numpy_pairwise_block(t, lo + n2, n - n2))


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
        a = np.ascontiguousarray(a, dtype=np.float32)
        b = None if b is None else np.ascontiguousarray(b, dtype=np.float32)
        if a.size < _MEMO_FROM:
            return self._fold(a, b)
        # a diagnosis asks for the same sums of the same terms under many variants
        key = (self.fn, self.name, self.fused, a.shape, _digest(a), None if b is None else _digest(b))
        if key not in _MEMO:
            out = self._fold(a, b)
            while _MEMO and sum(v.nbytes for v in _MEMO.values()) + out.nbytes > _MEMO_BYTES:
                _MEMO.pop(next(iter(_MEMO)))  # the oldest first
            if out.nbytes <= _MEMO_BYTES:
                _MEMO[key] = out
            return out.copy()
        return _MEMO[key].copy()

    def _fold(self, a, b):
        with np.errstate(all="ignore"):
            return self.fn(_Terms(a, b, self.fused))


# Sums of many terms are remembered by the digest of their terms (R results an
# entry, at most _MEMO_BYTES in all); below _MEMO_FROM terms folding is cheaper than hashing.
_MEMO: dict = {}
_MEMO_FROM = 1 << 16
_MEMO_BYTES = 32 << 20


def _digest(x: np.ndarray) -> bytes:
    return hashlib.blake2b(x.data, digest_size=16).digest()


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
