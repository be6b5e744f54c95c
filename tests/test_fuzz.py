"""`refreplay fuzz`: hypothesis finds shape-dependent algorithm switches that
the kernel's small cases hide, shrinks them to a minimal case, diagnoses and
saves it, deterministically per seed ([conf.runner.c1])."""

import json
import sys

import numpy as np
import pytest

import fuzz_kernels
from refreplay import cli
from refreplay.conformance.running import adapters as kernels
from refreplay.conformance.golden import store
from refreplay.testing import fuzz

MAX_ELEMENTS = 4096


def _kernel(name):
    return kernels.resolve(f"fuzz_kernels:{name}")


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint32)


@pytest.fixture(scope="module")
def split_k():
    return fuzz.fuzz(_kernel("matmul"), "matmul", 200, 0, MAX_ELEMENTS)


def test_split_k_matmul_is_found_and_shrunk(split_k):
    out = split_k
    assert out.result is not None and out.result.status == "fail"
    assert out.found_after <= 50
    d = out.dims
    assert fuzz_kernels.SPLIT_K_ABOVE < d["K"] <= fuzz_kernels.SPLIT_K_ABOVE + 8
    assert d["I"] == 1 and d["J"] == 1
    # the shrunk case is a real difference: the reference passes it
    assert (
        kernels.resolve("reference").run("matmul", list(out.result.case.inputs.values()), {})["C"].tobytes()
        == out.result.case.outputs["C"].tobytes()
    )


def test_online_softmax_is_found_and_shrunk():
    out = fuzz.fuzz(_kernel("softmax_forward"), "softmax_forward", 200, 0, MAX_ELEMENTS)
    assert out.result is not None and out.result.status == "fail"
    assert out.found_after <= 50
    assert fuzz_kernels.ONLINE_SOFTMAX_ABOVE < out.dims["V"] <= fuzz_kernels.ONLINE_SOFTMAX_ABOVE + 8
    assert out.dims["N"] == 1


def test_the_reference_passes_its_own_fuzz():
    for op in ("matmul", "softmax_forward"):
        out = fuzz.fuzz(kernels.resolve("reference"), op, 25, 1, MAX_ELEMENTS)
        assert out.result is None and out.examples == 25


