"""Reading ``spec/``: clauses, labels, worked examples, traceability.

The spec is plain text (see ``spec/00-conventions.txt``).  This module parses
it into clauses, evaluates the worked examples, and checks that code, tests and
vectors cite only labels that exist and that every normative clause is cited
by code and by a test.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .resources import CHECKOUT_DIR, data_dir

REPO_DIR = CHECKOUT_DIR
SPEC_DIR = data_dir("spec")

LABEL_RE = re.compile(r"\[([a-z][a-z0-9_]*(?:\.[a-z0-9_]+)*\.[cr][0-9]+)\]")
HEADER_RE = re.compile(r"^\[([a-z][a-z0-9_]*(?:\.[a-z0-9_]+)*\.[cr][0-9]+)\]\s+(.*\S)\s*$")
EXAMPLE_RE = re.compile(r"^\s*example:\s*(.+)\s+=\s+(.+?)\s*$")  # splits at the last " = "


class SpecError(Exception):
    """The spec text is malformed (duplicate label, bad example syntax...)."""


@dataclass
class Clause:
    label: str
    title: str
    file: str
    line: int
    body: list[str] = field(default_factory=list)

    @property
    def normative(self) -> bool:
        return re.search(r"\.c[0-9]+$", self.label) is not None

    @property
    def examples(self) -> list[tuple[int, str, str]]:
        out = []
        for i, text in enumerate(self.body):
            m = EXAMPLE_RE.match(text)
            if m:
                out.append((self.line + 1 + i, m.group(1), m.group(2)))
        return out

    def text(self) -> str:
        return "\n".join([f"[{self.label}] {self.title}"] + self.body).rstrip() + "\n"


def spec_files(spec_dir: Path = SPEC_DIR) -> list[Path]:
    return sorted(spec_dir.glob("*.txt"))


def version(spec_dir: Path = SPEC_DIR) -> str:
    return (spec_dir / "VERSION").read_text().strip()


# [conv.version.c1] Earlier versions whose runs this version replays: their
# clauses that a run's arithmetic depends on are unchanged here.
EARLIER_REPLAYED = ("0.3.0", "0.2.0")


def replayed_versions(spec_dir: Path = SPEC_DIR) -> tuple[str, ...]:
    """[conv.version.c1] The spec versions whose runs this implementation
    replays: its own, then the earlier ones it keeps unchanged."""
    return (version(spec_dir),) + EARLIER_REPLAYED


def spec_sha256(spec_dir: Path = SPEC_DIR) -> str:
    """SHA-256 over VERSION and every chapter (name and bytes, sorted)."""
    h = hashlib.sha256()
    for path in [spec_dir / "VERSION"] + spec_files(spec_dir):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def parse(spec_dir: Path = SPEC_DIR) -> dict[str, Clause]:
    clauses: dict[str, Clause] = {}
    for path in spec_files(spec_dir):
        current = None
        lines = path.read_text().splitlines()
        for n, line in enumerate(lines, 1):
            m = HEADER_RE.match(line)
            nxt = lines[n] if n < len(lines) else ""
            if m:
                label, title = m.groups()
                if label in clauses:
                    raise SpecError(f"{path.name}:{n}: duplicate label [{label}]")
                current = Clause(label, title, path.name, n)
                clauses[label] = current
            elif line.strip() and not line[0].isspace() and re.fullmatch(r"=+", nxt.strip() or "x"):
                current = None  # a chapter heading ends the clause
            elif current is not None and not re.fullmatch(r"=+", line.strip() or "x"):
                current.body.append(line)
    for c in clauses.values():
        while c.body and not c.body[-1].strip():
            c.body.pop()
    return clauses


# ---- worked examples ---------------------------------------------------------

_DTYPES = {
    "f32": np.float32,
    "i8": np.int8,
    "i32": np.int32,
    "i64": np.int64,
    "u32": np.uint32,
    "u64": np.uint64,
    "u8": np.uint8,
    "u16": np.uint16,
    "bf16": np.uint16,
}
_BITS = {"f32": np.uint32}


def _value(node: ast.AST):
    """Evaluate one value of the example language (see [conv.values.c1])."""
    if isinstance(node, ast.Tuple):
        return tuple(_value(e) for e in node.elts)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _DTYPES:
        if len(node.args) != 1:
            raise SpecError(f"{node.func.id}(...) takes one argument")
        name = node.func.id
        raw = ast.literal_eval(node.args[0])
        if name in _BITS:
            bits = np.array(raw, dtype=np.uint64)
            if np.any(bits > 0xFFFFFFFF):
                raise SpecError("f32 bit pattern wider than 32 bits")
            arr = bits.astype(np.uint32).view(np.float32)
        else:
            arr = np.array(raw, dtype=_DTYPES[name])
        return arr if isinstance(raw, list) else arr[()]
    if isinstance(node, ast.Call):
        return _call(node)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, str, bool)):
        return node.value
    raise SpecError(f"unsupported example syntax: {ast.dump(node)[:80]}")


# An example names a module of the reference relative to the package
# ("numerics.exp", "ops.quant.step_size"); the trainer's modules (chapters
# 20-23: "tokens", "data", "model", "treefold", "run") live in its training layer.
_EXAMPLE_PACKAGES = ("refreplay", "refreplay.training")


def _example_module(module: str):
    for package in _EXAMPLE_PACKAGES:
        try:
            if importlib.util.find_spec(f"{package}.{module}") is not None:
                return importlib.import_module(f"{package}.{module}")
        except ModuleNotFoundError:  # a parent of the dotted name is missing
            continue
    raise SpecError(f"example calls module {module!r}: no such module of the reference")


def _call(node: ast.Call):
    dotted = ast.unparse(node.func)
    if not re.fullmatch(r"[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)+", dotted):
        raise SpecError(f"example calls {dotted!r}: expected module.function")
    module, _, name = dotted.rpartition(".")
    fn = getattr(_example_module(module), name)
    args = [_value(a) for a in node.args]
    kwargs = {k.arg: _value(k.value) for k in node.keywords}
    return fn(*args, **kwargs)


def _coerce(expected, actual):
    """Numba boxes a float32/int8 scalar result as a Python float/int; the
    conversion back to the expected type is exact for every value of it."""
    if isinstance(expected, tuple) and isinstance(actual, tuple) and len(expected) == len(actual):
        return tuple(_coerce(e, a) for e, a in zip(expected, actual))
    if isinstance(expected, np.generic) and isinstance(actual, (bool, int, float)):
        return np.array(actual, dtype=expected.dtype)[()]
    return actual


def _same(expected, actual) -> bool:
    if isinstance(expected, tuple):
        return (
            isinstance(actual, tuple)
            and len(actual) == len(expected)
            and all(_same(e, a) for e, a in zip(expected, actual))
        )
    e, a = np.asarray(expected), np.asarray(actual)
    if e.shape != a.shape or e.dtype != a.dtype:
        return False
    return e.tobytes() == a.tobytes()


def _show(v) -> str:
    if isinstance(v, tuple):
        return "(" + ", ".join(_show(x) for x in v) + ")"
    a = np.asarray(v)
    if a.dtype == np.float32:
        bits = a.view(np.uint32)
        body = [f"0x{int(b):08X}" for b in bits.reshape(-1)]
        return f"f32({body[0]})" if a.ndim == 0 else f"f32(shape={a.shape}, {body[:8]})"
    return f"{a.dtype}({a.tolist()})"


def run_example(expr: str, result: str) -> tuple[bool, str]:
    """Evaluate one example line; return (passed, message)."""
    try:
        call = ast.parse(expr, mode="eval").body
        want = _value(ast.parse(result, mode="eval").body)
        if not isinstance(call, ast.Call):
            raise SpecError("the left side of an example must be a call")
        got = _coerce(want, _call(call))
    except SpecError as exc:
        return False, f"malformed example: {exc}"
    if _same(want, got):
        return True, "ok"
    return False, f"expected {_show(want)}, got {_show(got)}"


# ---- traceability --------------------------------------------------------------

CODE_DIRS = ("refreplay", "cuda_backend")
TEST_DIRS = ("tests",)
VECTOR_DIRS = ("vectors",)
_SCANNED = (".py", ".txt", ".json", ".md", ".c", ".cu", ".sh")


def citations(dirs, root: Path = REPO_DIR) -> dict[str, set[str]]:
    """label -> set of files (relative paths) that cite it."""
    found: dict[str, set[str]] = {}
    for d in dirs:
        base = root / d
        if not base.exists():
            continue
        for path in sorted(base.rglob("*")):
            if path.suffix not in _SCANNED or not path.is_file() or "__pycache__" in path.parts:
                continue
            for label in LABEL_RE.findall(path.read_text(errors="replace")):
                found.setdefault(label, set()).add(path.relative_to(root).as_posix())
    return found


@dataclass
class CheckReport:
    unknown: dict[str, set[str]]
    uncited_by_code: list[str]
    uncited_by_tests: list[str]

    @property
    def ok(self) -> bool:
        return not (self.unknown or self.uncited_by_code or self.uncited_by_tests)

    def lines(self) -> list[str]:
        out = []
        for label, files in sorted(self.unknown.items()):
            out.append(f"unknown label [{label}] cited in {', '.join(sorted(files))}")
        for label in self.uncited_by_code:
            out.append(f"normative clause [{label}] is cited by no code (refreplay/, cuda_backend/)")
        for label in self.uncited_by_tests:
            out.append(f"normative clause [{label}] is cited by no test (tests/)")
        return out


def check(root: Path = REPO_DIR) -> CheckReport:
    clauses = parse(root / "spec")
    code = citations(CODE_DIRS, root)
    tests = citations(TEST_DIRS, root)
    vectors = citations(VECTOR_DIRS, root)
    cross = citations(("spec",), root)  # cross-references between clauses
    unknown: dict[str, set[str]] = {}
    for table in (code, tests, vectors, cross):
        for label, files in table.items():
            if label not in clauses:
                unknown.setdefault(label, set()).update(files)
    normative = [c.label for c in clauses.values() if c.normative and not c.label.startswith("conv.")]
    return CheckReport(
        unknown=unknown,
        uncited_by_code=[lb for lb in normative if lb not in code],
        uncited_by_tests=[lb for lb in normative if lb not in tests],
    )
