"""Collective audit: unpredictable step sampling, certificates, coverage.

Many auditors each replay a few steps of a published run.  This module decides
*which* steps (so a publisher cannot predict them), writes what an auditor
certifies, and adds certificates up into coverage with the probability that
tampered steps escaped every sample.  Replaying a step is ``refreplay.verify.replay``.

Sampling (method ``refreplay-audit-sample/1``): the seed is
``SHA-256("refreplay-audit-sample/1" 0x00 chain_head 0x00 beacon 0x00 secret)``
where chain_head is the run's published chain head (hex text), beacon the bytes
of a public random value published *after* the chain head (e.g. a drand round
or a block hash) and secret the auditor's own random bytes, revealed in the
certificate.  Before the certificates appear, the publisher knows neither the
beacon (when it published) nor the secret; afterwards anyone recomputes the
choice.  Steps are drawn without replacement from 1..N by a partial
Fisher-Yates shuffle whose bounded integers come from SHA-256(seed || counter)
64-bit words with rejection (no modulo bias).
"""
from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from fractions import Fraction

from ..errors import InputError

SAMPLE_METHOD = "refreplay-audit-sample/1"
CERT_FORMAT = "refreplay-certificate/2"


def _hex_bytes(text: str, what: str) -> bytes:
    t = text.strip().lower().removeprefix("0x")
    if not t or len(t) % 2 or any(c not in "0123456789abcdef" for c in t):
        raise InputError(f"{what} must be a non-empty even-length hex string, got {text!r}")
    return bytes.fromhex(t)


def sample_seed(chain_head: str, beacon_hex: str, secret_hex: str) -> bytes:
    h = hashlib.sha256()
    h.update(SAMPLE_METHOD.encode() + b"\0")
    h.update(chain_head.encode() + b"\0")
    h.update(_hex_bytes(beacon_hex, "beacon") + b"\0")
    h.update(_hex_bytes(secret_hex, "auditor secret"))
    return h.digest()


class _WordStream:
    """64-bit words SHA-256(seed || counter_le64), four per hash, in order."""

    def __init__(self, seed: bytes):
        self.seed, self.counter, self.buf = seed, 0, []

    def next(self) -> int:
        if not self.buf:
            d = hashlib.sha256(self.seed + self.counter.to_bytes(8, "little")).digest()
            self.counter += 1
            self.buf = [int.from_bytes(d[i:i + 8], "little") for i in range(0, 32, 8)][::-1]
        return self.buf.pop()

    def below(self, n: int) -> int:
        """Uniform integer in [0, n) by rejection: words >= the largest
        multiple of n below 2^64 are discarded."""
        limit = (1 << 64) - ((1 << 64) % n)
        while True:
            w = self.next()
            if w < limit:
                return w % n


def sample_steps(chain_head: str, beacon_hex: str, secret_hex: str, n_steps: int, k: int) -> list[int]:
    """K distinct steps of 1..n_steps, sorted; a pure function of the inputs."""
    if n_steps < 1:
        raise InputError("the run has no steps to sample")
    if not 1 <= k <= n_steps:
        raise InputError(f"--sample must be between 1 and the run's {n_steps} steps, got {k}")
    stream = _WordStream(sample_seed(chain_head, beacon_hex, secret_hex))
    pool = list(range(1, n_steps + 1))
    for i in range(k):  # partial Fisher-Yates: position i takes a draw from [i, n)
        j = i + stream.below(n_steps - i)
        pool[i], pool[j] = pool[j], pool[i]
    return sorted(pool[:k])


# ---- certificates ------------------------------------------------------------


