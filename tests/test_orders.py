"""The candidate summation orders of the diagnosis (conformance/readings/orders.py)
against scalar transcriptions of the order each one names.

The orders fold many chains at once (lanes, blocks, a tree's levels) and
remember long sums by the digest of their terms; here every sum is written
out one element and one addition at a time: NumPy float32 scalars, each sum
rounded by IEEE binary32 and flushed ([num.flush.c1]); a fused step is the
exact a*b + acc (fractions) rounded once, then flushed.  Bits must agree
for every order, at lengths on both sides of every lane and block width.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from refreplay.conformance.readings import orders

F32 = np.float32
FLT_MIN = F32(2.0**-126)
NEG0 = F32(-0.0)


def _flush(x):
    return x * F32(0.0) if abs(x) < FLT_MIN else x


def _add(a, b):
    with np.errstate(all="ignore"):
        return _flush(F32(a) + F32(b))


def _mul(a, b):
    with np.errstate(all="ignore"):
        return _flush(F32(a) * F32(b))


def _round_f32(q: Fraction) -> np.float32:
    near = F32(float(q))
    cands = [np.nextafter(near, F32(-np.inf)), near, np.nextafter(near, F32(np.inf))]
    return min(cands, key=lambda v: (abs(Fraction(float(v)) - q), int(np.array(v).view(np.uint32)) & 1))


def _fma(a, b, c):
    """round(a*b + c) once (finite inputs), then flushed; an exact zero takes IEEE's sign rule."""
    q = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    if q == 0:
        with np.errstate(all="ignore"):
            return _flush(F32(float(a) * float(b) + float(c)))  # exact in float64: the sign of the zero
    return _flush(_round_f32(q))


class Scalar:
    """One sum's terms, folded one at a time."""

    def __init__(self, a, b, fused):
        self.a, self.b, self.fused = a, b, fused

    def fold(self, acc, k):
        if self.b is None:
            return _add(acc, self.a[k])
        if self.fused:
            return _fma(self.a[k], self.b[k], acc)
        return _add(acc, _mul(self.a[k], self.b[k]))

    def chain(self, ks, start=NEG0):
        acc = F32(start)
        for k in ks:
            acc = self.fold(acc, k)
        return acc


def _tree(t, lo, hi):
    if hi - lo == 0:
        return F32(0.0)
    if hi - lo == 1:
        return t.chain([lo])
    mid = lo + (hi - lo) // 2
    return _add(_tree(t, lo, mid), _tree(t, mid, hi))


def _blocked(t, n, block):
    acc = NEG0
    for k0 in range(0, n, block):
        acc = _add(acc, t.chain(range(k0, min(k0 + block, n))))
    return acc


def _strided(t, n, lanes):
    vals = [t.chain(range(lane, n, lanes)) for lane in range(lanes)]
    while len(vals) > 1:
        half = len(vals) // 2
        vals = [_add(vals[i], vals[i + half]) for i in range(half)]
    return vals[0]


def _numpy_block(t, lo, n):
    """NumPy's pairwise float32 reduction: below 8 terms from +0; up to 128
    terms 8 accumulators (terms j, j+8, ...), combined ((0+1)+(2+3))+((4+5)+(6+7)),
    then the tail; above, halves kept multiples of 8."""
    if n < 8:
        return t.chain(range(lo, lo + n), F32(0.0))
    if n <= 128:
        whole = n - n % 8
        r = [t.chain(range(lo + j, lo + whole, 8)) for j in range(8)]
        res = _add(_add(_add(r[0], r[1]), _add(r[2], r[3])), _add(_add(r[4], r[5]), _add(r[6], r[7])))
        for k in range(lo + whole, lo + n):
            res = t.fold(res, k)
        return res
    half = n // 2 - (n // 2) % 8
    return _add(_numpy_block(t, lo, half), _numpy_block(t, lo + half, n - half))


def scalar_order(name, t, n):
    """The order named ``name`` (without its ", fused multiply-add" suffix), written out."""
    if name == "sequential k increasing from -0":
        return t.chain(range(n))
    if name == "sequential from +0":
        return t.chain(range(n), F32(0.0))
    if name == "reversed":
        return t.chain(range(n - 1, -1, -1))
    if name == "pairwise tree (recursive halves)":
        return _tree(t, 0, n)
    if name.startswith("blocked/split-k, blocks of "):
        return _blocked(t, n, int(name.rsplit(" ", 1)[1]))
    if name.endswith("strided lanes + butterfly (SIMD/warp)"):
        return _strided(t, n, int(name.split(" ", 1)[0]))
    if name == "NumPy pairwise (8 accumulators, blocks of 128)":
        return _numpy_block(t, 0, n)
    raise AssertionError(f"no transcription of {name!r}")


SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-39, -1e-39, 1.1754944e-38, -1.1754942e-38, 3e38, -3e38])


