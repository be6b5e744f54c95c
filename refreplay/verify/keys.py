"""Auditor keys: RSA key pairs and their PKCS#1 v1.5 SHA-256 signatures
([step.audit.key.c1]), through the ``cryptography`` package (optional extra
``audit``).  No cryptography is written here: this module parses and checks
keys, names them by fingerprint and calls the library.

An auditor's identity is its public key; its fingerprint is the SHA-256 of the
key's DER SubjectPublicKeyInfo, the one canonical encoding (another encoding of
the same numbers is refused, so one key cannot pass for two auditors).
RSASSA-PKCS1-v1_5 is deterministic and, for a key that is a permutation
(honestly generated, e = 65537), unique: one message has exactly one valid
signature in [0, n).  That is what lets a signature fix an auditor's sample
([step.audit.sample.c1]).  Ed25519 signatures are not unique (the signer picks
the nonce) and must not be used for that.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError

ALGORITHM = "rsa-pkcs1v15-sha256"
MIN_BITS, MAX_BITS, DEFAULT_BITS = 2048, 8192, 3072
EXPONENT = 65537
KEY_FILE_LIMIT = 1 << 20  # bytes of one key or trust file
MAX_TRUSTED = 10_000
_PEM_PUBLIC = re.compile(rb"-----BEGIN PUBLIC KEY-----\r?\n.+?-----END PUBLIC KEY-----", re.S)
_HEX_LINE = re.compile(r"[0-9a-f]+")


def _crypto():
    try:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import padding, rsa
    except ImportError:  # pragma: no cover - the extra is missing
        raise InputError(
            "auditor keys need the `cryptography` package, a dependency of refreplay: "
            "pip install 'cryptography>=42,<49'"
        ) from None
    return InvalidSignature, hashes, serialization, padding, rsa


def _parse_errors() -> tuple:
    """What the library raises for bytes that are not a usable key."""
    from cryptography.exceptions import UnsupportedAlgorithm

    return ValueError, TypeError, UnsupportedAlgorithm


def _check_numbers(key, what: str):
    _, _, _, _, rsa = _crypto()
    if not isinstance(key, rsa.RSAPublicKey):
        raise InputError(f"{what} is not an RSA key ({ALGORITHM} keys only)")
    bits, e = key.key_size, key.public_numbers().e
    if not MIN_BITS <= bits <= MAX_BITS:
        raise InputError(f"{what} has {bits} bits; an auditor key has {MIN_BITS} to {MAX_BITS}")
    if e != EXPONENT:
        raise InputError(f"{what} has public exponent {e}; an auditor key has e = {EXPONENT}")


@dataclass(frozen=True)
class PublicKey:
    """An auditor's public key; ``der``: its canonical DER SubjectPublicKeyInfo."""

    der: bytes
    key: object

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(self.der).hexdigest()

    @property
    def size(self) -> int:
        """Bytes of the modulus: the length of every signature."""
        return (self.key.key_size + 7) // 8

    def pem(self) -> bytes:
        _, _, serialization, _, _ = _crypto()
        return self.key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)

    def verify(self, message: bytes, signature: bytes) -> bool:
        """Whether ``signature`` is THE signature of ``message``: exactly as
        long as the modulus, below it as an integer, and valid."""
        invalid, hashes, _, padding, _ = _crypto()
        if not isinstance(signature, bytes) or len(signature) != self.size:
            return False
        if int.from_bytes(signature, "big") >= self.key.public_numbers().n:
            return False
        try:
            self.key.verify(signature, message, padding.PKCS1v15(), hashes.SHA256())
        except invalid:
            return False
        return True


def public_from_der(der: bytes, what: str = "public key") -> PublicKey:
    """A PublicKey from DER bytes, refused unless RSA of an accepted size with
    e = 65537 in the canonical encoding."""
    _, _, serialization, _, _ = _crypto()
    try:
        key = serialization.load_der_public_key(der)
    except _parse_errors() as exc:
        raise InputError(f"{what} is not a DER public key ({exc})") from None
    _check_numbers(key, what)
    canon = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if canon != der:
        raise InputError(f"{what} is not in the canonical DER encoding of its numbers")
    return PublicKey(der, key)


