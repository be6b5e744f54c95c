"""The op table's core entries: sums, matmuls and the elementwise primitives
of chapters 1, 2 and 4 (the transformer, random-number and bf16 entries are
``model.py``, ``rng.py`` and ``bf16.py``; the record is ``opdef.py``).

An entry names the op, the spec clauses it implements, its calling
convention (input and output names, in order, with shapes in spec letters),
the reference function, the case builder, and, for ops that are sums, how to
view the inputs as R independent sums of N terms (for order diagnosis).
Adding an op to the suite is adding one entry here and running
``refreplay vectors generate``.

Calling convention (every kernel adapter): the op is called with its inputs
positionally in the order listed, as C-contiguous little-endian arrays, and
returns its outputs (one array, or a tuple in the order listed).
"""

from __future__ import annotations

import numpy as np

from ..inputs import boundaries as edges, builders as Bld, long_shapes as sweeps
from .opdef import OpDef, _register


def _linalg():
    from ... import linalg

    return linalg


# ---- sums viewed as rows of terms (for order analysis) --------------------------


def _mm_terms(A, B):
    """A: I x K, B: K x J -> the I*J sums of K products, row-major in (i, j)."""
    I, J = A.shape[0], B.shape[1]
    return np.repeat(A, J, axis=0), np.tile(np.ascontiguousarray(B.T), (I, 1))


def _layout(kind):
    """Store canonical (A: I x K, B: K x J) as the op takes them, and back."""
    if kind == "nn":
        return (lambda A, B: {"A": A, "B": B}), (lambda A, B: (A, B))
    if kind == "nt":
        return (lambda A, B: {"A": A, "B": np.ascontiguousarray(B.T)}), (lambda A, B: (A, np.ascontiguousarray(B.T)))
    return (lambda A, B: {"A": np.ascontiguousarray(A.T), "B": B}), (lambda A, B: (np.ascontiguousarray(A.T), B))


def _matmul_entry(name, fn_name, kind, clause, sig):
    store, canon = _layout(kind)

    def reference(A, B):
        return getattr(_linalg(), fn_name)(A, B)

    def build(op, rng):
        cases = Bld.matmul_cases(op, rng, store)
        cases += Bld.empty_matmul_cases(store)
        return cases + sweeps.matmul_cases(
            op, rng, store, sweeps.SHORT_K + sweeps.LONG_K if kind == "nn" else sweeps.THIN_K
        )

    return OpDef(
        name,
        (clause, "red.sum.c1", "num.nofma.c1"),
        sig,
        ("A", "B"),
        ("C",),
        reference,
        build,
        terms=lambda A, B: _mm_terms(*canon(A, B)),
    )


def _dot_build(op, rng):
    store, _ = _layout("nn")
    cases = Bld.dot_from_matmul(Bld.matmul_cases(op, rng, store))
    for n in (5, 9, 33, 100, 257, 1024):
        x = Bld.V.random_f32(rng, n, -24, 24, mant_bits=10)
        y = Bld.V.powers_of_two(rng, n, -2, 2)
        cases.append(("order", {"x": x, "y": y}, f"K={n}; exact products"))
    cases.append(("empty", {"x": np.zeros(0, np.float32), "y": np.zeros(0, np.float32)}, "K=0"))
    return cases + sweeps.dot_cases(op, rng)


_register(
    OpDef(
        "sum",
        ("red.rowsum.c1", "red.sum.c1"),
        "sum(X: f32[I, N]) -> out: f32[I]  (each row summed, n increasing)",
        ("X",),
        ("out",),
        lambda X: _linalg().row_sum(X),
        lambda op, rng: Bld.sum_cases(op, rng, "row"),
        terms=lambda X: (X, None),
    )
)
_register(
    OpDef(
        "col_sum",
        ("red.colsum.c1", "red.sum.c1"),
        "col_sum(X: f32[N, J]) -> out: f32[J]  (each column summed, n increasing)",
        ("X",),
        ("out",),
        lambda X: _linalg().col_sum(X),
        lambda op, rng: Bld.sum_cases(op, rng, "col"),
        terms=lambda X: (np.ascontiguousarray(X.T), None),
    )
)
_register(
    OpDef(
        "max",
        ("red.rowmax.c1", "num.minmax.c1"),
        "max(X: f32[I, N]) -> out: f32[I]  (fmax of each row)",
        ("X",),
        ("out",),
        lambda X: _linalg().row_max(X),
        Bld.max_cases,
    )
)
_register(
    OpDef(
        "dot",
        ("mm.nn.c1", "red.sum.c1", "num.nofma.c1"),
        "dot(x: f32[K], y: f32[K]) -> out: f32[1]  (the 1 x K x 1 matmul)",
        ("x", "y"),
        ("out",),
        lambda x, y: _linalg().matmul(x[None, :], np.ascontiguousarray(y[:, None])).reshape(1),
        _dot_build,
        terms=lambda x, y: (x[None, :], y[None, :]),
    )
)
_register(_matmul_entry("matmul", "matmul", "nn", "mm.nn.c1", "matmul(A: f32[I, K], B: f32[K, J]) -> C: f32[I, J]"))
_register(
    _matmul_entry(
        "matmul_nt", "matmul_nt", "nt", "mm.nt.c1", "matmul_nt(A: f32[I, K], B: f32[J, K]) -> C: f32[I, J]  (A·Bᵀ)"
    )
)
_register(
    _matmul_entry(
        "matmul_tn", "matmul_tn", "tn", "mm.tn.c1", "matmul_tn(A: f32[K, I], B: f32[K, J]) -> C: f32[I, J]  (Aᵀ·B)"
    )
)
_register(
    OpDef(
        "matmul_i8",
        ("mm.i8.c1", "mm.i8.c2"),
        "matmul_i8(A: i8[I, K], B: i8[K, J]) -> C: i32[I, J]  (exact)",
        ("A", "B"),
        ("C",),
        lambda A, B: _linalg().matmul_i8(A, B),
        Bld.i8_cases,
    )
)


