"""Fuzzing every loader of untrusted input and the command-line entry points
(issue 15, [state.untrusted.c1], [state.fileread.c1]).

Each loader, fed inputs derived from valid files by hypothesis (mutated
fields, other JSON types, byte flips, truncation, padding, deep nesting, paths
that lead outside), must return a value or raise ``InputError``; nothing
else may escape, nothing outside the input's root may be opened, and the
memory it allocates (tracemalloc peak) stays bounded whatever sizes the input
declares.  The commands must exit 0, 1 or 2, never 3 (a traceback), and 0
only when the mutated file still means what the original meant.

The default run tries a few hundred inputs; ``pytest -m slow
tests/test_loader_fuzz.py`` tries 10,000 per loader and per command (set
REFREPLAY_FUZZ_REPORT=FILE to write the number of inputs tried per target).
"""

import atexit
import collections
import contextlib
import copy
import dataclasses
import io
import json
import os
import shutil
import sys
import tempfile
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from refreplay import tensorio, untrusted
from refreplay import state as sh
from refreplay.training import presets, train
from refreplay.training import data as rdata
from refreplay.verify import audit

import auditor_keys
from json_fuzz import deep, deep_value, json_values, mutated
from refreplay.cli import main
from refreplay.conformance.golden import store
from refreplay.errors import InputError
from refreplay.training.launch.inproc import InProcess

FAST, SLOW = 40, 10_000
MEMORY_LIMIT = 64 << 20  # bytes a loader may allocate for these small inputs
TRIED = collections.Counter()


def _report():
    path = os.environ.get("REFREPLAY_FUZZ_REPORT")
    if path and TRIED:
        Path(path).write_text(json.dumps(dict(sorted(TRIED.items())), indent=1) + "\n")


def _count(name):
    """One more input tried for ``name`` (the report is rewritten every 250)."""
    TRIED[name] += 1
    if TRIED[name] % 250 == 0:
        _report()


atexit.register(_report)


def _settings(n):
    return settings(
        max_examples=n,
        deadline=None,
        derandomize=False,
        database=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.function_scoped_fixture,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
        ],
    )


