"""Real MPI ranks give the bits of in-process ranks ([fold.ranks.c1],
[data.batch.c1]): the TreeFold travels as point-to-point messages.

Each test starts several Python processes (about a minute of CPU on two
cores), so they are marked slow as well as mpi and stay out of the default
run.  Run them with:

    pip install 'mpi4py>=4' 'mpich>=4'
    python -m pytest -m mpi tests/test_mpi.py

(skipped, with the reason, when mpi4py or mpiexec is missing).
"""

import importlib.util
import os
import subprocess
import sys

import numba
import pytest

from refreplay.training import launch, presets, run
from refreplay.training.launch import mpi as mpi_launch
from refreplay.training.train import train

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

BYTE_CAP = 1 << 16
STEPS = 3


def _mpiexec():
    if importlib.util.find_spec("mpi4py") is None:
        pytest.skip("mpi4py is not installed: pip install 'mpi4py>=4' 'mpich>=4'")
    try:
        return mpi_launch.mpiexec_path()
    except Exception as exc:  # InputError naming the missing piece
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def inproc_run(tmp_path_factory):
    keep = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        out = tmp_path_factory.mktemp("mpi") / "inproc"
        m, t = presets.preset("tiny")
        train(
            m,
            t,
            steps=STEPS,
            checkpoint_every=STEPS,
            out=out,
            launcher=launch.get("inproc", 1),
            preset="tiny",
            byte_cap=BYTE_CAP,
            progress=None,
        )
    finally:
        numba.set_num_threads(keep)
    return out


def _args(out, ranks):
    return [
        "train",
        "--preset",
        "tiny",
        "--steps",
        str(STEPS),
        "--checkpoint-every",
        str(STEPS),
        "--launcher",
        "mpi",
        "--ranks",
        str(ranks),
        "--out",
        str(out),
        "--byte-cap",
        str(BYTE_CAP),
        "--threads",
        "1",
        "--quiet",
    ]


def _env():
    return {k: v for k, v in os.environ.items() if k not in ("PMI_RANK", "PMI_SIZE", "PMIX_RANK")}


def _same_run(a, b):
    assert (a / "steps.jsonl").read_text() == (b / "steps.jsonl").read_text()
    for ck in sorted((a / "checkpoints").iterdir()):
        assert (b / "checkpoints" / ck.name).read_bytes() == ck.read_bytes(), ck.name
    assert run.open_run(b).recipe.launcher == "mpi"


def test_mpi_two_ranks_relaunched_by_refreplay(inproc_run, tmp_path):
    """`refreplay train --launcher mpi --ranks 2` re-runs itself under
    mpiexec; its records and checkpoints equal the in-process run's."""
    _mpiexec()
    out = tmp_path / "mpi2"
    res = subprocess.run(
        [sys.executable, "-m", "refreplay", *_args(out, 2)], capture_output=True, text=True, env=_env(), timeout=600
    )
    assert res.returncode == 0, res.stdout + res.stderr
    _same_run(inproc_run, out)


def test_mpi_four_ranks_under_mpiexec(inproc_run, tmp_path):
    """`mpiexec -n 4 python -m refreplay train --launcher mpi --ranks 4` (the
    command of docs/run-format.md) equals the in-process run."""
    mpiexec = _mpiexec()
    out = tmp_path / "mpi4"
    res = subprocess.run(
        [mpiexec, "-n", "4", sys.executable, "-m", "refreplay", *_args(out, 4)],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=600,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    _same_run(inproc_run, out)


def test_mpi_bad_input_exits_2_on_every_rank(tmp_path):
    """An error on the root (here: a non-empty output directory) ends every
    rank with exit status 2 and one clear message, instead of leaving the
    other ranks waiting for messages."""
    _mpiexec()
    out = tmp_path / "full"
    out.mkdir()
    (out / "x").write_text("x")
    res = subprocess.run(
        [sys.executable, "-m", "refreplay", *_args(out, 2)], capture_output=True, text=True, env=_env(), timeout=600
    )
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.count("refusing to overwrite") == 1, res.stderr