def test_fuzz_cli_is_deterministic_diagnoses_and_saves_a_replayable_case(tmp_path, capsys, monkeypatch, split_k):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HYPOTHESIS_STORAGE_DIRECTORY", raising=False)
    rc = cli.main(
        [
            "fuzz",
            "fuzz_kernels:matmul",
            "--op",
            "matmul",
            "--examples",
            "200",
            "--max-elements",
            str(MAX_ELEMENTS),
            "--json",
            str(tmp_path / "f.json"),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 1
    # the same seed gives the same run as the fixture's (in-process) one
    assert (
        f"a difference after {split_k.found_after} examples, shrunk to I=1,K={split_k.dims['K']},J=1 "
        f"({split_k.examples} examples in all"
    ) in out
    assert "NOT CONFORMANT" in out and "Diagnosis:" in out
    assert "sums in another order" in out
    rep = json.loads((tmp_path / "f.json").read_text())
    assert not rep["conformant"] and rep["cases"][0]["id"] == "matmul-fuzz-00"
    assert rep["fuzz"]["found_after"] == split_k.found_after and rep["fuzz"]["dims"] == split_k.dims
    saved = tmp_path / "refreplay-fuzz" / "matmul-seed0"  # the default place
    assert (saved / store.MANIFEST).is_file()
    (case,) = store.load_cases(saved)[1]
    for n in case.inputs:
        assert np.array_equal(_bits(case.inputs[n]), _bits(split_k.result.case.inputs[n]))
    assert not (tmp_path / ".hypothesis").exists()  # no hypothesis files in the working directory
    assert cli.main(["conform", "fuzz_kernels:matmul", "--vectors", str(saved)]) == 1
    assert cli.main(["conform", "reference", "--vectors", str(saved)]) == 0
    capsys.readouterr()
    rc = cli.main(
        [
            "fuzz",
            "reference",
            "--op",
            "matmul",
            "--examples",
            "10",
            "--max-elements",
            "256",
            "--json",
            str(tmp_path / "p.json"),
            "--junit",
            str(tmp_path / "p.xml"),
        ]
    )
    assert rc == 0 and "every one matches" in capsys.readouterr().out
    rep = json.loads((tmp_path / "p.json").read_text())
    assert rep["conformant"] and rep["fuzz"]["examples"] == 10 and rep["fuzz"]["found_after"] is None
    assert b'failures="0"' in (tmp_path / "p.xml").read_bytes()


# The in-process call, once bare and once after importing what the CLI imports before running (the
# save checks); each in a fresh interpreter, so that no earlier test can put the process in either state.
_IN_PROCESS = (
    """
import sys
if sys.argv[1] == "after-imports":
    from refreplay.conformance.golden import live_save, store  # noqa: F401
    live_save.check_save_target(sys.argv[2])
from refreplay.conformance.running import adapters as kernels
from refreplay.testing import fuzz
o = fuzz.fuzz(kernels.resolve("fuzz_kernels:matmul"), "matmul", 200, 0, %d)
print(f"after {o.found_after} examples ({o.examples} examples in all")
"""
    % MAX_ELEMENTS
)


def test_fuzz_same_seed_same_run_from_every_entry_point(tmp_path):
    import os
    import re
    import subprocess
    from pathlib import Path

    tests = Path(__file__).resolve().parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests.parent), str(tests)])}

    def py(*argv):
        p = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
        found = re.search(r"after \d+ examples.*?\(\d+ examples in all", p.stdout)
        assert found, p.stdout + p.stderr
        return found.group(0).replace(", shrunk to I=1,K=65,J=1 ", " ")

    cli_run = py(
        "-m",
        "refreplay",
        "fuzz",
        "fuzz_kernels:matmul",
        "--op",
        "matmul",
        "--examples",
        "200",
        "--max-elements",
        str(MAX_ELEMENTS),
        "--save",
        str(tmp_path / "saved"),
    )
    assert py("-c", _IN_PROCESS, "bare", str(tmp_path / "x")) == cli_run
    assert py("-c", _IN_PROCESS, "after-imports", str(tmp_path / "x")) == cli_run


@pytest.mark.parametrize(
    "args,message",
    [
        (["--op", "matmul", "--examples", "0"], "--examples"),
        (["--op", "matmul", "--max-elements", "0"], "--max-elements"),
        (["--op", "layernorm_forward", "--max-elements", "1"], "smallest"),
        (["--op", "no_such_op"], "unknown op"),
        (["--op", "matmul", "--seed", "-3"], "--seed"),
    ],
)
def test_fuzz_bad_arguments_exit_2(capsys, args, message):
    assert cli.main(["fuzz", "reference", *args]) == 2
    assert message in capsys.readouterr().err


def test_fuzz_refuses_a_save_directory_it_may_not_write_before_running(tmp_path, capsys):
    (tmp_path / "keep.txt").write_text("mine")
    assert cli.main(["fuzz", "fuzz_kernels:matmul", "--op", "matmul", "--save", str(tmp_path)]) == 2
    assert "not empty" in capsys.readouterr().err and (tmp_path / "keep.txt").read_text() == "mine"


def test_fuzz_without_hypothesis_exits_2(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "hypothesis", None)  # import hypothesis raises ImportError
    assert cli.main(["fuzz", "reference", "--op", "matmul"]) == 2
    assert "pip install 'refreplay[fuzz]'" in capsys.readouterr().err


