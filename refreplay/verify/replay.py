"""Replay published steps on one device and say whether they are exactly what
was published; when not, localise the first divergence.

``replay(run, n)`` starts from the nearest usable checkpoint before step n
(``refreplay.verify.artifacts``), runs every step up to n on one in-process rank,
and compares each step's data hash, state root, loss bits and chain link with
the published record, and every checkpoint published for a recomputed step
(step n's own included) with the replayed state ([step.verified.c1]).  The
first difference stops the replay and is localised:

* a checkpoint that differs from the replayed state, or cannot be read:
  the tensors and 1 MiB chunks that differ, or why it cannot be read;
* a step whose data hash differs: the batch the recipe and shards give is not
  the batch that was trained on (a step whose samples lie in a missing or
  undecodable shard cannot be rebuilt at all: that is an ``InputError``,
  while steps that draw no such sample replay as usual);
* a step whose state root differs: the replayed state is compared with the
  published state digest of that step (or the step's checkpoint), naming the
  tensors and chunks, and the step is re-run with an op-level trace when the
  publisher included one.

Digests and traces only localise: a fault in one of them is a warning
beside the verdict, never the verdict ([step.verified.c1]).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .. import tensorio
from .. import state as statehash
from ..errors import InputError
from ..training.run import CKPT_DIR, checkpoint_name
from . import artifacts


@dataclass
class Divergence:
    step: int
    kind: str  # "checkpoint" | "data" | "state" | "chain" | "loss"
    summary: str
    details: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        return [f"first divergence at step {self.step} ({self.kind}): {self.summary}"] + [
            f"  {d}" for d in self.details
        ]


@dataclass
class StepCheck:
    step: int
    state_root: str
    chain_link: str
    seconds: float


@dataclass
class ReplayResult:
    target: int
    start: int
    checked: list[StepCheck]
    divergence: Divergence | None
    artifacts: list = field(default_factory=list)  # artifacts.Checked, in step order
    warnings: list[str] = field(default_factory=list)  # beside the verdict, never deciding it

    @property
    def verified(self) -> bool:
        return self.divergence is None and bool(self.checked) and self.checked[-1].step == self.target


def published_digest(run, step: int, warnings: list[str]):
    """The publisher's Merkle digest of state ``step``: from the per-step
    digest file when the run has one, else from the step's checkpoint; None
    when neither is usable (the reason goes to ``warnings``)."""
    d = run.state_digest(step)
    if d is not None or step not in run.checkpoints:
        return d
    try:
        tensors, _ = tensorio.load(run._file(CKPT_DIR, checkpoint_name(step)))
    except InputError as exc:
        warnings.append(f"cannot name tensors from the checkpoint of step {step}: {exc}")
        return None
    return statehash.state_hash(tensors, statehash.default_threads())


def _trace_details(run, step: int, state_before, warnings: list[str], device=None) -> list[str]:
    """Compare the op-level trace of the diverging step with the publisher's."""
    from .trace import first_difference, load_trace, step_trace

    try:
        published = load_trace(run, step)
    except InputError as exc:
        warnings.append(f"op-level trace not used: {exc}")
        return []
    if published is None:
        return [
            f"(no op-level trace published for step {step}; the publisher can add one with "
            f"`refreplay trace RUN --step {step}`)"
        ]
    diff = first_difference(published, step_trace(run.trainer(device), state_before))
    if diff is None:
        return [
            "op-level trace: every forward output, the loss and every gradient of every micro-batch "
            "match the published trace; the divergence lies after the gradients (TreeFold, clipping, "
            "AdamW, re-pinning) or in the published record itself"
        ]
    return [f"op-level trace: {diff}"]


