"""Case builders, one per kind of op: what inputs each probe family gets
([conf.probes.c1]).

A builder returns ``(family, inputs, note)`` triples; ``generate.py`` computes
the expected outputs with the reference and names the cases.  Where a probe
claims to isolate a property, the builder checks it against a model of the
deviation (``orders``, ``fp``) and raises ``ProbeError`` if the inputs would
not tell a deviant kernel from a conformant one, so a probe can never be
silently vacuous.
"""

from __future__ import annotations

import math

import numpy as np

from ..base import deviant as fp
from ..readings import orders
from . import values as V
from .separation import _check, differs


def distinguished_orders(terms, expected, products: bool) -> set[str]:
    """Names of candidate orders (unfused) that give other bits than
    ``expected`` on at least one sum."""
    a, b = terms
    out = set()
    for cand in orders.candidates(False):
        if cand.spec:
            continue
        if differs(expected, cand(a, b)).any():
            out.add(cand.name)
    return out


MUST_DISTINGUISH = {o.name for o in orders.candidates(False) if not o.spec and o.name != orders.PLUS_ZERO[0]}


# ---- elementwise -------------------------------------------------------------


def unary_cases(
    op, rng, sample, model64=None, vendor=False, zeroing_observable=True, sizes=(1, 7, 31, 1021), boundaries=None
):
    """``sample(rng, n)`` draws inputs in the op's domain; ``model64`` is the
    float64 function used to find inputs whose correctly rounded result is
    subnormal (flush probe) or where the spec's algorithm is not correctly
    rounded (vendor probe).  ``zeroing_observable`` is False for functions
    whose first primitive already turns a subnormal into a zero
    ([num.trans.c1]), where input zeroing cannot be seen."""
    out = [("random", {"x": sample(rng, n)}, f"N={n}") for n in sizes]
    out.append(("edge", {"x": V.edge_values()}, "edge grid"))
    nan = fp.f32(
        [
            0x7FC00000,
            0xFFC00000,
            0x7FFFFFFF,
            0x7FC12345,
            0x7F800001,
            0xFF800001,
            0xFFFFFFFF,
            0xBF800000,
            0xFF800000,
            0x7F800000,
        ]
    )
    out.append(("nan", {"x": _keep(op, {"x": nan}, np.isnan)["x"]}, "NaN inputs; inputs whose result is NaN"))
    if zeroing_observable:
        out.append(
            (
                "input_zeroing",
                {"x": np.concatenate([V.subnormals(rng, 64), fp.f32([1, 0x807FFFFF])])},
                "subnormal inputs",
            )
        )
    zeros = _keep(
        op, {"x": fp.f32([0x00000000, 0x80000000, 0xBE800000, 0x3E800000, 0xBF000000, 0x80800000])}, lambda y: y == 0
    )
    if zeros["x"].size:
        out.append(("signed_zero", zeros, "inputs whose result is a zero"))
    if model64 is not None:
        xs = sample(rng, 1 << 16)
        pool = np.concatenate([xs, V.random_f32(rng, 4096, 120, 127), V.uniform_f32(rng, 4096, -104, -87)])
        with np.errstate(all="ignore"):
            y = np.array([model64(float(v)) for v in pool], dtype=np.float64)
        tiny = (np.abs(y) > 2.0**-148) & (np.abs(y) < 2.0**-126 * (1 - 2.0**-23))
        if tiny.any():
            out.append(
                ("flush", {"x": np.ascontiguousarray(pool[tiny][:256])}, "correctly rounded result is subnormal")
            )
        if vendor:
            out.append(
                (
                    "vendor_transcendental",
                    {"x": _not_correctly_rounded(op, xs, y[: xs.size])},
                    "spec algorithm != correctly rounded",
                )
            )
    if boundaries is not None:
        out.append(
            (
                "edge",
                {"x": boundaries()},
                "every branch boundary and rounding tie of the clause, with its neighbours at +-1 and +-2 ulp",
            )
        )
    return out


def _keep(op, inputs: dict, pred) -> dict:
    """The elements of elementwise inputs whose reference result satisfies pred."""
    from ..base.case import load_inputs

    y = np.asarray(op.reference(*load_inputs(list(inputs.values()))))
    keep = pred(y)
    return {k: np.ascontiguousarray(v[keep]) for k, v in inputs.items()}


