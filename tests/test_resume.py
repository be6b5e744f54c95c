"""After a crash: ``train --resume`` finishes a run to exactly the files an
uninterrupted run writes, ``replay`` of an incomplete run verifies only steps
with whole records and never says VERIFIED (exit 4), and the writers leave
whole files or none ([step.record.c1], docs/run-format.md "After a crash")."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from refreplay.errors import InputError
from refreplay.training import launch, presets, run
from refreplay.training.train import resume, train

from cli_helpers import run_cli

BYTE_CAP = 1 << 16

pytestmark = pytest.mark.usefixtures("one_numba_thread")


def _train(out, steps=5, every=2):
    m, t = presets.preset("tiny")
    return train(
        m,
        t,
        steps=steps,
        checkpoint_every=every,
        out=out,
        launcher=launch.get("inproc", 1),
        preset="tiny",
        byte_cap=BYTE_CAP,
        progress=None,
    )


@pytest.fixture(scope="module")
def whole_run(tmp_path_factory):
    """An uninterrupted run: 5 steps, checkpoints at 0, 2, 4, 5."""
    out = tmp_path_factory.mktemp("resume") / "whole"
    _train(out)
    return out


def tree(path: Path) -> dict[str, bytes]:
    """Every file under ``path`` (relative name -> bytes); links refused."""
    out = {}
    for p in sorted(path.rglob("*")):
        assert not p.is_symlink(), p
        if p.is_file():
            out[p.relative_to(path).as_posix()] = p.read_bytes()
    return out


def assert_same_files(a: Path, b: Path):
    ta, tb = tree(a), tree(b)
    assert sorted(ta) == sorted(tb), sorted(set(ta) ^ set(tb))
    different = [k for k in ta if ta[k] != tb[k]]
    assert not different, different


def crash_copy(src: Path, dst: Path, records: int, torn: bool = False, keep_ckpts=None, temp=True) -> Path:
    """``src`` as a crash would leave it: the first ``records`` lines of each
    record file (plus half of the next one when ``torn``), no head, only the
    checkpoints of steps in ``keep_ckpts`` (default: those up to the last
    record), and a leftover temporary."""
    shutil.copytree(src, dst)
    (dst / "head.json").unlink()
    for name in ("steps.jsonl", "digests.jsonl"):
        lines = (dst / name).read_bytes().splitlines(True)
        body = b"".join(lines[:records])
        if torn and records < len(lines):
            body += lines[records][: len(lines[records]) // 2]
        (dst / name).write_bytes(body)
    for f in (dst / "checkpoints").iterdir():
        step = int(f.name[5:12])
        if (keep_ckpts is not None and step not in keep_ckpts) or (keep_ckpts is None and step >= records):
            f.unlink()
    if temp:
        (dst / "checkpoints" / ".step-0000004.safetensors.k2j3h4g5.tmp").write_bytes(b"\0" * 100)
    return dst


# crash points: (records written, torn next line, checkpoints present)
CRASHES = {
    "before step 0": (0, False, set()),
    "after record 0, before its checkpoint": (1, False, set()),
    "mid step 1 record": (1, True, {0}),
    "after record 2, before its checkpoint": (3, False, {0}),
    "after checkpoint 2": (3, False, {0, 2}),
    "mid step 4 record": (4, True, {0, 2}),
    "after checkpoint 4": (5, False, {0, 2, 4}),
    "after the last record": (6, False, {0, 2, 4}),
    "before the head": (6, False, {0, 2, 4, 5}),
}


@pytest.mark.parametrize("crash", sorted(CRASHES))
def test_resume_gives_the_files_of_an_uninterrupted_run(whole_run, tmp_path, crash):
    records, torn, ckpts = CRASHES[crash]
    p = crash_copy(whole_run, tmp_path / "run", records, torn, ckpts)
    summary, start = resume(p, progress=None)
    assert start == max([k for k in ckpts if k < records] or [0])
    assert_same_files(whole_run, p)
    assert summary.head == json.loads((whole_run / "head.json").read_text())["chain_link"]


def test_resume_skips_a_corrupt_checkpoint(whole_run, tmp_path):
    """A checkpoint whose root is not its record's is never resumed from."""
    p = crash_copy(whole_run, tmp_path / "run", 5, keep_ckpts={0, 2, 4})
    f = p / "checkpoints" / "step-0000004.safetensors"
    b = bytearray(f.read_bytes())
    b[-9] ^= 0x10
    f.write_bytes(bytes(b))
    _, start = resume(p, progress=None)
    assert start == 2
    assert_same_files(whole_run, p)


