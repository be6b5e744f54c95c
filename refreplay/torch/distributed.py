"""TreeFold over ``torch.distributed`` ([fold.ranks.c1]): every rank gets the
same bits of a step's mean gradient and loss, whatever the world size.

The collective moves bytes only.  Each rank's aligned blocks
(``GradFold.blocks()``) are viewed as int32 and exchanged with
``all_gather`` (block counts and positions first, then the padded
payloads); every rank then folds all blocks, rank 0's first, with
refreplay's own tree node (``fold_ranks``).  No floating-point addition
happens inside the collective, so the bits are those of one device folding
micro-batches 0 .. M-1, for R = 1, 2, 3, 4 ... ranks alike, also when R
does not divide M.

A step on rank q of R (docs/torch.md, "Distributed training"):

    a, b = rank_ranges(M, R)[q]             # [fold.ranks.c1]
    fold = GradFold(named, start=a)
    for m in range(a, b):                   # this rank's micro-batches, in order
        loss = model(x_m, y_m); loss.backward(); fold.push(loss)
    loss = all_fold(fold, M)                # every rank: .grad = the mean, loss returned
    clip_grad_norm_(named, clip); opt.step(); schedule.step()

``fold_hook`` is the same exchange as a DDP communication hook, for a
loop that keeps ``DistributedDataParallel``; see its docstring for when it
is conformant (one micro-batch per rank per step) and when it refuses.

Backends: gloo with CPU tensors (tested); NCCL with CUDA tensors (the
payloads are moved to the rank's CUDA device first; written, documented,
not tested here).  A rank that dies or hangs makes the collectives of the
others raise after the process group's ``timeout``; ``all_fold`` turns
that into ``Unsupported`` naming the step, and nothing that follows (the
optimizer step, a published record) runs.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from ..training.step import LOSS
from ..training.treefold import Block, fold_blocks, rank_ranges
from ._bridge import Unsupported, backend_of, eager, inside_reference, to_numpy
from .fold import GradFold, fold_ranks

_HEADER = 2  # (start, size) per block
# int32 elements per all_gather call.  Measured over gloo on 127.0.0.1, 2 ranks, 118 M elements:
# one call 18.2 s, 16 Mi-element pieces 3.4 s, 1 Mi-element (4 MiB) pieces 1.65 s.
_CHUNK = 1 << 20


class CollectiveError(Unsupported):
    """A collective of the fold failed: a rank died, hung past the group's
    timeout, or sent blocks that do not fit ([fold.ranks.c1])."""


def my_range(micro_batches: int, group=None) -> tuple[int, int]:
    """[fold.ranks.c1] The micro-batches [a, b) this rank holds."""
    r, q = dist.get_world_size(group), dist.get_rank(group)
    try:
        return rank_ranges(int(micro_batches), r)[q]
    except (TypeError, ValueError) as exc:
        raise Unsupported(f"my_range: {exc} (every rank needs at least one micro-batch)") from None


def _max_blocks(m: int) -> int:
    """An upper bound on the aligned blocks of any range inside [0, M): at
    most one per bit on the way up and one per bit on the way down."""
    return 2 * max(1, int(m).bit_length()) + 1


def _device(group):
    """Where the collective's tensors live: CUDA for NCCL, the host otherwise."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _as_int32(value: np.ndarray) -> torch.Tensor:
    """The bits of a host float32 array (``GradFold`` leaves are host arrays
    on either backend) as a flat int32 tensor: a view, no arithmetic."""
    if not isinstance(value, np.ndarray) or value.dtype != np.float32:
        raise Unsupported(f"fold: a block value is {type(value).__name__}, expected a float32 array")
    return torch.from_numpy(np.ascontiguousarray(value).reshape(-1).view(np.int32))


def _collect(what: str, fn, *args):
    try:
        fn(*args)
    except RuntimeError as exc:  # gloo/NCCL: a peer closed, or the timeout passed
        raise CollectiveError(
            f"{what}: the collective failed ({str(exc).splitlines()[0][:300]}); "
            "a rank died or hung: nothing of this step may be published"
        ) from None


_BUFFERS: dict = {}  # (group, device, ranks, width) -> (send buffer, receive buffers), reused step after step


def _buffers(group, dev, r: int, width: int, reuse: bool):
    """The int32 send buffer and the R receive buffers of a payload.  Fresh
    ones cost more than the transfer (page faults of ~1 GB at gpt2-124m's
    size: measured 7.5-12 s against 1.8-3.5 s reused, 2 ranks, load 9), so
    with ``reuse`` they are kept for the next call of the same width."""
    key = (id(group), str(dev), r, width)
    if reuse and key in _BUFFERS:
        return _BUFFERS[key]
    bufs = (
        torch.empty(width, dtype=torch.int32, device=dev),
        [torch.empty(width, dtype=torch.int32, device=dev) for _ in range(r)],
    )
    if reuse:
        if len(_BUFFERS) >= 16:  # a DDP hook keeps one per bucket size; sizes that stop recurring go
            _BUFFERS.clear()
        _BUFFERS[key] = bufs
    return bufs


