"""Collective audit: sampling nobody can steer, signed certificates, coverage.

Many auditors each replay a few steps of a published run.  This module decides
*which* steps, writes and signs what an auditor certifies, and adds
certificates up into coverage with the probability that tampered steps
escaped every sample.  Replaying a step is ``refreplay.verify.replay``; keys
and signatures are ``refreplay.verify.keys`` (the ``cryptography`` package).

Sampling (method ``refreplay-audit-sample/2``, [step.audit.sample.c1]): the
auditor signs the message ``"refreplay-audit-sample/2" 0x00 fingerprint 0x00
chain_head 0x00 beacon`` with its registered RSA key (PKCS#1 v1.5, SHA-256);
that signature is unique for the key, so it is a verifiable random function
(an RSA-FDH-VRF in the spirit of RFC 9381 section 5): the proof is the
signature, the output SHA-256(proof) seeds the draw.  Nobody can steer the
sample: not the publisher (the beacon comes after the chain head), not the
auditor (one key, one head, one beacon: one proof).  Steps are drawn without
replacement from 1..N by a partial Fisher-Yates shuffle whose bounded integers
come from SHA-256(seed || counter) 64-bit words with rejection (no modulo
bias).

Certificates ([step.audit.cert.c1]) are signed by the same key over their
canonical JSON without the signature.  ``certify_step`` makes one from a
replay and ``write_certificate`` writes it; both serve every caller (the
``audit`` and ``demo`` commands, and later a cluster's client), so there is
one certificate writer.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from fractions import Fraction

from ..errors import InputError
from . import keys

SAMPLE_METHOD = "refreplay-audit-sample/2"
CERT_FORMAT = "refreplay-certificate/3"
UNSIGNED_FORMATS = ("refreplay-certificate/1", "refreplay-certificate/2")  # sealed by an unkeyed digest
MAX_BEACON = 256  # bytes


def _hex_bytes(text: str, what: str, limit: int = MAX_BEACON) -> bytes:
    if not isinstance(text, str):
        raise InputError(f"{what} must be hex text")
    t = text.strip().lower().removeprefix("0x")
    if not t or len(t) % 2 or any(c not in "0123456789abcdef" for c in t):
        raise InputError(f"{what} must be a non-empty even-length hex string, got {text[:80]!r}")
    if len(t) > 2 * limit:
        raise InputError(f"{what} is longer than {limit} bytes")
    return bytes.fromhex(t)


def sample_message(chain_head: str, beacon_hex: str, fingerprint: str) -> bytes:
    """[step.audit.sample.c1] What an auditor signs to draw its sample."""
    return (
        SAMPLE_METHOD.encode()
        + b"\0"
        + _hex_bytes(fingerprint, "key fingerprint", 32)
        + b"\0"
        + chain_head.encode()
        + b"\0"
        + _hex_bytes(beacon_hex, "beacon")
    )


class _WordStream:
    """64-bit words SHA-256(seed || counter_le64), four per hash, in order."""

    def __init__(self, seed: bytes):
        self.seed, self.counter, self.buf = seed, 0, []

    def next(self) -> int:
        if not self.buf:
            d = hashlib.sha256(self.seed + self.counter.to_bytes(8, "little")).digest()
            self.counter += 1
            self.buf = [int.from_bytes(d[i : i + 8], "little") for i in range(0, 32, 8)][::-1]
        return self.buf.pop()

    def below(self, n: int) -> int:
        """Uniform integer in [0, n) by rejection: words >= the largest
        multiple of n below 2^64 are discarded."""
        limit = (1 << 64) - ((1 << 64) % n)
        while True:
            w = self.next()
            if w < limit:
                return w % n


def steps_from_proof(proof: bytes, n_steps: int, k: int) -> list[int]:
    """[step.audit.sample.c1] K distinct steps of 1..n_steps, sorted, drawn
    with the seed SHA-256(proof); a pure function of its inputs."""
    if n_steps < 1:
        raise InputError("the run has no steps to sample")
    if not 1 <= k <= n_steps:
        raise InputError(f"--sample must be between 1 and the run's {n_steps} steps, got {k}")
    stream = _WordStream(hashlib.sha256(proof).digest())
    pool = list(range(1, n_steps + 1))
    for i in range(k):  # partial Fisher-Yates: position i takes a draw from [i, n)
        j = i + stream.below(n_steps - i)
        pool[i], pool[j] = pool[j], pool[i]
    return sorted(pool[:k])


@dataclass(frozen=True)
class Sample:
    """An auditor's sample of a run: the beacon (lower-case hex), its size,
    the proof (the unique signature of ``sample_message``) and the steps."""

    beacon: str
    k: int
    proof: bytes
    steps: list

    def to_json(self) -> dict:
        return {
            "method": SAMPLE_METHOD,
            "beacon": self.beacon,
            "k": self.k,
            "steps": list(self.steps),
            "proof": self.proof.hex(),
        }


def draw_sample(key: keys.PrivateKey, chain_head: str, beacon_hex: str, n_steps: int, k: int) -> Sample:
    """The sample ``key`` must audit: fixed by the key, the chain head and
    the beacon ([step.audit.sample.c1])."""
    beacon = _hex_bytes(beacon_hex, "beacon").hex()
    proof = key.sign(sample_message(chain_head, beacon, key.public.fingerprint))
    return Sample(beacon, k, proof, verify_sample(key.public, chain_head, beacon, proof, n_steps, k))


def verify_sample(
    public: keys.PublicKey, chain_head: str, beacon_hex: str, proof: bytes, n_steps: int, k: int
) -> list[int]:
    """The steps ``proof`` selects, once it is checked to be the key's
    signature of the sampling message; InputError otherwise."""
    if not public.verify(sample_message(chain_head, beacon_hex, public.fingerprint), proof):
        raise InputError("the sampling proof is not the key's signature of (chain head, beacon)")
    return steps_from_proof(proof, n_steps, k)


# ---- certificates ------------------------------------------------------------


def canonical_json(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def certificate_message(cert: dict) -> bytes:
    """[step.audit.cert.c1] What a certificate's signature signs: the format
    name, 0x00 and the canonical JSON of every field but ``signature``."""
    body = {k: v for k, v in cert.items() if k != "signature"}
    return CERT_FORMAT.encode() + b"\0" + canonical_json(body)


def sign_certificate(cert: dict, key: keys.PrivateKey) -> dict:
    """The certificate with its signature by ``key`` (which it must name)."""
    if cert.get("key", {}).get("fingerprint") != key.public.fingerprint:
        raise InputError("the certificate names another key than the one signing it")
    body = {k: v for k, v in cert.items() if k != "signature"}
    return {**body, "signature": key.sign(certificate_message(body)).hex()}


def key_field(public: keys.PublicKey) -> dict:
    return {"algorithm": keys.ALGORITHM, "public": public.der.hex(), "fingerprint": public.fingerprint}


def make_certificate(
    *,
    run: dict,
    step: int,
    verdict: str,
    replayed: dict,
    published: dict,
    sample: Sample,
    auditor: str,
    key: keys.PrivateKey,
    spec_version: str,
    spec_sha256: str,
    refreplay_version: str,
    platform: dict,
    checked: dict,
    warnings: list[str],
    mismatch: dict | None = None,
) -> dict:
    """One auditor's signed statement about one step ([step.verified.c1],
    [step.audit.cert.c1]).

    ``run``: chain_head, recipe_sha256, steps.  ``replayed``/``published``:
    the step's state_root, data_hash and chain_link as recomputed (None
    each for a mismatch) and as published.  ``sample``: the key's sample of
    the run.  ``checked``: what the replay covered (``replay_evidence``).
    ``warnings``: faults of localisation aids and checkpoints passed over,
    beside the verdict.  ``mismatch``: step, kind and lines of the first
    divergence."""
    cert = {
        "format": CERT_FORMAT,
        "run": run,
        "step": step,
        "verdict": verdict,
        "replayed": replayed,
        "published": published,
        "sampling": sample.to_json(),
        "auditor": auditor,
        "key": key_field(key.public),
        "spec": {"version": spec_version, "sha256": spec_sha256},
        "refreplay_version": refreplay_version,
        "platform": platform,
        "checked": checked,
        "warnings": list(warnings),
    }
    if mismatch is not None:
        cert["mismatch"] = mismatch
    return sign_certificate(cert, key)


def certify_step(run, step: int, res, sample: Sample, key: keys.PrivateKey, auditor: str, platform: dict) -> dict:
    """The signed certificate of a replay result ``res`` of ``step`` of the
    opened run ``run``: the one place a certificate is made from a replay."""
    from .. import __version__, spec

    pub = run.records[step]
    published = {"state_root": pub.state_root, "data_hash": pub.data_hash, "chain_link": pub.chain_link}
    mismatch = None
    if res.verified:
        replayed, verdict = dict(published), "verified"
    else:
        verdict, replayed = "mismatch", dict.fromkeys(published)
        mismatch = {"step": res.divergence.step, "kind": res.divergence.kind, "lines": res.divergence.lines()}
    return make_certificate(
        run={"chain_head": run.head["chain_link"], "recipe_sha256": run.recipe_sha256, "steps": run.recipe.steps},
        step=step,
        verdict=verdict,
        replayed=replayed,
        published=published,
        sample=sample,
        auditor=auditor,
        key=key,
        spec_version=spec.version(),
        spec_sha256=spec.spec_sha256(),
        refreplay_version=__version__,
        platform=platform,
        checked=replay_evidence(res),
        warnings=res.warnings,
        mismatch=mismatch,
    )


def certificate_name(cert: dict) -> str:
    """[step.audit.cert.c1] A file name unique per run, sample and step: the
    chain head's and the key fingerprint's first 16 hex digits, the first 8 of
    SHA-256(proof), and the step."""
    sample_id = hashlib.sha256(bytes.fromhex(cert["sampling"]["proof"])).hexdigest()[:8]
    return (
        f"cert-{cert['run']['chain_head'][:16]}-{cert['key']['fingerprint'][:16]}-{sample_id}"
        f"-step-{cert['step']:07d}.json"
    )


def write_certificate(directory, cert: dict):
    """Write ``cert`` into ``directory`` atomically (never through a link
    planted there); a full, read-only or forbidden directory is an
    InputError.  Returns the path."""
    from pathlib import Path

    from .. import files

    path = Path(directory) / certificate_name(cert)
    files.write_atomic(path, json.dumps(cert, indent=1, sort_keys=True) + "\n")
    return path


def replay_evidence(res) -> dict:
    """The ``checked`` field of a certificate from a replay result: the step
    it started from, the steps it recomputed and matched, and the checkpoints
    it found equal to the replayed state."""
    return {
        "replayed_from": res.start,
        "steps": [c.step for c in res.checked],
        "checkpoints": [a.to_json() for a in res.artifacts],
    }


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

    published = {
        rec.step: {"state_root": rec.state_root, "data_hash": rec.data_hash, "chain_link": rec.chain_link}
        for rec in run.records
    }
    present = frozenset(k for k in run.checkpoints if (run.path / CKPT_DIR / checkpoint_name(k)).is_file())
    from .. import spec

    same = run.recipe.spec_version == spec.version()
    later = () if same else ((spec.version(), spec.spec_sha256()),)  # the run opened: this version replays it
    return RunFacts(
        run.head["chain_link"],
        run.recipe.steps,
        published,
        run.recipe_sha256,
        run.recipe.spec_version,
        present,
        spec.spec_sha256() if same else None,
        later,
    )


_KEYS = {
    "format",
    "run",
    "step",
    "verdict",
    "replayed",
    "published",
    "sampling",
    "auditor",
    "key",
    "spec",
    "refreplay_version",
    "platform",
    "checked",
    "warnings",
    "signature",
}
_HASH_KEYS = {"state_root", "data_hash", "chain_link"}
AUDITOR_RE = re.compile(r"[A-Za-z0-9_.@-]{1,64}")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_HEX = re.compile(r"(?:[0-9a-f]{2})+")
# a release, pre-release, post-release, development or local version, as Python packages number them
VERSION_RE = re.compile(
    r"\d{1,4}\.\d{1,4}(?:\.\d{1,4})?(?:(?:a|b|rc)\d{1,4})?(?:\.post\d{1,4})?"
    r"(?:\.dev\d{1,8})?(?:\+[a-z0-9.]{1,64})?"
)
_PRINTABLE = re.compile(r"[\x20-\x7e]{1,256}")
_SHORT = 4096  # longest text field accepted in a certificate


class _Bad(Exception):
    pass


def _need(cond, msg):
    if not cond:
        raise _Bad(msg)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _text(v, what, pattern=None):
    _need(
        isinstance(v, str) and len(v) <= _SHORT and (pattern is None or pattern.fullmatch(v)),
        f"{what} must be " + ("text" if pattern is None else f"text matching {pattern.pattern}"),
    )


def _keys(obj, keys, what):
    _need(isinstance(obj, dict), f"{what} must be an object")
    _need(set(obj) == set(keys), f"{what} must have exactly the fields {', '.join(sorted(keys))}")


def _hashes(obj, what, nullable):
    _keys(obj, _HASH_KEYS, what)
    for k in sorted(_HASH_KEYS):
        _need(
            obj[k] is None and nullable or isinstance(obj[k], str) and _HEX64.fullmatch(obj[k]),
            f"{what}.{k} must be 64 lower-case hex digits" + (" or null" if nullable else ""),
        )


def _isa(v):
    from ..doctor import _ISA_OF_INTEREST

    return (
        isinstance(v, list)
        and all(isinstance(x, str) for x in v)
        and v == sorted(set(v))
        and set(v) <= set(_ISA_OF_INTEREST)
    )


def _count(lo, hi, nullable=False):
    return lambda v: v is None and nullable or _is_int(v) and lo <= v <= hi


def _match(pattern):
    return lambda v: isinstance(v, str) and pattern.fullmatch(v) is not None


# [step.audit.cert.c1] the platform fields, each checked by value (doctor.fingerprint() and the device)
PLATFORM_FIELDS = {
    "cpu_model": (_match(_PRINTABLE), "printable text of 1-256 characters"),
    "cpu_llvm_name": (_match(re.compile(r"[a-z0-9_.+-]{1,64}")), "an LLVM CPU name"),
    "isa": (_isa, "a sorted list of distinct ISA extension names refreplay knows"),
    "machine": (_match(re.compile(r"[A-Za-z0-9_.-]{1,32}")), "a machine name such as x86_64"),
    "os": (_match(_PRINTABLE), "printable text of 1-256 characters"),
    "cpu_count": (_count(1, 1 << 20, nullable=True), "a CPU count or null"),
    "python": (_match(re.compile(r"[A-Za-z]{1,16} " + VERSION_RE.pattern)), "an implementation and a version"),
    "numpy": (_match(VERSION_RE), "a version"),
    "numba": (_match(VERSION_RE), "a version"),
    "llvmlite": (_match(VERSION_RE), "a version"),
    "numba_threads": (_count(1, 4096), "a thread count of 1-4096"),
    "refreplay": (_match(VERSION_RE), "a version"),
    "source_sha256": (_match(_HEX64), "64 lower-case hex digits"),
    "spec_version": (_match(re.compile(r"\d{1,4}\.\d{1,4}\.\d{1,4}")), "a spec version"),
    "spec_sha256": (_match(_HEX64), "64 lower-case hex digits"),
    "device": (_match(_PRINTABLE), "printable text of 1-256 characters"),
}


def _platform(cert):
    p = cert["platform"]
    _keys(p, PLATFORM_FIELDS, "platform")
    for k, (ok, what) in sorted(PLATFORM_FIELDS.items()):
        _need(ok(p[k]), f"platform.{k} must be {what}")
    _need(
        p["spec_version"] == cert["spec"]["version"] and p["spec_sha256"] == cert["spec"]["sha256"],
        "platform.spec_version/spec_sha256 differ from the certificate's spec field",
    )
    _need(p["refreplay"] == cert["refreplay_version"], "platform.refreplay differs from refreplay_version")


def _public_key(cert, trusted) -> keys.PublicKey:
    k = cert["key"]
    _keys(k, ("algorithm", "public", "fingerprint"), "key")
    _need(k["algorithm"] == keys.ALGORITHM, f"key.algorithm must be {keys.ALGORITHM}")
    _text(k["public"], "key.public", _HEX)
    _text(k["fingerprint"], "key.fingerprint", _HEX64)
    try:
        pub = keys.public_from_hex(k["public"], "key.public")
    except InputError as exc:
        raise _Bad(str(exc)) from None
    _need(pub.fingerprint == k["fingerprint"], "key.fingerprint is not the SHA-256 of key.public")
    _need(pub.fingerprint in trusted, f"unknown key {pub.fingerprint[:16]}...: not among the trusted keys (--trust)")
    return pub


def _signature(cert, pub: keys.PublicKey):
    s = cert["signature"]
    _need(
        isinstance(s, str) and len(s) == 2 * pub.size and _HEX.fullmatch(s),
        f"signature must be {2 * pub.size} lower-case hex digits",
    )
    _need(
        pub.verify(certificate_message(cert), bytes.fromhex(s)),
        "signature does not verify: the certificate was edited after it was signed, or signed by another key",
    )


def _structure(cert, facts: RunFacts, trusted) -> keys.PublicKey:
    """[step.verified.c1] [step.audit.cert.c1] Every field of a certificate:
    its key and signature first, then its type, and its value against the run
    and the spec."""
    _need(isinstance(cert, dict), "not a JSON object")
    fmt = cert.get("format")
    _need(
        fmt not in UNSIGNED_FORMATS and "digest" not in cert,
        f"unsigned certificate (format {fmt!r} is sealed by an unkeyed digest that anyone can recompute); "
        "re-audit with an auditor key (refreplay keygen, refreplay audit --key)",
    )
    missing = sorted(_KEYS - set(cert) - {"mismatch"})
    _need(not missing, "missing fields: " + ", ".join(missing))
    extra = sorted(set(cert) - _KEYS - {"mismatch"})
    _need(not extra, "unknown fields: " + ", ".join(extra))
    _need(fmt == CERT_FORMAT, f"unknown format {fmt!r} (expected {CERT_FORMAT})")
    pub = _public_key(cert, trusted)
    _signature(cert, pub)
    _keys(cert["run"], ("chain_head", "recipe_sha256", "steps"), "run")
    _need(cert["run"]["chain_head"] == facts.chain_head, "certificate is for another run (chain head differs)")
    _need(
        cert["run"]["recipe_sha256"] == facts.recipe_sha256,
        "certificate is for another run (run.recipe_sha256 is not the run's recipe hash)",
    )
    _need(
        cert["run"]["steps"] == facts.n_steps and _is_int(cert["run"]["steps"]),
        f"run.steps is not the run's {facts.n_steps} steps",
    )
    step = cert["step"]
    _need(_is_int(step) and 1 <= step <= facts.n_steps, f"step {str(step)[:40]!r} is not a step of this run")
    _need(cert["verdict"] in ("verified", "mismatch"), f"unknown verdict {str(cert['verdict'])[:40]!r}")
    verified = cert["verdict"] == "verified"
    _hashes(cert["published"], "published", False)
    _hashes(cert["replayed"], "replayed", not verified)
    _keys(cert["spec"], ("version", "sha256"), "spec")
    cv, later = cert["spec"]["version"], dict(facts.later)
    _need(
        isinstance(cv, str) and (cv == facts.spec_version or cv in later),
        f"spec.version {str(cv)[:40]!r} is not the run's spec version {facts.spec_version!r}"
        + (f" nor one that replays it ({', '.join(later)})" if later else ""),
    )
    _text(cert["spec"]["sha256"], "spec.sha256", _HEX64)
    want = facts.spec_sha256 if cv == facts.spec_version else later.get(cv)
    _need(
        want is None or cert["spec"]["sha256"] == want,
        f"spec.sha256 {cert['spec']['sha256']} is not the SHA-256 of spec {cv}'s text ({want})",
    )
    _text(cert["auditor"], "auditor", AUDITOR_RE)
    _text(cert["refreplay_version"], "refreplay_version", VERSION_RE)
    _platform(cert)
    _need(
        isinstance(cert["warnings"], list)
        and len(cert["warnings"]) <= 1024
        and all(isinstance(w, str) and len(w) <= _SHORT for w in cert["warnings"]),
        "warnings must be a list of texts",
    )
    if verified:
        _need("mismatch" not in cert, "a verified certificate carries a mismatch")
    else:
        _keys(cert.get("mismatch"), ("step", "kind", "lines"), "mismatch")
        m = cert["mismatch"]
        _need(_is_int(m["step"]) and 0 <= m["step"] <= step, "mismatch.step is not a step up to the certified one")
        _text(m["kind"], "mismatch.kind")
        _need(
            isinstance(m["lines"], list)
            and len(m["lines"]) <= 4096
            and all(isinstance(x, str) and len(x) <= _SHORT for x in m["lines"]),
            "mismatch.lines must be a list of texts",
        )
    _sampling(cert, facts, pub)
    _checked(cert, facts, verified)
    return pub


def _sampling(cert, facts, pub):
    """[step.audit.sample.c1] The proof is the key's signature of (head,
    beacon) and selects the listed steps, among them the certified one."""
    s = cert["sampling"]
    _keys(s, ("method", "beacon", "k", "steps", "proof"), "sampling")
    _need(s["method"] == SAMPLE_METHOD, f"sampling.method is not {SAMPLE_METHOD}")
    _need(
        isinstance(s["beacon"], str) and len(s["beacon"]) <= 2 * MAX_BEACON and _HEX.fullmatch(s["beacon"]),
        f"sampling.beacon must be lower-case hex of at most {MAX_BEACON} bytes",
    )
    _need(
        isinstance(s["proof"], str) and len(s["proof"]) == 2 * pub.size and _HEX.fullmatch(s["proof"]),
        f"sampling.proof must be {2 * pub.size} lower-case hex digits",
    )
    _need(_is_int(s["k"]) and 1 <= s["k"] <= facts.n_steps, "sampling.k is not a sample size for this run")
    _need(isinstance(s["steps"], list) and all(_is_int(x) for x in s["steps"]), "sampling.steps must list steps")
    try:
        chosen = verify_sample(pub, facts.chain_head, s["beacon"], bytes.fromhex(s["proof"]), facts.n_steps, s["k"])
    except InputError as exc:
        raise _Bad(f"sampling evidence unusable: {exc}") from None
    _need(chosen == s["steps"], "sampling evidence does not reproduce the listed steps")
    _need(cert["step"] in chosen, f"mis-sampled: step {cert['step']} was not selected by this key's sampling proof")


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
    _need(
        isinstance(c["checkpoints"], list) and len(c["checkpoints"]) <= facts.n_steps + 1,
        "checked.checkpoints must be a list",
    )
    seen = {}
    for i, a in enumerate(c["checkpoints"]):
        _keys(a, ("file", "step", "state_root", "role"), f"checked.checkpoints[{i}]")
        _need(
            _is_int(a["step"]) and a["step"] in facts.checkpoints and start <= a["step"] <= step,
            f"checked.checkpoints[{i}] names no published checkpoint of the replayed range",
        )
        _need(a["file"] == f"{CKPT_DIR}/{checkpoint_name(a['step'])}", f"checked.checkpoints[{i}].file is wrong")
        _need(a["role"] in ("start", "recomputed"), f"checked.checkpoints[{i}].role is unknown")
        _need(
            a["state_root"] == facts.published[a["step"]]["state_root"],
            f"checked.checkpoints[{i}] does not carry the published root of step {a['step']}",
        )
        seen[a["step"]] = a["role"]
    if not verified:
        return
    _need(
        c["steps"] == list(range(start + 1, step + 1)),
        "a verified certificate must list every step from its starting point to the certified step",
    )
    covered = {k for k in facts.checkpoints if start <= k <= step}
    _need(
        covered <= set(seen),
        "a verified certificate must list every published checkpoint of the steps it recomputed "
        f"(missing: {sorted(covered - set(seen))})",
    )


def check_certificate(cert, facts: RunFacts, trusted: dict) -> CertCheck:
    """Validate a certificate against the run it claims to certify and the
    trusted keys (fingerprint -> PublicKey): an empty problem list means it is
    signed by a trusted key and unaltered since, every field has its type and
    value, it belongs to this run and this spec version, certifies a step its
    key's sampling proof selected, its hashes are the run's, and (when
    verified) it lists the replay and the checkpoints [step.verified.c1]
    requires."""
    out = CertCheck(cert if isinstance(cert, dict) else {})
    if isinstance(cert, InputError):  # the file could not be read as JSON
        out.problems.append(f"unusable certificate file: {cert}")
        return out
    try:
        _structure(cert, facts, trusted)
        step = cert["step"]
        _need(
            cert["published"] == {k: facts.published[step][k] for k in _HASH_KEYS},
            f"published hashes in the certificate differ from the run's for step {step}",
        )
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
    """``certified``: step -> the certificates counted for it (at most one
    per key); ``auditors``: fingerprint -> auditor name of every key counted;
    ``sample_sizes``: k of each key whose whole sample is certified (the
    escape odds use these); ``incomplete``: fingerprint -> sampled steps
    without a certificate."""

    n_steps: int
    certified: dict[int, list[dict]]
    rejected: list[tuple[str, list[str]]]
    disagreements: dict[int, list[str]]
    sample_sizes: list[int]
    auditors: dict[str, str] = field(default_factory=dict)
    incomplete: dict[str, list[int]] = field(default_factory=dict)

    @property
    def percent(self) -> float:
        return 100.0 * len(self.certified) / self.n_steps

    @property
    def mismatched_steps(self) -> list[int]:
        return sorted(s for s, cs in self.certified.items() if any(c["verdict"] != "verified" for c in cs))


def who(cert) -> str:
    return f"{cert['auditor']} (key {cert['key']['fingerprint'][:16]})"


def coverage(certs: list[tuple[str, object]], facts: RunFacts, trusted: dict, beacon: str | None = None) -> Coverage:
    """Combine certificates (source name, parsed JSON) into coverage
    ([step.audit.coverage.c1]): a certificate that fails
    ``check_certificate`` is rejected with its problems; each trusted key is
    one auditor with one sample (a key that shows two samples has all its
    certificates rejected; a second certificate of a key for a step is
    rejected); ``beacon``: the audit's beacon, when it is fixed."""
    want_beacon = None if beacon is None else _hex_bytes(beacon, "--beacon").hex()
    rejected = []
    by_key: dict[str, list[tuple[str, dict]]] = {}
    for name, cert in certs:
        chk = check_certificate(cert, facts, trusted)
        if chk.ok and want_beacon is not None and cert["sampling"]["beacon"] != want_beacon:
            chk.problems.append(
                f"sampled with beacon {cert['sampling']['beacon'][:64]}, not the audit's beacon {want_beacon[:64]}"
            )
        if not chk.ok:
            rejected.append((name, chk.problems))
            continue
        by_key.setdefault(cert["key"]["fingerprint"], []).append((name, cert))
    certified: dict[int, list[dict]] = {}
    sizes, auditors, incomplete = [], {}, {}
    for fp, named in sorted(by_key.items()):
        samples = sorted({(c["sampling"]["beacon"], c["sampling"]["k"]) for _, c in named})
        if len(samples) > 1:
            why = (
                f"key {fp[:16]} shows {len(samples)} samples of this run (beacon, k: "
                + ", ".join(f"{b[:16]}, {k}" for b, k in samples)
                + "); a key has one sample per run"
            )
            rejected += [(name, [why]) for name, _ in named]
            continue
        seen: dict[int, str] = {}
        for name, cert in sorted(named, key=lambda nc: nc[0]):
            step = cert["step"]
            if step in seen:
                rejected.append(
                    (
                        name,
                        [
                            f"a second certificate of key {fp[:16]} for step {step} "
                            f"(one per key and step: {seen[step]} is counted)"
                        ],
                    )
                )
                continue
            seen[step] = name
            certified.setdefault(step, []).append(cert)
            auditors[fp] = cert["auditor"]
        sample = named[0][1]["sampling"]
        missing = sorted(set(sample["steps"]) - set(seen))
        if missing:
            incomplete[fp] = missing
        else:
            sizes.append(sample["k"])
    disagreements = {}
    for step, cs in certified.items():
        verdicts = {(c["verdict"], json.dumps(c["replayed"], sort_keys=True)) for c in cs}
        if len(verdicts) > 1:
            disagreements[step] = sorted(f"{who(c)}: {c['verdict']}" for c in cs)
    return Coverage(facts.n_steps, certified, rejected, disagreements, sizes, auditors, incomplete)
