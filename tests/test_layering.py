"""The package's layers: the map in ``refreplay/__init__.py`` places every
top-level module and sub-package, and every import of one package module by
another (lazy imports inside functions included) goes to a lower layer, so
there is no upward import and no import cycle between them."""

import ast
import re
from pathlib import Path

import pytest

import refreplay

PKG = Path(refreplay.__file__).resolve().parent


def layer_map(doc: str) -> dict[str, int]:
    """{unit: layer} from the docstring's lines "    N      unit unit ..."."""
    out = {}
    for m in re.finditer(r"^    (\d)      (\S.*)$", doc, re.M):
        for name in m.group(2).split():
            assert name not in out, f"{name} is placed twice in the layer map"
            out[name] = int(m.group(1))
    return out


LAYERS = layer_map(refreplay.__doc__)


def units_on_disk() -> set[str]:
    return {p.stem for p in PKG.glob("*.py") if p.stem != "__init__"} | {
        p.parent.name for p in PKG.glob("*/__init__.py")
    }


def imported_units(rel: Path, source: str) -> list[tuple[int, str]]:
    """(line, unit) of every package import in the module at ``rel`` (relative
    to the package directory); the unit of refreplay.a.b is "a", of a name
    imported from the package root ("from .. import doctor") the name itself,
    and "" for the root's own names (``__version__``)."""
    pkg = ["refreplay", *rel.parent.parts]
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[: len(pkg) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod == "refreplay":
                names = [a.name if a.name in LAYERS else "" for a in node.names]
            elif mod.startswith("refreplay."):
                names = [mod.split(".")[1]]
            else:
                names = []
        elif isinstance(node, ast.Import):
            names = [a.name.split(".")[1] for a in node.names if a.name.startswith("refreplay.")]
        else:
            continue
        out += [(node.lineno, n) for n in names]
    return out


def upward_imports(rel: Path, source: str) -> list[str]:
    unit = rel.parts[0].removesuffix(".py")
    return [
        f"{rel}:{line}: layer {LAYERS[unit]} ({unit}) imports layer {LAYERS[target]} ({target})"
        for line, target in imported_units(rel, source)
        if target and target != unit and LAYERS[target] >= LAYERS[unit]
    ]


def test_every_module_is_placed_in_the_layer_map():
    assert set(LAYERS) == units_on_disk(), (
        "refreplay/__init__.py's layer map and the package differ: "
        f"missing {sorted(units_on_disk() - set(LAYERS))}, stale {sorted(set(LAYERS) - units_on_disk())}"
    )


def test_imports_go_only_downward():
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG)
        if rel.name == "__init__.py" and rel.parent == Path("."):
            continue  # the root only sets up the process (_env)
        bad += upward_imports(rel, path.read_text())
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(
    "rel, source",
    [
        ("training/step.py", "from ..verify import replay\n"),
        ("training/step.py", "def f():\n    from ..verify.replay import replay\n"),
        ("ops/linear.py", "from ..training import treefold\n"),
        ("numerics/core.py", "import refreplay.training.step\n"),
        ("state.py", "from . import tensorio\n"),  # same layer is not below
        ("verify/replay.py", "from .. import conformance\n"),
    ],
)
def test_an_upward_import_is_caught(rel, source):
    assert upward_imports(Path(rel), source)


@pytest.mark.parametrize(
    "rel, source",
    [
        ("verify/replay.py", "from ..training.run import open_run\nfrom .. import __version__, state\n"),
        ("training/launch/mpi.py", "from ...errors import InputError\nfrom ..treefold import fold_blocks\n"),
    ],
)
def test_a_downward_import_passes(rel, source):
    assert not upward_imports(Path(rel), source)


# ---- cuda_backend: the twin of layers 1-3, below the trainer -----------------------
#
# cuda_backend mirrors numerics, linalg and ops for the device: it may import
# those reference layers (constants, the shapes' validation) and nothing above
# them; the trainer and everything above reach it, the layers it mirrors never do.

CUDA = PKG.parent / "cuda_backend"
CUDA_MAX_LAYER = LAYERS["ops"]


def cuda_upward_imports(rel: str, source: str) -> list[str]:
    """Imports in cuda_backend/``rel`` of a refreplay layer above ops."""
    bad = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and not node.level:
            mods = [node.module or ""]
            if node.module == "refreplay":
                mods = [f"refreplay.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        else:
            continue
        for mod in mods:
            parts = mod.split(".")
            if parts[0] == "refreplay" and len(parts) > 1 and LAYERS.get(parts[1], 0) > CUDA_MAX_LAYER:
                bad.append(
                    f"cuda_backend/{rel}:{node.lineno}: imports {mod} "
                    f"(layer {LAYERS[parts[1]]}, above the ops it mirrors)"
                )
    return bad


def test_cuda_backend_imports_only_the_layers_it_mirrors():
    bad = []
    for path in sorted(CUDA.rglob("*.py")):
        bad += cuda_upward_imports(path.relative_to(CUDA).as_posix(), path.read_text())
    assert not bad, "\n".join(bad)


def test_the_layers_cuda_backend_mirrors_never_import_it():
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG)
        unit = rel.parts[0].removesuffix(".py")
        if rel == Path("__init__.py") or LAYERS[unit] > CUDA_MAX_LAYER:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            bad += [f"{rel}:{node.lineno}: imports {n}" for n in names if n.split(".")[0] == "cuda_backend"]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize(
    "source",
    [
        "from refreplay.training import treefold as ref\n",
        "def f():\n    from refreplay.training import treefold\n",
        "import refreplay.verify.replay\n",
        "from refreplay import training\n",
    ],
)
def test_an_upward_import_from_cuda_backend_is_caught(source):
    assert cuda_upward_imports("treefold.py", source)