def test_resume_refuses_what_it_cannot_continue(whole_run, tmp_path):
    with pytest.raises(InputError, match="complete"):
        resume(whole_run, progress=None)
    p = crash_copy(whole_run, tmp_path / "a", 3, keep_ckpts={0, 2})
    (p / "recipe.json").unlink()
    with pytest.raises(InputError, match="nothing to resume"):
        resume(p, progress=None)
    p = crash_copy(whole_run, tmp_path / "b", 3, keep_ckpts={0, 2})
    lines = (p / "steps.jsonl").read_text().splitlines(True)
    rec = json.loads(lines[1])
    rec["loss"] = "0x3F800000"
    lines[1] = json.dumps(rec, sort_keys=True) + "\n"
    (p / "steps.jsonl").write_text("".join(lines))
    with pytest.raises(InputError, match="chain link"):
        resume(p, progress=None)  # a tampered record is not silently re-used
    r = run_cli("train", "--resume", p, "--steps", "9")
    assert r.returncode == 2 and "--steps" in r.stderr


def test_out_on_a_crashed_run_points_to_resume(whole_run, tmp_path):
    p = crash_copy(whole_run, tmp_path / "run", 3, keep_ckpts={0, 2})
    r = run_cli("train", "--preset", "tiny", "--steps", "5", "--out", p)
    assert r.returncode == 2
    assert "refusing to overwrite" in r.stderr and f"--resume {p}" in r.stderr


def test_replay_of_an_incomplete_run_never_says_verified(whole_run, tmp_path):
    p = crash_copy(whole_run, tmp_path / "run", 4, torn=True, keep_ckpts={0, 2})
    r = run_cli("replay", p, "--step", "3", "--quiet")  # step 3 has a whole record
    assert r.returncode == 4, r.stdout + r.stderr
    assert "VERIFIED" not in r.stdout and "INCOMPLETE" in r.stdout and "reproduces its record" in r.stdout
    r = run_cli("replay", p, "--step", "5", "--quiet")  # no record: steps up to 3 replayed
    assert r.returncode == 4 and "VERIFIED" not in r.stdout
    assert "step 5 is NOT verified" in r.stdout and "replayed steps 3..3" in r.stdout
    r = run_cli("replay", p, "--step", "3", "--expect-head", "ab" * 32, "--quiet")
    assert r.returncode == 1 and "no chain head" in r.stderr
    # a mismatch in the complete part is a mismatch (1), incomplete or not
    lines = (p / "steps.jsonl").read_text().splitlines(True)
    rec = json.loads(lines[3])
    rec["loss"] = "0x3F800000"
    lines[3] = json.dumps(rec, sort_keys=True) + "\n"
    (p / "steps.jsonl").write_text("".join(lines))
    r = run_cli("replay", p, "--step", "3", "--quiet")
    assert r.returncode == 1 and "MISMATCH" in r.stdout and "VERIFIED" not in r.stdout


def test_strict_open_still_refuses_an_incomplete_run(whole_run, tmp_path):
    p = crash_copy(whole_run, tmp_path / "run", 4, keep_ckpts={0, 2})
    with pytest.raises(InputError, match="--resume"):
        run.open_run(p, strict=False)
    # a head beside truncated records is a truncation after publication
    shutil.copy(whole_run / "head.json", p / "head.json")
    with pytest.raises(InputError, match="truncated after publication"):
        run.open_run(p, strict=False, incomplete=True)


def test_records_are_appended_whole_or_not_at_all(tmp_path, monkeypatch):
    """A failing write of a record line leaves the file as it was."""
    f = run._LineFile(tmp_path / "steps.jsonl", truncate=True)
    f.append('{"step":0}\n')
    real = os.write

    def short_then_fail(fd, data):
        if fd == f.fd:
            real(fd, bytes(data[:3]))
            raise OSError(28, "No space left on device")
        return real(fd, data)

    monkeypatch.setattr(os, "write", short_then_fail)
    with pytest.raises(InputError, match="no space left"):
        f.append('{"step":1}\n')
    monkeypatch.undo()
    f.close()
    assert (tmp_path / "steps.jsonl").read_bytes() == b'{"step":0}\n'


def test_resume_is_refused_while_another_process_writes_the_run(whole_run, tmp_path):
    """A train still running (or another --resume) holds the writer lock."""
    import fcntl

    p = crash_copy(whole_run, tmp_path / "run", 3, keep_ckpts={0, 2})
    before = tree(p)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time\n"
            "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "print('locked', flush=True)\n"
            "time.sleep(60)\n",
            str(p),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(InputError, match="being written by another process"):
            resume(p, progress=None)
        assert tree(p) == before  # nothing touched
    finally:
        holder.kill()
        holder.wait()
    resume(p, progress=None)  # the holder is gone: its lock with it
    assert_same_files(whole_run, p)
    fd = os.open(p, os.O_RDONLY)  # and resume let go of its own
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
