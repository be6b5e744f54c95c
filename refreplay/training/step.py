"""One training step, from state n-1 to state n (``spec/23-step.txt``).

The data flows one way ([step.order.c1]):
    micro-batches -> forward/backward -> TreeFold -> scale -> clip -> AdamW
    -> re-pin quantizer step sizes -> state hash -> chain link.

* [step.state.c1]  what the training state holds, under which names;
* [step.loss.c1]   the per-micro-batch loss and the step's reported loss;
* [step.order.c1]  the order of the operations of a step;
* [step.hparams.c1] the hyper-parameters and where each enters;
* [step.record.c1] the per-step hash record.

The TreeFold itself is delegated to a *launcher* (``refreplay.training.launch``):
an object with ``fold(leaf, M)`` that evaluates ``leaf(m)`` for the
micro-batches its ranks own and returns the folded sum of [fold.ranks.c1].
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from .. import doctor, environ
from .. import state as statehash
from ..ops import optim
from . import backend as backends
from . import budget
from .arrays import on_host
from .data import Stream, inputs_targets
from .model import Model, init_params, linear_names, param_shapes, quant_steps
from .presets import ModelConfig, TrainConfig
from .tokens import token_bytes
from .workspace import Spares

LOSS = "loss"  # the leaf entry that carries a micro-batch's mean loss ([step.loss.c1])
SCHEDULE = "cosine"  # [step.hparams.c1]


def pace_threads(work: int | None = None) -> None:
    """Set the calling thread's Numba thread count by the default policy
    (``refreplay.environ.kernel_threads``: the cores other processes leave
    free, or the user's fixed count; one thread when the step's largest
    activation, ``work`` values, is below ``environ.SMALL_WORK``), before
    each micro-batch and the optimizer.  Speed only: bits never depend on
    the count."""
    import numba

    cap = numba.config.NUMBA_NUM_THREADS
    n = 1 if work is not None and work < environ.SMALL_WORK else environ.kernel_threads(cap, cap)
    if n != numba.get_num_threads():
        numba.set_num_threads(n)


@dataclass
class TrainState:
    """[step.state.c1] Parameters, AdamW moments, re-pinned quantizer step
    sizes, the number of steps taken and the data position.  The tensors are
    host arrays, or device arrays after a step on a device-resident backend
    (``refreplay.training.backend``); ``tensors()`` and ``copy()`` give host arrays."""

    step: int
    params: dict
    m: dict
    v: dict
    qsteps: dict
    data_position: tuple[int, int]

    def tensors(self) -> dict:
        """[step.state.c1] The flat dict that is hashed and checkpointed (host
        arrays: a device-resident state crosses to the host here)."""
        out = {}
        for name in sorted(self.params):
            out[f"param/{name}"] = on_host(self.params[name])
            out[f"adam.m/{name}"] = on_host(self.m[name])
            out[f"adam.v/{name}"] = on_host(self.v[name])
        for name in sorted(self.qsteps):
            out[f"quant.step/{name}"] = on_host(self.qsteps[name])
        out["train.step"] = np.array([self.step], dtype=np.int64)
        out["data.position"] = np.array(self.data_position, dtype=np.int64)
        return {k: out[k] for k in sorted(out)}

    def digest(self) -> statehash.StateDigest:
        """[state.root.c1] The Merkle digest of ``tensors()``: the root and the
        hash of every tensor and chunk (what localises a difference)."""
        return statehash.state_hash(self.tensors(), statehash.default_threads())

    def root(self) -> str:
        """[state.root.c1] The state root (hex) of ``tensors()``."""
        return self.digest().root

    def copy(self, keep=None) -> "TrainState":
        """A deep copy on the host; ``keep`` (``budget.Memory.keep``) decides
        where each copied tensor lives."""
        keep = keep or np.copy
        cp = lambda d: {k: keep(on_host(d[k])) for k in sorted(d)}  # noqa: E731
        return TrainState(self.step, cp(self.params), cp(self.m), cp(self.v), cp(self.qsteps), self.data_position)


def state_names(cfg: ModelConfig) -> dict[str, tuple[str, tuple]]:
    """[step.state.c1] Every tensor name of a state -> (dtype name, shape)."""
    out = {}
    for name, shape in param_shapes(cfg).items():
        for prefix in ("param/", "adam.m/", "adam.v/"):
            out[prefix + name] = ("F32", shape)
    if cfg.linear == "int8":
        shapes = param_shapes(cfg)
        for name in linear_names(cfg):
            out["quant.step/" + name] = ("F32", (shapes[name][0],))
    out["train.step"] = ("I64", (1,))
    out["data.position"] = ("I64", (2,))
    return {k: out[k] for k in sorted(out)}


def state_from_tensors(cfg: ModelConfig, tensors: dict, where: str = "state") -> TrainState:
    """Rebuild a TrainState from its flat dict, checking every name, dtype and
    shape against the configuration (ValueError naming the first problem)."""
    want = state_names(cfg)
    missing = sorted(set(want) - set(tensors))
    extra = sorted(set(tensors) - set(want))
    if missing or extra:
        raise ValueError(f"{where}: tensors do not match the model: missing {missing[:5]}, unexpected {extra[:5]}")
    for name, (dt, shape) in want.items():
        a = tensors[name]
        if statehash.dtype_name(a.dtype) != dt or a.shape != shape:
            raise ValueError(f"{where}: tensor {name!r} is {a.dtype} {a.shape}, expected {dt} {shape}")
    pick = lambda prefix: {
        k[len(prefix) :]: np.ascontiguousarray(tensors[k])  # noqa: E731
        for k in want
        if k.startswith(prefix)
    }
    step = int(tensors["train.step"][0])
    pos = tuple(int(x) for x in tensors["data.position"])
    return TrainState(step, pick("param/"), pick("adam.m/"), pick("adam.v/"), pick("quant.step/"), pos)


@dataclass(frozen=True)
class StepRecord:
    """[step.record.c1] What the run publishes for step n.  ``digest`` (the
    state's full Merkle digest, when at hand) is published beside the record
    to localise a mismatch; it takes no part in comparisons."""

    step: int
    state_root: str
    data_hash: str
    chain_link: str
    loss: np.float32 | None  # None for step 0
    digest: statehash.StateDigest | None = field(default=None, compare=False, repr=False)

    def loss_hex(self) -> str | None:
        if self.loss is None:
            return None
        return f"0x{int(np.array([self.loss], np.float32).view(np.uint32)[0]):08X}"


def no_decay_names(params: dict) -> frozenset:
    """[step.hparams.c1] Tensors with one axis (norm weights, biases) take no
    weight decay."""
    return frozenset(k for k, a in params.items() if a.ndim == 1)


class Trainer:
    """Runs steps of one recipe: model, hyper-parameters, data stream and the
    recipe hash that every chain link binds."""

    def __init__(
        self, model_cfg: ModelConfig, train_cfg: TrainConfig, stream: Stream, recipe_hash: str, device=None, memory=None
    ):
        self.ops = backends.get(device)  # "cpu" (the reference, default) or "cuda": same bits
        self.memory = memory or budget.Memory()  # where large tensors live: never changes a bit
        self.model = Model(model_cfg, self.ops)
        # Reused buffers (speed only, the same bits): the model's workspace, and the TreeFold's
        # nodes written into their dead left operand.  Host ops, RAM budget only.
        self.reuse = self.ops.name == "cpu" and not self.memory.mapped
        if not self.reuse:  # under a memory budget no buffer outlives its pass
            self.model.workspace = None
        self.cfg = train_cfg.validate()
        # the embedding's dead gradients, for later micro-batches to write into: as many as
        # the fold holds at once (floor(log2 M) + 1), so that after the first step none is new
        self.spares = Spares(("wte",), self.cfg.micro_batches.bit_length()) if self.reuse else None
        self.model.spares = self.spares
        self.stream = stream
        self.recipe_hash = recipe_hash
        self.adam = optim.AdamW(train_cfg.beta1, train_cfg.beta2, train_cfg.eps, train_cfg.weight_decay)

    def _merge(self, left, right):
        """[fold.tree.c1] The launcher's merge; under a mapped budget name by
        name, each sum moved to a file as soon as it exists."""
        if self.reuse:  # the trainer's leaves are new gradient sets, each consumed by one node
            out = self.ops.treefold.merge_into(left, right)
            self.spares.give(right)  # consumed: no one reads it again
            return out
        merge = self.ops.treefold.merge
        if not self.memory.mapped or sorted(left) != sorted(right):
            return merge(left, right)
        return {k: self.memory.keep(merge(left[k], right[k])) for k in sorted(left)}

    def _scale(self, folded, m):
        """[fold.scale.c1] As ``_merge``: by name when mapped."""
        scale = self.ops.treefold.scale
        if not self.memory.mapped:
            return scale(folded, m)
        return {k: self.memory.keep(scale(folded[k], m)) for k in sorted(folded)}

    def fresh_buffers(self) -> None:
        """Turn the buffer reuse off: every temporary and every tree node a
        new array, as before issue #32 (benchmarks, tests)."""
        self.reuse = False
        self.model.workspace = None
        self.spares = self.model.spares = None

    def data_position(self, step: int) -> tuple[int, int]:
        """[step.state.c1] (epoch, index) of the batch that step ``step + 1`` reads."""
        return self.stream.position(step + 1)

    def initial_state(self) -> TrainState:
        """[model.init.c1] [optim.state.c1] State 0."""
        mem = self.memory
        if not mem.mapped:
            params = init_params(self.model.cfg, self.cfg.seed, self.ops)
            m, v = optim.adamw_init(params)  # zeros
        else:  # each tensor in a mapped file as it is made; the moments are files of zeros
            params = init_params(self.model.cfg, self.cfg.seed, self.ops, mem.keep)
            m, v = ({k: mem.zeros(params[k].shape, params[k].dtype) for k in sorted(params)} for _ in range(2))
        return TrainState(0, params, m, v, quant_steps(self.model.cfg, params, self.ops), self.data_position(0))

    def initial_record(self, st: TrainState) -> StepRecord:
        """[step.record.c1] Step 0: the initial state's root; its link is the genesis."""
        digest = st.digest()
        return StepRecord(0, digest.root, "00" * 32, statehash.GENESIS, None, digest)

    def step(self, st: TrainState, prev_link: str, launcher) -> tuple[TrainState, StepRecord]:
        """[step.order.c1] One step n = st.step + 1; returns (state n, record n).
        ``st`` is not modified."""
        doctor.require_ieee()  # refuse to compute under FTZ/DAZ ([num.flush.c1])
        n = st.step + 1
        cfg = self.cfg
        mc = self.model.cfg
        work = cfg.micro_batch_size * mc.seq_len * max(mc.width, mc.mlp_hidden, mc.vocab)
        pace_threads(work)
        M, B = cfg.micro_batches, cfg.micro_batch_size
        batch = self.stream.batch(n)  # [data.stream.c1]
        data_hash = hashlib.sha256(token_bytes(batch)).hexdigest()  # [data.hash.c1]
        A = self.model.arrays  # where the tensors live: host, or the device for the whole step
        on_dev = lambda d: {k: A.to_device(d[k]) for k in sorted(d)}  # noqa: E731
        masters = on_dev(st.params)
        # [bf16.tensors.c1] the working copies, rounded once per step (binary32: the masters)
        params = self.model.working_params(masters, self.memory.keep if self.memory.mapped else None)

        mem = self.memory

        def leaf(mb: int) -> dict:
            pace_threads(work)
            x, y = inputs_targets(batch[mb * B : (mb + 1) * B])  # [data.batch.c1]
            res = self.model.loss_and_grads(params, x, y, budget.SpillingDict(mem) if mem.mapped else None)
            out = dict(res.grads)
            out[LOSS] = A.to_device(np.array([res.loss], dtype=np.float32))
            return out

        ops = self.ops
        folded = launcher.fold(leaf, M, self._merge)  # [fold.tree.c1] [fold.ranks.c1]
        mean = self._scale(folded, M)  # [fold.scale.c1]
        if self.spares is not None:
            self.spares.give(folded)  # scaled into new arrays: no one reads it again
        del folded
        pace_threads(work)
        loss = np.float32(A.to_host(mean.pop(LOSS))[0])
        ops.optim.clip_grad_norm(mean, cfg.clip_norm)  # [optim.clip.c1]
        lr = ops.optim.lr_at(n, cfg.warmup_steps, cfg.schedule_steps, cfg.lr, cfg.min_lr, SCHEDULE)
        # AdamW updates the masters, never the working copies ([bf16.optim.c1])
        if not mem.mapped and ops.name == "cpu":  # st read, the new state written in one pass
            fresh = lambda d: {k: np.empty_like(d[k]) for k in sorted(d)}  # noqa: E731
            new = TrainState(n, fresh(masters), fresh(st.m), fresh(st.v), {}, st.data_position)
            ops.optim.adamw_step(
                masters,
                mean,
                st.m,
                st.v,
                step=n,
                lr=lr,
                hp=self.adam,
                no_decay=no_decay_names(masters),
                out=(new.params, new.m, new.v),
            )  # [optim.adamw.c1]
        elif not mem.mapped:  # copied where the tensors live (st stays unmodified)
            cp = lambda d: {k: A.copy(d[k]) for k in sorted(d)}  # noqa: E731
            new = TrainState(n, cp(masters), cp(on_dev(st.m)), cp(on_dev(st.v)), {}, st.data_position)
            ops.optim.adamw_step(
                new.params, mean, new.m, new.v, step=n, lr=lr, hp=self.adam, no_decay=no_decay_names(new.params)
            )  # [optim.adamw.c1]
        else:  # in mapped files, the same update tensor by tensor (it is elementwise), each released after
            new = st.copy(mem.keep)
            new.step = n
            no_decay = no_decay_names(new.params)
            for k in sorted(new.params):
                one = lambda d: {k: d[k]}  # noqa: E731
                ops.optim.adamw_step(
                    one(new.params),
                    one(mean),
                    one(new.m),
                    one(new.v),
                    step=n,
                    lr=lr,
                    hp=self.adam,
                    no_decay=no_decay & {k},
                )  # [optim.adamw.c1]
                for d in (new.params, mean, new.m, new.v):
                    budget.release(d[k])
        new.qsteps = quant_steps(self.model.cfg, new.params, ops)  # [model.quant.c1]
        new.data_position = self.data_position(n)
        digest = new.digest()
        loss_bits = f"0x{int(np.array([loss], np.float32).view(np.uint32)[0]):08X}"
        link = statehash.chain_link(prev_link, digest.root, data_hash, self.recipe_hash, loss_bits)  # [state.chain.c2]
        return new, StepRecord(n, digest.root, data_hash, link, loss, digest)
