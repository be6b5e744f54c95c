"""The published run directory: write it while training, read it back with
every field and file validated (format: ``docs/run-format.md``).

    RUN/recipe.json                     the recipe; its "recipe" object is hashed
    RUN/data/manifest.json              shard manifest ([data.shards.c1])
    RUN/data/shard-JJJJJ.zst            the samples
    RUN/checkpoints/step-NNNNNNN.safetensors   state at step 0, every K, and the last
    RUN/steps.jsonl                     one hash record per step, 0..N ([step.record.c1])
    RUN/digests.jsonl                   each step's full state digest (localisation only)
    RUN/head.json                       the chain head (written last)

The functions an auditor or replayer needs:

    run = open_run(path)         validated recipe, manifest, records, head
    open_run(path, strict=False) hash mismatches become run.findings instead
    run.recipe, run.recipe_sha256, run.records, run.head
    run.load_checkpoint(k)       the TrainState at step k (root checked)
    run.state_digest(k)          the published Merkle digest of state k, or None
    run.stream(), run.batch(n)   the data of step n, rebuilt from the shards
    run.trainer()                a step.Trainer for this recipe
    run.replay_step(state)       one step from a state -> (state, record)

Everything read here is untrusted: any problem raises ``InputError`` with
the file and the field named.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import __version__, files, spec, tensorio, untrusted
from .. import state as statehash
from ..errors import InputError
from . import data
from .tokens import padded_vocab
from .presets import PRESETS, ModelConfig, TrainConfig, model_from_json, model_to_json, train_from_json, train_to_json

RUN_FORMAT = "refreplay-run/1"
RECIPE_FILE = "recipe.json"
STEPS_FILE = "steps.jsonl"
HEAD_FILE = "head.json"
DIGESTS_FILE = "digests.jsonl"
DATA_DIR = "data"
CKPT_DIR = "checkpoints"
LAUNCHERS = ("inproc", "mpi", "torch")  # "torch": published from a torch.distributed loop
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_F32HEX = re.compile(r"^0x[0-9A-F]{8}$")
_RECORD_BYTES = 1024  # a steps.jsonl line is about 300 bytes


def canonical_json(obj) -> bytes:
    """[step.recipe.c1] Sorted keys, no spaces, ASCII only: the bytes that are hashed."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def recipe_hash_of_json(text: str) -> str:
    """[step.recipe.c1] SHA-256 (hex) of the canonical JSON of a JSON text."""
    obj = untrusted.parse_json(text, "recipe")
    return hashlib.sha256(canonical_json(obj)).hexdigest()


def checkpoint_name(step: int) -> str:
    return f"step-{step:07d}.safetensors"


def checkpoint_steps(steps: int, every: int) -> list[int]:
    """Step 0, every multiple of K up to N, and N."""
    return sorted({0, steps, *range(every, steps + 1, every)})


# ---- the recipe ----------------------------------------------------------------------


@dataclass(frozen=True)
class Recipe:
    model: ModelConfig
    train: TrainConfig
    manifest_sha256: str
    samples: int
    preset: str | None
    ranks: int
    launcher: str
    steps: int
    checkpoint_every: int
    spec_version: str
    spec_sha256: str
    refreplay_version: str

    def hashed(self) -> dict:
        """[step.recipe.c1] The part of the recipe that decides bits."""
        return {
            "spec_version": self.spec_version,
            "model": model_to_json(self.model),
            "train": train_to_json(self.train),
            "data": {
                "manifest_sha256": self.manifest_sha256,
                "samples": self.samples,
                "sample_tokens": self.model.seq_len + 1,
            },
        }

    def sha256(self) -> str:
        """[step.recipe.c1] The recipe hash bound into every chain link (binary32
        fields already written as "0x" bit patterns by ``hashed``)."""
        return hashlib.sha256(canonical_json(self.hashed())).hexdigest()

    def to_json(self) -> dict:
        return {
            "format": RUN_FORMAT,
            "recipe": self.hashed(),
            "recipe_sha256": self.sha256(),
            "run": {
                "preset": self.preset,
                "ranks": self.ranks,
                "launcher": self.launcher,
                "steps": self.steps,
                "checkpoint_every": self.checkpoint_every,
            },
            "provenance": {"refreplay_version": self.refreplay_version, "spec_sha256": self.spec_sha256},
        }


def _need(cond, msg):
    if not cond:
        raise InputError(msg)


