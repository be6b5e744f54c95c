"""Training data: byte-level corpus, fixed-length samples, zstd shards, and
the topology-invariant stream (``spec/21-data.txt``).

* [data.tokens.c1]  a token is a byte (V = 256) of the default corpus, or a
  token id of pre-tokenized files (``refreplay.training.tokens``, [data.tokenfile.c1]);
* [data.corpus.c1]  the default corpus is the running Python's standard
  library ``.py`` sources in a stated order, capped; or files the user names;
* [data.samples.c1] sample i is bytes [i*(T+1), (i+1)*(T+1)) of the corpus;
* [data.shards.c1]  samples in zstd shards named by the manifest with
  SHA-256 content hashes;
* [data.stream.c1]  the samples of step n and their order depend only on
  (seed, n, global batch): a Philox permutation per epoch;
* [data.batch.c1]   micro-batch m is samples [m*B, (m+1)*B) of that order,
  rank q gets a contiguous range of micro-batches;
* [data.hash.c1]    the data hash of a step.

The corpus is only read when a run is created; a published run carries its
shards, so replay never depends on the machine's standard library.
"""

from __future__ import annotations

import hashlib
import json
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import files, rng, untrusted
from ..errors import InputError
from . import tokens

VOCAB = 256
DEFAULT_BYTE_CAP = 1 << 20  # [data.corpus.c1]
SHARD_SAMPLES = 4096  # [data.shards.c1]
ZSTD_LEVEL = 10
MANIFEST_FORMAT = "refreplay-shards/1"
EXCLUDED_DIRS = ("site-packages", "dist-packages", "__pycache__")


# ---- corpus ----------------------------------------------------------------------


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"]).resolve()


def default_corpus_files(root: Path | None = None) -> list[tuple[str, Path]]:
    """[data.corpus.c1] (relative POSIX path, path) of every ``*.py`` file under
    the standard library directory, skipping directories named site-packages,
    dist-packages and __pycache__, sorted by the UTF-8 bytes of the relative
    path."""
    root = stdlib_dir() if root is None else Path(root)
    found = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if any(part in EXCLUDED_DIRS for part in rel.parts[:-1]) or not path.is_file():
            continue
        found.append((rel.as_posix(), path))
    found.sort(key=lambda item: item[0].encode("utf-8"))
    return found


def build_corpus(files=None, byte_cap: int = DEFAULT_BYTE_CAP) -> tuple[bytes, dict]:
    """[data.corpus.c1] The corpus bytes and a description of where they came from.

    ``files``: None for the default corpus, else paths concatenated in the
    order given.  The files' bytes are concatenated with nothing between them
    and the result is cut to its first ``byte_cap`` bytes.
    """
    if not isinstance(byte_cap, int) or byte_cap < 1:
        raise InputError(f"corpus byte cap must be a positive integer, got {byte_cap!r}")
    if files is None:
        named = default_corpus_files()
        source = {"kind": "python-stdlib", "root": str(stdlib_dir())}
    else:
        named = []
        for f in files:
            p = Path(f)
            if not p.is_file():
                raise InputError(f"corpus file not found: {f}")
            named.append((str(f), p))
        source = {"kind": "files"}
        if not named:
            raise InputError("no corpus files given")
    chunks, total, used = [], 0, []
    for rel, path in named:
        if total >= byte_cap:
            break
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise InputError(f"cannot read corpus file {rel}: {exc}") from None
        chunks.append(data[: byte_cap - total])
        total += len(chunks[-1])
        used.append(rel)
    corpus = b"".join(chunks)
    source.update(
        files_used=len(used),
        first_file=used[0] if used else None,
        last_file=used[-1] if used else None,
        byte_cap=byte_cap,
        bytes=len(corpus),
        sha256=hashlib.sha256(corpus).hexdigest(),
    )
    return corpus, source


