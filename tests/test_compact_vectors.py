"""Compact tensors in the vectors.  Causal ([conf.vectors.c3]): the attention
ops' att [..., T, T] is stored as the lower triangle (s <= t) of each matrix,
+0 above; the loader checks the flag and the square shape from the manifest
before reading, bounds the whole shape like a tiled one's, and checks the
stored triangle's length; the writer refuses a tensor with anything but +0
above its diagonal.  Hashed ([conf.vectors.c4]): a long attention forward's
att is held by its sha256 alone; a kernel matches by the hash, and only a
mismatch recomputes the expected elements, never at the verdict's cost."""

import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from refreplay.conformance.base.case import Case, causal_count, pack_causal, unpack_causal
from refreplay.conformance.golden import store
from refreplay.errors import InputError
from test_tiled_vectors import _copy


def _causal(m):
    return next(t for c in m["cases"] for t in c["inputs"] + c["outputs"] if "causal" in t and t["shape"][-1] > 2)


def test_every_att_is_causal_and_loads_as_the_forwards_own():
    """Every att of the attention ops that is stored is stored causal, loads whole with +0 above the diagonal, and
    (binary32 backward) is the forward's att of the case's q and k, T = 1,025 included."""
    from refreplay.ops import attention

    m = store.read_manifest()
    for c in m["cases"]:
        for t in c["inputs"] + c["outputs"]:
            att = t["name"] == "att" and "attention" in c["op"]
            assert ("causal" in t) == (att and "hashed" not in t), (c["id"], t["name"])  # hashed: not stored
    _, cases = store.load_cases(ops=["attention_backward"])
    assert max(c.inputs["att"].shape[-1] for c in cases) == 1025
    for c in cases:
        att = c.inputs["att"]
        assert c.causal == {"in/att"} and not np.triu(att.view(np.uint32), 1).any()
        _, fwd = attention.attention_forward(c.inputs["q"], c.inputs["k"], c.inputs["v"])
        assert np.array_equal(fwd.view(np.uint32), att.view(np.uint32)), c.id


