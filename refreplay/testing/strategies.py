"""Hypothesis strategies for testing binary32 kernels against refreplay.

Public API (``pip install 'refreplay[fuzz]'`` for hypothesis)::

    from hypothesis import given
    from refreplay.testing import strategies as rs

    @given(rs.op_inputs("matmul", max_elements=4096))
    def test_my_matmul(case):
        dims, inputs = case                       # {"I": 3, "K": 65, "J": 1}, {"A": ..., "B": ...}
        expected = rs.expected("matmul", inputs)  # {"C": ...} computed by the reference
        actual = my_matmul(inputs["A"], inputs["B"])
        assert rs.same_bits(expected["C"], actual)

Strategies:
  f32_bits(lo_exp, hi_exp)  uint32 bit patterns, edge-heavy: +-0, subnormals,
                            FLT_MIN and neighbours, max finite, +-inf, NaNs with
                            payloads (quiet, signalling, sign set), rounding ties,
                            short significands, huge and tiny magnitudes, and
                            ordinary values with exponents in [lo_exp, hi_exp]
  f32_values(...)           the same as float32 scalars
  f32_arrays(shape, ...)    arrays of them: up to 64 elements element by
                            element; larger, one drawn value with up to 16
                            others poked in; at any size, dense random values
                            from a drawn seed with up to 8 edge values poked
                            in (realistic sums: what finds order changes)
  sizes(lo, hi)             one size, biased to 0, 1, 2, powers of two +-1 and
                            tile edges (multiples of 16, 32, 64, 128 +-1)
  shapes(op, max_elements)  the op's shape letters ({"I": .., "K": .., "J": ..}),
                            inputs and outputs together at most max_elements
  op_inputs(op, max_elements)  (dims, inputs) in the op's calling convention
                            (``refreplay vectors ops``); inputs a backward takes
                            from its forward are computed by the reference

Helpers: ``expected(op, inputs)`` (the reference's outputs, [conv.conformance.c1])
and ``same_bits(a, b)`` (bit-for-bit equality, [conf.runner.c1]).
Values are drawn as bit patterns, so a failing example prints and replays
exactly.
"""

from __future__ import annotations

import functools

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from ..conformance.shapes import live

# Bit patterns a kernel most often gets wrong, each named by what it exercises.
EDGE_BITS = (
    0x00000000,
    0x80000000,  # +-0
    0x00000001,
    0x807FFFFF,
    0x00400000,  # subnormals: smallest, largest (negative), FLT_MIN/2
    0x00800000,
    0x80800000,
    0x00800001,
    0x00FFFFFF,  # FLT_MIN, -FLT_MIN and neighbours
    0x7F7FFFFF,
    0xFF7FFFFF,
    0x7F000000,  # max finite, -max finite, 2^127
    0x7F800000,
    0xFF800000,  # +-inf
    0x7FC00000,
    0xFFC00000,
    0x7FFFFFFF,
    0x7FC12345,
    0x7F800001,
    0xFFFFFFFF,  # NaNs: canonical, x86, CUDA, payloads
    0x3F800000,
    0xBF800000,
    0x3F800001,
    0x3F7FFFFF,
    0x3F7FFFFE,  # 1, -1 and its neighbours
    0x3F000000,
    0x3FC00000,
    0x40200000,
    0xBFC00000,  # 0.5, 1.5, 2.5, -1.5: round-half-even ties
    0x4B000001,
    0x4B7FFFFF,
    0x4B800000,  # 2^23 + 1, 2^24 - 1, 2^24: the end of exact integers
    0x3DCCCCCD,
    0x40490FDB,  # 0.1, pi
)


def _sign(bits, s):
    return bits | (s << 31)


def _normal(lo_exp, hi_exp, mant_bits=23):
    lo, hi = max(lo_exp, -126) + 127, min(hi_exp, 127) + 127
    return st.builds(
        lambda s, e, m: (s << 31) | (e << 23) | (m << (23 - mant_bits)),
        st.integers(0, 1),
        st.integers(lo, hi),
        st.integers(0, (1 << mant_bits) - 1),
    )