def _not_correctly_rounded(op, xs, y64, limit=512):
    """Inputs where the reference differs from the correctly rounded result.

    The float64 value ``y64`` comes from libm (generation time only, never
    an expected output).  Candidates whose float64 value lies within 2^-40
    (relative) of a float32 rounding boundary are skipped, so that the
    selection cannot depend on the last bit of a platform's double-precision
    libm and regenerates identically everywhere.
    """
    ref = np.asarray(op.reference(xs), dtype=np.float32)
    with np.errstate(all="ignore"):
        cr = y64.astype(np.float32)
        lo = np.nextafter(cr, np.float32(-np.inf)).astype(np.float64)
        hi = np.nextafter(cr, np.float32(np.inf)).astype(np.float64)
        c = cr.astype(np.float64)
        gap = np.minimum(np.abs(y64 - (c + lo) / 2), np.abs(y64 - (c + hi) / 2))
        safe = np.isfinite(y64) & (gap > np.abs(y64) * 2.0**-40) & (np.abs(y64) >= 2.0**-126)
    pick = safe & differs(ref, cr) & np.isfinite(ref)
    _check(pick.sum() >= 8, f"{op.name}: too few inputs where the spec's algorithm is not correctly rounded")
    return np.ascontiguousarray(xs[pick][:limit])


def binary_cases(op, rng, sample, model64=None, sizes=(1, 7, 31, 1021)):
    out = [("random", {"a": sample(rng, n), "b": sample(rng, n)}, f"N={n}") for n in sizes]
    ev = V.edge_values()
    a, b = np.meshgrid(ev, ev, indexing="ij")
    out.append(("edge", {"a": a.ravel().copy(), "b": b.ravel().copy()}, "edge grid, all pairs"))
    nan = fp.f32([0xFFC00000, 0x7FFFFFFF, 0x7FC12345, 0x7F800001, 0xFFFFFFFF, 0x7F800000, 0xFF800000])
    other = fp.f32([0x3F800000, 0x7F800000, 0xFF800000, 0x00000000, 0xFFC00000])
    na, nb = np.meshgrid(nan, other, indexing="ij")
    out.append(
        (
            "nan",
            _keep(
                op,
                {"a": np.concatenate([na.ravel(), nb.ravel()]), "b": np.concatenate([nb.ravel(), na.ravel()])},
                np.isnan,
            ),
            "NaN payloads; inf combinations whose result is NaN",
        )
    )
    sub = V.subnormals(rng, 32)
    partner = np.concatenate([fp.f32([0x00800000, 0x80800000, 0x72800000, 0x00000001]), V.random_f32(rng, 28, -2, 2)])
    # fmax/fmin flush their result ([num.minmax.c1]), so there a kept subnormal
    # input shows only as a subnormal result: a flush probe, not a zeroing one
    out.append(
        (
            "flush" if op.name in ("fmax", "fmin") else "input_zeroing",
            {"a": np.concatenate([sub, partner]), "b": np.concatenate([partner, sub])},
            "a subnormal operand",
        )
    )
    z = fp.f32([0x00000000, 0x80000000, 0x3F800000, 0xBF800000])
    za, zb = np.meshgrid(z, z, indexing="ij")
    out.append(
        (
            "signed_zero",
            _keep(op, {"a": za.ravel().copy(), "b": zb.ravel().copy()}, lambda y: y == 0),
            "+-0 against +-0 and +-1, where the result is a zero",
        )
    )
    if op.name == "mul":
        x, y = V.window_pairs(rng, 64, V.WINDOW_BEFORE)
        out.append(("ftz_before_rounding", {"a": x, "b": y}, "exact product FLT_MIN (1 - d), 0 < d <= 2^-25"))
        x, y = V.window_pairs(rng, 64, V.WINDOW_UNBOUNDED)
        out.append(("ftz_after_rounding", {"a": x, "b": y}, "exact product FLT_MIN (1 - d), 2^-25 < d <= 2^-24"))
    a, b = V.rounding_pairs()
    out.append(
        (
            "edge",
            _keep(op, {"a": a, "b": b}, lambda y: np.ones(y.shape, bool)),
            "rounding ties (to even, both directions), the overflow threshold and its neighbours",
        )
    )
    if model64 is not None:
        fa = V.random_f32(rng, 1 << 14, -127, -120)
        fb = V.random_f32(rng, 1 << 14, -127, -120) if op.name in ("add", "sub") else V.random_f32(rng, 1 << 14, -8, 0)
        with np.errstate(all="ignore"):
            y = model64(fa.astype(np.float64), fb.astype(np.float64))
        tiny = (np.abs(y) > 2.0**-148) & (np.abs(y) < 2.0**-126 * (1 - 2.0**-23))
        tiny &= np.abs(fa) >= fp.FLT_MIN
        tiny &= np.abs(fb) >= fp.FLT_MIN
        if tiny.any():
            out.append(("flush", {"a": fa[tiny][:256].copy(), "b": fb[tiny][:256].copy()}, "IEEE result is subnormal"))
    return out


