"""Canonical state hash: a SHA-256 Merkle tree over tensors and fixed-size
chunks ([state.*] in ``spec/06-state.txt``), and the per-step hash chain.

A training state is a flat dict name -> NumPy array (scalars as 0-d arrays).
The hash is a function of the names, dtypes, shapes and little-endian bytes
only; it never depends on dict order, memory layout, byte order of the host
or the number of hashing threads.  Because every tensor and every 1 MiB chunk
has its own hash, two digests that differ name the tensor and the byte range
that differ (``diff``).

Chunks are hashed with ``hashlib``, which releases the GIL while hashing a
large buffer, so a thread pool over chunks scales with cores.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field

import numpy as np

from ._shares import in_shares
from .errors import InputError

CHUNK_SIZE = 1 << 20  # [state.chunks.c1] 1 MiB

# [state.dtypes.c1] code, file name, NumPy dtype (little-endian).
DTYPES = {
    "F32": (1, np.dtype("<f4")),
    "I8": (2, np.dtype("i1")),
    "I32": (3, np.dtype("<i4")),
    "I64": (4, np.dtype("<i8")),
    "U32": (5, np.dtype("<u4")),
    "U64": (6, np.dtype("<u8")),
    "U16": (7, np.dtype("<u2")),  # bfloat16 is carried as its uint16 bit pattern
    "U8": (8, np.dtype("u1")),
}
_BY_KIND = {(dt.kind, dt.itemsize): name for name, (_, dt) in DTYPES.items()}

# [state.tree.c1] domain-separation prefixes: no hash of one kind can be
# mistaken for a hash of another.
CHUNK_LEAF = b"\x00"
CHUNK_NODE = b"\x01"
TENSOR_LEAF = b"\x02"
TENSOR_NODE = b"\x03"
STATE_ROOT = b"\x04"
CHAIN_LINK = b"\x05"

GENESIS = "00" * 32  # [state.chain.c2] the link before step 1


def dtype_name(dtype) -> str:
    """[state.dtypes.c1] The table name (F32, I8, ...) of a NumPy dtype, or of
    an array's or scalar's dtype; TypeError if it has none."""
    dt = dtype.dtype if isinstance(dtype, (np.ndarray, np.generic)) else np.dtype(dtype)
    name = _BY_KIND.get((dt.kind, dt.itemsize))
    if name is None or dt.kind not in "iuf":
        known = ", ".join(f"{n} ({d.name})" for n, (_, d) in DTYPES.items())
        raise TypeError(f"dtype {dt} is not a state dtype; known: {known}")
    return name


def canonical(name: str, value) -> np.ndarray:
    """A C-contiguous little-endian copy (or view) of a state tensor, checked."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"tensor names must be non-empty str, got {name!r}")
    if not isinstance(value, (np.ndarray, np.generic)):
        raise TypeError(f"tensor {name!r} must be a NumPy array or scalar, got {type(value).__name__}")
    arr = np.asarray(value)
    _, dt = DTYPES[dtype_name(arr.dtype)]
    # not np.ascontiguousarray: it turns a 0-d array into shape (1,)
    return np.asarray(arr, dtype=dt, order="C")


def _merkle(hashes: list[bytes], node_prefix: bytes) -> bytes:
    """[state.tree.c1] Pair neighbours level by level; an odd last hash moves
    up unchanged.  ``hashes`` must be non-empty."""
    level = hashes
    while len(level) > 1:
        nxt = [hashlib.sha256(node_prefix + level[i] + level[i + 1]).digest() for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]


def _chunk_views(arr: np.ndarray) -> list[memoryview]:
    """[state.chunks.c1] The tensor's bytes in CHUNK_SIZE pieces; an empty tensor
    has one empty chunk."""
    mv = memoryview(arr.reshape(-1).view(np.uint8))
    n = len(mv)
    return [mv[i : i + CHUNK_SIZE] for i in range(0, n, CHUNK_SIZE)] or [mv]


def _chunk_leaf(chunk) -> bytes:
    h = hashlib.sha256(CHUNK_LEAF)
    h.update(chunk)
    return h.digest()


def _tensor_leaf(name: str, dtype: str, shape: tuple[int, ...], chunk_root: bytes) -> bytes:
    """[state.leaf.c1] SHA-256 of 0x02, the name, dtype code, shape and chunk root."""
    raw = name.encode("utf-8")
    if len(shape) > 255:
        raise ValueError(f"tensor {name!r} has {len(shape)} dimensions (at most 255)")
    head = (
        TENSOR_LEAF
        + struct.pack("<I", len(raw))
        + raw
        + struct.pack("<BB", DTYPES[dtype][0], len(shape))
        + b"".join(struct.pack("<Q", d) for d in shape)
    )
    return hashlib.sha256(head + chunk_root).digest()


def _state_root(tensor_leaves: list[bytes]) -> bytes:
    """[state.root.c1] SHA-256 of 0x04, the tensor count and the tensor tree root."""
    top = _merkle(tensor_leaves, TENSOR_NODE) if tensor_leaves else bytes(32)
    return hashlib.sha256(STATE_ROOT + struct.pack("<Q", len(tensor_leaves)) + top).digest()


