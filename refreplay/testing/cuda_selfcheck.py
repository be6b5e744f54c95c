"""Device against reference, bit for bit: every kernel of ``cuda_backend``.

It lives here, above the trainer, because it compares the twin with every
reference layer (``training.treefold`` included); ``cuda_backend`` itself
imports only the layers below the trainer (``tests/test_layering.py``).

Each check draws inputs (random bit patterns, an edge-value grid, shapes that
cross tile boundaries), runs the device function of ``adapter`` and the
reference function of ``refreplay`` on the same host arrays, and compares
every bit of every output.  The spec's worked examples are run on the device
too.  Runs in the CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``, small shapes:
``tests/test_cuda_sim.py``) and on a GPU (``--large``: bigger shapes;
``scripts/gpu-selfcheck``).

    python -m refreplay.testing.cuda_selfcheck [--large] [--only NAME ...] [--json FILE]

exits 1 if any output differs in any bit.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

SEED = 20261129


# ---- inputs --------------------------------------------------------------------


def f32(bits) -> np.ndarray:
    return np.asarray(bits, dtype=np.uint64).astype(np.uint32).view(np.float32)


EDGE_BITS = (
    0x00000000,
    0x80000000,  # +-0
    0x00000001,
    0x807FFFFF,  # subnormals (min, -max)
    0x00800000,
    0x80800001,  # +-FLT_MIN neighbourhood
    0x3F800000,
    0xBF800000,
    0x3F800001,
    0x3F7FFFFF,  # around 1
    0x3F000000,
    0x3FC00000,
    0x40200000,
    0xBE800000,  # 0.5, 1.5, 2.5, -0.25 (rint ties)
    0x3F000001,
    0x4AFFFFFF,
    0x4B000000,
    0xCB000001,  # near 2^23
    0x3F7FFFFE,
    0x00800001,  # the flush-before-rounding pair
    0x7F7FFFFF,
    0xFF7FFFFF,
    0x7F000000,  # +-FLT_MAX, 2^127
    0x43000000,
    0xC3010000,
    0x42FE0000,  # 128, -129, 127 (saturation)
    0x7F800000,
    0xFF800000,  # +-inf
    0x7FC00000,
    0xFFC00000,
    0x7FFFFFFF,
    0x7F800001,
    0x7FC12345,  # NaNs
)


def edge() -> np.ndarray:
    return f32(EDGE_BITS)


def random_bits(rng, n) -> np.ndarray:
    """Uniform random bit patterns: every exponent, both signs, some NaNs."""
    return rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)


def random_normal(rng, shape, scale=1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def near_underflow_pairs(rng, n):
    """(a, b) whose product lies near 2^-126: exercises flush after rounding."""
    e = rng.integers(-70, -56, n)
    a = np.ldexp(rng.uniform(1, 2, n), e).astype(np.float32)
    b = np.ldexp(rng.uniform(0.5, 1, n), -126 - e).astype(np.float32)
    return a, b


def with_specials(rng, x, frac=0.1) -> np.ndarray:
    """x with a fraction of its elements replaced by edge values."""
    x = x.copy()
    flat = x.reshape(-1)
    pick = rng.random(flat.size) < frac
    flat[pick] = rng.choice(edge(), int(pick.sum()))
    return x


# ---- comparison ----------------------------------------------------------------


def same(want, got) -> bool:
    """Every output equal in dtype, shape and bits (tuples output by output)."""
    if isinstance(want, tuple):
        return isinstance(got, tuple) and len(got) == len(want) and all(map(same, want, got))
    if want is None or got is None:
        return want is None and got is None
    want, got = np.asarray(want), np.asarray(got)
    return want.dtype == got.dtype and want.shape == got.shape and want.tobytes() == got.tobytes()


def first_difference(want, got) -> str:
    if isinstance(want, tuple):
        if not isinstance(got, tuple) or len(got) != len(want):
            return f"expected {len(want)} outputs, got {type(got).__name__}"
        return "; ".join(
            f"output {k}: {first_difference(w, g)}" for k, (w, g) in enumerate(zip(want, got)) if not same(w, g)
        )
    want, got = np.asarray(want), np.asarray(got)
    if want.dtype != got.dtype or want.shape != got.shape:
        return f"expected {want.dtype}{want.shape}, got {got.dtype}{got.shape}"
    w, g = want.reshape(-1), got.reshape(-1)
    if w.dtype == np.float32:
        w, g = w.view(np.uint32), g.view(np.uint32)
    bad = np.flatnonzero(w != g)
    i = int(bad[0])
    idx = tuple(int(v) for v in np.unravel_index(i, want.shape)) if want.ndim else ()
    fmt = (lambda v: f"0x{int(v):08X}") if want.dtype == np.float32 else str
    return f"{bad.size} of {w.size} differ; first at {idx}: expected {fmt(w[i])}, got {fmt(g[i])}"


@dataclass
class Result:
    check: str
    clauses: list
    cases: int = 0
    failures: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.cases > 0 and not self.failures


# ---- checks: name, clauses, function(rng, large) -> [(case, want, got)] ----------


def _elementwise_pairs(rng, large):
    n = 1 << 16 if large else 256
    e = edge()
    ea, eb = np.repeat(e, e.size), np.tile(e, e.size)
    ua, ub = near_underflow_pairs(rng, n // 4)
    return [
        ("random bits", random_bits(rng, n), random_bits(rng, n)),
        ("edge x edge", ea, eb),
        ("products near 2^-126", ua, ub),
    ]


def _binary_check(name):
    def run(rng, large):
        from refreplay.numerics import core
        from cuda_backend import adapter

        ref, dev = getattr(core, name), getattr(adapter, name)
        return [(case, _ref_binary(ref, a, b), dev(a, b)) for case, a, b in _elementwise_pairs(rng, large)]

    return run


def _ref_binary(fn, a, b):
    return np.array([fn(x, y) for x, y in zip(a, b)], dtype=np.float32)


def _ref_unary(fn, x, dtype=np.float32):
    return np.array([fn(v) for v in x], dtype=dtype)


def _unary_inputs(rng, large):
    n = 1 << 16 if large else 512
    ties = f32(np.arange(0x4A800000, 0x4A800000 + 64, dtype=np.uint64))  # 2^22 ..: halves
    return [
        ("random bits", random_bits(rng, n)),
        ("edge", edge()),
        ("small magnitudes", random_normal(rng, n, 4.0)),
        ("rint ties near 2^22", ties),
    ]


def _unary_check(name):
    def run(rng, large):
        from refreplay.numerics import core
        from cuda_backend import adapter

        ref, dev = getattr(core, name), getattr(adapter, name)
        return [(case, _ref_unary(ref, x), dev(x)) for case, x in _unary_inputs(rng, large)]

    return run


TRANSCENDENTAL_DOMAINS = {  # where each function's algorithm does its work
    "exp": (-104.0, 90.0),
    "log": (0.0, 1e4),
    "tanh": (-12.0, 12.0),
    "sigmoid": (-40.0, 40.0),
    "sin": (-16384.0, 16384.0),
    "cos": (-100.0, 100.0),
}


def _transcendental_check(name):
    """[num.exp.c1] ... [num.sincos.c1]: the algorithm's every branch, plus specials."""

    def run(rng, large):
        from refreplay.numerics import elementwise as ref
        from cuda_backend import adapter

        lo, hi = TRANSCENDENTAL_DOMAINS[name]
        n = 1 << 16 if large else 384
        cases = [
            ("domain", rng.uniform(lo, hi, n).astype(np.float32)),
            ("small", np.ldexp(rng.uniform(-1, 1, n), rng.integers(-30, 1, n)).astype(np.float32)),
        ]
        cases += _unary_inputs(rng, large)[:2]  # random bits, edge values
        fr, fd = getattr(ref, name), getattr(adapter, name)
        return [(case, fr(x), fd(x)) for case, x in cases]

    return run