def _obj(d, key, where) -> dict:
    v = d.get(key) if isinstance(d, dict) else None
    _need(isinstance(v, dict), f"{where}: field {key!r} must be a JSON object")
    return v


def _int(d, key, where, lo=0, hi=1 << 62) -> int:
    v = d.get(key)
    _need(
        isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi,
        f"{where}: field {key!r} must be an integer in [{lo}, {hi}], got {v!r}",
    )
    return v


def _exact_keys(d, keys, where):
    extra = sorted(set(d) - set(keys))
    missing = sorted(set(keys) - set(d))
    _need(
        not extra and not missing,
        f"{where}: "
        + "; ".join(
            filter(
                None,
                [
                    extra and f"unknown field(s) {', '.join(extra)}",
                    missing and f"missing field(s) {', '.join(missing)}",
                ],
            )
        ),
    )


# [step.recipe.keys.c1] The model keys a later spec version added: a run made
# under an earlier version may only hold the value the key is omitted at.
_MODEL_KEYS_SINCE = (
    ("precision", "fp32", "0.3.0"),  # [bf16.precision.c1]
    ("pos", "rope", "0.4.0"),  # [model.pos.c1]
    ("norm_bias", True, "0.4.0"),
)  # [norm.layer.nobias.c1]


def _version(v: str) -> tuple:
    return tuple(int(x) for x in v.split("."))


def recipe_from_json(obj, where: str = RECIPE_FILE, on_edited=None) -> Recipe:
    """Validate every field of a recipe.json object (the keys, types and
    values of [step.recipe.keys.c1]).  A recipe_sha256 that is
    not the hash of the recipe raises InputError, or, when ``on_edited`` is
    given, is passed to ``on_edited(published_sha256, message)``."""
    _need(isinstance(obj, dict), f"{where}: not a JSON object")
    _exact_keys(obj, ("format", "recipe", "recipe_sha256", "run", "provenance"), where)
    _need(obj["format"] == RUN_FORMAT, f"{where}: unknown format {obj['format']!r} (expected {RUN_FORMAT})")
    hashed = _obj(obj, "recipe", where)
    _exact_keys(hashed, ("spec_version", "model", "train", "data"), f"{where}: recipe")
    sv = hashed["spec_version"]
    _need(
        sv in spec.replayed_versions(),
        f"{where}: the run was made under spec {sv!r}; this refreplay "
        f"implements spec {spec.version()!r} and replays runs of "
        f"{', '.join(spec.replayed_versions())}",
    )
    model = model_from_json(_obj(hashed, "model", where), f"{where}: recipe.model")
    for key, default, since in _MODEL_KEYS_SINCE:
        _need(
            _version(sv) >= _version(since) or getattr(model, key) == default,
            f"{where}: recipe.model.{key} is a field of spec {since} and later, not of {sv} ([conv.version.c1])",
        )
    train = train_from_json(_obj(hashed, "train", where), f"{where}: recipe.train")
    dat = _obj(hashed, "data", where)
    _exact_keys(dat, ("manifest_sha256", "samples", "sample_tokens"), f"{where}: recipe.data")
    msha = dat["manifest_sha256"]
    _need(isinstance(msha, str) and _HEX64.match(msha), f"{where}: recipe.data.manifest_sha256 is malformed")
    samples = _int(dat, "samples", f"{where}: recipe.data", 1)
    _need(
        dat["sample_tokens"] == model.seq_len + 1,
        f"{where}: recipe.data.sample_tokens must be seq_len + 1 = {model.seq_len + 1}",
    )
    run = _obj(obj, "run", where)
    _exact_keys(run, ("preset", "ranks", "launcher", "steps", "checkpoint_every"), f"{where}: run")
    preset = run["preset"]
    _need(
        preset is None or (isinstance(preset, str) and preset in PRESETS),
        f"{where}: unknown preset {preset!r}; known presets: {', '.join(sorted(PRESETS))}",
    )
    ranks = _int(run, "ranks", f"{where}: run", 1, train.micro_batches)
    _need(run["launcher"] in LAUNCHERS, f"{where}: run.launcher must be one of {LAUNCHERS}")
    steps = _int(run, "steps", f"{where}: run", 0, 1 << 24)
    every = _int(run, "checkpoint_every", f"{where}: run", 1, 1 << 24)
    prov = _obj(obj, "provenance", where)
    _exact_keys(prov, ("refreplay_version", "spec_sha256"), f"{where}: provenance")
    _need(
        isinstance(prov["refreplay_version"], str)
        and isinstance(prov["spec_sha256"], str)
        and _HEX64.match(prov["spec_sha256"]),
        f"{where}: provenance fields are malformed",
    )
    recipe = Recipe(
        model,
        train,
        msha,
        samples,
        preset,
        ranks,
        run["launcher"],
        steps,
        every,
        sv,
        prov["spec_sha256"],
        prov["refreplay_version"],
    )
    published = obj["recipe_sha256"]
    _need(isinstance(published, str) and _HEX64.match(published), f"{where}: recipe_sha256 is malformed")
    if published != recipe.sha256():
        msg = (
            f"{where}: recipe_sha256 {published} is not the hash of the recipe "
            f"({recipe.sha256()}): the recipe was edited"
        )
        if on_edited is None:
            raise InputError(msg)
        on_edited(published, msg)
    return recipe