def test_kernel_errors_and_declines_are_failures(tmp_path, monkeypatch, capsys):
    mod = tmp_path / "odd_kernels.py"
    mod.write_text(
        "import numpy as np\n"
        "def matmul(A, B):\n"
        "    if A.shape[1] > 20: raise RuntimeError('too long')\n"
        "    from refreplay import linalg\n"
        "    from refreplay.conformance.base.case import load_inputs\n"
        "    return linalg.matmul(*load_inputs([A, B]))\n"
        "def other(op, *xs):\n"
        "    raise NotImplementedError\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    out = fuzz.fuzz(kernels.resolve("odd_kernels:matmul"), "matmul", 100, 0, 1024)
    assert out.result.status == "error" and out.dims["K"] == 21 and "too long" in out.result.message
    assert cli.main(["fuzz", "odd_kernels:other", "--op", "sum", "--examples", "5", "--save", str(tmp_path / "s")]) == 1
    assert "SKIP" in capsys.readouterr().out


# ---- the public strategies -------------------------------------------------------------

from hypothesis import Phase, given, settings  # noqa: E402

from refreplay.conformance.shapes import live  # noqa: E402
from refreplay.testing import strategies as rs  # noqa: E402

_u = lambda a: np.ascontiguousarray(a).view(np.uint32)  # noqa: E731


EDGES = {
    "negative zero": lambda a: (_u(a) == 0x80000000).any(),
    "subnormal": lambda a: (((_u(a) & 0x7F800000) == 0) & ((_u(a) & 0x7FFFFF) != 0)).any(),
    "non-canonical NaN": lambda a: (np.isnan(a) & (_u(a) != 0x7FC00000)).any(),
    "infinity": lambda a: np.isinf(a).any(),
    "max finite": lambda a: (np.abs(a) == np.finfo(np.float32).max).any(),
    "a rounding tie (2.5)": lambda a: (a == np.float32(2.5)).any(),
}


@pytest.mark.parametrize("shape", [(8,), (300,)])
def test_value_strategies_reach_edge_values(shape):
    seen = set()

    @settings(max_examples=300, database=None, derandomize=True, phases=[Phase.generate])
    @given(rs.f32_arrays(shape))
    def draw(a):
        seen.update(k for k, pred in EDGES.items() if pred(a))

    draw()
    assert seen == set(EDGES)


def test_sizes_reach_the_edges():
    want = {0, 1, 63, 64, 65, 127, 129, 1023, 1025}
    seen = set()

    @settings(max_examples=1000, database=None, derandomize=True, phases=[Phase.generate])
    @given(rs.sizes(0, 1 << 16))
    def draw(n):
        assert 0 <= n <= 1 << 16
        seen.add(n)

    draw()
    assert want <= seen, want - seen


@pytest.mark.parametrize(
    "op", ["matmul", "attention_backward", "rope_forward", "embedding_forward", "layernorm_forward"]
)
def test_shapes_respect_the_budget_and_the_op(op):
    @settings(max_examples=60, database=None, derandomize=True)
    @given(rs.shapes(op, 5000))
    def check(dims):
        assert live.validate(op, dims, 5000) == dims  # letters, minimums, constraints and the bound

    check()


def test_strategies_in_a_kernel_authors_own_test():
    """The documented use: a hypothesis test of one's own kernel fails on
    the split-K kernel and passes on the reference."""
    import numba

    from refreplay import linalg
    from refreplay.conformance.base.case import load_inputs

    def my_test(kernel, examples):
        @settings(
            max_examples=examples, database=None, derandomize=True, deadline=None, phases=[Phase.generate, Phase.shrink]
        )  # no explain phase: it re-runs the kernel a lot
        @given(rs.op_inputs("matmul", max_elements=4096))
        def test(case):
            dims, inputs = case
            assert rs.same_bits(rs.expected("matmul", inputs)["C"], kernel(inputs["A"], inputs["B"]))

        test()

    keep = numba.get_num_threads()
    numba.set_num_threads(1)  # small cases: a parallel launch costs more than the work
    try:
        with pytest.raises(AssertionError):
            my_test(fuzz_kernels.matmul, 200)
        my_test(lambda A, B: linalg.matmul(*load_inputs([A, B])), 30)
    finally:
        numba.set_num_threads(keep)
