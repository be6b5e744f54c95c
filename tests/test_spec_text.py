"""Statements of the spec text that a clean-room implementer relies on,
checked against the reference: the recipe schema [step.recipe.keys.c1] (every
key, type, allowed value and omitted default), the recipe hash of
[step.recipe.c1] on the bytes it shows, the state names and data position of
[step.state.c1], the decayed parameters of [step.hparams.c1], adamw_update's
fixed hyper-parameters ([optim.adamw.c1]), the bf16 tied-gradient add
([bf16.tensors.c1]) and the x86 FTZ window of [num.flush.c1].  Each test
reads the text, so an edit of the text that no longer says what the code
does fails here."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import fields, replace

import numpy as np
import pytest

from refreplay import spec
from refreplay.conformance.base import deviant as fp
from refreplay.conformance.golden import steps
from refreplay.conformance.golden.store import VECTOR_DIR
from refreplay.numerics import core
from refreplay.ops import optim
from refreplay.training import model as tmodel
from refreplay.training import presets, run
from refreplay.training.data import Batching, Stream
from refreplay.training.step import no_decay_names, state_names

CLAUSES = spec.parse()
# optional model keys the schema lists ahead of the code that adds them (helper torch25: pos,
# norm_bias); once ModelConfig has them this set is a no-op
AHEAD = {"pos": "rope", "norm_bias": True}


def _schema():
    """section -> {key: description} from the table of [step.recipe.keys.c1]
    (section "" for the top-level key spec_version)."""
    out, section, last = {}, None, []
    for line in CLAUSES["step.recipe.keys.c1"].body:
        head = re.match(r"^    (model|train|data) \(", line)
        top = re.match(r"^    (spec_version) {2,}(\S.*)$", line)
        row = re.match(r"^      (\w+(?:, \w+)*) {2,}(\S.*)$", line)
        more = re.match(r"^ {22,}(\S.*)$", line)
        if head:
            section, last = head.group(1), []
            out[section] = {}
        elif top:
            section, last = "", [top.group(1)]
            out.setdefault("", {})[last[0]] = top.group(2)
        elif row and section:
            last = row.group(1).split(", ")
            for key in last:
                out[section][key] = row.group(2)
        elif more and section is not None:
            for key in last:
                out[section][key] += " " + more.group(1)
        else:
            section, last = None, []
    return out


SCHEMA = _schema()


def _kind(default) -> str:
    if isinstance(default, bool):
        return "boolean"
    if isinstance(default, (int, np.integer)):
        return "integer"
    if isinstance(default, np.float32):
        return "binary32"
    return "string"


def test_schema_lists_exactly_the_keys_of_the_code():
    model_keys = {f.name for f in fields(presets.ModelConfig)} | set(AHEAD)
    assert set(SCHEMA["model"]) == model_keys
    assert set(SCHEMA["train"]) == {f.name for f in fields(presets.TrainConfig)}
    tiny_m, tiny_t = presets.preset("tiny")
    hashed = run.Recipe(tiny_m, tiny_t, "0" * 64, 1, None, 1, "inproc", 1, 1, "0.4.0", "", "").hashed()
    assert set(SCHEMA[""]) | {"model", "train", "data"} == set(hashed)
    assert set(SCHEMA["data"]) == set(hashed["data"])


def test_schema_types_and_values_are_the_codes():
    allowed = {
        "norm": presets.NORMS,
        "mlp": presets.MLPS,
        "linear": presets.LINEARS,
        "precision": presets.PRECISIONS,
        "pos": getattr(presets, "POSITIONS", ("rope", "learned")),
    }
    for section, cls in (("model", presets.ModelConfig), ("train", presets.TrainConfig)):
        for f in fields(cls):
            text = SCHEMA[section][f.name]
            kind = _kind(f.default)
            if kind == "string":  # the values listed before any ";" are the allowed ones
                assert set(re.findall(r'"(\w+)"', text.split(";")[0])) == set(allowed[f.name]), (f.name, text)
            else:
                assert kind in text, (f.name, kind, text)
    assert set(re.findall(r'"(\w+)"', SCHEMA["model"]["pos"])) == set(allowed["pos"])
    assert "boolean" in SCHEMA["model"]["norm_bias"]


def test_optional_keys_and_their_omitted_values():
    optional = {k for k, v in SCHEMA["model"].items() if v.startswith("optional")}
    assert optional == set(presets.OPTIONAL) | set(AHEAD)
    assert not any(v.startswith("optional") for v in SCHEMA["train"].values())
    for key in optional:
        omitted = re.search(r"(\S+) \(omitted\)", SCHEMA["model"][key]).group(1)
        want = presets.OPTIONAL.get(key, AHEAD.get(key))
        assert json.loads(omitted) == want, key
        if key in presets.OPTIONAL:  # a key at its omitted value is not written ...
            cfg = presets.ModelConfig(**{key: want})
            assert key not in presets.model_to_json(cfg)
            # ... and a file that writes it hashes as one that does not
            written = {**presets.model_to_json(cfg), key: want}
            assert presets.model_to_json(presets.model_from_json(written)) == presets.model_to_json(cfg)


def test_unlisted_and_missing_keys_are_refused():
    tiny = presets.model_to_json(presets.preset("tiny")[0])
    with pytest.raises(presets.InputError, match="unknown field"):
        presets.model_from_json({**tiny, "dropout": 0})
    with pytest.raises(presets.InputError, match="missing field"):
        presets.model_from_json({k: v for k, v in tiny.items() if k != "width"})
    with pytest.raises(presets.InputError, match="integer"):
        presets.model_from_json({**tiny, "width": 32.0})


def test_a_binary32_is_hashed_in_its_0x_form():
    """[step.recipe.keys.c1] a reader may accept a JSON number; the hashed form is the bit pattern."""
    tiny = presets.model_to_json(presets.preset("tiny")[0])
    loose = {**tiny, "norm_eps": 1e-5, "init_std": tiny["init_std"].lower().replace("0x", "0X")}
    assert presets.model_to_json(presets.model_from_json(loose)) == tiny
    assert re.fullmatch(r"0x[0-9A-F]{8}", tiny["norm_eps"])


def test_the_recipe_example_is_what_the_trainer_hashes():
    """The bytes in the example of [step.recipe.c1] are the canonical JSON the
    trainer builds for the tiny preset, and the model object shown in
    [step.recipe.keys.c1] is the tiny preset's."""
    m, t = presets.preset("tiny")
    recipe = run.Recipe(m, t, "0" * 64, 31775, "tiny", 1, "inproc", 1000, 100, "0.4.0", "", "")
    ((_, expr, result),) = [e for e in CLAUSES["step.recipe.c1"].examples if "spec_version" in e[1]]
    text = re.fullmatch(r"run\.recipe_hash_of_json\('(.*)'\)", expr).group(1)
    assert run.canonical_json(recipe.hashed()).decode() == text
    assert result == f'"{recipe.sha256()}"'
    shown = [ln.strip() for ln in CLAUSES["step.recipe.keys.c1"].body if ln.strip().startswith('{"bias"')]
    assert shown == [run.canonical_json(presets.model_to_json(m)).decode()]


