"""The register-blocked inner loops of the fp32 products, written in LLVM vector IR.

One call computes an mr × nr tile of C over a block of kc consecutive k:

    for k in kc steps, increasing:
        for r in 0..mr-1, for every j in 0..nr-1 (as nv vectors of 16 lanes):
            acc[r][j] = acc[r][j] + Ap[k, r] * Bp[k, j]

with each multiply and each add a separate IEEE binary32 operation (LLVM
``fmul``/``fadd`` with no fast-math flags: never contracted into a fused
multiply-add, never reassociated).  Every output C[i, j] is one lane of one
accumulator, so its sum runs in increasing k exactly as [mm.nn.c1] states;
the lanes and rows of the tile are independent outputs.  The accumulators
live in registers for the whole k loop, which is what makes this fast, and
why it is written as vector IR: Numba's auto-vectoriser cannot keep a 2-D
accumulator in registers.

Two tile shapes are built, both keeping their accumulators and the B
vectors of one k step in the 32 vector registers of AVX-512:

* ``MM_MR`` × ``MM_NR`` = 8 × 48 (24 accumulators) for the matmul driver.
  Each k step loads 3 vectors of B for 24 multiply-adds; the earlier 4 × 64
  tile loaded 4 for 16, and with its B streamed from L2 it lost more of
  the unfused peak as packed B grew (Intel Xeon, 2 MiB L2, the tile alone
  over 1.5 MiB of packed B: 0.71 of the peak, 8 × 48 0.80; over 384 KiB
  both 0.89; issue 32).  Eight rows also make the transposing packs whole 8 × 8 blocks
  (``_tiles.transpose8``).  A last panel of at most 32 or 16 columns runs an
  8 × 32 or 8 × 16 tile instead (``mm2_*``, ``mm1_*``).
* ``MR`` × ``NR`` = 4 × 64 for attention (``ops/attention.py``), whose
  panels are a head's 64 channels and whose causal edges are cut by MR.

Each A value is read once per vector of B it multiplies, through an opaque
copy of the strip's address (``_opaque``), so that LLVM folds every read
into its multiply as a broadcast memory operand instead of broadcasting
once into a register (an instruction of its own, which on AMD Zen 4 took a
slot of the pipes the multiplies and adds need).

Three variants of each are built (``tile_variants``):

* ``flush``: every product and every partial sum goes through the flush
  of [num.flush.c1] (a subnormal becomes a zero of its sign), written as the
  select ``exponent field == 0 ? sign bit only : x``, which equals
  ``core.flush`` on every input.
* ``flush_sums``: only the partial sums are flushed, for tiles whose
  products are proved never subnormal.
* ``plain``: no flush, for tiles in which every flush is proved an
  identity.
The driver picks the variant per tile; the proofs are in ``mm_fp32.py``.
Each gives the bits of [mm.nn.c1] wherever the driver calls it.

Either variant stores its accumulators back to C with NaNs canonicalised
([num.nan.c1] allows this once at the end of an add/mul chain; C may be
stored and reloaded between k blocks, which keeps every bit).

Layout (packed by ``mm_fp32.py``): ``Ap[ap_off + k*mr + r]``,
``Bp[bp_off + k*nr + j]``, ``C[c_off + r*ldc + j]``; all 1-D float32.  A
strided tile (``tile_variants(..., strided=True)``) takes one more argument,
``lda`` after ``ap_off``, and reads ``Ap[ap_off + k*lda + r]``: mr
consecutive floats of each of kc rows lda apart, so an operand whose rows
already hold the tile's mr values side by side (attention's att and dz for
the key sums) needs no packed copy.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

LANES = 16  # one 512-bit vector of float32
MR, NV = 4, 4  # attention's tile: rows, vectors per row
NR = NV * LANES
MM_MR, MM_NV = 8, 3  # the matmul's tile
MM_NR = MM_NV * LANES

_F32 = ir.FloatType()
_I32 = ir.IntType(32)
_VF = ir.VectorType(_F32, LANES)
_VI = ir.VectorType(_I32, LANES)
_F32_1D = types.Array(types.float32, 1, "C")


def _splat_i32(value):
    return ir.Constant(_VI, [value] * LANES)


def _flush(builder, v):
    """[num.flush.c1] exponent field 0 (zero or subnormal) -> the sign bit alone."""
    bits = builder.bitcast(v, _VI)
    tiny = builder.icmp_unsigned("==", builder.and_(bits, _splat_i32(0x7F800000)), _splat_i32(0))
    signed_zero = builder.and_(bits, _splat_i32(0x80000000 - (1 << 32)))
    return builder.bitcast(builder.select(tiny, signed_zero, bits), _VF)


def _canon(builder, v):
    """[num.nan.c1] any NaN lane -> 0x7FC00000."""
    nan = builder.fcmp_unordered("uno", v, v)
    return builder.select(nan, builder.bitcast(_splat_i32(0x7FC00000), _VF), v)


def _vec_ptr(builder, base, offset):
    return builder.bitcast(builder.gep(base, [offset]), _VF.as_pointer())


def _opaque(builder, ptr):
    """ptr, through an empty inline asm: the same address, which LLVM can no
    longer prove equal to ptr.  The tile reads each A value once per vector
    of B, each read through a copy of its own: LLVM cannot merge the reads,
    so it folds each into its multiply as a broadcast memory operand
    (``vmulps m32{1to16}``), which the load unit serves.  One broadcast in a
    register shared by the vectors is an instruction of its own, and on
    AMD Zen 4 it took a slot of the vector pipes the multiplies and adds
    need (issue 32: the 8 x 48 tile at 87 GF/s of a 113 GF/s peak, with the
    broadcasts folded 115).  The values read and every operation are the
    same: no bit changes."""
    asm = ir.InlineAsm(ir.FunctionType(ptr.type, [ptr.type]), "", "=r,0", side_effect=True)
    return builder.call(asm, [ptr])


def _make_tile(mr: int, nv: int, flush_products: bool, flush_sums: bool, strided: bool):
    """The tile intrinsic for an mr x (nv * LANES) tile; with ``strided`` it
    takes ``lda`` after ``ap_off`` (A's rows lda floats apart, not mr)."""
    nr = nv * LANES
    x = 1 if strided else 0  # the arguments after ap_off move by one

    def typer(typingctx, *args):
        Ap, Bp, C, load_c = args[0], args[2 + x], args[5 + x], args[8 + x]
        for arr in (Ap, Bp, C):
            if arr != _F32_1D:
                return None
        for i in (1, 3 + x, 4 + x, 6 + x, 7 + x) + ((2,) if strided else ()):
            if not isinstance(args[i], types.Integer):
                return None
        if not isinstance(load_c, types.Boolean):
            return None
        sig = types.void(*args)

        def codegen(context, builder, signature, args):
            tys = signature.args
            intp = context.get_value_type(types.intp)

            def data(i):
                return context.make_array(tys[i])(context, builder, args[i]).data

            def as_intp(i):
                return context.cast(builder, args[i], tys[i], types.intp)

            ap, bp, c = data(0), data(2 + x), data(5 + x)
            ap_off, bp_off, kc, c_off, ldc = (as_intp(i) for i in (1, 3 + x, 4 + x, 6 + x, 7 + x))
            lda = as_intp(2) if strided else ir.Constant(intp, mr)
            load_c = context.cast(builder, args[8 + x], tys[8 + x], types.boolean)
            ap = builder.gep(ap, [ap_off])
            bp = builder.gep(bp, [bp_off])
            c = builder.gep(c, [c_off])
            a_bases = [ap] + [_opaque(builder, ap) for _ in range(nv - 1)]  # one per vector of B

            # Accumulators: allocas that mem2reg turns into vector registers.
            acc = [[cgutils.alloca_once(builder, _VF) for _ in range(nv)] for _ in range(mr)]
            neg_zero = ir.Constant(_VF, [-0.0] * LANES)  # [red.sum.c1] start of a sum
            for r in range(mr):
                row = builder.mul(ir.Constant(intp, r), ldc)
                for v in range(nv):
                    at = _vec_ptr(builder, c, builder.add(row, ir.Constant(intp, v * LANES)))
                    with builder.if_else(load_c) as (then, otherwise):
                        with then:
                            builder.store(builder.load(at, align=4), acc[r][v])
                        with otherwise:
                            builder.store(neg_zero, acc[r][v])

            with cgutils.for_range(builder, kc, intp=intp) as loop:
                k = loop.index
                b = [
                    builder.load(
                        _vec_ptr(
                            builder,
                            bp,
                            builder.add(builder.mul(k, ir.Constant(intp, nr)), ir.Constant(intp, v * LANES)),
                        ),
                        align=4,
                    )
                    for v in range(nv)
                ]
                a_at = builder.mul(k, lda)
                for r in range(mr):
                    for v in range(nv):
                        at = builder.add(a_at, ir.Constant(intp, r))
                        a = builder.load(builder.gep(a_bases[v], [at]), align=4)  # A[k, r], read for this vector
                        a_vec = builder.shuffle_vector(
                            builder.insert_element(ir.Constant(_VF, ir.Undefined), a, ir.Constant(_I32, 0)),
                            ir.Constant(_VF, ir.Undefined),
                            ir.Constant(_VI, [0] * LANES),
                        )
                        p = builder.fmul(a_vec, b[v])  # rounded product, no contraction
                        if flush_products:
                            p = _flush(builder, p)
                        s = builder.fadd(builder.load(acc[r][v]), p)  # rounded sum
                        if flush_sums:
                            s = _flush(builder, s)
                        builder.store(s, acc[r][v])

            for r in range(mr):
                row = builder.mul(ir.Constant(intp, r), ldc)
                for v in range(nv):
                    at = _vec_ptr(builder, c, builder.add(row, ir.Constant(intp, v * LANES)))
                    builder.store(_canon(builder, builder.load(acc[r][v])), at, align=4)
            return context.get_dummy_value()

        return sig, codegen

    # Numba's intrinsic reads the typer's parameter names: spell them out
    if strided:

        def tile(typingctx, Ap, ap_off, lda, Bp, bp_off, kc, C, c_off, ldc, load_c):
            return typer(typingctx, Ap, ap_off, lda, Bp, bp_off, kc, C, c_off, ldc, load_c)

    else:

        def tile(typingctx, Ap, ap_off, Bp, bp_off, kc, C, c_off, ldc, load_c):
            return typer(typingctx, Ap, ap_off, Bp, bp_off, kc, C, c_off, ldc, load_c)

    return intrinsic(tile)


def tile_variants(mr: int, nv: int, strided: bool = False):
    """(plain, flush_sums, flush): the three variants of the mr x (nv * LANES)
    tile.  Built for attention's MR x NR tile (packed and strided) and the
    matmul's MM_MR x MM_NR, and for the matmul's last panel when fewer than
    MM_NR columns are left: MM_MR x 32 and MM_MR x 16 (a width of 256 is 5
    whole panels and 16 columns, which a full-width tile would compute 3
    times over)."""
    return tuple(_make_tile(mr, nv, fp, fs, strided) for fp, fs in ((False, False), (False, True), (True, True)))