@dataclass(frozen=True)
class TensorDigest:
    """Hashes of one tensor: its leaf (``root``) and each chunk's leaf hash."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    root: str
    chunks: tuple[str, ...]


@dataclass(frozen=True)
class StateDigest:
    """The state root and, per tensor (sorted by name), its digest."""

    root: str
    tensors: dict[str, TensorDigest] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """JSON-ready form: {"root": hex, "tensors": {name: {...}}}."""
        return {
            "root": self.root,
            "chunk_size": CHUNK_SIZE,
            "tensors": {
                n: {
                    "dtype": t.dtype,
                    "shape": list(t.shape),
                    "nbytes": t.nbytes,
                    "root": t.root,
                    "chunks": list(t.chunks),
                }
                for n, t in self.tensors.items()
            },
        }

    @classmethod
    def from_dict(cls, d) -> "StateDigest":
        """Inverse of ``to_dict``; InputError on anything malformed (it comes from files)."""
        try:
            if d["chunk_size"] != CHUNK_SIZE:
                raise InputError(f"state digest uses chunk size {d['chunk_size']}, expected {CHUNK_SIZE}")
            tensors = {}
            if not isinstance(d["tensors"], dict):
                raise InputError("state digest: tensors must be an object")
            for n, t in d["tensors"].items():
                if not (isinstance(t["dtype"], str) and t["dtype"] in DTYPES):
                    raise InputError(f"state digest: tensor {n!r} has unknown dtype {t['dtype']!r}")
                if not (
                    isinstance(t["shape"], list)
                    and isinstance(t["chunks"], list)
                    and all(_count(x) for x in t["shape"])
                    and _count(t["nbytes"])
                ):
                    raise InputError(
                        f"state digest: tensor {n!r} needs a shape of integers, an integer nbytes and a list of chunks"
                    )
                tensors[n] = TensorDigest(
                    n,
                    t["dtype"],
                    tuple(t["shape"]),
                    t["nbytes"],
                    _hex32(t["root"], "tensor root"),
                    tuple(_hex32(c, "chunk hash") for c in t["chunks"]),
                )
            return cls(_hex32(d["root"], "state root"), dict(sorted(tensors.items())))
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            if isinstance(exc, InputError):
                raise
            raise InputError(f"malformed state digest: {exc!r}") from None


def _count(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def default_threads() -> int:
    """The number of hashing threads the trainer and replay use: the Numba
    thread count (``NUMBA_NUM_THREADS``, or ``train --threads``) when Numba is
    loaded, else 1.  It never changes a hash ([state.root.c1])."""
    import sys

    numba = sys.modules.get("numba")
    try:
        return max(1, int(numba.get_num_threads())) if numba is not None else 1
    except Exception:  # numba partly imported or without threading layer
        return 1


def _hash_in_threads(flat: list, workers: int) -> list[bytes]:
    """Chunk leaves of ``flat`` computed by ``workers`` threads; the result is
    the same list ``[_chunk_leaf(v) for v in flat]`` gives.

    Each thread gets a share of the chunks balanced by bytes
    (``_shares.in_shares``): tensors smaller than a chunk make chunks
    unequal, and a strided split left one thread with 13 % more bytes than
    the other on the `small` state.  ``hashlib`` releases the GIL while it
    hashes a buffer, so the shares run in parallel.
    """
    leaves: list = [None] * len(flat)

    def work(i):
        leaves[i] = _chunk_leaf(flat[i])

    # + a per-chunk cost, so empty chunks spread too
    in_shares(work, [len(v) + 64 for v in flat], workers)
    return leaves


def state_hash(tensors: dict, threads: int = 1) -> StateDigest:
    """[state.root.c1] Hash a training state given as name -> array.

    ``threads`` hashing threads share the chunks of all tensors; the result
    does not depend on it.
    """
    if not isinstance(tensors, dict):
        raise TypeError(f"state must be a dict name -> array, got {type(tensors).__name__}")
    if not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a positive int, got {threads!r}")
    # [state.order.c1] sorted by the UTF-8 bytes of the name
    names = sorted(tensors, key=lambda n: n.encode("utf-8") if isinstance(n, str) else b"")
    arrays = [canonical(n, tensors[n]) for n in names]
    views = [_chunk_views(a) for a in arrays]
    flat = [v for vs in views for v in vs]
    workers = min(threads, len(flat))
    if workers <= 1:
        leaves = [_chunk_leaf(v) for v in flat]
    else:
        leaves = _hash_in_threads(flat, workers)
    digests, tensor_leaves, pos = {}, [], 0
    for name, arr, vs in zip(names, arrays, views):
        chunk_leaves = leaves[pos : pos + len(vs)]
        pos += len(vs)
        dtype = dtype_name(arr.dtype)
        leaf = _tensor_leaf(name, dtype, arr.shape, _merkle(chunk_leaves, CHUNK_NODE))
        tensor_leaves.append(leaf)
        digests[name] = TensorDigest(
            name, dtype, tuple(arr.shape), arr.nbytes, leaf.hex(), tuple(c.hex() for c in chunk_leaves)
        )
    return StateDigest(_state_root(tensor_leaves).hex(), digests)


def tensor_root(name: str, value) -> str:
    """[state.leaf.c1] The leaf hash (hex) of one tensor."""
    return state_hash({name: value}).tensors[name].root


def root_of(*names_and_values) -> str:
    """[state.root.c1] The state root (hex) of the state given as alternating
    name, value arguments (the form the spec's worked examples can write)."""
    if len(names_and_values) % 2:
        raise TypeError("root_of takes name, value pairs")
    names, values = names_and_values[0::2], names_and_values[1::2]
    if len(set(names)) != len(names):
        raise ValueError("root_of: a tensor name is given twice")
    return state_hash(dict(zip(names, values))).root


# ---- diff ------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorChange:
    """One tensor present in both states whose hash differs."""

    name: str
    dtype: tuple[str, str]
    shape: tuple[tuple[int, ...], tuple[int, ...]]
    chunks: tuple[tuple[int, int, int], ...]  # (chunk index, first byte, end byte)

    def describe(self) -> str:
        parts = []
        if self.dtype[0] != self.dtype[1]:
            parts.append(f"dtype {self.dtype[0]} -> {self.dtype[1]}")
        if self.shape[0] != self.shape[1]:
            parts.append(f"shape {self.shape[0]} -> {self.shape[1]}")
        if self.chunks:
            shown = ", ".join(f"#{i} bytes [{a}, {b})" for i, a, b in self.chunks[:8])
            more = f" and {len(self.chunks) - 8} more" if len(self.chunks) > 8 else ""
            parts.append(f"{len(self.chunks)} chunk(s) differ: {shown}{more}")
        return f"tensor {self.name!r}: " + ("; ".join(parts) or "header differs")


@dataclass(frozen=True)
class StateDiff:
    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[TensorChange, ...]
    roots_differ: bool

    @property
    def same(self) -> bool:
        return not self.roots_differ

    def lines(self) -> list[str]:
        out = [f"tensor {n!r}: only in the second state" for n in self.added]
        out += [f"tensor {n!r}: only in the first state" for n in self.removed]
        out += [c.describe() for c in self.changed]
        return out


def diff(a: StateDigest, b: StateDigest) -> StateDiff:
    """[state.diff.c1] Localise the difference between two digests: tensors
    added (in b only), removed (in a only) and changed, with the indices and
    byte ranges of the chunks whose hashes differ."""
    changed = []
    for name in sorted(set(a.tensors) & set(b.tensors), key=lambda n: n.encode("utf-8")):
        ta, tb = a.tensors[name], b.tensors[name]
        if ta.root == tb.root:
            continue
        nbytes = max(ta.nbytes, tb.nbytes)
        chunks = []
        for i in range(max(len(ta.chunks), len(tb.chunks))):
            ca = ta.chunks[i] if i < len(ta.chunks) else None
            cb = tb.chunks[i] if i < len(tb.chunks) else None
            if ca != cb:
                chunks.append((i, i * CHUNK_SIZE, min((i + 1) * CHUNK_SIZE, nbytes)))
        changed.append(TensorChange(name, (ta.dtype, tb.dtype), (ta.shape, tb.shape), tuple(chunks)))
    key = lambda n: n.encode("utf-8")  # noqa: E731
    return StateDiff(
        tuple(sorted(set(b.tensors) - set(a.tensors), key=key)),
        tuple(sorted(set(a.tensors) - set(b.tensors), key=key)),
        tuple(changed),
        a.root != b.root,
    )


# ---- chain -------------------------------------------------------------------------


def _hex32(value, what: str) -> str:
    if not isinstance(value, str) or len(value) != 64:
        raise InputError(f"{what} must be 64 hex digits, got {value!r}")
    try:
        bytes.fromhex(value)
    except ValueError:
        raise InputError(f"{what} must be 64 hex digits, got {value!r}") from None
    return value.lower()


def chain_link(prev_link: str, state_root: str, data_hash: str, recipe_hash: str, loss: str) -> str:
    """[state.chain.c2] link_n = SHA-256(0x05 || link_{n-1} || state root ||
    data hash || recipe hash || u32(loss bits)), the hashes as 32 raw bytes
    each and the step's binary32 loss, given as "0x" and 8 upper-case hex
    digits, as its 4 bytes little-endian; link_0 = GENESIS."""
    parts = [
        _hex32(prev_link, "previous link"),
        _hex32(state_root, "state root"),
        _hex32(data_hash, "data hash"),
        _hex32(recipe_hash, "recipe hash"),
    ]
    if not (
        isinstance(loss, str)
        and len(loss) == 10
        and loss.startswith("0x")
        and all(c in "0123456789ABCDEF" for c in loss[2:])
    ):
        raise InputError(f"loss must be 0x and 8 upper-case hex digits (its binary32 bits), got {loss!r}")
    return hashlib.sha256(
        CHAIN_LINK + b"".join(bytes.fromhex(p) for p in parts) + struct.pack("<I", int(loss, 16))
    ).hexdigest()