def public_from_hex(text: str, what: str = "public key") -> PublicKey:
    if not isinstance(text, str) or not text or len(text) % 2 or not _HEX_LINE.fullmatch(text):
        raise InputError(f"{what} must be lower-case hex of a DER public key")
    return public_from_der(bytes.fromhex(text), what)


@dataclass(frozen=True)
class PrivateKey:
    key: object
    public: PublicKey

    def sign(self, message: bytes) -> bytes:
        _, hashes, _, padding, _ = _crypto()
        return self.key.sign(message, padding.PKCS1v15(), hashes.SHA256())

    def pem(self) -> bytes:
        _, _, serialization, _, _ = _crypto()
        return self.key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )


def _private(key, what: str) -> PrivateKey:
    _, _, serialization, _, rsa = _crypto()
    if not isinstance(key, rsa.RSAPrivateKey):
        raise InputError(f"{what} is not an RSA private key ({ALGORITHM} keys only)")
    pub = key.public_key()
    _check_numbers(pub, what)
    der = pub.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return PrivateKey(key, PublicKey(der, pub))


def generate(bits: int = DEFAULT_BITS) -> PrivateKey:
    """A fresh key pair from the operating system's random source."""
    _, _, _, _, rsa = _crypto()
    if not MIN_BITS <= bits <= MAX_BITS:
        raise InputError(f"--bits must be between {MIN_BITS} and {MAX_BITS}, got {bits}")
    return _private(rsa.generate_private_key(public_exponent=EXPONENT, key_size=bits), "the new key")


def load_private(path) -> PrivateKey:
    """The private key in PEM file ``path`` (unencrypted PKCS#8 or PKCS#1)."""
    from .. import untrusted

    _, _, serialization, _, _ = _crypto()
    raw = untrusted.read_file(path, KEY_FILE_LIMIT, what="private key file")
    try:
        key = serialization.load_pem_private_key(raw, password=None)
    except TypeError:
        raise InputError(
            f"{path}: the private key is encrypted; refreplay reads unencrypted keys (keep the file 0600)"
        ) from None
    except _parse_errors() as exc:
        raise InputError(f"{path}: not a PEM private key ({exc})") from None
    return _private(key, f"{path}")


def readable_by_others(path) -> bool:
    """Whether the group or other users may read the key file (POSIX modes)."""
    import os
    import stat

    try:
        return bool(os.stat(path).st_mode & (stat.S_IRGRP | stat.S_IROTH))
    except OSError:
        return False


def _keys_in(raw: bytes, where: str) -> list[PublicKey]:
    _, _, serialization, _, _ = _crypto()
    out = []
    if b"-----BEGIN" in raw:
        blocks = _PEM_PUBLIC.findall(raw)
        if not blocks:
            raise InputError(f"{where}: no PEM PUBLIC KEY block")
        for i, block in enumerate(blocks):
            try:
                key = serialization.load_pem_public_key(block)
            except _parse_errors() as exc:
                raise InputError(f"{where}: PEM block {i + 1} is not a public key ({exc})") from None
            _check_numbers(key, f"{where}: key {i + 1}")
            der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
            out.append(PublicKey(der, key))
        return out
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        raise InputError(f"{where}: neither PEM nor lines of hex DER public keys") from None
    for i, line in enumerate(text.splitlines()):
        line = line.strip()
        if line and not line.startswith("#"):
            out.append(public_from_hex(line.lower(), f"{where}: line {i + 1}"))
    if not out:
        raise InputError(f"{where}: no public key")
    return out


def load_trusted(paths) -> dict[str, PublicKey]:
    """Trusted auditor keys by fingerprint, from files (PEM PUBLIC KEY blocks,
    or lines of hex DER) and directories of ``*.pem`` files."""
    from .. import untrusted

    trusted: dict[str, PublicKey] = {}
    for p in map(Path, paths):
        if not p.exists():
            raise InputError(f"trusted key file not found: {p}")
        files = sorted(f for f in p.glob("*.pem") if ".key" not in f.name) if p.is_dir() else [p]
        if not files:
            raise InputError(f"{p}: no *.pem public key files")
        for f in files:
            raw = untrusted.read_file(f, KEY_FILE_LIMIT, p if p.is_dir() else None, "trusted key file")
            for k in _keys_in(raw, str(f)):
                trusted[k.fingerprint] = k
            if len(trusted) > MAX_TRUSTED:
                raise InputError(f"more than {MAX_TRUSTED} trusted keys")
    return trusted
