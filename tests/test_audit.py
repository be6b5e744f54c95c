"""Audit sampling, certificates and coverage arithmetic (no replay here; the
end-to-end replay/audit tests are in test_replay.py)."""

import itertools
import math
from fractions import Fraction

import pytest

from refreplay.verify import audit
from refreplay.errors import InputError

import auditor_keys

KEY, BOB = auditor_keys.key("alice"), auditor_keys.key("bob")


def _pkcs1_hex(key):
    """The public key's numbers in PKCS#1 DER: a valid key, not the canonical encoding."""
    from cryptography.hazmat.primitives import serialization

    return key.public.key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.PKCS1).hex()


HEAD = "ab" * 32
BEACON = "00112233445566778899aabbccddeeff"


def test_sampling_is_a_pure_function_and_depends_on_every_input():
    """[step.audit.sample.c1] the sample follows from (key, head, beacon) alone."""
    a = audit.draw_sample(KEY, HEAD, BEACON, 30, 4)
    assert a == audit.draw_sample(KEY, HEAD, BEACON, 30, 4)
    assert a.steps == audit.verify_sample(KEY.public, HEAD, BEACON, a.proof, 30, 4)
    assert len(set(a.steps)) == 4 and all(1 <= s <= 30 for s in a.steps) and a.steps == sorted(a.steps)
    others = {
        tuple(audit.draw_sample(k, h, b, 30, 4).steps)
        for k, h, b in [(KEY, "cd" * 32, BEACON), (KEY, HEAD, "ff" + BEACON[2:]), (BOB, HEAD, BEACON)]
    }
    assert tuple(a.steps) not in others


def test_sampling_is_uniform_over_steps():
    # 3000 samples of 1 step out of 6: each step ~500 times; chi-square, 5 dof
    counts = [0] * 6
    for i in range(3000):
        counts[audit.steps_from_proof(i.to_bytes(4, "little"), 6, 1)[0] - 1] += 1
    chi2 = sum((c - 500) ** 2 / 500 for c in counts)
    assert chi2 < 20.5  # p ~ 0.001 for 5 degrees of freedom


def test_sampling_rejects_bad_input():
    with pytest.raises(InputError):
        audit.draw_sample(KEY, HEAD, "xyz", 10, 2)
    with pytest.raises(InputError):
        audit.draw_sample(KEY, HEAD, BEACON, 10, 11)
    with pytest.raises(InputError):
        audit.draw_sample(KEY, HEAD, "ab" * 257, 10, 2)  # longer than a beacon may be


def test_escape_probability_matches_enumeration():
    n, ks, t = 7, [2, 3], 2
    tampered = {1, 5}
    total = escaped = 0
    for s1 in itertools.combinations(range(1, n + 1), ks[0]):
        for s2 in itertools.combinations(range(1, n + 1), ks[1]):
            total += 1
            escaped += not (tampered & (set(s1) | set(s2)))
    assert audit.escape_probability(n, ks, t) == Fraction(escaped, total)


def test_escape_probability_hypergeometric_single_auditor():
    # N=100, k=10, t=5: C(95,10)/C(100,10)
    assert audit.escape_probability(100, [10], 5) == Fraction(math.comb(95, 10), math.comb(100, 10))
    assert audit.escape_probability(10, [10], 1) == 0


RECIPE = "e" * 64
FACTS = None  # set below, once PUBLISHED exists


def _cert(beacon=BEACON, step=None, key=None, **over):
    key = key or KEY
    sample = audit.draw_sample(key, HEAD, beacon, 20, 3)
    step = sample.steps[0] if step is None else step
    hashes = {"state_root": f"{step:064x}", "data_hash": "d" * 64, "chain_link": "c" * 64}
    start = max(k for k in CHECKPOINTS if k < step)
    ckpts = [
        {
            "file": f"checkpoints/step-{k:07d}.safetensors",
            "step": k,
            "state_root": f"{k:064x}",
            "role": "start" if k == start else "recomputed",
        }
        for k in CHECKPOINTS
        if start <= k <= step
    ]
    fields = dict(
        run={"chain_head": HEAD, "recipe_sha256": RECIPE, "steps": 20},
        step=step,
        verdict="verified",
        replayed=dict(hashes),
        published=hashes,
        sample=sample,
        key=key,
        auditor="alice",
        spec_version="0.1.0",
        spec_sha256="5" * 64,
        refreplay_version="0.1.0",
        platform=dict(PLATFORM),
        checked={"replayed_from": start, "steps": list(range(start + 1, step + 1)), "checkpoints": ckpts},
        warnings=[],
    )
    fields.update(over)
    return audit.make_certificate(**fields)


