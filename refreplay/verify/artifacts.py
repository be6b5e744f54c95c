"""The published checkpoints a replay covers ([step.verified.c1]).

A replay of step n starts from the nearest *usable* checkpoint k < n (one
that reads as a well-formed state of the recipe's model and hashes to the
published root of step k), or, when none is usable, from state 0 recomputed
from the recipe.  It recomputes steps k+1..n, and every checkpoint published
for one of those steps (step n's own included, e.g. the final model) is then
compared, tensor by tensor, with the replayed state: a checkpoint that cannot
be read or that differs is a mismatch at its step, naming the tensors and
1 MiB chunks.  A checkpoint that was skipped as the start is therefore always
compared later (it lies in the recomputed range), so skipping one never hides
it.  State 0 is also recomputed from the recipe whenever a replay starts at
step 0, since the chain binds state 0 only through the recipe
([step.record.c1]).

This module decides where a replay starts and checks one checkpoint; the
step loop is ``refreplay.verify.replay``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import state as statehash
from .. import tensorio
from ..errors import InputError
from ..training.run import CKPT_DIR, checkpoint_metadata, checkpoint_name


@dataclass(frozen=True)
class Checked:
    """A published artifact found equal to the replayed state."""

    file: str  # path relative to the run directory
    step: int
    state_root: str
    role: str  # "start": the replay began from it; "recomputed": compared with the replay

    def to_json(self) -> dict:
        return {"file": self.file, "step": self.step, "state_root": self.state_root, "role": self.role}


@dataclass(frozen=True)
class Start:
    step: int
    state: object  # step.TrainState
    checked: tuple[Checked, ...]
    notes: tuple[str, ...]  # checkpoints passed over, and why
    from_seed: bool


def localise(published: statehash.StateDigest, replayed_tensors: dict) -> list[str]:
    """[state.diff.c1] The tensors and chunks in which a published state
    differs from the replayed one."""
    ours = statehash.state_hash(replayed_tensors, statehash.default_threads())
    d = statehash.diff(published, ours)
    return [
        ln.replace("only in the second state", "only in the replay").replace(
            "only in the first state", "only in the published state"
        )
        for ln in d.lines()
    ]


def _rel(k: int) -> str:
    return f"{CKPT_DIR}/{checkpoint_name(k)}"


def choose_start(run, target: int, device=None, memory=None) -> Start:
    """The nearest usable checkpoint before ``target`` (or state 0 from the
    recipe), with a note for every later checkpoint passed over; loaded, or
    mapped from its file, as ``memory`` (a ``budget.Memory``) says."""
    notes = []
    for k in sorted((c for c in run.checkpoints if c < target), reverse=True):
        try:
            st = run.load_checkpoint(k, memory)
        except InputError as exc:
            notes.append(
                f"checkpoint {_rel(k)} is not usable as a starting point ({exc}); "
                "replaying from an earlier one, and comparing it with the replayed state"
            )
            continue
        return Start(k, st, (Checked(_rel(k), k, st.root(), "start"),), tuple(notes), False)
    notes.append("no checkpoint before this step is usable: replaying from state 0, recomputed from the recipe")
    return Start(0, run.trainer(device, memory).initial_state(), (), tuple(notes), True)


def initial_state_divergence(run, start: Start, device=None, memory=None):
    """(kind, summary, details) when state 0 is not the recipe's initial state
    ([model.init.c1]); None when it is, or when the replay does not start at 0.
    The recomputed state is placed as ``memory`` says (mapped files under a
    budget: it is as large as the checkpoint)."""
    if start.step != 0:
        return None
    ours = start.state if start.from_seed else run.trainer(device, memory).initial_state()
    root = ours.root()
    if root != run.records[0].state_root:
        return (
            "state",
            "the published root of step 0 is not the root of the recipe's initial state",
            [f"published root {run.records[0].state_root}", f"recomputed root {root}"],
        )
    return None


def check_checkpoint(run, k: int, state, root: str, memory=None):
    """Compare the checkpoint published for step k with the replayed ``state``
    (whose root ``root`` equals the published root of step k).

    Returns ("checked", Checked), ("missing", note) or
    ("mismatch", (summary, details))."""
    rel = _rel(k)
    path = run.path / CKPT_DIR / checkpoint_name(k)
    if not path.exists() and not path.is_symlink():
        return "missing", f"{rel} is not published: the state of step {k} was recomputed but not compared with a file"
    try:
        load = tensorio.load_mapped if memory is not None and memory.mapped else tensorio.load
        tensors, meta = load(run._file(CKPT_DIR, checkpoint_name(k)))
    except InputError as exc:
        return "mismatch", (
            f"checkpoint {rel} published for step {k} is not a readable tensor file, so it "
            "is not the state the chain commits to",
            [str(exc)],
        )
    published = statehash.state_hash(tensors, statehash.default_threads())
    if published.root != root:
        return "mismatch", (
            f"checkpoint {rel} does not hold the state of step {k} that the replay recomputes and the chain commits to",
            [f"checkpoint root {published.root}", f"replayed root   {root}"] + localise(published, state.tensors()),
        )
    if meta != checkpoint_metadata(k, root):
        return "mismatch", (f"checkpoint {rel}: its metadata {meta!r} does not name step {k} and its state root", [])
    return "checked", Checked(rel, k, root, "recomputed")