def test_the_case_hash_is_the_canonical_json_of_step_recipe():
    """[conf.steps.c1] the case hash: run.canonical_json of model, train and samples_sha256."""
    committed = json.loads((VECTOR_DIR / steps.STEPS_FILE).read_text())
    for c in committed["cases"]:
        raw = b"".join(bytes.fromhex(r) for r in c["samples"])
        body = {"model": c["model"], "train": c["train"], "samples_sha256": hashlib.sha256(raw).hexdigest()}
        assert run.recipe_hash_of_json(json.dumps(body)) == c["recipe_sha256"]


def test_data_position_is_floor_and_mod():
    """[step.state.c1] data.position of state n is (floor(n / E), n mod E); E = 2: (0, 1), (1, 0)."""
    text = " ".join(CLAUSES["step.state.c1"].text().split())
    assert "(floor(n / E), n mod E)" in text and "state 1 holds (0, 1) and state 2 holds (1, 0)" in text
    samples = np.zeros((10, 5), np.uint8)
    stream = Stream(samples, 7, Batching(2, 2))  # G = 4, E = 2
    assert stream.steps_per_epoch == 2
    for n in range(7):
        assert stream.position(n + 1) == (n // 2, n % 2)  # Trainer.data_position(n)


def test_quant_step_names_and_shapes():
    """[step.state.c1] one quant.step/<weight name> per QAT weight, [OC]."""
    for mlp, want_mlp in (("gelu", ["mlp.fc.w"]), ("swiglu", ["mlp.gate.w", "mlp.up.w"])):
        cfg = presets.ModelConfig(
            width=16,
            layers=2,
            heads=2,
            seq_len=8,
            mlp_hidden=24,
            mlp=mlp,
            linear="int8",
            bias=True,
            tied=False,
            norm="layer",
        ).validate()
        names = state_names(cfg)
        q = {k: v for k, v in names.items() if k.startswith("quant.step/")}
        weights = [f"h.{i:02d}.{w}" for i in range(2) for w in ["attn.qkv.w", "attn.proj.w", *want_mlp, "mlp.proj.w"]]
        assert sorted(q) == sorted("quant.step/" + w for w in weights)
        shapes = tmodel.param_shapes(cfg)
        assert all(q["quant.step/" + w] == ("F32", (shapes[w][0],)) for w in weights)
        assert names["data.position"] == ("I64", (2,)) and names["train.step"] == ("I64", (1,))
    text = " ".join(CLAUSES["step.state.c1"].text().split())
    assert "quant.step/h.00.attn.qkv.w" in text


def test_decayed_parameters_are_those_the_text_lists():
    """[step.hparams.c1] wte, wpe, head.w and every X.w decayed; norm weights and every bias not."""
    cfg = presets.ModelConfig(
        width=16,
        layers=2,
        heads=2,
        seq_len=8,
        mlp_hidden=24,
        mlp="swiglu",
        bias=True,
        tied=False,
        norm="layer",
        pos="learned",
    ).validate()
    params = {k: np.zeros(s, np.float32) for k, s in tmodel.param_shapes(cfg).items()}
    no_decay = no_decay_names(params)
    norm_names = {f"h.{i:02d}.{n}.{p}" for i in range(2) for n in ("ln1", "ln2") for p in "wb"} | {"lnf.w", "lnf.b"}
    assert no_decay == norm_names | {k for k in params if k.endswith(".b")}
    decayed = set(params) - no_decay
    assert decayed == {"wte", "wpe", "head.w"} | {k for k in params if k.endswith(".w") and k not in norm_names}
    text = " ".join(CLAUSES["step.hparams.c1"].text().split())
    assert "wte, wpe, head.w and every linear weight X.w" in text
    assert "the LayerNorm biases ln1.b, ln2.b, lnf.b and every linear bias X.b are not" in text


def test_adamw_update_hyper_parameters_on_the_op():
    """[optim.adamw.c1] the op's beta1, beta2, eps and wd, read from the text, are the
    reference's defaults (which the vectors' adamw_update uses)."""
    text = " ".join(CLAUSES["optim.adamw.c1"].text().split())
    got = {k: int(v, 16) for k, v in re.findall(r"(beta1|beta2|eps|wd) = f32\((0x[0-9A-F]{8})\)", text)}
    hp = optim.AdamW()
    bits = lambda x: int(np.array([x], np.float32).view(np.uint32)[0])  # noqa: E731
    assert got == {"beta1": bits(hp.beta1), "beta2": bits(hp.beta2), "eps": bits(hp.eps), "wd": bits(hp.weight_decay)}


def test_bf16_tied_gradient_is_a_binary32_add():
    """[bf16.tensors.c1] the tied wte gradient is num.add of two binary32
    gradients, not rounded to bf16: it has elements that are no bf16 value."""
    cfg = presets.ModelConfig(width=16, layers=1, heads=2, seq_len=8, mlp_hidden=32, precision="bf16").validate()
    m = tmodel.Model(cfg)
    params = m.working_params(tmodel.init_params(cfg, 3))
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(2, 8)).astype(np.int32)
    y = rng.integers(0, 256, size=(2, 8)).astype(np.int32)
    _, logits, ctx = m.forward(params, x, y)
    grads = m.backward(params, ctx)
    low = grads["wte"].view(np.uint32) & 0xFFFF
    assert np.any(low != 0)
    assert "it is not bf16_add" in " ".join(CLAUSES["bf16.tensors.c1"].text().split())


