"""Golden training steps ([conf.steps.c1]): whole steps of small models, with
the state root, loss, data hash and chain link of each, in
``vectors/steps.json``.

The op vectors pin every op; these pin their composition: the model's op
order ([model.forward.c1], [model.backward.c1]), the data stream
([data.stream.c1]), TreeFold over micro-batches and ranks ([fold.tree.c1],
[fold.ranks.c1]), clipping and AdamW ([optim.clip.c1], [optim.adamw.c1]),
re-pinned int8 step sizes ([model.quant.c1]), the bf16 profile's rounding
points ([bf16.tensors.c1]) and the state hash and chain
([state.root.c1], [state.chain.c2]).  A training stack that claims to
implement the spec reproduces every record from the case's configuration and
samples alone.

``generate()`` builds the file from the reference (byte for byte, like the
op vectors, [conf.verify.c1]); ``check()`` recomputes every record from the
file's own samples on a device and rank count and names the first record
that differs.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ...errors import InputError
from ...training.presets import (
    ModelConfig,
    TrainConfig,
    model_from_json,
    model_to_json,
    preset,
    train_from_json,
    train_to_json,
)

FORMAT = "refreplay-steps/1"
STEPS_FILE = "steps.json"
SEED = 20261129


@dataclass(frozen=True)
class StepCase:
    name: str
    model: ModelConfig
    train: TrainConfig
    steps: int
    samples: int  # N samples of T+1 tokens


def _cases() -> tuple[StepCase, ...]:
    tiny_m, tiny_t = preset("tiny")
    variant_m = ModelConfig(
        width=16,
        layers=2,
        heads=2,
        seq_len=8,
        mlp_hidden=48,
        norm="layer",
        mlp="swiglu",
        tied=False,
        linear="int8",
        bias=True,
    )
    variant_t = TrainConfig(seed=7, micro_batches=6, micro_batch_size=2, warmup_steps=1, schedule_steps=4)
    return (
        # the `tiny` preset: RMSNorm, GELU, tied head, fp32; 8 micro-batches of 2
        StepCase("tiny", tiny_m, replace(tiny_t, warmup_steps=1, schedule_steps=3).validate(), 3, 40),
        # every other branch: LayerNorm, SwiGLU, untied head, biases, int8 QAT;
        # M = 6 is no power of two, and 24 samples make step 3 start epoch 1
        StepCase("layer-swiglu-int8", variant_m.validate(), variant_t.validate(), 3, 24),
        # the `tiny` preset in the bf16 profile ([bf16.precision.c1]): bf16 working
        # copies, activations and activation gradients; binary32 masters and moments
        StepCase(
            "tiny-bf16",
            replace(tiny_m, precision="bf16").validate(),
            replace(tiny_t, warmup_steps=1, schedule_steps=3).validate(),
            3,
            40,
        ),
        # the step clauses the others leave open: M = 7 leaves blocks of 4, 2 and 1
        # on the stack, so the final fold's direction decides bits ([fold.final.c1]);
        # 1/7 is inexact, so the mean's recip(M) multiply differs from a division
        # ([fold.scale.c1]) and the folded loss from a sum in order ([step.loss.c1]);
        # max_norm 0.25 lies below every step's gradient norm, so clipping engages
        # ([optim.clip.c1])
        StepCase(
            "tiny-m7-clip",
            tiny_m,
            replace(
                tiny_t,
                seed=11,
                micro_batches=7,
                micro_batch_size=2,
                warmup_steps=1,
                schedule_steps=3,
                clip_norm=np.float32(0.25),
            ).validate(),
            3,
            36,
        ),
    )


CASES = _cases()


def _samples(case: StepCase) -> np.ndarray:
    """The case's tokens: NumPy PCG64 seeded with (SEED, crc32 of the name),
    as every generated input ([conf.verify.c1]); stored in the file."""
    g = np.random.Generator(np.random.PCG64([SEED, zlib.crc32(case.name.encode())]))
    return g.integers(0, 256, size=(case.samples, case.model.seq_len + 1), dtype=np.uint8)


def recipe_sha256(model: ModelConfig, train: TrainConfig, samples: np.ndarray) -> str:
    """[conf.steps.c1] The recipe hash a case's chain binds (its case hash):
    SHA-256 of the canonical JSON ([step.recipe.c1]) of {"model", "train",
    "samples_sha256"}, "model" and "train" with the keys, types and omitted
    defaults of [step.recipe.keys.c1] (``model_to_json``, ``train_to_json``)."""
    body = {
        "model": model_to_json(model),
        "train": train_to_json(train),
        "samples_sha256": hashlib.sha256(np.ascontiguousarray(samples).tobytes()).hexdigest(),
    }
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def run_case(
    model: ModelConfig, train: TrainConfig, samples: np.ndarray, steps: int, ranks: int = 1, device=None
) -> list[dict]:
    """The records of steps 0..steps of one case, computed on ``device`` with
    ``ranks`` in-process ranks."""
    from ...training.data import Batching, Stream
    from ...training.launch.inproc import InProcess
    from ...training.step import Trainer

    stream = Stream(samples, train.seed, Batching(train.micro_batches, train.micro_batch_size))
    trainer = Trainer(model, train, stream, recipe_sha256(model, train, samples), device)
    st = trainer.initial_state()
    rec = trainer.initial_record(st)
    out = [{"step": 0, "state_root": rec.state_root}]
    launcher = InProcess(ranks)
    for _ in range(steps):
        st, rec = trainer.step(st, rec.chain_link, launcher)
        out.append(
            {
                "step": rec.step,
                "state_root": rec.state_root,
                "data_hash": rec.data_hash,
                "loss": rec.loss_hex(),
                "chain_link": rec.chain_link,
            }
        )
    return out


def generate() -> bytes:
    """[conf.steps.c1] The bytes of vectors/steps.json, from the reference."""
    cases = []
    for case in CASES:
        samples = _samples(case)
        cases.append(
            {
                "name": case.name,
                "model": model_to_json(case.model),
                "train": train_to_json(case.train),
                "samples": [bytes(row).hex() for row in samples],
                "recipe_sha256": recipe_sha256(case.model, case.train, samples),
                "records": run_case(case.model, case.train, samples, case.steps),
            }
        )
    return (json.dumps({"format": FORMAT, "cases": cases}, indent=1, sort_keys=True) + "\n").encode()


@dataclass(frozen=True)
class Loaded:
    name: str
    model: ModelConfig
    train: TrainConfig
    samples: np.ndarray
    recipe_sha256: str
    records: list


def load(path: Path) -> list[Loaded]:
    """The cases of a steps file; InputError naming what is malformed (a
    "model" or "train" key, type or value outside [step.recipe.keys.c1])."""
    from ... import untrusted

    obj = untrusted.load_json(path, what="steps file")
    if not isinstance(obj, dict) or obj.get("format") != FORMAT or not isinstance(obj.get("cases"), list):
        raise InputError(f"{path}: not a {FORMAT} file")
    out = []
    for i, c in enumerate(obj["cases"]):
        where = f"{path}: case {i}"
        try:
            model = model_from_json(c["model"], f"{where}: model")
            train = train_from_json(c["train"], f"{where}: train")
            rows = [bytes.fromhex(r) for r in c["samples"]]
            if not rows or any(len(r) != model.seq_len + 1 for r in rows):
                raise InputError(f"{where}: every sample must hold seq_len + 1 = {model.seq_len + 1} tokens")
            samples = np.frombuffer(b"".join(rows), dtype=np.uint8).reshape(len(rows), -1).copy()
            records = c["records"]
            if not isinstance(records, list) or [r.get("step") for r in records] != list(range(len(records))):
                raise InputError(f"{where}: records must be steps 0, 1, 2, ... in order")
            out.append(Loaded(str(c["name"]), model, train, samples, str(c["recipe_sha256"]), records))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            if isinstance(exc, InputError):
                raise
            raise InputError(f"{where}: malformed ({exc!r})") from None
    return out


def check(path: Path, ranks=(1,), device=None) -> tuple[int, list[str]]:
    """[conf.steps.c1] Recompute every case of ``path`` from its samples with
    each rank count of ``ranks`` on ``device``.  Returns (records checked,
    problems), each problem naming the case, the rank count, the step and
    the first field that differs."""
    problems, checked = [], 0
    for case in load(path):
        want_recipe = recipe_sha256(case.model, case.train, case.samples)
        if want_recipe != case.recipe_sha256:
            problems.append(
                f"{case.name}: recipe_sha256 is {case.recipe_sha256}, the configuration and samples give {want_recipe}"
            )
            continue
        for r in ranks:
            if r > case.train.micro_batches:
                continue
            got = run_case(case.model, case.train, case.samples, len(case.records) - 1, r, device)
            for want, have in zip(case.records, got):
                checked += 1
                for key in ("state_root", "loss", "data_hash", "chain_link"):
                    if want.get(key) != have.get(key):
                        problems.append(
                            f"{case.name}, {r} rank(s): step {want['step']}: {key} is "
                            f"{have.get(key)}, expected {want.get(key)}"
                        )
                        break
                else:
                    continue
                break  # later steps follow from the first difference
    return checked, problems
