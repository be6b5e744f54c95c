"""Host entry points of the device kernels: host NumPy arrays in, host arrays out,
one module per domain as in ``refreplay`` (``cuda_backend.adapter`` gathers them)."""
