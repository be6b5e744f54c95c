"""[conf.verify.c1] ``vectors verify``: compare a fresh in-memory regeneration with the files
on disk, byte for byte, and name every case whose bytes differ."""

from __future__ import annotations

import json
from pathlib import Path

from ... import untrusted
from ...errors import InputError
from .store import MANIFEST


def _tensors(data: bytes):
    """The tensors of a file's bytes, or None if they do not parse."""
    import tempfile

    from ... import tensorio

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "v.safetensors"
        path.write_bytes(data)
        try:
            return tensorio.load_vectors(path)[0]
        except InputError:
            return None


def _case_ids(name: str) -> str:
    return name.split("/")[0]


def compare(fresh: dict[str, bytes], directory: Path) -> list[str]:
    problems = []
    for name in sorted(set(fresh) | {p.name for p in directory.glob("*.safetensors")}):
        path = directory / name
        if name not in fresh:
            problems.append(f"{path}: not produced by the generator (stale file)")
            continue
        if not path.is_file():
            problems.append(f"{path}: missing")
            continue
        old = path.read_bytes()
        if old == fresh[name]:
            continue
        if name == MANIFEST:
            problems.extend(_manifest_diff(old, fresh[name], path))
            continue
        a, b = _tensors(old), _tensors(fresh[name])
        if a is None:
            problems.append(f"{path}: differs and is not a readable safetensors file")
            continue
        cases = sorted(
            {_case_ids(k) for k in set(a) ^ set(b)}
            | {
                _case_ids(k)
                for k in set(a) & set(b)
                if a[k].dtype != b[k].dtype or a[k].shape != b[k].shape or a[k].tobytes() != b[k].tobytes()
            }
        )
        if cases:
            for cid in cases:
                problems.append(f"{path}: case {cid} differs")
        else:
            problems.append(f"{path}: same tensors, different file bytes (header or metadata)")
    return problems


def _manifest_diff(old: bytes, new: bytes, path: Path) -> list[str]:
    try:
        m_old = untrusted.parse_json(old, str(path))
    except InputError:
        return [f"{path}: differs and is not valid JSON"]
    if not isinstance(m_old, dict):
        return [f"{path}: differs and is not a JSON object"]
    m_new = json.loads(new)
    out = []
    for key in ("format", "spec_version", "generator_version", "seed"):
        if m_old.get(key) != m_new.get(key):
            out.append(f"{path}: {key} is {m_old.get(key)!r}, regeneration gives {m_new.get(key)!r}")
    old_cases = {c.get("id"): c for c in m_old.get("cases", []) if isinstance(c, dict)}
    new_cases = {c["id"]: c for c in m_new["cases"]}
    for cid in sorted(set(old_cases) | set(new_cases)):
        if old_cases.get(cid) != new_cases.get(cid):
            out.append(f"{path}: entry of case {cid} differs")
    if m_old.get("files") != m_new.get("files"):
        out.append(f"{path}: file digests differ")
    return out or [f"{path}: differs (formatting)"]
