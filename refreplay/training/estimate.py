"""The cost of a step, known before it runs: FLOPs, bytes moved, predicted
peak memory and predicted time on this machine (``--estimate``).

Counts come from the configuration alone.  The time comes from a short
calibration (seconds at any model size): one micro-batch of the model cut to
at most 2 layers, 256 tokens, width 1024 and vocabulary 8192
(``calibration_model``), timed and scaled by FLOPs, and the step's
elementwise passes and state hash timed on a few MiB.  It is a
prediction for planning, not a measurement; nothing here touches the bits of
a step.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import numpy as np

from .model import param_count, param_shapes
from .presets import ModelConfig, TrainConfig

F32_BYTES = 4


def _grad_sets(m: int) -> int:
    """Gradient sets alive at once during TreeFold: the stack's
    floor(log2 M) + 1 blocks ([fold.memory.r1]) and the leaf being merged."""
    return m.bit_length() + 1


def activation_bytes(cfg: ModelConfig, b: int) -> int:
    """Bytes one micro-batch keeps for its backward (forward outputs saved per
    layer, the attention probabilities, the logits) plus the backward's
    transients of one layer and the head."""
    n, c, f, t, v = b * cfg.seq_len, cfg.width, cfg.mlp_hidden, cfg.seq_len, cfg.vocab
    per_layer = n * (14 * c + (2 if cfg.mlp == "gelu" else 3) * f) + b * cfg.heads * t * t
    transient = n * (6 * c + 2 * f) + 2 * b * cfg.heads * t * t
    head = 3 * n * v
    return F32_BYTES * (cfg.layers * per_layer + transient + head)


def workspace_bytes(cfg: ModelConfig, b: int, spares: bool = False) -> int:
    """Bytes of the reference trainer's reused scratch buffers
    (``training/workspace.py``), which outlive a micro-batch: the logits and
    their gradient [N, V], the head's activation gradient [N, C], each
    layer's attention probabilities [B, NH, T, T], the binary32 linears'
    input gradients (one [N, width] a role, shared by the layers: the MLP
    projection's [N, F], and [N, C] for each other linear), the MLP
    activation's input gradients [N, F] (GELU's one, SwiGLU's two, shared by
    the layers), and for a tied weight its two gradient halves [V, C] -- one
    with ``spares`` (the trainer's: the embedding's half is then written
    into a spare, ``spare_bytes``)."""
    n, c, v, t = b * cfg.seq_len, cfg.width, cfg.vocab, cfg.seq_len
    att = cfg.layers * b * cfg.heads * t * t
    halves = (1 if spares else 2) if cfg.tied else 0
    dx = 0 if cfg.linear == "int8" else n * (cfg.mlp_hidden + (3 if cfg.mlp == "gelu" else 4) * c)
    dact = n * cfg.mlp_hidden * (1 if cfg.mlp == "gelu" else 2)
    return F32_BYTES * (2 * n * v + n * c + att + dx + dact + halves * v * c)


def spare_bytes(cfg: ModelConfig, m: int) -> int:
    """Bytes of the trainer's spare embedding gradients (``workspace.Spares``),
    kept between steps: floor(log2 M) + 1 arrays [V, C]."""
    return F32_BYTES * m.bit_length() * cfg.vocab * cfg.width


def largest_tensor_bytes(cfg: ModelConfig) -> int:
    return F32_BYTES * max(int(np.prod(s)) for s in param_shapes(cfg).values())


@dataclass
class Cost:
    params: int
    tokens: int  # per step
    flops: int  # one step: forward and backward of every micro-batch, fold, optimizer
    bytes_moved: int  # state, gradients and checkpoint bytes read and written once each
    peak_ram: int  # every tensor in RAM
    peak_mapped: int  # anonymous memory with state and gradients in mapped files
    seconds: float | None = None  # predicted, from the calibration
    calibration_s: float | None = None

    def lines(self, budget: int | None = None) -> list[str]:
        gib = lambda x: f"{x / (1 << 30):.2f} GiB"  # noqa: E731
        mapped = budget is not None and self.peak_ram > budget
        out = [
            f"parameters      {self.params:,}",
            f"tokens per step {self.tokens:,}",
            f"FLOPs per step  {self.flops:.3e}",
            f"bytes moved     {gib(self.bytes_moved)} (state, gradients, checkpoint)",
            f"peak memory     {gib(self.peak_ram)} with every tensor in RAM; "
            f"{gib(self.peak_mapped)} with state and gradients in mapped files",
            "memory plan     "
            + (
                "no budget: tensors in RAM"
                if budget is None
                else f"--max-memory {gib(budget)}: "
                + ("state and gradients in mapped files" if mapped else "fits in RAM")
            ),
        ]
        if mapped and self.peak_mapped > budget:
            out.append(
                f"warning         even mapped, the step needs about {gib(self.peak_mapped)} "
                "(activations of one micro-batch): above the budget"
            )
        if self.seconds is not None:
            out.append(
                f"predicted time  {self.seconds:.1f} s per step on this machine "
                f"(calibrated in {self.calibration_s:.1f} s)"
            )
        return out


def cost(cfg: ModelConfig, train: TrainConfig) -> Cost:
    """FLOPs, bytes and peak memory of one step (replay or training)."""
    p = param_count(cfg)
    m, b, t, c, layers = train.micro_batches, train.micro_batch_size, cfg.seq_len, cfg.width, cfg.layers
    tokens = m * b * t
    # every weight is a matmul operand once (the tied wte as the head; an
    # untied wte is only gathered): forward 2 FLOPs per weight and token,
    # backward 4; causal attention (QK^T and AV over T/2 keys on average)
    # 2*2*(T/2)*C per token and layer forward, twice that backward
    matmul_params = p - (0 if cfg.tied else cfg.vocab * c)
    flops = 6 * matmul_params * tokens + 3 * 2 * t * c * layers * tokens
    flops += (m - 1) * p + p + 2 * p + 20 * p  # fold, scale, clip, AdamW
    state = 3 * p * F32_BYTES
    grad = p * F32_BYTES
    moved = (
        state  # checkpoint read
        + m * grad
        + (m - 1) * 3 * grad  # leaves written, merges read two and write one
        + 2 * grad
        + grad  # scale, clip
        + 4 * grad
        + 3 * grad  # AdamW reads params, grads, m, v; writes three
        + 2 * state
    )  # the state copied and hashed
    act = activation_bytes(cfg, b)
    fold_phase = state + _grad_sets(m) * grad + act
    # the workspace and the spare gradients outlive the backward
    optim_phase = 2 * state + 2 * grad + workspace_bytes(cfg, b, spares=True) + spare_bytes(cfg, m)
    peak_ram = max(fold_phase, optim_phase)
    peak_mapped = act + 4 * largest_tensor_bytes(cfg) + (64 << 20)
    return Cost(p, tokens, int(flops), int(moved), int(peak_ram), int(peak_mapped))


def _time(fn, repeat: int = 2) -> float:
    """Best of ``repeat`` wall times: the least disturbed by other load."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _micro_seconds(small: ModelConfig, repeat: int = 1) -> float:
    """Seconds of one micro-batch (B = 1) of the model ``small`` (best of
    ``repeat``); random parameters (timing does not depend on them)."""
    from .model import Model

    t = small.seq_len
    g = np.random.default_rng(0)
    pattern = g.standard_normal(4099, dtype=np.float32) * np.float32(0.02)  # tiled: cheap at any size
    params = {
        k: np.resize(pattern, s) if len(s) > 1 else np.ones(s, np.float32) for k, s in param_shapes(small).items()
    }
    model = Model(small)
    x = g.integers(0, small.vocab, size=(1, t)).astype(np.int32)
    y = g.integers(0, small.vocab, size=(1, t)).astype(np.int32)
    return _time(lambda: model.loss_and_grads(params, x, y), repeat)


