"""numba.cuda implementation of the refreplay spec (optional; the ``cuda`` extra).

Mirrors the CPU reference layer by layer: ``shim`` (binary32 primitives on
libdevice round-to-nearest intrinsics), ``numerics`` (elementwise primitive
kernels), ``linalg`` (fixed-order matmul and reductions), ``ops/``
(transformer ops).  ``adapter`` gives each covered op the calling convention
of the reference (host NumPy arrays in and out); ``ptx_audit`` checks the
compiled PTX of every kernel for fused, flushed or approximate instructions.

Importing this package needs numba-cuda but no GPU: kernels compile at their
first launch.  ``refreplay`` imports it only when the cuda kernel or device is
asked for.
"""
