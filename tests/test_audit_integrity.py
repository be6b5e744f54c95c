"""Issue 15: every published artifact a verdict covers is checked, a mismatch
always wins over faults of localisation aids, hostile input is a clear
refusal, and damage is attributed to the steps that read it
([step.verified.c1], [state.untrusted.c1])."""

import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import zstandard

from refreplay import tensorio
from refreplay import state as sh
from refreplay.training import presets, train
from refreplay.verify import audit

import auditor_keys
from cli_helpers import run_cli as _cli
from refreplay.training.data import SHARD_SAMPLES
from refreplay.training.launch.inproc import InProcess
from refreplay.training.run import open_run

STEPS, EVERY = 6, 3
SEQ = 16
# one sample more than a shard holds: shard 1 holds only sample 4096, which
# few steps draw, so damage to it must not touch the others
SAMPLES = SHARD_SAMPLES + 1


def _cfg():
    model, tcfg = presets.preset("tiny")
    model = dataclasses.replace(model, layers=1, seq_len=SEQ, mlp_hidden=64)
    tcfg = dataclasses.replace(tcfg, micro_batches=6, micro_batch_size=2, warmup_steps=3)
    return model, tcfg


@pytest.fixture(scope="module")
def run0(tmp_path_factory):
    path = tmp_path_factory.mktemp("runs") / "r"
    model, tcfg = _cfg()
    train.train(
        model,
        tcfg,
        steps=STEPS,
        checkpoint_every=EVERY,
        out=path,
        launcher=InProcess(1),
        byte_cap=SAMPLES * (SEQ + 1),
        progress=None,
    )
    return path


@pytest.fixture
def copy(run0, tmp_path):
    dst = tmp_path / "run"
    shutil.copytree(run0, dst)
    return dst


def _beacon_for(path, step):
    """A beacon under which the test key's one-step sample is ``step``."""
    head = open_run(path, strict=False).head["chain_link"]
    return auditor_keys.beacon_for(head, STEPS, step)


def _audit(path, step, out):
    key = auditor_keys.key_files(out.parent / "keys")[0]
    res = _cli(
        "audit",
        path,
        "--sample",
        1,
        "--beacon",
        _beacon_for(path, step),
        "--key",
        key,
        "--auditor",
        "eve",
        "--out",
        out,
    )
    certs = {json.loads(p.read_text())["step"]: json.loads(p.read_text()) for p in out.glob("*.json")}
    return res, certs


def _ckpt(path, k):
    return path / "checkpoints" / f"step-{k:07d}.safetensors"


def _flip_bit(ck, name, byte=2):
    raw = bytearray(ck.read_bytes())
    hlen = int.from_bytes(raw[:8], "little")
    start = json.loads(raw[8 : 8 + hlen])[name]["data_offsets"][0] + 8 + hlen
    raw[start + byte] ^= 0x10
    ck.write_bytes(bytes(raw))


def _no_trace(res):
    assert "Traceback" not in res.stdout + res.stderr, res.stdout + res.stderr


# ---- 1. everything a verdict covers is verified -------------------------------------------


@pytest.mark.parametrize("damage", ["swapped", "bit-flipped", "padded"])
def test_tampered_final_checkpoint_is_a_mismatch(copy, damage, tmp_path):
    final = _ckpt(copy, STEPS)
    if damage == "swapped":  # an older state released as the final model
        shutil.copy(_ckpt(copy, EVERY), final)
    elif damage == "bit-flipped":
        _flip_bit(final, sorted(n for n in tensorio.load(final)[0] if n.startswith("adam.v/"))[0])
    else:
        final.write_bytes(final.read_bytes() + b"\0" * 8)
    res = _cli("replay", copy, "--step", STEPS)
    text = res.stdout + res.stderr
    assert res.returncode == 1 and "VERIFIED" not in text, text
    assert f"first divergence at step {STEPS} (checkpoint)" in text, text
    assert f"step-{STEPS:07d}.safetensors" in text
    if damage == "bit-flipped":
        assert "tensor 'adam.v/" in text and "#0 bytes [0, " in text, text
    if damage == "swapped":
        assert "tensor 'train.step'" in text, text
    a, certs = _audit(copy, STEPS, tmp_path / "certs")
    assert a.returncode == 1, a.stdout + a.stderr
    assert certs[STEPS]["verdict"] == "mismatch" and certs[STEPS]["mismatch"]["kind"] == "checkpoint"
    assert not any(c["verdict"] == "verified" for c in certs.values())