def _check_load(rng, large):
    from refreplay import numerics
    from cuda_backend import adapter

    return [(case, numerics.load(x), adapter.load(x)) for case, x in _unary_inputs(rng, large)]


def _check_saturate(rng, large):
    from refreplay.numerics import core
    from cuda_backend import adapter

    out = []
    for case, x in _unary_inputs(rng, large):
        r = _ref_unary(core.rint, x)  # saturate_i8 takes integral values
        out.append((case, _ref_unary(core.saturate_i8, r, np.int8), adapter.saturate_i8(r)))
    return out


def _check_mul_add(rng, large):
    """[num.nofma.c1] a*b + c with products that cancel: a fused kernel leaves 2^-24-sized residues."""
    from refreplay.numerics import core
    from cuda_backend import adapter

    n = 1 << 14 if large else 256
    a = (np.float32(1) + np.ldexp(rng.integers(1, 1 << 11, n), -23)).astype(np.float32)
    b = a.copy()
    c = -_ref_binary(core.mul, a, b)
    want = _ref_binary(core.add, _ref_binary(core.mul, a, b), c)
    return [("a*a - round(a*a)", want, adapter.mul_add(a, b, c))]


def _shapes(large):
    return [(512, 384, 256), (257, 1000, 129)] if large else [(1, 1, 1), (17, 37, 19), (3, 0, 4)]


