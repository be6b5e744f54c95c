"""Process environment the reference needs, fixed before Numba is imported.

* Intel SVML would replace ``math.exp`` and friends inside compiled code with
  vector routines whose bits differ; refreplay never calls them on the
  normative path, but a stray call must not silently change meaning, so SVML
  is switched off for the whole process.
* Numba's on-disk cache can return stale machine code when a callee in another
  file changes.  The cache directory is therefore keyed to a SHA-256 of the
  package's *kernel closure*: every module that compiles code (it imports
  ``numba`` or the package's ``_jit``) and every package module those import,
  transitively.  Compiled code can only reach globals of modules in that
  closure, so any edit that could change machine code selects a fresh
  directory, while an edit to plumbing (commands, the conformance runner,
  replay, audit) keeps the compiled kernels.  The key is taken over the
  modules' syntax trees, so reformatting or a comment keeps it too; it is
  remembered on disk under the hash of every source byte, so a process pays
  the tree walk (about a second) once per source state, not at each start.
* Numba's parallel kernels run on an OpenMP pool (its ``omp`` threading
  layer; with PyTorch loaded first it is PyTorch's own libgomp, one pool for
  both).  OpenMP's default waiting policy lets idle workers spin for
  milliseconds after each parallel region; on a machine with any other busy
  process they steal the core the one working thread needs (measured: a
  small GPT step through refreplay.torch went from 8 ms idle to 0.3-0.8 s
  with one competing busy process, benchmarks/bench_threads.py).  So the
  process's policy is PASSIVE (workers sleep) unless the user set
  ``OMP_WAIT_POLICY`` themselves.  The runtime reads it once, when it is
  loaded.  A PyTorch wheel loads a private libgomp of its own, so with
  ``import torch`` first Numba's pool still loads a runtime of its own
  (the system's), which reads PASSIVE; only when the runtime Numba links
  to was itself loaded before refreplay (``OMP_RUNTIME_PRELOADED`` and
  ``_numba_omp_shared``) with no policy set do its workers spin, and
  Numba's kernels then go to Numba's ``workqueue`` layer instead (its own
  threads, which sleep between kernels) unless the user chose a layer
  (``NUMBA_THREADING_LAYER``).  The workqueue hands even a one-thread
  kernel to a worker thread: measured 170 us against 45 us for a small
  op at load 7, so it is the fallback, not the default.  Measured: the spinning pool made that
  small step 0.3-1 s beside one busy process, the workqueue 39 ms, the
  passive pool 23 ms (load 6-8).  The workqueue layer takes one parallel
  kernel at a time: refreplay.torch serialises its ops across Python
  threads then (``_bridge``).  Bits never depend on threads, layer or policy.
"""

from __future__ import annotations

import ast
import hashlib
import os
import sys
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


def _module_path(name: str) -> Path | None:
    """The source file of package module ``refreplay.<...>`` ``name``, if any."""
    parts = name.split(".")
    if parts[0] != PACKAGE_DIR.name:
        return None
    base = PACKAGE_DIR.joinpath(*parts[1:])
    for cand in (base.with_suffix(".py"), base / "__init__.py"):
        if cand.is_file():
            return cand
    return None


# Numba's entry points that compile code (``import numba`` alone, for its
# config or thread count, compiles nothing).
_COMPILERS = {"njit", "jit", "vectorize", "guvectorize", "cfunc", "stencil", "generated_jit"}