def test_tampered_intermediate_checkpoint_gives_a_mismatch_certificate(copy, tmp_path):
    ck = _ckpt(copy, EVERY)
    _flip_bit(ck, sorted(n for n in tensorio.load(ck)[0] if n.startswith("param/"))[0])
    a, certs = _audit(copy, EVERY, tmp_path / "certs")
    assert a.returncode == 1, a.stdout + a.stderr
    assert certs[EVERY]["verdict"] == "mismatch", certs
    # a later step replays from the checkpoint before, says so, and reaches the same mismatch
    res = _cli("replay", copy, "--step", EVERY + 2)
    text = res.stdout
    assert res.returncode == 1 and f"first divergence at step {EVERY} (checkpoint)" in text, text
    assert "not usable as a starting point" in text


def test_verified_certificate_lists_the_checkpoints_checked(run0, tmp_path):
    a, certs = _audit(run0, STEPS, tmp_path / "certs")
    assert a.returncode == 0, a.stdout + a.stderr
    checked = certs[STEPS]["checked"]
    assert checked["replayed_from"] == EVERY and checked["steps"] == list(range(EVERY + 1, STEPS + 1))
    assert [(c["step"], c["role"]) for c in checked["checkpoints"]] == [(EVERY, "start"), (STEPS, "recomputed")]
    trust = auditor_keys.key_files(tmp_path / "keys")[1]
    cov = _cli("coverage", run0, tmp_path / "certs", "--trust", trust)
    assert cov.returncode == 0, cov.stdout
    # a forger (even one holding the key) who drops the final checkpoint from the list is rejected
    f = next((tmp_path / "certs").glob("*.json"))
    cert = json.loads(f.read_text())
    cert["checked"]["checkpoints"] = cert["checked"]["checkpoints"][:1]
    f.write_text(json.dumps(audit.sign_certificate(cert, auditor_keys.key())))
    cov = _cli("coverage", run0, tmp_path / "certs", "--trust", trust)
    assert cov.returncode == 1 and "every published checkpoint" in cov.stdout, cov.stdout


# ---- 2. a mismatch wins over faults of localisation aids ---------------------------------------


def _republish_with_edited_root(path, step):
    p = path / "steps.jsonl"
    recs = [json.loads(x) for x in p.read_text().splitlines()]
    head = json.loads((path / "head.json").read_text())
    recs[step]["state_root"] = "ab" * 32
    for i in range(step, len(recs)):
        recs[i]["chain_link"] = sh.chain_link(
            recs[i - 1]["chain_link"],
            recs[i]["state_root"],
            recs[i]["data_hash"],
            head["recipe_sha256"],
            recs[i]["loss"],
        )
    p.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in recs))
    head["chain_link"] = recs[-1]["chain_link"]
    (path / "head.json").write_text(json.dumps(head))


SLOW = pytest.mark.slow  # more variants of a case the default run already has


