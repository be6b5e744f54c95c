"""Reading files an adversary may have written ([state.untrusted.c1]).

Every file refreplay reads from a run, a certificate directory or a vectors
directory comes through here, so that the same limits hold everywhere:

* ``inside(root, path)``: the path, resolved (symbolic links followed), lies
  inside ``root``; checked before the file is opened.
* ``read_file``: a regular file (not a directory named ``x.json``, not a
  device or a FIFO) whose size is at most a stated limit, read whole.
* ``parse_json``: UTF-8 JSON with no duplicate keys, no NaN/Infinity
  constants, nesting at most ``MAX_DEPTH`` deep (checked on the bytes before
  the parser recurses) and at most ``MAX_JSON`` bytes.
* ``zstd_frame``: a zstd frame decompressed as a stream into at most the
  number of bytes the caller expects, whatever size the frame declares
  (python-zstandard's ``decompress`` allocates the declared content size).

Every failure is an ``InputError`` naming the file and, where there is one,
the field.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from pathlib import Path

import numpy as np

from .errors import InputError

MAX_JSON = 64 << 20  # bytes of one JSON document or one JSON-lines line
MAX_DEPTH = 64  # nesting of arrays and objects; refreplay's own files use <= 6
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)


def resolve(path) -> Path:
    """``path`` with symbolic links resolved; a loop of links (or a chain too
    long to follow) is an ``InputError`` that says so."""
    p = Path(path)
    try:
        return p.resolve()
    except RuntimeError:  # Python < 3.13 reports a loop as RuntimeError
        raise InputError(f"{p}: a loop of symbolic links; refusing to read it") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InputError(f"{p}: a loop of symbolic links; refusing to read it") from None
        raise InputError(f"{p}: cannot resolve the path ({exc.strerror})") from None


def inside(root, path) -> Path:
    """``path`` with symbolic links resolved, refused unless it lies inside
    ``root`` (itself resolved)."""
    root_r = resolve(root)
    p = Path(path)
    resolved = resolve(p)
    try:
        resolved.relative_to(root_r)
    except ValueError:
        raise InputError(f"{p}: leads outside {root_r}; refusing to read it") from None
    return resolved


def read_file(path, limit: int, root=None, what: str = "file") -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes (inside ``root``
    when given); the size is checked on the open file before reading."""
    p = Path(path)
    if root is not None:
        inside(root, p)
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise InputError(f"missing {what} {p}") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InputError(f"{p}: {what} is a loop of symbolic links") from None
        raise InputError(f"{p}: cannot open {what} ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{p}: {what} is not a regular file")
        if st.st_size > limit:
            raise InputError(f"{p}: {what} is {st.st_size} bytes, more than the limit of {limit}")
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with f:  # read(n) allocates n bytes up front: ask for what the file holds, plus one to see growth
        data = f.read(st.st_size + 1)
    if len(data) > st.st_size:
        raise InputError(f"{p}: {what} grew while being read")
    return data


def nesting_depth(raw: bytes) -> int:
    """The deepest nesting of arrays and objects in JSON text ``raw`` (strings
    removed first, so brackets inside them do not count)."""
    bare = _STRING.sub(b"", raw)
    b = np.frombuffer(bare, np.uint8)
    if b.size == 0:
        return 0
    step = np.isin(b, (0x5B, 0x7B)).astype(np.int64) - np.isin(b, (0x5D, 0x7D)).astype(np.int64)
    return int(np.cumsum(step).max(initial=0))


def _no_duplicates(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


def _reject_constant(name):
    raise ValueError(f"non-standard JSON constant {name}")


def parse_json(raw, where: str, max_depth: int = MAX_DEPTH, max_bytes: int = MAX_JSON):
    """JSON text (bytes or str) parsed under the limits above."""
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogatepass")
    if len(raw) > max_bytes:
        raise InputError(f"{where}: JSON of {len(raw)} bytes is longer than the limit of {max_bytes}")
    depth = nesting_depth(raw)
    if depth > max_depth:
        raise InputError(f"{where}: not valid JSON (nested {depth} deep; the limit is {max_depth})")
    try:
        text = raw.decode("utf-8")
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)
    except UnicodeDecodeError as exc:
        raise InputError(f"{where}: not valid JSON (not UTF-8: {exc.reason} at byte {exc.start})") from None
    except (ValueError, RecursionError) as exc:
        raise InputError(f"{where}: not valid JSON ({exc})") from None


def load_json(path, root=None, what: str = "JSON file", limit: int = MAX_JSON):
    """A JSON file read by ``read_file`` and parsed by ``parse_json``."""
    return parse_json(read_file(path, limit, root, what), str(path))


def zstd_frame(data: bytes, expected: int, where: str) -> bytes:
    """The content of one zstd frame that must hold exactly ``expected``
    bytes; decompressed as a stream that stops one byte past ``expected``,
    so a frame declaring (or expanding to) more is refused without
    allocating it."""
    import zstandard

    out = bytearray()
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(data, read_size=1 << 16)
        with reader:
            while len(out) <= expected:
                piece = reader.read(min(1 << 20, expected + 1 - len(out)))
                if not piece:
                    break
                out += piece
    except zstandard.ZstdError as exc:
        raise InputError(f"{where} is corrupt: not a valid zstd frame ({exc})") from None
    if len(out) != expected:
        more = "more than" if len(out) > expected else f"{len(out)}, not"
        raise InputError(f"{where} is corrupt: it decompresses to {more} the {expected} bytes the manifest implies")
    return bytes(out)


def field(obj, key, kind, where: str):
    """``obj[key]`` when it is of type ``kind`` (bool is not an int here);
    InputError naming the file and field otherwise."""
    if not isinstance(obj, dict):
        raise InputError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    if key not in obj:
        raise InputError(f"{where}: field {key!r} is missing")
    v = obj[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(v, bool) and bool not in kinds or not isinstance(v, kinds):
        names = " or ".join(k.__name__ for k in kinds)
        raise InputError(f"{where}: field {key!r} must be {names}, got {type(v).__name__}")
    return v
