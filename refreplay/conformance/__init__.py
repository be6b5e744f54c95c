"""The conformance suite: golden vectors, the runner, the diagnosis.

The public API is ``check`` and ``Report`` (``api.py``); they are loaded on
first use so that importing a submodule stays cheap.
"""
from __future__ import annotations

__all__ = ["check", "Report", "NotConformant"]


def __getattr__(name: str):
    if name in __all__:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
