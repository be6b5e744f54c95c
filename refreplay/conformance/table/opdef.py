"""The op table's record: what an entry names (``OpDef``), and the table itself
(``OPS``, op name -> entry, in the order the families register: ``core``,
``model``, ``rng``, then ``bf16``, see ``__init__.py``).  The order is the
order of the golden vectors' manifest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class OpDef:
    name: str
    clauses: tuple[str, ...]
    signature: str  # human-readable calling convention
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    reference: Callable  # (*inputs) -> output(s); inputs already loaded
    build: Callable  # (op, rng) -> [(family, {name: array}, note)]
    terms: Callable | None = None  # inputs -> (a, b): R sums of N terms (b None: plain sums)
    bf16: frozenset[str] = frozenset()  # "in/NAME", "out/NAME": tensors of bf16 bits ([bf16.format.c1])


OPS: dict[str, OpDef] = {}


def _register(op: OpDef):
    OPS[op.name] = op
