"""Tensor files: safetensors with byte-deterministic layout ([state.file.c1])
and a reader that validates everything before trusting it ([state.fileread.c1]).

Files are written here, not by the ``safetensors`` package: its layout orders
tensors by dtype alignment and its ``__metadata__`` map has no fixed key
order, while refreplay checkpoints must be reproducible byte for byte (a
checkpoint is compared and hashed as a file).  The files remain ordinary
safetensors that any reader accepts.

A file on disk is untrusted input: every field is checked against the file's
real size before a byte is allocated for it, and every failure raises
``InputError`` naming the file.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np

from . import files, untrusted
from .errors import InputError
from .state import DTYPES, canonical, dtype_name

METADATA = "__metadata__"
METADATA_KEY = "refreplay"  # the one key __metadata__ may hold
MAX_HEADER = 100 << 20  # far above any refreplay header; refuse before reading
_ENTRY_KEYS = {"data_offsets", "dtype", "shape"}
# [bf16.format.c1] safetensors' BF16: bfloat16 bit patterns, held in memory as
# uint16.  Only golden vectors use it (``bf16=`` below); a state file never
# does, so that its dtypes stay those of [state.dtypes.c1].
BF16 = "BF16"


def _header_bytes(entries: dict, metadata: str | None) -> bytes:
    """[state.file.c1] Compact JSON, keys sorted, ASCII escapes, space-padded to 8."""
    obj = dict(entries)
    if metadata is not None:
        obj[METADATA] = {METADATA_KEY: metadata}
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode("ascii")
    return text + b" " * (-len(text) % 8)


def _layout(tensors: dict, metadata: str | None, bf16=frozenset()) -> tuple[bytes, list[np.ndarray]]:
    """[state.file.c1] The file's first 8 + L bytes and the arrays whose bytes
    follow; the uint16 tensors named in ``bf16`` get the dtype BF16."""
    if not isinstance(tensors, dict):
        raise TypeError(f"tensors must be a dict name -> array, got {type(tensors).__name__}")
    if metadata is not None and not isinstance(metadata, str):
        raise TypeError(f"metadata must be a str or None, got {type(metadata).__name__}")
    if METADATA in tensors:
        raise ValueError(f"{METADATA!r} is reserved and cannot name a tensor")
    names = sorted(tensors, key=lambda n: n.encode("utf-8") if isinstance(n, str) else b"")
    arrays = [canonical(n, tensors[n]) for n in names]
    entries, offset = {}, 0
    for name, arr in zip(names, arrays):
        dtype = dtype_name(arr.dtype)
        if name in bf16:
            if dtype != "U16":
                raise TypeError(f"tensor {name!r}: bf16 is carried as uint16 bits, got {arr.dtype}")
            dtype = BF16
        entries[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
    header = _header_bytes(entries, metadata)
    return struct.pack("<Q", len(header)) + header, arrays


def save(path, tensors: dict, metadata: str | None = None) -> None:
    """[state.file.c1] Write ``tensors`` (name -> array, state dtypes only) and an
    optional metadata string as a safetensors file.  The same arguments give
    the same bytes.  The file is written beside ``path``, synced and renamed
    into place (``files.atomic_file``), so a reader never sees half a file;
    a full disk or a read-only directory is an ``InputError``.
    """
    head, arrays = _layout(tensors, metadata)
    with files.atomic_file(path) as f:  # synced temporary, renamed: whole or absent
        f.write(head)
        for arr in arrays:
            f.write(memoryview(arr.reshape(-1).view(np.uint8)))


def file_bytes(metadata: str, *names_and_values, bf16=frozenset()) -> str:
    """[state.file.c1] Hex of the whole file that ``save`` writes for the tensors
    given as alternating name, value arguments (the spec's worked examples
    use this form; files of real size are written by ``save``).  ``bf16``:
    names of uint16 tensors written with the dtype BF16 (golden vectors)."""
    if len(names_and_values) % 2:
        raise TypeError("file_bytes takes a metadata string, then name, value pairs")
    tensors = dict(zip(names_and_values[0::2], names_and_values[1::2]))
    head, arrays = _layout(tensors, metadata, bf16)
    return (head + b"".join(a.tobytes() for a in arrays)).hex()


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _parse_header(raw: bytes, fail, bf16: bool = False) -> tuple[dict, str | None]:
    """[state.fileread.c1] The header as {name: (dtype, shape, begin, end)} and
    the metadata string; ``fail(msg)`` raises.  ``bf16``: accept the dtype
    BF16 (read as uint16 bits)."""
    dtypes = {**DTYPES, BF16: (None, np.dtype("<u2"))} if bf16 else DTYPES
    try:
        obj = untrusted.parse_json(raw, "header", max_bytes=MAX_HEADER)
    except InputError as exc:
        fail(str(exc))
    if not isinstance(obj, dict):
        fail(f"header must be a JSON object, got {type(obj).__name__}")
    metadata = None
    if METADATA in obj:
        meta = obj.pop(METADATA)
        if not (isinstance(meta, dict) and set(meta) == {METADATA_KEY} and isinstance(meta[METADATA_KEY], str)):
            fail(f"{METADATA} must be {{{METADATA_KEY!r}: string}}, got {json.dumps(meta)[:200]}")
        metadata = meta[METADATA_KEY]
    entries = {}
    for name, e in obj.items():
        where = f"tensor {name!r}"
        if not name:
            fail("a tensor has an empty name")
        if not isinstance(e, dict) or set(e) != _ENTRY_KEYS:
            fail(f"{where}: entry must have exactly the keys {sorted(_ENTRY_KEYS)}")
        dtype, shape, offs = e["dtype"], e["shape"], e["data_offsets"]
        if not isinstance(dtype, str) or dtype not in dtypes:
            hint = " (bfloat16 is stored as U16 bits)" if dtype == BF16 else ""
            fail(f"{where}: unknown dtype {dtype!r}{hint}; known: {', '.join(dtypes)}")
        if not (isinstance(shape, list) and len(shape) <= 255 and all(_is_int(d) and d >= 0 for d in shape)):
            fail(f"{where}: shape must be a list of at most 255 non-negative integers, got {shape!r}")
        if not (
            isinstance(offs, list) and len(offs) == 2 and all(_is_int(o) for o in offs) and 0 <= offs[0] <= offs[1]
        ):
            fail(f"{where}: data_offsets must be [begin, end] with 0 <= begin <= end, got {offs!r}")
        count = 1
        for d in shape:
            count *= d
        nbytes = count * dtypes[dtype][1].itemsize
        if offs[1] - offs[0] != nbytes:
            fail(
                f"{where}: shape {shape} of {dtype} needs {nbytes} bytes but data_offsets "
                f"{offs} span {offs[1] - offs[0]}"
            )
        entries[name] = (dtype, tuple(shape), offs[0], offs[1])
    return entries, metadata


def _check_layout(entries: dict, data_len: int, fail) -> None:
    """[state.fileread.c1] Tensors tile the data section exactly: sorted by
    offset they start at 0, each begins where the previous ends, the last ends
    at the end of the file."""
    pos, prev = 0, None
    for name, (_, _, begin, end) in sorted(entries.items(), key=lambda kv: (kv[1][2], kv[1][3])):
        if end > data_len:
            fail(f"tensor {name!r}: data_offsets [{begin}, {end}] run past the data section ({data_len} bytes)")
        if begin < pos:
            fail(f"tensor {name!r}: bytes [{begin}, {end}) overlap tensor {prev!r} (which ends at {pos})")
        if begin > pos:
            fail(f"tensor {name!r} starts at {begin}, leaving bytes [{pos}, {begin}) unused")
        pos, prev = end, name
    if pos != data_len:
        fail(f"tensors cover {pos} bytes of a {data_len}-byte data section")


def _read(path, mapped: bool, bf16: bool = False) -> tuple[dict[str, np.ndarray], str | None, frozenset]:
    """[state.fileread.c1] The one validating reader behind ``load`` and
    ``load_mapped``: header and layout are checked before any tensor byte is
    read; the data section is then read into memory or mapped read-only."""
    path = Path(path)

    def fail(msg):
        raise InputError(f"{path}: {msg}")

    if path.exists() and not path.is_file():  # a FIFO or device would block or never end
        fail("not a regular file")
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise InputError(f"{path}: cannot open ({exc.strerror})") from None
    with f:
        size = os.fstat(f.fileno()).st_size
        if size < 8:
            fail(f"truncated: {size} bytes, shorter than the 8-byte header length")
        (hlen,) = struct.unpack("<Q", f.read(8))
        if hlen > size - 8:
            fail(f"header length {hlen} exceeds the {size - 8} bytes that follow it (truncated or corrupt)")
        if hlen > MAX_HEADER:
            fail(f"header length {hlen} exceeds the limit of {MAX_HEADER} bytes")
        raw = f.read(hlen)
        if len(raw) != hlen:
            fail("file shrank while being read")
        entries, metadata = _parse_header(raw, fail, bf16)
        data_len = size - 8 - hlen
        _check_layout(entries, data_len, fail)
        if mapped and data_len:
            data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + hlen, shape=(data_len,))
        else:
            data = np.frombuffer(bytearray(data_len), np.uint8)
            if f.readinto(data) != data_len:
                fail("file shrank while being read")
    tensors = {}
    for name in sorted(entries, key=lambda n: n.encode("utf-8")):
        dtype, shape, begin, end = entries[name]
        arr = data[begin:end].view(np.dtype("<u2") if dtype == BF16 else DTYPES[dtype][1]).view(np.ndarray)
        if not arr.flags.aligned:  # compiled kernels want aligned data
            arr = arr.copy()
        tensors[name] = arr.reshape(shape)
    return tensors, metadata, frozenset(n for n, e in entries.items() if e[0] == BF16)


def load(path) -> tuple[dict[str, np.ndarray], str | None]:
    """[state.fileread.c1] Read a tensor file, validating it first.

    Returns (name -> array in name order, metadata string or None).  Arrays
    are little-endian, C-contiguous and writable.  Raises ``InputError``
    naming the file for anything that is not a well-formed refreplay tensor
    file; never reads outside the file.
    """
    return _read(path, mapped=False)[:2]


def load_mapped(path) -> tuple[dict[str, np.ndarray], str | None]:
    """[state.fileread.c1] As ``load``, validated the same way, but the tensors
    are read-only views of the file mapped into memory instead of copies: a
    state larger than the machine's memory can be read (``refreplay.training.budget``).
    A tensor whose offset does not suit its dtype's alignment is copied."""
    return _read(path, mapped=True)[:2]


def load_vectors(path) -> tuple[dict[str, np.ndarray], str | None, frozenset]:
    """[state.fileread.c1] As ``load``, for golden vectors: the dtype BF16 is
    accepted too ([bf16.format.c1]); its tensors are uint16 bit patterns and
    their names are returned as the third item."""
    return _read(path, mapped=False, bf16=True)
