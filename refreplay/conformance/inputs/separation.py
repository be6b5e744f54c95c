"""What makes a probe a probe: its inputs must separate the property it
claims (``ProbeError`` otherwise), bit differences with NaNs alike
(``differs``), and the sweep's own claim -- the same sums split in two halves
(the simplest split-K) give other bits somewhere (``split_in_two``,
``separating``, ``check_sweep``).
"""

from __future__ import annotations

import numpy as np

from ..base import deviant as fp
from ..base.case import load_inputs


class ProbeError(RuntimeError):
    """A probe's inputs do not separate the property it claims to probe."""


def differs(expected: np.ndarray, other: np.ndarray) -> np.ndarray:
    """Per element: different bits, not counting two NaNs as different."""
    e, o = np.asarray(expected, np.float32).ravel(), np.asarray(other, np.float32).ravel()
    both_nan = np.isnan(e) & np.isnan(o)
    return (fp.bits(e) != fp.bits(o)) & ~both_nan


def _check(cond: bool, what: str):
    if not cond:
        raise ProbeError(what)


def separating(op, draw, tries=32):
    """Inputs from ``draw()`` (redrawn while needed) on which the split in two
    of ``check_sweep`` gives other bits: a thin sweep has few outputs, and one
    random sum may happen to round alike both ways."""
    for _ in range(tries):
        inputs = draw()
        loaded = load_inputs([inputs[n] for n in op.inputs])
        expected = np.asarray(op.reference(*loaded), np.float32).ravel()
        if differs(expected, split_in_two(*op.terms(*loaded))).any():
            return inputs
    raise ProbeError(f"{op.name}: no sweep input separates a split in two")


def reversing_rows(op, draw, n, tries=400):
    """Inputs from ``draw()`` (redrawn while needed) on which the reference
    evaluated with every length-``n`` axis reversed (its sums walk the row
    backwards: another order, the same arithmetic) gives other bits on some
    output.  A tiled row ([conf.vectors.c2]) has few distinct elements, and
    a bf16 output or a logarithm can round two orders alike on all of them."""
    for _ in range(tries):
        inputs = draw()
        loaded = load_inputs([inputs[k] for k in op.inputs])
        if any(differs(e, r).any() for e, r in zip(_outs(op.reference(*loaded)), reversed_rows(op, loaded, n))):
            return inputs
    raise ProbeError(f"{op.name}: no tiled row separates its order from the reversed one")


def reversed_rows(op, args, n):
    """``op``'s reference on ``args`` with every axis of length ``n`` (the last
    one) reversed, and its outputs reversed back; targets index the reversed row."""
    flip = [np.ascontiguousarray(a[..., ::-1]) if a.ndim and a.shape[-1] == n else a for a in args]
    if "targets" in op.inputs:
        i = op.inputs.index("targets")
        t = args[i]
        flip[i] = np.where(t >= 0, n - 1 - t, t).astype(t.dtype)
    return [
        np.ascontiguousarray(o[..., ::-1]) if o.ndim and o.shape[-1] == n else o for o in _outs(op.reference(*flip))
    ]


def _outs(r):
    return [np.asarray(o) for o in (r if isinstance(r, tuple) else (r,))]


def split_in_two(a, b=None, first=None) -> np.ndarray:
    """R sums of N terms (rows of a, or of the products a*b, each rounded)
    split into two halves, the first holding ``first`` terms (default
    ceil(N/2)), each summed in order from -0, then added: what a kernel that
    switches to split-K or a two-block form above some length computes.
    (The halves are the spec's sequential sums, so the reference's row sum
    computes them.)"""
    from ... import linalg

    t = np.ascontiguousarray(a if b is None else fp.mul(a, b), dtype=np.float32)
    h = (t.shape[1] + 1) // 2 if first is None else first
    return fp.add(linalg.row_sum(np.ascontiguousarray(t[:, :h])), linalg.row_sum(np.ascontiguousarray(t[:, h:])))


def check_sweep(terms, expected):
    """A sweep case must tell the spec's sum from the same sum split in two
    halves (the simplest split-K or two-block form) on some output."""
    _check(differs(expected, split_in_two(*terms)).any(), "sweep case does not separate a split in two")
