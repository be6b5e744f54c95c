"""What the compiler does not find on its own: the 8 x 8 transpose and the
4 x 16 interleave, lane arrays it can keep in registers, whole-lane vector
arithmetic and copies, and a prefetch hint.

The row kernels (``ops/rowblock.py``) copy a block of rows into a tile with
rows and columns swapped, so that the sequential sums of 32 rows can run
side by side in SIMD lanes.  Written as loops, that copy is a gather: LLVM
moves one element at a time, and at C = 768 the copies took about half of
LayerNorm's time.  ``transpose8`` moves an 8 x 8 block with 8 vector loads,
24 shuffles and 8 vector stores instead (about 3x faster per element here).

It moves bits and computes nothing: no value is rounded, flushed or
compared, so it cannot change a result bit, and it cites no clause.  The
shuffles are written in LLVM's generic vector IR, which every target lowers
(AVX on x86, NEON on AArch64); tests/test_rowblock.py checks every position
against the element-by-element copy.

``stack_lanes(n)`` is a float32 array of n (a literal) elements on the
stack.  A row kernel's accumulators (one per lane, RB of them) live in such
an array: LLVM knows that nothing else can point into it, so once the lane
loops are unrolled it keeps the lanes in vector registers.  In a heap array
(``np.zeros``) every step of every chain went through memory, a store and a
load between two adds, which made a 32-lane chain about twice as slow.  It
changes where a value is kept, never an operation.  ``stack_keys`` is the
same for uint32 (per-lane minima of bit patterns).

``lanes_add``, ``lanes_sub`` and ``lanes_mul`` apply one IEEE binary32
operation to n lanes at once, as one LLVM vector operation (no fast-math
flag: each lane rounded once, to nearest, never contracted), and flush
nothing.  They serve a row kernel's flush-free form, where the kernel has
proved every flush an identity ([mm.flush.r1], ``ops/norms.py``).  The same
chains written as loops over stack lanes are unrolled by LLVM into n scalar
operations a step.  A stack array that both such loops and these vectors
touch is left in memory by LLVM: give each form lanes of its own.
``lanes_key_min`` takes per-lane minima of |x|'s bit patterns (integer
operations only) in the same pass.  tests/test_lanes.py checks them
against NumPy's float32 arithmetic on random bit patterns.

``lanes_copy`` moves n lanes' bits as one vector (the matmul's packs).
``interleave4`` moves a 4 x 16 block into 16 groups of 4 (4 vector loads,
8 shuffles, 4 stores): attention packs its 4-row A strips with it, which
element by element took as long as the tiles that read them.

``prefetch(X, i, j)`` asks the cache for the line that holds X[i, j]: a hint
that moves no value.  ``claim(counter)`` is an atomic fetch-and-add, by
which the parts of a parallel region share out their items of work.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from ._jit import kernel

_N = 8
_VEC = ir.VectorType(ir.FloatType(), _N)
_IDX = ir.VectorType(ir.IntType(32), _N)

# The three shuffle stages of an 8 x 8 transpose: interleave single lanes,
# then pairs, then quadruples.  A stage's step (a, b, lo, hi) shuffles
# vectors a and b (indices into their concatenation) into the new vectors
# lo and hi.
_LO1, _HI1 = [0, 8, 1, 9, 4, 12, 5, 13], [2, 10, 3, 11, 6, 14, 7, 15]
_LO2, _HI2 = [0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15]
_LO3, _HI3 = [0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]
_STAGES = (
    ((_LO1, _HI1), ((0, 1, 0, 1), (2, 3, 2, 3), (4, 5, 4, 5), (6, 7, 6, 7))),
    ((_LO2, _HI2), ((0, 2, 0, 1), (1, 3, 2, 3), (4, 6, 4, 5), (5, 7, 6, 7))),
    ((_LO3, _HI3), ((0, 4, 0, 4), (1, 5, 1, 5), (2, 6, 2, 6), (3, 7, 3, 7))),
)


def transpose8(X, xi, xj, T, ti, tj):
    """T[ti + c, tj + r] = X[xi + r, xj + c] for r, c < 8.  X, T: 2-D
    float32 arrays; the caller keeps every index in bounds (nothing is
    checked, as in any compiled kernel).  Callable from compiled code only;
    this body is the definition the compiled form must agree with."""
    for r in range(_N):
        for c in range(_N):
            T[ti + c, tj + r] = X[xi + r, xj + c]


def _element_pointer(context, builder, arrty, arr, i, j):
    a = context.make_array(arrty)(context, builder, arr)
    return cgutils.get_item_pointer2(
        context,
        builder,
        a.data,
        cgutils.unpack_tuple(builder, a.shape, 2),
        cgutils.unpack_tuple(builder, a.strides, 2),
        arrty.layout,
        [i, j],
    )


def _stack_array(n, dtype, lltype):
    """Typing and code of a new 1-D array of n (a literal int) elements on
    the caller's stack (see stack_lanes)."""
    if not isinstance(n, types.IntegerLiteral) or not 0 < n.literal_value <= 1024:
        return None
    size = n.literal_value
    arrty = types.Array(dtype, 1, "C")

    def codegen(context, builder, signature, args):
        data = cgutils.alloca_once(builder, lltype, size=size)  # in the entry block
        intp = lambda v: context.get_constant(types.intp, v)  # noqa: E731
        item = context.get_abi_sizeof(lltype)
        ary = context.make_array(arrty)(context, builder)
        context.populate_array(
            ary, data=data, shape=[intp(size)], strides=[intp(item)], itemsize=intp(item), meminfo=None
        )
        return ary._getvalue()

    return arrty(n), codegen


