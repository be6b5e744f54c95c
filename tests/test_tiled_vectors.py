"""Tiled tensors in the vectors ([conf.vectors.c2]): a pattern of P elements
stands for a tensor whose flat element i is pattern[i mod P].  The loader
bounds P, the tiled size and each case's total before reading anything,
and checks the stored pattern's shape; the writer refuses a tensor that is
not its pattern tiled."""

import json
import shutil

import numpy as np
import pytest

from refreplay.conformance.golden import store
from refreplay.conformance.shapes import axes
from refreplay.conformance.base.case import Case
from refreplay.errors import InputError


def _copy(tmp_path, op="adamw_update"):
    m = store.read_manifest()
    d = tmp_path / "v"
    d.mkdir()
    cases = [c for c in m["cases"] if c["op"] == op]
    files = {c["file"] for c in cases}
    for f in files:
        shutil.copy(store.VECTOR_DIR / f, d / f)
    m = {**m, "cases": cases, "files": {f: m["files"][f] for f in files}}
    (d / store.MANIFEST).write_text(json.dumps(m))
    return d, m


def _tiled(m):
    return next(c for c in m["cases"] if any("tile" in t for t in c["inputs"]))


def test_tiled_cases_load_whole_and_past_2_22_elements():
    m, cases = store.load_cases(ops=["adamw_update"])
    big = [c for c in cases if c.tiles]
    assert big and max(c.inputs["p"].size for c in big) == 2**22 + 1
    for c in big:
        for key, p in c.tiles.items():
            kind, _, name = key.partition("/")
            a = (c.inputs if kind == "in" else c.outputs)[name]
            assert p == axes.TILE and (a.view(np.uint32) == np.resize(a[:p], a.size).view(np.uint32)).all()


@pytest.mark.parametrize(
    "tile,shape,why",
    [
        (0, None, "tile must be an integer"),
        (True, None, "tile must be an integer"),
        ("251", None, "tile must be an integer"),
        (10**6, [7], "tile must be an integer"),
        (251, [1 << 20, 1 << 20], "tile must be an integer"),  # 2^40 elements claimed: refused, never allocated
    ],
)
def test_adversarial_tiles_are_refused_before_reading(tmp_path, tile, shape, why):
    d, m = _copy(tmp_path)
    t = _tiled(m)["inputs"][0]
    t["tile"] = tile
    if shape is not None:
        t["shape"] = shape
    (d / store.MANIFEST).write_text(json.dumps(m))
    with pytest.raises(InputError, match=why):
        store.read_manifest(d)


def test_too_many_tiled_elements_in_one_case_are_refused(tmp_path):
    """[conf.vectors.c2] The bound is per case: every tiled tensor of one case
    at 2^24 elements (each within its own bound), 7 x 2^24 > 2^26 in all, is
    refused from the manifest alone, before any file is read."""
    d, m = _copy(tmp_path)
    c = max((c for c in m["cases"] if any("tile" in t for t in c["inputs"])), key=lambda c: c["inputs"][0]["shape"])
    for t in c["inputs"] + c["outputs"]:
        if "tile" in t:
            t["shape"] = [store.MAX_TILED]
    (d / store.MANIFEST).write_text(json.dumps(m))
    with pytest.raises(InputError, match=f"case {c['id']}: its tiled tensors hold more than"):
        store.read_manifest(d)


def test_many_big_cases_load_as_patterns(tmp_path):
    """[conf.vectors.c2] A manifest's tiled total is not bounded, because a
    reader keeps the patterns and makes a case whole only when it runs: 40
    copies of the 2^22 + 1-element AdamW case (1.2 x 10^9 elements claimed,
    9 times the old 2^27 manifest bound) load in under 16 MiB, and each
    case's tensors are whole when read."""
    import tracemalloc

    from refreplay import tensorio

    d, m = _copy(tmp_path)
    c = max((c for c in m["cases"] if any("tile" in t for t in c["inputs"])), key=lambda c: c["inputs"][0]["shape"])
    tensors = tensorio.load_vectors(d / c["file"])[0]
    copies = [f"{c['id']}-copy{i}" for i in range(40)]
    pairs = [
        x
        for cid in copies
        for k in sorted(tensors)
        if k.startswith(c["id"] + "/")
        for x in (cid + k[len(c["id"]) :], tensors[k])
    ]
    data = bytes.fromhex(tensorio.file_bytes(store.FORMAT, *pairs))
    (d / c["file"]).write_bytes(data)
    m["files"] = {c["file"]: {"sha256": store.sha256(data), "bytes": len(data)}}
    m["cases"] = [{**c, "id": cid} for cid in copies]
    (d / store.MANIFEST).write_text(json.dumps(m))
    tracemalloc.start()
    try:
        _, cases = store.load_cases(d)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak
    assert len(cases) == 40 and cases[-1].inputs["p"].shape == (2**22 + 1,)


def test_a_pattern_of_another_length_is_refused(tmp_path):
    d, m = _copy(tmp_path)
    _tiled(m)["inputs"][0]["tile"] = axes.TILE - 1
    (d / store.MANIFEST).write_text(json.dumps(m))
    with pytest.raises(InputError, match="the manifest says"):
        store.load_cases(d)


def test_a_tensor_that_is_not_its_pattern_is_not_written():
    x = np.arange(600, dtype=np.float32)
    c = Case("t-sweep-00", "add", "sweep", "", [], {"a": x, "b": x}, {"out": x}, tiles={"in/a": 251})
    with pytest.raises(ValueError, match="not its first 251 elements tiled"):
        store.encode([c], "0", "1", 0)
    c.inputs["a"] = np.resize(x[:251], 600)
    assert store.encode([c], "0", "1", 0)  # tiled: written
