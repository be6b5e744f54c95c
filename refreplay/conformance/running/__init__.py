"""Stage 6: running a kernel -- what the runner calls (``kernel``), the adapters for the
reference, NumPy, PyTorch, CUDA and Python callables (``adapters``), PyTorch's own ops one
function per op (``torch_kernels``), the exec protocol for a
program in any language (``execproto``), and the bit-for-bit comparison (``compare``).
"""
