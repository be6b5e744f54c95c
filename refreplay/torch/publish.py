"""Publish a torch loop's run: the standard run directory
(docs/run-format.md), the same files ``refreplay train`` writes for the same
model, data and seed, so that ``refreplay replay``, ``audit`` and
``coverage`` check it with the reference trainer and never run the
publisher's code.

    cfg = model_config(model, named)        # the spec's model, or Unsupported naming the module
    pub = Publisher("RUN", cfg, train_cfg, steps=N, checkpoint_every=K)   # data, recipe
    pub.publish(0, named, opt)              # state 0
    for n in 1..N:
        batch = pub.batch(n)                # [data.stream.c1]
        ... GradFold / all_fold, clip, opt.step(), schedule.step() ...
        pub.publish(n, named, opt, loss)    # record n (+ checkpoint), head at N

Under ``torch.distributed`` every rank constructs the Publisher (rank 0
builds the data and sends it to the others as bytes) and calls
``publish``; the state roots of all ranks are compared before rank 0
writes anything, and a record is written only after its step completed
on every rank.  Writing is delegated to ``training.run.RunWriter`` and the
recipe to ``training.run.Recipe``: nothing of the format is restated here.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from .. import state as statehash
from ..errors import InputError
from ..training import data, tokens
from ..training.model import param_shapes
from ..training.presets import F32, ModelConfig, TrainConfig
from ..training.run import RunWriter, checkpoint_steps, new_recipe
from ..training.step import StepRecord
from . import nn as rnn
from ._bridge import Unsupported, named_tensors
from .distributed import same_on_all
from .fold import chain_link, train_state

TORCH_LAUNCHER = "torch"  # run.launcher of a run published from a torch.distributed loop


# ---- the model -> the spec's model configuration ------------------------------------------------


def model_config(model: nn.Module, named_parameters, *, init_std=F32(0.02), rope_theta=F32(10000.0)) -> ModelConfig:
    """[model.config.c1] The spec's configuration of a converted torch GPT, or
    ``Unsupported`` naming the first module (or parameter) that chapter 20
    cannot express.  ``named_parameters``: {reference name: parameter}
    ([model.params.c1]), whose names and shapes must be exactly the
    configuration's.  ``init_std`` and ``rope_theta`` are not visible in the
    module's tensors (the rotary tables are checked against ``rope_theta``).

    Learned positions ([model.pos.c1]): a second ``Embedding`` whose weight
    is named "wpe" in ``named_parameters``, of shape [T, C], with every
    attention built with ``rope=False``.  LayerNorms built with
    ``bias=False`` give norm_bias false ([norm.layer.nobias.c1]).  What a
    forward does with the modules is not visible here: a forward that adds
    the position rows elsewhere trains a different model, and its first
    published state root is not the reference's (replay names the step)."""
    named = named_tensors(named_parameters, "model_config")
    emb, attn, mlps, norms, lins = [], [], [], [], []
    inside = set()
    for path, mod in model.named_modules():
        where = path or type(model).__name__
        if any(path.startswith(p + ".") for p in inside):
            continue
        if isinstance(mod, rnn.Embedding):
            emb.append((where, mod))
        elif isinstance(mod, rnn.CausalSelfAttention):
            attn.append((where, mod))
            inside.add(path)
        elif isinstance(mod, rnn.MLP):
            mlps.append((where, mod))
            inside.add(path)
        elif isinstance(mod, (rnn.LayerNorm, rnn.RMSNorm)):
            norms.append((where, mod))
        elif isinstance(mod, rnn.Linear):
            lins.append((where, mod))
        elif isinstance(mod, (rnn.GELU, rnn.SiLU, nn.ModuleDict, nn.ModuleList, nn.Sequential, nn.Identity)):
            pass
        elif not list(mod.children()):
            raise Unsupported(
                f"model_config: module {where!r} ({type(mod).__name__}) has no counterpart in "
                "spec/20-model.txt; the spec's GPT is built from refreplay.torch.nn's Embedding, "
                "LayerNorm/RMSNorm, CausalSelfAttention, MLP and Linear (docs/torch.md)"
            )
        own = [n for n, _ in mod.named_parameters(recurse=False)]
        if own and not isinstance(mod, (rnn.Embedding, rnn.LayerNorm, rnn.RMSNorm, rnn.Linear)):
            raise Unsupported(
                f"model_config: module {where!r} ({type(mod).__name__}) holds its own parameter(s) "
                f"{own}, which no part of spec/20-model.txt names"
            )
    name_of = {id(p): k for k, p in named.items()}
    pos_emb = [(w, m) for w, m in emb if name_of.get(id(m.weight)) == "wpe"]
    tok_emb = [(w, m) for w, m in emb if name_of.get(id(m.weight)) != "wpe"]
    if len(tok_emb) != 1 or len(pos_emb) > 1:
        raise Unsupported(
            f"model_config: the spec's GPT has one token embedding and at most one position "
            f"table (an Embedding whose weight is named 'wpe', [model.pos.c1]); found "
            f"{[(w, name_of.get(id(m.weight))) for w, m in emb]}"
        )
    if not attn or len(attn) != len(mlps):
        raise Unsupported(
            f"model_config: {len(attn)} attention and {len(mlps)} MLP modules; the spec's layers hold one of each"
        )
    wte = tok_emb[0][1]
    V, C = wte.num_embeddings, wte.embedding_dim
    pos = "learned" if pos_emb else "rope"
    for w, mod in attn:
        if mod.rope != (pos == "rope"):
            raise Unsupported(
                f"model_config: attention {w!r} is built with rope={mod.rope}, but the model "
                + (
                    f"has the learned position table {pos_emb[0][0]!r}: build it with rope=False"
                    if pos_emb
                    else "has no position table named 'wpe': positions would be missing ([model.pos.c1])"
                )
            )
    a0, m0 = attn[0][1], mlps[0][1]
    hidden = (m0.fc if m0.kind == "gelu" else m0.gate).out_features
    every_linear = [
        (f"{w}.{n}", lin) for w, mod in attn + mlps for n, lin in mod.named_children() if isinstance(lin, rnn.Linear)
    ]
    quant = {lin.quant for _, lin in every_linear}
    biased = {lin.bias is not None for _, lin in every_linear}
    if len(quant) != 1 or len(biased) != 1:
        found = [(w, lin.quant, lin.bias is not None) for w, lin in every_linear]
        raise Unsupported(
            "model_config: every linear layer of the spec's model has the same bias and "
            f"quantization setting; found {found}"
        )
    for w, mod in attn:
        if (mod.heads, mod.head_size, mod.seq_len) != (a0.heads, a0.head_size, a0.seq_len):
            raise Unsupported(f"model_config: attention {w!r} differs in shape from {attn[0][0]!r}")
    for w, mod in mlps:
        if mod.kind != m0.kind:
            raise Unsupported(f"model_config: MLP {w!r} is {mod.kind}, {mlps[0][0]!r} is {m0.kind}")
    kinds = {type(n) for _, n in norms}
    eps = {np.float32(n.eps) for _, n in norms}
    if len(norms) != 2 * len(attn) + 1 or len(kinds) != 1 or len(eps) != 1:
        raise Unsupported(
            f"model_config: the spec's model has 2 norms per layer and a final one, all of one "
            f"kind and eps; found {[(w, type(n).__name__, n.eps) for w, n in norms]}"
        )
    unweighted = [w for w, n in norms if getattr(n, "weight", None) is None]
    if unweighted:
        raise Unsupported(
            f"model_config: the spec's model (spec/20-model.txt) has a weight in every norm; "
            f"{unweighted} have none (elementwise_affine=False runs through refreplay.torch "
            "([norm.layer.noaffine.c1]) but a run of the spec's model cannot record it)"
        )
    norm_biased = {getattr(n, "bias", None) is not None for _, n in norms} if kinds == {rnn.LayerNorm} else {True}
    if len(norm_biased) != 1:
        raise Unsupported(
            "model_config: the spec's LayerNorms all have a bias or none has "
            f"([norm.layer.nobias.c1]); found {[(w, n.bias is not None) for w, n in norms]}"
        )
    if pos_emb and (pos_emb[0][1].num_embeddings, pos_emb[0][1].embedding_dim) != (a0.seq_len, C):
        raise Unsupported(
            f"model_config: the position table {pos_emb[0][0]!r} must be Embedding({a0.seq_len}, "
            f"{C}) (wpe [T, C], [model.pos.c1])"
        )
    if len(lins) > 1:
        raise Unsupported(
            f"model_config: linear layers outside attention and MLP: {[w for w, _ in lins]}; "
            "the spec's model has at most the output head there"
        )
    if lins and (
        lins[0][1].bias is not None or lins[0][1].quant or (lins[0][1].out_features, lins[0][1].in_features) != (V, C)
    ):
        raise Unsupported(f"model_config: the output head {lins[0][0]!r} must be a bias-free binary32 Linear({C}, {V})")
    cfg = ModelConfig(
        vocab=V,
        width=C,
        layers=len(attn),
        heads=a0.heads,
        seq_len=a0.seq_len,
        mlp_hidden=hidden,
        norm="layer" if kinds == {rnn.LayerNorm} else "rms",
        mlp=m0.kind,
        tied=not lins,
        linear="int8" if quant == {"int8"} else "fp32",
        bias=biased == {True},
        rope_theta=F32(rope_theta),
        norm_eps=eps.pop(),
        init_std=F32(init_std),
        pos=pos,
        norm_bias=norm_biased == {True},
    )
    try:
        cfg = cfg.validate()
    except InputError as exc:
        raise Unsupported(f"model_config: {exc}") from None
    from .functional import rope_tables

    cos, sin = rope_tables(cfg.seq_len, cfg.head_size, cfg.rope_theta, "cpu")
    for w, mod in attn if pos == "rope" else ():
        if not (torch.equal(mod.rope_cos.cpu(), cos) and torch.equal(mod.rope_sin.cpu(), sin)):
            raise Unsupported(
                f"model_config: the rotary tables of {w!r} are not those of rope_theta "
                f"{float(cfg.rope_theta)} ([rope.freq.c1]); pass the model's rope_theta"
            )
    want = param_shapes(cfg)
    have = {k: tuple(p.shape) for k, p in named.items()}
    if want != have:
        missing = sorted(set(want) - set(have))
        extra = sorted(set(have) - set(want))
        shaped = sorted(k for k in set(want) & set(have) if want[k] != have[k])
        raise Unsupported(
            f"model_config: the named parameters are not those of [model.params.c1]: missing "
            f"{missing[:5]}, unexpected {extra[:5]}, other shape {shaped[:5]}"
        )
    return cfg


