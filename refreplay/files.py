"""Writing files that a crash, a full disk or a planted link cannot corrupt.

Every file refreplay writes (run directories, checkpoints, certificates,
traces, plots, vectors, reports) goes through here:

* ``atomic_file(path)``: a context manager yielding a binary file object; the
  bytes go to a temporary beside ``path`` (same directory, so the rename
  stays on one filesystem), are flushed and fsync'ed, and the temporary is
  renamed onto ``path`` only when the block ends without an exception, then
  the directory is fsync'ed.  A reader sees the old file or the whole new
  one, never a part; on any error the temporary is removed.
* ``write_atomic(path, data)``: the same for bytes in hand.
* ``check_target(path)``: refuses a target that is a symbolic link (one
  planted in an output directory would otherwise redirect the write outside
  it) or a directory.
* ``write_error(exc, path)``: ``ENOSPC``, ``EROFS``, ``EACCES``, ``EDQUOT``
  and friends as an ``InputError`` (exit 2) naming the file, so a full disk
  or a read-only directory is a clear message, not a traceback.

Temporaries are named ``.NAME.XXXXXXXX.tmp``; ``is_temporary(name)`` lets
readers and listings skip leftovers of a killed writer, and
``remove_temporaries(directory)`` cleans them up.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from pathlib import Path

from .errors import InputError

TMP_PREFIX = "."
TMP_SUFFIX = ".tmp"

_WRITE_ERRORS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "the filesystem is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.ENOENT: "the directory does not exist",
    errno.ENOTDIR: "a component of the path is not a directory",
    errno.ELOOP: "too many levels of symbolic links",
    errno.ENAMETOOLONG: "the file name is too long",
    errno.EFBIG: "the file is too large for the filesystem",
    errno.EIO: "an input/output error",
}


def write_error(exc: OSError, path) -> InputError:
    """An ``InputError`` for a failed write of ``path``, the cause in words."""
    why = _WRITE_ERRORS.get(exc.errno) or exc.strerror or type(exc).__name__
    return InputError(f"cannot write {path}: {why}")


def check_target(path) -> Path:
    """``path`` as a Path, refused if it is a symbolic link or a directory."""
    p = Path(path)
    if p.is_symlink():
        raise InputError(f"cannot write {p}: it is a symbolic link; refusing to write through it")
    if p.is_dir():
        raise InputError(f"cannot write {p}: it is a directory")
    return p


def is_temporary(name: str) -> bool:
    """Whether ``name`` is a temporary left by ``atomic_file``."""
    return name.startswith(TMP_PREFIX) and name.endswith(TMP_SUFFIX)


def fsync_dir(directory: Path) -> None:
    """fsync a directory, so a rename or a new file in it survives a crash."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return  # a platform that cannot open directories cannot fsync them either
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on a directory; the rename itself is done
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_file(path, mode: int = 0o644):
    """Yield a binary file whose bytes replace ``path`` whole when the block
    ends normally; nothing of it remains when the block raises.  ``mode``:
    the permission bits of the new file (0o600 for a private key)."""
    p = check_target(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f"{TMP_PREFIX}{p.name}.", suffix=TMP_SUFFIX)
    except OSError as exc:
        raise write_error(exc, p) from None
    tmp_path = Path(tmp)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        check_target(p)  # a link planted while the file was being written
        os.replace(tmp_path, p)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp_path.unlink()
        raise write_error(exc, p) from None
    except BaseException:
        with contextlib.suppress(OSError):
            tmp_path.unlink()
        raise
    fsync_dir(p.parent)


def write_atomic(path, data: bytes | str, mode: int = 0o644) -> None:
    """Write ``data`` (text is encoded as UTF-8) to ``path`` atomically."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    with atomic_file(path, mode) as f:
        f.write(data)


def remove_temporaries(directory) -> list[Path]:
    """Remove the temporaries a killed writer left directly in ``directory``
    (never following a link); return what was removed."""
    removed = []
    d = Path(directory)
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for entry in d.iterdir():
            if is_temporary(entry.name) and not entry.is_symlink() and entry.is_file():
                with contextlib.suppress(OSError):
                    entry.unlink()
                    removed.append(entry)
    return removed
