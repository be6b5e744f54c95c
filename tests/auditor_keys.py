"""Auditor key pairs for tests: generated once per process (2048 bits, the
smallest accepted, to keep tests fast) and written to key files on demand."""

from __future__ import annotations

import functools
from pathlib import Path

from refreplay.verify import keys


def key(name: str = "alice") -> keys.PrivateKey:
    return _key(name)


@functools.lru_cache(maxsize=None)
def _key(name: str) -> keys.PrivateKey:
    return keys.generate(keys.MIN_BITS)


def key_files(directory, name: str = "alice") -> tuple[Path, Path]:
    """(private key file, public key file) of ``key(name)`` in ``directory``."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    private, public = d / f"{name}.key", d / f"{name}.pub.pem"
    if not private.exists():
        private.write_bytes(key(name).pem())
        private.chmod(0o600)
        public.write_bytes(key(name).public.pem())
    return private, public


def beacon_for(head: str, n_steps: int, step: int, name: str = "alice", k: int = 1) -> str:
    """A beacon under which ``key(name)``'s sample of k steps holds ``step``
    (tests pick beacons to reach a step; a real beacon is not chosen)."""
    from refreplay.verify import audit

    for i in range(1 << 16):
        b = f"{i:04x}"
        if step in audit.draw_sample(key(name), head, b, n_steps, k).steps:
            return b
    raise AssertionError("no beacon found")