@functools.lru_cache(maxsize=None)
def f32_bits(lo_exp: int = -8, hi_exp: int = 8) -> st.SearchStrategy[int]:
    """uint32 bit patterns of binary32 values; ordinary values (exponent in
    [lo_exp, hi_exp]) about half the time, edge values the rest."""
    ordinary = _normal(lo_exp, hi_exp)
    return st.one_of(
        ordinary,
        ordinary,
        ordinary,
        st.sampled_from(EDGE_BITS),
        _normal(lo_exp, hi_exp, mant_bits=4),  # short significands: exact products, ties in sums
        st.builds(_sign, st.integers(1, 0x7FFFFF), st.integers(0, 1)),  # subnormals
        st.builds(_sign, st.integers(0x7F800001, 0x7FFFFFFF), st.integers(0, 1)),  # NaN payloads
        _normal(-126, -100),
        _normal(100, 127),  # tiny and huge
    )


def f32_values(lo_exp: int = -8, hi_exp: int = 8) -> st.SearchStrategy[np.float32]:
    return f32_bits(lo_exp, hi_exp).map(lambda b: np.array([b], np.uint32).view(np.float32)[0])


def _bits_to_f32(a):
    return np.ascontiguousarray(a.astype(np.uint32).view(np.float32))


def _poked(x, pokes):
    """x with the bit patterns of ``pokes`` [(flat index, bits)] written in."""
    x = x.reshape(-1).copy()
    for i, b in pokes:
        x.view(np.uint32)[i % x.size] = b
    return x


def _pokes(n, bits, most):
    return st.lists(st.tuples(st.integers(0, n - 1), bits), max_size=most)


def _filled(shape, n, lo_exp, hi_exp):
    """One value everywhere, up to 16 others at drawn positions (cheap to
    draw at any size; shrinks to a readable case)."""
    bits = f32_bits(lo_exp, hi_exp)
    return st.builds(
        lambda fill, pokes: _poked(_bits_to_f32(np.full(n, fill, np.uint32)), pokes).reshape(shape),
        bits,
        _pokes(n, bits, 16),
    )


def _dense(shape, n, lo_exp, hi_exp, positive):
    """Random values from a drawn seed (as the committed random cases are
    built), up to 8 edge values at drawn positions."""
    from ..conformance.inputs import values as V

    def make(seed, pokes):
        x = V.random_f32(np.random.default_rng(seed), n, lo_exp, hi_exp, positive=positive)
        return _poked(x, pokes).reshape(shape)

    return st.builds(make, st.integers(0, 2**32 - 1), _pokes(n, st.sampled_from(EDGE_BITS), 8))


ELEMENTWISE_MAX = 64  # larger arrays are drawn filled or dense, not element by element (speed)


def f32_arrays(shape, lo_exp: int = -8, hi_exp: int = 8, positive: bool = False) -> st.SearchStrategy[np.ndarray]:
    """float32 arrays of ``shape``: up to 64 elements, element by element
    from ``f32_bits``; larger, one value with up to 16 others poked in; or,
    at any size, dense random values (exponents in [lo_exp, hi_exp]) with up
    to 8 edge values poked in."""
    shape = tuple(int(s) for s in shape)
    n = int(np.prod(shape))
    if n == 0:
        return st.just(np.zeros(shape, np.float32))
    dense = _dense(shape, n, lo_exp, hi_exp, positive)
    if n <= ELEMENTWISE_MAX:
        return st.one_of(hnp.arrays(np.uint32, shape, elements=f32_bits(lo_exp, hi_exp)).map(_bits_to_f32), dense)
    return st.one_of(_filled(shape, n, lo_exp, hi_exp), dense)


def int_arrays(shape, lo: int, hi: int) -> st.SearchStrategy[np.ndarray]:
    """int32 arrays with values in [lo, hi): one value with up to 16 others
    at drawn positions (the bounds are the values' whole domain)."""
    shape = tuple(int(s) for s in shape)
    n = int(np.prod(shape))
    if n == 0:
        return st.just(np.zeros(shape, np.int32))
    v = st.integers(lo, hi - 1)

    def make(fill, pokes):
        x = np.full(n, fill, np.int32)
        for i, b in pokes:
            x[i] = b
        return x.reshape(shape)

    return st.builds(make, v, _pokes(n, v, 16))