def new_recipe(
    model: ModelConfig,
    train: TrainConfig,
    manifest_sha256: str,
    samples: int,
    *,
    preset,
    ranks,
    launcher,
    steps,
    checkpoint_every,
) -> Recipe:
    return Recipe(
        model.validate(),
        train.validate(),
        manifest_sha256,
        samples,
        preset,
        ranks,
        launcher,
        steps,
        checkpoint_every,
        spec.version(),
        spec.spec_sha256(),
        __version__,
    )


# ---- records ---------------------------------------------------------------------------


def record_to_json(rec) -> dict:
    return {
        "step": rec.step,
        "state_root": rec.state_root,
        "data_hash": rec.data_hash,
        "chain_link": rec.chain_link,
        "loss": rec.loss_hex(),
    }


def _record_from_json(obj, where):
    from .step import StepRecord

    _need(isinstance(obj, dict), f"{where}: not a JSON object")
    _exact_keys(obj, ("step", "state_root", "data_hash", "chain_link", "loss"), where)
    step = _int(obj, "step", where)
    for key in ("state_root", "data_hash", "chain_link"):
        _need(isinstance(obj[key], str) and _HEX64.match(obj[key]), f"{where}: {key} must be 64 lower-case hex digits")
    loss = obj["loss"]
    if step == 0:
        _need(loss is None, f"{where}: step 0 has no loss")
    else:
        _need(isinstance(loss, str) and _F32HEX.match(loss), f"{where}: loss must be a 0x bit pattern")
        loss = np.array([int(loss, 16)], np.uint32).view(np.float32)[0]
    return StepRecord(step, obj["state_root"], obj["data_hash"], obj["chain_link"], loss)


# ---- reading ------------------------------------------------------------------------------


