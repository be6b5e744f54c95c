"""Saving live cases ([conf.runner.c1]) in the format of ``vectors/``
([conf.vectors.c1]) so that ``conform --vectors DIR`` replays them; a save
replaces only an earlier live save, never other files.
"""

from __future__ import annotations

import json
from pathlib import Path

from ... import spec
from ...errors import InputError
from ..base.case import Case
from ..shapes.live import GENERATOR_VERSION
from . import store


def check_save_target(directory) -> list:
    """``directory`` can take a live save: absent, empty, or an earlier live
    save (its files are returned, to be replaced).  Anything else, committed
    vectors included, is refused: a save never overwrites other files."""
    d = Path(directory)
    if d.exists() and not d.is_dir():
        raise InputError(f"--save {d}: exists and is not a directory")
    if not (d.is_dir() and any(d.iterdir())):
        return []
    try:
        m = json.loads((d / store.MANIFEST).read_bytes())
        if isinstance(m, dict) and str(m.get("generator_version", "")).startswith("live"):
            return [d / store.MANIFEST] + [d / n for n in m["files"]]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    raise InputError(f"--save {d}: directory is not empty and holds no earlier live save; choose a new directory")


def save(cases: list[Case], directory, seed: int) -> None:
    """Write live cases in the format of ``vectors/`` ([conf.vectors.c1]) so
    that ``conform --vectors DIR`` replays them (``check_save_target`` says
    where that is allowed)."""
    d = Path(directory)
    for p in check_save_target(d):
        if p.parent == d and p.name.endswith(".safetensors") and p.is_file():
            p.unlink()
    store.write(store.encode(cases, spec.version(), GENERATOR_VERSION, seed), d)


# ---- the shapes of a model preset ------------------------------------------------------------