def replay(run, target: int, progress=None, device=None, memory=None) -> ReplayResult:
    """Replay steps up to ``target`` from the nearest usable earlier
    checkpoint, with the ops on ``device`` ("cpu", the default, or "cuda":
    the same bits).

    ``run`` is best opened with ``open_run(path, strict=False)``: integrity
    problems of its files (``run.findings``) then become divergences here,
    at the step they affect, instead of refusals to open.  ``memory`` (a
    ``budget.Memory``) places the large tensors; it changes no bit."""
    steps = run.recipe.steps
    if not 1 <= target <= steps:
        raise InputError(f"step {target} is not a step of this run (1..{steps})")
    if target > run.last_step:  # an incomplete run (open_run(..., incomplete=True)): never certified
        raise InputError(f"step {target} has no record: the run is incomplete (records end at step {run.last_step})")
    dated = sorted((f for f in run.findings if f.step is not None), key=lambda f: f.step)
    if dated:  # the published records themselves are inconsistent
        f = dated[0]
        return ReplayResult(
            target,
            max(c for c in run.checkpoints if c < target),
            [],
            Divergence(f.step, f.kind, f.message, [g.message for g in dated[1:]]),
            warnings=list(run.warnings),
        )
    res = _replay_from(run, target, progress, device, memory)
    undated = [f.message for f in run.findings if f.step is None]
    if res.divergence is None:
        # every step replayed drew samples that hash to its published data hash
        res.warnings += [
            f"{m} (the steps replayed here do not draw the altered samples: their data hashes match)" for m in undated
        ]
    else:
        res.divergence.details += undated
    res.warnings += [w for w in run.warnings if w not in res.warnings]
    return res


def _replay_from(run, target: int, progress, device=None, memory=None) -> ReplayResult:
    start = artifacts.choose_start(run, target, device, memory)
    res = ReplayResult(target, start.step, [], None, list(start.checked), list(start.notes))
    bad0 = artifacts.initial_state_divergence(run, start, device, memory)
    if bad0 is not None:
        res.divergence = Divergence(0, *bad0)
        return res
    st = start.state
    if start.from_seed and 0 in run.checkpoints:
        if _compare_checkpoint(run, res, 0, st, run.records[0].state_root, memory):
            return res
    k = start.step
    for s in range(k + 1, target + 1):
        t0 = time.perf_counter()
        before = st
        unreadable = run.unreadable_data(s)
        if unreadable:  # nothing to compare: the input itself is unusable
            raise InputError(
                f"step {s} draws samples from a shard that cannot be read, so it cannot be "
                "replayed: " + "; ".join(unreadable)
            )
        st, rec = run.replay_step(st, device=device, memory=memory)
        pub = run.records[s]
        dt = time.perf_counter() - t0
        if progress:
            progress(s - k, target - k, s)
        div = _record_divergence(run, s, rec, pub, st, before, res.warnings, device)
        if div is not None:
            res.divergence = div
            return res
        if s in run.checkpoints and _compare_checkpoint(run, res, s, st, rec.state_root, memory):
            return res
        res.checked.append(StepCheck(s, rec.state_root, rec.chain_link, dt))
    return res


def _compare_checkpoint(run, res: ReplayResult, s: int, st, root: str, memory=None) -> bool:
    """Check the checkpoint of recomputed step s; True when it is a mismatch
    (``res.divergence`` set)."""
    outcome, value = artifacts.check_checkpoint(run, s, st, root, memory)
    if outcome == "checked":
        res.artifacts.append(value)
    elif outcome == "missing":
        res.warnings.append(value)
    else:
        res.divergence = Divergence(s, "checkpoint", *value)
    return outcome == "mismatch"


def _record_divergence(run, s, rec, pub, st, before, warnings, device) -> Divergence | None:
    """How the replayed record of step s differs from the published one."""
    if rec.data_hash != pub.data_hash:
        return Divergence(
            s,
            "data",
            "the batch rebuilt from the recipe and the shards is not the one published for this step",
            [f"published data hash {pub.data_hash}", f"replayed data hash  {rec.data_hash}"],
        )
    if rec.state_root != pub.state_root:
        dig = published_digest(run, s, warnings)
        details = [f"published root {pub.state_root}", f"replayed root  {rec.state_root}"]
        if dig is not None:
            details += artifacts.localise(dig, st.tensors())
        else:
            details.append(
                "(no published digest that hashes to this step's published root, and no "
                "checkpoint: tensors cannot be named)"
            )
        if pub.loss is not None and rec.loss is not None and rec.loss_hex() != pub.loss_hex():
            details.append(
                f"loss differs too: published {pub.loss_hex()}, replayed {rec.loss_hex()} "
                "(the forward pass already differs)"
            )
        details += _trace_details(run, s, before, warnings, device)
        return Divergence(s, "state", "the state after this step differs from the published state", details)
    if rec.loss_hex() != pub.loss_hex():
        return Divergence(
            s,
            "loss",
            "the published loss is not the loss of this step",
            [f"published {pub.loss_hex()}, replayed {rec.loss_hex()}"],
        )
    if rec.chain_link != pub.chain_link:
        return Divergence(
            s,
            "chain",
            "the chain link differs although state and data match",
            [f"published {pub.chain_link}", f"replayed  {rec.chain_link}"],
        )
    return None