def _package_imports(path: Path) -> tuple[set[Path], bool]:
    """(package modules ``path`` imports, whether it compiles code itself).

    A module compiles code when it imports the package's ``_jit`` or one of
    Numba's compiling entry points, or names ``numba.njit``-style attributes.
    """
    rel = path.relative_to(PACKAGE_DIR).with_suffix("")
    pkg = [PACKAGE_DIR.name, *rel.parts]
    if pkg[-1] == "__init__":
        pkg.pop()
    else:
        pkg.pop()  # a module's relative imports start from its package
    found: set[Path] = set()
    compiles = False
    for node in ast.walk(ast.parse(path.read_bytes(), filename=str(path))):
        names: list[str] = []
        if (
            isinstance(node, ast.Attribute)
            and node.attr in _COMPILERS
            and isinstance(node.value, ast.Name)
            and node.value.id == "numba"
        ):
            compiles = True
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[: len(pkg) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            names = [mod] + [f"{mod}.{a.name}" for a in node.names]
        for name in names:
            if name.endswith("._jit") or name.split(".")[0] == "numba" and name.rsplit(".", 1)[-1] in _COMPILERS:
                compiles = True
            target = _module_path(name)
            if target is not None:
                found.add(target)
                # importing a.b.c runs a/__init__ and a/b/__init__ too
                parts = name.split(".")
                for i in range(2, len(parts)):
                    init = _module_path(".".join(parts[:i]))
                    if init is not None:
                        found.add(init)
    return found, compiles


def kernel_closure() -> list[Path]:
    """Modules that compile code, and every package module they import (sorted)."""
    graph: dict[Path, set[Path]] = {}
    todo: list[Path] = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        imports, compiles = _package_imports(path)
        graph[path] = imports
        if compiles:
            todo.append(path)
    closure: set[Path] = set()
    while todo:
        path = todo.pop()
        if path in closure:
            continue
        closure.add(path)
        todo.extend(graph.get(path, ()))
    return sorted(closure)


def _without_docstrings(tree: ast.Module) -> ast.Module:
    """``tree`` with the docstrings of its module, classes and functions removed.

    Compiled code never reads a docstring, and formatters re-indent them."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                node.body = body[1:] or [ast.Pass()]
    return tree


def kernel_hash() -> str:
    """SHA-256 over the kernel closure's code (paths and syntax trees, sorted).

    Each module enters as its syntax tree without positions or docstrings, so
    what only moves text -- a formatter's line breaks, quotes, trailing
    commas, re-indented docstrings, comments -- keeps the key (and the cross-architecture evidence recorded
    for it, scripts/check-aarch64), while any change to what the code does
    changes it.  The tree's text follows the Python version's ``ast``; a new
    Python gives a new key, which only means recompiling and a full run.
    """
    h = hashlib.sha256()
    for path in kernel_closure():
        rel = path.relative_to(PACKAGE_DIR).as_posix()
        tree = _without_docstrings(ast.parse(path.read_bytes(), filename=str(path)))
        h.update(rel.encode() + b"\0")
        h.update(ast.dump(tree, include_attributes=False).encode() + b"\0")
    return h.hexdigest()


def cache_root() -> Path:
    base = os.environ.get("REFREPLAY_CACHE_ROOT")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "refreplay"


def _remembered_kernel_hash(sources: str) -> str:
    """``kernel_hash()``, remembered on disk under the hash of every source byte.

    Walking every module's syntax tree costs about a second, paid by each
    process at import (each CLI call, each worker); the key it gives depends
    only on the package's sources and the Python version, both in the file
    name, so a remembered value is the value.  An unreadable or unwritable
    cache only means computing it.
    """
    name = f"{sources}-py{sys.version_info[0]}.{sys.version_info[1]}"
    path = cache_root() / "kernel-keys" / name
    try:
        text = path.read_text()
        if len(text) == 64 and all(c in "0123456789abcdef" for c in text):
            return text
    except (OSError, UnicodeDecodeError):
        pass
    key = kernel_hash()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{name}.{os.getpid()}.tmp")
        tmp.write_text(key)
        os.replace(tmp, path)
    except OSError:
        pass
    return key


SOURCE_HASH = source_hash()
KERNEL_HASH = _remembered_kernel_hash(SOURCE_HASH)
CACHE_DIR = cache_root() / f"numba-{KERNEL_HASH[:16]}"


def _omp_runtime_loaded() -> bool:
    """Whether an OpenMP runtime is already mapped into the process (Linux;
    elsewhere False)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return False
    return any(name in maps for name in ("libgomp", "libiomp", "libomp"))


def _needed(path: Path) -> list[str]:
    """The DT_NEEDED names of the ELF64 little-endian shared object ``path``
    (its dynamic section and the string table it links to); [] if unreadable."""
    import struct

    try:
        data = path.read_bytes()
        if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            return []
        (shoff,) = struct.unpack_from("<Q", data, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
        sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
        out = []
        for sh in sections:
            if sh[1] != 6:  # SHT_DYNAMIC
                continue
            stroff = sections[sh[6]][4]
            for j in range(0, sh[5], 16):
                tag, val = struct.unpack_from("<qQ", data, sh[4] + j)
                if tag == 1:  # DT_NEEDED
                    out.append(data[stroff + val : data.index(b"\0", stroff + val)].decode())
        return out
    except (OSError, struct.error, IndexError, ValueError, UnicodeDecodeError):
        return []


def _numba_omp_shared() -> bool:
    """Whether the OpenMP runtime Numba's ``omp`` layer links to is one
    already loaded (so its waiting policy is fixed), as opposed to a copy of
    its own that will read ``OMP_WAIT_POLICY`` when it loads (a PyTorch wheel
    loads a private libgomp; Numba's pool then loads the system's).  True
    when it cannot tell."""
    import ctypes
    import importlib.util

    try:
        spec = importlib.util.find_spec("numba")
        pools = sorted(Path(spec.origin).parent.joinpath("np", "ufunc").glob("omppool*"))
    except (ImportError, AttributeError, TypeError, ValueError, OSError):
        return True
    names = [n for p in pools[:1] for n in _needed(p) if "omp" in n]
    if not names:
        return True
    for name in names:
        try:
            ctypes.CDLL(name, mode=getattr(os, "RTLD_NOLOAD", 4) | getattr(os, "RTLD_LAZY", 1))
            return True
        except OSError:
            continue
    return False


OMP_RUNTIME_PRELOADED = _omp_runtime_loaded()


def configure() -> None:
    if "OMP_WAIT_POLICY" not in os.environ and OMP_RUNTIME_PRELOADED and _numba_omp_shared():
        os.environ.setdefault("NUMBA_THREADING_LAYER", "workqueue")  # the loaded pool spins
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ["NUMBA_DISABLE_INTEL_SVML"] = "1"
    os.environ["NUMBA_CACHE_DIR"] = str(CACHE_DIR)
    import sys

    if "numba" in sys.modules:  # imported before us: patch its live config too
        from numba.core import config

        config.CACHE_DIR = str(CACHE_DIR)
        config.THREADING_LAYER = os.environ.get("NUMBA_THREADING_LAYER", config.THREADING_LAYER)


configure()
