"""Process environment the reference needs, fixed before Numba is imported.

* Intel SVML would replace ``math.exp`` and friends inside compiled code with
  vector routines whose bits differ; refreplay never calls them on the
  normative path, but a stray call must not silently change meaning, so SVML
  is switched off for the whole process.
* Numba's on-disk cache can return stale machine code when a callee in another
  file changes.  The cache directory is therefore keyed to a SHA-256 of every
  source file of the package: any edit selects a fresh directory.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def source_hash() -> str:
    """SHA-256 over the package's Python sources (paths and bytes, sorted)."""
    h = hashlib.sha256()
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        rel = path.relative_to(PACKAGE_DIR).as_posix()
        h.update(rel.encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()


def cache_root() -> Path:
    base = os.environ.get("REFREPLAY_CACHE_ROOT")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "refreplay"


SOURCE_HASH = source_hash()
CACHE_DIR = cache_root() / f"numba-{SOURCE_HASH[:16]}"


def configure() -> None:
    os.environ["NUMBA_DISABLE_INTEL_SVML"] = "1"
    os.environ["NUMBA_CACHE_DIR"] = str(CACHE_DIR)
    import sys

    if "numba" in sys.modules:  # imported before us: patch its live config too
        from numba.core import config

        config.CACHE_DIR = str(CACHE_DIR)


configure()
