"""Numerics: binary32 primitives as the spec defines them.

* ``core`` — rounding, flushing, NaN canonicalisation, add/mul/recip/sqrt,
  min/max, rint and saturation (``spec/01-numbers.txt``);
* ``transcendental`` — exp, log, tanh, sigmoid, sin and cos, each defined by
  an algorithm built on ``core`` (``spec/02-transcendentals.txt``);
* ``elementwise`` — the array form of every primitive above, under the same
  name (``numerics.elementwise.exp(x)`` applies ``numerics.exp`` to each
  element).

The package namespace holds the scalar forms (``numerics.add``,
``numerics.exp``, ...) for use inside kernels; array callers use
``numerics.elementwise``.
"""

from .core import (  # noqa: F401
    add,
    sub,
    mul,
    recip,
    sqrt,
    fmax,
    fmin,
    rint,
    saturate_i8,
    flush,
    canon,
    finish,
    load,
    F32,
    ZERO,
    ONE,
    TWO,
    HALF,
    FLT_MIN,
    FLT_MAX,
    INF,
)
from .transcendental import exp, log, tanh, sigmoid, sin, cos  # noqa: F401
from . import elementwise  # noqa: F401
from ._bits import f32_from_bits, bits_of  # noqa: F401
