"""Host-side entry points of the device kernels, with the reference's calling convention.

Each function takes host NumPy arrays, validates them as ``refreplay``'s API
does (clear ``TypeError``/``ValueError``), copies them to the device, launches
the kernel and copies the result back: host arrays in, host arrays out, the
same bits as the reference function of the same name.  Inputs are used as
given; like the reference kernels, callers pass tensors that went through
[num.load.c1] (``load`` does that on the device).

``OPS`` maps the conformance registry's op names to these functions and
``EXAMPLE_FUNCTIONS`` maps the reference names used in the spec's worked
examples (``numerics.add``, ``linalg.matmul``, ...).
"""
from __future__ import annotations

import numpy as np
from numba import cuda

from . import linalg as L
from . import numerics as N
from . import rng as R
from . import treefold as T
from .ops import norms as NORM
from ._jit import THREADS, blocks

I8_MAX_K = 131071  # [mm.i8.c2]


# ---- validation (mirrors refreplay.linalg.api) --------------------------------

def _array(name, x, dtype=np.float32, ndim=None):
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, got {type(x).__name__}")
    if x.dtype != dtype:
        raise TypeError(f"{name} must have dtype {np.dtype(dtype).name}, got {x.dtype}")
    if ndim is not None and x.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {x.shape}")
    return x if x.flags.c_contiguous else np.ascontiguousarray(x)  # keeps a 0-d array 0-d


def _output(out, shape, dtype=np.float32, accumulate=False):
    if out is None:
        if accumulate:
            raise ValueError("accumulate=True needs out= (the array to accumulate into)")
        return np.empty(shape, dtype=dtype)
    _array("out", out, dtype, len(shape))
    if out.shape != shape:
        raise ValueError(f"out must have shape {shape}, got {out.shape}")
    if not (out.flags.c_contiguous and out.flags.writeable):
        raise ValueError("out must be C-contiguous and writeable")
    return out


def _contracted(what, ka, kb):
    if ka != kb:
        raise ValueError(f"{what}: contracted lengths differ (K = {ka} vs {kb})")


def _scalar_or_array(name, x, dtype=np.float32):
    """An array, or a NumPy scalar (as in the spec's examples) as a 0-d array."""
    if isinstance(x, np.generic):
        x = np.asarray(x)
    return _array(name, x, dtype)


# ---- elementwise primitives (spec chapter 1) -----------------------------------

def _elementwise(k, out_dtype, *xs):
    """Launch an elementwise kernel over same-shape inputs; a 0-d result is a scalar."""
    shape = xs[0].shape
    for x in xs[1:]:
        if x.shape != shape:
            raise ValueError(f"shapes differ: {shape} vs {x.shape}")
    flat = [cuda.to_device(x.reshape(-1)) for x in xs]
    n = int(np.prod(shape, dtype=np.int64))
    out = cuda.device_array(n, dtype=out_dtype)
    if n:
        k[blocks(n), THREADS](*flat, out)
    res = out.copy_to_host().reshape(shape)
    return res[()] if res.ndim == 0 else res


def _unary(kernel, name, doc, out_dtype=np.float32):
    def op(x):
        return _elementwise(kernel, out_dtype, _scalar_or_array("x", x))
    op.__name__, op.__doc__ = name, doc
    return op


def _binary(kernel, name, doc):
    def op(a, b):
        return _elementwise(kernel, np.float32, _scalar_or_array("a", a), _scalar_or_array("b", b))
    op.__name__, op.__doc__ = name, doc
    return op


load = _unary(N.load_k, "load", "[num.load.c1] subnormals zeroed (sign kept), NaN canonical.")
add = _binary(N.add_k, "add", "[num.add.c1] a + b elementwise.")
sub = _binary(N.sub_k, "sub", "[num.add.c1] a - b elementwise.")
mul = _binary(N.mul_k, "mul", "[num.mul.c1] a * b elementwise.")
fmax = _binary(N.fmax_k, "fmax", "[num.minmax.c1] max elementwise.")
fmin = _binary(N.fmin_k, "fmin", "[num.minmax.c1] min elementwise.")
recip = _unary(N.recip_k, "recip", "[num.recip.c1] 1/x elementwise.")
sqrt = _unary(N.sqrt_k, "sqrt", "[num.sqrt.c1] square root elementwise.")
rint = _unary(N.rint_k, "rint", "[num.rint.c1] nearest integer, ties to even.")
saturate_i8 = _unary(N.saturate_i8_k, "saturate_i8", "[num.sat.c1] integral float32 -> int8.", np.int8)


def _transcendental(name, doc):
    from . import transcendental as TR  # imports the reference's constants
    return _unary(getattr(TR, name + "_k"), name, doc)


def exp(x):
    """[num.exp.c1] e^x elementwise, by the spec's algorithm."""
    return _transcendental("exp", exp.__doc__)(x)


def log(x):
    """[num.log.c1] natural logarithm elementwise."""
    return _transcendental("log", log.__doc__)(x)


def tanh(x):
    """[num.tanh.c1] tanh elementwise."""
    return _transcendental("tanh", tanh.__doc__)(x)


def sigmoid(x):
    """[num.sigmoid.c1] logistic sigmoid elementwise."""
    return _transcendental("sigmoid", sigmoid.__doc__)(x)


def sin(x):
    """[num.sincos.c1] sine elementwise (|x| <= 2^14, NaN outside)."""
    return _transcendental("sin", sin.__doc__)(x)


def cos(x):
    """[num.sincos.c1] cosine elementwise (|x| <= 2^14, NaN outside)."""
    return _transcendental("cos", cos.__doc__)(x)


def mul_add(a, b, c):
    """[num.nofma.c1] add(mul(a, b), c) elementwise: two roundings."""
    return _elementwise(N.mul_add_k, np.float32, _scalar_or_array("a", a),
                        _scalar_or_array("b", b), _scalar_or_array("c", c))


# ---- linear algebra (spec chapters 3 and 4) -------------------------------------

def _matmul(kernel, what, A, B, IJ, ka, kb, out, accumulate):
    _contracted(what, ka, kb)
    C = _output(out, IJ, accumulate=accumulate)
    dC = cuda.to_device(C) if accumulate else cuda.device_array(IJ, dtype=np.float32)
    if IJ[0] and IJ[1]:
        grid = (blocks(IJ[1], L.TILE), blocks(IJ[0], L.TILE))
        kernel[grid, (L.TILE, L.TILE)](cuda.to_device(A), cuda.to_device(B), dC, bool(accumulate))
        dC.copy_to_host(C)
    return C