def _mm_inputs(rng, large):
    from refreplay import numerics

    for I, K, J in _shapes(large):
        A = numerics.load(random_normal(rng, (I, K)))
        B = numerics.load(random_normal(rng, (K, J)))
        yield f"{I}x{K}x{J} normal", A, B
    I, K, J = _shapes(large)[1]
    yield (
        f"{I}x{K}x{J} with specials",
        numerics.load(with_specials(rng, random_normal(rng, (I, K)))),
        numerics.load(with_specials(rng, random_normal(rng, (K, J)))),
    )
    a, b = near_underflow_pairs(rng, I * K)  # products flushed before they are added
    yield f"{I}x{K}x{J} products near 2^-126", a.reshape(I, K), np.resize(b, (K, J))


def _check_matmul(form):
    def run(rng, large):
        from refreplay import linalg
        from cuda_backend import adapter

        ref, dev = getattr(linalg, form), getattr(adapter, form)
        out = []
        for case, A, B in _mm_inputs(rng, large):
            if form == "matmul_nt":
                B = np.ascontiguousarray(B.T)
            elif form == "matmul_tn":
                A = np.ascontiguousarray(A.T)
            want = ref(A, B)
            out.append((case, want, dev(A, B)))
            if case.endswith("normal") and want.size > 1:
                D = random_normal(rng, want.shape)
                out.append((case + " accumulate", ref(A, B, D.copy(), True), dev(A, B, D.copy(), True)))
        return out

    return run


def _check_reductions(rng, large):
    from refreplay import linalg, numerics
    from cuda_backend import adapter

    out = []
    for I, N, _ in _shapes(large):
        for case, X in (
            ("normal", random_normal(rng, (I, N))),
            ("specials", with_specials(rng, random_normal(rng, (I, N)), 0.05)),
        ):
            X = numerics.load(X)
            out.append((f"row_sum {I}x{N} {case}", linalg.row_sum(X), adapter.row_sum(X)))
            out.append((f"row_max {I}x{N} {case}", linalg.row_max(X), adapter.row_max(X)))
            out.append((f"col_sum {I}x{N} {case}", linalg.col_sum(X), adapter.col_sum(X)))
            if N:
                D = random_normal(rng, (N,))
                out.append(
                    (
                        f"col_sum {I}x{N} {case} accumulate",
                        linalg.col_sum(X, D.copy(), True),
                        adapter.col_sum(X, D.copy(), True),
                    )
                )
            b = numerics.load(with_specials(rng, random_normal(rng, (N,))))
            out.append(
                (
                    f"bias_add {I}x{N} {case}",
                    linalg.bias_add(X, b, inplace=False),
                    adapter.bias_add(X, b, inplace=False),
                )
            )
    return out


def _check_matmul_i8(rng, large):
    from refreplay import linalg
    from cuda_backend import adapter

    out = []
    for I, K, J in _shapes(large):
        A = rng.integers(-128, 128, (I, K)).astype(np.int8)
        B = rng.integers(-128, 128, (K, J)).astype(np.int8)
        out.append((f"{I}x{K}x{J}", linalg.matmul_i8(A, B), adapter.matmul_i8(A, B)))
    K = 4096 if large else 300  # the largest products, all the same sign
    A = np.full((2, K), -128, np.int8)
    B = np.full((K, 3), -128, np.int8)
    out.append((f"2x{K}x3 all -128", linalg.matmul_i8(A, B), adapter.matmul_i8(A, B)))
    return out


