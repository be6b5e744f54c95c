"""numba.cuda implementation of the refreplay spec (optional; the ``cuda`` extra).

Mirrors the CPU reference layer by layer, citing the same clauses:
``shim`` (the binary32 primitives on libdevice round-to-nearest intrinsics),
``numerics`` and ``transcendental`` (elementwise kernels), ``linalg``
(fixed-order matmul and reductions), ``rng`` (Philox), ``treefold``, and
``ops/`` (the transformer ops, forward and backward).  ``host/`` holds the
host entry points (NumPy arrays in and out, the reference's calling
conventions) and ``adapter`` gathers them under the reference's names for
the conformance runner (``refreplay conform cuda``).  ``ptx_audit`` checks
the compiled PTX of every kernel for fused, flushed, approximate or float64
instructions; ``selfcheck`` compares every device function with the
reference bit for bit.

Importing this package needs numba-cuda but no GPU: kernels compile at their
first launch.  ``refreplay`` imports it only when the cuda kernel or device is
asked for.  See docs/cuda.md.
"""
