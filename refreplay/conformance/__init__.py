"""The conformance suite: golden vectors, the runner, the diagnosis.

The public API is ``check`` and ``Report`` (``api.py``); they are loaded on
first use so that importing a submodule stays cheap.

Stages, each importing only the stages below it (``tests/test_layering.py``
checks this map against the files and every import, lazy ones included;
inside a stage the imports form no circle):

    stage  sub-package  what it holds
    0      base         the case record, bit casts and deviant arithmetic, bf16 roundings
    1      readings     wrong readings: other summation orders, transformer-op variants, bf16 misreadings
    2      inputs       input generators and the case builders, one per kind of op
    3      table        what is checked: the op table, one entry per op
    4      shapes       cases at any shape: live forms, axis sweeps, edge cases, the domain
    5      golden       the golden vectors on disk: format, generation, regeneration, steps
    6      running      running a kernel: adapters, the exec protocol, the bit comparison
    7      diagnosis    why a kernel fails, and its accumulation order
    8      reporting    the report (text, JSON, JUnit) and the published results table
    9      api          check() and Report
"""

from __future__ import annotations

__all__ = ["check", "Report", "NotConformant"]


def __getattr__(name: str):
    if name in __all__:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
