"""Properties of the reference checked with hypothesis at random shapes and
edge-heavy values (refreplay.testing.strategies):

* batch invariance: a row's result does not depend on which other rows are
  in the batch, nor on their order ([red.sum.c1]: the order of a sum
  depends on its length only);
* thread-count invariance: the same bits with 1 and with several threads
  (parallel loops run over independent outputs only);
* the loaders (tensor files, vector manifests) against random and mutated
  bytes: a clean ``InputError`` or a successful load, never another error;
* round trips of the vector file format ([conf.vectors.c1]).
"""

import json

import numba
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from refreplay import tensorio
from refreplay.conformance.shapes import live
from refreplay.conformance.golden import live_save
from refreplay.conformance.golden import store
from refreplay.conformance.base.case import as_outputs, load_inputs
from refreplay.conformance.table import OPS
from refreplay.errors import InputError
from refreplay.testing import strategies as rs

SETTINGS = settings(
    max_examples=15,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def ref(op, inputs):
    return as_outputs(OPS[op].reference(*load_inputs([inputs[n] for n in OPS[op].inputs])), OPS[op].outputs)


def same(a, b):
    return rs.same_bits(np.ascontiguousarray(a), np.ascontiguousarray(b))


# ---- batch invariance -----------------------------------------------------------------

# op -> (the inputs that carry the batch on axis 0, the outputs that do)
ROWWISE = {
    "matmul": (("A",), ("C",)),
    "matmul_nt": (("A",), ("C",)),
    "linear_forward": (("x",), ("y",)),
    "sum": (("X",), ("out",)),
    "max": (("X",), ("out",)),
    "softmax_forward": (("x",), ("y",)),
    "log_softmax_forward": (("x",), ("y",)),
    "layernorm_forward": (("x",), ("out", "mean", "rstd")),
    "rmsnorm_forward": (("x",), ("out", "rrms")),
    "cross_entropy_forward": (("logits", "targets"), ("losses",)),
    "attention_forward": (("q", "k", "v"), ("out", "att")),
}


@pytest.mark.parametrize("op", sorted(ROWWISE))
def test_batch_invariance(op):
    """Any sub-batch, in any order and with repeats, gives each of its rows
    the bits that row has in the full batch."""
    rows_in, rows_out = ROWWISE[op]

    @SETTINGS
    @given(rs.op_inputs(op, max_elements=3000), st.data())
    def check(drawn, data):
        dims, inputs = drawn
        n = inputs[rows_in[0]].shape[0]
        if n == 0:
            return
        full = ref(op, inputs)
        pick = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=6)))
        part = ref(op, {k: np.ascontiguousarray(v[pick]) if k in rows_in else v for k, v in inputs.items()})
        for name in rows_out:
            assert same(part[name], full[name][pick]), (dims, pick.tolist(), name)

    check()


# ---- thread-count invariance ---------------------------------------------------------------

PARALLEL = (
    "matmul",
    "matmul_nt",
    "matmul_tn",
    "matmul_i8",
    "sum",
    "col_sum",
    "linear_backward",
    "softmax_forward",
    "layernorm_backward",
    "attention_forward",
    "attention_backward",
    "cross_entropy_backward",
)


@pytest.mark.threads
@pytest.mark.parametrize("op", PARALLEL)
def test_thread_count_invariance(op):
    many = numba.config.NUMBA_NUM_THREADS
    keep = numba.get_num_threads()

    @settings(SETTINGS, max_examples=8)
    @given(rs.op_inputs(op, max_elements=40000))
    def check(drawn):
        dims, inputs = drawn
        try:
            numba.set_num_threads(1)
            one = ref(op, inputs)
            numba.set_num_threads(many)
            all_ = ref(op, inputs)
        finally:
            numba.set_num_threads(keep)
        for name in one:
            assert same(one[name], all_[name]), (dims, name)

    check()


# ---- loaders against random and mutated bytes -------------------------------------------------


def _saved_dir(tmp_path):
    d = tmp_path / "v"
    cases = [live.build("matmul", {"I": 2, "K": 5, "J": 3}, 1, 0), live.build("sum", {"I": 2, "N": 4}, 1, 0)]
    live_save.save(cases, d, 1)
    return d


def _loads_cleanly(fn):
    try:
        fn()
    except InputError:
        pass


@SETTINGS
@given(st.binary(max_size=512))
def test_tensor_loader_on_random_bytes(tmp_path_factory, data):
    p = tmp_path_factory.mktemp("t") / "x.safetensors"
    p.write_bytes(data)
    with pytest.raises(InputError):
        tensorio.load(p)


@SETTINGS
@given(
    st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), min_size=1, max_size=4), st.integers(0, 1 << 20)
)
def test_loaders_on_mutated_files(tmp_path_factory, flips, cut):
    d = _saved_dir(tmp_path_factory.mktemp("m"))
    for name in (store.MANIFEST, "matmul.safetensors"):
        data = bytearray((d / name).read_bytes())
        for pos, val in flips:
            data[pos % len(data)] = val
        (d / name).write_bytes(bytes(data[: max(1, cut % (len(data) + 1))]))
        _loads_cleanly(lambda: store.load_cases(d))
        _loads_cleanly(lambda: tensorio.load(d / "matmul.safetensors"))


@SETTINGS
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=8),
        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=4),
        max_leaves=12,
    ),
    st.sampled_from(["format", "files", "cases", "seed", "spec_version", None]),
)
def test_manifest_loader_on_random_structures(tmp_path_factory, junk, where):
    """A manifest whose fields (or whose one case) are replaced by arbitrary
    JSON: an InputError or a load, nothing else."""
    d = _saved_dir(tmp_path_factory.mktemp("j"))
    m = json.loads((d / store.MANIFEST).read_text())
    if where is None:
        m["cases"][0] = junk
    else:
        m[where] = junk
    (d / store.MANIFEST).write_text(json.dumps(m))
    _loads_cleanly(lambda: store.load_cases(d))


# ---- round trips of the vector format -------------------------------------------------------------


@SETTINGS
@given(
    st.sampled_from(
        [
            "matmul",
            "matmul_tn",
            "matmul_i8",
            "sum",
            "exp",
            "softmax_backward",
            "cross_entropy_forward",
            "embedding_backward",
            "adamw_update",
        ]
    ).flatmap(lambda op: st.tuples(st.just(op), rs.op_inputs(op, max_elements=600)))
)
def test_vector_format_round_trip(tmp_path_factory, drawn):
    """Cases with edge values (NaN payloads, subnormals, -0, empty tensors)
    written and read back: the same ids, clauses and bits, and encoding is
    byte-deterministic."""
    op, (dims, inputs) = drawn
    cases = [live.make_case(op, inputs, f"{op}-live-00", live.format_dims(dims))]
    files = store.encode(cases, "9.9", live.GENERATOR_VERSION, 7)
    assert files == store.encode(cases, "9.9", live.GENERATOR_VERSION, 7)
    d = tmp_path_factory.mktemp("rt")
    store.write(files, d)
    m, back = store.load_cases(d)
    assert m["seed"] == 7 and len(back) == 1
    (c,) = back
    assert (c.id, c.op, c.family, c.clauses) == (cases[0].id, op, cases[0].family, cases[0].clauses)
    for side in ("inputs", "outputs"):
        a, b = getattr(c, side), getattr(cases[0], side)
        assert list(a) == list(b)
        for n in a:
            assert same(a[n], b[n]), (side, n)