PLATFORM = {
    "cpu_model": "AMD EPYC 9B45",
    "cpu_llvm_name": "znver5",
    "isa": ["avx", "avx2", "sse2"],
    "machine": "x86_64",
    "os": "Linux-6.8.0-x86_64-with-glibc2.39",
    "cpu_count": 2,
    "python": "CPython 3.12.3",
    "numpy": "2.3.1",
    "numba": "0.62.1",
    "llvmlite": "0.45.1",
    "numba_threads": 2,
    "refreplay": "0.1.0",
    "source_sha256": "a" * 64,
    "spec_version": "0.1.0",
    "spec_sha256": "5" * 64,
    "device": "cpu",
}
TRUST = {k.public.fingerprint: k.public for k in (KEY, BOB)}


PUBLISHED = {s: {"state_root": f"{s:064x}", "data_hash": "d" * 64, "chain_link": "c" * 64} for s in range(0, 21)}
CHECKPOINTS = (0, 5, 10, 15, 20)
FACTS = audit.RunFacts(HEAD, 20, PUBLISHED, RECIPE, "0.1.0", frozenset(CHECKPOINTS))


def _check(cert, facts=None):
    return audit.check_certificate(cert, facts or FACTS, TRUST)


def test_certificates_from_two_auditors_combine():
    c1, c2 = _cert(), _cert(key=BOB, auditor="bob")
    cov = audit.coverage([("a", c1), ("b", c2)], FACTS, TRUST)
    assert not cov.rejected, cov.rejected
    assert set(cov.certified) == {c1["step"], c2["step"]}
    # each key certified one of its three sampled steps: both samples are incomplete
    assert cov.sample_sizes == [] and len(cov.incomplete) == 2
    full = [
        (f"{k.public.fingerprint}-{s}", _cert(key=k, step=s))
        for k in (KEY, BOB)
        for s in audit.draw_sample(k, HEAD, BEACON, 20, 3).steps
    ]
    cov = audit.coverage(full, FACTS, TRUST)
    assert not cov.rejected and cov.sample_sizes == [3, 3] and not cov.incomplete, cov.rejected


def test_altered_or_foreign_certificate_is_rejected():
    good = _cert()
    altered = dict(good, step=good["step"] % 20 + 1)  # signature no longer matches
    foreign = _cert(run={"chain_head": "ee" * 32, "recipe_sha256": "r", "steps": 20})
    unsampled_step = next(s for s in range(1, 21) if s not in good["sampling"]["steps"])
    forged = _cert(step=unsampled_step)  # signed by the key, but for a step its proof did not select
    cov = audit.coverage([("alt", altered), ("foreign", foreign), ("forged", forged), ("x", [1])], FACTS, TRUST)
    assert not cov.certified
    reasons = dict(cov.rejected)
    assert any("signature does not verify" in p for p in reasons["alt"])
    assert any("another run" in p for p in reasons["foreign"])
    assert any("mis-sampled" in p for p in reasons["forged"])
    assert reasons["x"] == ["not a JSON object"]


def test_disagreeing_auditors_are_reported():
    c1 = _cert()
    step = c1["step"]
    bob_beacon = next(f"{i:02x}" for i in range(256) if step in audit.draw_sample(BOB, HEAD, f"{i:02x}", 20, 3).steps)
    bad = {"state_root": "0" * 64, "data_hash": "d" * 64, "chain_link": "c" * 64}
    c2 = _cert(
        bob_beacon,
        step=step,
        key=BOB,
        verdict="mismatch",
        replayed=bad,
        auditor="bob",
        mismatch={"step": step, "kind": "state", "lines": ["differs"]},
    )
    cov = audit.coverage([("a", c1), ("b", c2)], FACTS, TRUST)
    assert not cov.rejected, cov.rejected
    assert step in cov.disagreements and cov.mismatched_steps == [step]


