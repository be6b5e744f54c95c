"""The Philox4x32 round function ([rng.philox.c1], ``spec/05-rng.txt``), written once.

``philox_block`` is a plain Python function on uint64 values holding 32-bit
words, with no compiler attached: ``refreplay.rng`` compiles it for the CPU
(``_jit.kernel``, numba.njit) and ``cuda_backend.rng`` for the device
(``cuda_backend._jit.device``); the CUDA simulator runs it as Python.  Both
backends therefore execute the same source, and the Random123 known answers
(``tests/test_rng.py``) and the simulator's comparison with the CPU
(``tests/test_cuda_sim.py``) check the one round.  Only integer arithmetic:
the 64-bit products of two 32-bit values are exact in uint64.
"""

from __future__ import annotations

import numpy as np

# [rng.philox.c1] multipliers and Weyl key increments (Random123).
M0 = np.uint64(0xD2511F53)
M1 = np.uint64(0xCD9E8D57)
W0 = np.uint64(0x9E3779B9)
W1 = np.uint64(0xBB67AE85)
MASK32 = np.uint64(0xFFFFFFFF)
U32 = np.uint64(32)


def philox_block(c0, c1, c2, c3, k0, k1, rounds):
    """[rng.philox.c1] Philox4x32-``rounds`` of counter (c0..c3) under key (k0, k1).

    Counter and key words are uint64 holding 32-bit values; returns the four
    output words (as uint64).  Each round takes the 64-bit products M0*c0 and
    M1*c2 and permutes their halves; the key is bumped by the Weyl constants
    before every round but the first.
    """
    for r in range(rounds):
        if r > 0:
            k0 = (k0 + W0) & MASK32
            k1 = (k1 + W1) & MASK32
        p0 = M0 * c0
        p1 = M1 * c2
        c0, c1, c2, c3 = ((p1 >> U32) ^ c1 ^ k0, p1 & MASK32, (p0 >> U32) ^ c3 ^ k1, p0 & MASK32)
    return c0, c1, c2, c3
