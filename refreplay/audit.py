"""Collective audit: unpredictable step sampling, certificates, coverage.

Many auditors each replay a few steps of a published run.  This module decides
*which* steps (so a publisher cannot predict them), writes what an auditor
certifies, and adds certificates up into coverage with the probability that
tampered steps escaped every sample.  Replaying a step is ``refreplay.replay``.

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
from dataclasses import dataclass, field
from fractions import Fraction

from .errors import InputError

SAMPLE_METHOD = "refreplay-audit-sample/1"
CERT_FORMAT = "refreplay-certificate/1"


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
                     refreplay_version: str, platform: dict, mismatch: dict | None = None) -> dict:
    """One auditor's statement about one step.

    ``run``: chain_head, recipe_sha256, steps.  ``replayed``/``published``:
    the step's state_root, data_hash and chain_link as recomputed and as
    published (equal when verified).  ``sampling``: beacon, secret, k and the
    sampled steps."""
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
    }
    if mismatch is not None:
        cert["mismatch"] = mismatch
    return seal(cert)


@dataclass
class CertCheck:
    cert: dict
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


_REQUIRED = ("format", "run", "step", "verdict", "replayed", "published", "sampling",
             "auditor", "spec", "refreplay_version", "platform", "digest")


def check_certificate(cert, chain_head: str, n_steps: int, published_steps: dict) -> CertCheck:
    """Validate a certificate against the run it claims to certify.

    ``published_steps``: step -> {state_root, data_hash, chain_link} as the run
    publishes them.  Problems are listed; an empty list means the certificate
    is internally consistent, belongs to this run, certifies a step its
    sampling evidence really selected, and its hashes are the run's."""
    out = CertCheck(cert if isinstance(cert, dict) else {})
    if not isinstance(cert, dict):
        out.problems.append("not a JSON object")
        return out
    missing = [k for k in _REQUIRED if k not in cert]
    if missing:
        out.problems.append("missing fields: " + ", ".join(missing))
        return out
    if cert["format"] != CERT_FORMAT:
        out.problems.append(f"unknown format {cert['format']!r}")
    if seal(cert)["digest"] != cert["digest"]:
        out.problems.append("digest does not match the content (altered certificate)")
    run = cert["run"] if isinstance(cert["run"], dict) else {}
    if run.get("chain_head") != chain_head:
        out.problems.append("certificate is for another run (chain head differs)")
        return out
    step = cert["step"]
    if not isinstance(step, int) or not 1 <= step <= n_steps:
        out.problems.append(f"step {step!r} is not a step of this run")
        return out
    s = cert["sampling"]
    try:
        chosen = sample_steps(chain_head, s["beacon"], s["secret"], n_steps, int(s["k"]))
    except (KeyError, TypeError, ValueError, InputError) as exc:
        out.problems.append(f"sampling evidence unusable: {exc}")
    else:
        if chosen != s.get("steps"):
            out.problems.append("sampling evidence does not reproduce the listed steps")
        if step not in chosen:
            out.problems.append(f"step {step} was not selected by the sampling evidence")
    pub = published_steps.get(step)
    if cert["published"] != pub:
        out.problems.append(f"published hashes in the certificate differ from the run's for step {step}")
    if cert["verdict"] == "verified" and cert["replayed"] != cert["published"]:
        out.problems.append("verdict 'verified' but replayed hashes differ from published")
    if cert["verdict"] not in ("verified", "mismatch"):
        out.problems.append(f"unknown verdict {cert['verdict']!r}")
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


def coverage(certs: list[tuple[str, object]], chain_head: str, n_steps: int,
             published_steps: dict) -> Coverage:
    """Combine certificates (source name, parsed JSON) into coverage."""
    certified: dict[int, list[dict]] = {}
    rejected = []
    samples: dict[tuple, int] = {}
    for name, cert in certs:
        chk = check_certificate(cert, chain_head, n_steps, published_steps)
        if not chk.ok:
            rejected.append((name, chk.problems))
            continue
        certified.setdefault(cert["step"], []).append(cert)
        s = cert["sampling"]
        samples[(cert["auditor"], s["beacon"], s["secret"])] = int(s["k"])
    disagreements = {}
    for step, cs in certified.items():
        verdicts = {(c["verdict"], json.dumps(c["replayed"], sort_keys=True)) for c in cs}
        if len(verdicts) > 1:
            disagreements[step] = sorted(f"{c['auditor']}: {c['verdict']}" for c in cs)
    return Coverage(n_steps, certified, rejected, disagreements, list(samples.values()))
