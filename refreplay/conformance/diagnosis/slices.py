"""Slices of a failing case too large to re-evaluate whole ([conf.diagnosis.r1]).

The diagnosis re-evaluates the spec's algorithm and its variants on a failing
case, and the variant models hold every product term of every sum at once
(``model_bytes``).  A live case at a model's shapes would need tens of GiB, so
it is cut to a sub-case: the same op on a part of the inputs whose reference
outputs are, bit for bit, the case's own outputs at the positions kept.  The
kernel's outputs there are cut the same way, so the diagnosis of the slice is
the diagnosis of the case.  A sub-case may keep only some of the op's outputs
(a row slice of linear_backward keeps dx, whose rows are independent, and
drops dW, which sums over every row); the diagnosis compares only the outputs
a case holds.

Every rule below cites the clause that makes the outputs it keeps depend on
the inputs it keeps only.  Each keeps every reduction whole (its length and
its terms in order), so a variant of the order (blocked, pairwise, strided
lanes) gives the same sums on the slice as on the case.  Where an op does not
split so, there is no rule and the case stays whole (or is left out, above
the budget): see ``NOT_SLICED``.
"""

from __future__ import annotations

from dataclasses import replace
from math import isqrt

import numpy as np

from ..base import deviant as fp

SLICE_FROM = 128 << 20  # bytes a failing case's models may take before it is re-evaluated on a slice
SLICE_ROWS = 64  # differing rows of a row op re-evaluated, at most (each variant is evaluated on them)


def _model_terms(op, r) -> int:
    """About how many product terms the op's models hold at once on case
    ``r``: they materialise every term of every sum of the case (``dot``,
    ``orders._Terms``), where a kernel or the reference streams them."""
    shapes = [r.case.shape(f"in/{n}") for n in r.case.inputs]  # a tiled tensor is not made whole
    base = op.name.removeprefix("bf16_")
    if base.startswith("attention_"):  # q: [B, NH, T, HS]; every (t, s) pair is a dot over HS
        B, NH, T, HS = next(s for s in shapes if len(s) == 4)
        return B * NH * T * T * HS
    if base == "linear_backward":  # dy: [N, OC], x: [N, C]; dx and dW are each N*OC*C terms
        dy, x = shapes[:2]
        return 2 * int(np.prod(dy)) * int(x[1])
    two = sorted((int(np.prod(s)) for s in shapes if len(s) == 2))[-2:]
    sizes = [int(np.prod(r.case.shape(f"out/{n}"))) for n in r.case.outputs]
    out = max(sizes, default=0)
    if len(two) == 2 and out and (op.terms is not None or base == "linear_forward"):
        # A (I*K), B (K*J) and the output (I*J) give the dots' length K
        return out * round(float(np.sqrt(two[0] * two[1] / out)))
    return sum(int(np.prod(s)) for s in shapes) + sum(sizes)


def model_bytes(op, r) -> int:
    """An estimate of the memory re-evaluating the op's models on ``r`` takes:
    six binary32 arrays of its terms (two broadcast operands, their
    transposes, the products, the folded sums)."""
    return 24 * _model_terms(op, r)


def stored(r, n):
    """Output ``n`` of the kernel as stored (a bf16 output as uint16 bits)."""
    from ...numerics.bf16 import as_bits

    a = np.asarray(r.actual[n])
    return as_bits(a) if f"out/{n}" in r.case.bf16 else a


def differs(r, n) -> np.ndarray | None:
    """Where output ``n`` of ``r`` differs (two NaNs agree), as stored; None
    if a shape or dtype differs."""
    if n not in r.actual:
        return None
    e, a = r.case.outputs[n], stored(r, n)  # a bf16 output as its bits
    if a.shape != e.shape or a.dtype != e.dtype:
        return None
    if e.dtype == np.float32:
        return (fp.bits(e) != fp.bits(a)) & ~(np.isnan(e) & np.isnan(a))
    return e != a


def _cut(r, ins: dict, outs: dict):
    """Failing result ``r`` with input n cut to x[ins[n]] (inputs not named
    kept whole) and only the outputs named in ``outs``, cut to x[outs[n]]."""

    def cut(x, ix):
        return np.ascontiguousarray(np.asarray(x)[ix])

    case = replace(
        r.case,
        inputs={n: cut(x, ins[n]) if n in ins else x for n, x in r.case.inputs.items()},
        outputs={n: cut(x, outs[n]) for n, x in r.case.outputs.items() if n in outs},
        tiles={},
    )
    return replace(r, case=case, actual={n: cut(x, outs[n]) for n, x in r.actual.items() if n in outs})


