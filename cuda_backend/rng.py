"""Philox4x32 counter-based random numbers on the device (``spec/05-rng.txt``);
mirrors ``refreplay.rng``.

Every word is a pure function of (key, counter), so threads compute disjoint
blocks of a stream with no shared state: thread t of ``words_k`` computes one
Philox block (four consecutive words).  Integer arithmetic is uint64 holding
32-bit values, as in the reference: the 64-bit products of the round function
are exact.  The round function is not written here: it is
``refreplay.philox.philox_block``, the plain Python function that
``refreplay.rng`` compiles for the CPU, compiled here as a device function,
so both backends run one source.  The word-to-float maps use the shim's ``mul``.  Bounded integers
and permutations read a stream sequentially and stay on the host.
"""

from __future__ import annotations

import numpy as np
from numba import cuda

from refreplay import philox
from refreplay.philox import MASK32, U32  # [rng.philox.c1] the round: one source, both backends

from . import shim
from ._jit import device, kernel

U0 = np.uint64(0)
U1 = np.uint64(1)
U2 = np.uint64(2)
U8 = np.uint64(8)
TWO_M24 = np.float32(2.0**-24)  # 0x33800000
TWO_M23 = np.float32(2.0**-23)  # 0x34000000
TWO23 = np.int64(1 << 23)
ROUNDS = 10
STREAM_INIT = np.uint64(1)  # [rng.streams.c1]


# [rng.philox.c1] the block function: refreplay.philox.philox_block, compiled here for the device.
philox_block = device(philox.philox_block)


@device
def unit(w):
    """[rng.unit.c1] (w >> 8) * 2^-24: the top 24 bits (exact as a float32), scaled exactly."""
    return shim.mul(np.float32(np.uint64(w) >> U8), TWO_M24)


@device
def symmetric(w, a):
    """[rng.symmetric.c1] mul(f32((w >> 8) - 2^23) * 2^-23, a): exact up to the final mul."""
    s = np.int64(np.uint64(w) >> U8) - TWO23
    return shim.mul(shim.mul(np.float32(s), TWO_M23), a)


@kernel("void(uint32[:, ::1], uint32[::1], int64, uint32[:, ::1])")
def philox_k(counters, key, rounds, out):
    """[rng.philox.c1] out[n] = Philox4x32-rounds(counters[n], key).  counters, out: N×4
    uint32, key: 2 uint32; out overwritten.  One thread per counter."""
    n = cuda.grid(1)
    if n < out.shape[0]:
        x = philox_block(
            np.uint64(counters[n, 0]),
            np.uint64(counters[n, 1]),
            np.uint64(counters[n, 2]),
            np.uint64(counters[n, 3]),
            np.uint64(key[0]),
            np.uint64(key[1]),
            rounds,
        )
        for j in range(4):
            out[n, j] = np.uint32(x[j])


@device
def _stream_block(k0, k1, sub, stream, start, t):
    """Index and words of the t-th block touched by words start, start+1, ...  [rng.counter.c1]"""
    b = (start >> U2) + np.uint64(t)
    return b, philox_block(b & MASK32, b >> U32, sub, stream, k0, k1, ROUNDS)


@kernel("void(uint64, uint64, uint64, uint64, uint64, uint32[::1])")
def words_k(k0, k1, sub, stream, start, out):
    """[rng.counter.c1] out[i] = word start+i of stream (key k0, k1; sub; stream).

    Word q is word q mod 4 of the block with counter (lo(q div 4), hi(q div 4),
    sub, stream).  N = out.size; thread t computes block (start div 4) + t and
    writes those of its four words that fall in [start, start + N); grid
    ``blocks((start mod 4 + N + 3) div 4)``.  out overwritten.
    """
    t = cuda.grid(1)
    n = np.uint64(out.size)
    if np.uint64(t) <= ((start + n - U1) >> U2) - (start >> U2):
        b, x = _stream_block(k0, k1, sub, stream, start, t)
        for j in range(4):
            q = (b << U2) + np.uint64(j)
            if q >= start and q - start < n:
                out[q - start] = np.uint32(x[j])


@kernel("void(uint32[::1], float32[::1])")
def unit_k(w, out):
    """[rng.unit.c1] out[n] = unit(w[n]).  w, out: N; out overwritten."""
    n = cuda.grid(1)
    if n < out.size:
        out[n] = unit(w[n])


@kernel("void(uint32[::1], float32, float32[::1])")
def symmetric_k(w, a, out):
    """[rng.symmetric.c1] out[n] = symmetric(w[n], a).  w, out: N; out overwritten."""
    n = cuda.grid(1)
    if n < out.size:
        out[n] = symmetric(w[n], a)


@kernel("void(uint64, uint64, uint64, float32, float32[::1])")
def init_uniform_k(k0, k1, tag, a, out):
    """[rng.init.c1] out[i] = symmetric(word i of stream (seed, 1, tag), a).

    N = out.size (the parameter tensor, row-major); thread t computes words
    4t .. 4t+3; grid ``blocks((N + 3) div 4)``.  out overwritten.
    """
    t = cuda.grid(1)
    n = np.uint64(out.size)
    if np.uint64(t) <= (n - U1) >> U2:
        b, x = _stream_block(k0, k1, tag, STREAM_INIT, U0, t)
        for j in range(4):
            q = (b << U2) + np.uint64(j)
            if q < n:
                out[q] = symmetric(x[j], a)
