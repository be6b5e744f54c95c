"""The compiled-code cache key covers every module whose code Numba compiles.

Numba's cache checks only the timestamp of the file that defines a kernel, so
an edit to a callee in another file would reuse stale machine code; the cache
directory is keyed to the kernel closure instead (``refreplay/_env.py``).
These tests fail if a compiling module, or a module one of them imports, is
left out of the key, and if plumbing edits needlessly throw the cache away.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import refreplay
from refreplay import _env

PKG = Path(refreplay.__file__).resolve().parent


def _rel(paths):
    return {p.relative_to(PKG).as_posix() for p in paths}


def test_every_module_that_compiles_is_in_the_key():
    closure = _rel(_env.kernel_closure())
    compiling = set()
    for path in PKG.rglob("*.py"):
        text = path.read_text()
        if "@kernel" in text or "@parallel_kernel" in text or "numba.njit" in text:
            compiling.add(path.relative_to(PKG).as_posix())
    assert compiling, "the scan found no kernels at all"
    assert compiling <= closure, sorted(compiling - closure)


def test_the_key_is_closed_under_package_imports():
    closure = _env.kernel_closure()
    for path in closure:
        imports, _ = _env._package_imports(path)
        assert imports <= set(closure), (path, sorted(_rel(imports - set(closure))))


def test_relative_imports_resolve(tmp_path):
    # ``from ..numerics import core`` inside ops/x.py names numerics/core.py
    path = PKG / "ops" / "softmax.py"
    imports, compiles = _env._package_imports(path)
    assert compiles
    assert "numerics/core.py" in _rel(imports) or "numerics/__init__.py" in _rel(imports)
    tree = ast.parse(path.read_text())
    assert any(isinstance(n, ast.ImportFrom) and n.level == 2 for n in ast.walk(tree))


def _copy_package(tmp_path):
    dst = tmp_path / "refreplay"
    shutil.copytree(PKG, dst, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def _key_of(pkg_dir, monkeypatch):
    monkeypatch.setattr(_env, "PACKAGE_DIR", pkg_dir)
    return _env.kernel_hash()


def test_kernel_edit_changes_the_key_plumbing_edit_does_not(tmp_path, monkeypatch):
    pkg = _copy_package(tmp_path)
    base = _key_of(pkg, monkeypatch)
    (pkg / "cli.py").write_text((pkg / "cli.py").read_text() + "\n# plumbing edit\n")
    assert _key_of(pkg, monkeypatch) == base
    # a constant in a module that kernels import (not itself a kernel file)
    core = pkg / "numerics" / "_bits.py"
    core.write_text(core.read_text() + "\nEXTRA_CONSTANT = 1\n")
    assert _key_of(pkg, monkeypatch) != base


def test_moving_text_keeps_the_key_changing_code_does_not(tmp_path, monkeypatch):
    """Formatting, comments and docstrings leave the key alone; a changed
    literal, operator or name changes it."""
    pkg = _copy_package(tmp_path)
    base = _key_of(pkg, monkeypatch)
    core = pkg / "numerics" / "core.py"
    text = core.read_text()
    assert "def " in text and "return " in text
    reflowed = "# a comment a formatter might move\n" + text.replace("return ", "return  ", 1).replace(
        "\n\n\n", "\n\n\n\n", 1
    )
    core.write_text(reflowed)
    assert _key_of(pkg, monkeypatch) == base
    # the same call written with a trailing comma and other quotes
    probe = pkg / "numerics" / "_bits.py"
    probe.write_text(probe.read_text() + "\n_PROBE = dict(a='x', b=2)\n")
    with_probe = _key_of(pkg, monkeypatch)
    assert with_probe != base
    probe.write_text(probe.read_text().replace("dict(a='x', b=2)", 'dict(\n    a="x",\n    b=2,\n)'))
    assert _key_of(pkg, monkeypatch) == with_probe
    probe.write_text(probe.read_text().replace("b=2", "b=3"))
    changed = _key_of(pkg, monkeypatch)
    assert changed != with_probe
    # a docstring re-indented (as a formatter does) or reworded: compiled
    # code never reads it; a string that is not a docstring is code
    probe.write_text(probe.read_text() + '\n\ndef _probe():\n    """One.\n        Two."""\n    return "s"\n')
    with_def = _key_of(pkg, monkeypatch)
    probe.write_text(probe.read_text().replace('"""One.\n        Two."""', '"""One.\n    Two, reworded."""'))
    assert _key_of(pkg, monkeypatch) == with_def
    probe.write_text(probe.read_text().replace('return "s"', 'return "t"'))
    assert _key_of(pkg, monkeypatch) != with_def


def test_the_remembered_key_is_the_computed_one(tmp_path, monkeypatch):
    monkeypatch.setenv("REFREPLAY_CACHE_ROOT", str(tmp_path))
    sources = "0" * 64
    first = _env._remembered_kernel_hash(sources)
    assert first == _env.kernel_hash()
    (stored,) = (tmp_path / "kernel-keys").iterdir()
    assert stored.name.startswith(sources) and stored.read_text() == first
    # a remembered value is used as it is (it is keyed by every source byte) ...
    stored.write_text("f" * 64)
    assert _env._remembered_kernel_hash(sources) == "f" * 64
    # ... but garbage in the file is not a key, and other sources are another file
    stored.write_text("not a key")
    assert _env._remembered_kernel_hash(sources) == first
    assert _env._remembered_kernel_hash("1" * 64) == first
    assert len(list((tmp_path / "kernel-keys").iterdir())) == 2


def test_an_unwritable_cache_still_gives_the_key(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("REFREPLAY_CACHE_ROOT", str(blocker))
    assert _env._remembered_kernel_hash("2" * 64) == _env.kernel_hash()


def test_a_new_kernel_in_a_plumbing_module_joins_the_key(tmp_path, monkeypatch):
    pkg = _copy_package(tmp_path)
    target = pkg / "verify" / "audit.py"
    assert "verify/audit.py" not in _rel(_env.kernel_closure())
    target.write_text(target.read_text() + "\nfrom .._jit import kernel as _k\n")
    monkeypatch.setattr(_env, "PACKAGE_DIR", pkg)
    assert target in _env.kernel_closure()
