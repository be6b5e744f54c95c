"""Replay published steps on one device and say whether they are exactly what
was published; when not, localise the first divergence.

``replay(run, n)`` starts from the nearest checkpoint before step n (its state
root checked against the published record), runs every step up to n on one
in-process rank, and compares each step's data hash, state root, chain link and
loss bits with the published record.  The first difference stops the replay
and is localised:

* a checkpoint whose root differs from its record: the state is rebuilt from
  the previous checkpoint (or from the seed, for step 0) and the Merkle trees
  are compared, naming the tensors and 1 MiB chunks that were altered;
* a step whose data hash differs: the batch the recipe and shards give is not
  the batch that was trained on;
* a step whose state root differs: the replayed state is compared with the
  published state digest of that step (or the step's checkpoint), naming the
  tensors and chunks, and the step is re-run with an op-level trace when the
  publisher included one.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from . import state as statehash
from . import tensorio
from .errors import InputError


@dataclass
class Divergence:
    step: int
    kind: str  # "checkpoint" | "data" | "state" | "chain" | "loss"
    summary: str
    details: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        return [f"first divergence at step {self.step} ({self.kind}): {self.summary}"] + \
            [f"  {d}" for d in self.details]


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

    @property
    def verified(self) -> bool:
        return self.divergence is None and bool(self.checked) and self.checked[-1].step == self.target


def _raw_checkpoint_digest(run, k: int):
    """Digest of the tensors stored in checkpoint k, trusting nothing but the
    file format."""
    tensors, _ = tensorio.load(run._file("checkpoints", f"step-{k:07d}.safetensors"))
    return statehash.state_hash(tensors, statehash.default_threads())


def published_digest(run, step: int):
    """The publisher's Merkle digest of state ``step``: from the per-step
    digest file when the run has one, else from the step's checkpoint."""
    get = getattr(run, "state_digest", None)
    if get is not None:
        d = get(step)
        if d is not None:
            return d
    if step in run.checkpoints:
        return _raw_checkpoint_digest(run, step)
    return None


def _localise(published, replayed_tensors) -> list[str]:
    ours = statehash.state_hash(replayed_tensors, statehash.default_threads())
    d = statehash.diff(published, ours)
    return [ln.replace("only in the second state", "only in the replay")
            .replace("only in the first state", "only in the published state") for ln in d.lines()]


def _start_state(run, k: int, device=None, memory=None):
    """State k from its checkpoint; a checkpoint whose root is not the
    published one is a divergence at step k, localised by rebuilding step k."""
    rec = run.records[k]
    try:
        return run.load_checkpoint(k, memory), None
    except InputError as exc:
        if "state root" not in str(exc):
            raise
    # the checkpoint's content differs from what step k published: rebuild it
    published = _raw_checkpoint_digest(run, k)
    earlier = [c for c in run.checkpoints if c < k]
    if k == 0:
        rebuilt = run.trainer(device).initial_state()
    else:
        res_state = None
        start = earlier[-1]
        st, div = _start_state(run, start, device)
        if div is not None:
            return None, div
        res_state = st
        for s in range(start + 1, k + 1):
            res_state, _ = run.replay_step(res_state, device=device)
        rebuilt = res_state
    if rebuilt.root() != rec.state_root:
        return None, Divergence(k, "checkpoint", "the checkpoint differs from its published root, and "
                                "rebuilding step k does not give the published root either",
                                [f"published root {rec.state_root}", f"rebuilt root   {rebuilt.root()}"])
    details = _localise(published, rebuilt.tensors())
    return None, Divergence(k, "checkpoint", f"checkpoint step-{k:07d}.safetensors was altered after "
                            "publication (its content does not hash to the published state root)",
                            [f"published root {rec.state_root}"] + details)