def test_x86_ftz_window_as_the_text_says():
    """[num.flush.c1] the spec keeps FLT_MIN where x86 FTZ (tininess on the
    unbounded rounding) and ARM FZ (before rounding) give 0, and x86 keeps
    what ARM flushes nearer FLT_MIN."""
    f = lambda b: np.array([b], np.uint32).view(np.float32)  # noqa: E731
    u = lambda x: int(np.asarray(x, np.float32).view(np.uint32).reshape(-1)[0])  # noqa: E731
    a, b = f(0xAB123191), f(0x14E0241F)
    assert u(core.mul(a[0], b[0])) == 0x80800000
    assert u(fp.mul_ftz_unbounded(a, b)) == 0x80000000 and u(fp.mul_ftz_before(a, b)) == 0x80000000
    a, b = f(0x00800001), f(0x3F7FFFFE)
    assert u(core.mul(a[0], b[0])) == 0x00800000 == u(fp.mul_ftz_unbounded(a, b))
    assert u(fp.mul_ftz_before(a, b)) == 0
    text = " ".join(CLAUSES["num.flush.c1"].text().split())
    assert "x86 judges tininess after rounding and ARM before" not in text
    assert "with an unbounded exponent, not on the IEEE result" in text


def _num(text: str) -> int:
    return 2 ** int(text[2:]) if text.startswith("2^") else int(text)


