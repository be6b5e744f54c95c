"""Op-level traces: the SHA-256 of every operation's output in one step, so a
replay that diverges can name the first operation whose bits differ.

A trace of step n is, for each micro-batch m of the step in order, the list of
(entry, sha256) pairs of the model's forward pass in execution order (every
tensor an op keeps for its backward: norm inputs and statistics, linear
inputs, rotated q/k, v, attention weights, activations, the head input, the
logits), then the micro-batch's loss, then every parameter gradient (sorted by
name).  A publisher includes traces for any steps it likes
(``refreplay trace RUN --step N`` writes ``RUN/traces/step-NNNNNNN.json``);
when a replay diverges at a traced step, the two traces are compared and the
first differing entry is reported.  Traces are diagnostic only: nothing
normative depends on them.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from .. import untrusted
from ..errors import InputError
from ..training.arrays import on_host
from ..training.data import inputs_targets

TRACE_FORMAT = "refreplay-trace/1"
TRACE_DIR = "traces"


def _digest(value) -> str:
    h = hashlib.sha256()
    items = value if isinstance(value, tuple) else (value,)
    for a in items:
        a = np.ascontiguousarray(np.asarray(on_host(a)))  # a device-resident step's tensors too
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def micro_batch_trace(model, params: dict, tokens: np.ndarray, targets: np.ndarray) -> list[list[str]]:
    """[(entry, sha256)] of one micro-batch's forward, loss and gradients."""
    mean, logits, ctx = model.forward(params, tokens, targets)
    out = [[f"forward/{k}", _digest(v)] for k, v in ctx.saved.items()]
    out.append(["forward/logits", _digest(logits)])
    out.append(["loss", _digest(np.float32(mean))])
    grads = model.backward(params, ctx)
    out += [[f"grad/{k}", _digest(grads[k])] for k in sorted(grads)]
    return out


def step_trace(trainer, state) -> dict:
    """The trace of step ``state.step + 1`` computed from ``state``."""
    n = state.step + 1
    cfg = trainer.cfg
    batch = trainer.stream.batch(n)
    B = cfg.micro_batch_size
    mbs = []
    params = trainer.model.working_params(state.params)  # [bf16.tensors.c1]
    for m in range(cfg.micro_batches):
        x, y = inputs_targets(batch[m * B : (m + 1) * B])
        mbs.append(micro_batch_trace(trainer.model, params, x, y))
    return {"format": TRACE_FORMAT, "step": n, "micro_batches": mbs}


def trace_path(run, step: int) -> Path:
    return run.path / TRACE_DIR / f"step-{step:07d}.json"


def load_trace(run, step: int) -> dict | None:
    """The publisher's trace of ``step``, or None when it published none;
    InputError when the file is not a well-formed trace of that step (a
    replay reports that as a warning: traces never decide a verdict)."""
    p = trace_path(run, step)
    if not p.exists() and not p.is_symlink():
        return None
    t = untrusted.load_json(p, run.path, "trace")
    ok = (
        isinstance(t, dict)
        and set(t) == {"format", "step", "micro_batches"}
        and t["format"] == TRACE_FORMAT
        and type(t["step"]) is int
        and t["step"] == step
        and isinstance(t["micro_batches"], list)
        and all(
            isinstance(mb, list)
            and all(isinstance(e, list) and len(e) == 2 and all(isinstance(x, str) for x in e) for e in mb)
            for mb in t["micro_batches"]
        )
    )
    if not ok:
        raise InputError(f"{p}: not a {TRACE_FORMAT} trace of step {step}")
    return t


def first_difference(published: dict, ours: dict) -> str | None:
    """The first entry, in execution order, whose digest differs (None: the
    traces agree entry for entry)."""
    if len(published["micro_batches"]) != len(ours["micro_batches"]):
        return (
            f"the published trace has {len(published['micro_batches'])} micro-batches, "
            f"the replay {len(ours['micro_batches'])}"
        )
    for m, (pub, mine) in enumerate(zip(published["micro_batches"], ours["micro_batches"])):
        for i, ((name_p, dig_p), (name_o, dig_o)) in enumerate(zip(pub, mine)):
            if name_p != name_o:
                return f"micro-batch {m}, entry {i}: the published trace has {name_p!r} where the replay has {name_o!r}"
            if dig_p != dig_o:
                return f"micro-batch {m}: first diverging operation output {name_o!r} (entry {i})"
        if len(pub) != len(mine):
            return f"micro-batch {m}: the published trace has {len(pub)} entries, the replay {len(mine)}"
    return None
