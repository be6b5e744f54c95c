"""Fault injection, deterministic per seed: ``train`` killed (SIGKILL) at
seeded points, checkpoint writes included, then ``--resume``d, gives the
files of an uninterrupted run; a full disk and a read-only filesystem are
exit 2 with no partial file; a planted symbolic link is never written
through; symbolic link loops, bad environment settings, a non-ASCII path
under an ASCII locale and a corrupt compile cache give clear messages and
no traceback.  The kill hooks live in ``tests/_fault_train.py`` only."""

import contextlib
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from refreplay import files
from refreplay.errors import InputError

from cli_helpers import run_cli
from test_resume import assert_same_files

HERE = Path(__file__).resolve().parent
TRAIN = ["train", "--preset", "tiny", "--steps", "5", "--checkpoint-every", "2", "--byte-cap", "65536", "--quiet"]
KINDS = ("fsync", "replace", "line", "bytes")
# events of one run of TRAIN, counted with the same hooks: 32 fsyncs, 8 renames,
# 12 record lines, 1,614,732 bytes through files.atomic_file; n is drawn within them
RANGES = {"fsync": (1, 32), "replace": (1, 8), "line": (1, 12), "bytes": (1, 1_614_732)}

pytestmark = pytest.mark.usefixtures("one_numba_thread")


def env():
    return {
        **os.environ,
        "NUMBA_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(HERE.parent), str(HERE), os.environ.get("PYTHONPATH", "")]),
    }


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """TRAIN run uninterrupted (through the command line, as the killed runs are)."""
    out = tmp_path_factory.mktemp("faults") / "ref"
    r = run_cli(*TRAIN, "--out", out)
    assert r.returncode == 0, r.stderr
    return out


def fault(seed: int):
    g = random.Random(seed)
    kind = KINDS[seed % len(KINDS)]
    lo, hi = RANGES[kind]
    return kind, g.randint(lo, hi)


def kill_and_resume(reference, tmp_path, seed):
    kind, n = fault(seed)
    out = tmp_path / "run"
    p = subprocess.run(
        [sys.executable, str(HERE / "_fault_train.py"), kind, str(n), "--", *TRAIN, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env(),
    )
    assert "Traceback" not in p.stderr, p.stderr
    if p.returncode == 0:  # the run had fewer events than n: nothing was killed
        assert_same_files(reference, out)
        return kind, n, "finished"
    assert p.returncode == -9, (kind, n, p.returncode, p.stderr)
    for name in ("recipe.json", "head.json", "data/manifest.json"):
        f = out / name
        assert not f.exists() or f.stat().st_size > 0
    assert not (out / "head.json").exists()
    r = run_cli("train", "--resume", out, "--quiet")
    if r.returncode == 2 and "nothing to resume" in r.stderr:
        assert not (out / "recipe.json").exists()  # killed before the recipe: start again, as documented
        shutil.rmtree(out)
        r = run_cli(*TRAIN, "--out", out)
    assert r.returncode == 0, (kind, n, r.stderr)
    assert_same_files(reference, out)
    return kind, n, "resumed"


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_killed_train_resumes_to_the_uninterrupted_files(reference, tmp_path, seed):
    assert kill_and_resume(reference, tmp_path, seed)[2] == "resumed"


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4, 28))
def test_killed_train_resumes_many_seeds(reference, tmp_path, seed):
    kill_and_resume(reference, tmp_path, seed)


def test_fault_points_are_deterministic_per_seed():
    assert [fault(s) for s in range(8)] == [fault(s) for s in range(8)]
    assert len({fault(s) for s in range(28)}) > 20


# ---- a full disk, a read-only filesystem, planted links ----------------------------------


@contextlib.contextmanager
def tmpfs(path: Path, size: str):
    path.mkdir(parents=True, exist_ok=True)
    if (
        os.geteuid() != 0
        or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True
        ).returncode
        != 0
    ):
        pytest.skip("needs root to mount a small tmpfs")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def no_partial_files(root: Path):
    """No temporary left behind and no empty named file."""
    for p in root.rglob("*"):
        assert not files.is_temporary(p.name), p
        if p.is_file():
            assert p.stat().st_size > 0, p


def test_full_disk_is_exit_2_with_no_partial_file(reference, tmp_path):
    with tmpfs(tmp_path / "small", "600k") as d:
        r = run_cli(*TRAIN, "--out", d / "run")
        assert r.returncode == 2, r.stderr
        assert "no space left on the device" in r.stderr and "Traceback" not in r.stderr
        no_partial_files(d)
        # resuming on the still-full disk: the same clear refusal, nothing half-written
        r = run_cli("train", "--resume", d / "run", "--quiet")
        assert r.returncode == 2 and "no space left" in r.stderr, r.stderr
        no_partial_files(d)
    with tmpfs(tmp_path / "small2", "64k") as d:  # the shared writer itself
        with pytest.raises(InputError, match="no space left"):
            files.write_atomic(d / "big.bin", b"\0" * (1 << 20))
        assert not (d / "big.bin").exists()
        no_partial_files(d)