# ---- the run directory ---------------------------------------------------------------------


def _distributed(group) -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1


def _rank(group) -> int:
    return dist.get_rank(group) if dist.is_available() and dist.is_initialized() else 0


def _root(group) -> int:
    """The global rank of the group's rank 0."""
    return 0 if group is None else dist.get_global_rank(group, 0)


def _world(group) -> int:
    return dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1


class Publisher:
    """Writes the run directory of a torch loop: on rank 0 the data (shards,
    manifest) and recipe at construction, then a record per ``publish``,
    checkpoints at step 0, every K and N, and the head after step N.

    The data is the byte corpus (``corpus_files``, None for the default)
    or token files, built exactly as ``refreplay train`` builds it;
    ``model_cfg.vocab`` must be the data's padded vocabulary.  Under a
    process group rank 0 builds it and broadcasts the samples' bytes."""

    def __init__(
        self,
        out,
        model_cfg: ModelConfig,
        train_cfg: TrainConfig,
        *,
        steps: int,
        checkpoint_every: int,
        corpus_files=None,
        byte_cap: int = data.DEFAULT_BYTE_CAP,
        token_files=None,
        vocab=None,
        preset=None,
        group=None,
        launcher: str = TORCH_LAUNCHER,
    ):
        self.group = group
        self.rank, self.world = _rank(group), _world(group)
        model_cfg, train_cfg = model_cfg.validate(), train_cfg.validate()
        if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= 1 << 24:
            raise InputError(f"Publisher: steps must be an integer in [1, 2^24], got {steps!r}")
        if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int) or checkpoint_every < 1:
            raise InputError(f"Publisher: checkpoint_every must be a positive integer, got {checkpoint_every!r}")
        if self.world > train_cfg.micro_batches:
            raise InputError(
                f"Publisher: {self.world} ranks exceed the {train_cfg.micro_batches} micro-batches "
                "of a step: every rank needs at least one"
            )
        path = None
        meta = [None]
        if self.rank == 0:
            try:
                path = RunWriter.prepare(out)
                if token_files:
                    toks, v, source = tokens.load_tokens(token_files, vocab)
                    samples = tokens.make_samples(toks, model_cfg.seq_len)
                else:
                    corpus, source = data.build_corpus(corpus_files, byte_cap)
                    samples, v = data.make_samples(corpus, model_cfg.seq_len), data.VOCAB
                if model_cfg.vocab != tokens.padded_vocab(v):
                    raise InputError(
                        f"Publisher: the model's vocabulary {model_cfg.vocab} is not the data's "
                        f"padded vocabulary {tokens.padded_vocab(v)} ([data.vocab.c1])"
                    )
                manifest = data.write_shards(samples, path / "data", source, v)
                msha = hashlib.sha256(data.manifest_bytes(manifest)).hexdigest()
                meta = [("ok", samples.shape, samples.dtype.str, v, msha)]
            except InputError as exc:
                meta = [("error", str(exc))]
        if _distributed(group):
            dist.broadcast_object_list(meta, src=_root(group), group=group)
        if meta[0][0] == "error":
            raise InputError(meta[0][1])
        _, shape, dtype, v, msha = meta[0]
        if self.rank != 0:
            samples = np.empty(tuple(shape), np.dtype(dtype))
        if _distributed(group):
            buf = torch.from_numpy(samples.reshape(-1).view(np.uint8))
            dist.broadcast(buf, src=_root(group), group=group)
        self.samples = samples
        self.model = model_cfg
        self.train = train_cfg
        self.steps = steps
        self.recipe = new_recipe(
            model_cfg,
            train_cfg,
            msha,
            int(samples.shape[0]),
            preset=preset,
            ranks=self.world,
            launcher=launcher,
            steps=steps,
            checkpoint_every=checkpoint_every,
        )
        self.recipe_sha256 = self.recipe.sha256()
        self.stream = data.Stream(
            samples, train_cfg.seed, data.Batching(train_cfg.micro_batches, train_cfg.micro_batch_size)
        )
        self.saves = set(checkpoint_steps(steps, checkpoint_every))
        self.writer = None
        if self.rank == 0:
            self.writer = RunWriter(path, self.recipe)
            self.writer.write_recipe()
        self.last = None  # the last published record

    def batch(self, n: int) -> np.ndarray:
        """[data.stream.c1] The (M*B, T+1) samples of step n, in stream order."""
        return self.stream.batch(n)

    def publish(self, n: int, named_parameters, optimizer, loss=None, quant_names=()) -> StepRecord:
        """[step.record.c1] [state.chain.c2] Record step n (0, then 1, 2, ...)
        from the state now in the parameters and optimizer: every rank's
        state root must agree before rank 0 writes the record, the
        checkpoint (steps 0, every K, N) and, after step N, the head."""
        want = 0 if self.last is None else self.last.step + 1
        if n != want or n > self.steps:
            raise Unsupported(f"Publisher.publish: step {n} out of order (next is {want} of 0..{self.steps})")
        if (n == 0) != (loss is None):
            raise Unsupported("Publisher.publish: step 0 has no loss; every later step has one")
        st = train_state(n, named_parameters, optimizer, self.stream.position(n + 1), quant_names)
        digest = st.digest()
        if _distributed(self.group):
            same_on_all(digest.root, f"the state root of step {n}", self.group)
        if n == 0:
            rec = StepRecord(0, digest.root, "00" * 32, statehash.GENESIS, None, digest)
        else:
            data_hash = self.stream.data_hash(n).hex()
            link = chain_link(self.last.chain_link, digest.root, data_hash, self.recipe_sha256, loss)
            rec = StepRecord(n, digest.root, data_hash, link, np.float32(loss), digest)
        if self.writer is not None:
            self.writer.record(rec)
            if n in self.saves:
                self.writer.checkpoint(st, rec.state_root)
            if n == self.steps:
                self.writer.finish(rec)
        self.last = rec
        return rec


__all__ = ["TORCH_LAUNCHER", "model_config", "Publisher"]