class Run:
    """A published run directory, validated on open (see ``open_run``)."""

    def __init__(self, path, strict: bool = True, incomplete: bool = False):
        """``strict``: every integrity problem (a hash that does not match) is
        an ``InputError``.  With ``strict=False`` (what replay uses) only
        malformed or missing files raise; integrity problems are collected in
        ``self.findings`` as ``Finding(step, kind, message)`` so that a
        replay can report them as a verification failure at the step they
        affect.

        ``incomplete``: accept a run whose training stopped early (a crash):
        fewer records than steps + 1, a torn last line of steps.jsonl
        (dropped), no head.json.  ``self.complete`` then says which it is and
        ``self.last_step`` is the last step with a whole record; ``self.head``
        is None when there is no head.  Without it such a run is refused."""
        self.strict = strict
        self.incomplete_ok = incomplete
        self.findings: list[Finding] = []
        self.warnings: list[str] = []  # faults of localisation aids (digests, traces): never a verdict
        self.path = Path(path)
        _need(self.path.is_dir(), f"run directory not found: {self.path}")
        self._root = untrusted.resolve(self.path)
        obj = untrusted.parse_json(self._read(RECIPE_FILE, "recipe"), str(self.path / RECIPE_FILE))
        published = []

        def edited(sha, msg):
            # Not strict: replay runs the edited recipe (step 1 is the first
            # step it decides); the chain is checked with the published hash.
            self._integrity(False, 1, "recipe", msg)
            published.append(sha)

        self.recipe = recipe_from_json(obj, str(self.path / RECIPE_FILE), None if strict else edited)
        self.recipe_sha256 = published[0] if published else self.recipe.sha256()
        self.manifest, mraw = data.load_manifest(self._file(DATA_DIR, "manifest.json").parent)
        self._integrity(
            hashlib.sha256(mraw).hexdigest() == self.recipe.manifest_sha256,
            None,
            "data",
            f"{self.path / DATA_DIR / 'manifest.json'}: sha256 does not match the recipe's manifest_sha256",
        )
        _need(
            self.manifest["samples"] == self.recipe.samples
            and self.manifest["sample_tokens"] == self.recipe.model.seq_len + 1,
            f"{self.path / DATA_DIR / 'manifest.json'}: sample count or length differs from the recipe",
        )
        _need(
            self.recipe.model.vocab == padded_vocab(self.manifest["vocab"]),
            f"{self.path / DATA_DIR / 'manifest.json'}: vocabulary {self.manifest['vocab']} does not pad to "
            f"the recipe's model vocabulary {self.recipe.model.vocab} ([data.vocab.c1])",
        )
        self.records = self._read_records()
        self.last_step = len(self.records) - 1
        has_head = _present(self.path / HEAD_FILE)
        if incomplete and not has_head:
            self.head = None
        else:
            _need(
                self.last_step == self.recipe.steps,
                f"{self.path / STEPS_FILE}: {len(self.records)} records for a run of {self.recipe.steps} steps "
                f"(expected {self.recipe.steps + 1}, steps 0..{self.recipe.steps}) beside a chain head: the "
                "records were truncated after publication",
            )
            self.head = self._read_head()
        self.complete = self.head is not None
        self.checkpoints = checkpoint_steps(self.recipe.steps, self.recipe.checkpoint_every)
        if strict:  # replay reads a shard or checkpoint only when a step needs it
            for s in self.manifest["shards"]:
                self._file(DATA_DIR, s["file"])  # inside the run directory, present
            for k in self.checkpoints if self.complete else ():  # a crash may precede a checkpoint
                self._file(CKPT_DIR, checkpoint_name(k))
        self._shards = None
        self._stream = None
        self._digests = None

    def _integrity(self, ok: bool, step, kind: str, message: str) -> None:
        if ok:
            return
        if self.strict:
            raise InputError(message)
        self.findings.append(Finding(step, kind, message))

    # -- files
    def _file(self, *parts) -> Path:
        """A path inside the run directory that exists; symbolic links that
        lead outside it are refused."""
        p = self.path.joinpath(*parts)
        resolved = untrusted.resolve(p)  # a loop of links: an InputError saying so
        try:
            resolved.relative_to(self._root)
        except ValueError:
            raise InputError(f"{p}: leads outside the run directory") from None
        _need(p.is_file(), f"missing file {p}")
        return p

    def _read(self, name, what, limit=untrusted.MAX_JSON) -> bytes:
        return untrusted.read_file(self.path / name, limit, self._root, f"{what} file")

    def _read_records(self):
        where = self.path / STEPS_FILE
        limit = (self.recipe.steps + 1) * _RECORD_BYTES
        if self.incomplete_ok and not _present(where):
            return []  # training stopped before the record of step 0
        raw = self._read(STEPS_FILE, "step hash", limit)
        if self.incomplete_ok and raw and not raw.endswith(b"\n"):
            raw = raw[: raw.rfind(b"\n") + 1]  # a record is whole only with its newline
        lines = raw.decode("utf-8", "replace").splitlines()
        recs = []
        prev = statehash.GENESIS
        for i, line in enumerate(lines):
            w = f"{where}:{i + 1}"
            rec = _record_from_json(untrusted.parse_json(line, w), w)
            _need(rec.step == i, f"{w}: expected step {i}, found step {rec.step}")
            if i == 0:
                _need(
                    rec.chain_link == statehash.GENESIS and rec.data_hash == "00" * 32,
                    f"{w}: step 0 must carry the genesis link and a zero data hash",
                )
            else:
                want = statehash.chain_link(prev, rec.state_root, rec.data_hash, self.recipe_sha256, rec.loss_hex())
                self._integrity(
                    rec.chain_link == want,
                    i,
                    "chain",
                    f"{w}: chain link does not follow from the previous link, this step's "
                    "hashes, its loss and the recipe hash",
                )
            prev = rec.chain_link
            recs.append(rec)
        _need(
            len(recs) <= self.recipe.steps + 1,
            f"{where}: {len(recs)} records for a run of {self.recipe.steps} steps (at most "
            f"{self.recipe.steps + 1}, steps 0..{self.recipe.steps})",
        )
        _need(
            len(recs) == self.recipe.steps + 1 or self.incomplete_ok,
            f"{where}: {len(recs)} records for a run of {self.recipe.steps} steps (expected "
            f"{self.recipe.steps + 1}, steps 0..{self.recipe.steps}); the run is incomplete or truncated "
            f"(a crashed training run is continued with `refreplay train --resume {self.path}`)",
        )
        return recs

    def _read_head(self) -> dict:
        where = self.path / HEAD_FILE
        head = untrusted.parse_json(self._read(HEAD_FILE, "chain head", 1 << 16), str(where))
        _need(isinstance(head, dict), f"{where}: not a JSON object")
        _exact_keys(head, ("step", "chain_link", "recipe_sha256"), str(where))
        _int(head, "step", str(where))
        for key in ("chain_link", "recipe_sha256"):
            _need(
                isinstance(head[key], str) and _HEX64.match(head[key]),
                f"{where}: field {key!r} must be 64 lower-case hex digits",
            )
        last = self.records[-1]
        if head["step"] != last.step or head["chain_link"] != last.chain_link:
            # the records are checked link by link; a head that is not their last link
            # was substituted (or is stale), whatever recipe it names
            self._integrity(
                False,
                last.step,
                "head",
                f"{where}: the chain head (step {head['step']}, link {head['chain_link']}) is not "
                f"the last link of {STEPS_FILE} (step {last.step}, link {last.chain_link}): "
                "head.json was substituted or belongs to another run",
            )
        else:
            self._integrity(
                head["recipe_sha256"] == self.recipe_sha256,
                1,
                "recipe",
                f"{self.path / RECIPE_FILE} hashes to {self.recipe_sha256} but the published chain "
                f"head binds recipe {head['recipe_sha256']}: the recipe was changed after publication",
            )
        return head

    # -- state
    def state_digest(self, step: int):
        """The published Merkle digest of state ``step`` (from digests.jsonl),
        or None when the run has none for that step or it does not hash to
        the published state root (a digest is a localisation aid only; the
        root decides)."""
        if self._digests is None:
            self._digests = {}
            p = self.path / DIGESTS_FILE
            try:
                lines = self._digest_lines(p) if p.exists() or p.is_symlink() else []
            except InputError as exc:
                self.warnings.append(f"{exc} (digests only localise a mismatch; ignored)")
                lines = []
            for i, line in enumerate(lines):
                try:
                    obj = untrusted.parse_json(line, f"{p}:{i + 1}")
                    d = statehash.StateDigest.from_dict(untrusted.field(obj, "digest", dict, f"{p}:{i + 1}"))
                    k = untrusted.field(obj, "step", int, f"{p}:{i + 1}")
                except InputError as exc:
                    self.warnings.append(f"{exc} (line ignored)")
                    continue
                if 0 <= k < len(self.records) and d.root == self.records[k].state_root:
                    self._digests[k] = d
        return self._digests.get(step)

    def _digest_lines(self, p) -> list[bytes]:
        """The lines of digests.jsonl, read under a limit of one line's size per record."""
        raw = untrusted.read_file(p, len(self.records) * untrusted.MAX_JSON, self._root, "digest file")
        return raw.splitlines()

    def load_checkpoint(self, k: int, memory=None):
        """The TrainState at step k, checked against the model and against
        the published state root of step k; mapped from the file, not read,
        under a mapped ``budget.Memory``."""
        from .step import state_from_tensors

        _need(k in self.checkpoints, f"no checkpoint at step {k}; checkpoints: {self.checkpoints}")
        _need(k <= self.last_step, f"no record of step {k}: the run's records end at step {self.last_step}")
        path = self._file(CKPT_DIR, checkpoint_name(k))
        mapped = memory is not None and memory.mapped
        tensors, meta = (tensorio.load_mapped if mapped else tensorio.load)(path)
        try:
            st = state_from_tensors(self.recipe.model, tensors, str(path))
        except ValueError as exc:
            raise InputError(str(exc)) from None
        _need(st.step == k, f"{path}: holds step {st.step}, expected {k}")
        _need(
            meta == checkpoint_metadata(k, self.records[k].state_root),
            f"{path}: metadata does not name step {k} and its state root",
        )
        root = st.root()
        _need(
            root == self.records[k].state_root,
            f"{path}: state root {root} differs from the published root of step {k} "
            f"({self.records[k].state_root}): the checkpoint is corrupt",
        )
        return st

    # -- data
    def stream(self) -> data.Stream:
        """[data.stream.c1] The run's stream, shards read and hash-checked once."""
        if self._stream is None:
            sh = data.read_shards(self.path / DATA_DIR, verify=self.strict, problems=True)
            for msg in sh.altered:
                self._integrity(False, None, "data", msg)
            self._shards = sh
            t = self.recipe.train
            self._stream = data.Stream(sh.samples, t.seed, data.Batching(t.micro_batches, t.micro_batch_size))
        return self._stream

    def unreadable_data(self, n: int) -> list[str]:
        """Why the batch of step n cannot be rebuilt: the missing or undecodable
        shards holding any of its samples (empty when it can)."""
        stream = self.stream()
        return self._shards.unreadable_in(stream.sample_ids(n))

    def batch(self, n: int) -> np.ndarray:
        """The (G, T+1) token samples of step n >= 1, in stream order."""
        _need(1 <= n <= self.recipe.steps, f"step {n} is not a step of this run (1..{self.recipe.steps})")
        return self.stream().batch(n)

    # -- replay
    def trainer(self, device=None, memory=None):
        """A Trainer of this recipe whose ops run on ``device`` ("cpu", the
        default, or "cuda"; ``refreplay.training.backend``), its large tensors placed
        by ``memory`` (``refreplay.training.budget``)."""
        from .step import Trainer

        return Trainer(self.recipe.model, self.recipe.train, self.stream(), self.recipe_sha256, device, memory)

    def replay_step(self, st, launcher=None, device=None, memory=None):
        """One step from state ``st`` (state k -> k+1), on one in-process rank
        unless a launcher is given, on ``device``; returns (state k+1, record
        k+1) to compare with ``records[k+1]``."""
        from .launch.inproc import InProcess

        _need(0 <= st.step < self.recipe.steps, f"state at step {st.step} has no next step in this run")
        return self.trainer(device, memory).step(st, self.records[st.step].chain_link, launcher or InProcess(1))


