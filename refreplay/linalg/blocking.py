"""The fp32 matmul's block sizes, derived from the caches this process sees.

``blocks_for(Caches(l1d, l2, l3))`` is the whole rule; ``machine_caches()``
reads the sizes from Linux's sysfs (``/sys/devices/system/cpu/cpu0/cache``),
falling back to ``FALLBACK`` (the machine the constants in ``mm_fp32.py`` were
tuned on) where a level is absent or unreadable; ``machine_blocks()`` is the
two together, computed once per process.

Nothing here is normative and nothing here can change a bit: every output of
``mm_fp32`` is one sequential chain over k whatever the blocks are (k blocks
meet in C, a float32 stored and loaded back exactly, and which tile runs when
is free), which ``tests/test_blocking.py`` checks against the one-at-a-time
loops on shapes at, below and above every size derived here.  Block sizes
are run-time arguments of the compiled driver, not compile-time constants, so
one compiled (and cached) kernel serves every machine and every test's
override.

The rule (sizes in bytes of the core's own caches; the matmul's register
tile is ``_tile.MM_MR`` x ``_tile.MM_NR`` = 8 x 48 floats):

* ``kc`` (k block): the largest power of two, at most 1024, such that a row
  block's packed A strip (kc x MR floats) takes at most half of L1d and one
  packed B panel (kc x NR floats) at most a quarter of L2.  A tile streams its
  B panel with the A strip held in L1.
* ``b_block`` (floats of packed B per column block): half of L2.  Every row
  block runs its tiles over one column block before the next, so the block is
  read from L2, not memory.
* ``b_cached`` (floats of packed B above which column blocks are used): the
  same half of L2.  Earlier the threshold was an 8 MiB guess at what row
  blocks can each stream from L3; that held on the AMD Zen machines (32 MiB
  L3) but not on an Intel Xeon (2 MiB L2), where 1024 x 1024 ran at a third
  of the speed of 512 x 512 (issue 32).  Measured on the AMD machine, column
  blocks at 1024 are not slower than streaming from L3 (benchmarks/README.md),
  so one rule serves both: a cache-size threshold with no vendor guess.
* ``a_rows`` (rows of A packed at once where column blocks are used):
  ``A_ROWS`` = 4096, not a cache size but a ratio of work.  B's column blocks
  are packed again for every chunk of a_rows rows, one packed element of B
  per a_rows multiply-adds, which keeps the repacking near 1 % of the
  chunk's arithmetic on any core; and the packed chunk (a_rows x kc floats,
  8 MiB at kc = 512) stays far below the whole packed A of a tall operand
  (the LM head's weight gradient: 50,304 rows, 103 MB, a fresh mapping and
  its page faults on every call).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

MR, NR = 8, 48  # the matmul's register tile in _tile.py (kept equal by tests/test_blocking.py)
KC_MAX = 1024  # the longest k block measured (longer ones were never faster)
KC_MIN = 64
A_ROWS = 4096  # rows of A per packed chunk in the column-blocked path (the rule above)
SYSFS = "/sys/devices/system/cpu/cpu0/cache"
_FLOAT = 4


@dataclass(frozen=True)
class Caches:
    """Per-core data cache sizes in bytes (l3: the last level the core sees; 0 if none)."""

    l1d: int
    l2: int
    l3: int = 0
    source: str = "given"


@dataclass(frozen=True)
class Blocks:
    """``mm_fp32``'s run-time block sizes: kc (k block, in k), b_cached and
    b_block (in floats of packed B), a_rows (rows of A per packed chunk)."""

    kc: int
    b_cached: int
    b_block: int
    a_rows: int = A_ROWS

    def args(self) -> tuple[int, int, int, int]:
        """The trailing arguments of ``mm_nn/mm_nt/mm_tn``."""
        return self.kc, self.b_cached, self.b_block, self.a_rows


FALLBACK = Caches(l1d=32 << 10, l2=1 << 20, l3=32 << 20, source="fallback")


def blocks_for(c: Caches) -> Blocks:
    """The block sizes for caches ``c`` (the rule in the module docstring)."""
    l1d = max(int(c.l1d), 1 << 10)
    l2 = max(int(c.l2), 16 << 10)
    kc = KC_MAX
    while kc > KC_MIN and (kc * MR * _FLOAT > l1d // 2 or kc * NR * _FLOAT > l2 // 4):
        kc //= 2
    half_l2 = l2 // 2 // _FLOAT
    return Blocks(kc=kc, b_cached=half_l2, b_block=half_l2)


_SIZE = re.compile(r"^\s*(\d+)\s*([KMG]?)\s*$")


def _size(text: str) -> int | None:
    m = _SIZE.match(text)
    if not m:
        return None
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2)]


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(64).decode("ascii", "replace").strip()
    except OSError:
        return None


def machine_caches(root: str = SYSFS) -> Caches:
    """L1d, L2 and L3 sizes of cpu0 from sysfs ``root``; a level that is
    absent or unreadable takes ``FALLBACK``'s size."""
    found: dict[int, int] = {}
    try:
        entries = sorted(e for e in os.listdir(root) if e.startswith("index"))
    except OSError:
        entries = []
    for e in entries[:16]:
        level, kind, size = (_read(os.path.join(root, e, n)) for n in ("level", "type", "size"))
        if kind not in ("Data", "Unified") or level not in ("1", "2", "3", "4"):
            continue
        n = _size(size or "")
        if n:
            found[int(level)] = max(found.get(int(level), 0), n)
    if not found:
        return FALLBACK
    last = max((lv for lv in found if lv >= 3), default=None)
    return Caches(
        l1d=found.get(1, FALLBACK.l1d), l2=found.get(2, FALLBACK.l2), l3=found[last] if last else 0, source=root
    )


_MACHINE: Blocks | None = None


def machine_blocks() -> Blocks:
    """``blocks_for(machine_caches())``, computed once per process."""
    global _MACHINE
    if _MACHINE is None:
        _MACHINE = blocks_for(machine_caches())
    return _MACHINE
