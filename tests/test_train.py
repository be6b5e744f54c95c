"""The trainer: rank-count invariance of every step's bits ([step.order.c1],
[fold.ranks.c1], [data.batch.c1]), the run directory and its validation
([step.state.c1], [step.record.c1], [step.recipe.c1], [step.loss.c1],
[step.hparams.c1]), learning, and the command line's exit codes."""

import dataclasses
import hashlib
import json
import shutil

import numpy as np
import pytest

from refreplay import state
from refreplay.training import launch, presets, run, treefold
from refreplay.errors import InputError
from refreplay.training.train import train

BYTE_CAP = 1 << 16  # 64 KiB of the default corpus: ~2000 samples of the tiny preset


pytestmark = pytest.mark.usefixtures("one_numba_thread")


def _train(out, ranks, model=None, tcfg=None, steps=4, every=2, preset="tiny"):
    m, t = presets.preset("tiny")
    return train(
        model or m,
        tcfg or t,
        steps=steps,
        checkpoint_every=every,
        out=out,
        launcher=launch.get("inproc", ranks),
        preset=preset,
        byte_cap=BYTE_CAP,
        progress=None,
    )


def _records(path):
    return (path / "steps.jsonl").read_text()


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "r1"
    _train(out, 1)
    return out


def test_rank_counts_give_identical_hashes(tiny_run, tmp_path):
    """[fold.ranks.c1] [data.batch.c1] R = 1, 2, 3, 4, 8 in-process ranks
    (M = 8: R = 3 splits it 2 + 3 + 3, not into powers of two) give the same
    record for every step and byte-identical checkpoints."""
    want = _records(tiny_run)
    assert len(want.splitlines()) == 5
    assert [b - a for a, b in treefold.rank_ranges(8, 3)] == [2, 3, 3]
    for r in (2, 3, 4, 8):
        out = tmp_path / f"r{r}"
        _train(out, r)
        assert _records(out) == want, f"R={r}"
        for ck in sorted((tiny_run / "checkpoints").iterdir()):
            assert (out / "checkpoints" / ck.name).read_bytes() == ck.read_bytes(), (r, ck.name)
        assert json.loads((out / "recipe.json").read_text())["run"]["ranks"] == r


def test_ragged_ranks_other_architecture(tmp_path):
    """[fold.ranks.c1] [model.quant.c1] M = 6 on R = 1, 4, 5 (blocks of sizes
    1+2+1+2 and 1+1+1+1+2) with LayerNorm, SwiGLU, biases, an untied head and
    int8 QAT linears: identical records, and the re-pinned step sizes are in
    the state."""
    m = presets.ModelConfig(
        width=16,
        layers=1,
        heads=2,
        seq_len=16,
        mlp_hidden=32,
        norm="layer",
        mlp="swiglu",
        tied=False,
        bias=True,
        linear="int8",
    )
    t = presets.TrainConfig(micro_batches=6, micro_batch_size=2, schedule_steps=20)
    outs = []
    for r in (1, 4, 5):
        out = tmp_path / f"r{r}"
        _train(out, r, m, t, steps=3, every=3, preset=None)
        outs.append(_records(out))
    assert outs[0] == outs[1] == outs[2]
    st = run.open_run(tmp_path / "r4").load_checkpoint(3)
    assert sorted(st.qsteps) == [
        "h.00.attn.proj.w",
        "h.00.attn.qkv.w",
        "h.00.mlp.gate.w",
        "h.00.mlp.proj.w",
        "h.00.mlp.up.w",
    ]


def test_run_directory_reads_back_and_replays(tiny_run):
    """[step.record.c1] [step.state.c1] [state.chain.c2] [data.hash.c1] the run
    opens with every field checked; a checkpoint's state replays the next
    step to the published record; the data of a step is rebuilt exactly."""
    r = run.open_run(tiny_run)
    assert r.checkpoints == [0, 2, 4]
    assert r.records[0].chain_link == state.GENESIS and r.records[0].loss is None
    st0 = r.load_checkpoint(0)
    assert st0.root() == r.trainer().initial_state().root()  # state 0 follows from the recipe
    assert st0.tensors()["data.position"].tolist() == [0, 0]
    for k in (0, 2):
        st = r.load_checkpoint(k)
        nxt, rec = r.replay_step(st)
        assert rec == r.records[k + 1]
        assert nxt.step == k + 1 and nxt.tensors()["train.step"].tolist() == [k + 1]
    assert hashlib.sha256(r.batch(3).tobytes()).hexdigest() == r.records[3].data_hash
    assert r.head["chain_link"] == r.records[-1].chain_link