def test_read_only_run_directory(reference, tmp_path):
    with tmpfs(tmp_path / "ro", "8m") as d:
        shutil.copytree(reference, d / "run")
        shutil.copytree(reference, d / "crashed")
        (d / "crashed" / "head.json").unlink()
        assert subprocess.run(["mount", "-o", "remount,ro", str(d)]).returncode == 0
        r = run_cli("replay", d / "run", "--step", "3", "--quiet")  # reading needs no write
        assert r.returncode == 0 and "VERIFIED" in r.stdout, r.stderr
        r = run_cli("trace", d / "run", "--step", "3")
        assert r.returncode == 2 and "read-only" in r.stderr, r.stderr
        r = run_cli(*TRAIN, "--out", d / "new")
        assert r.returncode == 2 and "read-only" in r.stderr, r.stderr
        r = run_cli("train", "--resume", d / "run")
        assert r.returncode == 2 and "complete" in r.stderr
        r = run_cli("train", "--resume", d / "crashed", "--quiet")
        assert r.returncode == 2 and "read-only" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_planted_link_is_not_written_through(reference, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    # a crashed run whose head.json position holds a link to a file outside it
    out = tmp_path / "run"
    shutil.copytree(reference, out)
    (out / "head.json").unlink()
    (out / "head.json").symlink_to(victim)
    r = run_cli("train", "--resume", out)
    assert r.returncode == 2  # a head (even a link) means complete: refused, nothing written
    (out / "head.json").unlink()
    (out / "steps.jsonl").rename(out / "steps.real")
    (out / "steps.jsonl").symlink_to(victim)
    r = run_cli("train", "--resume", out, "--quiet")
    assert r.returncode == 2 and "leads outside" in r.stderr, r.stderr  # refused before any write
    assert victim.read_text() == "keep me"
    # a trace target planted as a link
    traces = out / "traces"
    traces.mkdir()
    (out / "steps.jsonl").unlink()
    (out / "steps.real").rename(out / "steps.jsonl")
    shutil.copy(reference / "head.json", out / "head.json")
    (traces / "step-0000001.json").symlink_to(victim)
    r = run_cli("trace", out, "--step", "1")
    assert r.returncode == 2 and "symbolic link" in r.stderr, r.stderr
    assert victim.read_text() == "keep me"
    with pytest.raises(InputError, match="symbolic link"):
        files.write_atomic(traces / "step-0000001.json", b"x")
    # an output directory that is itself a link
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "out-link").symlink_to(tmp_path / "elsewhere")
    r = run_cli(*TRAIN, "--out", tmp_path / "out-link")
    assert r.returncode == 2 and "symbolic link" in r.stderr
    assert not list((tmp_path / "elsewhere").iterdir())


# ---- symbolic link loops, environment, the compile cache -----------------------------------


LOOPED = ["checkpoints/step-0000002.safetensors", "data/manifest.json", "recipe.json", "steps.jsonl", "head.json"]


@pytest.mark.parametrize("name", LOOPED)
def test_symlink_loops_are_named(reference, tmp_path, name):
    out = tmp_path / "run"
    shutil.copytree(reference, out)
    f = out / name
    f.unlink()
    f.symlink_to(f.name + ".x")
    f.with_name(f.name + ".x").symlink_to(f.name)
    r = run_cli("replay", out, "--step", "3", "--quiet")
    text = r.stdout + r.stderr
    assert "loop of symbolic links" in text and "leads outside" not in text, text
    assert "VERIFIED" not in r.stdout
    # a checkpoint in the recomputed range that cannot be read is a mismatch ([step.verified.c1])
    assert r.returncode == (1 if name.startswith("checkpoints/") else 2)
    if name.startswith("checkpoints/"):
        r = run_cli("trace", out, "--step", "3")
        assert r.returncode == 2 and "loop of symbolic links" in r.stderr


@pytest.mark.parametrize(
    "setting,message",
    [
        ({"NUMBA_THREADING_LAYER": "tbb"}, "needs Intel TBB"),
        ({"NUMBA_THREADING_LAYER": "nonsense"}, "not a Numba threading layer"),
    ],
)
def test_bad_threading_layer_is_refused(setting, message, tmp_path):
    pytest.importorskip("numba")
    if "tbb" in setting.values():
        import importlib.util

        if importlib.util.find_spec("tbb") is not None:
            pytest.skip("TBB is installed here")
    p = subprocess.run(
        [sys.executable, "-m", "refreplay", "replay", str(tmp_path), "--step", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**env(), **setting},
    )
    assert p.returncode == 2 and message in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_non_ascii_path_under_ascii_io(reference, tmp_path):
    out = tmp_path / "r\u00e9sum\u00e9"
    shutil.copytree(reference, out)
    p = subprocess.run(
        [sys.executable, "-m", "refreplay", "replay", str(out), "--step", "1", "--quiet"],
        capture_output=True,
        timeout=300,
        env={**env(), "PYTHONIOENCODING": "ascii"},
    )
    err = p.stderr.decode("ascii", "replace")
    assert p.returncode == 0 and b"VERIFIED" in p.stdout and "Traceback" not in err, err
    assert b"r\\xe9sum\\xe9" in p.stdout


def test_corrupt_compile_cache_is_set_aside_and_recompiled(tmp_path):
    code = (
        "import numpy as np\n"
        "from refreplay.numerics import bf16\n"
        "print(bf16.encode(np.array([1.5, -2.25, 3.0], np.float32)).tolist())\n"
    )
    e = {**env(), "REFREPLAY_CACHE_ROOT": str(tmp_path / "cache")}
    first = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=e)
    assert first.returncode == 0, first.stderr
    cached = [p for p in (tmp_path / "cache").rglob("bf16.*") if p.suffix in (".nbi", ".nbc")]
    assert cached
    for i, p in enumerate(sorted(cached)):
        p.write_bytes(b"\x80\x04garbage" if i % 2 else b"")  # truncated and overwritten files
    second = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=e)
    assert second.returncode == 0 and "Traceback" not in second.stderr, second.stderr
    assert second.stdout == first.stdout
    assert "compile cache file" in second.stderr and "is corrupt" in second.stderr
    assert list((tmp_path / "cache").rglob("*.corrupt-*"))
    third = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=e)
    assert third.returncode == 0 and "corrupt" not in third.stderr and third.stdout == first.stdout
