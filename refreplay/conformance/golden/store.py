"""Golden vectors on disk: one safetensors file per op plus ``manifest.json``.

Format (spec/07-conformance.txt, [conf.vectors.c1]):
  vectors/<op>.safetensors   tensors "<case id>/in/<name>" and "<case id>/out/<name>",
                             little-endian, written by ``tensorio`` (byte-
                             deterministic layout, one ``__metadata__`` key)
  vectors/manifest.json      format, spec version, generator version, seed,
                             per file its sha256, per case: op, family, the
                             property probed, clause labels, and per tensor
                             dtype, shape and (outputs) sha256 of its bytes.

Reading checks every file's sha256 against the manifest and every output's
sha256 against its bytes before anything is compared: a corrupt or edited
vector is an ``InputError`` (exit 2), never a pass.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np

from ... import files as _files, untrusted
from ...errors import InputError
from ...resources import data_dir
from ..base.case import BF16, DTYPES, Case, Tiled, causal_count, dtype_name, pack_causal, untile

VECTOR_DIR = data_dir("vectors")
MANIFEST = "manifest.json"
FORMAT = "refreplay-vectors/1"
FILE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}\.safetensors")
MAX_FILE = 1 << 30  # bytes of one vector file
# [conf.vectors.c2] a tiled tensor holds at most 2^24 elements once tiled, and the tiled tensors of
# one case at most 2^26 together (256 MiB of binary32).  The loader keeps the patterns and a case's
# tensors are made whole only when it runs (``case.Tiled``): a manifest cannot make a reader
# allocate more than one case's bound at a time, whatever its shapes claim.
MAX_TILED = 1 << 24
MAX_TILED_CASE = 1 << 26


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tensor_sha(a: np.ndarray) -> str:
    return sha256(np.ascontiguousarray(a).tobytes())


def _le(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))


def stored(case: Case, key: str, a: np.ndarray) -> np.ndarray:
    """[conf.vectors.c2, conf.vectors.c3] What the file holds for tensor ``key`` of
    ``case``: the whole array, for a tiled one its first P elements (flat,
    row-major), after checking that tiling them gives the array back, for a
    causal one its lower triangles, after checking that the rest is +0."""
    if key in case.causal:
        packed = None if key in case.tiles or a.ndim < 2 or a.shape[-1] != a.shape[-2] else pack_causal(a)
        if packed is None:
            raise ValueError(f"{case.id}: {key} {list(a.shape)} is not causal: [..., T, T] with +0 above the diagonal")
        return packed
    p = case.tiles.get(key)
    if p is None:
        return a
    flat = np.ascontiguousarray(a).reshape(-1)
    if not 1 <= p <= flat.size <= MAX_TILED or not np.array_equal(
        untile(flat[:p], a.shape).view(np.uint8), np.ascontiguousarray(a).view(np.uint8)
    ):
        raise ValueError(f"{case.id}: {key} is not its first {p} elements tiled to {list(a.shape)}")
    return np.ascontiguousarray(flat[:p])


def encode_file(cases: list[Case]) -> bytes:
    """One op's cases as the bytes of a refreplay tensor file ([state.file.c1]:
    tensors in name order, compact sorted header, one metadata key)."""
    from ... import tensorio

    pairs = []
    bf16 = frozenset(f"{c.id}/{k}" for c in cases for k in c.bf16)
    for c in cases:
        for n, a in c.inputs.items():
            pairs += [f"{c.id}/in/{n}", _le(stored(c, f"in/{n}", a))]
        for n, a in c.outputs.items():
            if f"out/{n}" not in c.hashed:  # [conf.vectors.c4] held by its sha256 alone
                pairs += [f"{c.id}/out/{n}", _le(stored(c, f"out/{n}", a))]
    return bytes.fromhex(tensorio.file_bytes(FORMAT, *pairs, bf16=bf16))


def _tensor_entry(case, kind, name, a, with_sha):
    key = f"{kind}/{name}"
    e = {"name": name, "dtype": case.dtype(key), "shape": list(a.shape)}
    if key in case.tiles:
        e["tile"] = case.tiles[key]
    if key in case.causal:
        e["causal"] = True
    if key in case.hashed:
        e["hashed"] = True
    if with_sha:
        e["sha256"] = tensor_sha(stored(case, key, a))  # of the bytes the file holds
    return e


def encode(cases: list[Case], spec_version: str, generator_version: str, seed: int) -> dict[str, bytes]:
    """All files (name -> bytes), the manifest last."""
    by_op: dict[str, list[Case]] = {}
    for c in cases:
        by_op.setdefault(c.op, []).append(c)
    files = {f"{op}.safetensors": encode_file(cs) for op, cs in by_op.items()}
    manifest = {
        "format": FORMAT,
        "spec_version": spec_version,
        "generator_version": generator_version,
        "seed": seed,
        "files": {name: {"sha256": sha256(data), "bytes": len(data)} for name, data in files.items()},
        "cases": [
            {
                "id": c.id,
                "op": c.op,
                "file": f"{c.op}.safetensors",
                "family": c.family,
                "probes": c.probes,
                "clauses": [f"[{lb}]" for lb in c.clauses],
                "inputs": [_tensor_entry(c, "in", n, a, False) for n, a in c.inputs.items()],
                "outputs": [_tensor_entry(c, "out", n, a, True) for n, a in c.outputs.items()],
            }
            for c in cases
        ],
    }
    files[MANIFEST] = _manifest_bytes(manifest)
    return files


def _manifest_bytes(manifest: dict) -> bytes:
    """The manifest as JSON, one file and one case a line (a diff names what changed; the
    indented form took 2.2 MB of the 40 MB the vectors may hold, this 1.6 MB)."""

    def dump(x):
        return json.dumps(x, ensure_ascii=False, separators=(",", ":"))

    def items(lines):
        return ",\n".join(lines) + "\n" if lines else ""

    head = dump({k: v for k, v in manifest.items() if k not in ("files", "cases")})[:-1]
    files = items([f"{dump(k)}:{dump(v)}" for k, v in manifest["files"].items()])
    cases = items([dump(c) for c in manifest["cases"]])
    return f'{head},"files":{{\n{files}}},"cases":[\n{cases}]}}\n'.encode()


def write(files: dict[str, bytes], directory: Path = VECTOR_DIR) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _files.write_error(exc, directory) from None
    for name, data in files.items():
        _files.write_atomic(directory / name, data)  # synced temporary, renamed: whole or absent


def read_manifest(directory: Path = VECTOR_DIR) -> dict:
    path = directory / MANIFEST
    if not path.is_file():
        raise InputError(f"no vectors at {directory} (missing {MANIFEST}; run `refreplay vectors generate`)")
    try:
        m = untrusted.load_json(path, directory, "vectors manifest")
    except InputError as exc:
        raise InputError(f"corrupt manifest: {exc}") from None
    _validate_manifest(m, path)
    return m


def _validate_manifest(m, path):
    def bad(what):
        raise InputError(f"{path}: corrupt manifest ({what})")

    if not isinstance(m, dict) or m.get("format") != FORMAT:
        bad(f"format is not {FORMAT!r}")
    for key in ("spec_version", "generator_version", "seed", "files", "cases"):
        if key not in m:
            bad(f"missing {key!r}")
    if not isinstance(m["files"], dict) or not isinstance(m["cases"], list):
        bad("files must be an object and cases a list")
    for name, entry in m["files"].items():
        # a bare file name of this directory: never a path, so nothing outside it is opened
        if not FILE_NAME.fullmatch(name):
            bad(f"file name {name!r} is not a plain <name>.safetensors in the vectors directory")
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("sha256"), str)
            and isinstance(entry.get("bytes"), int)
            and not isinstance(entry.get("bytes"), bool)
            and 0 <= entry["bytes"] <= MAX_FILE
        ):
            bad(f"files[{name!r}] must give its sha256 and a byte count up to {MAX_FILE}")
    ids = set()
    for i, c in enumerate(m["cases"]):
        try:
            _check_case(c, m["files"], ids, bad)
        except (KeyError, TypeError) as exc:
            bad(f"case {i} malformed: {exc!r}")


def _strs(x) -> bool:
    return isinstance(x, list) and all(isinstance(v, str) for v in x)


def _check_tile(c, t, tiled, bad) -> None:
    """[conf.vectors.c2] A tiled tensor's pattern length and tiled size are bounded before
    anything is read or allocated."""
    p = t["tile"]
    n = 1
    for d in t["shape"]:
        n *= d
        if n > MAX_TILED:
            break
    if not (isinstance(p, int) and not isinstance(p, bool) and 1 <= p <= n <= MAX_TILED):
        bad(
            f"case {c['id']}: tensor {t['name']}: tile must be an integer in [1, elements of its shape] "
            f"and the shape at most {MAX_TILED} elements"
        )
    tiled[0] += n
    if tiled[0] > MAX_TILED_CASE:
        bad(f"case {c['id']}: its tiled tensors hold more than {MAX_TILED_CASE} elements")


def _count_whole(c, t, tiled, bad, what) -> None:
    """A tensor a reader makes whole (a causal or a hashed one) holds at most MAX_TILED elements
    and counts toward its case's bound of [conf.vectors.c2], checked before anything is read."""
    n = 1
    for d in t["shape"]:
        n *= d
        if n > MAX_TILED:
            bad(f"case {c['id']}: tensor {t['name']}: {what} holds at most {MAX_TILED} elements")
    tiled[0] += n
    if tiled[0] > MAX_TILED_CASE:
        bad(f"case {c['id']}: its tiled, causal and hashed tensors hold more than {MAX_TILED_CASE} elements")