def test_per_step_digests_localise(tiny_run, tmp_path):
    """[state.diff.c1] every step publishes its state's Merkle digest; it hashes
    to the published root, so a replayed state can be compared tensor by
    tensor; a digest that does not match its root is ignored."""
    r = run.open_run(tiny_run)
    for k in range(len(r.records)):
        assert r.state_digest(k).root == r.records[k].state_root
    st = r.load_checkpoint(2)
    assert r.state_digest(2) == st.digest()
    st.params["wte"][0, 0] += np.float32(1.0)
    changed = state.diff(r.state_digest(2), st.digest()).changed
    assert [c.name for c in changed] == ["param/wte"] and changed[0].chunks[0][0] == 0
    p = _copy(tiny_run, tmp_path / "run")
    lines = (p / "digests.jsonl").read_text().splitlines(True)
    lines[1] = lines[1].replace(r.records[1].state_root, "0" * 64)
    (p / "digests.jsonl").write_text("".join(lines))
    assert run.open_run(p).state_digest(1) is None and run.open_run(p).state_digest(2) is not None


def test_recipe_hash_is_canonical_and_excludes_provenance(tiny_run):
    """[step.recipe.c1] the hash covers spec version, model, train and data;
    binary32 fields are bit patterns; ranks and steps are not hashed."""
    obj = json.loads((tiny_run / "recipe.json").read_text())
    hashed = obj["recipe"]
    assert hashed["train"]["lr"] == "0x3B449BA6" and hashed["model"]["norm_eps"] == "0x3727C5AC"
    canon = json.dumps(hashed, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    assert obj["recipe_sha256"] == hashlib.sha256(canon).hexdigest()
    assert set(hashed) == {"spec_version", "model", "train", "data"}
    assert run.recipe_hash_of_json('{"b": true, "a": 1}') == hashlib.sha256(b'{"a":1,"b":true}').hexdigest()


def test_step_loss_and_hparams(tiny_run):
    """[step.loss.c1] [step.hparams.c1] the published loss of step 1 is the
    TreeFold of the micro-batch losses times recip(M), and one-axis tensors
    take no weight decay."""
    r = run.open_run(tiny_run)
    tr = r.trainer()
    st0 = r.load_checkpoint(0)
    batch = r.batch(1)
    from refreplay.training.data import inputs_targets

    losses = np.array(
        [[tr.model.loss_and_grads(st0.params, *inputs_targets(batch[2 * m : 2 * m + 2])).loss] for m in range(8)],
        dtype=np.float32,
    )
    want = treefold.scale(treefold.fold_rows(losses), 8)
    assert np.float32(r.records[1].loss).tobytes() == want.tobytes()
    from refreplay.training.step import no_decay_names

    nd = no_decay_names(st0.params)
    assert "lnf.w" in nd and "wte" not in nd and all(st0.params[k].ndim == 1 for k in nd)


def test_loss_decreases_over_thirty_steps(tmp_path):
    """The tiny model learns: over 30 steps on the default corpus the mean loss
    of the last 5 steps is clearly below that of the first 5."""
    m, t = presets.preset("tiny")
    s = train(
        m,
        dataclasses.replace(t, schedule_steps=30),
        steps=30,
        checkpoint_every=30,
        out=tmp_path / "run",
        launcher=launch.get("inproc", 1),
        byte_cap=BYTE_CAP,
        progress=None,
    )
    first, last = np.mean(s.losses[:5]), np.mean(s.losses[-5:])
    assert last < first - 0.5, (first, last)


@pytest.mark.slow
def test_loss_decreases_over_three_hundred_steps(tmp_path):
    """The tiny model learns the default corpus: 300 steps take the loss from
    ln(256) = 5.55 to below 3.0 nats per byte."""
    m, t = presets.preset("tiny")
    s = train(
        m,
        dataclasses.replace(t, schedule_steps=300),
        steps=300,
        checkpoint_every=100,
        out=tmp_path / "run",
        launcher=launch.get("inproc", 1),
        progress=None,
    )
    assert s.losses[0] > 5.3 and np.mean(s.losses[-10:]) < 3.0, (s.losses[0], s.losses[-10:])


# ---- validation: every file and field -------------------------------------------------


def _copy(src, dst):
    shutil.copytree(src, dst, symlinks=True)
    return dst


def _edit_recipe(path, fn):
    obj = json.loads((path / "recipe.json").read_text())
    fn(obj)
    (path / "recipe.json").write_text(json.dumps(obj))


def _flip_byte(path, offset_from_end=20):
    b = bytearray(path.read_bytes())
    b[-offset_from_end] ^= 0x01
    path.write_bytes(bytes(b))


CORRUPTIONS = {
    "missing recipe": (lambda p: (p / "recipe.json").unlink(), "missing recipe file"),
    "recipe not JSON": (lambda p: (p / "recipe.json").write_text("{oops"), "not valid JSON"),
    "edited hyper-parameter": (
        lambda p: _edit_recipe(p, lambda o: o["recipe"]["train"].update(lr="0x3B449BA7")),
        "the recipe was edited",
    ),
    "unknown preset": (lambda p: _edit_recipe(p, lambda o: o["run"].update(preset="huge")), "unknown preset 'huge'"),
    "unknown field": (
        lambda p: _edit_recipe(p, lambda o: o["recipe"]["model"].update(dropout=0)),
        "unknown field(s) dropout",
    ),
    "bad float field": (
        lambda p: _edit_recipe(p, lambda o: o["recipe"]["train"].update(eps="tiny")),
        "binary32 bit pattern",
    ),
    "other spec version": (
        lambda p: _edit_recipe(p, lambda o: o["recipe"].update(spec_version="9.9")),
        "made under spec '9.9'",
    ),
    "missing shard": (lambda p: (p / "data" / "shard-00000.zst").unlink(), "missing file"),
    "edited manifest": (
        lambda p: (p / "data" / "manifest.json").write_text(
            (p / "data" / "manifest.json").read_text().replace('"vocab": 256', '"vocab": 256 ')
        ),
        "does not match the recipe's manifest_sha256",
    ),
    "missing checkpoint": (lambda p: (p / "checkpoints" / "step-0000002.safetensors").unlink(), "missing file"),
    "truncated records": (
        lambda p: (p / "steps.jsonl").write_text("".join((p / "steps.jsonl").read_text().splitlines(True)[:3])),
        "incomplete or truncated",
    ),
    "missing head": (lambda p: (p / "head.json").unlink(), "missing chain head file"),
    "shard outside the run": (
        lambda p: (
            (p / "data" / "shard-00000.zst").unlink(),
            (p / "data" / "shard-00000.zst").symlink_to("/etc/hostname"),
        ),
        "leads outside the run directory",
    ),
}


def _tamper_record(p):
    lines = (p / "steps.jsonl").read_text().splitlines(True)
    rec = json.loads(lines[2])
    rec["state_root"] = ("0" if rec["state_root"][0] != "0" else "1") + rec["state_root"][1:]
    lines[2] = json.dumps(rec, sort_keys=True) + "\n"
    (p / "steps.jsonl").write_text("".join(lines))


CORRUPTIONS["tampered record"] = (_tamper_record, "chain link does not follow")


@pytest.mark.parametrize("what", sorted(CORRUPTIONS))
def test_corrupt_run_is_refused_on_open(tiny_run, tmp_path, what):
    """Every file and field is validated on open: InputError naming the problem."""
    p = _copy(tiny_run, tmp_path / "run")
    damage, message = CORRUPTIONS[what]
    damage(p)
    with pytest.raises(InputError) as exc:
        run.open_run(p)
    assert message in str(exc.value)


def test_corrupt_shard_and_checkpoint_are_refused_on_use(tiny_run, tmp_path):
    """A shard whose content changed, a checkpoint with one flipped bit or a
    truncated checkpoint is refused with InputError when read."""
    p = _copy(tiny_run, tmp_path / "run")
    shard = p / "data" / "shard-00000.zst"
    _flip_byte(shard, 10)
    with pytest.raises(InputError, match="shard-00000.zst"):
        run.open_run(p).stream()
    q = _copy(tiny_run, tmp_path / "run2")
    ck = q / "checkpoints" / "step-0000002.safetensors"
    _flip_byte(ck, 100)
    r = run.open_run(q)
    with pytest.raises(InputError, match="differs from the published root of step 2"):
        r.load_checkpoint(2)
    ck.write_bytes(ck.read_bytes()[:1000])
    with pytest.raises(InputError, match="step-0000002.safetensors"):
        r.load_checkpoint(2)
    with pytest.raises(InputError, match="no checkpoint at step 3"):
        r.load_checkpoint(3)


# ---- command line -------------------------------------------------------------------------


def test_cli_trains_and_reports(tmp_path, capsys):
    """`refreplay train` writes a run equal to the library's and prints step,
    loss and tokens/s."""
    from refreplay.cli import main

    out = tmp_path / "run"
    code = main(
        [
            "train",
            "--preset",
            "tiny",
            "--steps",
            "2",
            "--ranks",
            "3",
            "--out",
            str(out),
            "--byte-cap",
            str(BYTE_CAP),
            "--seed",
            "5",
        ]
    )
    cap = capsys.readouterr()
    assert code == 0, cap.err
    assert "step 2/2" in cap.err and "loss" in cap.err and "tok/s" in cap.err
    r = run.open_run(out)
    assert r.recipe.train.seed == 5 and r.recipe.ranks == 3 and r.recipe.train.schedule_steps == 1000
    assert r.head["chain_link"] in cap.out


def test_cli_bad_input_exits_2(tmp_path, capsys):
    """Unknown preset, bad config, missing corpus file, too many ranks,
    non-empty output: exit 2 with a clear message."""
    from refreplay.cli import main

    out = str(tmp_path / "o")
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"preset": "giant"}))
    cfg2 = tmp_path / "c2.json"
    cfg2.write_text(json.dumps({"model": {"norm": "batch"}}))
    cfg3 = tmp_path / "c3.json"
    cfg3.write_text("{")
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    cases = [
        (["--preset", "huge", "--steps", "1", "--out", out], "unknown preset 'huge'"),
        (["--preset", "tiny", "--steps", "1", "--out", out, "--ranks", "9"], "exceeds the 8 micro-batches"),
        (
            ["--preset", "tiny", "--steps", "1", "--out", out, "--data", str(tmp_path / "nope.txt")],
            "corpus file not found",
        ),
        (["--config", str(cfg), "--steps", "1", "--out", out], "unknown preset 'giant'"),
        (["--config", str(cfg2), "--steps", "1", "--out", out], "norm must be one of"),
        (["--config", str(cfg3), "--steps", "1", "--out", out], "not valid JSON"),
        (["--config", str(tmp_path / "none.json"), "--steps", "1", "--out", out], "missing config file"),
        (["--preset", "tiny", "--steps", "1", "--out", str(full)], "refusing to overwrite"),
    ]
    for args, message in cases:
        assert main(["train", *args]) == 2, args
        err = capsys.readouterr().err
        assert "refreplay train: error:" in err and message in err, (args, err)


@pytest.mark.parametrize(
    "what,message",
    [
        ("missing recipe", "missing recipe file"),
        ("unknown preset", "unknown preset 'huge'"),
        ("missing shard", "missing data shard"),
        ("garbage shard", "is corrupt"),
    ],
)
def test_command_line_refuses_a_damaged_run_with_exit_2(tiny_run, tmp_path, capsys, what, message):
    """A corrupt or missing recipe or shard, or a recipe naming an unknown
    preset: the command that reads the run (`refreplay replay`) exits 2 with a
    message naming the problem, never a traceback.  (A missing checkpoint only
    stops the steps that read it, and an unreadable one in the replayed range is
    a mismatch: tests/test_audit_integrity.py, [step.verified.c1].)"""
    from refreplay.cli import main

    p = _copy(tiny_run, tmp_path / "run")
    if what in CORRUPTIONS:
        CORRUPTIONS[what][0](p)
    elif what == "garbage shard":
        (p / "data" / "shard-00000.zst").write_bytes(b"\x28\xb5\x2f\xfd garbage")
    assert main(["replay", str(p), "--step", "1", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and message in err and "Traceback" not in err, err