def both(case):
    """Two tests of ``case(data, **fixtures)``: FAST examples in the default
    run, SLOW behind the slow marker (each its own hypothesis wrapper)."""
    import inspect

    fixtures = [p for p in inspect.signature(case).parameters if p != "data"]

    def make(n):
        def test(*args, **kw):
            kw.update(zip(fixtures + ["data"], args))
            case(**kw)

        test.__signature__ = inspect.Signature(
            [inspect.Parameter(f, inspect.Parameter.POSITIONAL_OR_KEYWORD) for f in fixtures]
            + [inspect.Parameter("data", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        )
        return _settings(n)(given(data=st.data())(test))

    return make(FAST), pytest.mark.slow(make(SLOW))


# ---- what every loader must do -------------------------------------------------------------

_OPENED = None


def _hook(event, args):
    if event == "open" and _OPENED is not None and isinstance(args[0], (str, bytes, os.PathLike)):
        _OPENED.append(os.path.realpath(os.fsdecode(args[0])))


sys.addaudithook(_hook)


@contextlib.contextmanager
def guarded(name, outside: Path | None = None):
    """Count one input for ``name``; the body may raise InputError only, may
    not open anything under ``outside``, and may not allocate more than
    MEMORY_LIMIT bytes."""
    global _OPENED
    _count(name)
    _OPENED = []
    tracemalloc.start()
    try:
        yield
    except InputError:
        pass
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        opened, _OPENED = _OPENED, None
    assert peak < MEMORY_LIMIT, f"{name}: {peak} bytes allocated"
    if outside is not None:
        bad = [p for p in opened if p.startswith(str(outside.resolve()))]
        assert not bad, f"{name} opened {bad}"


# ---- strategies ------------------------------------------------------------------------------


@st.composite
def mutated_json(draw, original):
    """``original`` with one to three values (at any depth) replaced by other
    JSON, deleted, or a key added; or the text of it damaged."""
    how = draw(st.sampled_from(["values", "values", "values", "text", "deep"]))
    if how == "deep":
        return draw(deep)
    if how == "text":
        raw = json.dumps(original)
        i = draw(st.integers(0, len(raw)))
        return raw[:i] + draw(st.text(max_size=8)) + raw[i + draw(st.integers(0, 8)) :]
    obj = draw(mutated(original, st.one_of(json_values, deep_value)))
    return json.dumps(obj)


@st.composite
def damaged_bytes(draw, original: bytes):
    """``original`` with bytes flipped, cut, inserted or appended."""
    b = bytearray(original)
    for _ in range(draw(st.integers(1, 4))):
        how = draw(st.sampled_from(["flip", "cut", "insert", "append", "truncate"]))
        i = draw(st.integers(0, max(0, len(b) - 1)))
        if how == "flip" and b:
            b[i] ^= 1 << draw(st.integers(0, 7))
        elif how == "cut":
            del b[i : i + draw(st.integers(1, 16))]
        elif how == "insert":
            b[i:i] = draw(st.binary(max_size=16))
        elif how == "append":
            b += draw(st.binary(min_size=1, max_size=64))
        else:
            del b[i:]
    return bytes(b)


# ---- loaders ------------------------------------------------------------------------------------

SMALL = {
    "a": np.arange(6, dtype=np.float32).reshape(2, 3),
    "b": np.array([1, -2], np.int64),
    "c": np.zeros(0, np.uint8),
}


def _tensor_file(tmp_path) -> bytes:
    p = tmp_path / "ok.safetensors"
    tensorio.save(p, SMALL, "meta")
    return p.read_bytes()


def _header_of(raw):
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def _tensorio_case(tmp_path, data):
    """[state.fileread.c1] damaged files and headers with any JSON in any field."""
    raw = _tensor_file(tmp_path)
    if data.draw(st.booleans()):
        fuzzed = data.draw(damaged_bytes(raw))
    else:
        header, body = _header_of(raw)
        text = data.draw(mutated_json(header)).encode("utf-8", "surrogatepass")
        declared = data.draw(st.sampled_from([len(text), len(text), 1 << 40, (1 << 64) - 1, 0]))
        fuzzed = declared.to_bytes(8, "little") + text + body
    p = tmp_path / "f.safetensors"
    p.write_bytes(fuzzed)
    with guarded("tensorio.load"):
        tensors, meta = tensorio.load(p)
        assert all(isinstance(v, np.ndarray) for v in tensors.values())


test_fuzz_tensorio_load, test_fuzz_tensorio_load_slow = both(_tensorio_case)


def _json(data):
    raw = data.draw(
        st.one_of(
            st.binary(max_size=200),
            st.text(max_size=200).map(str.encode),
            deep.map(str.encode),
            mutated_json({"a": [1, {"b": "c"}], "d": None}).map(lambda t: t.encode("utf-8", "surrogatepass")),
        )
    )
    with guarded("untrusted.parse_json"):
        untrusted.parse_json(raw, "x")


test_fuzz_parse_json, test_fuzz_parse_json_slow = both(_json)

_FRAME = zstandard.ZstdCompressor(write_checksum=True).compress(bytes(range(256)) * 8)


def _zstd(data):
    """Damaged frames, and frames declaring any content size up to 2^64 - 1."""
    frame = data.draw(
        st.one_of(
            st.binary(max_size=64),
            damaged_bytes(_FRAME),
            st.integers(0, (1 << 64) - 1).map(
                lambda n: b"\x28\xb5\x2f\xfd\xe0" + n.to_bytes(8, "little") + b"\x21\x03\x00x"
            ),
        )
    )
    expected = data.draw(st.sampled_from([2048, 0, 100, 1 << 20]))
    with guarded("untrusted.zstd_frame"):
        out = untrusted.zstd_frame(frame, expected, "f")
        assert len(out) == expected


test_fuzz_zstd_frame, test_fuzz_zstd_frame_slow = both(_zstd)


def _shard_dir(tmp_path):
    d = tmp_path / "data"
    if not (d / "manifest.json").exists():
        samples = (np.arange(4100 * 5) % 251).astype(np.uint8).reshape(4100, 5)
        rdata.write_shards(samples, d, {"kind": "test"})
        (tmp_path / "outside").mkdir()
        (tmp_path / "outside" / "x.zst").write_bytes(_FRAME)
    return d


def _shards(tmp_path, data):
    """[data.shards.c1] damaged manifests and shards, a shard linked out of the directory."""
    d = _shard_dir(tmp_path)
    work = Path(tempfile.mkdtemp(dir=tmp_path))
    shutil.copytree(d, work / "data")
    m = json.loads((d / "manifest.json").read_text())
    target = data.draw(st.sampled_from(["manifest", "shard0", "shard1", "link"]))
    if target == "manifest":
        (work / "data" / "manifest.json").write_text(data.draw(mutated_json(m)))
    elif target == "link":
        (work / "data" / "shard-00001.zst").unlink()
        (work / "data" / "shard-00001.zst").symlink_to(tmp_path / "outside" / "x.zst")
    else:
        p = work / "data" / f"shard-0000{target[-1]}.zst"
        p.write_bytes(data.draw(damaged_bytes(p.read_bytes())))
    verify = data.draw(st.booleans())
    with guarded("data.read_shards", tmp_path / "outside"):
        out = rdata.read_shards(work / "data", verify=verify, problems=not verify)
        if not verify:
            assert out.samples.shape[0] == out.manifest["samples"]
    shutil.rmtree(work)


test_fuzz_read_shards, test_fuzz_read_shards_slow = both(_shards)


_DIGEST = sh.state_hash(SMALL).to_dict()


def _digest(data):
    d = data.draw(mutated_json(_DIGEST))
    with guarded("state.StateDigest.from_dict"):
        sh.StateDigest.from_dict(untrusted.parse_json(d, "digest"))


test_fuzz_state_digest, test_fuzz_state_digest_slow = both(_digest)


def _valid_cert():
    from test_audit import _cert  # the unit tests' valid certificate and run facts

    return _cert()


def _certificate(data):
    from test_audit import FACTS, TRUST

    text = data.draw(st.one_of(mutated_json(_valid_cert()), st.binary(max_size=100).map(lambda b: b.decode("latin-1"))))

    with guarded("audit.check_certificate"):
        chk = audit.check_certificate(untrusted.parse_json(text, "cert"), FACTS, TRUST)
        assert isinstance(chk.problems, list)


test_fuzz_certificate, test_fuzz_certificate_slow = both(_certificate)


def _vectors_dir(tmp_path):
    vec = tmp_path / "vec" / "vectors"
    if not vec.exists():
        vec.mkdir(parents=True)
        m = json.loads((store.VECTOR_DIR / store.MANIFEST).read_text())
        op_file = m["cases"][0]["file"]
        shutil.copy(store.VECTOR_DIR / op_file, vec / op_file)
        m["files"] = {op_file: m["files"][op_file]}
        m["cases"] = [c for c in m["cases"] if c["file"] == op_file][:3]
        (vec / store.MANIFEST).write_text(json.dumps(m))
        (tmp_path / "outside").mkdir(exist_ok=True)
        (tmp_path / "outside" / "x.safetensors").write_bytes(b"secret")
    return vec


@st.composite
def vector_manifests(draw, m):
    if draw(st.booleans()):
        return draw(mutated_json(m))
    m = copy.deepcopy(m)
    evil = draw(
        st.sampled_from(
            [
                "../../outside/x.safetensors",
                "/etc/passwd",
                "..",
                "a/../../outside/x.safetensors",
                "x.safetensors/..",
                "\0.safetensors",
            ]
        )
    )
    m["files"][evil] = {"sha256": "0" * 64, "bytes": 6}
    for c in m["cases"]:
        c["file"] = evil
    return json.dumps(m)


def _vectors(tmp_path, data):
    vec = _vectors_dir(tmp_path)
    m = json.loads((vec / store.MANIFEST).read_text())
    original = (vec / store.MANIFEST).read_text()
    (vec / store.MANIFEST).write_text(data.draw(vector_manifests(m)))
    try:
        with guarded("conformance.golden.store.load_cases", tmp_path / "outside"):
            store.load_cases(vec)
    finally:
        (vec / store.MANIFEST).write_text(original)


test_fuzz_vectors_manifest, test_fuzz_vectors_manifest_slow = both(_vectors)


# ---- command-line entry points on a published run ----------------------------------------------

STEPS = 3


@pytest.fixture(scope="module")
def run0(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzzrun") / "run"
    model, tcfg = presets.preset("tiny")
    model = dataclasses.replace(model, layers=1, seq_len=8, mlp_hidden=32, width=16)
    tcfg = dataclasses.replace(tcfg, micro_batches=2, micro_batch_size=1, warmup_steps=1)
    train.train(
        model, tcfg, steps=STEPS, checkpoint_every=1, out=path, launcher=InProcess(1), byte_cap=1 << 12, progress=None
    )
    from refreplay.commands import trace as _  # noqa: F401  (imported once, outside the guard)

    return path


_RUN_FILES = [
    "recipe.json",
    "steps.jsonl",
    "head.json",
    "data/manifest.json",
    "digests.jsonl",
    "traces/step-0000001.json",
    "checkpoints/step-0000001.safetensors",
    "checkpoints/step-0000003.safetensors",
    "data/shard-00000.zst",
]


def _semantically_same(a: bytes, b: bytes, lines: bool) -> bool:
    """Whether two JSON documents (or JSON-lines files) hold the same values."""

    def parse(x):
        try:
            if lines:
                return [untrusted.parse_json(line, "x") for line in x.splitlines() if line.strip()]
            return untrusted.parse_json(x, "x")
        except InputError:
            return None

    pa = parse(a)
    return pa is not None and pa == parse(b)


def _covered(argv, run):
    """The checkpoints a replay or audit of this argv compares ([step.verified.c1])."""
    if argv[0] == "replay":
        n = argv[3]
    else:
        head = json.loads((run / "head.json").read_text()) if (run / "head.json").is_file() else {}
        try:
            n = audit.draw_sample(auditor_keys.key(), head["chain_link"], "00", STEPS, 1).steps[0]
        except (KeyError, TypeError, AttributeError, InputError):
            return set()
    return {n - 1, n}


def _same_tensors(before: bytes, p: Path) -> bool:
    """Whether a changed tensor file still holds the same tensors and metadata
    ([state.fileread.c1] accepts any valid layout, not only the canonical one)."""
    q = p.with_name(p.name + ".before")
    q.write_bytes(before)
    try:
        (a, ma), (b, mb) = tensorio.load(q), tensorio.load(p)
    except InputError:
        return False
    finally:
        q.unlink()
    return (
        ma == mb
        and list(a) == list(b)
        and all(a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and a[k].tobytes() == b[k].tobytes() for k in a)
    )


def _may_verify(name, before: bytes, p: Path, covered) -> bool:
    """Whether a verdict of 0 is allowed after this change: the content means
    the same, or the file is a localisation aid, data whose hashes the step
    checks itself, a checkpoint outside the replayed range, or a recipe whose
    hashed part is unchanged."""
    if p.is_dir() or p.is_symlink():
        after = None
    else:
        after = p.read_bytes()
        if _semantically_same(before, after, name.endswith(".jsonl")):
            return True
    if name in ("digests.jsonl", "traces/step-0000001.json", "data/manifest.json", "data/shard-00000.zst"):
        return True
    if name.startswith("checkpoints/"):
        return int(name[-19:-12]) not in covered or (after is not None and _same_tensors(before, p))
    if name == "recipe.json" and after is not None:
        try:
            a, b = json.loads(before), untrusted.parse_json(after, "r")
            return (
                all(a[k] == b[k] for k in ("format", "recipe", "recipe_sha256"))
                and a["run"]["steps"] == b["run"]["steps"]
                and a["run"]["checkpoint_every"] == b["run"]["checkpoint_every"]
            )
        except (InputError, KeyError, TypeError):
            return False
    return False


def _cli(*args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in args])
    return rc, out.getvalue() + err.getvalue()


def _commands(run0, tmp_path, data):
    work = Path(tempfile.mkdtemp(dir=tmp_path))
    shutil.copytree(run0, work / "run", symlinks=True)
    run = work / "run"
    (run / "traces").mkdir(exist_ok=True)
    shutil.copy(run0 / "recipe.json", run / "traces" / "step-0000001.json")  # a wrong trace to start with
    (work / "outside").mkdir()
    (work / "outside" / "secret.json").write_text("{}")
    name = data.draw(st.sampled_from(_RUN_FILES))
    p = run / name
    before = p.read_bytes()
    how = data.draw(st.sampled_from(["json", "bytes", "link", "directory"]))
    if how == "json" and name.endswith(".json"):
        p.write_text(data.draw(mutated_json(json.loads(before))))
    elif how == "json" and name.endswith(".jsonl"):
        lines = before.decode().splitlines() or ["{}"]
        i = data.draw(st.integers(0, len(lines) - 1))
        lines[i] = data.draw(mutated_json(json.loads(lines[i])))
        p.write_text("\n".join(lines) + "\n")
    elif how == "link":
        p.unlink()
        p.symlink_to(work / "outside" / "secret.json")
    elif how == "directory":
        p.unlink()
        p.mkdir()
    else:
        p.write_bytes(data.draw(damaged_bytes(before)))
    command = data.draw(st.sampled_from(["replay", "coverage", "audit", "trace"]))
    private, public = auditor_keys.key_files(work / "keys")
    argv = {
        "replay": ["replay", run, "--step", data.draw(st.integers(1, STEPS))],
        "trace": ["trace", run, "--step", 2],
        "audit": [
            "audit",
            run,
            "--sample",
            1,
            "--beacon",
            "00",
            "--key",
            private,
            "--auditor",
            "f",
            "--out",
            work / "certs",
        ],
        "coverage": ["coverage", run, work / "certs", "--trust", public],
    }[command]
    if command == "coverage":
        (work / "certs").mkdir()
        (work / "certs" / "c.json").write_text(data.draw(mutated_json({"format": audit.CERT_FORMAT, "step": 1})))
    global _OPENED
    _count(f"cli {command}")
    _OPENED = []
    try:
        rc, text = _cli(*argv)
    finally:
        opened, _OPENED = _OPENED, None
    assert rc in (0, 1, 2) and "Traceback" not in text, f"{name} {how}: {text}"
    assert not [q for q in opened if q.startswith(str((work / "outside").resolve()))], (name, how, opened)
    if rc == 0 and command in ("replay", "audit"):
        assert _may_verify(name, before, p, _covered(argv, run)), f"{name} {how} verified: {text}"
    shutil.rmtree(work)


test_fuzz_commands, test_fuzz_commands_slow = both(_commands)
