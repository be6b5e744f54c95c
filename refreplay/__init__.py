"""refreplay: the portable, normative reference for bitwise-reproducible
training arithmetic.  See ``spec/`` for the normative text."""
from . import _env  # noqa: F401  (must run before anything imports numba)

__version__ = "0.3.0"
