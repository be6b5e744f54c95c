"""Pre-tokenized training data: token files in, a flat token sequence out
(``spec/21-data.txt``: [data.tokenfile.c1], [data.vocab.c1]).

Two layouts are read, both little-endian:

* llm.c (``dev/data/*.bin``): a header of 256 int32 -- [0] the magic
  20240520, [1] the version (1: uint16 tokens, 2: uint32 tokens), [2] the
  token count -- then exactly that many tokens.  The header names no
  vocabulary size: it comes from the sidecar or ``--vocab``.
* flat (nanoGPT's ``train.bin``): tokens only, no header.  The sidecar
  ``FILE.json`` must give {"dtype": "uint16" | "uint32", "vocab": V}.

A sidecar is the file's name with ".json" appended.  Every token must be
below the true vocabulary size V (1 <= V <= 2^20); the model's vocabulary is
V rounded up to a multiple of 64, as llm.c pads GPT-2's 50,257 to 50,304.

Token files are untrusted: sizes are checked against the header before any
token is read, and every problem raises ``InputError`` naming the file.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from ..errors import InputError

LLMC_MAGIC = 20240520
LLMC_HEADER_INTS = 256
LLMC_DTYPES = {1: np.dtype("<u2"), 2: np.dtype("<u4")}  # version -> token dtype
FLAT_DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
MAX_VOCAB = 1 << 20  # [data.vocab.c1]
VOCAB_MULTIPLE = 64  # [data.vocab.c1]
MAX_SIDECAR = 1 << 16  # bytes: a sidecar is a few fields
SIDECAR_KEYS = {"dtype", "vocab"}


def padded_vocab(vocab: int) -> int:
    """[data.vocab.c1] The model's vocabulary: V rounded up to a multiple of 64."""
    check_vocab(vocab, "vocabulary size")
    return -(-vocab // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def check_vocab(vocab, what: str) -> int:
    if isinstance(vocab, bool) or not isinstance(vocab, (int, np.integer)) or not 1 <= vocab <= MAX_VOCAB:
        raise InputError(f"{what} must be an integer in [1, 2^20], got {vocab!r}")
    return int(vocab)


def token_dtype(vocab: int) -> np.dtype:
    """[data.vocab.c1] How a token is stored in shards and hashed: one byte
    for V <= 256, two for V <= 65536, else four (little-endian)."""
    check_vocab(vocab, "vocabulary size")
    return np.dtype("u1") if vocab <= 1 << 8 else np.dtype("<u2") if vocab <= 1 << 16 else np.dtype("<u4")


def sidecar_path(path) -> Path:
    return Path(str(path) + ".json")


def read_sidecar(path) -> dict | None:
    """The validated sidecar of token file ``path`` ({"dtype"?, "vocab"?}),
    or None when there is none."""
    side = sidecar_path(path)
    if not side.exists():
        return None
    try:
        size = side.stat().st_size
        if size > MAX_SIDECAR:
            raise InputError(f"{side}: {size} bytes, more than a sidecar's limit of {MAX_SIDECAR}")
        obj = json.loads(side.read_bytes())
    except OSError as exc:
        raise InputError(f"{side}: cannot read ({exc.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise InputError(f"{side}: not valid JSON ({type(exc).__name__})") from None
    if not isinstance(obj, dict) or not obj or set(obj) - SIDECAR_KEYS:
        raise InputError(f"{side}: expected a JSON object with keys from {sorted(SIDECAR_KEYS)}")
    if "dtype" in obj and (not isinstance(obj["dtype"], str) or obj["dtype"] not in FLAT_DTYPES):
        raise InputError(f"{side}: dtype must be one of {sorted(FLAT_DTYPES)}, got {obj['dtype']!r}")
    if "vocab" in obj:
        check_vocab(obj["vocab"], f"{side}: vocab")
    return obj


def _layout(path: Path, side: dict | None, size: int) -> tuple[str, np.dtype, int, int]:
    """(layout name, token dtype, byte offset of the first token, token count)
    of a token file of ``size`` bytes, checked against the file's size."""
    if side is not None and "dtype" in side:  # flat: the sidecar declares it
        dt = FLAT_DTYPES[side["dtype"]]
        if size == 0:
            raise InputError(f"{path}: empty token file")
        if size % dt.itemsize:
            raise InputError(
                f"{path}: {size} bytes is not a whole number of {side['dtype']} tokens "
                "(odd byte count: truncated or not this dtype)"
            )
        return "flat", dt, 0, size // dt.itemsize
    head_bytes = 4 * LLMC_HEADER_INTS
    if size < head_bytes:
        raise InputError(
            f"{path}: {size} bytes, shorter than the llm.c header of {head_bytes} bytes "
            f"(a flat token file needs a sidecar {sidecar_path(path).name} giving its dtype)"
        )
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(head_bytes), dtype="<i4")
    if int(header[0]) != LLMC_MAGIC:
        raise InputError(
            f"{path}: no llm.c header (magic {int(header[0])}, expected {LLMC_MAGIC}); "
            f"a flat token file needs a sidecar {sidecar_path(path).name} with its dtype"
        )
    version = int(header[1])
    if version not in LLMC_DTYPES:
        raise InputError(f"{path}: llm.c header version {version} is not 1 (uint16) or 2 (uint32)")
    dt = LLMC_DTYPES[version]
    count = int(header[2])
    if count < 1:
        raise InputError(f"{path}: llm.c header declares {count} tokens")
    want = head_bytes + count * dt.itemsize
    if size != want:
        raise InputError(
            f"{path}: the header declares {count} tokens ({want} bytes with the header) "
            f"but the file has {size} bytes ({'truncated' if size < want else 'trailing bytes'})"
        )
    return "llm.c", dt, head_bytes, count


def read_token_file(path, vocab: int | None = None) -> tuple[np.ndarray, int, dict]:
    """[data.tokenfile.c1] The tokens of one file (as stored, little-endian),
    its vocabulary size and a description.  ``vocab`` (from ``--vocab``) must
    agree with the sidecar's when both are given."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"token file not found: {path}")
    side = read_sidecar(path)
    declared = None if side is None else side.get("vocab")
    if vocab is not None:
        check_vocab(vocab, "--vocab")
        if declared is not None and declared != vocab:
            raise InputError(f"{path}: --vocab {vocab} differs from the sidecar's vocab {declared}")
    v = vocab if vocab is not None else declared
    if v is None:
        raise InputError(
            f"{path}: the vocabulary size is not known: give --vocab V or a sidecar "
            f'{sidecar_path(path).name} with "vocab" (GPT-2\'s is 50257)'
        )
    size = os.stat(path).st_size
    layout, dt, offset, count = _layout(path, side, size)
    tokens = np.fromfile(path, dtype=dt, count=count, offset=offset)
    if tokens.size != count:
        raise InputError(f"{path}: file shrank while being read")
    top = int(tokens.max())
    if top >= v:
        at = int(np.argmax(tokens >= v))
        raise InputError(f"{path}: token id {top} at position {at} is outside the vocabulary [0, {v})")
    return tokens, v, {"file": str(path), "layout": layout, "dtype": dt.name, "tokens": count}


def peek_vocab(files, vocab: int | None = None) -> int:
    """The one vocabulary size that the files' sidecars and ``--vocab``
    declare (read without the tokens)."""
    found = set() if vocab is None else {check_vocab(vocab, "--vocab")}
    for f in files:
        side = read_sidecar(f)
        if side is not None and "vocab" in side:
            found.add(side["vocab"])
    if len(found) != 1:
        raise InputError(
            "the token files' vocabulary size is not known: give --vocab V or a sidecar "
            'FILE.json with "vocab" (GPT-2\'s is 50257)'
            if not found
            else f"the token files declare different vocabulary sizes {sorted(found)}"
        )
    return found.pop()


def load_tokens(files, vocab: int | None = None) -> tuple[np.ndarray, int, dict]:
    """[data.tokenfile.c1] The files' tokens concatenated in the order given,
    in the storage dtype of [data.vocab.c1]; the vocabulary size V (every file
    must have the same); and a description of the source (hashed with the
    manifest)."""
    files = list(files or ())
    if not files:
        raise InputError("no token files given")
    v = peek_vocab(files, vocab)  # one V for all: a sidecar's, or --vocab
    parts, described = [], []
    for f in files:
        toks, _, info = read_token_file(f, v)
        parts.append(toks)
        described.append(info)
    dt = token_dtype(v)
    tokens = np.concatenate([p.astype(dt) for p in parts])  # exact: every token < V fits
    source = {
        "kind": "token-files",
        "vocab": v,
        "files": described,
        "tokens": int(tokens.size),
        "sha256": hashlib.sha256(tokens.astype(dt.newbyteorder("<")).tobytes()).hexdigest(),
    }
    return tokens, v, source


def make_samples(tokens: np.ndarray, t: int) -> np.ndarray:
    """[data.samples.c1] (N, T+1): sample i is tokens [i*(T+1), (i+1)*(T+1)),
    N = floor(count / (T+1)); the tail is dropped."""
    if t < 1:
        raise InputError(f"sequence length T must be >= 1, got {t}")
    n = tokens.size // (t + 1)
    if n == 0:
        raise InputError(f"{tokens.size} tokens are fewer than one sample of {t + 1} tokens")
    return np.ascontiguousarray(tokens[: n * (t + 1)]).reshape(n, t + 1).copy()


def token_bytes(tokens: np.ndarray) -> bytes:
    """[data.hash.c1] Tokens as the little-endian bytes of their storage dtype."""
    return np.ascontiguousarray(tokens, dtype=tokens.dtype.newbyteorder("<")).tobytes()


def write_llmc(path, tokens, version: int = 1) -> None:
    """Write an llm.c token file (header + tokens): for tests and benchmarks."""
    dt = LLMC_DTYPES[version]
    header = np.zeros(LLMC_HEADER_INTS, "<i4")
    header[:3] = (LLMC_MAGIC, version, len(tokens))
    from .. import files

    files.write_atomic(path, header.tobytes() + np.asarray(tokens, dtype=dt).tobytes())
