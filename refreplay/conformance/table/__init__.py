"""What is checked: the op table (``OPS``: op name -> ``OpDef``).

The families register in this order, which is the golden manifest's order:
the core entries (sums, matmuls, elementwise), the transformer ops, the
random-number ops, and the ops of the bf16 profile (built on the binary32
entries, so last).
"""

from . import core, model, rng  # noqa: F401  (register, in this order)
from . import bf16  # noqa: F401  (the bf16 profile, built on the binary32 entries)
from .opdef import OPS, OpDef

__all__ = ["OPS", "OpDef"]
