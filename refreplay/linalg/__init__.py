"""Fixed-order linear algebra: fp32 matmul (A·B, A·Bᵀ, Aᵀ·B), bias add,
row/column sums, row max, and exact int8 matmul.  Spec chapters
``03-reductions`` and ``04-matmul``.

Python callers use the validating API (``matmul``, ``matmul_nt``,
``matmul_tn``, ``bias_add``, ``row_sum``, ``col_sum``, ``row_max``,
``matmul_i8``).  Compiled callers call the kernels directly (no validation):
``mm_nn/mm_nt/mm_tn(A, B, C, accumulate=False)``, ``bias_add_k(C, b)``,
``row_sum_k(X, out)``, ``col_sum_k(X, out, accumulate=False)``,
``row_max_k(X, out)``, ``mm_i8(A, B, C)`` -- C-contiguous arrays, outputs not
overlapping inputs, called from serial code (they thread themselves over
independent outputs).  The ``*_naive`` kernels are the
one-output-at-a-time references the fast ones must equal bit for bit.
"""

from .api import (  # noqa: F401
    matmul,
    matmul_nt,
    matmul_tn,
    bias_add,
    row_sum,
    col_sum,
    row_max,
    matmul_i8,
)
from .mm_fp32 import mm_nn, mm_nt, mm_tn, bias_add_k  # noqa: F401
from .mm_fp32_naive import mm_nn_naive, mm_nt_naive, mm_tn_naive, bias_add_naive  # noqa: F401
from .reduce import row_sum_k, col_sum_k, row_max_k  # noqa: F401
from .reduce_naive import row_sum_naive, col_sum_naive, row_max_naive  # noqa: F401
from .mm_int8 import mm_i8, mm_i8_naive, I8_MAX_K  # noqa: F401
