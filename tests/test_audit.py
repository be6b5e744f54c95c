"""Audit sampling, certificates and coverage arithmetic (no replay here; the
end-to-end replay/audit tests are in test_replay.py)."""
import itertools
import math
from fractions import Fraction

import pytest

from refreplay.verify import audit
from refreplay.errors import InputError

HEAD = "ab" * 32
BEACON = "00112233445566778899aabbccddeeff"


def test_sampling_is_a_pure_function_and_depends_on_every_input():
    a = audit.sample_steps(HEAD, BEACON, "5ec7e7", 30, 4)
    assert a == audit.sample_steps(HEAD, BEACON, "5ec7e7", 30, 4)
    assert len(set(a)) == 4 and all(1 <= s <= 30 for s in a) and a == sorted(a)
    others = {tuple(audit.sample_steps(h, b, s, 30, 4)) for h, b, s in [
        ("cd" * 32, BEACON, "5ec7e7"), (HEAD, "ff" + BEACON[2:], "5ec7e7"), (HEAD, BEACON, "5ec7e8")]}
    assert tuple(a) not in others


def test_sampling_is_uniform_over_steps():
    # 3000 samples of 1 step out of 6: each step ~500 times; chi-square, 5 dof
    counts = [0] * 6
    for i in range(3000):
        counts[audit.sample_steps(HEAD, BEACON, f"{i:08x}", 6, 1)[0] - 1] += 1
    chi2 = sum((c - 500) ** 2 / 500 for c in counts)
    assert chi2 < 20.5  # p ~ 0.001 for 5 degrees of freedom


def test_sampling_rejects_bad_input():
    with pytest.raises(InputError):
        audit.sample_steps(HEAD, "xyz", "00", 10, 2)
    with pytest.raises(InputError):
        audit.sample_steps(HEAD, BEACON, "00", 10, 11)


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


def _cert(secret, step=None, **over):
    steps = audit.sample_steps(HEAD, BEACON, secret, 20, 3)
    step = steps[0] if step is None else step
    hashes = {"state_root": f"{step:064x}", "data_hash": "d" * 64, "chain_link": "c" * 64}
    start = max(k for k in CHECKPOINTS if k < step)
    ckpts = [{"file": f"checkpoints/step-{k:07d}.safetensors", "step": k, "state_root": f"{k:064x}",
              "role": "start" if k == start else "recomputed"} for k in CHECKPOINTS if start <= k <= step]
    fields = dict(run={"chain_head": HEAD, "recipe_sha256": RECIPE, "steps": 20}, step=step,
                  verdict="verified", replayed=dict(hashes), published=hashes,
                  sampling={"beacon": BEACON, "secret": secret, "k": 3, "steps": steps},
                  auditor="alice", spec_version="0.1.0", spec_sha256="5" * 64,
                  refreplay_version="0.1.0", platform={"cpu": "x", "spec_version": "0.1.0"},
                  checked={"replayed_from": start, "steps": list(range(start + 1, step + 1)),
                           "checkpoints": ckpts}, warnings=[])
    fields.update(over)
    return audit.make_certificate(**fields)


PUBLISHED = {s: {"state_root": f"{s:064x}", "data_hash": "d" * 64, "chain_link": "c" * 64}
             for s in range(0, 21)}
CHECKPOINTS = (0, 5, 10, 15, 20)
FACTS = audit.RunFacts(HEAD, 20, PUBLISHED, RECIPE, "0.1.0", frozenset(CHECKPOINTS))


def test_certificates_from_two_auditors_combine():
    c1, c2 = _cert("01"), _cert("02", auditor="bob")
    cov = audit.coverage([("a", c1), ("b", c2)], FACTS)
    assert not cov.rejected, cov.rejected
    assert set(cov.certified) == {c1["step"], c2["step"]}
    assert cov.sample_sizes == [3, 3]


def test_altered_or_foreign_certificate_is_rejected():
    good = _cert("01")
    altered = dict(good, step=good["step"] % 20 + 1)  # digest no longer matches
    foreign = _cert("01", run={"chain_head": "ee" * 32, "recipe_sha256": "r", "steps": 20})
    unsampled_step = next(s for s in range(1, 21) if s not in good["sampling"]["steps"])
    forged = _cert("01", step=unsampled_step)
    cov = audit.coverage([("alt", altered), ("foreign", foreign), ("forged", forged), ("x", [1])], FACTS)
    assert not cov.certified
    reasons = dict(cov.rejected)
    assert any("altered" in p for p in reasons["alt"])
    assert any("another run" in p for p in reasons["foreign"])
    assert any("not selected" in p for p in reasons["forged"])
    assert reasons["x"] == ["not a JSON object"]


def test_disagreeing_auditors_are_reported():
    c1 = _cert("01")
    step = c1["step"]
    bad = {"state_root": "0" * 64, "data_hash": "d" * 64, "chain_link": "c" * 64}
    c2 = _cert("01", verdict="mismatch", replayed=bad, auditor="bob",
               mismatch={"step": step, "kind": "state", "lines": ["differs"]})
    cov = audit.coverage([("a", c1), ("b", c2)], FACTS)
    assert not cov.rejected, cov.rejected
    assert step in cov.disagreements and cov.mismatched_steps == [step]