@intrinsic
def stack_lanes(typingctx, n):
    """A new float32 [n] array on the caller's stack, contents undefined; n
    must be a literal int.  The array lives as long as the compiled function
    that called this (the intrinsic is inlined there): it must never be
    returned or kept; read it out in a loop of constant trip count (n), so
    that the compiler still sees each element at a fixed place."""
    return _stack_array(n, types.float32, ir.FloatType())


@intrinsic
def stack_keys(typingctx, n):
    """stack_lanes for uint32 elements (per-lane minima of bit patterns)."""
    return _stack_array(n, types.uint32, ir.IntType(32))


def _f32_row(t):
    return isinstance(t, types.Array) and t.ndim == 1 and t.dtype == types.float32 and t.layout == "C"


def _lanes_op(op, out, a, b, n):
    """Typing and code of out[i] = a[i] <op> b[i] for i < n (see lanes_add):
    one LLVM vector operation of n float32 lanes, without fast-math flags."""
    if not (isinstance(n, types.IntegerLiteral) and 0 < n.literal_value <= 1024):
        return None
    if not (_f32_row(out) and _f32_row(a) and (_f32_row(b) or b == types.float32)):
        return None
    vec = ir.VectorType(ir.FloatType(), n.literal_value)

    def codegen(context, builder, signature, args):
        def pointer(arrty, arr):
            return builder.bitcast(context.make_array(arrty)(context, builder, arr).data, vec.as_pointer())

        def load(arrty, arr):
            v = builder.load(pointer(arrty, arr))
            v.align = 4  # element alignment only
            return v

        va = load(a, args[1])
        if isinstance(b, types.Array):
            vb = load(b, args[2])
        else:  # one value in every lane
            one = builder.insert_element(ir.Constant(vec, ir.Undefined), args[2], ir.Constant(ir.IntType(32), 0))
            vb = builder.shuffle_vector(one, one, ir.Constant(ir.VectorType(ir.IntType(32), n.literal_value), None))
        store = builder.store(getattr(builder, op)(va, vb), pointer(out, args[0]))
        store.align = 4
        return context.get_dummy_value()

    return types.void(out, a, b, n), codegen


@intrinsic
def lanes_add(typingctx, out, a, b, n):
    """out[i] = a[i] + b[i] for i < n: IEEE binary32, rounded to nearest,
    NOT flushed, NaN not canonicalised.  out, a: float32 rows (1-D,
    C-contiguous) of at least n elements; b: such a row, or one float32 for
    every lane; n: a literal int.  out may be a or b.  Nothing is checked.

    Written as loops over stack lanes, a chain of plain adds in every lane
    (a row sum whose flushes are proved identities) is unrolled by LLVM into
    n scalar adds a step, about 5x slower than the one vector add this
    emits.  For the row kernels' flush-free forms only: a caller that uses
    it where a flush could change a bit breaks [num.flush.c1]."""
    return _lanes_op("fadd", out, a, b, n)