def _resigned(cert, path, value, key=None):
    """The certificate with the field at ``path`` set to ``value`` (deleted for
    DELETE) and signed again by ``key`` (default: its own), as a forger who
    holds the key would."""
    import copy

    c = copy.deepcopy(cert)
    obj = c
    for k in path[:-1]:
        obj = obj[k]
    if value is DELETE:
        del obj[path[-1]]
    else:
        obj[path[-1]] = value
    key = key or KEY
    if path[0] != "key":
        c["key"] = audit.key_field(key.public)
    return {**c, "signature": key.sign(audit.certificate_message(c)).hex()}


DELETE = object()

# [step.verified.c1] [step.audit.cert.c1] every field is checked against the run and the spec: each
# of these forged-but-re-signed certificates (the forger holds a trusted key) must be rejected,
# naming what is wrong
FORGERIES = [
    (("format",), "refreplay-certificate/1", "unsigned certificate"),
    (("format",), "refreplay-certificate/4", "unknown format"),
    (("run", "recipe_sha256"), "f" * 64, "recipe"),
    (("run", "steps"), 21, "steps"),
    (("run", "steps"), True, "steps"),
    (("step",), "3", "not a step"),
    (("step",), 2.0, "not a step"),
    (("verdict",), ["verified"], "verdict"),
    (("replayed", "state_root"), None, "replayed"),
    (("replayed", "extra"), "x", "exactly the fields"),
    (("published", "data_hash"), "D" * 64, "published"),
    (("spec", "version"), "9.9.9", "spec version"),
    (("spec", "sha256"), "xyz", "spec.sha256"),
    (("spec",), "0.1.0", "spec must be an object"),
    (("platform",), [], "platform"),
    (("platform", "cpu_model"), {"nested": 1}, "platform.cpu_model"),
    (("platform", "cpu_model"), "\x1b[2J", "platform.cpu_model"),
    (("platform", "spec_version"), "9.9.9", "platform.spec_version"),
    (("platform", "isa"), ["avx2", "avx"], "platform.isa"),
    (("platform", "isa"), ["quantum"], "platform.isa"),
    (("platform", "numba_threads"), 0, "platform.numba_threads"),
    (("platform", "numpy"), "latest", "platform.numpy"),
    (("platform", "source_sha256"), "x", "platform.source_sha256"),
    (("platform", "refreplay"), "0.2.0", "platform.refreplay"),
    (("platform", "extra"), "1", "platform must have exactly"),
    (("platform", "device"), DELETE, "platform must have exactly"),
    (("auditor",), "../../etc", "auditor"),
    (("refreplay_version",), 1, "refreplay_version"),
    (("refreplay_version",), "0.1.0; trust me", "refreplay_version"),
    (("refreplay_version",), "", "refreplay_version"),
    (("sampling", "k"), "3", "sampling.k"),
    (("sampling", "k"), 4, "does not reproduce"),
    (("sampling", "method"), "refreplay-audit-sample/1", "sampling.method"),
    (("sampling", "steps"), DELETE, "exactly the fields"),
    (("sampling", "beacon"), "C0FFEE", "sampling.beacon"),
    (("sampling", "beacon"), "c0ffef", "proof is not the key's signature"),
    (("sampling", "proof"), "00", "sampling.proof"),
    (("sampling", "secret"), "01", "exactly the fields"),
    (("key", "algorithm"), "ed25519", "key.algorithm"),
    (("key", "fingerprint"), "0" * 64, "key.fingerprint"),
    (("key", "public"), "3000", "key.public"),
    (("key", "public"), _pkcs1_hex(KEY), "canonical DER"),
    (("warnings",), "none", "warnings"),
    (("warnings",), [1], "warnings"),
    (("checked",), DELETE, "missing fields"),
    (("checked", "checkpoints"), [], "every published checkpoint"),
    (("checked", "steps"), [], "every step"),
    (("checked", "replayed_from"), -1, "replayed_from"),
    (("mismatch",), {"step": 1, "kind": "x", "lines": []}, "carries a mismatch"),
    (("surplus",), 1, "unknown fields"),
    (("digest",), "0" * 64, "unsigned certificate"),
]