def _span(name, ix) -> str:
    return f"{ix.size} {name}s from {ix[0]} to {ix[-1]}" if ix.size > 1 else f"{name} {ix[0]}"


def _block(hit, per_output: int, anyway=False, pad=False):
    """(rows, columns) of a 2-D mask of differing outputs: its first differing
    rows, then the columns that differ in them, as many as fit ``SLICE_FROM``
    at ``per_output`` bytes an output; None if none fits, or none differs
    and not ``anyway`` (then the first rows and columns, where the kernel
    agrees: a variant must reproduce those too).  With ``pad``, rows and
    columns where the kernel agrees fill what is left of the budget, so that
    a few scattered differences come with many agreeing outputs beside them."""
    most = SLICE_FROM // max(1, per_output)
    rows = np.flatnonzero(hit.any(axis=1))
    if not rows.size and anyway:
        rows = np.arange(hit.shape[0])
    if not rows.size or not most or not hit.shape[1]:
        return None
    n_rows = max(1, min(SLICE_ROWS, isqrt(most)))
    rows = rows[:n_rows]
    if pad:
        rows = _padded(rows, hit.shape[0], n_rows)
    cols = np.flatnonzero(hit[rows].any(axis=0))
    cols = cols if cols.size else np.arange(hit.shape[1])
    n_cols = max(1, most // rows.size)
    return rows, _padded(cols[:n_cols], hit.shape[1], n_cols) if pad else cols[:n_cols]


def _padded(ix, size: int, most: int):
    """Indices ``ix`` and, up to ``most`` in all, the first others below ``size``, in order."""
    rest = np.setdiff1d(np.arange(min(size, ix.size + most)), ix)
    return np.sort(np.concatenate([ix, rest[: max(0, most - ix.size)]]))


def _first(hit, most: int):
    """The first differing indices of a 1-D mask, else the first ones (where
    the kernel agrees), at most ``most``."""
    ix = np.flatnonzero(hit)
    return (ix if ix.size else np.arange(hit.size))[: min(SLICE_ROWS, most)]


def _per_output(op, r, outputs: int) -> int:
    return model_bytes(op, r) // max(1, outputs)


# ---- the rules: (op, r, {output: differing mask}) -> [(sub-case, where)] --------------------


def _matmul_block(a_rows, b_cols):
    """[mm.nn.c1] [mm.nt.c1] [mm.tn.c1] C[i, j] is the sum over k of
    A's row i and B's column j, "for every i, j independently": rows i and
    columns j of C are those of the product of A's rows i and B's columns j.
    ``a_rows(i)``, ``b_cols(j)``: the index of A and B holding them."""

    def rule(op, r, masks):
        ((name, hit),) = masks.items()
        # a case the kernel passes is cut too (its first rows and columns), and scattered differences come
        # with agreeing outputs beside them: a candidate order named the cause must agree there too
        blk = _block(hit, _per_output(op, r, hit.size), anyway=True, pad=True)
        if blk is None:
            return []
        i, j = blk
        A, B = r.case.inputs
        sub = _cut(r, {A: a_rows(i), B: b_cols(j)}, {name: np.ix_(i, j)})
        return [(sub, f"{_span('row', i)} x {_span('column', j)}")]

    return rule


def _linear_forward(op, r, masks):
    """[linear.fwd.c1] [mm.bias.c1] y[n, o] = add(sum over c of x[n, c] W[o, c],
    b[o]): "each row of y depends only on the same row of x", each column o
    only on W's row o and b[o]."""
    hit = masks["y"]
    blk = _block(hit, _per_output(op, r, hit.size))
    if blk is None:
        return []
    n, o = blk
    sub = _cut(r, {"x": n, "W": o, "b": o}, {"y": np.ix_(n, o)})
    return [(sub, f"{_span('row', n)} x {_span('column', o)} of y")]


def _linear_backward(op, r, masks):
    """[linear.bwd.c1] dx[n, c] sums over o of dy[n, o] W[o, c] ("dx row n
    depends only on dy row n"): rows n and columns c of dx come from dy's rows
    n, x's rows n (unused by dx) and W's columns c, with dW and db dropped
    (they sum over every row n).  dW[o, c] and db[o] sum over n of dy[n, o]
    (x[n, c]): rows o of dW and db, columns c of dW, come from dy's columns o,
    x's columns c and W's block (unused by them), with dx dropped (it sums
    over every o).  Each slice keeps its sums whole: OC terms for dx, N for
    dW and db."""
    N, OC = r.case.shape("in/dy")
    out = []
    per = 24 * 2 * OC  # a dx output: OC terms in dx and as many in the sub-case's dW
    blk = _block(masks["dx"], per, anyway=True)
    if blk is not None:
        n, c = blk
        sub = _cut(r, {"dy": n, "x": np.ix_(n, c), "W": (slice(None), c)}, {"dx": np.ix_(n, c)})
        out.append((sub, f"{_span('row', n)} x {_span('column', c)} of dx"))
    dw = masks["dW"] | masks["db"][:, None]  # a db that differs takes a column of dW with it
    blk = _block(dw, 24 * 2 * N, anyway=True)
    if blk is not None:
        o, c = blk
        sub = _cut(
            r,
            {"dy": (slice(None), o), "x": (slice(None), c), "W": np.ix_(o, c)},
            {"dW": np.ix_(o, c), "db": o},
        )
        out.append((sub, f"{_span('row', o)} x {_span('column', c)} of dW and db"))
    return out


def _norm_backward(stats, col_outputs):
    """[norm.layer.bwd.c1] [norm.rms.bwd.c1] steps 1-4: dx row n reads row n
    of dout and x, w, and the row's statistics only; step 5: dw[c] (and
    db[c]) sum over n of column c of dout and of norm, which reads x[n, c]
    and the row statistics.  A row slice keeps dx, a column slice dw (db)."""

    def rule(op, r, masks):
        out = []
        hit = masks["dx"]
        rows = _first(hit.reshape(len(hit), -1).any(axis=1), SLICE_FROM // max(1, model_bytes(op, r) // len(hit)))
        if rows.size:
            sub = _cut(r, {n: rows for n in ("dout", "x", *stats)}, {"dx": rows})
            out.append((sub, f"{_span('row', rows)} of dx"))
        C = len(masks[col_outputs[0]])
        cols = _first(np.any([masks[n] for n in col_outputs], axis=0), SLICE_FROM // max(1, model_bytes(op, r) // C))
        if cols.size:
            every_row = (slice(None), cols)
            sub = _cut(r, {"dout": every_row, "x": every_row, "w": cols}, dict.fromkeys(col_outputs, cols))
            out.append((sub, f"{_span('column', cols)} of {' and '.join(col_outputs)}"))
        return out

    return rule


def _cross_entropy_forward(op, r, masks):
    """[loss.token.c1] loss[n] reads row n of logits and targets[n] only
    ("per-token losses do not" depend on the other tokens, [loss.mean.c1]):
    differing rows of the losses, with the mean dropped.  The mean sums the
    loss of every counted token: a kernel whose losses are right and mean
    wrong has no slice ([loss.mean.c1]), and its case stays whole."""
    hit = masks["losses"]
    rows = np.flatnonzero(hit)
    per_row = max(1, model_bytes(op, r) // max(1, len(hit)))
    rows = rows[: min(SLICE_ROWS, SLICE_FROM // per_row)]
    if not rows.size:
        return []
    return [(_cut(r, {"logits": rows, "targets": rows}, {"losses": rows}), f"{_span('row', rows)} of the losses")]


def _attention_forward(op, r, masks):
    """[attn.bwd.c1] "for every b, h independently", and the forward per
    (b, h) too ([attn.scores.c1]); [attn.mask.c1] [attn.out.c1] query row t
    reads q[t] and the keys and values s = 0 .. t only: the first T' rows of
    out and of att (its first T' columns, the rest +0 above the diagonal) are
    those of the case cut to its first T' positions.  The first (b, h) pair
    that differs, cut to as many positions as fit, if its first differing
    row is among them.  (A sub-case of fewer query rows over all T keys is
    not expressible: q, k and v share T in the calling convention.)"""
    hit = masks["out"].any(axis=3) | masks["att"].any(axis=3)  # [B, NH, T]
    if not hit.any():
        return []
    b, h, t0 = (int(i) for i in np.argwhere(hit)[0])
    B, NH, T, HS = r.case.shape("in/q")
    fit = isqrt(SLICE_FROM // (24 * max(1, HS)))  # T'^2 HS terms in the models
    if t0 >= fit:
        return []
    t = min(T, fit)
    pair = (slice(b, b + 1), slice(h, h + 1))
    rows = (*pair, slice(0, t))
    sub = _cut(r, dict.fromkeys(r.case.inputs, rows), {"out": rows, "att": (*rows, slice(0, t))})
    where = f"(b, h) = ({b}, {h})" + (f", positions 0 to {t - 1}" if t < T else "")
    return [(sub, where)]


def _per_head(op, r, masks):
    """[attn.bwd.c1] every (b, h) pair independently: the first that differs."""
    hit = np.zeros(r.case.shape(f"out/{next(iter(r.case.outputs))}")[:2], bool)
    for m in masks.values():
        hit |= m.any(axis=(2, 3))
    if not hit.any():
        return []
    b, h = (int(i) for i in np.argwhere(hit)[0])
    pick = (slice(b, b + 1), slice(h, h + 1))
    sub = _cut(r, dict.fromkeys(r.case.inputs, pick), dict.fromkeys(r.case.outputs, pick))
    return [(sub, f"(b, h) = ({b}, {h})")]


def _per_row(names):
    """A row op ([softmax.fwd.c1], [softmax.bwd.c1], [softmax.log.c1],
    [softmax.log.bwd.c1], [norm.layer.fwd.c1], [norm.rms.fwd.c1]): every
    output row reads the same row of the inputs ``names`` only."""

    def rule(op, r, masks):
        hit = np.zeros(len(next(iter(masks.values()))), bool)
        for m in masks.values():
            hit |= m.reshape(len(m), -1).any(axis=1)
        rows = np.flatnonzero(hit)
        per_row = max(1, model_bytes(op, r) // max(1, len(hit)))
        rows = rows[: min(SLICE_ROWS, SLICE_FROM // per_row)]
        if not rows.size:
            return []
        sub = _cut(r, dict.fromkeys(names, rows), dict.fromkeys(r.case.outputs, rows))
        return [
            (sub, f"{rows.size} differing rows from {rows[0]} to {rows[-1]}" if rows.size > 1 else f"row {rows[0]}")
        ]

    return rule


_ALL = slice(None)
RULES = {
    "matmul": _matmul_block(lambda i: i, lambda j: (_ALL, j)),
    "matmul_nt": _matmul_block(lambda i: i, lambda j: j),
    "matmul_tn": _matmul_block(lambda i: (_ALL, i), lambda j: (_ALL, j)),
    "linear_forward": _linear_forward,
    "linear_backward": _linear_backward,
    "layernorm_backward": _norm_backward(("mean", "rstd"), ("dw", "db")),
    "rmsnorm_backward": _norm_backward(("rrms",), ("dw",)),
    "cross_entropy_forward": _cross_entropy_forward,
    "attention_forward": _attention_forward,
    "attention_backward": _per_head,
    "softmax_forward": _per_row(("x",)),
    "softmax_backward": _per_row(("dy", "y")),
    "log_softmax_forward": _per_row(("x",)),
    "log_softmax_backward": _per_row(("dy", "y")),
    "layernorm_forward": _per_row(("x",)),
    "rmsnorm_forward": _per_row(("x",)),
}

# No rule, and why (their cases are re-evaluated whole, or above the budget left out):
# - cross_entropy_backward: [loss.bwd.c1] every row is scaled by recip(f32(count)), count the
#   counted tokens of the whole call, and the calling convention has no count to pass: fewer rows
#   change every row's bits.
# - attention_backward below a (b, h) pair: [attn.bwd.c1] dk[s] and dv[s] sum over every query
#   row t >= s, and the dz of row t reads the whole row 0 .. t.
# - embedding_forward ([emb.fwd.c1], a copy) and embedding_backward ([emb.bwd.c1], sums per token
#   id): their models hold no product terms, so their estimate (the tensors themselves, 902 MiB
#   at gpt2-124m) stays under the budget and they are re-evaluated whole.
# - matmul_i8: [mm.i8.c1] its sums are exact in any order, so no model or candidate order is
#   re-evaluated on it; its estimate is its tensors' size (2 GiB at the gpt2-124m head, reported
#   as skipped), and a slice of them would not shrink what the diagnosis does.


def slices(op, r) -> list:
    """[(sub-case of failing ``r``, where)]: sub-cases holding differing
    elements whose outputs are exactly ``r``'s there, each fitting
    ``SLICE_FROM``, so that the diagnosis of the slices is the diagnosis of
    the case; [] where the op does not split so or no slice fits.  A matmul
    the kernel passes is cut at its first rows and columns (a candidate
    order named the cause must agree with the kernel there too).  Where
    the outputs split apart (linear_backward, the norms' backward), every
    group of outputs gets a slice, one where the kernel agrees included: a
    variant named the cause must reproduce those elements too."""
    rule = RULES.get(op.name.removeprefix("bf16_"))
    if rule is None:
        return []
    masks = {n: differs(r, n) for n in r.case.outputs}
    if any(m is None for m in masks.values()):  # a wrong shape: no arithmetic variant to find
        return []
    out = []
    for sub, where in rule(op, r, masks):
        if model_bytes(op, sub) > SLICE_FROM:
            continue
        if not any(differs(sub, n).any() for n in sub.case.outputs):
            where += " (where the kernel agrees: a variant must too)"
        out.append((sub, where))
    return out