def _terms(rng, R, n, kind):
    if kind == "normal":
        return rng.standard_normal((R, n)).astype(F32)
    if kind == "tiny":  # sums that land below FLT_MIN: the flush decides
        return (rng.standard_normal((R, n)) * 3e-38).astype(F32)
    if kind == "special":
        return rng.choice(SPECIAL, size=(R, n)).astype(F32)
    return (rng.standard_normal((R, n)) * 2.0 ** rng.integers(-60, 60, (R, n))).astype(F32)  # wide exponents


def _bits(x):
    """Bit patterns, every NaN as one: a NaN's sign and payload come from the
    hardware (NumPy's scalar and vector paths differ on inf + -inf), not from
    the order."""
    b = np.array(x, F32).view(np.uint32)
    b[np.isnan(np.array(x, F32))] = 0x7FC00000
    return b


LENGTHS = [0, 1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 65, 127, 128, 129, 136, 255, 257, 300]


@pytest.mark.parametrize("kind", ["normal", "tiny", "special", "wide"])
def test_every_order_of_sums_matches_its_transcription(kind):
    rng = np.random.default_rng(["normal", "tiny", "special", "wide"].index(kind))
    for n in LENGTHS:
        a = _terms(rng, 3, n, kind)
        for order in orders.candidates(False):
            got = order(a)
            want = [scalar_order(order.name, Scalar(a[r], None, False), n) for r in range(3)]
            assert got.dtype == F32 and got.shape == (3,)
            assert _bits(got).tolist() == _bits(want).tolist(), (order.name, n, kind)


@pytest.mark.parametrize("fused", [False, True])
def test_every_order_of_products_matches_its_transcription(fused):
    rng = np.random.default_rng(7 + fused)
    for n in LENGTHS:
        a, b = _terms(rng, 2, n, "wide"), _terms(rng, 2, n, "normal")
        b[:, ::5] = 0  # zero products: the signs of zero sums
        for order in (o for o in orders.candidates(True) if o.fused == fused):
            got = order(a, b)
            base = order.name.removesuffix(", fused multiply-add")
            want = [scalar_order(base, Scalar(a[r], b[r], fused), n) for r in range(2)]
            assert _bits(got).tolist() == _bits(want).tolist(), (order.name, n)


def test_the_orders_are_told_apart_by_the_transcriptions():
    """The comparisons above can fail: on random rows every two orders give
    different bits (but the two sequential ones, which differ only in the
    sign of a zero sum), in the code and in the transcriptions."""
    a = np.random.default_rng(3).standard_normal((64, 300)).astype(F32)
    got = {o.name: _bits(o(a)).tobytes() for o in orders.candidates(False) if o.name != "sequential from +0"}
    assert len(set(got.values())) == len(got)
    row = Scalar(a[0], None, False)
    assert scalar_order("8 strided lanes + butterfly (SIMD/warp)", row, 300) != scalar_order(
        "16 strided lanes + butterfly (SIMD/warp)", row, 300
    )
    z = np.full((1, 4), -0.0, F32)
    assert _bits(orders.candidates(False)[0](z)) != _bits(orders.candidates(False)[1](z))  # -0 against +0


def test_long_sums_are_remembered_by_their_terms_only(monkeypatch):
    """A long sum is remembered (from 2^16 terms; here from 64, with a memo of
    its own): the same terms give the same bits, other terms (one bit
    flipped, or other products, fused or not) their own bits, and a caller
    that writes into a result does not change the next one."""
    monkeypatch.setattr(orders, "_MEMO_FROM", 64)
    monkeypatch.setattr(orders, "_MEMO", {})
    rng = np.random.default_rng(11)
    n = 300
    a = rng.standard_normal((1, n)).astype(F32)
    b = rng.standard_normal((1, n)).astype(F32)
    for name in ("sequential k increasing from -0", "16 strided lanes + butterfly (SIMD/warp)"):
        order = next(o for o in orders.candidates(True) if o.name == name)
        want = scalar_order(name, Scalar(a[0], None, False), n)
        first = order(a)
        assert _bits(first).tolist() == _bits([want]).tolist()
        first[:] = 12345.0
        assert _bits(order(a)).tolist() == _bits([want]).tolist()
        assert any(k[1] == name for k in orders._MEMO)
        flipped = a.copy()
        flipped.view(np.uint32)[0, n // 2] ^= 1 << 22
        assert (
            _bits(order(flipped)).tolist() == _bits([scalar_order(name, Scalar(flipped[0], None, False), n)]).tolist()
        )
        assert order(flipped).tobytes() != order(a).tobytes()
        prod = order(a, b)
        assert _bits(prod).tolist() == _bits([scalar_order(name, Scalar(a[0], b[0], False), n)]).tolist()
        fused = next(o for o in orders.candidates(True) if o.name == name + ", fused multiply-add")
        assert _bits(fused(a, b)).tolist() == _bits([scalar_order(name, Scalar(a[0], b[0], True), n)]).tolist()
