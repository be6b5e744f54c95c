"""Issue 26, item 1: certificates nobody can forge, sampling nobody can steer
([step.audit.key.c1], [step.audit.sample.c1], [step.audit.cert.c1],
[step.audit.coverage.c1]).

A real tiny run is audited by two trusted keys; every kind of forged
certificate a hostile publisher could make is rejected by `coverage --trust`
with its reason; a publisher holding auditor keys cannot choose the steps
those keys sample; certificate files are written whole and never through a
planted link; fuzzed certificates give exit 1 or 2, never a traceback or a
count."""

import copy
import dataclasses
import errno
import json
import os
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from refreplay.training import presets, train
from refreplay.training.launch.inproc import InProcess
from refreplay.training.run import open_run
from refreplay.verify import audit, keys

import auditor_keys
from json_fuzz import mutated
from cli_helpers import run_cli

pytestmark = pytest.mark.usefixtures("one_numba_thread")

STEPS, EVERY = 6, 3
BEACON = "c0ffee"
ALICE, BOB, MALLORY = (auditor_keys.key(n) for n in ("alice", "bob", "mallory"))  # mallory: not trusted


@pytest.fixture(scope="module")
def run0(tmp_path_factory):
    path = tmp_path_factory.mktemp("runs") / "r"
    model, tcfg = presets.preset("tiny")
    model = dataclasses.replace(model, layers=1, seq_len=16, mlp_hidden=64)
    tcfg = dataclasses.replace(tcfg, micro_batches=2, micro_batch_size=2, warmup_steps=2)
    train.train(
        model,
        tcfg,
        steps=STEPS,
        checkpoint_every=EVERY,
        out=path,
        launcher=InProcess(1),
        byte_cap=1 << 14,
        progress=None,
    )
    return path