@settings(max_examples=60, deadline=None)
@given(
    lead=st.lists(st.integers(0, 3), max_size=2),
    t=st.integers(0, 9),
    dtype=st.sampled_from([np.float32, np.uint16]),
    seed=st.integers(0, 2**32 - 1),
)
def test_pack_and_unpack_round_trip(lead, t, dtype, seed):
    """The stored order is row-major over the lower triangle: element (t, s) of matrix l is stored
    at l * T (T + 1) / 2 + t (t + 1) / 2 + s."""
    rng = np.random.default_rng(seed)
    shape = (*lead, t, t)
    a = np.tril(rng.integers(1, 1 << 15, shape).astype(dtype))
    p = pack_causal(a)
    assert p is not None and p.shape == (causal_count(shape),)
    L = int(np.prod(lead, dtype=np.int64))
    flat = a.reshape(L, t, t)
    for idx in rng.integers(0, max(1, p.size), 5) if p.size else ():
        l, r = divmod(int(idx), t * (t + 1) // 2)
        row = int((np.sqrt(8 * r + 1) - 1) // 2)
        assert p[idx] == flat[l, row, r - row * (row + 1) // 2]
    assert np.array_equal(unpack_causal(p, shape), a)
    if t > 1 and L:
        b = a.copy()
        b.reshape(L, t, t)[-1, 0, t - 1] = dtype(1)  # anything above the diagonal: not causal
        assert pack_causal(b) is None


def test_minus_zero_above_the_diagonal_is_not_causal():
    a = np.zeros((3, 3), np.float32)
    a[0, 2] = -0.0
    assert pack_causal(a) is None
    c = Case("t-sweep-00", "attention_backward", "sweep", "", [], {"att": a}, {}, causal=frozenset({"in/att"}))
    with pytest.raises(ValueError, match="is not causal"):
        store.encode([c], "0", "1", 0)
    a[0, 2] = 0.0
    assert store.encode([c], "0", "1", 0)


@pytest.mark.parametrize(
    "edit,why",
    [
        (lambda t: t.update(causal=1), "causal must be true"),
        (lambda t: t.update(causal="yes"), "causal must be true"),
        (lambda t: t.update(tile=7), "causal must be true"),
        (lambda t: t.update(shape=t["shape"][:-1] + [t["shape"][-1] + 1]), "causal must be true"),
        (lambda t: t.update(shape=[t["shape"][-1]]), "causal must be true"),
        (lambda t: t.update(shape=[1 << 20, 1 << 20]), "at most"),  # 2^40 claimed: refused, never allocated
    ],
)
def test_adversarial_causal_entries_are_refused_before_reading(tmp_path, edit, why):
    d, m = _copy(tmp_path, "attention_backward")
    edit(_causal(m))
    (d / store.MANIFEST).write_text(json.dumps(m))
    with pytest.raises(InputError, match=why):
        store.read_manifest(d)


def test_a_stored_triangle_of_another_length_is_refused(tmp_path):
    """The manifest claims a T the file's triangle does not hold: refused at load (exit 2)."""
    d, m = _copy(tmp_path, "attention_backward")
    t = _causal(m)
    t["shape"] = t["shape"][:-2] + [t["shape"][-1] - 1] * 2
    (d / store.MANIFEST).write_text(json.dumps(m))
    with pytest.raises(InputError, match="the manifest says"):
        store.load_cases(d)


def test_a_reader_without_the_clause_refuses_the_file(tmp_path):
    """Dropping the flag (an older reader's view) makes the stored triangle a shape mismatch, never
    a silently misread tensor."""
    d, m = _copy(tmp_path, "attention_backward")
    del _causal(m)["causal"]
    (d / store.MANIFEST).write_text(json.dumps(m))
    with pytest.raises(InputError, match="the manifest says"):
        store.load_cases(d)


# ---- [conf.vectors.c4] hashed outputs ----------------------------------------------------------


def _hashed(m):
    return next(t for c in m["cases"] for t in c["outputs"] if "hashed" in t)


def test_long_forward_att_is_hashed_and_recomputes_to_the_reference():
    from refreplay.ops import attention

    m, cases = store.load_cases(ops=["attention_forward", "bf16_attention_forward"])
    hashed = [c for c in cases if c.hashed]
    assert {c.inputs["q"].shape[2] for c in hashed} >= {1024, 1025}
    for c in m["cases"]:
        for t in c["outputs"]:
            assert ("hashed" in t) == (t["name"] == "att" and int(np.prod(t["shape"])) >= 1 << 18), c["id"]
    c = next(c for c in hashed if c.op == "attention_forward")
    _, att = attention.attention_forward(c.inputs["q"], c.inputs["k"], c.inputs["v"])
    assert np.array_equal(c.outputs["att"].view(np.uint32), att.view(np.uint32))
    assert c.outputs["att"].shape == c.shape("out/att") == att.shape


@pytest.mark.parametrize(
    "edit,why",
    [
        (lambda c, t: t.update(hashed=1), "hashed must be true"),
        (lambda c, t: t.update(tile=7), "hashed must be true"),
        (lambda c, t: t.update(causal=True), "hashed must be true"),
        (lambda c, t: t.update(shape=[1 << 20, 1 << 20]), "at most"),
        (lambda c, t: c["inputs"][0].update(hashed=True), "only an output may be"),
    ],
)
def test_adversarial_hashed_entries_are_refused_before_reading(tmp_path, edit, why):
    d, m = _copy(tmp_path, "attention_forward")
    c = next(c for c in m["cases"] if any("hashed" in t for t in c["outputs"]))
    edit(c, _hashed(m))
    (d / store.MANIFEST).write_text(json.dumps(m))
    with pytest.raises(InputError, match=why):
        store.read_manifest(d)


def test_a_stored_output_declared_hashed_is_refused(tmp_path):
    d, m = _copy(tmp_path, "attention_forward")
    c = next(c for c in m["cases"] if not any("hashed" in t for t in c["outputs"]))
    c["outputs"][0]["hashed"] = True
    (d / store.MANIFEST).write_text(json.dumps(m))
    with pytest.raises(InputError, match="is in the file, the manifest says it is hashed"):
        store.load_cases(d)


def test_the_verdict_is_the_hashs_alone(tmp_path, monkeypatch):
    """A kernel whose output has the sha256 passes without the expected elements being made
    (their recomputation is broken here); one that differs fails, located where the reference
    can recompute them and shown by the hashes where it cannot."""
    from refreplay.conformance.running import compare
    from refreplay.conformance.running.kernel import Kernel

    _, cases = store.load_cases(ops=["attention_forward"])
    case = next(c for c in cases if c.hashed and c.inputs["q"].shape[2] == 1025)
    from refreplay.ops import attention

    good = dict(zip(("out", "att"), attention.attention_forward(*(case.inputs[n] for n in ("q", "k", "v")))))
    bad = {**good, "att": good["att"].copy()}
    bad["att"][0, 0, 700, 3] = np.nextafter(bad["att"][0, 0, 700, 3], np.float32(1))

    class Fixed(Kernel):
        def __init__(self, out):
            self.out = out

        def run(self, op, inputs, specs, case_id):
            return self.out

    assert compare.run_case(Fixed(bad), case).mismatches[0].first_index == (0, 0, 700, 3)
    made = case.outputs._made
    monkeypatch.setitem(made, "att", (made["att"][0], lambda: (_ for _ in ()).throw(InputError("broken here"))))
    assert compare.run_case(Fixed(good), case).status == "pass"
    r = compare.run_case(Fixed(bad), case)
    assert r.status == "fail" and r.mismatches[0].output == "att" and "broken here" in r.mismatches[0].expected


def test_a_tampered_hash_fails_the_reference_never_passes(tmp_path):
    """The manifest's sha256 of a hashed output edited: the reference itself no longer matches,
    so `conform reference` says NOT CONFORMANT (exit 1) with the hashes, no traceback."""
    from cli_helpers import run_cli

    d, m = _copy(tmp_path, "attention_forward")
    t = _hashed(m)
    t["sha256"] = ("0" if t["sha256"][0] != "0" else "1") + t["sha256"][1:]
    (d / store.MANIFEST).write_text(json.dumps(m))
    p = run_cli("conform", "reference", "--vectors", d)
    rc, out, err = p.returncode, p.stdout, p.stderr
    assert rc == 1 and "Traceback" not in out + err, out + err
    assert "verdict: NOT CONFORMANT" in out and "does not reproduce its hashed output" in out
