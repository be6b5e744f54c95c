"""Configuration records of a training run and the named presets.

``ModelConfig`` is the architecture ([model.config.c1]); ``TrainConfig`` the
batch geometry, seed and optimizer hyper-parameters ([step.hparams.c1]).
Every float hyper-parameter is a binary32 value; in a recipe it is written as
its bit pattern ("0x3B03126F"), so no decimal conversion decides a bit.

Presets:
  tiny       a step well under a second on one laptop core: for tests and demos
  small      a few million parameters: for benchmarks
  gpt2-124m  GPT-2 small's shape (123.7 M parameters: no learned positions,
             rotary instead), V = 50,304 (GPT-2's 50,257 padded): real data
  gpt2-xl    GPT-2 XL's shape (1.56 B parameters), the scale of the paper's
             1.61 B model: an auditor's replay within a memory budget
The two GPT-2 shapes train on token files (``train --tokens``), which set
the vocabulary ([data.vocab.c1]).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import numpy as np

from ..errors import InputError

F32 = np.float32

NORMS = ("rms", "layer")
MLPS = ("gelu", "swiglu")
LINEARS = ("fp32", "int8")
PRECISIONS = ("fp32", "bf16")  # [bf16.precision.c1]
POSITIONS = ("rope", "learned")  # [model.pos.c1]
# Fields a recipe may leave out, and the value that means: a field at this
# value is never written, so recipes (and their hashes) made before the field
# existed are unchanged ([bf16.precision.c1] [model.pos.c1] [norm.layer.nobias.c1]).
OPTIONAL = {"precision": "fp32", "pos": "rope", "norm_bias": True}


def f32_hex(x) -> str:
    """The bit pattern of a binary32 as "0xXXXXXXXX"."""
    return f"0x{int(np.array([x], dtype=F32).view(np.uint32)[0]):08X}"


def f32_from(value, what: str) -> np.float32:
    """A binary32 from a recipe field: "0x" + 8 hex digits (exact), or a JSON
    number, taken as the nearest binary32 (config files written by hand)."""
    if isinstance(value, str):
        s = value.strip()
        if len(s) == 10 and s[:2] in ("0x", "0X"):
            try:
                return np.array([int(s, 16)], dtype=np.uint32).view(F32)[0]
            except ValueError:
                pass
        raise InputError(f"{what}: expected a binary32 bit pattern like 0x3F800000, got {value!r}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return F32(value)
    raise InputError(f"{what}: expected a number or a 0x bit pattern, got {value!r}")


@dataclass(frozen=True)
class ModelConfig:
    """[model.config.c1] The architecture of the GPT-style decoder."""

    vocab: int = 256  # V
    width: int = 64  # C
    layers: int = 2
    heads: int = 4  # NH; head size HS = C / NH (even, for rotary pairs)
    seq_len: int = 32  # T
    mlp_hidden: int = 256  # F
    norm: str = "rms"  # "rms" or "layer"
    mlp: str = "gelu"  # "gelu" or "swiglu"
    tied: bool = True  # output head shares the embedding matrix
    linear: str = "fp32"  # "fp32" or "int8" (quantization-aware)
    bias: bool = False  # linear layers carry a bias
    rope_theta: np.float32 = F32(10000.0)
    norm_eps: np.float32 = F32(1e-5)
    init_std: np.float32 = F32(0.02)
    precision: str = "fp32"  # "fp32" or "bf16": the mixed-precision profile ([bf16.precision.c1])
    pos: str = "rope"  # "rope" (rotary) or "learned" (a parameter wpe [T, C]) ([model.pos.c1])
    norm_bias: bool = True  # LayerNorm carries a bias; False: bias -0 ([norm.layer.nobias.c1])

    def validate(self) -> "ModelConfig":
        def need(cond, msg):
            if not cond:
                raise InputError(f"model config: {msg}")

        for name in ("vocab", "width", "layers", "heads", "seq_len", "mlp_hidden"):
            v = getattr(self, name)
            need(
                isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 1 << 20,
                f"{name} must be an integer in [1, 2^20], got {v!r}",
            )
        need(self.vocab % 64 == 0, "vocab must be a multiple of 64 (the padded vocabulary, [data.vocab.c1])")
        need(self.width % self.heads == 0, f"width {self.width} is not a multiple of heads {self.heads}")
        need(self.pos in POSITIONS, f"pos must be one of {POSITIONS}, got {self.pos!r}")
        need(
            self.pos != "rope" or (self.width // self.heads) % 2 == 0,
            'head size width/heads must be even (rotary pairs) under pos "rope"',
        )
        need(self.norm in NORMS, f"norm must be one of {NORMS}, got {self.norm!r}")
        need(self.mlp in MLPS, f"mlp must be one of {MLPS}, got {self.mlp!r}")
        need(self.linear in LINEARS, f"linear must be one of {LINEARS}, got {self.linear!r}")
        need(self.precision in PRECISIONS, f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        need(
            not (self.precision == "bf16" and self.linear == "int8"),
            'precision "bf16" cannot be combined with linear "int8" ([bf16.ops.c1])',
        )
        need(
            isinstance(self.tied, bool) and isinstance(self.bias, bool) and isinstance(self.norm_bias, bool),
            "tied, bias and norm_bias must be booleans",
        )
        need(
            self.norm_bias or self.norm == "layer",
            'norm_bias false is a LayerNorm setting: norm "rms" has no bias ([norm.layer.nobias.c1])',
        )
        for name in ("rope_theta", "norm_eps", "init_std"):
            v = getattr(self, name)
            need(
                isinstance(v, np.float32) and np.isfinite(v) and v > 0,
                f"{name} must be a positive finite binary32, got {v!r}",
            )
        return self

    @property
    def head_size(self) -> int:
        return self.width // self.heads


@dataclass(frozen=True)
class TrainConfig:
    """[step.hparams.c1] Seed, batch geometry and optimizer hyper-parameters."""

    seed: int = 0
    micro_batches: int = 8  # M
    micro_batch_size: int = 4  # B
    lr: np.float32 = F32(3e-3)
    min_lr: np.float32 = F32(3e-4)
    warmup_steps: int = 10
    schedule_steps: int = 1000  # steps over which the rate decays to min_lr
    beta1: np.float32 = F32(0.9)
    beta2: np.float32 = F32(0.95)
    eps: np.float32 = F32(1e-8)
    weight_decay: np.float32 = F32(0.1)
    clip_norm: np.float32 = F32(1.0)

    def validate(self) -> "TrainConfig":
        def need(cond, msg):
            if not cond:
                raise InputError(f"train config: {msg}")

        need(
            isinstance(self.seed, int) and not isinstance(self.seed, bool) and 0 <= self.seed < 1 << 64,
            f"seed must be an integer in [0, 2^64), got {self.seed!r}",
        )
        for name in ("micro_batches", "micro_batch_size", "schedule_steps"):
            v = getattr(self, name)
            need(
                isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 1 << 24,
                f"{name} must be an integer in [1, 2^24], got {v!r}",
            )
        need(
            isinstance(self.warmup_steps, int)
            and not isinstance(self.warmup_steps, bool)
            and 0 <= self.warmup_steps < self.schedule_steps,
            f"warmup_steps must be an integer in [0, schedule_steps), got {self.warmup_steps!r}",
        )
        for name in ("lr", "min_lr", "beta1", "beta2", "eps", "weight_decay", "clip_norm"):
            v = getattr(self, name)
            need(
                isinstance(v, np.float32) and np.isfinite(v) and v >= 0,
                f"{name} must be a non-negative finite binary32, got {v!r}",
            )
        need(self.beta1 < 1 and self.beta2 < 1, "beta1 and beta2 must be below 1")
        need(self.eps > 0 and self.lr > 0, "eps and lr must be positive")
        return self


PRESETS = {
    "tiny": (
        ModelConfig(width=32, layers=2, heads=2, seq_len=32, mlp_hidden=128),
        TrainConfig(micro_batches=8, micro_batch_size=2),
    ),
    "small": (
        ModelConfig(width=256, layers=4, heads=8, seq_len=128, mlp_hidden=1024),
        TrainConfig(micro_batches=8, micro_batch_size=4, lr=F32(1e-3), min_lr=F32(1e-4)),
    ),
    "gpt2-124m": (
        ModelConfig(
            vocab=50304,
            width=768,
            layers=12,
            heads=12,
            seq_len=1024,
            mlp_hidden=3072,
            norm="layer",
            mlp="gelu",
            tied=True,
            bias=True,
        ),
        TrainConfig(micro_batches=8, micro_batch_size=1, lr=F32(6e-4), min_lr=F32(6e-5)),
    ),
    "gpt2-xl": (
        ModelConfig(
            vocab=50304,
            width=1600,
            layers=48,
            heads=25,
            seq_len=1024,
            mlp_hidden=6400,
            norm="layer",
            mlp="gelu",
            tied=True,
            bias=True,
        ),
        TrainConfig(micro_batches=8, micro_batch_size=1, lr=F32(2e-4), min_lr=F32(2e-5)),
    ),
}


def preset(name: str) -> tuple[ModelConfig, TrainConfig]:
    if name not in PRESETS:
        raise InputError(f"unknown preset {name!r}; known presets: {', '.join(sorted(PRESETS))}")
    return PRESETS[name]


def _to_json(cfg) -> dict:
    out = {}
    for k, v in asdict(cfg).items():
        out[k] = f32_hex(v) if isinstance(v, np.float32) else v
    return out


def model_to_json(cfg: ModelConfig) -> dict:
    """[bf16.precision.c1] A field at its OPTIONAL value is left out, so a
    binary32 recipe's bytes are those of a recipe that never had it."""
    return {k: v for k, v in _to_json(cfg).items() if OPTIONAL.get(k, object()) != v}