def _resealed(cert, path, value):
    """The certificate with the field at ``path`` set to ``value`` (deleted for
    DELETE) and its digest recomputed, as a forger would."""
    import copy

    c = copy.deepcopy(cert)
    obj = c
    for k in path[:-1]:
        obj = obj[k]
    if value is DELETE:
        del obj[path[-1]]
    else:
        obj[path[-1]] = value
    return audit.seal(c)


DELETE = object()

# [step.verified.c1] every field is checked against the run and the spec: each of these
# forged-but-resealed certificates must be rejected, naming what is wrong
FORGERIES = [
    (("format",), "refreplay-certificate/1", "format"),
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
    (("platform", "cpu"), {"nested": 1}, "platform.cpu"),
    (("platform", "spec_version"), "9.9.9", "platform.spec_version"),
    (("auditor",), "../../etc", "auditor"),
    (("refreplay_version",), 1, "refreplay_version"),
    (("sampling", "k"), "3", "sampling.k"),
    (("sampling", "method"), "other", "sampling.method"),
    (("sampling", "steps"), DELETE, "exactly the fields"),
    (("warnings",), "none", "warnings"),
    (("warnings",), [1], "warnings"),
    (("checked",), DELETE, "missing fields"),
    (("checked", "checkpoints"), [], "every published checkpoint"),
    (("checked", "steps"), [], "every step"),
    (("checked", "replayed_from"), -1, "replayed_from"),
    (("mismatch",), {"step": 1, "kind": "x", "lines": []}, "carries a mismatch"),
    (("surplus",), 1, "unknown fields"),
]


@pytest.mark.parametrize("path,value,needle", FORGERIES, ids=lambda x: str(x)[:24])
def test_every_certificate_field_is_validated(path, value, needle):
    good = _cert("01")
    assert audit.check_certificate(good, FACTS).ok
    chk = audit.check_certificate(_resealed(good, path, value), FACTS)
    assert not chk.ok and any(needle in p for p in chk.problems), chk.problems


def test_a_certificate_must_name_the_text_of_the_runs_spec_version():
    """[step.verified.c1] where the run's spec version is the running one, the
    certificate's spec.sha256 must be that text's SHA-256, not any 64 hex digits."""
    import dataclasses

    facts = dataclasses.replace(FACTS, spec_sha256="5" * 64)
    assert audit.check_certificate(_cert("01"), facts).ok
    other = _resealed(_cert("01"), ("spec", "sha256"), "6" * 64)
    assert audit.check_certificate(other, FACTS).ok  # another version's text: not comparable
    chk = audit.check_certificate(other, facts)
    assert not chk.ok and any("is not the SHA-256 of spec" in p for p in chk.problems), chk.problems


def test_a_later_version_that_replays_the_run_may_certify_it():
    """[conv.version.c1] a certificate made under a later spec version that
    replays the run's version covers the run, with that later text's SHA-256;
    any other version does not."""
    import dataclasses

    facts = dataclasses.replace(FACTS, later=(("0.3.0", "7" * 64),))
    later = _cert("01")
    for path, value in ((("spec", "version"), "0.3.0"), (("spec", "sha256"), "7" * 64),
                        (("platform", "spec_version"), "0.3.0"), (("platform", "spec_sha256"), "7" * 64)):
        if path[0] == "spec" or path[1] in later["platform"]:
            later = _resealed(later, path, value)
    assert audit.check_certificate(later, facts).ok
    assert not audit.check_certificate(later, FACTS).ok  # no later version replays the run
    wrong_text = _resealed(later, ("spec", "sha256"), "8" * 64)
    chk = audit.check_certificate(wrong_text, facts)
    assert not chk.ok and any("is not the SHA-256 of spec 0.3.0" in p for p in chk.problems), chk.problems
    other = _resealed(later, ("spec", "version"), "0.4.0")
    if "spec_version" in other["platform"]:
        other = _resealed(other, ("platform", "spec_version"), "0.4.0")
    chk = audit.check_certificate(other, facts)
    assert not chk.ok and any("nor one that replays it" in p for p in chk.problems), chk.problems


def test_a_verified_certificate_must_list_its_checkpoints():
    good = _cert("01", step=10)  # replayed from 5: lists checkpoints 5 (start) and 10
    assert [a["step"] for a in good["checked"]["checkpoints"]] == [5, 10]
    assert audit.check_certificate(good, FACTS).ok
    dropped = _resealed(good, ("checked", "checkpoints"), good["checked"]["checkpoints"][:1])
    assert "missing: [10]" in " ".join(audit.check_certificate(dropped, FACTS).problems)
    wrong_root = _resealed(good, ("checked", "checkpoints", 1, "state_root"), "a" * 64)
    assert any("published root" in p for p in audit.check_certificate(wrong_root, FACTS).problems)
    # a checkpoint the run does not publish need not (cannot) be listed
    facts = audit.RunFacts(HEAD, 20, PUBLISHED, RECIPE, "0.1.0", frozenset({0, 5, 15, 20}))
    assert audit.check_certificate(dropped, facts).ok