def _check_causal(c, t, tiled, bad) -> None:
    """[conf.vectors.c3] A causal tensor is [..., T, T], not tiled as well; its whole size is bounded."""
    shape = t["shape"]
    if t["causal"] is not True or "tile" in t or len(shape) < 2 or shape[-1] != shape[-2]:
        bad(f"case {c['id']}: tensor {t['name']}: causal must be true, on a [..., T, T] tensor that is not tiled")
    _count_whole(c, t, tiled, bad, "a causal shape")


def _check_hashed(c, t, tiled, bad) -> None:
    """[conf.vectors.c4] Only an output may be hashed, not tiled or causal as well; it is made
    whole by the reference, so its size is bounded like a causal one's."""
    if t["hashed"] is not True or "tile" in t or "causal" in t:
        bad(f"case {c['id']}: tensor {t['name']}: hashed must be true, on an output neither tiled nor causal")
    _count_whole(c, t, tiled, bad, "a hashed output")


def _check_case(c, files, ids, bad) -> None:
    """Every field of one manifest case has its type ([conf.vectors.c1])."""
    if not (
        isinstance(c, dict)
        and all(isinstance(c[k], str) for k in ("id", "op", "file", "family", "probes"))
        and _strs(c["clauses"])
        and isinstance(c["inputs"], list)
        and isinstance(c["outputs"], list)
    ):
        bad(
            "a case must be an object with string id, op, file, family and probes, a list of clause "
            "labels and lists of inputs and outputs"
        )
    if c["id"] in ids:
        bad(f"duplicate case id {c['id']}")
    ids.add(c["id"])
    if c["file"] not in files:
        bad(f"case {c['id']} names unknown file {c['file']}")
    tiled = [0]  # elements of the case's tiled tensors, summed as they are checked
    for t in c["inputs"] + c["outputs"]:
        if not (
            isinstance(t, dict)
            and isinstance(t["name"], str)
            and isinstance(t["dtype"], str)
            and t["dtype"] in DTYPES
            and isinstance(t["shape"], list)
            and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in t["shape"])
        ):
            bad(f"case {c['id']}: every tensor needs a string name, a known dtype and a shape of sizes")
        if "tile" in t:
            _check_tile(c, t, tiled, bad)
        if "causal" in t:
            _check_causal(c, t, tiled, bad)
    for t in c["inputs"]:
        if "hashed" in t:
            bad(f"case {c['id']}: input {t['name']} is hashed: only an output may be")
    for t in c["outputs"]:
        if "hashed" in t:
            _check_hashed(c, t, tiled, bad)
    for t in c["outputs"]:
        if not (isinstance(t["sha256"], str) and len(t["sha256"]) == 64):
            bad(f"case {c['id']}: bad sha256 for output {t['name']}")