def _special_sizes(lo, hi):
    out = {0, 1, 2, 3}
    for p in range(1, 31):
        out |= {(1 << p) - 1, 1 << p, (1 << p) + 1}
    for tile in (16, 32, 64, 128):
        out |= {m * tile + d for m in range(1, 9) for d in (-1, 0, 1)}
    return sorted(s for s in out if lo <= s <= hi)


def sizes(lo: int = 0, hi: int = 1 << 16) -> st.SearchStrategy[int]:
    """One size in [lo, hi]: often a special size (0, 1, 2, 3, 2^p and 2^p+-1,
    tile multiples of 16, 32, 64, 128 and +-1), otherwise any; shrinks
    toward lo."""
    special = _special_sizes(lo, hi)
    anyone = st.integers(lo, hi)
    return st.one_of(anyone, st.sampled_from(special)) if special else anyone


def _largest(lv, dims, x, lo, budget):
    """The largest value of letter x (others as in dims) within budget."""
    hi = live.MAX_DIM
    if lv.elements({**dims, x: hi}) <= budget:
        return hi
    while lo < hi:  # elements grow with every letter: bisect
        mid = (lo + hi + 1) // 2
        if lv.elements({**dims, x: mid}) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def shapes(op: str, max_elements: int = 1 << 16) -> st.SearchStrategy[dict]:
    """The op's shape letters -> sizes, inputs and outputs together at most
    ``max_elements`` elements.  The letters are drawn in a drawn order, each
    up to what the budget leaves with the letters not yet drawn at 1 (and
    never above ``max_elements``), so thin-but-long shapes (a long K, a wide
    V) are as likely as square ones."""
    lv = live.live_op(op)
    low = {x: lv.minimum.get(x, 0) for x in lv.letters}
    if lv.elements(low) > max_elements:
        raise ValueError(f"{op}: even the smallest shape has more than {max_elements} elements")

    @st.composite
    def draw(draw_):
        dims = {x: max(1, v) for x, v in low.items()}  # undecided letters count as 1 (else 0 frees all)
        for x in draw_(st.permutations(lv.letters)):
            top = _largest(lv, dims, x, low[x], max_elements) if lv.elements(dims) <= max_elements else low[x]
            dims[x] = draw_(sizes(low[x], min(top, max_elements)))
        if lv.check and lv.check(dims):  # rotary pairs need an even HS: one less is within the budget
            dims["HS"] -= 1
        return dims

    return draw()


class _Source:
    """``live.NumpySource``'s interface, drawing from hypothesis."""

    def __init__(self, draw):
        self.draw = draw

    def f32(self, shape, lo=-8, hi=8, positive=False):
        return self.draw(f32_arrays(tuple(np.atleast_1d(shape).tolist()), lo, hi, positive))

    def uniform(self, shape, lo, hi):
        m = max(abs(lo), abs(hi))
        return self.f32(shape, -8, int(np.ceil(np.log2(m))) if m > 0 else 0)

    def ints(self, shape, lo, hi):
        return self.draw(int_arrays(tuple(np.atleast_1d(shape).tolist()), lo, hi))


def op_inputs(op: str, max_elements: int = 1 << 16) -> st.SearchStrategy[tuple[dict, dict]]:
    """(dims, inputs) for ``op`` in its calling convention, at most
    ``max_elements`` elements in inputs and outputs together."""
    lv = live.live_op(op)

    @st.composite
    def draw(draw_):
        dims = draw_(shapes(op, max_elements))
        return dims, lv.make(_Source(draw_), dims)

    return draw()


def expected(op: str, inputs: dict) -> dict[str, np.ndarray]:
    """[conv.conformance.c1] The reference's outputs for these inputs."""
    return live.expected(op, inputs)


def same_bits(a, b) -> bool:
    """[conf.runner.c1] Same dtype, shape and bits (NaNs included)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    u = np.dtype(f"u{a.dtype.itemsize}")
    return bool(np.array_equal(np.ascontiguousarray(a).view(u), np.ascontiguousarray(b).view(u)))