# ---- elementwise primitives (spec chapters 1 and 2) ------------------------------


def _numerics(name):
    def fn(*xs):
        from ...numerics import elementwise

        return getattr(elementwise, name)(*xs)

    return fn


def _unary(name, clauses, sample, model64=None, vendor=False, zeroing_observable=True, boundaries=None):
    _register(
        OpDef(
            name,
            clauses,
            f"{name}(x: f32[N]) -> out: f32[N]  (elementwise)",
            ("x",),
            ("out",),
            _numerics(name),
            lambda op, rng: Bld.unary_cases(
                op, rng, sample, model64, vendor, zeroing_observable, boundaries=boundaries
            ),
        )
    )


def _binary(name, clauses, model64=None):
    _register(
        OpDef(
            name,
            clauses,
            f"{name}(a: f32[N], b: f32[N]) -> out: f32[N]  (elementwise)",
            ("a", "b"),
            ("out",),
            _numerics(name),
            lambda op, rng: Bld.binary_cases(op, rng, Bld.wide_sampler(), model64),
        )
    )


_binary("add", ("num.add.c1", "num.flush.c1", "num.nan.c1"), np.add)
_binary("sub", ("num.add.c1", "num.flush.c1", "num.nan.c1"), np.subtract)
_binary("mul", ("num.mul.c1", "num.flush.c1", "num.nan.c1"), np.multiply)
_binary("fmax", ("num.minmax.c1",))
_binary("fmin", ("num.minmax.c1",))
_unary(
    "recip",
    ("num.recip.c1", "num.flush.c1"),
    Bld.wide_sampler(-20, 20),
    lambda x: 1.0 / x if x else np.inf,
    boundaries=edges.recip,
)
_unary("sqrt", ("num.sqrt.c1",), Bld.wide_sampler(-20, 20, positive=True), Bld.libm("sqrt"), boundaries=edges.sqrt)
_unary("rint", ("num.rint.c1",), Bld.wide_sampler(-4, 24), zeroing_observable=False, boundaries=edges.rint)
_unary(
    "exp",
    ("num.exp.c1", "num.trans.c1"),
    Bld.transcendental_sampler(-90, 89),
    Bld.libm("exp"),
    vendor=True,
    zeroing_observable=False,
    boundaries=edges.exp,
)
_unary(
    "log",
    ("num.log.c1", "num.trans.c1"),
    Bld.wide_sampler(-30, 30, positive=True),
    Bld.libm("log"),
    vendor=True,
    zeroing_observable=False,
    boundaries=edges.log,
)
_unary(
    "tanh",
    ("num.tanh.c1", "num.trans.c1"),
    Bld.transcendental_sampler(-10, 10),
    Bld.libm("tanh"),
    vendor=True,
    zeroing_observable=False,
    boundaries=edges.tanh,
)
_unary(
    "sigmoid",
    ("num.sigmoid.c1", "num.trans.c1"),
    Bld.transcendental_sampler(-20, 20),
    Bld.sigmoid64,
    vendor=True,
    zeroing_observable=False,
    boundaries=edges.sigmoid,
)
_unary(
    "sin",
    ("num.sincos.c1", "num.trans.c1"),
    Bld.transcendental_sampler(-100, 100),
    Bld.libm("sin"),
    vendor=True,
    zeroing_observable=False,
    boundaries=edges.sincos,
)
_unary(
    "cos",
    ("num.sincos.c1", "num.trans.c1"),
    Bld.transcendental_sampler(-100, 100),
    Bld.libm("cos"),
    vendor=True,
    zeroing_observable=False,
    boundaries=edges.sincos,
)