@pytest.mark.parametrize(
    "aid",
    [
        "trace-garbage",
        pytest.param("trace-deep", marks=SLOW),
        pytest.param("trace-symlink-out", marks=SLOW),
        "trace-directory",
        pytest.param("digests-undecodable", marks=SLOW),
        "digests-symlink-out",
        pytest.param("digests-deep", marks=SLOW),
    ],
)
def test_mismatch_wins_over_broken_localisation_aids(copy, aid, tmp_path):
    step = 2
    _republish_with_edited_root(copy, step)
    outside = tmp_path / "outside.json"
    outside.write_text("{}")
    trace = copy / "traces" / f"step-{step:07d}.json"
    trace.parent.mkdir(exist_ok=True)
    digests = copy / "digests.jsonl"
    if aid == "trace-garbage":
        trace.write_bytes(b"\xff\xfe not json")
    elif aid == "trace-deep":
        trace.write_text("[" * 100_000 + "]" * 100_000)
    elif aid == "trace-symlink-out":
        trace.symlink_to(outside)
    elif aid == "trace-directory":
        trace.mkdir()
    elif aid == "digests-undecodable":
        digests.write_bytes(b"\xff" * 64 + b"\n{\n")
    elif aid == "digests-symlink-out":
        digests.unlink()
        digests.symlink_to(outside)
    else:
        digests.write_text('{"step": 1, "digest": ' + "[" * 50_000 + "]" * 50_000 + "}\n")
    res = _cli("replay", copy, "--step", step)
    text = res.stdout + res.stderr
    assert res.returncode == 1 and f"first divergence at step {step} (state)" in text, text
    assert "warning:" in text and "VERIFIED" not in text, text
    _no_trace(res)
    a, certs = _audit(copy, step, tmp_path / "certs")
    assert a.returncode == 1 and certs[step]["verdict"] == "mismatch", a.stdout + a.stderr
    assert certs[step]["warnings"], certs[step]


# ---- 3. hostile input: a clear refusal, never a traceback ------------------------------------


def _zstd_bomb(declared=1 << 40, n=100):
    """A zstd frame whose header declares ``declared`` bytes of content (a
    single-segment frame: the whole content size is the window), holding one
    RLE block of ``n`` bytes."""
    header = b"\x28\xb5\x2f\xfd" + bytes([0xE0]) + declared.to_bytes(8, "little")
    return header + ((n << 3) | (1 << 1) | 1).to_bytes(3, "little") + b"x"


def test_zstd_declared_size_bomb_is_refused(copy):
    (copy / "data" / "shard-00000.zst").write_bytes(_zstd_bomb())
    res = _cli("replay", copy, "--step", 1)
    assert res.returncode == 2 and "shard-00000.zst" in res.stderr, res.stdout + res.stderr
    _no_trace(res)


def test_stream_reader_caps_an_honest_frame_that_expands_too_far(tmp_path):
    from refreplay import untrusted
    from refreplay.errors import InputError

    frame = zstandard.ZstdCompressor(write_content_size=False).compress(b"\0" * (64 << 20))
    assert len(frame) < 1 << 16
    with pytest.raises(InputError, match="more than the 1000 bytes"):
        untrusted.zstd_frame(frame, 1000, "f")
    with pytest.raises(InputError, match="not a valid zstd frame"):
        untrusted.zstd_frame(_zstd_bomb(), 100, "f")


@pytest.mark.parametrize(
    "where,depth",
    [("recipe.json", 100_000), ("data/manifest.json", 100_000), ("steps.jsonl", 2000), ("head.json", 2000)],
)
def test_deep_json_anywhere_in_a_run_is_refused(copy, where, depth):
    p = copy / where  # (steps.jsonl and head.json have small size limits: a shallower bomb)
    deep = "[" * depth + "]" * depth
    if where == "steps.jsonl":
        lines = p.read_text().splitlines()
        lines[1] = deep
        p.write_text("\n".join(lines) + "\n")
    else:
        p.write_text(deep)
    res = _cli("replay", copy, "--step", 1)
    assert res.returncode == 2 and f"nested {depth} deep" in res.stderr, res.stdout + res.stderr
    _no_trace(res)