def read_file(directory: Path, name: str, entry: dict) -> tuple[dict[str, np.ndarray], frozenset]:
    """The tensors of one vector file, after checking its sha256, and the
    names of its BF16 tensors; the file is then parsed by the validating
    reader ([state.fileread.c1])."""
    from ... import tensorio

    path = directory / name
    if not FILE_NAME.fullmatch(name):
        raise InputError(f"{path}: not a plain file name of the vectors directory; refusing to open it")
    if not path.is_file() and not path.is_symlink():
        raise InputError(f"{path}: vector file missing (listed in the manifest)")
    data = untrusted.read_file(path, MAX_FILE, directory, "vector file")
    if sha256(data) != entry.get("sha256"):
        raise InputError(
            f"{path}: sha256 {sha256(data)[:16]}... does not match the manifest "
            f"({str(entry.get('sha256'))[:16]}...): the file is corrupt or was edited; "
            f"`refreplay vectors verify` names the differing cases"
        )
    tensors, metadata, bf16 = tensorio.load_vectors(path)
    if metadata != FORMAT:
        raise InputError(f"{path}: metadata {metadata!r} is not {FORMAT!r}")
    return tensors, bf16


def load_cases(directory: Path = VECTOR_DIR, ops=None) -> tuple[dict, list[Case]]:
    """Manifest and cases (optionally only the given ops), every tensor
    checked against the manifest's dtype, shape and sha256."""
    m = read_manifest(directory)
    wanted = [c for c in m["cases"] if ops is None or c["op"] in ops]
    files = {}
    out = []
    for c in wanted:
        if c["file"] not in files:
            files[c["file"]] = read_file(directory, c["file"], m["files"][c["file"]])
        tensors, bf16 = files[c["file"]]

        def get(kind, t):
            key = f"{c['id']}/{kind}/{t['name']}"
            if "hashed" in t:  # [conf.vectors.c4] in the manifest only: recomputed when read
                if key in tensors:
                    raise InputError(f"{directory / c['file']}: {key} is in the file, the manifest says it is hashed")
                return np.empty(0, DTYPES[t["dtype"]])
            if key not in tensors:
                raise InputError(f"{directory / c['file']}: tensor {key} missing")
            a = tensors[key]
            # [bf16.format.c1] a BF16 tensor of the file is dtype bf16 in the manifest, and only it
            dt = BF16 if key in bf16 else dtype_name(a)
            # [conf.vectors.c2] the file holds the pattern, [conf.vectors.c3] the lower triangles
            want = [t["tile"]] if "tile" in t else [causal_count(t["shape"])] if "causal" in t else t["shape"]
            if dt != t["dtype"] or list(a.shape) != want:
                raise InputError(
                    f"{directory / c['file']}: {key} is {dt}{list(a.shape)}, the manifest says {t['dtype']}{want}"
                )
            if kind == "out" and tensor_sha(a) != t["sha256"]:
                raise InputError(f"{directory / c['file']}: {key} does not match its sha256 in the manifest")
            return a  # [conf.vectors.c2] a tiled tensor stays its pattern until the case runs

        def of_case(kind, ts, inputs=None):
            shapes = {t["name"]: tuple(t["shape"]) for t in ts if "tile" in t or "causal" in t or "hashed" in t}
            causal = frozenset(t["name"] for t in ts if "causal" in t)
            made = {t["name"]: (t["sha256"], _recompute(c, t, inputs)) for t in ts if "hashed" in t}
            return Tiled({t["name"]: get(kind, t) for t in ts}, shapes, causal, made)

        inputs = of_case("in", c["inputs"])

        out.append(
            Case(
                c["id"],
                c["op"],
                c["family"],
                c["probes"],
                [lb.strip("[]") for lb in c["clauses"]],
                inputs,
                of_case("out", c["outputs"], inputs),
                frozenset(
                    f"{kind}/{t['name']}"
                    for kind, ts in (("in", c["inputs"]), ("out", c["outputs"]))
                    for t in ts
                    if t["dtype"] == BF16
                ),
                {
                    f"{kind}/{t['name']}": t["tile"]
                    for kind, ts in (("in", c["inputs"]), ("out", c["outputs"]))
                    for t in ts
                    if "tile" in t
                },
                frozenset(
                    f"{kind}/{t['name']}"
                    for kind, ts in (("in", c["inputs"]), ("out", c["outputs"]))
                    for t in ts
                    if "causal" in t
                ),
                frozenset(f"out/{t['name']}" for t in c["outputs"] if "hashed" in t),
            )
        )
    return m, out