@pytest.fixture(scope="module")
def keydir(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    for name in ("alice", "bob", "mallory"):
        auditor_keys.key_files(d, name)
    return d


def _audit(run, name, keydir, out, k=1, beacon=BEACON):
    res = run_cli(
        "audit",
        run,
        "--sample",
        k,
        "--beacon",
        beacon,
        "--key",
        keydir / f"{name}.key",
        "--auditor",
        name,
        "--out",
        out,
        "--quiet",
    )
    assert res.returncode in (0, 1), res.stdout + res.stderr
    return res


@pytest.fixture(scope="module")
def honest(run0, keydir, tmp_path_factory):
    """Certificates of alice (2 steps) and bob (1 step) for run0, by file name."""
    out = tmp_path_factory.mktemp("certs")
    assert _audit(run0, "alice", keydir, out, k=2).returncode == 0
    assert _audit(run0, "bob", keydir, out).returncode == 0
    return {p.name: json.loads(p.read_text()) for p in sorted(out.glob("*.json"))}


def _trust(keydir, *names):
    return ["--trust", *(keydir / f"{n}.pub.pem" for n in (names or ("alice", "bob")))]


def _coverage(run, certs: dict, tmp_path, keydir, *extra):
    d = tmp_path / "cov"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    for name, cert in certs.items():
        (d / name).write_text(cert if isinstance(cert, str) else json.dumps(cert))
    res = run_cli("coverage", run, d, *_trust(keydir), *extra)
    assert "Traceback" not in res.stdout + res.stderr, res.stdout + res.stderr
    return res


def _of(certs, key):
    return [c for c in certs.values() if c["key"]["fingerprint"] == key.public.fingerprint]


def _signed(cert, key, **changes):
    c = copy.deepcopy(cert)
    c.update(changes)
    c["key"] = audit.key_field(key.public)
    return audit.sign_certificate(c, key)


# ---- what honest certificates give ---------------------------------------------------------------


def test_honest_certificates_count_one_auditor_per_key(run0, honest, tmp_path, keydir):
    assert len(honest) == 3 and all(c["verdict"] == "verified" for c in honest.values())
    res = _coverage(run0, honest, tmp_path, keydir)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "3 valid certificate(s) from 2 auditor key(s)" in res.stdout, res.stdout
    assert "distinct key(s) with complete samples" in res.stdout and "REJECTED" not in res.stdout
    # the escape odds are those of two independent samples of sizes 2 and 1
    p1 = float(audit.escape_probability(STEPS, [2, 1], 1))
    assert f"t =   1: {p1:.6g}" in res.stdout, res.stdout
    # without trusting bob, his certificate is an unknown key's
    d = tmp_path / "cov"
    res = run_cli("coverage", run0, d, *_trust(keydir, "alice"))
    assert res.returncode == 1 and "unknown key" in res.stdout and "from 1 auditor key(s)" in res.stdout


def test_certificate_names_are_unique_per_run_key_sample_and_step(run0, honest):
    head = open_run(run0).head["chain_link"]
    for name, cert in honest.items():
        assert name == audit.certificate_name(cert)
        assert head[:16] in name and cert["key"]["fingerprint"][:16] in name and f"step-{cert['step']:07d}" in name
    assert len({(c["key"]["fingerprint"], c["step"]) for c in honest.values()}) == len(honest)


# ---- forgeries: each rejected with its reason -----------------------------------------------------


def _leaves(obj, prefix=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, prefix + (k,))
    elif isinstance(obj, list) and obj:
        for i, v in enumerate(obj):
            yield from _leaves(v, prefix + (i,))
    else:
        yield prefix


def _changed(v):
    if isinstance(v, bool) or v is None:
        return 1
    if isinstance(v, int):
        return v + 1
    if isinstance(v, str):
        return v[:-1] + ("0" if v[-1:] != "0" else "1") if v else "x"
    return ["x"]


def test_an_edit_of_any_field_is_rejected(run0, honest):
    """Every leaf of a real certificate, edited without the key: rejected."""
    facts, trust = audit.run_facts(open_run(run0)), {k.public.fingerprint: k.public for k in (ALICE, BOB)}
    cert = next(iter(honest.values()))
    assert audit.check_certificate(cert, facts, trust).ok
    paths = list(_leaves(cert))
    assert len(paths) > 40
    for path in paths:
        c = copy.deepcopy(cert)
        obj = c
        for k in path[:-1]:
            obj = obj[k]
        obj[path[-1]] = _changed(obj[path[-1]])
        chk = audit.check_certificate(c, facts, trust)
        assert not chk.ok, path
        if path[0] not in ("format", "key", "signature"):
            assert any("signature does not verify" in p for p in chk.problems), (path, chk.problems)


def _tampered_run(run0, tmp_path):
    """A copy of run0 whose final checkpoint has a flipped bit."""
    from refreplay import tensorio

    run = tmp_path / "tampered"
    shutil.copytree(run0, run)
    ck = run / "checkpoints" / f"step-{STEPS:07d}.safetensors"
    name = sorted(n for n in tensorio.load(ck)[0] if n.startswith("param/"))[0]
    raw = bytearray(ck.read_bytes())
    hlen = int.from_bytes(raw[:8], "little")
    raw[json.loads(raw[8 : 8 + hlen])[name]["data_offsets"][0] + 8 + hlen + 2] ^= 0x10
    ck.write_bytes(bytes(raw))
    return run


def test_a_mismatch_rewritten_as_verified_is_rejected(run0, keydir, tmp_path):
    run = _tampered_run(run0, tmp_path)
    head = open_run(run).head["chain_link"]
    beacon = auditor_keys.beacon_for(head, STEPS, STEPS, "alice")
    out = tmp_path / "certs"
    assert _audit(run, "alice", keydir, out, beacon=beacon).returncode == 1
    [f] = out.glob("*.json")
    bad = json.loads(f.read_text())
    assert bad["verdict"] == "mismatch" and bad["step"] == STEPS
    lie = copy.deepcopy(bad)
    lie["verdict"], lie["replayed"] = "verified", dict(lie["published"])
    del lie["mismatch"]
    forgeries = {
        "lie.json": lie,  # rewritten, old signature kept
        "lie-mallory.json": _signed(lie, MALLORY),  # rewritten and re-signed by the forger's own key
        "lie-alice-key.json": dict(_signed(lie, MALLORY), key=bad["key"]),
    }  # ... claiming alice's key
    res = _coverage(run, forgeries, tmp_path, keydir)
    assert res.returncode == 1 and res.stdout.count("REJECTED") == 3, res.stdout
    assert "lie.json: signature does not verify" in res.stdout
    assert "lie-mallory.json: unknown key" in res.stdout
    assert "lie-alice-key.json: signature does not verify" in res.stdout
    assert "0 valid certificate(s)" in res.stdout and "certified steps: []" in res.stdout
    # the honest mismatch certificate itself is counted, and coverage fails on it
    res = _coverage(run, {f.name: bad}, tmp_path, keydir)
    assert res.returncode == 1 and f"MISMATCH certified at steps [{STEPS}]" in res.stdout, res.stdout


def test_each_kind_of_forgery_is_rejected_with_its_reason(run0, honest, tmp_path, keydir):
    [a1, a2] = _of(honest, ALICE)
    unsampled = next(s for s in range(1, STEPS + 1) if s not in a1["sampling"]["steps"])
    legacy = {k: v for k, v in a1.items() if k not in ("signature", "key")}
    legacy["format"] = "refreplay-certificate/2"
    legacy["sampling"] = {
        "beacon": BEACON,
        "secret": "01",
        "k": 2,
        "steps": a1["sampling"]["steps"],
        "method": "refreplay-audit-sample/1",
    }
    legacy["digest"] = "0" * 64
    other_head = "ee" * 32
    platform = dict(a1["platform"], os=5)
    forgeries = {
        # (certificate, what the reason says)
        "edited": (dict(a1, step=unsampled), "signature does not verify"),
        "relabelled": (dict(a1, auditor="carol"), "signature does not verify"),
        "resealed-unsigned": (legacy, "unsigned certificate"),
        "resealed-own-key": (_signed(a1, MALLORY), "unknown key"),
        "unknown-key": (_signed(dict(a1, auditor="mallory"), MALLORY), "unknown key"),
        "mis-sampled": (_signed(a1, ALICE, step=unsampled), "mis-sampled"),
        "steps-listed": (
            _signed(a1, ALICE, sampling=dict(a1["sampling"], steps=[unsampled])),
            "does not reproduce the listed steps",
        ),
        "proof-of-alice-under-bob": (_signed(a1, BOB), "sampling evidence unusable"),
        "other-run": (_signed(a1, ALICE, run=dict(a1["run"], chain_head=other_head)), "another run"),
        "other-recipe": (_signed(a1, ALICE, run=dict(a1["run"], recipe_sha256="f" * 64)), "another run"),
        "platform": (_signed(a1, ALICE, platform=platform), "platform.os"),
        "free-version": (_signed(a1, ALICE, refreplay_version="anything"), "refreplay_version"),
    }
    certs = {f"{k}.json": c for k, (c, _) in forgeries.items()}
    res = _coverage(run0, certs, tmp_path, keydir)
    assert res.returncode == 1, res.stdout
    for kind, (_, reason) in forgeries.items():
        line = next(x for x in res.stdout.splitlines() if f"/{kind}.json:" in x)
        assert line.startswith("REJECTED") and reason in line, (kind, line)
    assert "0 valid certificate(s)" in res.stdout, res.stdout


def test_clones_and_relabels_count_as_one_auditor(run0, honest, tmp_path, keydir):
    """One certificate copied five times, or relabelled as five auditors and
    signed again by its key, is one auditor's one certificate."""
    [a1, _] = _of(honest, ALICE)
    certs = {f"clone-{i}.json": a1 for i in range(5)}
    certs.update({f"relabel-{i}.json": _signed(a1, ALICE, auditor=f"auditor{i}") for i in range(5)})
    res = _coverage(run0, certs, tmp_path, keydir)
    assert res.returncode == 1, res.stdout
    assert "1 valid certificate(s) from 1 auditor key(s)" in res.stdout, res.stdout
    assert res.stdout.count("a second certificate of key") == 9, res.stdout
    assert "INCOMPLETE sample" in res.stdout  # alice sampled two steps; one is shown


def test_a_key_has_one_sample_per_run(run0, honest, keydir, tmp_path):
    """A key that shows certificates of two beacons (a ground beacon) has all
    of them rejected; `--beacon` rejects certificates of any other beacon."""
    [b1] = _of(honest, BOB)
    head = open_run(run0).head["chain_link"]
    other = next(
        f"{i:02x}"
        for i in range(1, 256)
        if audit.draw_sample(BOB, head, f"{i:02x}", STEPS, 1).steps != b1["sampling"]["steps"]
    )
    second = _certificate_for(
        open_run(run0),
        audit.draw_sample(BOB, head, other, STEPS, 1).steps[0],
        audit.draw_sample(BOB, head, other, STEPS, 1),
        BOB,
    )
    facts, trust = audit.run_facts(open_run(run0)), {BOB.public.fingerprint: BOB.public}
    assert audit.check_certificate(second, facts, trust).ok  # valid alone: a second sample of the key
    res = _coverage(run0, {"first.json": b1, "second.json": second}, tmp_path, keydir)
    assert res.returncode == 1 and res.stdout.count("shows 2 samples of this run") == 2, res.stdout
    res = _coverage(run0, dict(honest), tmp_path, keydir, "--beacon", other)
    assert res.returncode == 1 and res.stdout.count("not the audit's beacon") == 3, res.stdout
    res = _coverage(run0, dict(honest), tmp_path, keydir, "--beacon", BEACON.upper())
    assert res.returncode == 0, res.stdout


# ---- nobody can steer the sample -------------------------------------------------------------------


def test_a_publisher_holding_keys_cannot_choose_their_steps(run0):
    """For keys the publisher holds (trusted, registered before the beacon),
    the steps whose certificates count are exactly the keys' samples: a
    signed certificate for any other step is rejected, whatever else it
    changes, and the sample size only takes a prefix of one fixed order."""
    r = open_run(run0)
    facts, head = audit.run_facts(r), r.head["chain_link"]
    trust = {k.public.fingerprint: k.public for k in (ALICE, BOB)}
    for key in (ALICE, BOB):
        sample = audit.draw_sample(key, head, BEACON, STEPS, 2)
        accepted = set()
        for step in range(1, STEPS + 1):
            cert = _certificate_for(r, step, sample, key)
            if audit.check_certificate(cert, facts, trust).ok:
                accepted.add(step)
        assert accepted == set(sample.steps)
        nested = [set(audit.draw_sample(key, head, BEACON, STEPS, k).steps) for k in range(1, STEPS + 1)]
        assert all(a < b for a, b in zip(nested, nested[1:]))


def _certificate_for(r, step, sample, key):
    """A certificate a key holder could sign for ``step`` without replaying it
    (published hashes copied, the checkpoints listed)."""
    from refreplay.training.run import CKPT_DIR, checkpoint_name

    rec = r.records[step]
    hashes = {"state_root": rec.state_root, "data_hash": rec.data_hash, "chain_link": rec.chain_link}
    start = max(k for k in (0, EVERY, STEPS) if k < step)
    ckpts = [
        {
            "file": f"{CKPT_DIR}/{checkpoint_name(k)}",
            "step": k,
            "state_root": r.records[k].state_root,
            "role": "start" if k == start else "recomputed",
        }
        for k in (0, EVERY, STEPS)
        if start <= k <= step
    ]
    from refreplay import __version__, doctor, spec

    return audit.make_certificate(
        run={"chain_head": r.head["chain_link"], "recipe_sha256": r.recipe_sha256, "steps": STEPS},
        step=step,
        verdict="verified",
        replayed=dict(hashes),
        published=hashes,
        sample=sample,
        auditor="pub",
        key=key,
        spec_version=spec.version(),
        spec_sha256=spec.spec_sha256(),
        refreplay_version=__version__,
        platform=dict(doctor.fingerprint(), device="cpu"),
        checked={"replayed_from": start, "steps": list(range(start + 1, step + 1)), "checkpoints": ckpts},
        warnings=[],
    )


def test_no_other_signature_of_the_sampling_message_verifies():
    """[step.audit.sample.c1] the proof is unique: the same key signs the same
    message to the same bytes, and every other value near it, a PSS signature
    (valid, but randomised) or another key's signature is refused."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding

    head = "ab" * 32
    msg = audit.sample_message(head, BEACON, ALICE.public.fingerprint)
    proof = ALICE.sign(msg)
    assert proof == ALICE.sign(msg) and ALICE.public.verify(msg, proof)
    n = ALICE.public.key.public_numbers().n
    s = int.from_bytes(proof, "big")
    size = ALICE.public.size
    others = [
        (s + n).to_bytes(size + 1, "big"),  # the same residue, one byte longer
        (n - s).to_bytes(size, "big"),
        b"\0" + proof,
        proof[1:] if proof[0] == 0 else proof[:-1],
        ALICE.key.sign(msg, padding.PSS(padding.MGF1(hashes.SHA256()), padding.PSS.MAX_LENGTH), hashes.SHA256()),
        BOB.sign(msg),
    ]
    others += [bytes(proof[:i]) + bytes([proof[i] ^ 1]) + proof[i + 1 :] for i in (0, size // 2, size - 1)]
    for other in others:
        assert not ALICE.public.verify(msg, other)
        with pytest.raises(audit.InputError, match="not the key's signature"):
            audit.verify_sample(ALICE.public, head, BEACON, other, STEPS, 1)
    with pytest.raises(audit.InputError, match="not the key's signature"):  # a proof for another head
        audit.verify_sample(ALICE.public, "cd" * 32, BEACON, proof, STEPS, 1)


def test_a_freely_chosen_secret_selects_nothing(run0, keydir, tmp_path):
    """The old `--secret` is gone: grinding it cannot change a sample."""
    with pytest.raises(SystemExit) as exc:
        run_cli(
            "audit",
            run0,
            "--sample",
            1,
            "--beacon",
            BEACON,
            "--key",
            keydir / "alice.key",
            "--secret",
            "01",
            "--out",
            tmp_path / "c",
        )
    assert exc.value.code == 2
    assert not hasattr(audit, "sample_steps") and not hasattr(audit, "seal")


@pytest.mark.parametrize("kind", ["ed25519", "rsa-1024", "rsa-e3", "private", "garbage", "pkcs1-der"])
def test_keys_that_are_not_auditor_keys_are_refused(kind, run0, honest, tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519, rsa

    pem = serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    text = {
        "ed25519": lambda: ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(*pem),
        "rsa-1024": lambda: rsa.generate_private_key(65537, 1024).public_key().public_bytes(*pem),
        "rsa-e3": lambda: rsa.generate_private_key(3, 2048).public_key().public_bytes(*pem),
        "private": lambda: ALICE.pem(),
        "garbage": lambda: b"\xff\xfe not a key",
        # the same numbers in another DER encoding: would be a second fingerprint of one key
        "pkcs1-der": lambda: (
            ALICE.public.key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.PKCS1).hex().encode()
        ),
    }[kind]()
    f = tmp_path / "k.pem"
    f.write_bytes(text)
    res = run_cli("coverage", run0, tmp_path, "--trust", f)
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stdout + res.stderr
    want = {
        "ed25519": "not an RSA key",
        "rsa-1024": "1024 bits",
        "rsa-e3": "exponent 3",
        "private": "no PEM PUBLIC KEY",
        "garbage": "neither PEM nor",
        "pkcs1-der": "canonical DER",
    }[kind]
    assert want in res.stderr, res.stderr


# ---- keys and writes ----------------------------------------------------------------------------


def test_keygen_writes_a_private_key_only_its_owner_reads(tmp_path):
    res = run_cli("keygen", "--out", tmp_path / "carol", "--bits", 2048)
    assert res.returncode == 0, res.stdout + res.stderr
    private, public = tmp_path / "carol.key", tmp_path / "carol.pub.pem"
    assert os.stat(private).st_mode & 0o777 == 0o600
    key = keys.load_private(private)
    assert key.public.fingerprint in res.stdout
    assert keys.load_trusted([public]) == {key.public.fingerprint: key.public}
    assert keys.load_trusted([tmp_path]) == {key.public.fingerprint: key.public}  # a directory of *.pem
    hexfile = tmp_path / "trusted.txt"
    hexfile.write_text(f"# carol\n{key.public.der.hex()}\n")
    assert keys.load_trusted([hexfile]) == {key.public.fingerprint: key.public}
    before = private.read_bytes()
    res = run_cli("keygen", "--out", tmp_path / "carol")
    assert res.returncode == 2 and "refusing to replace" in res.stderr and private.read_bytes() == before
    res = run_cli("keygen", "--out", tmp_path / "dave", "--bits", 1024)
    assert res.returncode == 2 and not (tmp_path / "dave.key").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporaries left


def test_audit_warns_about_a_private_key_others_can_read(run0, keydir, tmp_path):
    loose = tmp_path / "loose.key"
    shutil.copy(keydir / "alice.key", loose)
    loose.chmod(0o644)
    res = run_cli("audit", run0, "--sample", 1, "--beacon", BEACON, "--key", loose, "--out", tmp_path / "c", "--quiet")
    assert res.returncode == 0 and "can be read by other users" in res.stderr, res.stderr
    res = run_cli(
        "audit",
        run0,
        "--sample",
        1,
        "--beacon",
        BEACON,
        "--key",
        keydir / "alice.key",
        "--out",
        tmp_path / "c",
        "--quiet",
    )
    assert res.returncode == 0 and "warning" not in res.stderr, res.stderr


def test_audit_refuses_a_key_that_is_not_a_private_key(run0, keydir, tmp_path):
    res = run_cli(
        "audit", run0, "--sample", 1, "--beacon", BEACON, "--key", keydir / "alice.pub.pem", "--out", tmp_path / "c"
    )
    assert res.returncode == 2 and "not a PEM private key" in res.stderr, res.stderr
    assert not (tmp_path / "c").exists()


def test_audit_refuses_an_encrypted_or_foreign_private_key(run0, tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    enc = tmp_path / "enc.key"
    enc.write_bytes(
        ALICE.key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.BestAvailableEncryption(b"pw")
        )
    )
    ed = tmp_path / "ed.key"
    ed.write_bytes(
        ed25519.Ed25519PrivateKey.generate().private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    for f, words in ((enc, "is encrypted"), (ed, "not an RSA private key")):
        res = run_cli("audit", run0, "--sample", 1, "--beacon", BEACON, "--key", f, "--out", tmp_path / "c")
        assert res.returncode == 2 and words in res.stderr and "Traceback" not in res.stderr, res.stderr


def test_a_link_planted_in_out_is_not_written_through(run0, keydir, tmp_path):
    r = open_run(run0)
    sample = audit.draw_sample(ALICE, r.head["chain_link"], BEACON, STEPS, 1)
    cert = {
        "run": {"chain_head": r.head["chain_link"]},
        "key": {"fingerprint": ALICE.public.fingerprint},
        "sampling": {"proof": sample.proof.hex()},
        "step": sample.steps[0],
    }
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    (out / audit.certificate_name(cert)).symlink_to(victim)
    res = run_cli(
        "audit", run0, "--sample", 1, "--beacon", BEACON, "--key", keydir / "alice.key", "--out", out, "--quiet"
    )
    assert res.returncode == 2 and "symbolic link" in res.stderr, res.stdout + res.stderr
    assert victim.read_text() == "keep me" and (out / audit.certificate_name(cert)).is_symlink()
    assert sorted(p.name for p in out.iterdir()) == [audit.certificate_name(cert)]


@pytest.mark.parametrize(
    "err,words", [(errno.ENOSPC, "no space left"), (errno.EROFS, "read-only"), (errno.EACCES, "permission denied")]
)
def test_a_failed_write_is_exit_2_and_leaves_no_file(run0, keydir, tmp_path, monkeypatch, err, words):
    from refreplay import files

    def fail(fd):
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(files.os, "fsync", fail)
    out = tmp_path / "out"
    res = run_cli(
        "audit", run0, "--sample", 1, "--beacon", BEACON, "--key", keydir / "alice.key", "--out", out, "--quiet"
    )
    assert res.returncode == 2 and words in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert list(out.iterdir()) == []  # no 0-byte certificate, no temporary


# ---- fuzz: a damaged certificate is never counted -------------------------------------------------


def _fuzz(n):
    return settings(
        max_examples=n,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )


@_fuzz(40)
@given(data=st.data())
def test_fuzzed_certificates_are_rejected_never_counted(run0, honest, tmp_path_factory, keydir, data):
    _fuzz_case(run0, honest, tmp_path_factory, keydir, data)


@pytest.mark.slow
@_fuzz(2000)
@given(data=st.data())
def test_fuzzed_certificates_are_rejected_never_counted_slow(run0, honest, tmp_path_factory, keydir, data):
    _fuzz_case(run0, honest, tmp_path_factory, keydir, data)


def _fuzz_case(run0, honest, tmp_path_factory, keydir, data):
    """A real certificate with one to three fields replaced, deleted or added,
    left as it is or signed again (by an untrusted key, or by its own key as a
    forger holding it would): coverage exits 1 or 2 without a traceback and
    counts nothing, except a harmless change signed by the certificate's own
    key, which must then pass check_certificate."""
    original = data.draw(st.sampled_from(sorted(honest)))
    cert = data.draw(mutated(honest[original]))
    if cert == honest[original]:
        return
    resign, signer = data.draw(st.booleans()), None  # as mallory, or as alice herself (a forger with the key)
    if resign:
        signer = data.draw(st.sampled_from([ALICE, MALLORY]))
        try:
            cert = dict(cert, signature=signer.sign(audit.certificate_message(cert)).hex())
        except (TypeError, ValueError):  # not canonical-JSON-able (e.g. huge floats): leave it
            pass
    tmp = tmp_path_factory.mktemp("fuzz")
    (tmp / "c.json").write_text(json.dumps(cert))
    res = run_cli("coverage", run0, tmp, *_trust(keydir))
    text = res.stdout + res.stderr
    assert "Traceback" not in text and res.returncode in (0, 1, 2), text
    if "1 valid certificate(s)" in text:  # only a certificate re-signed by its key, with a harmless change
        assert resign and signer is ALICE, text
        facts = audit.run_facts(open_run(run0))
        trust = {k.public.fingerprint: k.public for k in (ALICE, BOB)}
        assert audit.check_certificate(json.loads((tmp / "c.json").read_text()), facts, trust).ok
    else:
        assert res.returncode in (1, 2) and ("0 valid certificate(s)" in text or res.returncode == 2), text


def test_concurrent_audits_into_one_directory_keep_every_certificate(run0, keydir, tmp_path):
    """Two auditors' `refreplay audit` processes writing into the same --out at
    once: every certificate of both arrives whole (names are unique per run,
    key, sample and step; each is written atomically), and coverage counts
    both auditors."""
    import os
    import subprocess
    import sys

    out = tmp_path / "shared"
    env = dict(os.environ, NUMBA_NUM_THREADS="1")
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "refreplay",
                "audit",
                str(run0),
                "--sample",
                "2",
                "--beacon",
                BEACON,
                "--key",
                str(keydir / f"{name}.key"),
                "--auditor",
                name,
                "--out",
                str(out),
                "--quiet",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("alice", "bob")
    ]
    try:
        results = [p.communicate(timeout=600) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], results
    certs = {p.name: json.loads(p.read_text()) for p in sorted(out.glob("*.json"))}
    assert len(certs) == 4 and len(_of(certs, ALICE)) == 2 and len(_of(certs, BOB)) == 2
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary left
    res = run_cli("coverage", run0, out, *_trust(keydir))
    assert res.returncode == 0 and "4 valid certificate(s) from 2 auditor key(s)" in res.stdout, res.stdout