def matmul(A, B, out=None, accumulate=False):
    """[mm.nn.c1] C = A·B, A: I×K, B: K×J -> C: I×J; ``accumulate`` adds into ``out``."""
    A, B = _array("A", A, ndim=2), _array("B", B, ndim=2)
    return _matmul(L.mm_nn_k, "matmul", A, B, (A.shape[0], B.shape[1]), A.shape[1], B.shape[0],
                   out, accumulate)


def matmul_nt(A, B, out=None, accumulate=False):
    """[mm.nt.c1] C = A·Bᵀ, A: I×K, B: J×K -> C: I×J."""
    A, B = _array("A", A, ndim=2), _array("B", B, ndim=2)
    return _matmul(L.mm_nt_k, "matmul_nt", A, B, (A.shape[0], B.shape[0]), A.shape[1], B.shape[1],
                   out, accumulate)


def matmul_tn(A, B, out=None, accumulate=False):
    """[mm.tn.c1] C = Aᵀ·B, A: K×I, B: K×J -> C: I×J."""
    A, B = _array("A", A, ndim=2), _array("B", B, ndim=2)
    return _matmul(L.mm_tn_k, "matmul_tn", A, B, (A.shape[1], B.shape[1]), A.shape[0], B.shape[0],
                   out, accumulate)


def bias_add(C, b, inplace=True):
    """[mm.bias.c1] C[i,j] + b[j] for C: I×J, b: J; in place (returns C) or into a new array."""
    _array("C", C, ndim=2), _array("b", b, ndim=1)
    if b.shape[0] != C.shape[1]:
        raise ValueError(f"bias_add: b has length {b.shape[0]}, C has {C.shape[1]} columns")
    if inplace and not (C.flags.c_contiguous and C.flags.writeable):
        raise ValueError("C must be C-contiguous and writeable for an in-place bias_add")
    target = C if inplace else np.ascontiguousarray(C).copy()
    if target.size:
        dC = cuda.to_device(target)
        L.bias_add_k[blocks(target.size), THREADS](dC, cuda.to_device(np.ascontiguousarray(b)))
        dC.copy_to_host(target)
    return target


def _rows(kernel, X, n_out, out, accumulate=None):
    o = _output(out, (n_out,), accumulate=bool(accumulate))
    if n_out:
        d_out = cuda.to_device(o) if accumulate else cuda.device_array(n_out, dtype=np.float32)
        args = (cuda.to_device(X), d_out) + ((bool(accumulate),) if accumulate is not None else ())
        kernel[blocks(n_out), THREADS](*args)
        d_out.copy_to_host(o)
    return o


def row_sum(X, out=None):
    """[red.rowsum.c1] X: I×N -> I, each row summed in increasing n."""
    X = _array("X", X, ndim=2)
    return _rows(L.row_sum_k, X, X.shape[0], out)


def col_sum(X, out=None, accumulate=False):
    """[red.colsum.c1] X: N×J -> J, each column summed in increasing row index."""
    X = _array("X", X, ndim=2)
    return _rows(L.col_sum_k, X, X.shape[1], out, accumulate)


def row_max(X, out=None):
    """[red.rowmax.c1] X: I×N -> I, fmax of each row from -inf."""
    X = _array("X", X, ndim=2)
    return _rows(L.row_max_k, X, X.shape[0], out)


def matmul_i8(A, B, out=None):
    """[mm.i8.c1] int8 A: I×K times int8 B: K×J -> exact int32 C: I×J; K <= 131071 ([mm.i8.c2])."""
    A, B = _array("A", A, np.int8, 2), _array("B", B, np.int8, 2)
    _contracted("matmul_i8", A.shape[1], B.shape[0])
    if A.shape[1] > I8_MAX_K:
        raise ValueError(f"matmul_i8: K = {A.shape[1]} exceeds {I8_MAX_K} ([mm.i8.c2])")
    I, J = A.shape[0], B.shape[1]
    C = _output(out, (I, J), np.int32)
    if I and J:
        dC = cuda.device_array((I, J), dtype=np.int32)
        grid = (blocks(J, L.TILE), blocks(I, L.TILE))
        L.mm_i8_k[grid, (L.TILE, L.TILE)](cuda.to_device(A), cuda.to_device(B), dC)
        dC.copy_to_host(C)
    return C


# ---- random numbers (spec chapter 5) -------------------------------------------

def _uint(value, bits, what):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what} must be an integer, got {type(value).__name__}")
    if not 0 <= int(value) < (1 << bits):
        raise ValueError(f"{what} must lie in [0, 2**{bits}), got {int(value)}")
    return np.uint64(int(value))


def _key(seed):
    from refreplay.rng import seed_key  # [rng.counter.c1] (lo(s), hi(s))
    return seed_key(seed)


def _scale(a):
    a32 = np.float32(a)
    if not (np.isfinite(a32) and a32 >= np.float32(1.1754943508222875e-38)) or float(a32) != float(a):
        raise ValueError(f"scale a must be a positive normal binary32 value, got {a!r}")
    return a32


def philox4x32(counter, key, rounds=R.ROUNDS):
    """[rng.philox.c1] Philox4x32 of counters (4 words, or N×4) under a 2-word key -> uint32."""
    c = np.asarray(counter)
    k = np.asarray(key)
    if c.shape[-1:] != (4,) or c.ndim > 2 or c.dtype.kind not in "iu" or k.shape != (2,) or k.dtype.kind not in "iu":
        raise TypeError("counter must be 4 (or N x 4) integer words and key 2 integer words")
    if not isinstance(rounds, (int, np.integer)) or not 1 <= rounds <= 16:
        raise ValueError(f"rounds must be an integer in [1, 16], got {rounds!r}")
    if (c.size and (c.min() < 0 or c.max() > 0xFFFFFFFF)) or k.min() < 0 or k.max() > 0xFFFFFFFF:
        raise ValueError("words must lie in [0, 2**32)")
    cs = np.ascontiguousarray(c.reshape(-1, 4), dtype=np.uint32)
    out = cuda.device_array(cs.shape, dtype=np.uint32)
    if cs.shape[0]:
        R.philox_k[blocks(cs.shape[0]), THREADS](cuda.to_device(cs), cuda.to_device(k.astype(np.uint32)),
                                                 int(rounds), out)
    return out.copy_to_host().reshape(c.shape)


