"""The bf16 profile in the trainer ([bf16.precision.c1], [bf16.tensors.c1],
[bf16.ops.c1], [bf16.optim.c1]).

1. The model's bf16 forward and backward equal a composition of the
   profile's ops (``ops.bf16.apply``: bf16 tensors as uint16 bits, each op
   widening its inputs and rounding its outputs once) written here op by op,
   on two configurations that between them take every branch; the binary32
   model gives other bits (so the rounding points are really there).
2. The recipe field: absent for fp32 (the recipe bytes and hash of a recipe
   that never had it), "bf16" recorded, anything else refused, bf16 with
   int8 refused with exit 2.
3. A bf16 `tiny` run on 1 and 3 ranks publishes the same hashes; replay and
   audit verify it; a run whose recipe says fp32, or with a bit flipped in a
   checkpoint, is a mismatch (exit 1).
"""

import dataclasses
import hashlib
import json
import shutil

import numpy as np
import pytest

from refreplay.training import presets
from refreplay.training.model import Model, init_params
from refreplay.numerics import bf16 as B
from refreplay.ops import bf16 as OB
from refreplay.ops import linear, rope
from refreplay.training.presets import ModelConfig
from refreplay.training.run import open_run

import auditor_keys
from cli_helpers import run_cli

pytestmark = pytest.mark.usefixtures("one_numba_thread")

# ---- 1. the model against the profile's ops, composed here -------------------------------------

SMALL = ModelConfig(vocab=64, width=8, layers=1, heads=2, seq_len=4, mlp_hidden=16, precision="bf16")
VARIANT = dataclasses.replace(SMALL, norm="layer", mlp="swiglu", tied=False, bias=True)


def _heads(x, j, Bn, T, NH, HS):
    """Part j of rows [N, W] as heads [B, NH, T, HS] (any dtype: bits move exactly)."""
    C = NH * HS
    return np.ascontiguousarray(
        x.reshape(Bn, T, -1)[:, :, j * C : (j + 1) * C].reshape(Bn, T, NH, HS).transpose(0, 2, 1, 3)
    )


def _rows(parts, Bn, T):
    return np.concatenate([p.transpose(0, 2, 1, 3).reshape(Bn * T, -1) for p in parts], axis=1)


def _lin_f(x, P, name, bias):
    if bias:
        return OB.apply("linear_forward", x, P[f"{name}.w"], P[f"{name}.b"])
    return OB.call(linear.linear_forward, "hh", "h", x, P[f"{name}.w"])


def _lin_b(dy, x, P, name, bias, grads):
    dx, dw, db = OB.apply("linear_backward", dy, x, P[f"{name}.w"])
    grads[f"{name}.w"] = dw
    if bias:
        grads[f"{name}.b"] = db
    return dx


def _norm_f(cfg, x, P, name):
    if cfg.norm == "rms":
        out, rrms = OB.apply("rmsnorm_forward", x, P[f"{name}.w"])
        return out, (rrms,)
    out, mean, rstd = OB.apply("layernorm_forward", x, P[f"{name}.w"], P[f"{name}.b"])
    return out, (mean, rstd)


def _norm_b(cfg, dout, x, P, name, saved, grads):
    if cfg.norm == "rms":
        dx, dw = OB.apply("rmsnorm_backward", dout, x, P[f"{name}.w"], *saved)
    else:
        dx, dw, db = OB.apply("layernorm_backward", dout, x, P[f"{name}.w"], *saved)
        grads[f"{name}.b"] = db
    grads[f"{name}.w"] = dw
    return dx