@dataclass(frozen=True)
class Finding:
    """An integrity problem of a published run: the step it first affects
    (None: not known from the files alone), its kind, and what differs."""

    step: int | None
    kind: str  # "data" | "chain" | "recipe"
    message: str


def _present(p: Path) -> bool:
    return p.exists() or p.is_symlink()


def open_run(path, strict: bool = True, incomplete: bool = False) -> Run:
    return Run(path, strict, incomplete)


def checkpoint_metadata(step: int, root: str) -> str:
    return canonical_json({"step": step, "state_root": root}).decode()


# ---- writing --------------------------------------------------------------------------------


class RunWriter:
    """Writes a run directory as training proceeds; ``finish`` writes the head.

    Every whole file (recipe, head, checkpoints) appears by an atomic rename
    of a synced temporary; the two record files are appended one synced line
    at a time, so after a crash each holds whole lines and at most one torn
    last line, which ``resume`` drops (``docs/run-format.md``, "After a
    crash")."""

    def __init__(self, path, recipe: Recipe):
        self.path = Path(path)
        self.recipe = recipe
        self._steps = None
        self._digests = None
        self.lock_fd = None  # the writer lock (``lock``), released by ``release``

    def release(self) -> None:
        """Close the record files and drop the writer lock (idempotent)."""
        for f in (self._steps, self._digests):
            if f is not None:
                f.close()
        self._steps = self._digests = None
        if self.lock_fd is not None:
            os.close(self.lock_fd)
            self.lock_fd = None

    @staticmethod
    def prepare(path) -> Path:
        """Create the directory; refuse one that exists and is not empty."""
        p = Path(path)
        if p.is_symlink():
            raise InputError(f"output {p} is a symbolic link; refusing to write through it")
        if p.exists() and (not p.is_dir() or any(p.iterdir())):
            hint = (
                f" (to continue a crashed run: `refreplay train --resume {p}`)"
                if _present(p / RECIPE_FILE) and not _present(p / HEAD_FILE)
                else ""
            )
            raise InputError(f"output {p} exists and is not an empty directory; refusing to overwrite{hint}")
        try:
            (p / DATA_DIR).mkdir(parents=True, exist_ok=True)
            (p / CKPT_DIR).mkdir(exist_ok=True)
        except OSError as exc:
            raise files.write_error(exc, p / DATA_DIR) from None
        return p

    @staticmethod
    def lock(path) -> int:
        """Take the run directory's writer lock (an exclusive ``flock`` on the
        directory, released when the process ends, however it ends) and return
        its descriptor; refuse when another process holds it: a ``train`` that
        is still running, or another ``--resume``."""
        import fcntl

        p = Path(path)
        try:
            fd = os.open(p, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        except OSError as exc:
            raise InputError(f"{p}: cannot open the run directory ({exc.strerror})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise InputError(
                f"{p} is being written by another process (a train or --resume still running); wait for it to end"
            ) from None
        return fd

    def write_recipe(self) -> None:
        text = json.dumps(self.recipe.to_json(), sort_keys=True, indent=2, ensure_ascii=True) + "\n"
        files.write_atomic(self.path / RECIPE_FILE, text.encode())
        self._steps = _LineFile(self.path / STEPS_FILE, truncate=True)
        self._digests = _LineFile(self.path / DIGESTS_FILE, truncate=True)

    def reopen(self, last_step: int) -> None:
        """Continue a crashed run after step ``last_step`` (-1: before step 0):
        keep the records and digests of steps 0..last_step, drop later and
        torn lines, later checkpoints and leftover temporaries."""
        self._steps = _LineFile(self.path / STEPS_FILE, keep=lambda i, line: i <= last_step)
        self._digests = _LineFile(self.path / DIGESTS_FILE, keep=lambda i, line: _digest_step(line) <= last_step)
        for d in (self.path, self.path / CKPT_DIR, self.path / DATA_DIR):
            files.remove_temporaries(d)  # of writes the crash interrupted
        for k in checkpoint_steps(self.recipe.steps, self.recipe.checkpoint_every):
            f = self.path / CKPT_DIR / checkpoint_name(k)
            if k > last_step and _present(f):
                try:
                    f.unlink()
                except OSError as exc:
                    raise files.write_error(exc, f) from None

    def record(self, rec) -> None:
        self._steps.append(json.dumps(record_to_json(rec), sort_keys=True) + "\n")
        if rec.digest is not None:
            line = {"step": rec.step, "digest": rec.digest.to_dict()}
            self._digests.append(json.dumps(line, sort_keys=True, separators=(",", ":")) + "\n")

    def checkpoint(self, st, root: str) -> None:
        tensorio.save(self.path / CKPT_DIR / checkpoint_name(st.step), st.tensors(), checkpoint_metadata(st.step, root))

    def finish(self, last) -> None:
        self._steps.close()
        self._digests.close()
        self._steps = self._digests = None
        head = {"step": last.step, "chain_link": last.chain_link, "recipe_sha256": self.recipe.sha256()}
        files.write_atomic(self.path / HEAD_FILE, (json.dumps(head, sort_keys=True, indent=2) + "\n").encode())


def _digest_step(line: bytes) -> int:
    """The step of a digests.jsonl line written by ``RunWriter`` (a huge
    number for a line that is not one, so that it is dropped)."""
    m = re.match(rb'\{"digest":.*,"step":([0-9]+)\}\n\Z', line, re.DOTALL)
    return int(m.group(1)) if m else 1 << 62


class _LineFile:
    """An append-only file of lines, each written whole and synced before
    ``append`` returns (a record is whole with its newline: docs/run-format.md).
    ``truncate``: start empty; ``keep(i, line)``: keep the existing whole lines it
    accepts, in order, up to the first it refuses (a torn last line is never kept)."""

    def __init__(self, path: Path, truncate: bool = False, keep=None):
        self.path = files.check_target(path)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0)
        try:
            if truncate:
                flags |= os.O_TRUNC
            self.fd = os.open(path, flags, 0o644)
            if keep is not None:
                with open(path, "rb") as f:
                    size = 0
                    for i, line in enumerate(f):
                        if not line.endswith(b"\n") or not keep(i, line):
                            break
                        size += len(line)
                os.ftruncate(self.fd, size)
            os.fsync(self.fd)
        except OSError as exc:
            raise files.write_error(exc, path) from None
        files.fsync_dir(path.parent)

    def append(self, text: str) -> None:
        data = text.encode()
        end = os.lseek(self.fd, 0, os.SEEK_END)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self.fd, view) :]
            os.fsync(self.fd)
        except OSError as exc:
            try:
                os.ftruncate(self.fd, end)  # the line is whole or not there
            except OSError:
                pass
            raise files.write_error(exc, self.path) from None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