def _check_rng(rng, large):
    from refreplay import rng as ref
    from cuda_backend import adapter

    n = 1 << 16 if large else 200
    out = []
    counters = rng.integers(0, 1 << 32, (n, 4), dtype=np.uint64).astype(np.uint32)
    key = rng.integers(0, 1 << 32, 2, dtype=np.uint64).astype(np.uint32)
    want = np.array([ref.philox4x32(c, key) for c in counters], dtype=np.uint32)
    out.append(("philox4x32-10 random counters", want, adapter.philox4x32(counters, key)))
    want7 = np.array([ref.philox4x32(c, key, 7) for c in counters[:16]], dtype=np.uint32)
    out.append(("philox4x32-7", want7, adapter.philox4x32(counters[:16], key, 7)))
    seed = int(rng.integers(0, 1 << 63)) * 2 + 1
    for start in (0, 1, 3, (1 << 34) - 2):  # unaligned starts; a block index above 2^32
        out.append(
            (f"words start={start}", ref.words(seed, 2, 7, n + 1, start), adapter.words(seed, 2, 7, n + 1, start))
        )
    w = random_bits(rng, n).view(np.uint32)
    w[:4] = [0, 0xFF, 0x100, 0xFFFFFFFF]
    out.append(("unit", ref.unit_floats(seed, 2, 7, n), adapter.unit(adapter.words(seed, 2, 7, n))))
    for a in (np.float32(0.5), np.float32(1.5), f32(0x3CA3D70A)[()], f32(0x00800000)[()]):
        want = np.array([ref.symmetric(v, a) for v in w], dtype=np.float32)
        out.append((f"symmetric a=0x{int(np.float32(a).view(np.uint32)):08X}", want, adapter.symmetric(w, a)))
    for name, shape in (("w", (2, 3)), ("wte.weight", (5, 7)), ("b", (1,)), ("big", (3, n // 3 + 1))):
        a = f32(0x3DCCCCCD)[()]
        out.append(
            (
                f"init_uniform {name} {shape}",
                ref.init_uniform(seed, name, shape, a),
                adapter.init_uniform(seed, name, shape, a),
            )
        )
    return out


def _check_treefold(rng, large):
    from refreplay.training import treefold as ref
    from cuda_backend import adapter

    out = []
    n = 4096 if large else 24
    for M in (1, 2, 3, 5, 7, 8, 13, 16, 33):
        # magnitudes spread over 2^-20 .. 2^20: association changes the bits
        X = np.ldexp(random_normal(rng, (M, n)), rng.integers(-20, 21, (M, n))).astype(np.float32)
        X = with_specials(rng, X, 0.01) if M == 13 else X
        for R in sorted({1, 2, 3, M}):
            if R <= M:
                out.append((f"fold_rows M={M} R={R}", ref.fold_rows(X, R), adapter.fold_rows(X, R)))
        out.append((f"scale M={M}", ref.scale(X[0].copy(), M), adapter.scale(X[0], M)))
    return out


def _check_embedding_linear(rng, large):
    from refreplay.ops import embedding as emb, linear as lin
    from cuda_backend import adapter

    out = []
    V, C, B, T = (512, 768, 4, 256) if large else (11, 5, 2, 9)
    wte = with_specials(rng, random_normal(rng, (V, C)), 0.05)
    tokens = rng.integers(0, V - 2, (B, T)).astype(np.int32)  # the last two ids never occur
    tokens[0, :3] = 0  # a repeated id
    out.append(("embedding fwd", emb.embedding_forward(wte, tokens), adapter.embedding_forward(wte, tokens)))
    dout = np.ldexp(random_normal(rng, (B, T, C)), rng.integers(-24, 1, (B, T, C))).astype(np.float32)
    out.append(("embedding bwd", emb.embedding_backward(dout, tokens, V), adapter.embedding_backward(dout, tokens, V)))
    N, OC = B * T, 3 * C
    x, W, b = random_normal(rng, (N, C)), random_normal(rng, (OC, C)), random_normal(rng, OC)
    dy = random_normal(rng, (N, OC))
    out.append(("linear fwd", lin.linear_forward(x, W, b), adapter.linear_forward(x, W, b)))
    out.append(("linear fwd, no bias", lin.linear_forward(x, W), adapter.linear_forward(x, W)))
    out.append(("linear bwd", lin.linear_backward(dy, x, W), adapter.linear_backward(dy, x, W)))
    return out


def _check_quant(rng, large):
    from refreplay.ops import quant as ref
    from cuda_backend import adapter

    out = []
    B, T, C, OC = (4, 64, 256, 512) if large else (2, 3, 5, 4)
    x = random_normal(rng, (B, T, C), 2.0)
    w = random_normal(rng, (OC, C), 0.1)
    w[1] = 0  # an all-zero row: the step floor
    b = random_normal(rng, OC)
    dy = random_normal(rng, (B, T, OC))
    xs = with_specials(rng, random_normal(rng, (6, 9)), 0.1)
    s = np.abs(random_normal(rng, 6)) + np.float32(0.01)
    out.append(("step_size_rows", ref.step_size_rows(xs), adapter.step_size_rows(xs)))
    out.append(("step_size", np.float32(ref.step_size(x)), adapter.step_size(x)))
    out.append(("quantize", ref.quantize(xs, s), adapter.quantize(xs, s)))
    q = rng.integers(-128, 128, (6, 9)).astype(np.int8)
    out.append(("dequantize", ref.dequantize(q, s), adapter.dequantize(q, s)))
    out.append(
        (
            "fake_quantize, explicit small steps",
            ref.fake_quantize(xs, s / np.float32(64)),
            adapter.fake_quantize(xs, s / np.float32(64)),
        )
    )
    g = random_normal(rng, xs.shape)
    out.append(
        (
            "fake_quantize_backward (saturating)",
            ref.fake_quantize_backward(g, xs, s / np.float32(64)),
            adapter.fake_quantize_backward(g, xs, s / np.float32(64)),
        )
    )
    out.append(("qlinear fwd", ref.qlinear_forward(x, w, b), adapter.qlinear_forward(x, w, b)))
    out.append(("qlinear fwd, no bias", ref.qlinear_forward(x, w), adapter.qlinear_forward(x, w)))
    out.append(("qlinear bwd", ref.qlinear_backward(dy, x, w), adapter.qlinear_backward(dy, x, w)))
    return out


def _check_rope_attention(rng, large):
    from refreplay.ops import attention as att_ref, rope as rope_ref
    from cuda_backend import adapter

    out = []
    B, NH, T, HS = (2, 4, 128, 64) if large else (2, 2, 5, 4)
    for T_, HS_ in ((T, HS), (300, 6) if not large else (4096, 128)):
        out.append((f"rope_tables T={T_} HS={HS_}", rope_ref.rope_tables(T_, HS_), adapter.rope_tables(T_, HS_)))
    cos_t, sin_t = rope_ref.rope_tables(T, HS)
    x = random_normal(rng, (B, NH, T, HS))
    out.append(("rope fwd", rope_ref.rope_forward(x, cos_t, sin_t), adapter.rope_forward(x, cos_t, sin_t)))
    out.append(("rope bwd", rope_ref.rope_backward(x, cos_t, sin_t), adapter.rope_backward(x, cos_t, sin_t)))
    q, k, v, dout = (random_normal(rng, (B, NH, T, HS), 2.0) for _ in range(4))
    k[1, 0, T - 1, 0] = np.float32(np.inf)  # a future inf must not reach earlier rows
    v[1, 1, 2, 1] = np.float32(np.nan)
    o, att = att_ref.attention_forward(q, k, v)
    out.append(("attention fwd", (o, att), adapter.attention_forward(q, k, v)))
    out.append(
        (
            "attention bwd",
            att_ref.attention_backward(dout, q, k, v, att),
            adapter.attention_backward(dout, q, k, v, att),
        )
    )
    return out


def _check_loss_optim(rng, large):
    from refreplay.ops import loss as loss_ref, optim as opt_ref
    from cuda_backend import adapter

    out = []
    N, V = (64, 50257) if large else (6, 11)
    logits = random_normal(rng, (N, V), 3.0)
    targets = rng.integers(0, V, N).astype(np.int32)
    targets[1] = -1
    out.append(
        (
            "cross_entropy fwd",
            loss_ref.cross_entropy_forward(logits, targets),
            adapter.cross_entropy_forward(logits, targets),
        )
    )
    for dloss, count in ((np.float32(1.0), None), (np.float32(0.37), 3 * N)):
        out.append(
            (
                f"cross_entropy bwd dloss={dloss} count={count}",
                loss_ref.cross_entropy_backward(logits, targets, dloss, count),
                adapter.cross_entropy_backward(logits, targets, dloss, count),
            )
        )
    pad = np.full(N, -1, np.int32)
    out.append(
        (
            "cross_entropy fwd, padding only",
            loss_ref.cross_entropy_forward(logits, pad),
            adapter.cross_entropy_forward(logits, pad),
        )
    )
    b1, b2 = np.float32(0.9), np.float32(0.95)
    for t in (1, 2, 77, 10000):
        out.append(
            (
                f"bias corrections t={t}",
                tuple(np.float32(v) for v in opt_ref.adamw_bias_corrections(b1, b2, t)),
                adapter.adamw_bias_corrections(b1, b2, t),
            )
        )
    n = 1 << 16 if large else 50
    params = {"w": random_normal(rng, n), "b": random_normal(rng, 7), "a.z": random_normal(rng, (3, 4))}
    grads = {k: random_normal(rng, p.shape) for k, p in params.items()}
    m = {k: random_normal(rng, p.shape, 0.1) for k, p in params.items()}
    v = {k: np.abs(random_normal(rng, p.shape, 0.01)) for k, p in params.items()}
    lr = np.float32(1e-3)
    for decay in (True, False):
        out.append(
            (
                f"adamw_update decay={decay}",
                opt_ref.adamw_update(params["w"], grads["w"], m["w"], v["w"], 5, lr, decay=decay),
                adapter.adamw_update(params["w"], grads["w"], m["w"], v["w"], 5, lr, decay=decay),
            )
        )
    for max_norm in (np.float32(1.0), np.float32(1e6)):
        g_ref = {k: a.copy() for k, a in grads.items()}
        g_dev = {k: a.copy() for k, a in grads.items()}
        nc_ref = tuple(np.float32(x) for x in opt_ref.clip_grad_norm(g_ref, max_norm))
        nc_dev = adapter.clip_grad_norm(g_dev, max_norm)
        out.append(
            (
                f"clip_grad_norm max_norm={max_norm}",
                (nc_ref, *[g_ref[k] for k in sorted(g_ref)]),
                (tuple(nc_dev), *[g_dev[k] for k in sorted(g_dev)]),
            )
        )
    lr_max, lr_min = np.float32(6e-4), np.float32(6e-5)
    for kind in ("cosine", "linear", "constant"):
        want = np.array(
            [opt_ref.lr_at(t, 10, 100, lr_max, lr_min, kind) for t in (1, 10, 11, 55, 100, 200)], np.float32
        )
        got = np.array([adapter.lr_at(t, 10, 100, lr_max, lr_min, kind) for t in (1, 10, 11, 55, 100, 200)], np.float32)
        out.append((f"lr_at {kind}", want, got))
    return out


def _check_norms(rng, large):
    from refreplay.ops import norms as ref
    from cuda_backend import adapter

    out = []
    eps = np.float32(1e-5)
    for N, C in ((64, 768), (33, 100)) if large else ((1, 1), (5, 7), (3, 40)):
        x = random_normal(rng, (N, C), 3.0) + np.float32(rng.standard_normal())
        if N > 3:
            x[1] = with_specials(rng, x[1:2], 0.2)[0]  # one row with specials
        w, b = random_normal(rng, C), random_normal(rng, C)
        dout = random_normal(rng, (N, C))
        y, mean, rstd = ref.layernorm_forward(x, w, b, eps)
        out.append((f"layernorm fwd {N}x{C}", (y, mean, rstd), adapter.layernorm_forward(x, w, b, eps)))
        out.append(
            (
                f"layernorm bwd {N}x{C}",
                ref.layernorm_backward(dout, x, w, mean, rstd),
                adapter.layernorm_backward(dout, x, w, mean, rstd),
            )
        )
        y, rrms = ref.rmsnorm_forward(x, w, eps)
        out.append((f"rmsnorm fwd {N}x{C}", (y, rrms), adapter.rmsnorm_forward(x, w, eps)))
        out.append(
            (f"rmsnorm bwd {N}x{C}", ref.rmsnorm_backward(dout, x, w, rrms), adapter.rmsnorm_backward(dout, x, w, rrms))
        )
    return out


def _check_activations(rng, large):
    from refreplay.ops import activations as ref
    from cuda_backend import adapter

    n = 1 << 16 if large else 300
    out = []
    for case, x in (
        ("normal*4", random_normal(rng, (3, n // 3), 4.0)),
        ("edge", edge()),
        ("wide", rng.uniform(-60, 60, n).astype(np.float32)),
    ):
        dout = random_normal(rng, x.shape)
        b = random_normal(rng, x.shape)
        for name, args in (
            ("gelu_forward", (x,)),
            ("gelu_backward", (dout, x)),
            ("silu_forward", (x,)),
            ("silu_backward", (dout, x)),
            ("swiglu_forward", (x, b)),
            ("swiglu_backward", (dout, x, b)),
        ):
            out.append((f"{name} {case}", getattr(ref, name)(*args), getattr(adapter, name)(*args)))
    return out


def _check_softmax(rng, large):
    from refreplay import numerics
    from refreplay.ops import softmax as ref
    from cuda_backend import adapter

    out = []
    for shape in ((64, 1024), (7, 50257)) if large else ((1, 1), (4, 33), (2, 3, 17)):
        x = numerics.load(random_normal(rng, shape, 5.0))
        if x.shape[0] > 1:
            x[1, ..., 3] = np.float32(np.inf)  # one row (or row group) with +inf: NaN rows
        dy = random_normal(rng, shape)
        y, ly = ref.softmax_forward(x), ref.log_softmax_forward(x)
        out.append((f"softmax fwd {shape}", y, adapter.softmax_forward(x)))
        out.append((f"softmax bwd {shape}", ref.softmax_backward(dy, y), adapter.softmax_backward(dy, y)))
        out.append((f"log_softmax fwd {shape}", ly, adapter.log_softmax_forward(x)))
        out.append((f"log_softmax bwd {shape}", ref.log_softmax_backward(dy, ly), adapter.log_softmax_backward(dy, ly)))
    return out


def bf16_rounding_grid() -> np.ndarray:
    """binary32 inputs at and beside every kind of bf16 tie: every exponent
    field, kept fractions 0x00, 0x01, 0x7F, low halves 0x7FFF, 0x8000, 0x8001
    (even and odd kept bits, carries into the exponent and to infinity), both
    signs."""
    g = np.array(
        [
            (s << 31) | (e << 23) | (k << 16) | low
            for s in (0, 1)
            for e in range(256)
            for k in (0x00, 0x01, 0x7F)
            for low in (0x7FFF, 0x8000, 0x8001)
        ],
        dtype=np.uint64,
    )
    return f32(g)


def bf16_edge_bits() -> np.ndarray:
    """bf16 patterns of every exponent class with fractions 0x00, 0x01, 0x2A,
    0x40, 0x7E, 0x7F, both signs (subnormals, infinities and NaNs with
    payloads among them)."""
    return np.array(
        [(s << 15) | (e << 7) | f for s in (0, 1) for e in range(256) for f in (0x00, 0x01, 0x2A, 0x40, 0x7E, 0x7F)],
        dtype=np.uint16,
    )


def _check_bf16(rng, large):
    """[bf16.round.c1] [bf16.widen.c1] [bf16.load.c1]: the device conversions
    against ``refreplay.numerics.bf16``; round_inplace on a device array."""
    from numba import cuda

    from refreplay.numerics import bf16 as ref
    from cuda_backend.host import bf16 as dev

    n = 1 << 16 if large else 512
    xs = [("bf16 rounding grid", bf16_rounding_grid()), ("random bits", random_bits(rng, n)), ("edge", edge())]
    hs = [
        ("bf16 edge", bf16_edge_bits()),
        (
            "bf16 patterns",
            np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
            if large
            else rng.integers(0, 1 << 16, n, dtype=np.uint32).astype(np.uint16),
        ),
    ]
    out = [(f"encode {c}", ref.encode(x), dev.encode(x)) for c, x in xs]
    out += [(f"round_f32 {c}", ref.round_f32(x), dev.round_f32(x)) for c, x in xs]
    out += [(f"decode {c}", ref.decode(h), dev.decode(h)) for c, h in hs]
    out += [(f"load {c}", ref.load(h), dev.load(h)) for c, h in hs]
    x = bf16_rounding_grid().reshape(-1, 6)
    d = cuda.to_device(x)
    dev.round_inplace(d)
    out.append(("round_inplace on the device", ref.round_f32(x), d.copy_to_host()))
    return out


# ---- the spec's worked examples, evaluated with the device functions -------------

_DTYPES = {
    "f32": np.float32,
    "i8": np.int8,
    "i32": np.int32,
    "i64": np.int64,
    "u32": np.uint32,
    "u64": np.uint64,
    "u8": np.uint8,
    "u16": np.uint16,
    "bf16": np.uint16,
}  # [bf16.format.c1] bf16 tensors are their bit patterns


def _example_value(node, functions):
    """A value of the example language ([conv.values.c1]); calls go to ``functions``."""
    import ast
    import importlib

    if isinstance(node, ast.Tuple):
        return tuple(_example_value(e, functions) for e in node.elts)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _DTYPES:
        raw = ast.literal_eval(node.args[0])
        arr = f32(raw) if node.func.id == "f32" else np.array(raw, dtype=_DTYPES[node.func.id])
        return arr if isinstance(raw, list) else arr[()]
    if isinstance(node, ast.Call):
        name = ast.unparse(node.func)
        module, _, attr = name.rpartition(".")
        fn = functions.get(name) or getattr(importlib.import_module(f"refreplay.{module}"), attr)
        args = [_example_value(a, functions) for a in node.args]
        return fn(*args, **{k.arg: _example_value(k.value, functions) for k in node.keywords})
    if isinstance(node, ast.Constant):
        return node.value
    raise ValueError(f"unsupported example syntax: {ast.unparse(node)}")


def _as_result(want, got):
    """Scalars as the examples write them (a NumPy scalar of the example's dtype)."""
    if isinstance(want, tuple):
        return tuple(_as_result(w, g) for w, g in zip(want, got))
    return np.asarray(got, dtype=np.asarray(want).dtype) if np.ndim(got) == 0 else got


def example_cases(clause_prefixes=None):
    """(clause label, line, expression) of every example whose function the device covers."""
    import ast

    from refreplay import spec
    from cuda_backend.adapter import EXAMPLE_FUNCTIONS

    for label, clause in spec.parse().items():
        for line, expr, result in clause.examples:
            call = ast.parse(expr, mode="eval").body
            if ast.unparse(call.func) in EXAMPLE_FUNCTIONS:
                yield label, line, expr, result


def _check_examples(rng, large):
    import ast

    from cuda_backend.adapter import EXAMPLE_FUNCTIONS

    out = []
    for label, line, expr, result in example_cases():
        want = _example_value(ast.parse(result, mode="eval").body, {})
        got = _example_value(ast.parse(expr, mode="eval").body, EXAMPLE_FUNCTIONS)
        out.append((f"[{label}] line {line}: {expr}", want, _as_result(want, got)))
    return out


CHECKS: dict[str, tuple[tuple[str, ...], Callable]] = {
    "load": (("num.load.c1",), _check_load),
    "add": (("num.add.c1", "num.flush.c1", "num.nan.c1"), _binary_check("add")),
    "sub": (("num.add.c1",), _binary_check("sub")),
    "mul": (("num.mul.c1", "num.flush.c1", "num.nan.c1"), _binary_check("mul")),
    "mul_add": (("num.nofma.c1",), _check_mul_add),
    "recip": (("num.recip.c1",), _unary_check("recip")),
    "sqrt": (("num.sqrt.c1",), _unary_check("sqrt")),
    "fmax": (("num.minmax.c1",), _binary_check("fmax")),
    "fmin": (("num.minmax.c1",), _binary_check("fmin")),
    "rint": (("num.rint.c1",), _unary_check("rint")),
    "saturate_i8": (("num.sat.c1",), _check_saturate),
    "exp": (("num.exp.c1",), _transcendental_check("exp")),
    "log": (("num.log.c1",), _transcendental_check("log")),
    "tanh": (("num.tanh.c1",), _transcendental_check("tanh")),
    "sigmoid": (("num.sigmoid.c1",), _transcendental_check("sigmoid")),
    "sin": (("num.sincos.c1",), _transcendental_check("sin")),
    "cos": (("num.sincos.c1",), _transcendental_check("cos")),
    "matmul": (("mm.nn.c1", "mm.accumulate.c1"), _check_matmul("matmul")),
    "matmul_nt": (("mm.nt.c1", "mm.accumulate.c1"), _check_matmul("matmul_nt")),
    "matmul_tn": (("mm.tn.c1", "mm.accumulate.c1"), _check_matmul("matmul_tn")),
    "reductions": (("red.rowsum.c1", "red.colsum.c1", "red.rowmax.c1", "mm.bias.c1"), _check_reductions),
    "matmul_i8": (("mm.i8.c1",), _check_matmul_i8),
    "treefold": (("fold.tree.c1", "fold.final.c1", "fold.ranks.c1", "fold.scale.c1"), _check_treefold),
    "embedding_linear": (("emb.fwd.c1", "emb.bwd.c1", "linear.fwd.c1", "linear.bwd.c1"), _check_embedding_linear),
    "rope_attention": (
        (
            "rope.freq.c1",
            "rope.fwd.c1",
            "rope.bwd.c1",
            "attn.scores.c1",
            "attn.mask.c1",
            "attn.out.c1",
            "attn.bwd.c1",
            "attn.batch.c1",
        ),
        _check_rope_attention,
    ),
    "loss_optim": (
        (
            "loss.token.c1",
            "loss.mean.c1",
            "loss.bwd.c1",
            "optim.adamw.bias.c1",
            "optim.adamw.c1",
            "optim.clip.c1",
            "optim.lr.c1",
        ),
        _check_loss_optim,
    ),
    "quant": (
        (
            "quant.granularity.c1",
            "quant.step.c1",
            "quant.quantize.c1",
            "quant.dequantize.c1",
            "quant.ste.c1",
            "quant.linear.fwd.c1",
            "quant.linear.bwd.c1",
        ),
        _check_quant,
    ),
    "norms": (
        ("norm.meanop.c1", "norm.layer.fwd.c1", "norm.layer.bwd.c1", "norm.rms.fwd.c1", "norm.rms.bwd.c1"),
        _check_norms,
    ),
    "activations": (
        (
            "act.gelu.fwd.c1",
            "act.gelu.bwd.c1",
            "act.silu.fwd.c1",
            "act.silu.bwd.c1",
            "act.swiglu.fwd.c1",
            "act.swiglu.bwd.c1",
        ),
        _check_activations,
    ),
    "softmax": (("softmax.fwd.c1", "softmax.bwd.c1", "softmax.log.c1", "softmax.log.bwd.c1"), _check_softmax),
    "rng": (("rng.philox.c1", "rng.counter.c1", "rng.unit.c1", "rng.symmetric.c1", "rng.init.c1"), _check_rng),
    "bf16": (("bf16.round.c1", "bf16.widen.c1", "bf16.load.c1"), _check_bf16),
    "spec_examples": ((), _check_examples),
}


def run(names=None, large=False) -> list[Result]:
    """Run the named checks (all by default); each draws from its own seeded stream."""
    import zlib

    results = []
    for name in names or CHECKS:
        clauses, fn = CHECKS[name]
        rng = np.random.default_rng([SEED, zlib.crc32(name.encode())])
        res = Result(name, list(clauses))
        with np.errstate(all="ignore"):
            for case, want, got in fn(rng, large):
                res.cases += 1
                if not same(want, got):
                    res.failures.append(f"{case}: {first_difference(want, got)}")
        results.append(res)
    return results


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m refreplay.testing.cuda_selfcheck", description=__doc__.split("\n\n")[0])
    p.add_argument("--large", action="store_true", help="GPU-sized inputs (slow in the simulator)")
    p.add_argument("--only", nargs="+", choices=sorted(CHECKS), help="run only these checks")
    p.add_argument("--json", help="also write the results to this file")
    args = p.parse_args(argv)
    results = run(args.only, args.large)
    width = max(len(r.check) for r in results)
    for r in results:
        print(f"{r.check:<{width}}  {'ok  ' if r.ok else 'FAIL'}  {r.cases:4d} cases  {' '.join(r.clauses)}")
        for f in r.failures[:10]:
            print(f"{'':<{width}}    {f}")
    bad = sum(not r.ok for r in results)
    print(f"device vs reference: {len(results) - bad} checks equal bit for bit, {bad} differ")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                [dict(check=r.check, clauses=r.clauses, cases=r.cases, ok=r.ok, failures=r.failures) for r in results],
                fh,
                indent=1,
            )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
