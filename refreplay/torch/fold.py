"""The parts of a training step around the user's model: TreeFold of the
micro-batch gradients, the training state, its hash and the chain link
(``spec/22-treefold.txt``, ``spec/23-step.txt``), all delegated to
refreplay's own functions so a torch loop publishes what the reference
trainer publishes.

A step of a torch loop (docs/torch.md):

    opt.zero_grad()                             # .grad = None: nothing to add to
    fold = GradFold(names)                      # names: {state name: parameter}
    for m in range(M):                          # micro-batches in stream order
        loss = model(x_m, y_m); loss.backward()
        fold.push(loss)                         # takes every .grad, clears it
    loss = fold.mean()                          # TreeFold, x recip(M); .grad set
    clip_grad_norm_(names, clip); opt.step(); schedule.step()
    st = train_state(n, names, opt, position, quant_names)
    link = chain_link(prev_link, st.root(), data_hash, recipe_hash, loss)
"""

from __future__ import annotations


import numpy as np
import torch

from .. import state as statehash
from ..training.presets import f32_hex
from ..training.step import LOSS, TrainState
from ..training.treefold import FoldStack, fold_blocks
from ._bridge import Unsupported, backend_of, eager, from_numpy, inside_reference, named_tensors, to_numpy


class GradFold:
    """[fold.tree.c1] [fold.final.c1] [fold.scale.c1] [step.loss.c1] The
    binary-carry fold of one step's micro-batch leaves {gradients, loss}.

    ``push(loss)`` after each micro-batch's ``loss.backward()`` takes the
    gradient of every named parameter (a parameter without one is refused:
    its leaf would be missing) and sets ``.grad`` to None, so the next
    micro-batch's backward starts from nothing: PyTorch never adds
    micro-batch gradients itself.  ``mean()`` folds, scales by recip(f32(M)),
    puts the mean gradients in ``.grad`` and returns the step's loss.

    Data parallel ([fold.ranks.c1]): the rank holding micro-batches [a, b)
    builds ``GradFold(named, start=a)``, pushes its leaves and sends
    ``blocks()``; the root passes every rank's blocks, rank 0 first, to
    ``fold_ranks``.  The bits do not depend on the number of ranks.
    """

    def __init__(self, named_parameters, start: int = 0):
        self.named = named_tensors(named_parameters, "GradFold")
        if LOSS in self.named:
            raise Unsupported(f"GradFold: the name {LOSS!r} is the loss leaf ([step.loss.c1])")
        self.names = sorted(self.named)
        stale = [k for k in self.names if self.named[k].grad is not None]
        if stale:
            raise Unsupported(
                f"GradFold: {stale[:5]} already hold a gradient, which the first backward "
                "would add to with PyTorch's own add: call optimizer.zero_grad() "
                "(set_to_none=True, the default) before the step"
            )
        self.ops = backend_of(*self.named.values())
        self.stack = FoldStack(start, self.ops.treefold.merge)
        self.count = 0

    @eager
    def push(self, loss: torch.Tensor) -> None:
        """One micro-batch, in global sample order."""
        missing = [k for k in self.names if self.named[k].grad is None]
        if missing:
            raise Unsupported(
                f"GradFold.push: no gradient for {missing[:5]} (call loss.backward() first; "
                "every parameter of the state takes part in the fold)"
            )
        with inside_reference():
            leaf = {k: to_numpy(f"grad of {k}", self.named[k].grad) for k in self.names}
            leaf[LOSS] = to_numpy("loss", loss.detach().reshape(1)).copy()
        for k in self.names:
            self.named[k].grad = None
        self.stack.push(leaf)
        self.count += 1

    def blocks(self) -> list:
        """[fold.ranks.c1] This rank's share: the maximal aligned blocks of
        its micro-batch range, earliest first (``treefold.Block``)."""
        return self.stack.blocks()

    @eager
    def mean(self) -> np.float32:
        """[fold.final.c1] [fold.scale.c1] The fold of the pushed leaves times
        recip(f32(M)); sets every ``.grad`` to its mean and returns the loss."""
        if not self.count or self.stack.start:
            raise Unsupported(
                "GradFold.mean: needs the leaves of a whole step, from micro-batch 0 "
                "(a rank's share goes to fold_ranks)"
            )
        return _set_mean(self.named, self.ops, self.stack.result(), self.count)