def test_deep_or_odd_certificates_are_rejected_not_crashed(run0, tmp_path):
    certs = tmp_path / "certs"
    certs.mkdir()
    (certs / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (certs / "x.json").mkdir()  # a directory named like a certificate
    (tmp_path / "elsewhere.json").write_text("{}")
    (certs / "link.json").symlink_to(tmp_path / "elsewhere.json")  # leads out of the directory
    (certs / "types.json").write_text(
        json.dumps({"format": audit.CERT_FORMAT, "run": [], "step": "1", "verdict": 1, "digest": 5})
    )
    res = _cli("coverage", run0, certs, "--trust", auditor_keys.key_files(tmp_path / "keys")[1])
    _no_trace(res)
    assert res.returncode == 1 and res.stdout.count("REJECTED") == 4, res.stdout
    assert "nested 100000 deep" in res.stdout and "not a regular file" in res.stdout
    assert "leads outside" in res.stdout


def test_checkpoint_header_with_a_list_dtype_is_refused(copy):
    ck = _ckpt(copy, 0)
    raw = ck.read_bytes()
    hlen = int.from_bytes(raw[:8], "little")
    header = raw[8 : 8 + hlen].replace(b'"dtype":"F32"', b'"dtype":["F32"]', 1)
    header += b" " * (-len(header) % 8)
    ck.write_bytes(len(header).to_bytes(8, "little") + header + raw[8 + hlen :])
    res = _cli("trace", copy, "--step", 1)  # reads checkpoint 0 as its input
    assert res.returncode == 2 and "unknown dtype ['F32']" in res.stderr, res.stdout + res.stderr
    _no_trace(res)
    res = _cli("replay", copy, "--step", 1)  # a covered checkpoint that cannot be read: mismatch
    assert res.returncode == 1 and "first divergence at step 0 (checkpoint)" in res.stdout, res.stdout
    _no_trace(res)


def test_bad_thread_count_in_the_environment_is_a_clear_error(run0):
    env = dict(os.environ, NUMBA_NUM_THREADS="0")
    out = subprocess.run(
        [sys.executable, "-m", "refreplay", "replay", str(run0), "--step", "1"], capture_output=True, text=True, env=env
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert "NUMBA_NUM_THREADS='0'" in out.stderr and "Traceback" not in out.stderr, out.stderr


# ---- 4. finer attribution ----------------------------------------------------------------


def test_missing_checkpoints_do_not_stop_steps_that_never_read_them(copy):
    _ckpt(copy, STEPS).unlink()
    res = _cli("replay", copy, "--step", 2)  # before: every step refused (exit 2)
    assert res.returncode == 0 and "VERIFIED: step 2" in res.stdout, res.stdout + res.stderr
    _ckpt(copy, EVERY).unlink()
    res = _cli("replay", copy, "--step", EVERY + 1)
    assert res.returncode == 0 and f"replayed steps 1..{EVERY + 1} from the checkpoint at step 0" in res.stdout
    assert f"step-{EVERY:07d}.safetensors is not published" in res.stdout, res.stdout


def _samples(run, n):
    return set(int(i) for i in run.stream().sample_ids(n))


def _rewrite_shard(path, j, mutate):
    shard = path / "data" / f"shard-{j:05d}.zst"
    raw = zstandard.ZstdDecompressor().decompress(shard.read_bytes())
    samples = np.frombuffer(raw, np.uint8).reshape(-1, SEQ + 1).copy()
    mutate(samples)
    shard.write_bytes(zstandard.ZstdCompressor().compress(samples.tobytes()))


def test_data_tamper_is_reported_at_the_first_step_that_draws_it(copy):
    r = open_run(copy)
    late = set().union(*(_samples(r, n) for n in range(EVERY + 1, STEPS + 1)))
    sid = min(_samples(r, 2) - _samples(r, 1) - late - {SHARD_SAMPLES})

    def flip(samples):
        samples[sid, 3] ^= 1

    _rewrite_shard(copy, 0, flip)
    res = _cli("replay", copy, "--step", STEPS)  # steps 4..6 never draw the sample
    assert res.returncode == 0 and "VERIFIED" in res.stdout, res.stdout
    assert "warning:" in res.stdout and "shard-00000.zst" in res.stdout, res.stdout
    res = _cli("replay", copy, "--step", EVERY)
    assert res.returncode == 1 and "first divergence at step 2 (data)" in res.stdout, res.stdout


@pytest.mark.parametrize("damage", [pytest.param("missing", marks=SLOW), "bomb"])
def test_unreadable_shard_only_stops_the_steps_that_draw_from_it(copy, damage):
    r = open_run(copy)
    drawing = [n for n in range(1, STEPS + 1) if SHARD_SAMPLES in _samples(r, n)]
    shard = copy / "data" / "shard-00001.zst"
    if damage == "missing":
        shard.unlink()
    else:
        shard.write_bytes(_zstd_bomb())
    # a replay of step n recomputes the steps after the checkpoint before n
    reads = {n: any(max(k for k in (0, EVERY) if k < n) < d <= n for d in drawing) for n in range(1, STEPS + 1)}
    for n in sorted({1, STEPS, *drawing}):
        res = _cli("replay", copy, "--step", n)
        if reads[n]:
            assert res.returncode == 2 and "shard-00001.zst" in res.stderr, res.stdout + res.stderr
        else:
            assert res.returncode == 0 and "VERIFIED" in res.stdout, res.stdout + res.stderr
        _no_trace(res)
    assert not all(reads.values())


def test_substituted_head_is_named_as_such(copy, tmp_path):
    head = json.loads((copy / "head.json").read_text())
    head["chain_link"] = "cd" * 32
    head["recipe_sha256"] = "ef" * 32
    (copy / "head.json").write_text(json.dumps(head))
    res = _cli("replay", copy, "--step", 1)
    assert res.returncode == 1 and "(head)" in res.stdout and "substituted" in res.stdout, res.stdout
    assert "(recipe)" not in res.stdout


# ---- the vectors manifest cannot point outside its directory ----------------------------------

_OPENED = None  # paths opened while recording (an audit hook cannot be removed: it is switched)


def _hook(event, args):
    if event == "open" and _OPENED is not None and isinstance(args[0], (str, bytes, os.PathLike)):
        _OPENED.append(os.fsdecode(args[0]))


sys.addaudithook(_hook)


@contextlib.contextmanager
def opened_files():
    global _OPENED
    _OPENED = []
    try:
        yield _OPENED
    finally:
        _OPENED = None


def test_vectors_manifest_traversal_is_refused_before_any_read(tmp_path):
    import hashlib

    from refreplay.conformance.golden import store

    vec = tmp_path / "a" / "b" / "vectors"
    vec.mkdir(parents=True)
    m = json.loads((store.VECTOR_DIR / store.MANIFEST).read_text())
    op_file = m["cases"][0]["file"]
    shutil.copy(store.VECTOR_DIR / op_file, vec / op_file)
    secret = tmp_path / "secret.safetensors"
    secret.write_bytes(b"the auditor's private key")
    evil = "../../../secret.safetensors"
    assert (vec / evil).resolve() == secret.resolve()
    m["files"] = {op_file: m["files"][op_file], evil: {"sha256": "0" * 64, "bytes": 25}}
    m["cases"] = [dict(c, file=evil) for c in m["cases"] if c["file"] == op_file]
    (vec / store.MANIFEST).write_text(json.dumps(m))
    with opened_files() as seen:
        res = _cli("conform", "reference", "--vectors", vec)
    text = res.stdout + res.stderr
    assert res.returncode == 2 and "not a plain <name>.safetensors" in text, text
    assert not any("secret" in p for p in seen), seen
    assert hashlib.sha256(secret.read_bytes()).hexdigest()[:8] not in text
    _no_trace(res)
    # a symbolic link inside the directory that leads outside is refused too
    m = json.loads((store.VECTOR_DIR / store.MANIFEST).read_text())
    (vec / op_file).unlink()
    (vec / op_file).symlink_to(secret)
    m["files"] = {op_file: m["files"][op_file]}
    m["cases"] = [c for c in m["cases"] if c["file"] == op_file]
    (vec / store.MANIFEST).write_text(json.dumps(m))
    with opened_files() as seen:
        res = _cli("conform", "reference", "--vectors", vec)
    assert res.returncode == 2 and "leads outside" in res.stderr, res.stdout + res.stderr
    assert not any("secret" in p for p in seen), seen


@pytest.mark.parametrize(
    "value,ok",
    [
        ("1", True),
        (" 2 ", True),
        ("4096", True),
        ("0", False),
        ("-1", False),
        ("abc", False),
        ("", False),
        ("4097", False),
        ("1e3", False),
    ],
)
def test_thread_count_values(value, ok):
    from refreplay import environ
    from refreplay.errors import InputError

    if ok:
        environ.check({"NUMBA_NUM_THREADS": value})
    else:
        with pytest.raises(InputError, match="NUMBA_NUM_THREADS"):
            environ.check({"NUMBA_NUM_THREADS": value})
