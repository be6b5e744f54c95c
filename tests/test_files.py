"""refreplay.files: a write lands whole or not at all, never through a link,
and a full or read-only filesystem is an InputError naming the file."""

import errno
import os

import pytest

from refreplay import files
from refreplay.errors import InputError


def test_write_replaces_whole_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "cert.json"
    target.write_text("old")
    files.write_atomic(target, "new text")
    assert target.read_text() == "new text"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cert.json"]


def test_an_exception_inside_the_block_keeps_the_old_file(tmp_path):
    target = tmp_path / "steps.jsonl"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with files.atomic_file(target) as f:
            f.write(b"half of the new")
            raise RuntimeError("killed")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["steps.jsonl"]


def test_a_new_file_does_not_appear_when_the_write_fails(tmp_path):
    target = tmp_path / "head.json"
    with pytest.raises(KeyboardInterrupt):
        with files.atomic_file(target) as f:
            f.write(b"{")
            raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_a_planted_symlink_is_not_written_through(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("precious")
    out = tmp_path / "out"
    out.mkdir()
    (out / "cert.json").symlink_to(outside)
    with pytest.raises(InputError, match="symbolic link"):
        files.write_atomic(out / "cert.json", "forged")
    assert outside.read_text() == "precious"
    assert [p.name for p in out.iterdir()] == ["cert.json"]


def test_a_directory_is_not_a_target(tmp_path):
    (tmp_path / "x.json").mkdir()
    with pytest.raises(InputError, match="directory"):
        files.write_atomic(tmp_path / "x.json", "{}")


@pytest.mark.parametrize(
    "code, words",
    [
        (errno.ENOSPC, "no space left"),
        (errno.EROFS, "read-only"),
        (errno.EACCES, "permission denied"),
        (errno.EDQUOT, "quota"),
    ],
)
def test_write_errors_are_input_errors_and_leave_nothing(tmp_path, monkeypatch, code, words):
    def failing_fsync(fd):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(files.os, "fsync", failing_fsync)
    target = tmp_path / "ckpt.safetensors"
    with pytest.raises(InputError, match=words) as exc:
        files.write_atomic(target, b"\0" * 4096)
    assert str(target) in str(exc.value)
    assert list(tmp_path.iterdir()) == []


def test_an_unwritable_directory_is_an_input_error(tmp_path, monkeypatch):
    def no_temp(*a, **k):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(files.tempfile, "mkstemp", no_temp)
    with pytest.raises(InputError, match="read-only"):
        files.write_atomic(tmp_path / "a.json", "{}")


def test_missing_directory_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        files.write_atomic(tmp_path / "no" / "a.json", "{}")


def test_mode_of_a_private_file(tmp_path):
    files.write_atomic(tmp_path / "key.pem", b"secret", mode=0o600)
    assert (tmp_path / "key.pem").stat().st_mode & 0o777 == 0o600


def test_temporaries_are_recognised_and_removed(tmp_path):
    (tmp_path / ".head.json.abc123.tmp").write_text("torn")
    (tmp_path / "head.json").write_text("{}")
    (tmp_path / ".hidden").write_text("not ours")
    link = tmp_path / ".link.x.tmp"
    link.symlink_to(tmp_path / "head.json")
    assert files.is_temporary(".head.json.abc123.tmp")
    assert not files.is_temporary("head.json") and not files.is_temporary(".hidden")
    removed = files.remove_temporaries(tmp_path)
    assert [p.name for p in removed] == [".head.json.abc123.tmp"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".hidden", ".link.x.tmp", "head.json"]
