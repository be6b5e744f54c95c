"""Tiled rows of the bf16 log-softmaxes whose bf16 outputs show their sum's
order ([conf.vectors.c2], [conf.domain.c1]; issue 31).

A tiled row is a 251-element pattern repeated ([conf.vectors.c2]); its case
must tell the spec's order from the reversed one on some output
(``separation.reversing_rows``).  A drawn row does not, for these two ops
(none of 400 draws): the row's sum reaches the bf16 outputs through a
logarithm or a product by a probability, and the two orders' binary32
results, at most a few ulp apart, round to the same bf16 value on all 251
distinct elements.  So these rows are built, not drawn:

* forward, y[j] = (x[j] - m) - l with l = log(s): every y lies within a
  few binary32 ulp of l's own bits, and a bf16 output changes only when
  some y sits at most that far from a bf16 rounding boundary (the halfway
  point between two bf16 values).  The pattern holds its maximum 0, 125
  elements at one level c (which moves l by up to about 0.7), 124 elements
  in (-2^-8, 0) and one aim element.  c is redrawn until the halfway point
  next below -l is less than 2^-12 away; the aim element is set to minus
  that distance (a bf16 value that fine exists there), so its own output
  lands within an ulp of the boundary; its neighbours at +-1 .. +-4 bf16
  ulp are tried in turn.
* backward, dx[j] = dy[j] - exp(y[j]) * g with g the sum of dy: at even
  j, dy[j] is exp(y[j]) * g rounded to bf16, so dx[j] is the small
  remainder of a cancellation, whose bf16 rounding a change of a few ulp in
  g moves; at odd j, dy[j] is drawn with magnitudes 2^-8 .. 2^3 times the
  even ones', so that g is not exact (with terms of one magnitude, at
  V = 32,769, every term is a multiple of g's ulp and both orders give the
  same g); g is the fixed point of g = sum of dy, found by iteration.

The same builders give the V = 16,385 rows, stored whole (below the
tiling threshold), since a drawn row of that length separates no better.
Every candidate is still checked by ``reversing_rows`` against the
reference; nothing here decides a golden bit.
"""

from __future__ import annotations

import math

import numpy as np

from ..table.bf16 import _enc

F32 = np.float32
PATTERN = 251  # axes.TILE


def _widen(h):
    return (np.asarray(h, np.uint16).astype(np.uint32) << 16).view(F32)


def _row(p, n):
    return np.resize(p, (1, n))


def _lse(pattern_h, n):
    """l = log(s) of the row (its maximum is the pattern's element 0, exactly 0):
    the binary32 log-softmax of the widened row at that element is 0 - l."""
    from ...ops import softmax

    return -float(softmax.log_softmax_forward(_row(_widen(pattern_h), n))[0, 0])


def _to_halfway(l):
    """Distance from -l down to the next bf16 halfway point (the outputs are
    -l - d for d >= 0, in l's binade: a bf16 ulp of 2^(e-7))."""
    step = 2.0 ** (math.floor(math.log2(l)) - 7)
    return (math.floor(l / step - 0.5) + 1.5) * step - l


def log_softmax_forward(rng, n):
    """A ``draw()`` for ``reversing_rows``: each call gives the next candidate row."""

    def candidates():
        while True:
            p = np.zeros(PATTERN, F32)
            p[1:126] = -rng.uniform(0.5, 4.0)
            p[126:250] = -rng.uniform(0.0, 2.0**-8, 124)
            r = _to_halfway(_lse(_enc(p), n))
            if r >= 2.0**-12:
                continue
            for _ in range(3):  # the aim element moves l by about r / 251: settle it
                p[250] = -r
                r = _to_halfway(_lse(_enc(p), n))
            h = _enc(p)
            for step in (0, -1, 1, -2, 2, -3, 3, -4, 4):
                q = h.copy()
                q[250] = np.uint16(int(q[250]) + step)
                yield {"x": _row(q, n)}

    it = candidates()
    return lambda: next(it)


def log_softmax_backward(rng, n):
    """A ``draw()`` for ``reversing_rows``: dy the probabilities times g, in bf16."""
    from ...linalg import row_sum
    from ...numerics import elementwise
    from ...ops import bf16

    def draw():
        x = _enc(_row(rng.uniform(-1.0, 0.0, PATTERN).astype(F32), n))
        y = bf16.apply("log_softmax_forward", x)
        p = elementwise.exp(np.ascontiguousarray(_widen(y[0, :PATTERN])))  # the reference's exp(y[j])
        odd = np.zeros(PATTERN, F32)  # magnitudes 2^-8 .. 2^3 times the even ones': g is inexact
        odd[1::2] = rng.choice((-1.0, 1.0), PATTERN // 2) * 2.0 ** rng.uniform(-8.0, 3.0, PATTERN // 2) * 100 / n
        g = F32(0)
        for _ in range(16):  # g -> P_even g + D_odd contracts (P_even about 1/2): the fixed point
            dy = _enc(np.where(np.arange(PATTERN) % 2 == 0, np.multiply(p, g, dtype=F32), odd))
            g = row_sum(_row(_widen(dy), n))[0]
        return {"dy": _row(dy, n), "y": y}

    return draw


DESIGNED = {"bf16_log_softmax_forward": log_softmax_forward, "bf16_log_softmax_backward": log_softmax_backward}