def compose(cfg, P, tokens, targets):
    """The forward and backward of [model.forward.c1] / [model.backward.c1],
    every op through ops.bf16 ([bf16.ops.c1]); P: the parameters as bf16
    bits.  -> (mean loss, logits bits, parameter gradients)."""
    Bn, T = tokens.shape
    NH, HS, C = cfg.heads, cfg.head_size, cfg.width
    cos, sin = rope.rope_tables(T, HS, cfg.rope_theta)
    bias = cfg.bias
    h0 = OB.apply("embedding_forward", P["wte"], tokens).reshape(Bn * T, C)
    n1, s1 = _norm_f(cfg, h0, P, "h.00.ln1")
    qkv = _lin_f(n1, P, "h.00.attn.qkv", bias)
    q = OB.apply("rope_forward", _heads(qkv, 0, Bn, T, NH, HS), cos, sin)
    k = OB.apply("rope_forward", _heads(qkv, 1, Bn, T, NH, HS), cos, sin)
    v = _heads(qkv, 2, Bn, T, NH, HS)
    o, att = OB.apply("attention_forward", q, k, v)
    om = _rows([o], Bn, T)
    a = _lin_f(om, P, "h.00.attn.proj", bias)
    h1 = OB.apply("add", h0, a)
    n2, s2 = _norm_f(cfg, h1, P, "h.00.ln2")
    if cfg.mlp == "gelu":
        u = _lin_f(n2, P, "h.00.mlp.fc", bias)
        g = OB.apply("gelu_forward", u)
    else:
        ga = _lin_f(n2, P, "h.00.mlp.gate", bias)
        up = _lin_f(n2, P, "h.00.mlp.up", bias)
        g = OB.apply("swiglu_forward", ga, up)
    m = _lin_f(g, P, "h.00.mlp.proj", bias)
    h2 = OB.apply("add", h1, m)
    nf, sf = _norm_f(cfg, h2, P, "lnf")
    head = P["wte"] if cfg.tied else P["head.w"]
    logits = OB.call(linear.linear_forward, "hh", "h", nf, head)
    y = targets.reshape(-1)
    _, mean = OB.apply("cross_entropy_forward", logits, y)

    grads = {}
    dlogits = OB.apply("cross_entropy_backward", logits, y)
    dnf, dhead, _ = OB.apply("linear_backward", dlogits, nf, head)
    dh = _norm_b(cfg, dnf, h2, P, "lnf", sf, grads)
    dg = _lin_b(dh, g, P, "h.00.mlp.proj", bias, grads)
    if cfg.mlp == "gelu":
        du = OB.apply("gelu_backward", dg, u)
        dn2 = _lin_b(du, n2, P, "h.00.mlp.fc", bias, grads)
    else:
        dga, dup = OB.apply("swiglu_backward", dg, ga, up)
        dn2 = OB.apply(
            "add", _lin_b(dga, n2, P, "h.00.mlp.gate", bias, grads), _lin_b(dup, n2, P, "h.00.mlp.up", bias, grads)
        )
    dh = OB.apply("add", dh, _norm_b(cfg, dn2, h1, P, "h.00.ln2", s2, grads))
    do = _lin_b(dh, om, P, "h.00.attn.proj", bias, grads)
    dq, dk, dv = OB.apply("attention_backward", _heads(do, 0, Bn, T, NH, HS), q, k, v, att)
    dq = OB.apply("rope_backward", dq, cos, sin)
    dk = OB.apply("rope_backward", dk, cos, sin)
    dn1 = _lin_b(_rows([dq, dk, dv], Bn, T), n1, P, "h.00.attn.qkv", bias, grads)
    dh = OB.apply("add", dh, _norm_b(cfg, dn1, h0, P, "h.00.ln1", s1, grads))
    dwte = OB.apply("embedding_backward", dh.reshape(Bn, T, C), tokens, np.array([cfg.vocab], np.int32))
    if cfg.tied:  # a parameter gradient: the binary32 add, no rounding
        grads["wte"] = OB.FP32["add"](dwte, dhead)
    else:
        grads["wte"], grads["head.w"] = dwte, dhead
    return mean[0], logits, grads


def _batch(cfg, seed):
    g = np.random.default_rng(seed)
    tok = g.integers(0, cfg.vocab, size=(2, cfg.seq_len + 1)).astype(np.int32)
    return np.ascontiguousarray(tok[:, :-1]), np.ascontiguousarray(tok[:, 1:])


def _bits(a):
    return np.asarray(a, np.float32).view(np.uint32)


@pytest.mark.parametrize("cfg", [SMALL, VARIANT], ids=["rms-gelu-tied", "layer-swiglu-untied-bias"])
def test_model_equals_the_profiles_ops_composed(cfg):
    params = init_params(cfg, 3)
    params = {
        k: (v + np.float32(0.01) * (np.arange(v.size, dtype=np.float32).reshape(v.shape) % 7)).astype(np.float32)
        for k, v in params.items()
    }  # non-trivial norm weights and biases
    tokens, targets = _batch(cfg, 4)
    model = Model(cfg)
    work = model.working_params(params)
    for k in params:  # [bf16.tensors.c1] each working copy is the round of its master
        assert np.array_equal(_bits(work[k]), _bits(B.round_f32(params[k]))), k
    assert not all(np.array_equal(_bits(work[k]), _bits(params[k])) for k in params)
    mean, logits, ctx = model.forward(work, tokens, targets)
    grads = model.backward(work, ctx)

    P = {k: B.encode(params[k]) for k in params}
    want_mean, want_logits, want_grads = compose(cfg, P, tokens, targets)
    assert _bits(mean) == _bits(want_mean)
    assert np.array_equal(_bits(logits), _bits(B.decode(want_logits)))
    assert sorted(grads) == sorted(want_grads)
    for k in grads:  # parameter gradients: binary32, not rounded
        assert np.array_equal(_bits(grads[k]), _bits(want_grads[k])), k
    assert any(np.any(_bits(B.round_f32(grads[k])) != _bits(grads[k])) for k in grads)

    # the binary32 model on the same working copies computes other bits
    m32 = Model(dataclasses.replace(cfg, precision="fp32"))
    assert m32.working_params(params) is params
    mean32, logits32, _ = m32.forward(work, tokens, targets)
    assert not np.array_equal(_bits(logits32), _bits(logits))


