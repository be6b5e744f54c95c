"""Causal tensors in the vectors ([conf.vectors.c3]): the attention ops' att
[..., T, T] is stored as the lower triangle (s <= t) of each matrix, +0
above.  The loader checks the flag and the square shape from the manifest
before reading, bounds the whole shape like a tiled one's, and checks the
stored triangle's length; the writer refuses a tensor with anything but +0
above its diagonal."""

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
    """Every att of the attention ops is stored causal, loads whole with +0 above the diagonal, and
    (binary32 backward) is the forward's att of the case's q and k, T = 1,025 included."""
    from refreplay.ops import attention

    m = store.read_manifest()
    for c in m["cases"]:
        for t in c["inputs"] + c["outputs"]:
            assert ("causal" in t) == (t["name"] == "att" and "attention" in c["op"]), (c["id"], t["name"])
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