def _accepts(cls, base, key, value) -> bool:
    try:
        cls(**{**{f.name: getattr(base, f.name) for f in fields(cls)}, key: value}).validate()
        return True
    except presets.InputError:
        return False


@pytest.mark.parametrize("section", ["model", "train"])
def test_schema_ranges_are_the_validation(section):
    """Every range the schema states is the one the reference enforces: the
    bounds are accepted, one past each is refused."""
    cls = presets.ModelConfig if section == "model" else presets.TrainConfig
    base = presets.preset("tiny")[0] if section == "model" else replace(presets.preset("tiny")[1], warmup_steps=0)
    checked = 0
    for key, text in SCHEMA[section].items():
        if key not in {f.name for f in fields(cls)} or "multiple" in text or "even" in text:
            continue
        m = re.match(r"integer in \[(\S+), (\S+?)([\])])", text)
        if m:
            lo = _num(m.group(1))
            hi = (
                getattr(base, m.group(2)) - 1
                if m.group(2) == "schedule_steps"
                else _num(m.group(2)) - (m.group(3) == ")")
            )
            assert _accepts(cls, base, key, lo) and _accepts(cls, base, key, hi), (key, lo, hi)
            assert not _accepts(cls, base, key, lo - 1) and not _accepts(cls, base, key, hi + 1), (key, lo, hi)
            checked += 1
        elif text.startswith("binary32"):
            tiny = np.float32(2.0**-126)
            assert not _accepts(cls, base, key, np.float32(np.inf)) and not _accepts(cls, base, key, -tiny)
            assert _accepts(cls, base, key, np.float32(0)) == ("> 0" not in text), key
            if "< 1" in text:
                assert not _accepts(cls, base, key, np.float32(1)) and _accepts(
                    cls, base, key, np.nextafter(np.float32(1), np.float32(0))
                )
            checked += 1
    assert checked == (6 if section == "model" else 12)