def philox4x32_10(counter, key):
    """[rng.philox.c1] Philox4x32-10."""
    return philox4x32(counter, key, R.ROUNDS)


def words(seed, stream, sub, count, start=0):
    """[rng.counter.c1] Words start .. start+count-1 of stream (seed, stream, sub), uint32 (count,)."""
    k0, k1 = _key(seed)
    st, sb, s0 = _uint(stream, 32, "stream"), _uint(sub, 32, "sub"), _uint(start, 64, "start")
    c = int(_uint(count, 63, "count"))
    if int(s0) + c > 1 << 64:
        raise ValueError("start + count exceeds the 2**64 words of a stream")
    out = cuda.device_array(c, dtype=np.uint32)
    if c:
        nblocks = (int(s0) % 4 + c + 3) // 4
        R.words_k[blocks(nblocks), THREADS](k0, k1, sb, st, s0, out)
    return out.copy_to_host()


def unit(w):
    """[rng.unit.c1] uint32 word(s) -> float32 in [0, 1)."""
    return _elementwise(R.unit_k, np.float32, _scalar_or_array("w", w, np.uint32))


def symmetric(w, a):
    """[rng.symmetric.c1] uint32 word(s) -> float32 uniform in [-a, a)."""
    a32 = _scale(a)
    x = _scalar_or_array("w", w, np.uint32)
    flat = x.reshape(-1)
    out = cuda.device_array(flat.size, dtype=np.float32)
    if flat.size:
        R.symmetric_k[blocks(flat.size), THREADS](cuda.to_device(flat), a32, out)
    res = out.copy_to_host().reshape(x.shape)
    return res[()] if res.ndim == 0 else res