# ---- reductions ----------------------------------------------------------------

SUM_SHAPES = ((1, 1), (3, 2), (3, 7), (5, 31), (4, 128), (2, 257), (3, 1021), (1, 4099), (16, 64), (8, 768))


def sum_cases(op, rng, orient):
    """Row sums (``orient='row'``: X is I x N) or column sums (``'col'``: N x J)."""

    def shaped(rows):  # rows: R x N, one sum per row
        return np.ascontiguousarray(rows if orient == "row" else rows.T)

    out = [("random", {"X": shaped(V.random_f32(rng, s))}, f"{s[0]} sums of {s[1]}") for s in SUM_SHAPES]
    for n in (5, 8, 9, 16, 33, 100, 128, 257, 1024):
        out.append(
            (
                "order",
                {"X": shaped(V.random_f32(rng, (8, n), -24, 24, mant_bits=10))},
                f"8 sums of {n}, magnitudes 2^-24..2^24",
            )
        )
    ev = V.edge_values()
    rows = [ev[i : i + 16] for i in range(0, len(ev) - 15, 16)]
    rows += [
        fp.f32([0x7F7FFFFF, 0x7F7FFFFF, 0xFF7FFFFF]),
        fp.f32([0x7F800000, 0x3F800000, 0xFF800000]),
        fp.f32([0xFF7FFFFF, 0xFF7FFFFF, 0x7F7FFFFF]),
    ]
    out.append(("edge", {"X": shaped(_ragged(rows))}, "edge values; overflow; inf - inf"))
    zeros = [
        [0x80000000] * 5,
        [0x80000000, 0, 0x80000000, 0x80000000, 0x80000000],
        [0x80000000, 0x80000000, 0x80000000, 0x80000000, 0],
    ]
    out.append(("signed_zero", {"X": shaped(fp.f32(zeros))}, "sums of -0 terms are -0"))
    out.append(
        (
            "flush",
            {"X": shaped(fp.f32([[0x00C00000, 0x80800000], [0x00800001, 0x80800000], [0x80FFFFFF, 0x00800000]]))},
            "partial sums that are subnormal",
        )
    )
    out.append(
        (
            "input_zeroing",
            {"X": shaped(fp.f32([[0x00800000, 0x00000001], [0x80800000, 0x807FFFFF], [0x00400000, 0x00400000]]))},
            "subnormal terms beside FLT_MIN",
        )
    )
    out.append(
        (
            "nan",
            {
                "X": shaped(
                    fp.f32(
                        [
                            [0x3F800000, 0xFFC00000],
                            [0x7F800000, 0xFF800000],
                            [0x7FC12345, 0x3F800000],
                            [0x7F800001, 0x7FFFFFFF],
                        ]
                    )
                )
            },
            "NaN payloads; inf - inf",
        )
    )
    out.append(("empty", {"X": shaped(np.zeros((3, 0), np.float32))}, "3 sums of 0 terms"))
    from . import long_shapes as sweeps

    lengths = sweeps.SUM_N if orient == "row" else sweeps.THIN_K
    return out + sweeps.sum_cases(op, rng, lengths, shaped)