@intrinsic
def lanes_sub(typingctx, out, a, b, n):
    """out[i] = a[i] - b[i] for i < n (as lanes_add)."""
    return _lanes_op("fsub", out, a, b, n)


@intrinsic
def lanes_mul(typingctx, out, a, b, n):
    """out[i] = a[i] * b[i] for i < n (as lanes_add)."""
    return _lanes_op("fmul", out, a, b, n)


@intrinsic
def lanes_copy(typingctx, out, a, n):
    """out[i] = a[i] for i < n, bits moved as one vector load and one
    vector store (no value is read as a number: NaN payloads and subnormals
    arrive unchanged).  out, a: float32 rows (1-D, C-contiguous) of at least
    n elements; n: a literal int.  Nothing is checked.  The matmul's packs
    copy a panel row (48 floats) or a strip row (8) per k with it: written as
    a loop of constant trip count, LLVM unrolls it into n scalar moves (SLP
    vectorisation is off in Numba's pipeline), 4-5x slower per pack."""
    if not (isinstance(n, types.IntegerLiteral) and 0 < n.literal_value <= 1024):
        return None
    if not (_f32_row(out) and _f32_row(a)):
        return None
    ivec = ir.VectorType(ir.IntType(32), n.literal_value)  # bits, never a float operation

    def codegen(context, builder, signature, args):
        def pointer(arrty, arr):
            return builder.bitcast(context.make_array(arrty)(context, builder, arr).data, ivec.as_pointer())

        v = builder.load(pointer(a, args[1]))
        v.align = 4  # element alignment only
        builder.store(v, pointer(out, args[0])).align = 4
        return context.get_dummy_value()

    return types.void(out, a, n), codegen


@intrinsic
def lanes_key_min(typingctx, k, x, n):
    """k[i] = min(k[i], (bits(x[i]) & 0x7FFFFFFF) - 1) for i < n, unsigned
    32-bit (the minus wraps for +-0): per lane, the least key of |x| seen,
    ordered as |x| for finite nonzero x and largest for +-0, inf and NaN (the
    bound of ``ops/norms.py``).  k: a uint32 row, x: a float32 row (1-D,
    C-contiguous, at least n elements); n: a literal int.  Integer
    operations only: no value is rounded.  Beside lanes_add in one loop, a
    loop over the lanes for the same keys was unrolled into scalars."""
    if not (isinstance(n, types.IntegerLiteral) and 0 < n.literal_value <= 1024):
        return None
    u32_row = isinstance(k, types.Array) and k.ndim == 1 and k.dtype == types.uint32 and k.layout == "C"
    if not (u32_row and _f32_row(x)):
        return None
    ivec = ir.VectorType(ir.IntType(32), n.literal_value)

    def codegen(context, builder, signature, args):
        def pointer(arrty, arr):
            return builder.bitcast(context.make_array(arrty)(context, builder, arr).data, ivec.as_pointer())

        pk = pointer(k, args[0])
        vk = builder.load(pk)
        vk.align = 4
        vx = builder.load(pointer(x, args[1]))  # the float bits, as integers
        vx.align = 4
        key = builder.sub(
            builder.and_(vx, ir.Constant(ivec, [0x7FFFFFFF] * n.literal_value)),
            ir.Constant(ivec, [1] * n.literal_value),
        )
        smaller = builder.icmp_unsigned("<", key, vk)
        builder.store(builder.select(smaller, key, vk), pk).align = 4
        return context.get_dummy_value()

    return types.void(k, x, n), codegen