def test_ops_and_model_agree_that_rounding_is_once():
    """A mutant that rounds an attention probability ([bf16.ops.c1] forbids it)
    changes the composed result: the comparison above can fail."""
    cfg = SMALL
    params = init_params(cfg, 3)
    tokens, targets = _batch(cfg, 4)
    P = {k: B.encode(params[k]) for k in params}
    base = compose(cfg, P, tokens, targets)
    keep = OB.FP32["attention_forward"]
    try:
        OB.FP32["attention_forward"] = lambda q, k, v: (lambda o, a: (o, B.round_f32(a)))(*keep(q, k, v))
        mutant = compose(cfg, P, tokens, targets)
    finally:
        OB.FP32["attention_forward"] = keep
    assert any(not np.array_equal(_bits(base[2][k]), _bits(mutant[2][k])) for k in base[2])


# ---- 2. the recipe field -------------------------------------------------------------------------


def test_fp32_recipes_do_not_carry_the_field():
    """[bf16.precision.c1] an fp32 model's JSON has no "precision"; the JSON
    without it and with "fp32" read back as the same config."""
    m, _ = presets.preset("tiny")
    js = presets.model_to_json(m)
    assert "precision" not in js
    assert presets.model_from_json(js) == m
    assert presets.model_from_json({**js, "precision": "fp32"}) == m
    b = presets.model_from_json({**js, "precision": "bf16"})
    assert b.precision == "bf16" and presets.model_to_json(b)["precision"] == "bf16"


@pytest.mark.parametrize("value", ["bf16 ", "BF16", "fp16", "tf32", 16, None, True])
def test_other_precisions_are_refused(value):
    m, _ = presets.preset("tiny")
    with pytest.raises(presets.InputError):
        presets.model_from_json({**presets.model_to_json(m), "precision": value})


def test_bf16_with_int8_is_refused(tmp_path):
    with pytest.raises(presets.InputError, match="int8"):
        dataclasses.replace(SMALL, linear="int8").validate()
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"preset": "tiny", "model": {"linear": "int8", "precision": "bf16"}}))
    res = run_cli("train", "--config", cfg, "--steps", 1, "--out", tmp_path / "r", "--quiet")
    assert res.returncode == 2 and "int8" in res.stderr, res.stderr
    with pytest.raises(SystemExit) as exc:  # argparse's usage error
        run_cli("train", "--preset", "tiny", "--precision", "fp16", "--steps", 1, "--out", tmp_path / "r2")
    assert exc.value.code == 2


# ---- 3. runs: rank-count invariance, replay, audit, tampering ------------------------------------

STEPS = 2


def _train(path, ranks):
    res = run_cli(
        "train",
        "--preset",
        "tiny",
        "--precision",
        "bf16",
        "--steps",
        STEPS,
        "--ranks",
        ranks,
        "--out",
        path,
        "--byte-cap",
        1 << 15,
        "--checkpoint-every",
        1,
        "--quiet",
    )
    assert res.returncode == 0, res.stdout + res.stderr
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("bf16runs")
    return _train(base / "r1", 1), _train(base / "r3", 3)


def test_bf16_run_is_rank_count_invariant(runs):
    a, b = (open_run(p) for p in runs)
    assert a.recipe.model.precision == "bf16"
    assert [(r.state_root, r.chain_link, r.loss_hex()) for r in a.records] == [
        (r.state_root, r.chain_link, r.loss_hex()) for r in b.records
    ]
    assert a.recipe.ranks == 1 and b.recipe.ranks == 3


def test_bf16_differs_from_fp32(runs, tmp_path):
    res = run_cli("train", "--preset", "tiny", "--steps", 1, "--out", tmp_path / "f", "--byte-cap", 1 << 15, "--quiet")
    assert res.returncode == 0, res.stderr
    f, b = open_run(tmp_path / "f"), open_run(runs[0])
    assert f.records[0].state_root == b.records[0].state_root  # state 0 is the masters: the same
    assert f.records[1].state_root != b.records[1].state_root
    assert "precision" not in json.loads((tmp_path / "f" / "recipe.json").read_text())["recipe"]["model"]