def exchange_blocks(
    blocks: list, names: list, shapes: dict, micro_batches: int, group=None, step=None, reuse: bool = False
) -> list:
    """[fold.ranks.c1] Every rank's aligned blocks, rank 0's first, on every
    rank.  ``blocks``: this rank's ``Block``s whose values are dicts over
    ``names`` (each of ``shapes[name]``, float32); returned values are host
    numpy arrays holding the bits as sent.  Block counts and positions are
    exchanged first, then the int32 payloads padded to the largest rank's,
    in 4 MiB ``all_gather`` calls.  With ``reuse`` the returned arrays are
    views of buffers that the next call overwrites (what ``all_fold`` uses:
    it folds them at once)."""
    where = f"step {step}" if step is not None else "fold"
    r = dist.get_world_size(group)
    dev = _device(group)
    kmax = _max_blocks(micro_batches)
    if len(blocks) > kmax:
        raise Unsupported(
            f"{where}: {len(blocks)} blocks on one rank, more than any range of {micro_batches} micro-batches has"
        )
    header = torch.zeros(1 + _HEADER * kmax, dtype=torch.int64)
    header[0] = len(blocks)
    for i, b in enumerate(blocks):
        header[1 + 2 * i], header[2 + 2 * i] = int(b.start), int(b.size)
    headers = [torch.zeros_like(header, device=dev) for _ in range(r)]
    _collect(f"{where}: exchanging block positions", dist.all_gather, headers, header.to(dev), group)
    headers = [h.cpu() for h in headers]
    sizes = {k: int(np.prod(shapes[k], dtype=np.int64)) for k in names}
    per_block = sum(sizes.values())
    counts = [int(h[0]) for h in headers]
    if any(not 0 <= c <= kmax for c in counts):
        raise CollectiveError(f"{where}: a rank announced {counts} blocks")
    width = max(counts) * per_block
    payload, gathered = _buffers(group, dev, r, width, reuse)
    off = 0
    for b in blocks:
        for k in names:
            part = _as_int32(b.value[k])
            if part.numel() != sizes[k]:
                raise Unsupported(f"{where}: {k} holds {part.numel()} elements, its shape {shapes[k]} says {sizes[k]}")
            payload[off : off + sizes[k]].copy_(part)
            off += sizes[k]
    payload[off:].zero_()
    for s in range(0, width, _CHUNK):
        e = min(width, s + _CHUNK)
        _collect(
            f"{where}: exchanging gradient blocks", dist.all_gather, [g[s:e] for g in gathered], payload[s:e], group
        )
    out = []
    for q in range(r):
        buf = gathered[q].cpu().numpy().view(np.float32)
        off = 0
        for i in range(counts[q]):
            value = {}
            for k in names:
                value[k] = buf[off : off + sizes[k]].reshape(shapes[k])  # a view of the received bytes
                off += sizes[k]
            out.append(Block(int(headers[q][1 + 2 * i]), int(headers[q][2 + 2 * i]), value))
    return out


@eager
def all_fold(fold: GradFold, micro_batches: int, group=None, step=None) -> np.float32:
    """[fold.ranks.c1] [fold.final.c1] [fold.scale.c1] [step.loss.c1] On every
    rank of ``group``: exchange every rank's ``fold.blocks()`` and fold them
    (``fold_ranks``); sets each ``.grad`` to the step's mean gradient and
    returns the step's loss, the same bits on every rank and for every world
    size.  ``fold`` must be ``GradFold(named, start=a)`` with [a, b) this
    rank's ``my_range`` and one push per micro-batch of it."""
    a, b = my_range(micro_batches, group)
    if fold.stack.start != a or fold.stack.end != b:
        raise Unsupported(
            f"all_fold: this rank (rank {dist.get_rank(group)} of {dist.get_world_size(group)}) "
            f"holds micro-batches [{a}, {b}) by [fold.ranks.c1], its GradFold pushed "
            f"[{fold.stack.start}, {fold.stack.end})"
        )
    names = sorted(fold.names) + [LOSS]
    shapes = {k: tuple(fold.named[k].shape) for k in fold.names}
    shapes[LOSS] = (1,)
    blocks = fold.blocks()
    every = exchange_blocks(blocks, names, shapes, micro_batches, group, step, reuse=True)
    return _fold_exchanged(fold.named, every, micro_batches, step)


def _fold_exchanged(named: dict, blocks: list, m: int, step) -> np.float32:
    """``fold_ranks`` on the exchanged blocks; a gap, an overlap or a wrong
    count is a ``CollectiveError`` naming the step."""
    try:
        return fold_ranks(named, blocks, m)
    except Unsupported as exc:
        raise CollectiveError(f"step {step}: {exc}") from None