def _ragged(rows) -> np.ndarray:
    """Rows of different lengths padded with -0 (the identity of a sum)."""
    n = max(len(r) for r in rows)
    out = np.full((len(rows), n), np.float32(-0.0), dtype=np.float32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def max_cases(op, rng):
    out = [("random", {"X": V.random_f32(rng, s)}, f"{s[0]} rows of {s[1]}") for s in SUM_SHAPES]
    ev = V.edge_values()
    out.append(("edge", {"X": _pad_max([ev[i : i + 16] for i in range(0, len(ev) - 15, 16)])}, "edge values"))
    out.append(
        (
            "signed_zero",
            {
                "X": fp.f32(
                    [
                        [0x80000000, 0x00000000],
                        [0x00000000, 0x80000000],
                        [0x80000000, 0x80000000],
                        [0xBF800000, 0x80000000],
                    ]
                )
            },
            "+0 is larger than -0",
        )
    )
    out.append(
        (
            "nan",
            {
                "X": fp.f32(
                    [
                        [0x3F800000, 0xFFC00000],
                        [0x7FC12345, 0x7F800000],
                        [0xFF800000, 0x7F800001],
                        [0x7FFFFFFF, 0xFFFFFFFF],
                    ]
                )
            },
            "NaN propagates, canonical",
        )
    )
    # fmax flushes its result, so a subnormal maximum must come out as a zero
    out.append(
        (
            "flush",
            {"X": fp.f32([[0x00000001, 0x80000000], [0x807FFFFF, 0xBF800000], [0x00400000, 0x80000000]])},
            "a subnormal is the maximum",
        )
    )
    out.append(("empty", {"X": np.zeros((2, 0), np.float32)}, "2 rows of 0 terms: the maximum is -inf"))
    return out


def _pad_max(rows):
    n = max(len(r) for r in rows)
    out = np.full((len(rows), n), np.float32(-np.inf), dtype=np.float32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


# ---- matmul --------------------------------------------------------------------

MM_SHAPES = (
    (1, 1, 1),
    (1, 2, 1),
    (3, 5, 7),
    (7, 1, 3),
    (17, 35, 23),
    (2, 257, 3),
    (5, 1021, 2),
    (16, 64, 256),
    (16, 256, 64),
)
FMA_SHAPES = ((1, 2, 1), (3, 4, 5), (17, 36, 23), (8, 128, 16), (5, 258, 7), (4, 768, 3))
# K >= 64 with K mod 8 = 3, 7, 5: a kernel that fuses only its scalar tail after
# 8-wide blocks must meet the decisive product there
FMA_TAIL_SHAPES = ((3, 67, 2), (3, 71, 3), (2, 133, 2))
U = np.float32(1 + 2.0**-12)  # u*u = 1 + 2^-11 + 2^-24 rounds to 1 + 2^-11


def matmul_cases(op, rng, to_layout):
    """Cases for fp32 matmul forms.  Inputs are built as A (I x K), B (K x J)
    and ``to_layout`` stores them as the op takes them."""
    out = []

    def add(family, A, B, note):
        out.append((family, to_layout(np.ascontiguousarray(A), np.ascontiguousarray(B)), note))

    for i, k, j in MM_SHAPES:
        add("random", V.random_f32(rng, (i, k), -4, 4), V.random_f32(rng, (k, j), -4, 4), f"I,K,J={i},{k},{j}")
    for i, k, j in FMA_SHAPES:
        for dist in sorted({1, min(32, k // 2)}):
            A, B = _fma_probe(rng, i, k, j, dist)
            add("fma", A, B, f"I,K,J={i},{k},{j}; the two cancelling products {dist} apart in k")
    for i, k, j in FMA_TAIL_SHAPES:
        A, B = _fma_probe(rng, i, k, j, 0, tail=8)
        add("fma", A, B, f"I,K,J={i},{k},{j}; the second cancelling product in the last K mod 8 terms")
    for i, k, j in ((2, 5, 3), (4, 9, 4), (3, 33, 5), (4, 100, 3), (2, 257, 2), (1, 1024, 2)):
        A = V.random_f32(rng, (i, k), -24, 24, mant_bits=10)
        B = V.powers_of_two(rng, (k, j), -2, 2)
        add("order", A, B, f"I,K,J={i},{k},{j}; exact products 2^-26..2^26")
    for family, window, what in (
        ("ftz_before_rounding", V.WINDOW_BEFORE, "0 < d <= 2^-25"),
        ("ftz_after_rounding", V.WINDOW_UNBOUNDED, "2^-25 < d <= 2^-24"),
    ):
        x, y = V.window_pairs(rng, 24, window)
        perm = rng.permutation(24)
        A = np.zeros((24, 24), np.float32)
        A[np.arange(24), perm] = x
        B = np.zeros((24, 2), np.float32)
        B[perm, 0] = y
        B[perm, 1] = np.float32(1.0)
        add(family, A, B, f"one product per output FLT_MIN (1 - d), {what}")
    A = fp.f32(
        [
            [0x00800000, 0x00800000, 0x3F800000],
            [0x00C00000, 0x00000000, 0x00000000],
            [0x80800000, 0x00800000, 0x00000000],
        ]
    )
    B = fp.f32([[0x3F000000, 0x3F800000], [0x3F000000, 0x3F800000], [0x00000000, 0x00000000]])
    add("flush", A, B, "subnormal products; subnormal partial sums")
    A = V.subnormals(rng, 16).reshape(4, 4)
    A[2:, 1] = V.random_f32(rng, 2, -40, -30, mant_bits=8)  # one normal term beside subnormals
    B = V.powers_of_two(rng, (4, 3), 90, 100)  # exact products
    add("input_zeroing", A, B, "subnormal inputs times 2^90..2^100")
    A = fp.f32([[0x7FC12345, 0x3F800000], [0x7F800000, 0x00000000], [0x7F800000, 0xFF800000], [0xFFC00000, 0x7F800001]])
    B = fp.f32([[0x3F800000, 0x00000000], [0x3F800000, 0x7F800000]])
    add("nan", A, B, "NaN payloads; 0*inf; inf - inf")
    A = fp.f32([[0x80000000] * 3, [0x3F800000, 0x80000000, 0x00000000]])
    B = fp.f32([[0x3F800000, 0x80000000], [0x40000000, 0x00000000], [0x3F800000, 0x3F800000]])
    add("signed_zero", A, B, "sums of -0 products are -0")
    A = V.random_f32(rng, (8, 8), -3, 3)
    A = fp.f32(fp.bits(A) | np.uint32(0x1FFF) & fp.bits(V.random_f32(rng, (8, 8))))
    B = np.diag(V.powers_of_two(rng, 8, -2, 2)).astype(np.float32)
    add("tf32", A, B, "one exact product per output; low 13 significand bits set")
    ev = V.edge_values()
    A = ev[:160].reshape(10, 16)
    B = V.random_f32(rng, (16, 4), -2, 2)
    add("edge", A, B, "edge values in A")
    add("edge", B.T.copy(), A.T.copy(), "edge values in B")
    return out


def empty_matmul_cases(to_layout):
    """K = 0: every output is the empty sum, +0 ([mm.nn.c1]), not the -0 a sum starts from."""
    return [
        ("empty", to_layout(np.zeros((i, 0), np.float32), np.zeros((0, j), np.float32)), f"I,K,J={i},0,{j}")
        for i, j in ((1, 1), (2, 3))
    ]


def _fma_probe(rng, I, K, J, dist, tail=None):
    """A has two non-zeros per row, +u s and -u s at k0 and k0 + dist; every
    entry of column j of B is u 2^f_j.  The two products cancel exactly
    after rounding (so every order of an unfused sum gives +0), while a*b + c
    rounded once leaves (u*u - round(u*u)) s 2^f_j = +-2^-24 s 2^f_j.
    ``tail``: the second product lies in the last K mod ``tail`` terms (the
    scalar tail after blocks of ``tail``), the first 1, ``tail`` or 32 terms
    before it, row by row (``dist`` is then unused)."""
    A = np.zeros((I, K), np.float32)
    for i in range(I):
        if tail is None:
            k0 = int(rng.integers(0, K - dist))
        else:
            r = K % tail
            assert r and K >= 4 * tail, "a tail probe needs K mod tail > 0 and a few blocks"
            k1 = K - r + int(rng.integers(0, r))
            dist = (1, tail, 32)[i % 3]
            k0 = k1 - dist
        s = V.powers_of_two(rng, 1, -4, 4)[0]
        A[i, k0] = U * s
        A[i, k0 + dist] = -U * s
    col = V.powers_of_two(rng, J, -4, 4) * U
    return A, np.tile(col, (K, 1))


def _fused_spec_order():
    seq = orders.spec_order(False)
    return orders.Order(seq.name + ", fused multiply-add", seq.fn, fused=True)


def check_isolation(family, terms, expected):
    """A probe family must isolate its property on the case's own inputs:
    every family except ``order`` gives the spec's bits under every other
    candidate order (a start from +0 aside, which only ``signed_zero`` is
    about), and every family except ``fma`` gives them when products are
    contracted into the sum."""
    a, b = terms
    if family in ("random", "edge", "sweep", "empty"):
        return
    if family == "order":
        if b is not None:
            _check(not differs(expected, _fused_spec_order()(a, b)).any(), "order probe depends on fusing")
        return
    for cand in orders.candidates(False):
        if cand.plus_zero:
            continue
        _check(not differs(expected, cand(a, b)).any(), f"{family} probe changes under order {cand.name}")
    if b is None:
        return
    fused = differs(expected, _fused_spec_order()(a, b))
    if family == "fma":
        _check(fused.all(), "fma probe not separated by fused multiply-add")
    else:
        _check(not fused.any(), f"{family} probe depends on fusing")


def i8_cases(op, rng):
    out = []
    for i, k, j in MM_SHAPES:
        out.append(
            (
                "random",
                {
                    "A": rng.integers(-128, 128, (i, k), dtype=np.int8),
                    "B": rng.integers(-128, 128, (k, j), dtype=np.int8),
                },
                f"I,K,J={i},{k},{j}",
            )
        )
    k = 4099
    out.append(
        (
            "edge",
            {
                "A": np.full((2, k), -128, np.int8),
                "B": np.stack([np.full(k, -128, np.int8), np.full(k, 127, np.int8)], 1).copy(),
            },
            "extreme products, K=4099",
        )
    )
    from . import long_shapes as sweeps

    k = sweeps.I8_K[0]
    out.append(
        (
            "edge",
            {
                "A": np.full((1, k), -128, np.int8),
                "B": np.stack([np.full(k, -128, np.int8), np.full(k, 127, np.int8)], 1).copy(),
            },
            f"extreme products at the K bound of [mm.i8.c2], K={k}: sums 2^31 - 2^14 and -128*127*K",
        )
    )
    out.append(("empty", {"A": np.zeros((2, 0), np.int8), "B": np.zeros((0, 3), np.int8)}, "K=0"))
    out.append(
        (
            "sweep",
            {"A": rng.integers(-128, 128, (1, k), dtype=np.int8), "B": rng.integers(-128, 128, (k, 1), dtype=np.int8)},
            sweeps.note(f"I,K,J=1,{k},1"),
        )
    )
    return out


# ---- dot -------------------------------------------------------------------------


def dot_from_matmul(cases):
    """A dot product is a 1 x K x 1 matmul: reuse the matmul probes row by row."""
    out = []
    for family, inp, note in cases:
        A, B = inp["A"], inp["B"]
        out.append(
            (family, {"x": np.ascontiguousarray(A[0]), "y": np.ascontiguousarray(B[:, 0])}, note + "; row 0, column 0")
        )
    return out


def transcendental_sampler(lo, hi):
    def sample(rng, n):
        return V.uniform_f32(rng, n, lo, hi)

    return sample


def wide_sampler(lo_exp=-8, hi_exp=8, positive=False):
    def sample(rng, n):
        return V.random_f32(rng, n, lo_exp, hi_exp, positive=positive)

    return sample


def libm(name):
    """A float64 libm function, for selecting probe inputs only."""
    fn = getattr(math, name)

    def f(x):
        try:
            return fn(x)
        except (OverflowError, ValueError):
            return math.nan

    return f


def sigmoid64(x):
    """1 / (1 + e^-x) in float64, for selecting probe inputs only."""
    try:
        return 1.0 / (1.0 + math.exp(-x))
    except OverflowError:
        return 0.0