def canonical_json(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def seal(cert: dict) -> dict:
    """Add the certificate's digest: SHA-256 of its canonical JSON without it."""
    body = {k: v for k, v in cert.items() if k != "digest"}
    return {**body, "digest": hashlib.sha256(canonical_json(body)).hexdigest()}


def make_certificate(*, run: dict, step: int, verdict: str, replayed: dict, published: dict,
                     sampling: dict, auditor: str, spec_version: str, spec_sha256: str,
                     refreplay_version: str, platform: dict, checked: dict, warnings: list[str],
                     mismatch: dict | None = None) -> dict:
    """One auditor's statement about one step ([step.verified.c1]).

    ``run``: chain_head, recipe_sha256, steps.  ``replayed``/``published``:
    the step's state_root, data_hash and chain_link as recomputed (None
    each for a mismatch) and as published.  ``sampling``: beacon, secret, k
    and the sampled steps.  ``checked``: what the replay covered
    (``replay_evidence``).  ``warnings``: faults of localisation aids and
    checkpoints passed over, beside the verdict.  ``mismatch``: step, kind and
    lines of the first divergence."""
    cert = {
        "format": CERT_FORMAT,
        "run": run,
        "step": step,
        "verdict": verdict,
        "replayed": replayed,
        "published": published,
        "sampling": {**sampling, "method": SAMPLE_METHOD},
        "auditor": auditor,
        "spec": {"version": spec_version, "sha256": spec_sha256},
        "refreplay_version": refreplay_version,
        "platform": platform,
        "checked": checked,
        "warnings": list(warnings),
    }
    if mismatch is not None:
        cert["mismatch"] = mismatch
    return seal(cert)


def replay_evidence(res) -> dict:
    """The ``checked`` field of a certificate from a replay result: the step
    it started from, the steps it recomputed and matched, and the checkpoints
    it found equal to the replayed state."""
    return {"replayed_from": res.start, "steps": [c.step for c in res.checked],
            "checkpoints": [a.to_json() for a in res.artifacts]}


@dataclass
class CertCheck:
    cert: dict
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass(frozen=True)
class RunFacts:
    """What a certificate is checked against: the run's chain head, step
    count, published hashes, recipe hash, spec version and the steps whose
    checkpoints the run publishes; ``spec_sha256``: the SHA-256 of the spec
    text of the running refreplay when it is of the run's version;
    ``later``: (version, SHA-256) of later spec versions that replay the
    run's ([conv.version.c1]), whose certificates also cover it."""
    chain_head: str
    n_steps: int
    published: dict  # step -> {state_root, data_hash, chain_link}
    recipe_sha256: str
    spec_version: str
    checkpoints: frozenset
    spec_sha256: str | None = None  # None: the running spec is of another version
    later: tuple = ()


def run_facts(run) -> RunFacts:
    from ..training.run import CKPT_DIR, checkpoint_name

    published = {rec.step: {"state_root": rec.state_root, "data_hash": rec.data_hash,
                            "chain_link": rec.chain_link} for rec in run.records}
    present = frozenset(k for k in run.checkpoints if (run.path / CKPT_DIR / checkpoint_name(k)).is_file())
    from .. import spec

    same = run.recipe.spec_version == spec.version()
    later = () if same else ((spec.version(), spec.spec_sha256()),)  # the run opened: this version replays it
    return RunFacts(run.head["chain_link"], run.recipe.steps, published, run.recipe_sha256,
                    run.recipe.spec_version, present, spec.spec_sha256() if same else None, later)


_KEYS = {"format", "run", "step", "verdict", "replayed", "published", "sampling", "auditor", "spec",
         "refreplay_version", "platform", "checked", "warnings", "digest"}
_HASH_KEYS = {"state_root", "data_hash", "chain_link"}
AUDITOR_RE = re.compile(r"[A-Za-z0-9_.@-]{1,64}")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_SHORT = 4096  # longest text field accepted in a certificate


class _Bad(Exception):
    pass


def _need(cond, msg):
    if not cond:
        raise _Bad(msg)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _text(v, what, pattern=None):
    _need(isinstance(v, str) and len(v) <= _SHORT and (pattern is None or pattern.fullmatch(v)),
          f"{what} must be " + ("text" if pattern is None else f"text matching {pattern.pattern}"))


def _keys(obj, keys, what):
    _need(isinstance(obj, dict), f"{what} must be an object")
    _need(set(obj) == set(keys), f"{what} must have exactly the fields {', '.join(sorted(keys))}")


def _hashes(obj, what, nullable):
    _keys(obj, _HASH_KEYS, what)
    for k in sorted(_HASH_KEYS):
        _need(obj[k] is None and nullable or isinstance(obj[k], str) and _HEX64.fullmatch(obj[k]),
              f"{what}.{k} must be 64 lower-case hex digits" + (" or null" if nullable else ""))


def _platform(p):
    _need(isinstance(p, dict) and 0 < len(p) <= 64, "platform must be a non-empty object")
    for k, v in p.items():
        _text(k, "platform field names")
        ok = (v is None or _is_int(v) or isinstance(v, str) and len(v) <= _SHORT
              or isinstance(v, list) and len(v) <= 256 and all(isinstance(x, str) and len(x) <= 64 for x in v))
        _need(ok, f"platform.{k} must be text, an integer, null or a list of short texts")


def _structure(cert, facts: RunFacts):
    """[step.verified.c1] Every field of a certificate: its type, and its value
    against the run and the spec."""
    _need(isinstance(cert, dict), "not a JSON object")
    missing = sorted(_KEYS - set(cert) - {"mismatch"})
    _need(not missing, "missing fields: " + ", ".join(missing))
    extra = sorted(set(cert) - _KEYS - {"mismatch"})
    _need(not extra, "unknown fields: " + ", ".join(extra))
    _need(cert["format"] == CERT_FORMAT, f"unknown format {cert['format']!r} (expected {CERT_FORMAT})")
    _need(isinstance(cert["digest"], str) and seal(cert)["digest"] == cert["digest"],
          "digest does not match the content (altered certificate)")
    _keys(cert["run"], ("chain_head", "recipe_sha256", "steps"), "run")
    _need(cert["run"]["chain_head"] == facts.chain_head, "certificate is for another run (chain head differs)")
    _need(cert["run"]["recipe_sha256"] == facts.recipe_sha256,
          "run.recipe_sha256 is not the run's recipe hash")
    _need(cert["run"]["steps"] == facts.n_steps and _is_int(cert["run"]["steps"]),
          f"run.steps is not the run's {facts.n_steps} steps")
    step = cert["step"]
    _need(_is_int(step) and 1 <= step <= facts.n_steps, f"step {step!r} is not a step of this run")
    _need(cert["verdict"] in ("verified", "mismatch"), f"unknown verdict {cert['verdict']!r}")
    verified = cert["verdict"] == "verified"
    _hashes(cert["published"], "published", False)
    _hashes(cert["replayed"], "replayed", not verified)
    _keys(cert["spec"], ("version", "sha256"), "spec")
    cv, later = cert["spec"]["version"], dict(facts.later)
    _need(cv == facts.spec_version or cv in later,
          f"spec.version {cv!r} is not the run's spec version {facts.spec_version!r}"
          + (f" nor one that replays it ({', '.join(later)})" if later else ""))
    _text(cert["spec"]["sha256"], "spec.sha256", _HEX64)
    want = facts.spec_sha256 if cv == facts.spec_version else later.get(cv)
    _need(want is None or cert["spec"]["sha256"] == want,
          f"spec.sha256 {cert['spec']['sha256']} is not the SHA-256 of spec {cv}'s text ({want})")
    _text(cert["auditor"], "auditor", AUDITOR_RE)
    _text(cert["refreplay_version"], "refreplay_version")
    _platform(cert["platform"])
    for k in ("spec_version", "spec_sha256"):
        if k in cert["platform"]:
            want = cert["spec"]["version" if k == "spec_version" else "sha256"]
            _need(cert["platform"][k] == want, f"platform.{k} differs from the certificate's spec field")
    _need(isinstance(cert["warnings"], list) and len(cert["warnings"]) <= 1024
          and all(isinstance(w, str) and len(w) <= _SHORT for w in cert["warnings"]),
          "warnings must be a list of texts")
    if verified:
        _need("mismatch" not in cert, "a verified certificate carries a mismatch")
    else:
        _keys(cert.get("mismatch"), ("step", "kind", "lines"), "mismatch")
        m = cert["mismatch"]
        _need(_is_int(m["step"]) and 0 <= m["step"] <= step, "mismatch.step is not a step up to the certified one")
        _text(m["kind"], "mismatch.kind")
        _need(isinstance(m["lines"], list) and len(m["lines"]) <= 4096
              and all(isinstance(x, str) and len(x) <= _SHORT for x in m["lines"]),
              "mismatch.lines must be a list of texts")
    _sampling(cert, facts)
    _checked(cert, facts, verified)


def _sampling(cert, facts):
    s = cert["sampling"]
    _keys(s, ("beacon", "secret", "k", "steps", "method"), "sampling")
    _need(s["method"] == SAMPLE_METHOD, f"sampling.method is not {SAMPLE_METHOD}")
    _text(s["beacon"], "sampling.beacon")
    _text(s["secret"], "sampling.secret")
    _need(_is_int(s["k"]) and 1 <= s["k"] <= facts.n_steps, "sampling.k is not a sample size for this run")
    _need(isinstance(s["steps"], list) and all(_is_int(x) for x in s["steps"]), "sampling.steps must list steps")
    try:
        chosen = sample_steps(facts.chain_head, s["beacon"], s["secret"], facts.n_steps, s["k"])
    except InputError as exc:
        raise _Bad(f"sampling evidence unusable: {exc}") from None
    _need(chosen == s["steps"], "sampling evidence does not reproduce the listed steps")
    _need(cert["step"] in chosen, f"step {cert['step']} was not selected by the sampling evidence")


def _checked(cert, facts, verified):
    """[step.verified.c1] A verified step lists a replay from a checkpoint
    before it through the step, and every checkpoint the run publishes for a
    recomputed step, each with the published root of its step."""
    from ..training.run import CKPT_DIR, checkpoint_name

    c = cert["checked"]
    _keys(c, ("replayed_from", "steps", "checkpoints"), "checked")
    step = cert["step"]
    start = c["replayed_from"]
    _need(_is_int(start) and 0 <= start < step, "checked.replayed_from is not a step before the certified one")
    _need(isinstance(c["steps"], list) and all(_is_int(x) for x in c["steps"]), "checked.steps must list steps")
    _need(isinstance(c["checkpoints"], list) and len(c["checkpoints"]) <= facts.n_steps + 1,
          "checked.checkpoints must be a list")
    seen = {}
    for i, a in enumerate(c["checkpoints"]):
        _keys(a, ("file", "step", "state_root", "role"), f"checked.checkpoints[{i}]")
        _need(_is_int(a["step"]) and a["step"] in facts.checkpoints and start <= a["step"] <= step,
              f"checked.checkpoints[{i}] names no published checkpoint of the replayed range")
        _need(a["file"] == f"{CKPT_DIR}/{checkpoint_name(a['step'])}", f"checked.checkpoints[{i}].file is wrong")
        _need(a["role"] in ("start", "recomputed"), f"checked.checkpoints[{i}].role is unknown")
        _need(a["state_root"] == facts.published[a["step"]]["state_root"],
              f"checked.checkpoints[{i}] does not carry the published root of step {a['step']}")
        seen[a["step"]] = a["role"]
    if not verified:
        return
    _need(c["steps"] == list(range(start + 1, step + 1)),
          "a verified certificate must list every step from its starting point to the certified step")
    covered = {k for k in facts.checkpoints if start <= k <= step}
    _need(covered <= set(seen),
          "a verified certificate must list every published checkpoint of the steps it recomputed "
          f"(missing: {sorted(covered - set(seen))})")


def check_certificate(cert, facts: RunFacts) -> CertCheck:
    """Validate a certificate against the run it claims to certify: an empty
    problem list means every field has its type, the certificate is
    unaltered, belongs to this run and this spec version, certifies a step its
    sampling evidence really selected, its hashes are the run's, and (when
    verified) it lists the replay and the checkpoints [step.verified.c1]
    requires."""
    out = CertCheck(cert if isinstance(cert, dict) else {})
    if isinstance(cert, InputError):  # the file could not be read as JSON
        out.problems.append(f"unusable certificate file: {cert}")
        return out
    try:
        _structure(cert, facts)
        step = cert["step"]
        _need(cert["published"] == {k: facts.published[step][k] for k in _HASH_KEYS},
              f"published hashes in the certificate differ from the run's for step {step}")
        if cert["verdict"] == "verified":
            _need(cert["replayed"] == cert["published"], "verdict 'verified' but replayed hashes differ from published")
    except _Bad as exc:
        out.problems.append(str(exc))
    return out


# ---- coverage --------------------------------------------------------------------


def escape_probability(n_steps: int, sample_sizes: list[int], tampered: int) -> Fraction:
    """Exact probability that `tampered` fixed steps all escape independent
    auditors each sampling k_a distinct steps uniformly from n_steps:
    prod_a C(N - t, k_a) / C(N, k_a)  (hypergeometric, zero successes)."""
    p = Fraction(1)
    for k in sample_sizes:
        p *= Fraction(math.comb(n_steps - tampered, k), math.comb(n_steps, k))
    return p


@dataclass
class Coverage:
    n_steps: int
    certified: dict[int, list[dict]]
    rejected: list[tuple[str, list[str]]]
    disagreements: dict[int, list[str]]
    sample_sizes: list[int]

    @property
    def percent(self) -> float:
        return 100.0 * len(self.certified) / self.n_steps

    @property
    def mismatched_steps(self) -> list[int]:
        return sorted(s for s, cs in self.certified.items() if any(c["verdict"] != "verified" for c in cs))


def coverage(certs: list[tuple[str, object]], facts: RunFacts) -> Coverage:
    """Combine certificates (source name, parsed JSON) into coverage; a
    certificate that fails ``check_certificate`` is rejected, with its
    problems."""
    n_steps = facts.n_steps
    certified: dict[int, list[dict]] = {}
    rejected = []
    samples: dict[tuple, int] = {}
    for name, cert in certs:
        chk = check_certificate(cert, facts)
        if not chk.ok:
            rejected.append((name, chk.problems))
            continue
        certified.setdefault(cert["step"], []).append(cert)
        s = cert["sampling"]
        samples[(cert["auditor"], s["beacon"], s["secret"])] = s["k"]
    disagreements = {}
    for step, cs in certified.items():
        verdicts = {(c["verdict"], json.dumps(c["replayed"], sort_keys=True)) for c in cs}
        if len(verdicts) > 1:
            disagreements[step] = sorted(f"{c['auditor']}: {c['verdict']}" for c in cs)
    return Coverage(n_steps, certified, rejected, disagreements, list(samples.values()))
