"""Where the package finds its data: the spec text and the golden vectors.

``spec/`` and ``vectors/`` are top-level directories of the repository (one
source of truth).  A wheel or sdist build copies them into the package as
``refreplay/_data/spec`` and ``refreplay/_data/vectors`` (``setup.py``), so an
installed refreplay works from any directory.  A source checkout has no
``_data`` and reads the top-level directories directly.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
INSTALLED_DATA = PACKAGE_DIR / "_data"
CHECKOUT_DIR = PACKAGE_DIR.parent


def installed() -> bool:
    """True when running from an installed build (wheel or sdist), not a checkout."""
    return INSTALLED_DATA.is_dir()


def data_dir(name: str) -> Path:
    """``spec`` or ``vectors``: the installed copy if there is one, else the checkout's directory."""
    return (INSTALLED_DATA if installed() else CHECKOUT_DIR) / name