def fold_hook(state, bucket):
    """A DDP communication hook (``ddp.register_comm_hook(HookState(M), fold_hook)``)
    that replaces DDP's bucket sum by [fold.ranks.c1] and [fold.scale.c1].

    What a DDP bucket is: the flat concatenation of some parameters'
    ``.grad`` of ONE rank, after that rank's backward.  The fold needs one
    leaf per micro-batch, so the hook is conformant only when every rank's
    backward is exactly one micro-batch: M == world size, no ``no_sync()``
    accumulation (PyTorch's own ``+=`` into ``.grad`` is not [fold.tree.c1]),
    ``gradient_as_bucket_view`` either way (the bucket holds the gradient's
    bits).  The hook then exchanges every rank's bucket bytes (all_gather,
    int32 view), folds rank 0's leaf first (a leaf per rank is a block of
    size 1 at micro-batch q) and scales by recip(f32(M)) elementwise.  An
    elementwise fold of a flat bucket is the fold of each of its tensors, so
    bucket boundaries change no bit.  The loss is not in a bucket: fold it
    with ``fold_loss``.  The hook refuses (``Unsupported``, raised in
    backward) a world size other than ``state.micro_batches``."""
    group = state.group
    r = dist.get_world_size(group)
    if r != state.micro_batches:
        raise Unsupported(
            f"fold_hook: a DDP bucket is one rank's gradient, so the hook folds one micro-batch "
            f"per rank; this step has M = {state.micro_batches} micro-batches on {r} ranks. "
            "Use all_fold with GradFold (any M and world size) instead"
        )
    grad = bucket.buffer()
    if grad.dtype != torch.float32:
        raise Unsupported(f"fold_hook: bucket dtype {grad.dtype}; the fold is defined on float32")
    host = grad.detach().cpu().contiguous().numpy()
    q = dist.get_rank(group)
    every = exchange_blocks(
        [Block(q, 1, {"bucket": host})], ["bucket"], {"bucket": tuple(host.shape)}, r, group, state.step, reuse=True
    )
    ops = backend_of(grad)
    with inside_reference():
        folded = fold_blocks(every, ops.treefold.merge)
        mean = ops.treefold.scale(folded, r)["bucket"]
    out = torch.from_numpy(np.ascontiguousarray(mean)).to(grad.device)
    fut = torch.futures.Future()
    fut.set_result(out)
    return fut


class HookState:
    """The state of ``fold_hook``: the step's micro-batch count M (must equal
    the world size), the process group, and a step label for messages."""

    def __init__(self, micro_batches: int, group=None):
        self.micro_batches = int(micro_batches)
        self.group = group
        self.step = None


@eager
def fold_loss(loss, micro_batches: int, group=None, step=None) -> np.float32:
    """[step.loss.c1] [fold.ranks.c1] The step's loss for a loop under
    ``fold_hook``: every rank's micro-batch loss (one per rank, M == world
    size) folded and scaled like the gradients; the same bits on every rank."""
    r = dist.get_world_size(group)
    if r != micro_batches:
        raise Unsupported(f"fold_loss: one micro-batch per rank, got M = {micro_batches} on {r} ranks")
    with inside_reference():
        leaf = to_numpy("loss", loss.detach().reshape(1)).copy()
    q = dist.get_rank(group)
    every = exchange_blocks([Block(q, 1, {LOSS: leaf})], [LOSS], {LOSS: (1,)}, r, group, step)
    from ..training.treefold import merge, scale

    with inside_reference():
        return np.float32(scale(fold_blocks(every, merge), r)[LOSS][0])


def same_on_all(text: str, what: str, group=None) -> None:
    """Every rank holds the same ``text`` (a state root, a hash): exchanged
    as bytes; a difference or a failed collective raises, naming ``what``."""
    raw = np.frombuffer(text.encode("ascii"), np.uint8)
    n = torch.tensor([raw.size], dtype=torch.int64)
    r = dist.get_world_size(group)
    dev = torch.device("cpu") if dist.get_backend(group) != "nccl" else _device(group)
    sizes = [torch.zeros(1, dtype=torch.int64, device=dev) for _ in range(r)]
    _collect(f"{what}: exchanging sizes", dist.all_gather, sizes, n.to(dev), group)
    width = max(int(s) for s in sizes)
    buf = torch.zeros(width, dtype=torch.uint8)
    buf[: raw.size] = torch.from_numpy(raw.copy())
    got = [torch.zeros(width, dtype=torch.uint8, device=dev) for _ in range(r)]
    _collect(what, dist.all_gather, got, buf.to(dev), group)
    texts = [bytes(g.cpu().numpy()[: int(s)]).decode("ascii", "replace") for g, s in zip(got, sizes)]
    if len(set(texts)) != 1:
        raise CollectiveError(f"{what} differs between ranks: {texts}")


__all__ = [
    "CollectiveError",
    "my_range",
    "exchange_blocks",
    "all_fold",
    "fold_hook",
    "HookState",
    "fold_loss",
    "same_on_all",
]