@intrinsic
def prefetch(typingctx, X, i, j):
    """Ask the cache to fetch the line that holds X[i, j] (X: a 2-D array;
    the address must lie inside X).  A hint: it moves nothing and changes no
    value.  The row kernels fetch the next block of rows while they work on
    one: the transposed copy reads 32 rows at once, a pattern the hardware
    prefetcher does not follow, so without it each line came from memory on
    demand (the cost that makes a cold call twice a warm one)."""
    if not (isinstance(X, types.Array) and X.ndim == 2):
        return None
    sig = types.void(X, i, j)

    def codegen(context, builder, signature, args):
        Xt, it, jt = signature.args
        X_, i_, j_ = args
        i_ = context.cast(builder, i_, it, types.intp)
        j_ = context.cast(builder, j_, jt, types.intp)
        p = _element_pointer(context, builder, Xt, X_, i_, j_)
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [p.type, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        builder.call(fn, [p, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])  # read, keep, data
        return context.get_dummy_value()

    return sig, codegen


_CLAIMS = types.Array(types.int64, 1, "C")


@intrinsic
def claim(typingctx, counter):
    """counter[0] += 1 as one atomic step; returns the value before.  The
    parts of a parallel region take their next item of work with it (a
    row block, a head), so a part whose core runs slower takes fewer: with
    fixed shares a region waits for its slowest part (2 threads on a KVM
    host whose second vCPU slows in bursts: 512^3 products 7-10 % faster
    claimed; a core of a hybrid CPU is the same case).  It orders nothing
    but the count: which part computes an item changes no bit, since every
    item writes outputs of its own."""
    if counter != _CLAIMS:
        return None

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        return builder.atomic_rmw("add", data, ir.Constant(ir.IntType(64), 1), "monotonic")

    return types.int64(counter), codegen


@intrinsic
def _transpose8_vectors(typingctx, X, xi, xj, T, ti, tj):
    """transpose8 on C-contiguous arrays: 8 rows loaded as vectors, shuffled, stored."""
    sig = types.void(X, xi, xj, T, ti, tj)

    def codegen(context, builder, signature, args):
        Xt, xit, xjt, Tt, tit, tjt = signature.args
        X_, xi_, xj_, T_, ti_, tj_ = args
        xi_, xj_, ti_, tj_ = (
            context.cast(builder, v, t, types.intp) for v, t in ((xi_, xit), (xj_, xjt), (ti_, tit), (tj_, tjt))
        )
        v = []
        for r in range(_N):
            p = _element_pointer(context, builder, Xt, X_, builder.add(xi_, ir.Constant(xi_.type, r)), xj_)
            load = builder.load(builder.bitcast(p, _VEC.as_pointer()))
            load.align = 4  # element alignment only
            v.append(load)
        for (lo_idx, hi_idx), steps in _STAGES:
            out = [None] * _N
            for a, b, lo, hi in steps:
                out[lo] = builder.shuffle_vector(v[a], v[b], ir.Constant(_IDX, lo_idx))
                out[hi] = builder.shuffle_vector(v[a], v[b], ir.Constant(_IDX, hi_idx))
            v = out
        for c in range(_N):
            p = _element_pointer(context, builder, Tt, T_, builder.add(ti_, ir.Constant(ti_.type, c)), tj_)
            store = builder.store(v[c], builder.bitcast(p, _VEC.as_pointer()))
            store.align = 4
        return context.get_dummy_value()

    return sig, codegen


_transpose8_elements = kernel(transpose8)  # any layout: element by element


def _f32_array(t, ndim):
    return isinstance(t, types.Array) and t.ndim == ndim and t.dtype == types.float32


@overload(transpose8, jit_options=dict(cache=True))
def _transpose8_impl(X, xi, xj, T, ti, tj):
    if not (_f32_array(X, 2) and _f32_array(T, 2)):
        return None
    if X.layout == "C" and T.layout == "C":  # rows of 8 adjacent elements: vector loads and stores
        return lambda X, xi, xj, T, ti, tj: _transpose8_vectors(X, xi, xj, T, ti, tj)
    return lambda X, xi, xj, T, ti, tj: _transpose8_elements(X, xi, xj, T, ti, tj)


# interleave4's two shuffle stages: rows 0 and 1 (and 2 and 3) lane by lane,
# then the pairs two lanes at a time; indices into the concatenation of two
# 16-lane vectors.
_I16 = ir.VectorType(ir.IntType(32), 16)
_V16 = ir.VectorType(ir.FloatType(), 16)
_PAIRS_LO = [i // 2 + 16 * (i % 2) for i in range(16)]  # a0 b0 a1 b1 .. a7 b7
_PAIRS_HI = [8 + i // 2 + 16 * (i % 2) for i in range(16)]  # a8 b8 .. a15 b15
_QUADS_LO = [2 * (i // 4) + i % 2 + 16 * ((i // 2) % 2) for i in range(16)]  # p0 p1 q0 q1 p2 p3 q2 q3 ..
_QUADS_HI = [8 + q for q in _QUADS_LO]


def interleave4(X, xi, xj, out, off):
    """out[off + 4*c + r] = X[xi + r, xj + c] for r < 4, c < 16: a 4 x 16
    block of X transposed into 16 groups of 4 (attention's packed A strips,
    MR = 4 rows a k).  X: 2-D float32, out: 1-D float32; the caller keeps
    every index in bounds.  Callable from compiled code only; this body is
    the definition the compiled form must agree with."""
    for r in range(4):
        for c in range(16):
            out[off + 4 * c + r] = X[xi + r, xj + c]


@intrinsic
def _interleave4_vectors(typingctx, X, xi, xj, out, off):
    """interleave4 on C-contiguous arrays: 4 row vectors, 8 shuffles, 4 stores."""
    sig = types.void(X, xi, xj, out, off)

    def codegen(context, builder, signature, args):
        Xt, xit, xjt, Ot, offt = signature.args
        X_, xi_, xj_, O_, off_ = args
        xi_, xj_, off_ = (context.cast(builder, v, t, types.intp) for v, t in ((xi_, xit), (xj_, xjt), (off_, offt)))
        rows = []
        for r in range(4):
            p = _element_pointer(context, builder, Xt, X_, builder.add(xi_, ir.Constant(xi_.type, r)), xj_)
            load = builder.load(builder.bitcast(p, _V16.as_pointer()))
            load.align = 4  # element alignment only
            rows.append(load)
        a0, b0, c0, d0 = rows
        ab_lo = builder.shuffle_vector(a0, b0, ir.Constant(_I16, _PAIRS_LO))
        ab_hi = builder.shuffle_vector(a0, b0, ir.Constant(_I16, _PAIRS_HI))
        cd_lo = builder.shuffle_vector(c0, d0, ir.Constant(_I16, _PAIRS_LO))
        cd_hi = builder.shuffle_vector(c0, d0, ir.Constant(_I16, _PAIRS_HI))
        outs = (
            builder.shuffle_vector(ab_lo, cd_lo, ir.Constant(_I16, _QUADS_LO)),  # columns 0-3
            builder.shuffle_vector(ab_lo, cd_lo, ir.Constant(_I16, _QUADS_HI)),  # 4-7
            builder.shuffle_vector(ab_hi, cd_hi, ir.Constant(_I16, _QUADS_LO)),  # 8-11
            builder.shuffle_vector(ab_hi, cd_hi, ir.Constant(_I16, _QUADS_HI)),  # 12-15
        )
        base = context.make_array(Ot)(context, builder, O_).data
        for q, v in enumerate(outs):
            p = builder.gep(base, [builder.add(off_, ir.Constant(off_.type, 16 * q))])
            builder.store(v, builder.bitcast(p, _V16.as_pointer())).align = 4
        return context.get_dummy_value()

    return sig, codegen


_interleave4_elements = kernel(interleave4)  # any layout: element by element


@overload(interleave4, jit_options=dict(cache=True))
def _interleave4_impl(X, xi, xj, out, off):
    if not (_f32_array(X, 2) and _f32_array(out, 1)):
        return None
    if X.layout == "C" and out.layout == "C":  # rows of 16 adjacent elements: vector loads and stores
        return lambda X, xi, xj, out, off: _interleave4_vectors(X, xi, xj, out, off)
    return lambda X, xi, xj, out, off: _interleave4_elements(X, xi, xj, out, off)