def test_cuda_backend_may_import_numerics():
    assert not cuda_upward_imports(
        "transcendental.py", "from refreplay.numerics.transcendental import EXP_C\nfrom refreplay import numerics\n"
    )


# ---- conformance/: its stages, in the map of refreplay/conformance/__init__.py -------------

import refreplay.conformance as _conformance  # noqa: E402

CONF = PKG / "conformance"
STAGES = {
    name.split()[0]: n
    for name, n in (
        (m.group(2), int(m.group(1))) for m in re.finditer(r"^    (\d)      (\S.*)$", _conformance.__doc__, re.M)
    )
}


def conformance_imports(rel: str, source: str) -> list[tuple[int, str, str]]:
    """(line, stage, module) of every import of a conformance module in conformance/``rel``:
    its stage is the sub-package (or "api"), its module the dotted name below the suite."""
    pkg = ["refreplay", "conformance", *Path(rel).parent.parts]
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[: len(pkg) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            mods = [f"{mod}.{a.name}" for a in node.names] if mod.count(".") <= 2 else [mod]
        elif isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        else:
            continue
        for m in mods:
            parts = m.split(".")
            if parts[:2] == ["refreplay", "conformance"] and len(parts) > 2:
                out.append((node.lineno, parts[2], ".".join(parts[2:4])))
    return out


def conformance_violations(rel: str, source: str) -> list[str]:
    stage = Path(rel).parts[0].removesuffix(".py")
    return [
        f"conformance/{rel}:{line}: stage {STAGES[stage]} ({stage}) imports stage {STAGES.get(target, '?')} ({target})"
        for line, target, _ in conformance_imports(rel, source)
        if target != stage and (target not in STAGES or STAGES[target] >= STAGES[stage])
    ]


def test_every_conformance_file_is_in_a_stage():
    on_disk = {p.stem for p in CONF.glob("*.py") if p.stem != "__init__"} | {
        p.parent.name for p in CONF.glob("*/__init__.py")
    }
    assert set(STAGES) == on_disk, (sorted(on_disk - set(STAGES)), sorted(set(STAGES) - on_disk))
    assert not [p for p in CONF.glob("*/*/") if p.name != "__pycache__"], "stages are one level deep"


def test_conformance_imports_go_only_to_lower_stages():
    bad = []
    for path in sorted(CONF.rglob("*.py")):
        rel = path.relative_to(CONF).as_posix()
        if rel == "__init__.py":
            continue  # the suite's entry loads api lazily
        bad += conformance_violations(rel, path.read_text())
    assert not bad, "\n".join(bad)


def test_no_circle_inside_a_stage():
    graph: dict[str, set[str]] = {}
    for path in sorted(CONF.rglob("*.py")):
        rel = path.relative_to(CONF)
        if len(rel.parts) != 2:
            continue
        me = f"{rel.parts[0]}.{rel.stem}"
        graph[me] = {
            m
            for _, st, m in conformance_imports(rel.as_posix(), path.read_text())
            if st == rel.parts[0] and m != me and "." in m and not m.endswith(".__init__")
        }
    state: dict[str, int] = {}

    def visit(node, trail):
        if state.get(node) == 1:
            raise AssertionError("import circle: " + " -> ".join(trail[trail.index(node) :] + [node]))
        if state.get(node) == 2:
            return
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            visit(nxt, trail + [node])
        state[node] = 2

    for node in sorted(graph):
        visit(node, [])


@pytest.mark.parametrize(
    "rel, source",
    [
        ("table/core.py", "from ..golden import store\n"),  # up
        ("inputs/builders.py", "def f():\n    from ..shapes import axes\n"),  # up, lazy
        ("base/case.py", "from ..readings import orders\n"),
        ("running/compare.py", "from refreplay.conformance.diagnosis import diagnose\n"),
        ("golden/store.py", "from .. import api\n"),
        ("readings/bf16.py", "from ..readings import orders\nfrom ..inputs import values\n"),
    ],
)
def test_an_upward_conformance_import_is_caught(rel, source):
    assert conformance_violations(rel, source)


@pytest.mark.parametrize(
    "rel, source",
    [
        ("golden/generate.py", "from ..shapes import axes as axis_sweeps\nfrom ..table import OPS\n"),
        ("api.py", "from .reporting import report\n"),
        ("readings/bf16.py", "from . import transformer as Vr\nfrom ..base.bf16 import widen\n"),
    ],
)
def test_a_downward_conformance_import_passes(rel, source):
    assert not conformance_violations(rel, source)