def _recompute(c, t, inputs):
    """[conf.vectors.c4] How hashed output ``t`` of manifest case ``c`` is made whole: the
    reference on the case's inputs, as the generator computed it, accepted only if its bytes
    have the manifest's sha256; else an InputError (the comparison then shows the hashes)."""

    def make():
        from ..base.case import as_outputs, load_inputs
        from ..table import OPS

        op = OPS.get(c["op"])
        if op is None or any(n not in inputs for n in op.inputs):
            raise InputError(f"case {c['id']}: op {c['op']!r} or its inputs unknown: its hashed output cannot be made")
        raw = [np.ascontiguousarray(inputs[n]) for n in op.inputs]
        try:
            a = as_outputs(op.reference(*load_inputs(raw)), op.outputs).get(t["name"])
        except (ValueError, TypeError, IndexError) as exc:  # inputs the reference refuses
            raise InputError(f"case {c['id']}: the reference refuses its inputs ({exc})") from None
        dt = None if a is None else BF16 if f"out/{t['name']}" in op.bf16 else dtype_name(a)
        if dt != t["dtype"] or list(a.shape) != t["shape"] or tensor_sha(a) != t["sha256"]:
            raise InputError(
                f"case {c['id']}: the reference on this machine does not reproduce its hashed output "
                f"{t['name']} (sha256 {t['sha256'][:16]}...): run `refreplay doctor`"
            )
        return a

    return make