@eager
def fold_ranks(named_parameters, blocks_in_rank_order, micro_batches: int) -> np.float32:
    """[fold.ranks.c1] [fold.final.c1] [fold.scale.c1] The root's share:
    fold every rank's ``GradFold.blocks()`` (rank 0 first; together they
    must cover micro-batches 0 .. M-1), scale by recip(f32(M)), put the mean
    gradients in ``.grad`` and return the step's loss."""
    named = named_tensors(named_parameters, "fold_ranks")
    ops = backend_of(*named.values())
    blocks = list(blocks_in_rank_order)
    covered = sum(b.size for b in blocks)
    if covered != micro_batches:
        raise Unsupported(f"fold_ranks: the blocks cover {covered} micro-batches, the step has {micro_batches}")
    with inside_reference():
        try:
            folded = fold_blocks(blocks, ops.treefold.merge)
        except ValueError as exc:  # a gap or an overlap between ranks
            raise Unsupported(f"fold_ranks: {exc}") from None
    return _set_mean(named, ops, folded, micro_batches)


def _set_mean(named: dict, ops, folded: dict, m: int) -> np.float32:
    """[fold.scale.c1] [step.loss.c1] Scale the folded leaves by recip(f32(M)),
    set every ``.grad`` to its mean, return the mean loss."""
    with inside_reference():
        mean = ops.treefold.scale(folded, m)
        loss = np.float32(mean.pop(LOSS)[0])
        if sorted(mean) != sorted(named):
            raise Unsupported("fold: the leaves do not hold exactly the named parameters")
        for k in sorted(named):
            p = named[k]
            p.grad = from_numpy(mean[k], p)
    return loss


def train_state(step: int, named_parameters, optimizer, data_position, quant_names=()) -> TrainState:
    """[step.state.c1] The state after ``step`` steps as refreplay's
    ``TrainState`` (copies): parameters, AdamW moments (+0 before the first
    update), the re-pinned step sizes of the int8 weights named in
    ``quant_names`` ([model.quant.c1]), the step and the data position."""
    named = named_tensors(named_parameters, "train_state")
    params, m, v = {}, {}, {}
    with inside_reference():
        for k in sorted(named):
            p = named[k]
            params[k] = to_numpy(k, p).copy()
            st = optimizer.state.get(p, {})
            m[k] = to_numpy(f"exp_avg of {k}", st["exp_avg"]).copy() if st else np.zeros_like(params[k])
            v[k] = to_numpy(f"exp_avg_sq of {k}", st["exp_avg_sq"]).copy() if st else np.zeros_like(params[k])
        ops = backend_of(*named.values())
        qsteps = {k: ops.quant.step_size_rows(params[k]) for k in sorted(quant_names)}
    return TrainState(int(step), params, m, v, qsteps, tuple(int(x) for x in data_position))


def load_state(state: TrainState, named_parameters, optimizer) -> None:
    """[step.state.c1] Put a state (a checkpoint, ``step.state_from_tensors``)
    into the parameters and the AdamW state, bits copied: how an auditor
    starts replaying at step ``state.step + 1``.  The names must be exactly
    the state's; the optimizer's step counters become ``state.step``."""
    named = named_tensors(named_parameters, "load_state")
    if sorted(named) != sorted(state.params):
        missing = sorted(set(state.params) - set(named))
        extra = sorted(set(named) - set(state.params))
        raise Unsupported(f"load_state: names differ from the state's: missing {missing[:5]}, extra {extra[:5]}")
    with inside_reference(), torch.no_grad():
        for k in sorted(named):
            p = named[k]
            if tuple(p.shape) != state.params[k].shape or p.dtype != torch.float32:
                raise Unsupported(
                    f"load_state: {k} is {p.dtype} {tuple(p.shape)}, the state holds float32 {state.params[k].shape}"
                )
            p.copy_(from_numpy(state.params[k].copy(), p))
            optimizer.state[p] = {
                "step": int(state.step),
                "exp_avg": from_numpy(state.m[k].copy(), p),
                "exp_avg_sq": from_numpy(state.v[k].copy(), p),
            }


def chain_link(prev_link: str, state_root: str, data_hash: str, recipe_hash: str, loss) -> str:
    """[state.chain.c2] The chain link of a step: refreplay's own
    ``state.chain_link`` (the one place a torch loop computes it), with
    ``loss`` the step's binary32 loss (``GradFold.mean()``) bound into the
    link by its bits."""
    return statehash.chain_link(prev_link, state_root, data_hash, recipe_hash, f32_hex(np.float32(loss)))