def init_uniform(seed, name, shape, a):
    """[rng.init.c1] Initial value of parameter ``name`` (float32 of ``shape``)."""
    from refreplay.rng import name_tag
    k0, k1 = _key(seed)
    tag = np.uint64(name_tag(name))
    dims = tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise ValueError(f"shape must be non-negative, got {shape!r}")
    n = int(np.prod(dims, dtype=np.int64)) if dims else 1
    out = cuda.device_array(n, dtype=np.float32)
    if n:
        R.init_uniform_k[blocks((n + 3) // 4), THREADS](k0, k1, tag, _scale(a), out)
    return out.copy_to_host().reshape(dims)


# ---- TreeFold (spec chapter 22) ----------------------------------------------------

def fold_rows(leaves, ranks=1):
    """[fold.tree.c1] [fold.final.c1] [fold.ranks.c1] TreeFold of the M rows of an
    M×N float32 array split over ``ranks`` ranks -> (N,) unscaled sum."""
    X = _array("leaves", leaves, ndim=2)
    M, n = X.shape
    if not isinstance(ranks, (int, np.integer)) or not 1 <= ranks <= M:
        raise ValueError(f"fold_rows: need 1 <= ranks <= M = {M}, got {ranks!r}")
    out = cuda.device_array(n, dtype=np.float32)
    if n:
        T.fold_rows_k[blocks(n), THREADS](cuda.to_device(X), int(ranks), out)
    return out.copy_to_host()


def merge(left, right):
    """[fold.tree.c1] One tree node: add(left, right) elementwise (dicts name by name)."""
    if isinstance(left, dict):
        if not isinstance(right, dict) or sorted(left) != sorted(right):
            raise ValueError("merge: leaves must have the same tensor names")
        return {k: merge(left[k], right[k]) for k in sorted(left)}
    return add(_array("left", left), _array("right", right))


def scale(value, m):
    """[fold.scale.c1] Every element times recip(f32(M))."""
    if not isinstance(m, (int, np.integer)) or m < 1:
        raise ValueError(f"scale: micro-batch count must be a positive integer, got {m!r}")
    if isinstance(value, dict):
        return {k: scale(value[k], m) for k in sorted(value)}
    x = _array("value", value)
    flat = x.reshape(-1)
    out = cuda.device_array(flat.size, dtype=np.float32)
    if flat.size:
        T.scale_k[blocks(flat.size), THREADS](cuda.to_device(flat), int(m), out)
    return out.copy_to_host().reshape(x.shape)


# ---- ops: norms (spec chapter 11) --------------------------------------------------

def _f32_args(**arrays):
    """Validate named float32 arrays with their expected shapes (refreplay.ops' checks)."""
    from refreplay.ops import check_f32, check_shape
    for name, (a, shape) in arrays.items():
        check_f32(name, a, len(shape))
        check_shape(name, a, shape)


def _norm_rows(x):
    from refreplay.ops import check_f32
    check_f32("x", x, 2)
    N, C = x.shape
    if C < 1 or C > 1 << 24:
        raise ValueError(f"x must have 1 <= C <= 2**24 channels, got {C}")
    return N, C


def _eps(eps):
    from refreplay.ops import check_scalar_f32
    return check_scalar_f32("eps", eps)


def _launch_rows(kernel, n, *args):
    """Launch a one-thread-per-row (or per-column) kernel over n threads."""
    if n:
        kernel[blocks(n), THREADS](*args)


def layernorm_forward(x, w, b, eps=np.float32(1e-5)):
    """[norm.layer.fwd.c1] x [N, C], w, b [C] -> (out [N, C], mean [N], rstd [N])."""
    N, C = _norm_rows(x)
    _f32_args(w=(w, (C,)), b=(b, (C,)))
    eps = _eps(eps)
    out, mean, rstd = (cuda.device_array(s, np.float32) for s in ((N, C), N, N))
    _launch_rows(NORM.layernorm_forward_k, N, out, mean, rstd, cuda.to_device(x),
                 cuda.to_device(w), cuda.to_device(b), eps)
    return out.copy_to_host(), mean.copy_to_host(), rstd.copy_to_host()


def layernorm_backward(dout, x, w, mean, rstd):
    """[norm.layer.bwd.c1] -> (dx [N, C], dw [C], db [C])."""
    N, C = _norm_rows(x)
    _f32_args(dout=(dout, (N, C)), w=(w, (C,)), mean=(mean, (N,)), rstd=(rstd, (N,)))
    d_dout, d_x, d_mean, d_rstd = (cuda.to_device(a) for a in (dout, x, mean, rstd))
    dx, dw, db = (cuda.device_array(s, np.float32) for s in ((N, C), C, C))
    _launch_rows(NORM.layernorm_backward_dx_k, N, dx, d_dout, d_x, cuda.to_device(w), d_mean, d_rstd)
    _launch_rows(NORM.layernorm_backward_dwdb_k, C, dw, db, d_dout, d_x, d_mean, d_rstd)
    return dx.copy_to_host(), dw.copy_to_host(), db.copy_to_host()


def rmsnorm_forward(x, w, eps=np.float32(1e-5)):
    """[norm.rms.fwd.c1] x [N, C], w [C] -> (out [N, C], rrms [N])."""
    N, C = _norm_rows(x)
    _f32_args(w=(w, (C,)))
    eps = _eps(eps)
    out, rrms = cuda.device_array((N, C), np.float32), cuda.device_array(N, np.float32)
    _launch_rows(NORM.rmsnorm_forward_k, N, out, rrms, cuda.to_device(x), cuda.to_device(w), eps)
    return out.copy_to_host(), rrms.copy_to_host()


def rmsnorm_backward(dout, x, w, rrms):
    """[norm.rms.bwd.c1] -> (dx [N, C], dw [C])."""
    N, C = _norm_rows(x)
    _f32_args(dout=(dout, (N, C)), w=(w, (C,)), rrms=(rrms, (N,)))
    d_dout, d_x, d_rrms = (cuda.to_device(a) for a in (dout, x, rrms))
    dx, dw = cuda.device_array((N, C), np.float32), cuda.device_array(C, np.float32)
    _launch_rows(NORM.rmsnorm_backward_dx_k, N, dx, d_dout, d_x, cuda.to_device(w), d_rrms)
    _launch_rows(NORM.rmsnorm_backward_dw_k, C, dw, d_dout, d_x, d_rrms)
    return dx.copy_to_host(), dw.copy_to_host()


# ---- ops: embedding and linear (spec chapter 10) ---------------------------------

def _tokens(tokens, V):
    from refreplay.errors import InputError
    from refreplay.ops import check_array
    check_array("tokens", tokens, np.int32, 2)
    if tokens.size and (tokens.min() < 0 or tokens.max() >= V):
        bad = tokens[(tokens < 0) | (tokens >= V)][0]
        raise InputError(f"token id {int(bad)} outside the vocabulary [0, {V})")
    return tokens


def embedding_forward(wte, tokens):
    """[emb.fwd.c1] wte [V, C], tokens [B, T] int32 -> out [B, T, C]."""
    from refreplay.ops import check_f32
    from .ops import embedding as EMB
    check_f32("wte", wte, 2)
    V, C = wte.shape
    B, T = _tokens(tokens, V).shape
    out = cuda.device_array((B * T, C), np.float32)
    if out.size:
        EMB.embedding_forward_k[blocks(out.size), THREADS](out, cuda.to_device(wte),
                                                           cuda.to_device(tokens.reshape(-1)))
    return out.copy_to_host().reshape(B, T, C)


def embedding_backward(dout, tokens, V):
    """[emb.bwd.c1] dout [B, T, C], tokens [B, T] int32 -> dwte [V, C] (ordered scatter-add)."""
    from refreplay.ops import check_f32, check_shape
    from .ops import embedding as EMB
    check_f32("dout", dout, 3)
    if isinstance(V, bool) or not isinstance(V, (int, np.integer)) or V < 1:
        raise ValueError(f"V must be a positive integer, got {V!r}")
    V = int(V)
    B, T, C = dout.shape
    _tokens(tokens, V)
    check_shape("tokens", tokens, (B, T))
    dwte = cuda.device_array((V, C), np.float32)
    seen = cuda.device_array(V, np.uint8)
    if dwte.size:
        EMB.embedding_backward_init_k[blocks(dwte.size), THREADS](dwte, seen)
        if B * T:
            EMB.embedding_backward_k[blocks(C), THREADS](dwte, cuda.to_device(dout.reshape(B * T, C)),
                                                         cuda.to_device(tokens.reshape(-1)), seen)
        EMB.embedding_backward_unseen_k[blocks(dwte.size), THREADS](dwte, seen)
    return dwte.copy_to_host()


def linear_forward(x, W, b=None):
    """[linear.fwd.c1] x [N, C], W [OC, C], b [OC] or None -> y = x·Wᵀ (+ b after the sum)."""
    from refreplay.ops import check_f32, check_shape
    check_f32("x", x, 2), check_f32("W", W, 2)
    check_shape("W", W, (W.shape[0], x.shape[1]))
    if b is not None:
        check_f32("b", b, 1), check_shape("b", b, (W.shape[0],))
    y = matmul_nt(x, W)  # [mm.nt.c1]
    return bias_add(y, b) if b is not None else y  # [mm.bias.c1]


def linear_backward(dy, x, W, has_bias=True):
    """[linear.bwd.c1] -> (dx = dy·W, dW = dyᵀ·x, db = col_sum(dy) or None)."""
    from refreplay.ops import check_f32, check_shape
    check_f32("dy", dy, 2), check_f32("x", x, 2), check_f32("W", W, 2)
    check_shape("W", W, (W.shape[0], x.shape[1]))
    check_shape("dy", dy, (x.shape[0], W.shape[0]))
    return matmul(dy, W), matmul_tn(dy, x), col_sum(dy) if has_bias else None


# ---- ops: activations (spec chapter 12) and softmax (chapter 13) ------------------

def _same_shape(**arrays):
    """float32 C-contiguous arrays of one shape (refreplay.ops' checks); returns it."""
    from refreplay.ops import check_array
    shape = None
    for name, a in arrays.items():
        if not isinstance(a, np.ndarray):
            raise TypeError(f"{name} must be a numpy array, got {type(a).__name__}")
        check_array(name, a, np.float32, a.ndim)
        if shape is None:
            shape = a.shape
        elif a.shape != shape:
            raise ValueError(f"{name} has shape {a.shape}, expected {shape}")
    return shape


def _map(kernel_name, n_out, **inputs):
    """Run an elementwise op kernel over flattened same-shape inputs -> n_out arrays."""
    from .ops import activations as ACT
    shape = _same_shape(**inputs)
    n = int(np.prod(shape, dtype=np.int64))
    outs = [cuda.device_array(n, np.float32) for _ in range(n_out)]
    if n:
        getattr(ACT, kernel_name)[blocks(n), THREADS](*outs, *(cuda.to_device(a.reshape(-1))
                                                              for a in inputs.values()))
    res = tuple(o.copy_to_host().reshape(shape) for o in outs)
    return res if n_out > 1 else res[0]


def gelu_forward(x):
    """[act.gelu.fwd.c1] x (any shape) -> out."""
    return _map("gelu_forward_k", 1, x=x)


def gelu_backward(dout, x):
    """[act.gelu.bwd.c1] (dout, x) -> dx."""
    return _map("gelu_backward_k", 1, dout=dout, x=x)


def silu_forward(x):
    """[act.silu.fwd.c1] x -> out."""
    return _map("silu_forward_k", 1, x=x)


def silu_backward(dout, x):
    """[act.silu.bwd.c1] (dout, x) -> dx."""
    return _map("silu_backward_k", 1, dout=dout, x=x)


def swiglu_forward(a, b):
    """[act.swiglu.fwd.c1] gate a, value b -> out."""
    return _map("swiglu_forward_k", 1, a=a, b=b)


def swiglu_backward(dout, a, b):
    """[act.swiglu.bwd.c1] (dout, a, b) -> (da, db)."""
    return _map("swiglu_backward_k", 2, dout=dout, a=a, b=b)


def _softmax_rows(kernel_name, **inputs):
    """Row kernel over the last axis of same-shape inputs (leading axes flattened)."""
    from .ops import softmax as SM
    shape = _same_shape(**inputs)
    if len(shape) < 1 or shape[-1] < 1:
        raise ValueError(f"needs a non-empty last axis, got shape {shape}")
    rows = [cuda.to_device(a.reshape(-1, shape[-1])) for a in inputs.values()]
    out = cuda.device_array(rows[0].shape, np.float32)
    if rows[0].shape[0]:
        getattr(SM, kernel_name)[blocks(rows[0].shape[0]), THREADS](*rows, out)
    return out.copy_to_host().reshape(shape)


def softmax_forward(x):
    """[softmax.fwd.c1] softmax over the last axis."""
    return _softmax_rows("softmax_forward_k", x=x)


def softmax_backward(dy, y):
    """[softmax.bwd.c1] dx from dy and the forward output y."""
    return _softmax_rows("softmax_backward_k", dy=dy, y=y)


def log_softmax_forward(x):
    """[softmax.log.c1] log-softmax over the last axis."""
    return _softmax_rows("log_softmax_forward_k", x=x)


def log_softmax_backward(dy, y):
    """[softmax.log.bwd.c1] dx from dy and the forward output y."""
    return _softmax_rows("log_softmax_backward_k", dy=dy, y=y)


# ---- ops: rotary embedding and causal attention (spec chapter 13) ----------------

MAX_T = 2 ** 14 + 1  # [rope.freq.c1] angles stay in the domain of sin and cos


def rope_tables(T, HS, theta=np.float32(10000.0)):
    """[rope.freq.c1] (cos [T, HS/2], sin [T, HS/2]) for positions 0 .. T-1."""
    from .ops import rope as RO
    if not (isinstance(T, (int, np.integer)) and isinstance(HS, (int, np.integer))):
        raise TypeError("T and HS must be integers")
    if T < 1 or T > MAX_T or HS < 2 or HS % 2:
        raise ValueError(f"need 1 <= T <= {MAX_T} and an even HS >= 2, got T={T}, HS={HS}")
    theta = np.float32(theta)
    if not (theta > 1 and np.isfinite(theta)):
        raise ValueError(f"theta must be a finite float32 > 1, got {theta}")
    cos_t, sin_t = (cuda.device_array((T, HS // 2), np.float32) for _ in range(2))
    RO.rope_tables_k[blocks(T * (HS // 2)), THREADS](theta, int(HS), cos_t, sin_t)
    return cos_t.copy_to_host(), sin_t.copy_to_host()


def _rope(kernel_name, name, x, cos_t, sin_t):
    from .ops import rope as RO
    _qcheck(name, x, 4)
    T, HS = x.shape[2], x.shape[3]
    for tname, tab in (("cos", cos_t), ("sin", sin_t)):
        _qcheck(f"{tname} table", tab, 2)
        if HS % 2 or tab.shape[0] < T or tab.shape[1] != HS // 2:
            raise ValueError(f"{tname} table of shape {tab.shape} does not fit {name} of shape {x.shape}")
    out = cuda.device_array(x.shape, np.float32)
    _each(getattr(RO, kernel_name), x.size // 2, cuda.to_device(x), cuda.to_device(cos_t),
          cuda.to_device(sin_t), out)
    return out.copy_to_host()


def rope_forward(x, cos_t, sin_t):
    """[rope.fwd.c1] rotate x [B, NH, T, HS] (half-split pairs)."""
    return _rope("rope_forward_k", "x", x, cos_t, sin_t)


def rope_backward(dout, cos_t, sin_t):
    """[rope.bwd.c1] dx from dout [B, NH, T, HS]."""
    return _rope("rope_backward_k", "dout", dout, cos_t, sin_t)


def attention_scale(HS):
    """[attn.scores.c1] recip(sqrt(f32(HS)))."""
    return recip(sqrt(np.float32(HS)))


def _heads(shape=None, **arrays):
    for name, a in arrays.items():
        _qcheck(name, a, 4)
        shape = shape or a.shape
        if a.shape != shape:
            raise ValueError(f"{name} has shape {a.shape}, expected {shape}")
    if min(shape) < 1:
        raise ValueError(f"empty attention shape {shape}")
    return shape


def attention_forward(q, k, v):
    """[attn.scores.c1] [attn.mask.c1] [attn.out.c1] q, k, v [B, NH, T, HS] -> (out, att [B, NH, T, T])."""
    from .ops import attention as AT
    B, NH, T, HS = _heads(q=q, k=k, v=v)
    out = cuda.device_array(q.shape, np.float32)
    att = cuda.device_array((B, NH, T, T), np.float32)
    _each(AT.attention_forward_k, B * NH * T, cuda.to_device(q), cuda.to_device(k), cuda.to_device(v),
          attention_scale(HS), out, att)
    return out.copy_to_host(), att.copy_to_host()


def attention_backward(dout, q, k, v, att):
    """[attn.bwd.c1] -> (dq, dk, dv), each [B, NH, T, HS]."""
    from .ops import attention as AT
    B, NH, T, HS = _heads(dout=dout, q=q, k=k, v=v)
    _heads((B, NH, T, T), att=att)
    d_dout, d_q, d_att = cuda.to_device(dout), cuda.to_device(q), cuda.to_device(att)
    dz = cuda.device_array((B, NH, T, T), np.float32)
    dq, dk, dv = (cuda.device_array(q.shape, np.float32) for _ in range(3))
    _each(AT.attention_backward_rows_k, B * NH * T, d_dout, d_q, cuda.to_device(k), cuda.to_device(v),
          d_att, attention_scale(HS), dz, dq)
    _each(AT.attention_backward_keys_k, q.size, d_dout, d_q, d_att, dz, dk, dv)
    return dq.copy_to_host(), dk.copy_to_host(), dv.copy_to_host()


# ---- ops: cross-entropy (spec chapter 14) and the optimizer (chapter 15) ----------

def _one_thread(kernel, *args):
    kernel[1, 1](*args)


def cross_entropy_forward(logits, targets, ignore_index=-1):
    """[loss.token.c1] [loss.mean.c1] -> (losses [N], mean, count)."""
    from refreplay.ops import loss as ref
    from .ops import loss as LO
    ref._check(logits, targets, ignore_index)  # the reference's validation, errors and all
    N = logits.shape[0]
    d_targets = cuda.to_device(targets)
    losses = cuda.device_array(N, np.float32)
    _each(LO.cross_entropy_k, N, cuda.to_device(logits), d_targets, int(ignore_index), losses)
    mean, count = cuda.device_array(1, np.float32), cuda.device_array(1, np.int64)
    _one_thread(LO.masked_mean_k, losses, d_targets, int(ignore_index), mean, count)
    return losses.copy_to_host(), mean.copy_to_host()[0], int(count.copy_to_host()[0])


def cross_entropy_backward(logits, targets, dloss=np.float32(1.0), count=None, ignore_index=-1):
    """[loss.bwd.c1] dlogits [N, V] of dloss * mean-loss over ``count`` tokens."""
    from refreplay.ops import loss as ref
    from .ops import loss as LO
    ref._check(logits, targets, ignore_index)
    counted = int(np.count_nonzero(targets != ignore_index))
    count = counted if count is None else int(count)
    if count < counted or count > ref.MAX_COUNT:
        raise ValueError(f"count {count} must lie in [{counted}, 2^24]")
    c = mul(np.float32(dloss), recip(np.float32(count))) if count else np.float32(0.0)
    dlogits = cuda.device_array(logits.shape, np.float32)
    _each(LO.cross_entropy_backward_k, logits.shape[0], cuda.to_device(logits), cuda.to_device(targets),
          int(ignore_index), np.float32(c), dlogits)
    return dlogits.copy_to_host()


def adamw_bias_corrections(beta1, beta2, t):
    """[optim.adamw.bias.c1] (recip(1 - beta1^t), recip(1 - beta2^t))."""
    from .ops import optim as OP
    out = cuda.device_array(2, np.float32)
    _one_thread(OP.adamw_bias_corrections_k, np.float32(beta1), np.float32(beta2), int(t), out)
    rbc = out.copy_to_host()
    return rbc[0], rbc[1]


def adamw_step(params, grads, m, v, *, step, lr, hp=None, no_decay=frozenset()):
    """[optim.adamw.c1] Update ``params``, ``m``, ``v`` (dicts of host arrays) in place,
    tensors in sorted name order ([optim.state.c1])."""
    from refreplay.ops import check_scalar_f32
    from refreplay.ops import optim as ref
    from .ops import optim as OP
    hp = ref.AdamW() if hp is None else hp
    ref._check_state(params, grads=grads, m=m, v=v)
    t = ref._check_step(step)
    lr = check_scalar_f32("lr", lr)
    unknown = set(no_decay) - set(params)
    if unknown:
        raise ValueError(f"no_decay names unknown parameters: {sorted(unknown)}")
    rbc1, rbc2 = adamw_bias_corrections(hp.beta1, hp.beta2, t)
    for k in sorted(params):
        wd = np.float32(0.0) if k in no_decay else hp.weight_decay
        dp, dm, dv = (cuda.to_device(a[k].reshape(-1)) for a in (params, m, v))
        _each(OP.adamw_k, params[k].size, dp, cuda.to_device(grads[k].reshape(-1)), dm, dv,
              lr, hp.beta1, hp.beta2, hp.eps, wd, rbc1, rbc2)
        for a, d in ((params, dp), (m, dm), (v, dv)):
            a[k].reshape(-1)[:] = d.copy_to_host()


def adamw_update(p, g, m, v, step, lr, hp=None, decay=True):
    """[optim.adamw.c1] One tensor's AdamW update as new arrays -> (p', m', v')."""
    p2, m2, v2 = p.copy(), m.copy(), v.copy()
    adamw_step({"t": p2}, {"t": g}, {"t": m2}, {"t": v2}, step=step, lr=lr, hp=hp,
               no_decay=frozenset() if decay else frozenset({"t"}))
    return p2, m2, v2


def sum_of_squares(g):
    """[optim.clip.c1] step 1: sum over i increasing of g[i]*g[i] (1-D float32)."""
    from .ops import optim as OP
    out = cuda.device_array(1, np.float32)
    _one_thread(OP.sum_of_squares_k, cuda.to_device(_qcheck("g", g, 1)), out, 0)
    return out.copy_to_host()[0]


def clip_coefficient(partials, max_norm):
    """[optim.clip.c1] steps 2-4: (norm, coef) from the per-tensor sums in name order."""
    from .ops import optim as OP
    out = cuda.device_array(2, np.float32)
    _one_thread(OP.clip_coefficient_k, cuda.to_device(_qcheck("partials", partials, 1)),
                np.float32(max_norm), out)
    r = out.copy_to_host()
    return r[0], r[1]


def clip_grad_norm(grads, max_norm):
    """[optim.clip.c1] Global-norm clipping of ``grads`` (dict of host arrays), in place -> (norm, coef)."""
    from refreplay.ops import check_scalar_f32
    from refreplay.ops import optim as ref
    from .ops import optim as OP
    ref._check_state(grads)
    max_norm = check_scalar_f32("max_norm", max_norm)
    names = sorted(grads)
    d_grads = {k: cuda.to_device(grads[k].reshape(-1)) for k in names}
    partials = cuda.device_array(len(names), np.float32)
    for j, k in enumerate(names):
        _one_thread(OP.sum_of_squares_k, d_grads[k], partials, j)
    out = cuda.device_array(2, np.float32)
    _one_thread(OP.clip_coefficient_k, partials, max_norm, out)
    norm, coef = out.copy_to_host()
    if coef < np.float32(1.0):
        for k in names:
            _each(OP.clip_scale_k, grads[k].size, d_grads[k], coef)
            grads[k].reshape(-1)[:] = d_grads[k].copy_to_host()
    return norm, coef


def lr_at(step, warmup, total, lr_max, lr_min, kind="cosine"):
    """[optim.lr.c1] Learning rate of update ``step`` (1-based)."""
    from refreplay.ops import check_scalar_f32
    from refreplay.ops import optim as ref
    from .ops import optim as OP
    t = ref._check_step(step)
    for name, n in (("warmup", warmup), ("total", total)):
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 0 <= n <= 1 << 24:
            raise ValueError(f"{name} must be an integer in [0, 2**24], got {n!r}")
    if not warmup < total:
        raise ValueError(f"need warmup < total, got warmup={warmup}, total={total}")
    if kind not in ref.SCHEDULES:
        raise ValueError(f"kind must be one of {ref.SCHEDULES}, got {kind!r}")
    lr_max, lr_min = check_scalar_f32("lr_max", lr_max), check_scalar_f32("lr_min", lr_min)
    out = cuda.device_array(1, np.float32)
    _one_thread(OP.lr_k, t, int(warmup), int(total), lr_max, lr_min, ref.SCHEDULES.index(kind), out)
    return out.copy_to_host()[0]


# ---- ops: int8 quantization-aware linear (spec chapter 16) -------------------------

def _qcheck(name, a, ndim=None):
    if not isinstance(a, np.ndarray) or a.dtype != np.float32:
        raise TypeError(f"{name} must be a float32 ndarray")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous")
    if ndim is not None and a.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {a.shape}")
    return a


def _qrows(x, s):
    """x as rows with one step per row: s scalar (one row) or s [R] (R = x.shape[0])."""
    s = np.asarray(s)
    if s.dtype != np.float32:
        raise TypeError("s must be float32")
    if s.ndim == 0:
        return x.reshape(1, -1), s.reshape(1)
    if s.ndim != 1 or x.ndim < 1 or x.shape[0] != s.shape[0]:
        raise ValueError(f"s of shape {s.shape} does not match x of shape {x.shape}")
    return x.reshape(x.shape[0], -1), np.ascontiguousarray(s)


def _each(kernel, n, *args):
    if n:
        kernel[blocks(n), THREADS](*args)


def step_size_rows(x):
    """[quant.step.c1] One re-pinned step per row: x [R, K] -> s [R]."""
    from .ops import quant as Q
    _qcheck("x", x, 2)
    s = cuda.device_array(x.shape[0], np.float32)
    _each(Q.step_rows_k, x.shape[0], cuda.to_device(x), s)
    return s.copy_to_host()


def step_size(x):
    """[quant.step.c1] The re-pinned step size of a whole tensor (any shape)."""
    _qcheck("x", x)
    return step_size_rows(x.reshape(1, -1))[0]


def quantize(x, s):
    """[quant.quantize.c1] int8 codes of x with step s (scalar, or one per first-axis index)."""
    from .ops import quant as Q
    _qcheck("x", x)
    x2, s1 = _qrows(x, s)
    q = cuda.device_array(x2.shape, np.int8)
    _each(Q.quantize_rows_k, x2.size, cuda.to_device(x2), cuda.to_device(s1), q)
    return q.copy_to_host().reshape(x.shape)


def dequantize(q, s):
    """[quant.dequantize.c1] f32(q) * s (s scalar or per first-axis index)."""
    from .ops import quant as Q
    if not isinstance(q, np.ndarray) or q.dtype != np.int8 or not q.flags.c_contiguous:
        raise TypeError("q must be a C-contiguous int8 ndarray")
    q2, s1 = _qrows(q, s)
    out = cuda.device_array(q2.shape, np.float32)
    _each(Q.dequantize_rows_k, q2.size, cuda.to_device(q2), cuda.to_device(s1), out)
    return out.copy_to_host().reshape(q.shape)


def fake_quantize(x, s):
    """[quant.quantize.c1] [quant.dequantize.c1] dequantize(quantize(x, s), s)."""
    return dequantize(quantize(x, s), s)


def _ste(x2, s1, g2):
    """[quant.ste.c1] g2 (rows like x2) with saturated codes' gradients set to +0, on the host."""
    from .ops import quant as Q
    d_g = cuda.to_device(g2)
    _each(Q.ste_mask_rows_k, x2.size, cuda.to_device(x2), cuda.to_device(s1), d_g)
    return d_g.copy_to_host()


def fake_quantize_backward(dy, x, s):
    """[quant.ste.c1] dy where x's code is not saturated, +0 where it is."""
    _qcheck("dy", dy), _qcheck("x", x)
    if dy.shape != x.shape:
        raise ValueError(f"dy has shape {dy.shape}, x has {x.shape}")
    x2, s1 = _qrows(x, s)
    return _ste(x2, s1, dy.reshape(x2.shape)).reshape(dy.shape)


def _qlinear_check(x, w, b):
    _qcheck("x", x, 3), _qcheck("w", w, 2)
    B, T, C = x.shape
    OC = w.shape[0]
    if w.shape[1] != C:
        raise ValueError(f"w has shape {w.shape}, expected (OC, {C})")
    if C > I8_MAX_K:
        raise ValueError(f"C = {C} exceeds {I8_MAX_K}: the int32 accumulator could overflow")
    if b is not None:
        _qcheck("b", b, 1)
        if b.shape[0] != OC:
            raise ValueError(f"b has shape {b.shape}, expected ({OC},)")
    return B, T, C, OC


def _qoperands(x, w):
    """[quant.granularity.c1] steps per sequence and per output channel, and the codes."""
    B, T, C = x.shape
    sx = step_size_rows(x.reshape(B, T * C))
    sw = step_size_rows(w)
    return sx, sw, quantize(x, sx).reshape(B * T, C), quantize(w, sw)


def qlinear_forward(x, w, b=None):
    """[quant.linear.fwd.c1] x [B, T, C], w [OC, C], b [OC] or None -> y [B, T, OC]."""
    from .ops import quant as Q
    B, T, C, OC = _qlinear_check(x, w, b)
    sx, sw, qx, qw = _qoperands(x, w)
    acc = matmul_i8(qx, np.ascontiguousarray(qw.T))  # [mm.i8.c1], exact
    y = cuda.device_array((B * T, OC), np.float32)
    bias = b if b is not None else np.zeros(OC, np.float32)
    _each(Q.rescale_k, B * T * OC, cuda.to_device(acc), cuda.to_device(sx), cuda.to_device(sw),
          cuda.to_device(bias), b is not None, T, y)
    return y.copy_to_host().reshape(B, T, OC)


def qlinear_backward(dy, x, w, has_bias=True):
    """[quant.linear.bwd.c1] -> (dx [B, T, C], dw [OC, C], db [OC] or None), binary32 with STE."""
    B, T, C, OC = _qlinear_check(x, w, None)
    _qcheck("dy", dy, 3)
    if dy.shape != (B, T, OC):
        raise ValueError(f"dy has shape {dy.shape}, expected {(B, T, OC)}")
    sx, sw, qx, qw = _qoperands(x, w)
    xd = dequantize(qx.reshape(B, T * C), sx).reshape(B * T, C)
    wd = dequantize(qw, sw)
    dy2 = dy.reshape(B * T, OC)
    dx = _ste(x.reshape(B, T * C), sx, matmul(dy2, wd).reshape(B, T * C))
    dw = _ste(w, sw, matmul_tn(dy2, xd))
    return dx.reshape(B, T, C), dw, col_sum(dy2) if has_bias else None


# ---- tables --------------------------------------------------------------------

# Conformance registry op name -> device function, same positional inputs and outputs
# (inputs already loaded, [num.load.c1]).
OPS = {
    "add": add, "sub": sub, "mul": mul, "recip": recip, "sqrt": sqrt,
    "fmax": fmax, "fmin": fmin, "rint": rint,
    "exp": exp, "log": log, "tanh": tanh, "sigmoid": sigmoid, "sin": sin, "cos": cos,
    "sum": row_sum,
    "col_sum": col_sum,
    "max": row_max,
    "dot": lambda x, y: matmul(x[None, :], np.ascontiguousarray(y[:, None])).reshape(1),
    "matmul": matmul,
    "matmul_nt": matmul_nt,
    "matmul_tn": matmul_tn,
    "matmul_i8": matmul_i8,
}

# Reference function name (relative to ``refreplay``) -> device function, for the
# spec's worked examples.
EXAMPLE_FUNCTIONS = {
    "numerics.load": load, "numerics.add": add, "numerics.sub": sub, "numerics.mul": mul,
    "numerics.recip": recip, "numerics.sqrt": sqrt, "numerics.fmax": fmax, "numerics.fmin": fmin,
    "numerics.rint": rint, "numerics.saturate_i8": saturate_i8,
    "numerics.exp": exp, "numerics.log": log, "numerics.tanh": tanh, "numerics.sigmoid": sigmoid,
    "numerics.sin": sin, "numerics.cos": cos,
    **{f"numerics.elementwise.{f.__name__}": f
       for f in (add, sub, mul, recip, sqrt, fmax, fmin, rint, exp, log, tanh, sigmoid, sin, cos)},
    "linalg.matmul": matmul, "linalg.matmul_nt": matmul_nt, "linalg.matmul_tn": matmul_tn,
    "linalg.bias_add": bias_add, "linalg.row_sum": row_sum, "linalg.col_sum": col_sum,
    "linalg.row_max": row_max, "linalg.matmul_i8": matmul_i8,
    "rng.philox4x32": philox4x32, "rng.philox4x32_10": philox4x32_10, "rng.words": words,
    "rng.unit": unit, "rng.symmetric": symmetric, "rng.init_uniform": init_uniform,
    "treefold.fold_rows": fold_rows, "treefold.scale": scale, "treefold.merge": merge,
    "ops.embedding.embedding_forward": embedding_forward,
    "ops.embedding.embedding_backward": embedding_backward,
    "ops.linear.linear_forward": linear_forward, "ops.linear.linear_backward": linear_backward,
    **{f"ops.rope.{f.__name__}": f for f in (rope_tables, rope_forward, rope_backward)},
    **{f"ops.attention.{f.__name__}": f for f in (attention_scale, attention_forward, attention_backward)},
    **{f"ops.loss.{f.__name__}": f for f in (cross_entropy_forward, cross_entropy_backward)},
    **{f"ops.optim.{f.__name__}": f
       for f in (adamw_bias_corrections, adamw_update, sum_of_squares, clip_coefficient, lr_at)},
    **{f"ops.quant.{f.__name__}": f
       for f in (step_size, step_size_rows, quantize, dequantize, fake_quantize,
                 fake_quantize_backward, qlinear_forward, qlinear_backward)},
    "ops.norms.layernorm_forward": layernorm_forward, "ops.norms.layernorm_backward": layernorm_backward,
    "ops.norms.rmsnorm_forward": rmsnorm_forward, "ops.norms.rmsnorm_backward": rmsnorm_backward,
    **{f"ops.activations.{f.__name__}": f
       for f in (gelu_forward, gelu_backward, silu_forward, silu_backward, swiglu_forward, swiglu_backward)},
    **{f"ops.softmax.{f.__name__}": f
       for f in (softmax_forward, softmax_backward, log_softmax_forward, log_softmax_backward)},
}


def conform_op(op_name, *inputs):
    """The conformance runner's entry: ``refreplay conform cuda_backend.adapter:conform_op``.

    Inputs arrive as stored in the vectors; float32 ones are loaded on the
    device first ([num.load.c1]: subnormals zeroed, NaN canonical), as the
    reference does.  An op the device does not cover raises
    ``NotImplementedError`` (the runner reports its cases as skipped).
    """
    fn = OPS.get(op_name)
    if fn is None:
        raise NotImplementedError(f"cuda_backend has no kernel for {op_name}")
    return fn(*[load(x) if x.dtype == np.float32 else x for x in inputs])
