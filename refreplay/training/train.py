"""Train a recipe and publish the run directory.

    corpus or token files -> samples -> shards + manifest -> recipe -> state 0 -> steps 1..N

The root rank (rank 0) builds the data and writes every file; with the mpi
launcher the other ranks receive the samples from it and compute their share
of each step.  Every rank keeps the full training state (the folded gradient
reaches all of them), and after each step all ranks must agree on the state
root.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sys
import time
from dataclasses import dataclass

from ..errors import InputError
from . import data, tokens
from .presets import ModelConfig, TrainConfig
from .run import RunWriter, checkpoint_steps, new_recipe
from .step import Trainer


@dataclass
class Summary:
    steps: int
    head: str
    recipe_sha256: str
    losses: list
    seconds: float


def _progress(stream, n, total, loss, tokens_per_s, eta_s, final=False):
    line = f"step {n:>{len(str(total))}}/{total}  loss {float(loss):.4f}  {tokens_per_s:,.0f} tok/s  ETA {eta_s:.0f} s"
    if stream.isatty():
        stream.write("\r" + line + ("\n" if final else ""))
    else:
        stream.write(line + "\n")
    stream.flush()


def train(
    model: ModelConfig,
    train_cfg: TrainConfig,
    *,
    steps: int,
    checkpoint_every: int,
    out,
    launcher,
    launcher_name: str = "inproc",
    preset: str | None = None,
    corpus_files=None,
    byte_cap: int = data.DEFAULT_BYTE_CAP,
    progress=sys.stderr,
    device=None,
    token_files=None,
    vocab=None,
    memory=None,
) -> Summary:
    """Train ``steps`` steps and write the run to ``out`` (root rank), with the
    ops on ``device`` ("cpu", the default, or "cuda"; not part of the recipe,
    since it changes no bit).

    The data is the byte corpus, or with ``token_files`` pre-tokenized files
    ([data.tokenfile.c1], ``vocab`` as ``--vocab``); either way the model's
    vocabulary is the data's, padded ([data.vocab.c1]).  ``memory``: a
    ``budget.Memory`` that keeps large tensors in files (changes no bit)."""
    model = model.validate()
    train_cfg = train_cfg.validate()
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= 1 << 24:
        raise InputError(f"--steps must be an integer in [1, 2^24], got {steps!r}")
    if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int) or checkpoint_every < 1:
        raise InputError(f"--checkpoint-every must be a positive integer, got {checkpoint_every!r}")
    if launcher.size > train_cfg.micro_batches:
        raise InputError(
            f"--ranks {launcher.size} exceeds the {train_cfg.micro_batches} micro-batches "
            "of a step: every rank needs at least one"
        )

    writer = None
    lock = None
    if launcher.is_root:
        try:
            path = RunWriter.prepare(out)
            lock = RunWriter.lock(path)  # held while training: a --resume meanwhile is refused
            if token_files:
                toks, v, source = tokens.load_tokens(token_files, vocab)
                samples = tokens.make_samples(toks, model.seq_len)
            else:
                corpus, source = data.build_corpus(corpus_files, byte_cap)
                samples, v = data.make_samples(corpus, model.seq_len), data.VOCAB
            manifest = data.write_shards(samples, path / "data", source, v)
            payload = ("ok", samples, hashlib.sha256(data.manifest_bytes(manifest)).hexdigest(), v)
        except InputError as exc:
            if lock is not None:
                os.close(lock)
            payload = ("error", str(exc), None, None)
        payload = launcher.share(payload)
    else:
        payload = launcher.share(None)
    if payload[0] == "error":
        raise InputError(payload[1])
    _, samples, manifest_sha, v = payload
    model = dataclasses.replace(model, vocab=tokens.padded_vocab(v)).validate()

    recipe = new_recipe(
        model,
        train_cfg,
        manifest_sha,
        int(samples.shape[0]),
        preset=preset,
        ranks=launcher.size,
        launcher=launcher_name,
        steps=steps,
        checkpoint_every=checkpoint_every,
    )
    stream = data.Stream(samples, train_cfg.seed, data.Batching(train_cfg.micro_batches, train_cfg.micro_batch_size))
    trainer = Trainer(model, train_cfg, stream, recipe.sha256(), device, memory)
    saves = set(checkpoint_steps(steps, checkpoint_every))
    if launcher.is_root:
        writer = RunWriter(path, recipe)
        writer.lock_fd = lock
        writer.write_recipe()

    st = trainer.initial_state()
    rec = trainer.initial_record(st)
    launcher.same_on_all(rec.state_root, "the state root of step 0")
    try:
        if writer:
            writer.record(rec)
            writer.checkpoint(st, rec.state_root)
        return _steps(trainer, st, rec, steps, saves, writer, launcher, progress, model, train_cfg, recipe)
    finally:
        if writer:
            writer.release()


def _steps(trainer, st, rec, steps, saves, writer, launcher, progress, model, train_cfg, recipe) -> Summary:
    """Steps st.step+1..steps: each record appended, the scheduled
    checkpoints saved, then the head."""
    step_tokens = train_cfg.micro_batches * train_cfg.micro_batch_size * model.seq_len
    first = st.step
    losses, t0 = [], time.perf_counter()
    for n in range(first + 1, steps + 1):
        t = time.perf_counter()
        st, rec = trainer.step(st, rec.chain_link, launcher)
        launcher.same_on_all(rec.state_root, f"the state root of step {n}")
        losses.append(rec.loss)
        if writer:
            writer.record(rec)
            if n in saves:
                writer.checkpoint(st, rec.state_root)
            if progress is not None:
                now = time.perf_counter()
                _progress(
                    progress,
                    n,
                    steps,
                    rec.loss,
                    step_tokens / max(now - t, 1e-9),
                    (now - t0) / (n - first) * (steps - n),
                    final=n == steps,
                )
    if writer:
        writer.finish(rec)
    return Summary(steps, rec.chain_link, recipe.sha256(), losses, time.perf_counter() - t0)


def open_for_resume(out):
    """The crashed run in ``out``, opened with every check of a published run
    but allowed to be incomplete; refused when it is complete or has no
    recipe (killed before it was written: nothing to resume)."""
    from pathlib import Path

    from .run import HEAD_FILE, RECIPE_FILE, open_run

    path = Path(out)
    if not path.is_dir() or path.is_symlink():
        raise InputError(f"--resume {path}: not a run directory")
    if (path / HEAD_FILE).exists() or (path / HEAD_FILE).is_symlink():
        raise InputError(f"--resume {path}: the run is complete (it has {HEAD_FILE}); nothing to resume")
    if not ((path / RECIPE_FILE).exists() or (path / RECIPE_FILE).is_symlink()):
        raise InputError(
            f"--resume {path}: no {RECIPE_FILE}: training stopped before the recipe was written, "
            "so there is nothing to resume; remove the directory and train again"
        )
    return open_run(path, strict=True, incomplete=True)


def resume(out, *, progress=sys.stderr, device=None, memory=None) -> tuple[Summary, int]:
    """Continue the crashed run in ``out`` from its last complete checkpoint
    (or from state 0, recomputed from the recipe, when none is usable) and
    finish it: the files end up byte for byte those an uninterrupted run
    writes (``docs/run-format.md``, "After a crash").  Returns (summary, the
    step resumed from).

    The run is reopened with every integrity check (``open_run`` strict):
    what was written must be this recipe's own output.  The steps run on the
    recipe's rank count in this process: bits do not depend on the ranks or
    the launcher ([fold.ranks.c1]), and recipe.json, which names them, is
    kept as written."""
    run = open_for_resume(out)
    writer = RunWriter(run.path, run.recipe)
    writer.lock_fd = RunWriter.lock(run.path)  # a train still running, or another --resume, holds it
    try:
        return _resume_with(run, writer, progress, device, memory)
    finally:
        writer.release()


def _resume_with(run, writer, progress, device, memory):
    from .launch.inproc import InProcess
    from .run import CKPT_DIR, checkpoint_name

    path, recipe = run.path, run.recipe
    trainer = run.trainer(device, memory)
    start = None
    for k in sorted((c for c in run.checkpoints if c <= run.last_step), reverse=True):
        try:
            start = run.load_checkpoint(k, memory)  # root checked against record k
            break
        except InputError:
            continue  # torn or missing: an earlier one (every write is atomic, so this is rare)
    launcher = InProcess(recipe.ranks)
    saves = set(checkpoint_steps(recipe.steps, recipe.checkpoint_every))
    if start is not None:
        writer.reopen(start.step)
        rec = run.records[start.step]
        st = start
    else:
        st = trainer.initial_state()
        rec = trainer.initial_record(st)
        if run.records and run.records[0].state_root != rec.state_root:
            raise InputError(
                f"--resume {path}: the record of step 0 does not hold the recipe's initial state "
                f"(published {run.records[0].state_root}, recomputed {rec.state_root}); "
                "this is not the output of this recipe"
            )
        writer.reopen(-1)
        writer.record(rec)
        if not (path / CKPT_DIR / checkpoint_name(0)).exists():
            writer.checkpoint(st, rec.state_root)
    summary = _steps(
        trainer, st, rec, recipe.steps, saves, writer, launcher, progress, recipe.model, recipe.train, recipe
    )
    return summary, st.step