def test_bf16_run_replays_and_audits(runs, tmp_path):
    res = run_cli("replay", runs[1], "--step", STEPS)
    assert res.returncode == 0 and f"VERIFIED: step {STEPS}" in res.stdout, res.stdout + res.stderr
    res = run_cli(
        "audit",
        runs[0],
        "--sample",
        1,
        "--beacon",
        "c0ffee",
        "--key",
        auditor_keys.key_files(tmp_path / "keys")[0],
        "--auditor",
        "eve",
        "--out",
        tmp_path / "certs",
        "--quiet",
    )
    assert res.returncode == 0, res.stdout + res.stderr
    certs = [json.loads(p.read_text()) for p in (tmp_path / "certs").glob("*.json")]
    assert certs and all(c["verdict"] == "verified" for c in certs)


@pytest.mark.parametrize("rehash", [False, True], ids=["edited", "edited-and-rehashed"])
def test_a_bf16_run_relabelled_fp32_is_a_mismatch(runs, tmp_path, rehash):
    run = tmp_path / "run"
    shutil.copytree(runs[0], run)
    rj = run / "recipe.json"
    obj = json.loads(rj.read_text())
    del obj["recipe"]["model"]["precision"]  # what an fp32 recipe says
    if rehash:
        canon = json.dumps(obj["recipe"], sort_keys=True, separators=(",", ":"), ensure_ascii=True)
        obj["recipe_sha256"] = hashlib.sha256(canon.encode()).hexdigest()
    rj.write_text(json.dumps(obj, indent=2, sort_keys=True))
    res = run_cli("replay", run, "--step", 1)
    assert res.returncode == 1 and "VERIFIED" not in res.stdout, res.stdout + res.stderr


def test_a_bit_flipped_bf16_checkpoint_is_a_mismatch(runs, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(runs[0], run)
    ck = run / "checkpoints" / f"step-{1:07d}.safetensors"
    raw = bytearray(ck.read_bytes())
    hlen = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + hlen])
    name = sorted(n for n in header if n.startswith("param/"))[0]
    raw[8 + hlen + header[name]["data_offsets"][0] + 1] ^= 0x01  # a low bit: bf16 rounding would hide it
    ck.write_bytes(bytes(raw))
    res = run_cli("replay", run, "--step", 1)
    assert res.returncode == 1 and "VERIFIED" not in res.stdout, res.stdout + res.stderr
    assert "first divergence at step 1" in res.stdout, res.stdout


def test_a_bf16_trace_is_taken_on_the_working_copies(runs, tmp_path):
    """The op-level trace of a bf16 step hashes the forward on the working
    copies ([bf16.tensors.c1]): what the first norm saves is the bf16
    embedding of the working wte (the masters would give other bits), and
    replay with the trace published verifies."""
    from refreplay.verify import trace

    run = tmp_path / "run"
    shutil.copytree(runs[0], run)
    res = run_cli("trace", run, "--step", 1)
    assert res.returncode == 0, res.stdout + res.stderr
    r = open_run(run)
    t = trace.load_trace(r, 1)
    trainer = r.trainer()
    st = r.load_checkpoint(0)
    x, _ = trace.inputs_targets(trainer.stream.batch(1)[: trainer.cfg.micro_batch_size])
    work = trainer.model.working_params(st.params)
    emb = B.round_f32(np.ascontiguousarray(work["wte"][x].reshape(-1, trainer.model.cfg.width)))
    first = dict(t["micro_batches"][0])["forward/h.00.ln1"]  # what the first norm saves: (x, rrms)
    assert trace._digest((emb, trainer.model.ops.norms.rmsnorm_forward(emb, work["h.00.ln1.w"])[1])) == first
    res = run_cli("replay", run, "--step", 1)
    assert res.returncode == 0 and "VERIFIED: step 1" in res.stdout, res.stdout + res.stderr


def test_a_bf16_run_replays_with_every_tensor_in_mapped_files(runs):
    """Under a memory budget the working copies live in mapped files too
    (``working_params(keep=...)``) and the bits are the same."""
    from refreplay.training import budget
    from refreplay.verify.replay import replay

    mem = budget.Memory(True, min_bytes=0)
    res = replay(open_run(runs[0], strict=False), STEPS, memory=mem)
    assert res.verified and mem.files > 0