def _trace_details(run, step: int, state_before, device=None) -> list[str]:
    """Compare the op-level trace of the diverging step with the publisher's."""
    from .trace import first_difference, load_trace, step_trace

    published = load_trace(run, step)
    if published is None:
        return [f"(no op-level trace published for step {step}; the publisher can add one with "
                f"`refreplay trace RUN --step {step}`)"]
    diff = first_difference(published, step_trace(run.trainer(device), state_before))
    if diff is None:
        return ["op-level trace: every forward output, the loss and every gradient of every micro-batch "
                "match the published trace; the divergence lies after the gradients (TreeFold, clipping, "
                "AdamW, re-pinning) or in the published record itself"]
    return [f"op-level trace: {diff}"]


def replay(run, target: int, progress=None, device=None, memory=None) -> ReplayResult:
    """Replay steps up to ``target`` from the nearest earlier checkpoint, with
    the ops on ``device`` ("cpu", the default, or "cuda": the same bits).

    ``run`` is best opened with ``open_run(path, strict=False)``: integrity
    problems of its files (``run.findings``) then become divergences here,
    at the step they affect, instead of refusals to open.  ``memory`` (a
    ``budget.Memory``) places the large tensors; it changes no bit."""
    steps = run.recipe.steps
    if not 1 <= target <= steps:
        raise InputError(f"step {target} is not a step of this run (1..{steps})")
    k = max(c for c in run.checkpoints if c < target)
    dated = sorted((f for f in run.findings if f.step is not None), key=lambda f: f.step)
    if dated:  # the published records themselves are inconsistent
        f = dated[0]
        return ReplayResult(target, k, [], Divergence(
            f.step, f.kind, f.message, [g.message for g in dated[1:]]))
    res = _replay_from(run, k, target, progress, device, memory)
    undated = [f.message for f in run.findings if f.step is None]
    if undated and res.divergence is None:
        res.divergence = Divergence(target, "data", "the run's data files are not the published ones, "
                                    "although the replayed steps do not read the altered samples", undated)
    elif undated:
        res.divergence.details += undated
    return res


def _replay_from(run, k: int, target: int, progress, device=None, memory=None) -> ReplayResult:
    st, div = _start_state(run, k, device, memory)
    if div is not None:
        return ReplayResult(target, k, [], div)
    checked: list[StepCheck] = []
    for s in range(k + 1, target + 1):
        t0 = time.perf_counter()
        before = st
        st, rec = run.replay_step(st, device=device, memory=memory)
        pub = run.records[s]
        dt = time.perf_counter() - t0
        if progress:
            progress(s - k, target - k, s)
        if rec.data_hash != pub.data_hash:
            return ReplayResult(target, k, checked, Divergence(
                s, "data", "the batch rebuilt from the recipe and the shards is not the one published "
                "for this step", [f"published data hash {pub.data_hash}", f"replayed data hash  {rec.data_hash}"]))
        if rec.state_root != pub.state_root:
            dig = published_digest(run, s)
            details = [f"published root {pub.state_root}", f"replayed root  {rec.state_root}"]
            if dig is not None:
                details += _localise(dig, st.tensors())
            else:
                details.append("(no published digest that hashes to this step's published root, and no "
                               "checkpoint: tensors cannot be named)")
            if pub.loss is not None and rec.loss is not None and \
                    rec.loss_hex() != pub.loss_hex():
                details.append(f"loss differs too: published {pub.loss_hex()}, replayed {rec.loss_hex()} "
                               "(the forward pass already differs)")
            details += _trace_details(run, s, before, device)
            return ReplayResult(target, k, checked, Divergence(
                s, "state", "the state after this step differs from the published state", details))
        if rec.loss_hex() != pub.loss_hex():
            return ReplayResult(target, k, checked, Divergence(
                s, "loss", "the published loss is not the loss of this step",
                [f"published {pub.loss_hex()}, replayed {rec.loss_hex()}"]))
        if rec.chain_link != pub.chain_link:
            return ReplayResult(target, k, checked, Divergence(
                s, "chain", "the chain link differs although state and data match",
                [f"published {pub.chain_link}", f"replayed  {rec.chain_link}"]))
        checked.append(StepCheck(s, rec.state_root, rec.chain_link, dt))
    return ReplayResult(target, k, checked, None)