def make_samples(corpus: bytes, t: int) -> np.ndarray:
    """[data.samples.c1] (N, T+1) uint8: sample i is corpus bytes
    [i*(T+1), (i+1)*(T+1)), N = floor(len / (T+1)); the tail is dropped."""
    if t < 1:
        raise InputError(f"sequence length T must be >= 1, got {t}")
    n = len(corpus) // (t + 1)
    if n == 0:
        raise InputError(f"corpus of {len(corpus)} bytes is shorter than one sample of {t + 1} tokens")
    return np.frombuffer(corpus, dtype=np.uint8, count=n * (t + 1)).reshape(n, t + 1).copy()


# ---- shards ------------------------------------------------------------------------


def _sha256(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def write_shards(samples: np.ndarray, directory: Path, source: dict, vocab: int = VOCAB) -> dict:
    """[data.shards.c1] Write ``shard-JJJJJ.zst`` files and ``manifest.json`` into
    ``directory``; return the manifest.  Shard j holds samples
    [j*4096, min((j+1)*4096, N)) as row-major tokens in the storage dtype of
    the vocabulary ([data.vocab.c1]: uint8 for V <= 256), one zstd frame."""
    import zstandard

    if samples.dtype != tokens.token_dtype(vocab) or samples.ndim != 2:
        raise ValueError(f"samples must be a 2-d {tokens.token_dtype(vocab)} array (N, T+1) for V = {vocab}")
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise files.write_error(exc, directory) from None
    shards = []
    comp = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_checksum=True)
    for j, lo in enumerate(range(0, samples.shape[0], SHARD_SAMPLES)):
        raw = tokens.token_bytes(samples[lo : lo + SHARD_SAMPLES])
        name = f"shard-{j:05d}.zst"
        files.write_atomic(directory / name, comp.compress(raw))  # synced, renamed: whole or absent
        shards.append({"file": name, "samples": len(raw) // samples[0].nbytes, "sha256": _sha256(raw)})
    manifest = {
        "format": MANIFEST_FORMAT,
        "vocab": vocab,
        "sample_tokens": int(samples.shape[1]),
        "samples": int(samples.shape[0]),
        "source": source,
        "shards": shards,
    }
    files.write_atomic(directory / "manifest.json", manifest_bytes(manifest))
    return manifest


def manifest_bytes(manifest: dict) -> bytes:
    """Canonical JSON of a manifest: sorted keys, two-space indent, trailing newline."""
    return (json.dumps(manifest, sort_keys=True, indent=2, ensure_ascii=True) + "\n").encode()


def _require(cond, msg):
    if not cond:
        raise InputError(msg)


def _check_manifest(m, where: str) -> None:
    _require(isinstance(m, dict), f"{where}: manifest is not a JSON object")
    _require(
        m.get("format") == MANIFEST_FORMAT,
        f"{where}: unknown manifest format {m.get('format')!r} (expected {MANIFEST_FORMAT})",
    )
    v = m.get("vocab")
    _require(
        isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= tokens.MAX_VOCAB,
        f"{where}: vocab must be an integer in [1, 2^20], got {v!r}",
    )
    for key in ("sample_tokens", "samples"):
        v = m.get(key)
        _require(
            isinstance(v, int) and not isinstance(v, bool) and v >= 1,
            f"{where}: {key} must be a positive integer, got {v!r}",
        )
    shards = m.get("shards")
    _require(isinstance(shards, list) and shards, f"{where}: shards must be a non-empty list")
    total = 0
    for j, s in enumerate(shards):
        _require(isinstance(s, dict), f"{where}: shard entry {j} is not an object")
        _require(
            s.get("file") == f"shard-{j:05d}.zst",
            f"{where}: shard {j} must be named shard-{j:05d}.zst, got {s.get('file')!r}",
        )
        n = s.get("samples")
        last = j == len(shards) - 1
        _require(
            isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= SHARD_SAMPLES and (last or n == SHARD_SAMPLES),
            f"{where}: shard {j} has a bad sample count {n!r}",
        )
        h = s.get("sha256")
        _require(
            isinstance(h, str) and len(h) == 64 and all(c in "0123456789abcdef" for c in h),
            f"{where}: shard {j} has a malformed sha256",
        )
        total += n
    _require(total == m["samples"], f"{where}: shards hold {total} samples, manifest says {m['samples']}")


def load_manifest(directory: Path) -> tuple[dict, bytes]:
    """Read and validate ``manifest.json``; returns (manifest, its bytes)."""
    path = Path(directory) / "manifest.json"
    raw = untrusted.read_file(path, untrusted.MAX_JSON, directory, "shard manifest")
    m = untrusted.parse_json(raw, str(path))
    _check_manifest(m, str(path))
    return m, raw


def shard_limit(n_bytes: int) -> int:
    """The largest compressed shard accepted for ``n_bytes`` of content: zstd's
    worst-case expansion (raw blocks) plus room for frame headers."""
    return n_bytes + (n_bytes >> 7) + (1 << 16)


@dataclass
class Shards:
    """The samples of a run's shards as read, and what was wrong with them.

    ``altered``: messages for shards whose content does not hash to the
    manifest (their samples are kept as stored: a step that draws one of them
    then has a different data hash).  ``unreadable``: (first sample, end,
    message) for shards that are missing or cannot be decoded (their samples
    are zeros and must not be used)."""

    samples: np.ndarray
    manifest: dict
    altered: list[str]
    unreadable: list[tuple[int, int, str]]

    def unreadable_in(self, ids) -> list[str]:
        """Messages of the unreadable shards that hold any of sample ``ids``."""
        ids = np.asarray(ids)
        return [msg for lo, hi, msg in self.unreadable if np.any((ids >= lo) & (ids < hi))]


def read_shards(directory: Path, verify: bool = True, problems: bool = False):
    """[data.shards.c1] Load every shard, checking each content hash; returns
    ((N, T+1) samples in the storage dtype of [data.vocab.c1], manifest).
    Each shard is read under a size limit and decompressed as a stream into
    exactly the bytes its sample count implies, whatever size its frame
    declares; a token outside [0, V) is refused (the model could not embed it).

    With ``verify=False`` a damaged shard is not an error: ``problems=True``
    then returns a ``Shards`` instead, whose samples are as stored and which
    says which shards are altered or unreadable (an auditor replays the
    altered data to find the step it changes, and any step that draws an
    unreadable sample cannot be verified)."""
    directory = Path(directory)
    manifest, _ = load_manifest(directory)
    width = manifest["sample_tokens"]
    dt = tokens.token_dtype(manifest["vocab"])
    samples = np.zeros((manifest["samples"], width), dt)
    altered, unreadable = [], []
    lo = 0
    for s in manifest["shards"]:
        path = directory / s["file"]
        want = s["samples"] * width * dt.itemsize
        try:
            comp = untrusted.read_file(path, shard_limit(want), directory, "data shard")
            raw = untrusted.zstd_frame(comp, want, f"data shard {path}")
            part = np.frombuffer(raw, dtype=dt.newbyteorder("<")).astype(dt, copy=False)
            top = int(part.max()) if part.size else 0
            _require(
                top < manifest["vocab"],
                f"data shard {path}: token id {top} is outside the vocabulary [0, {manifest['vocab']})",
            )
        except InputError as exc:
            if verify:
                raise
            unreadable.append((lo, lo + s["samples"], str(exc)))
        else:
            if _sha256(raw) != s["sha256"]:
                msg = f"data shard {path}: content sha256 {_sha256(raw)} does not match the manifest"
                _require(not verify, msg)
                altered.append(msg)
            samples[lo : lo + s["samples"]] = part.reshape(s["samples"], width)
        lo += s["samples"]
    if problems:
        return Shards(samples, manifest, altered, unreadable)
    return samples, manifest


# ---- the stream ----------------------------------------------------------------------


@dataclass(frozen=True)
class Batching:
    """Global batch geometry: M micro-batches of B samples (G = M*B per step)."""

    micro_batches: int  # M
    micro_batch_size: int  # B

    @property
    def global_batch(self) -> int:
        return self.micro_batches * self.micro_batch_size


def step_sample_ids(seed: int, step: int, global_batch: int, n_samples: int) -> np.ndarray:
    """[data.stream.c1] The G sample indices of step n >= 1, in order (int64):
    with E = floor(N / G) steps per epoch, epoch e = (n-1) div E and
    j = (n-1) mod E, the indices are entries [j*G, (j+1)*G) of the epoch's
    permutation [rng.data.c1].  Nothing here depends on the rank count."""
    for what, v in (("step", step), ("global batch", global_batch), ("sample count", n_samples)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{what} must be a positive integer, got {v!r}")
    e_steps = n_samples // global_batch
    if e_steps == 0:
        raise InputError(
            f"the data holds {n_samples} samples, fewer than one "
            f"global batch of {global_batch}; use a larger corpus or a smaller batch"
        )
    epoch, j = (step - 1) // e_steps, (step - 1) % e_steps
    perm = rng.data_permutation(seed, epoch, n_samples)
    return perm[j * global_batch : (j + 1) * global_batch].copy()


class Stream:
    """[data.stream.c1] The samples of every step, as a pure function of
    (seed, step, global batch).  Holds the N samples; caches one epoch's
    permutation."""

    def __init__(self, samples: np.ndarray, seed: int, batching: Batching):
        if samples.dtype not in (np.uint8, np.uint16, np.uint32) or samples.ndim != 2:
            raise ValueError("samples must be a 2-d unsigned token array (N, T+1)")
        self.samples = samples
        self.seed = seed
        self.batching = batching
        g = batching.global_batch
        self.steps_per_epoch = samples.shape[0] // g
        if self.steps_per_epoch == 0:
            raise InputError(
                f"the data holds {samples.shape[0]} samples, fewer than one "
                f"global batch of {g}; use a larger corpus or a smaller batch"
            )
        self._perm = (None, None)

    def position(self, step: int) -> tuple[int, int]:
        """[data.stream.c1] (epoch, index of the batch within the epoch) of step n >= 1."""
        if not isinstance(step, (int, np.integer)) or step < 1:
            raise ValueError(f"steps are numbered from 1, got {step!r}")
        return (step - 1) // self.steps_per_epoch, (step - 1) % self.steps_per_epoch

    def sample_ids(self, step: int) -> np.ndarray:
        """[data.stream.c1] The G sample indices of step n, in order (int64)."""
        epoch, j = self.position(step)
        if self._perm[0] != epoch:
            self._perm = (epoch, rng.data_permutation(self.seed, epoch, self.samples.shape[0]))
        g = self.batching.global_batch
        return self._perm[1][j * g : (j + 1) * g].copy()

    def batch(self, step: int) -> np.ndarray:
        """The step's samples, (G, T+1) tokens, in stream order."""
        return self.samples[self.sample_ids(step)]

    def micro_batch(self, step: int, m: int) -> np.ndarray:
        """[data.batch.c1] Micro-batch m: samples [m*B, (m+1)*B) of the step's order."""
        bsz = self.batching.micro_batch_size
        if not 0 <= m < self.batching.micro_batches:
            raise ValueError(f"micro-batch {m} out of range [0, {self.batching.micro_batches})")
        return self.samples[self.sample_ids(step)[m * bsz : (m + 1) * bsz]]

    def data_hash(self, step: int) -> bytes:
        """[data.hash.c1] SHA-256 of the step's G*(T+1) tokens in stream order."""
        return hashlib.sha256(tokens.token_bytes(self.batch(step))).digest()


def inputs_targets(micro: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[data.batch.c1] A micro-batch (B, T+1) of tokens as model inputs tokens[:, :T]
    and targets tokens[:, 1:], both (B, T) int32."""
    x = np.ascontiguousarray(micro[:, :-1], dtype=np.int32)
    y = np.ascontiguousarray(micro[:, 1:], dtype=np.int32)
    return x, y
