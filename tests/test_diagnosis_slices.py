"""[conf.diagnosis.r1] A failing case too large to re-evaluate whole is
diagnosed on slices of it whose outputs are the case's own (``slices``): a
slice's reference outputs equal the case's at the positions kept, and a
kernel with one known deviation gets, at a size that needs slicing, the
cause the whole diagnosis of a small case of it names."""

from __future__ import annotations

import numpy as np
import pytest

from refreplay.conformance.diagnosis import slices as S
from refreplay.conformance.diagnosis.diagnose import SLICED, TOO_BIG, diagnose
from refreplay.conformance.running.compare import Result
from refreplay.conformance.shapes import live
from refreplay.conformance.table import OPS


def _case(op, shape, seed=0):
    return live.build(op, live.parse_shape(op, shape), seed)


def _perturbed(case, every=7):
    """The case's outputs with every ``every``-th element one bit (or one) off."""
    out = {}
    for n, e in case.outputs.items():
        a = e.copy()
        flat = a.reshape(-1)
        if a.dtype == np.float32:
            flat.view(np.uint32)[::every] ^= np.uint32(1)
        else:
            flat[::every] += 1
        out[n] = a
    return out


# op, shape: small live shapes, cut hard by a budget of a tenth of the whole case
SLICEABLE = [
    ("matmul", "I=9,K=40,J=11"),
    ("matmul_nt", "I=9,K=40,J=11"),
    ("matmul_tn", "I=9,K=40,J=11"),
    ("linear_forward", "N=9,C=40,OC=11"),
    ("linear_backward", "N=9,C=40,OC=11"),
    ("layernorm_backward", "N=33,C=40"),
    ("rmsnorm_backward", "N=33,C=40"),
    ("cross_entropy_forward", "N=33,V=40"),
    ("attention_forward", "B=2,NH=2,T=24,HS=8"),
]
# a (b, h) pair is the smallest slice of attention_backward ([attn.bwd.c1]): a quarter of these
CUT = {"attention_backward": 4}


@pytest.mark.parametrize("op,shape", SLICEABLE + [("attention_backward", "B=2,NH=2,T=24,HS=8")])
def test_a_slices_reference_outputs_are_the_cases_own_there(op, shape, monkeypatch):
    """The reference on a slice's inputs gives, bit for bit, the outputs the
    slice holds, which are cut from the case's: every output the slice keeps
    depends on the inputs it keeps only."""
    case = _case(op, shape)
    r = Result(case, "fail", actual=_perturbed(case))
    monkeypatch.setattr(S, "SLICE_FROM", max(1, S.model_bytes(OPS[op], r) // CUT.get(op, 10)))
    subs = S.slices(OPS[op], r)
    assert subs
    for sub, where in subs:
        assert sub.case.outputs and set(sub.case.outputs) == set(sub.actual), where
        ref = live.expected(op, sub.case.inputs)
        for n, e in sub.case.outputs.items():
            assert ref[n].shape == e.shape and np.array_equal(ref[n].view(np.uint8), e.view(np.uint8)), (n, where)
        assert S.model_bytes(OPS[op], sub) <= S.SLICE_FROM


def test_an_op_whose_rows_share_a_denominator_is_not_sliced():
    """[loss.bwd.c1] every row of dlogits is scaled by 1/count over the whole
    call: fewer rows would change every row, so there is no slice."""
    case = _case("cross_entropy_backward", "N=33,V=40")
    assert S.slices(OPS[case.op], Result(case, "fail", actual=_perturbed(case))) == []


def _findings(op, shape):
    import diagnosis_kernels as K  # noqa: F401  (tests/ is on sys.path)
    from refreplay.conformance.running import adapters
    from refreplay.conformance.running import compare

    results = compare.run(adapters.resolve("diagnosis_kernels"), [_case(op, shape)], [])
    assert results[0].status == "fail", results[0].message
    return [f.message for f in diagnose(op, results)]


CAUSE = "reproduced exactly by the spec's algorithm with "

# op, a small shape, a shape whose models take over SLICE_FROM (128 MiB), the deviation named
DEVIANT = [
    ("linear_forward", "N=8,C=32,OC=16", "N=64,C=256,OC=512", "bias as the sum's first term"),
    ("linear_backward", "N=8,C=32,OC=16", "N=64,C=256,OC=256", "sums reversed"),
    ("layernorm_backward", "N=16,C=64", "N=1024,C=2048", "sums reversed"),
    ("rmsnorm_backward", "N=16,C=64", "N=1024,C=2048", "sums reversed"),
    ("cross_entropy_forward", "N=128,V=512", "N=128,V=50304", "loss as -log(e/s)"),
    ("attention_forward", "B=1,NH=2,T=16,HS=8", "B=1,NH=1,T=512,HS=64", "vendor exp (np.exp)"),
]


@pytest.mark.parametrize("op,small,large,named", DEVIANT)
def test_a_sliced_case_gets_the_small_cases_cause(op, small, large, named, monkeypatch):
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).parent))
    whole = _findings(op, small)
    cut = _findings(op, large)
    cause = [m.split(" (on the")[0] for m in whole if m.startswith(CAUSE)]
    assert cause and cause[0].startswith(CAUSE + named)
    assert [m.split(" (on the")[0] for m in cut if m.startswith(CAUSE)] == cause
    assert any(m.startswith(f"{SLICED}: {op}-live-00 at its") for m in cut)
    assert not any(m.startswith((SLICED, TOO_BIG)) for m in whole)
    assert not any(m.startswith(TOO_BIG) for m in cut)