def _stream_seconds_per_byte() -> tuple[float, float]:
    """(seconds per byte of an elementwise pass, of the state hash)."""
    from .. import state as statehash
    from . import backend as backends

    ops = backends.get("cpu")
    n = 1 << 22
    a = np.full(n, np.float32(0.5))
    b = np.full(n, np.float32(0.25))
    ops.treefold.merge(a, b)
    merge = _time(lambda: ops.treefold.merge(a, b)) / (3 * 4 * n)
    hashing = _time(lambda: statehash.state_hash({"x": a}, statehash.default_threads())) / (4 * n)
    return merge, hashing


CAL_LAYERS = 2  # layers of the model that calibration times (fewer if the model has fewer)
CAL_SEQ = 256  # its sequence length (shorter if the model's is)
CAL_WIDTH = 1024  # its width at most: whole heads of the model's head size
CAL_MLP = 4096  # its MLP hidden size at most (the model's ratio to the width otherwise)
CAL_VOCAB = 8192  # its vocabulary at most


def calibration_model(cfg: ModelConfig) -> ModelConfig:
    """The cut-down model that calibration times: at most CAL_LAYERS layers
    of CAL_SEQ tokens, CAL_WIDTH wide, a CAL_VOCAB vocabulary, whatever the
    model's size, so that calibrating takes seconds and a few hundred MiB at
    any size (a recipe's widths are untrusted: the width-65,536 one would
    otherwise allocate 16 GiB to be timed).  Head size, norm, MLP kind,
    precision and linear kind are the model's own."""
    head = cfg.width // cfg.heads
    if cfg.width <= CAL_WIDTH:
        heads, width = cfg.heads, cfg.width
    elif head >= CAL_WIDTH:
        heads, width = 1, CAL_WIDTH
    else:
        heads = CAL_WIDTH // head
        width = heads * head
    mlp = min(CAL_MLP, max(1, cfg.mlp_hidden * width // cfg.width))
    return dataclasses.replace(
        cfg,
        layers=min(cfg.layers, CAL_LAYERS),
        seq_len=min(cfg.seq_len, CAL_SEQ),
        width=width,
        heads=heads,
        mlp_hidden=mlp,
        vocab=min(cfg.vocab, CAL_VOCAB),
    ).validate()


def micro_flops(cfg: ModelConfig, layers: int, t: int) -> float:
    """FLOPs of one micro-batch (B = 1) of ``cfg`` cut to ``layers`` layers at
    sequence length t: every matmul weight twice forward and four times
    backward per token, causal attention 6*t*t*C per layer."""
    per_layer = param_count(dataclasses.replace(cfg, layers=2)) - param_count(dataclasses.replace(cfg, layers=1))
    head = cfg.vocab * cfg.width
    return layers * (6.0 * per_layer * t + 6.0 * t * t * cfg.width) + 6.0 * head * t


def calibrate(cfg: ModelConfig, train: TrainConfig, c: Cost) -> Cost:
    """Fill in ``c.seconds``: the predicted time of one step here.

    Times one micro-batch of ``calibration_model(cfg)`` (after one untimed
    call, which loads or compiles every kernel it uses) and scales it by the
    FLOPs of the real micro-batch: one measurement of a second or so, no
    difference of two noisy timings extrapolated (the earlier fit of
    per-layer and head times at T = 32 and 64 moved by 10x between runs on a
    quiet machine).  The cut-down model's size does not grow with the
    model's, so neither does the calibration's time or memory."""
    t0 = time.perf_counter()
    small = calibration_model(cfg)
    _micro_seconds(small)
    cut = _micro_seconds(small, repeat=2)
    micro = (
        train.micro_batch_size
        * cut
        * micro_flops(cfg, cfg.layers, cfg.seq_len)
        / micro_flops(small, small.layers, small.seq_len)
    )
    per_byte, hash_per_byte = _stream_seconds_per_byte()
    stream_bytes = c.bytes_moved - 3 * c.params * F32_BYTES * 2  # what the hash reads is timed apart
    seconds = (
        train.micro_batches * micro + per_byte * stream_bytes + hash_per_byte * 2 * 3 * c.params * F32_BYTES
    )  # the loaded and the new state hashed
    c.seconds = seconds
    c.calibration_s = time.perf_counter() - t0
    return c


def estimate(cfg: ModelConfig, train: TrainConfig, calibrated: bool = True) -> Cost:
    c = cost(cfg, train)
    return calibrate(cfg, train, c) if calibrated else c