def train_to_json(cfg: TrainConfig) -> dict:
    return _to_json(cfg)


def _from_json(cls, obj, what: str, partial: bool = False):
    if not isinstance(obj, dict):
        raise InputError(f"{what} must be a JSON object")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(obj) - set(known))
    if unknown:
        raise InputError(f"{what}: unknown field(s) {', '.join(unknown)}")
    missing = sorted(set(known) - set(obj) - set(OPTIONAL))
    if missing and not partial:
        raise InputError(f"{what}: missing field(s) {', '.join(missing)}")
    kw = {}
    for k, v in obj.items():
        default = known[k].default
        if isinstance(default, np.float32):
            kw[k] = f32_from(v, f"{what}.{k}")
        elif isinstance(default, bool):
            if not isinstance(v, bool):
                raise InputError(f"{what}.{k}: expected true or false, got {v!r}")
            kw[k] = v
        elif isinstance(default, int):
            if isinstance(v, bool) or not isinstance(v, int):
                raise InputError(f"{what}.{k}: expected an integer, got {v!r}")
            kw[k] = v
        else:
            if not isinstance(v, str):
                raise InputError(f"{what}.{k}: expected a string, got {v!r}")
            kw[k] = v
    return cls(**kw)


def model_from_json(obj, what: str = "model", partial: bool = False, base=None) -> ModelConfig:
    cfg = _from_json(ModelConfig, obj, what, partial)
    if partial and base is not None:
        cfg = ModelConfig(**{**asdict(base), **{k: getattr(cfg, k) for k in obj}})
    return cfg.validate()


def train_from_json(obj, what: str = "train", partial: bool = False, base=None) -> TrainConfig:
    cfg = _from_json(TrainConfig, obj, what, partial)
    if partial and base is not None:
        cfg = TrainConfig(**{**asdict(base), **{k: getattr(cfg, k) for k in obj}})
    return cfg.validate()