# ids without the values: some come from a key made at import, which differs in every
# process (pytest-xdist's workers must collect the same ids)
@pytest.mark.parametrize(
    "path,value,needle", FORGERIES, ids=[f"{i}-{'.'.join(p)}-{n[:20]}" for i, (p, _, n) in enumerate(FORGERIES)]
)
def test_every_certificate_field_is_validated(path, value, needle):
    good = _cert()
    assert _check(good).ok
    chk = _check(_resigned(good, path, value))
    assert not chk.ok and any(needle in p for p in chk.problems), chk.problems


def test_this_platform_passes_the_platform_check():
    """The fields doctor.fingerprint() records (plus the device) are the ones
    [step.audit.cert.c1] checks, each with a value its rule accepts."""
    from refreplay import doctor, spec

    fp = dict(doctor.fingerprint(), device="cpu")
    assert set(fp) == set(audit.PLATFORM_FIELDS)
    cert = _cert(
        platform=fp, spec_version=spec.version(), spec_sha256=spec.spec_sha256(), refreplay_version=fp["refreplay"]
    )
    facts = audit.RunFacts(HEAD, 20, PUBLISHED, RECIPE, spec.version(), frozenset(CHECKPOINTS), spec.spec_sha256())
    assert _check(cert, facts).ok, _check(cert, facts).problems


def test_a_certificate_must_name_the_text_of_the_runs_spec_version():
    """[step.verified.c1] where the run's spec version is the running one, the
    certificate's spec.sha256 must be that text's SHA-256, not any 64 hex digits."""
    import dataclasses

    facts = dataclasses.replace(FACTS, spec_sha256="5" * 64)
    assert _check(_cert(), facts).ok
    other = _resigned(_resigned(_cert(), ("spec", "sha256"), "6" * 64), ("platform", "spec_sha256"), "6" * 64)
    assert _check(other).ok  # another version's text: not comparable
    chk = _check(other, facts)
    assert not chk.ok and any("is not the SHA-256 of spec" in p for p in chk.problems), chk.problems


def test_a_later_version_that_replays_the_run_may_certify_it():
    """[conv.version.c1] a certificate made under a later spec version that
    replays the run's version covers the run, with that later text's SHA-256;
    any other version does not."""
    import dataclasses

    facts = dataclasses.replace(FACTS, later=(("0.3.0", "7" * 64),))
    later = _cert()
    for path, value in (
        (("spec", "version"), "0.3.0"),
        (("spec", "sha256"), "7" * 64),
        (("platform", "spec_version"), "0.3.0"),
        (("platform", "spec_sha256"), "7" * 64),
    ):
        later = _resigned(later, path, value)
    assert _check(later, facts).ok
    assert not _check(later).ok  # no later version replays the run
    wrong_text = _resigned(_resigned(later, ("spec", "sha256"), "8" * 64), ("platform", "spec_sha256"), "8" * 64)
    chk = _check(wrong_text, facts)
    assert not chk.ok and any("is not the SHA-256 of spec 0.3.0" in p for p in chk.problems), chk.problems
    other = _resigned(_resigned(later, ("spec", "version"), "0.4.0"), ("platform", "spec_version"), "0.4.0")
    chk = _check(other, facts)
    assert not chk.ok and any("nor one that replays it" in p for p in chk.problems), chk.problems


def test_a_verified_certificate_must_list_its_checkpoints():
    step10 = next(f"{i:02x}" for i in range(256) if 10 in audit.draw_sample(KEY, HEAD, f"{i:02x}", 20, 3).steps)
    good = _cert(step10, step=10)  # replayed from 5: lists checkpoints 5 (start) and 10
    assert [a["step"] for a in good["checked"]["checkpoints"]] == [5, 10]
    assert _check(good).ok
    dropped = _resigned(good, ("checked", "checkpoints"), good["checked"]["checkpoints"][:1])
    assert "missing: [10]" in " ".join(_check(dropped).problems)
    wrong_root = _resigned(good, ("checked", "checkpoints", 1, "state_root"), "a" * 64)
    assert any("published root" in p for p in _check(wrong_root).problems)
    # a checkpoint the run does not publish need not (cannot) be listed
    facts = audit.RunFacts(HEAD, 20, PUBLISHED, RECIPE, "0.1.0", frozenset({0, 5, 15, 20}))
    assert _check(dropped, facts).ok
