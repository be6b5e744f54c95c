"""int8 quantization-aware linear layer (spec/16-quant.txt) against exact
oracles: Python integers and fractions for codes and int32 sums, float64
products (exact for two binary32 operands) for single roundings, PyTorch
autograd in float64 for the straight-through backward."""

from fractions import Fraction

import numpy as np
import pytest
import torch

from refreplay.ops import quant as Q

F = np.float32
FLT_MIN = 2.0**-126


def f32_round(value: float) -> np.float32:
    """Oracle: a float64 that holds an exact real, rounded once to binary32
    (NumPy's conversion rounds to nearest even), then flushed
    ([num.flush.c1])."""
    r = np.float32(value)
    if r != 0 and abs(float(r)) < FLT_MIN:
        return np.float32(np.copysign(0.0, float(r)))
    return r


def add_oracle(a, b) -> np.float32:
    """One rounded binary32 sum; asserts the float64 sum is exact first."""
    s = float(np.float32(a)) + float(np.float32(b))
    assert Fraction(s) == Fraction(float(np.float32(a))) + Fraction(float(np.float32(b)))
    return f32_round(s)


def mul_oracle(a, b) -> np.float32:
    """One rounded binary32 product: the float64 product of two binary32 values
    is exact (24 + 24 bits), so a single conversion rounds it correctly."""
    return f32_round(float(np.float32(a)) * float(np.float32(b)))


def recip_oracle(s) -> np.float32:
    """1/s correctly rounded: double rounding 1/s -> float64 -> float32 cannot
    land on a tie here because 1/s of a binary32 is never within 2^-53
    relative of a binary32 midpoint unless exact; checked against Fraction."""
    exact = Fraction(1) / Fraction(float(np.float32(s)))
    r = np.float32(float(exact))
    # confirm with the exact rational: r is the nearest binary32
    lo, hi = np.nextafter(r, F(-np.inf)), np.nextafter(r, F(np.inf))
    assert abs(Fraction(float(r)) - exact) <= min(abs(Fraction(float(lo)) - exact), abs(Fraction(float(hi)) - exact))
    return f32_round(r)


def step_oracle(values) -> np.float32:
    """[quant.step.c1] max|x| * recip(127), floor 2^-126 for a zero result."""
    a = max((abs(float(v)) for v in np.asarray(values, F).reshape(-1)), default=0.0)
    s = mul_oracle(a, recip_oracle(127))
    return np.float32(FLT_MIN) if s == 0 else s


def code_oracle(x, s) -> int:
    """[quant.quantize.c1] saturate(round-half-even(x * recip(s))) with exact
    rationals: Python's round() of a Fraction rounds half to even."""
    v = Fraction(float(mul_oracle(x, recip_oracle(s))))
    return max(-128, min(127, round(v)))


def bits(a):
    return np.asarray(a, F).view(np.uint32)


def test_recip_127_constant():
    """[quant.step.c1] RQ = recip(127) = f32(0x3C010204)."""
    assert bits(Q.RECIP_QMAX) == 0x3C010204 == bits(recip_oracle(127))


@pytest.mark.parametrize("scale", [1.0, 1e-3, 3e4, 1e-36, 1e-38, 0.0])
def test_step_size_follows_formula_bit_for_bit(scale):
    """[quant.step.c1] per tensor and per row, including the floor (all zero
    and subnormal-flushing maxima) and ties in |x| between signs."""
    rng = np.random.default_rng(int(scale * 1e3) % 1000 + 7)
    x = (rng.standard_normal((5, 37)) * scale).astype(F)
    x[2, 3] = -np.max(np.abs(x[2]))  # equal magnitudes of both signs
    assert bits(Q.step_size(x)) == bits(step_oracle(x))
    rows = Q.step_size_rows(x)
    assert rows.dtype == F and rows.shape == (5,)
    assert list(bits(rows)) == [int(bits(step_oracle(r))) for r in x]


def test_step_size_is_order_free_and_handles_nan_inf():
    """[quant.step.c1] fmax of |x| has the same bits in any order; NaN -> NaN,
    inf -> inf; -0 and +0 give the floor."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal(1000).astype(F)
    assert bits(Q.step_size(x)) == bits(Q.step_size(x[::-1].copy()))
    assert bits(Q.step_size(np.array([1, np.nan, 2], F))) == 0x7FC00000
    assert bits(Q.step_size(np.array([1, -np.inf], F))) == 0x7F800000
    assert bits(Q.step_size(np.array([-0.0, 0.0], F))) == 0x00800000


def test_quantize_dequantize_round_trip_matches_exact_oracle():
    """[quant.quantize.c1] [quant.dequantize.c1] random values and steps,
    exact ties (k + 1/2) * s with s a power of two, and saturation."""
    rng = np.random.default_rng(2)
    x = (rng.standard_normal(400) * 60).astype(F)
    s = F(rng.uniform(0.1, 1.0))
    ties = ((np.arange(-140, 140) + 0.5) * 0.25).astype(F)  # exact halves of s = 0.25
    for xs, step in ((x, s), (ties, F(0.25)), (x * F(9), s)):
        q = Q.quantize(xs, step)
        want = [code_oracle(v, step) for v in xs]
        assert q.dtype == np.int8 and q.tolist() == want
        back = Q.dequantize(q, step)
        assert list(bits(back)) == [int(bits(mul_oracle(c, step))) for c in want]
        assert list(bits(Q.fake_quantize(xs, step))) == list(bits(back))
    q = Q.quantize(ties, F(0.25))
    halves = np.arange(-140, 140) + 0.5
    even = [max(-128, min(127, round(Fraction(h)))) for h in halves]
    assert q.tolist() == even
    assert q.min() == -128 and q.max() == 127  # saturation reached both ends


def test_per_row_steps():
    """[quant.quantize.c1] s [R] quantizes row r with s[r]; recip once per row."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((6, 11)).astype(F)
    s = Q.step_size_rows(w)
    q = Q.quantize(w, s)
    assert q.tolist() == [[code_oracle(v, s[r]) for v in w[r]] for r in range(6)]
    assert np.abs(q).max(axis=1).tolist() == [127] * 6  # the max maps to +-127


def qlinear_oracle(x, w, b):
    """[quant.linear.fwd.c1] exact int32 sums in Python integers, then the
    stated roundings one at a time."""
    B, T, C = x.shape
    OC = w.shape[0]
    sx = [step_oracle(x[bb]) for bb in range(B)]
    sw = [step_oracle(w[o]) for o in range(OC)]
    qx = [[[code_oracle(v, sx[bb]) for v in x[bb, t]] for t in range(T)] for bb in range(B)]
    qw = [[code_oracle(v, sw[o]) for v in w[o]] for o in range(OC)]
    y = np.empty((B, T, OC), F)
    accs = []
    for bb in range(B):
        for t in range(T):
            for o in range(OC):
                acc = sum(a * c for a, c in zip(qx[bb][t], qw[o]))  # Python int
                assert -(2**31) <= acc < 2**31
                accs.append(acc)
                v = mul_oracle(np.float32(acc), mul_oracle(sx[bb], sw[o]))  # f32(acc) is RNE
                y[bb, t, o] = v if b is None else add_oracle(v, b[o])
    return y, accs


@pytest.mark.parametrize("C", [7, 1200])
def test_qlinear_forward_matches_integer_oracle(C):
    """[quant.linear.fwd.c1] [mm.i8.c1] C = 1200 makes |acc| exceed 2^24 so the
    int32 -> binary32 conversion rounds (to nearest even)."""
    rng = np.random.default_rng(C)
    B, T, OC = 2, 2, 3
    x = rng.standard_normal((B, T, C)).astype(F)
    w = rng.standard_normal((OC, C)).astype(F)
    if C > 1040:
        x = rng.uniform(0.99, 1.0, (B, T, C)).astype(F)  # codes near 127: a large sum
        w = rng.uniform(0.99, 1.0, (OC, C)).astype(F)
    b = rng.standard_normal(OC).astype(F)
    want, accs = qlinear_oracle(x, w, b)
    got = Q.qlinear_forward(x, w, b)
    assert got.tobytes() == want.tobytes()
    if C > 1040:
        assert max(abs(a) for a in accs) > 2**24
        assert any(float(np.float32(a)) != a for a in accs)  # conversion rounded
    nob, _ = qlinear_oracle(x, w, None)
    assert Q.qlinear_forward(x, w).tobytes() == nob.tobytes()


def test_qlinear_forward_close_to_float64():
    """[quant.linear.fwd.c1] the quantized product is within the int8 error of
    the float64 product (bound: |dx| <= s/2 per element)."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 4, 32)).astype(F)
    w = rng.standard_normal((8, 32)).astype(F)
    y = Q.qlinear_forward(x, w)
    ref = x.astype(np.float64) @ w.T.astype(np.float64)
    sx = np.abs(x).reshape(2, -1).max(1) / 127
    sw = np.abs(w).max(1) / 127
    bound = 32 * (
        sx[:, None, None] / 2 * np.abs(w).max()
        + sw[None, None, :] / 2 * np.abs(x).max()
        + sx[:, None, None] * sw[None, None, :] / 4
    )
    assert np.all(np.abs(y - ref) <= bound)
    assert np.max(np.abs(y - ref)) > 0  # it is quantized


def torch_ste_grads(dy, x, w):
    """PyTorch autograd in float64 of y = fq(x) . fq(w)^T + b with the
    straight-through estimator; fq uses refreplay's codes and steps."""
    B, T, C = x.shape
    sx = Q.step_size_rows(x.reshape(B, -1))
    sw = Q.step_size_rows(w)
    xd = Q.dequantize(Q.quantize(x.reshape(B, -1), sx), sx).reshape(x.shape)
    wd = Q.dequantize(Q.quantize(w, sw), sw)
    xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    wt = torch.tensor(w, dtype=torch.float64, requires_grad=True)
    bt = torch.zeros(w.shape[0], dtype=torch.float64, requires_grad=True)
    xq = xt + (torch.tensor(xd, dtype=torch.float64) - xt).detach()
    wq = wt + (torch.tensor(wd, dtype=torch.float64) - wt).detach()
    y = xq @ wq.T + bt
    y.backward(torch.tensor(dy, dtype=torch.float64))
    return xt.grad.numpy(), wt.grad.numpy(), bt.grad.numpy()


def test_qlinear_backward_matches_torch_autograd():
    """[quant.linear.bwd.c1] [quant.ste.c1] relative error <= 1e-4 against
    float64 autograd through the STE (no code saturates with re-pinned
    steps, so the STE passes everywhere).  Finite differences do not apply:
    fake quantization is piecewise constant, and the STE is by definition
    not its derivative."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 3, 16)).astype(F)
    w = rng.standard_normal((5, 16)).astype(F)
    dy = rng.standard_normal((2, 3, 5)).astype(F)
    dx, dw, db = Q.qlinear_backward(dy, x, w)
    tx, tw, tb = torch_ste_grads(dy, x, w)
    for got, ref in ((dx, tx), (dw, tw), (db, tb)):
        assert np.max(np.abs(got - ref)) <= 1e-4 * np.max(np.abs(ref))
    assert Q.qlinear_backward(dy, x, w, has_bias=False)[2] is None


def test_qlinear_backward_bits_match_sequential_oracle():
    """[quant.linear.bwd.c1] dx sums over o increasing, dw over n increasing,
    each product and sum rounded once (scalar float32 loop)."""
    rng = np.random.default_rng(7)
    B, T, C, OC = 2, 2, 3, 4
    x = rng.standard_normal((B, T, C)).astype(F)
    w = rng.standard_normal((OC, C)).astype(F)
    dy = rng.standard_normal((B, T, OC)).astype(F)
    sx = [step_oracle(x[b]) for b in range(B)]
    sw = [step_oracle(w[o]) for o in range(OC)]
    xd = np.array(
        [[[mul_oracle(code_oracle(v, sx[b]), sx[b]) for v in x[b, t]] for t in range(T)] for b in range(B)], F
    ).reshape(B * T, C)
    wd = np.array([[mul_oracle(code_oracle(v, sw[o]), sw[o]) for v in w[o]] for o in range(OC)], F)
    d2 = dy.reshape(B * T, OC)
    dx = np.empty((B * T, C), F)
    dw = np.empty((OC, C), F)
    for n in range(B * T):
        for c in range(C):
            s = F(-0.0)
            for o in range(OC):
                s = add_oracle(s, mul_oracle(d2[n, o], wd[o, c]))
            dx[n, c] = s
    for o in range(OC):
        for c in range(C):
            s = F(-0.0)
            for n in range(B * T):
                s = add_oracle(s, mul_oracle(d2[n, o], xd[n, c]))
            dw[o, c] = s
    gx, gw, gb = Q.qlinear_backward(dy, x, w)
    assert gx.tobytes() == dx.reshape(B, T, C).tobytes()
    assert gw.tobytes() == dw.tobytes()


def test_fake_quantize_backward_masks_only_saturated_codes():
    """[quant.ste.c1] with an explicit step: codes -128..127 pass dy unchanged
    (boundaries included, 127.5 rounds to 128 and is blocked), others get +0."""
    x = np.array([127.0, 127.49, 127.5, -128.0, -128.5, -128.51, 300, np.nan, -0.0], F)
    dy = np.array([-3.0, 2.0, 5.0, 7.0, 1.5, 9.0, 4.0, 6.0, -1.0], F)
    dx = Q.fake_quantize_backward(dy, x, F(1.0))
    want = np.array([-3.0, 2.0, 0.0, 7.0, 1.5, 0.0, 0.0, 0.0, -1.0], F)
    assert dx.tobytes() == want.tobytes()


def test_zero_gradient_stays_exactly_zero():
    """[quant.zerograd.c1] dy = 0 gives zeros (sign per the sums) everywhere,
    and zero rows of dy contribute nothing to dw and db."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((3, 4, 8)).astype(F)
    w = rng.standard_normal((5, 8)).astype(F)
    dx, dw, db = Q.qlinear_backward(np.zeros((3, 4, 5), F), x, w)
    assert not dx.any() and not dw.any() and not db.any()
    dy = rng.standard_normal((3, 4, 5)).astype(F)
    dy[1] = 0.0  # sequence 1 sends no gradient
    _, dw_all, db_all = Q.qlinear_backward(dy, x, w)
    _, dw_02, db_02 = Q.qlinear_backward(np.ascontiguousarray(dy[[0, 2]]), np.ascontiguousarray(x[[0, 2]]), w)
    assert dw_all.tobytes() == dw_02.tobytes() and db_all.tobytes() == db_02.tobytes()


def test_qlinear_is_batch_invariant():
    """[quant.granularity.c1] one step per sequence: a sequence's y and dx are
    bitwise unchanged when other sequences (with larger values) join."""
    rng = np.random.default_rng(9)
    x1 = rng.standard_normal((1, 5, 16)).astype(F)
    others = (rng.standard_normal((3, 5, 16)) * 10).astype(F)
    w = rng.standard_normal((6, 16)).astype(F)
    dy1 = rng.standard_normal((1, 5, 6)).astype(F)
    xb = np.concatenate([others[:2], x1, others[2:]])
    dyb = np.concatenate([rng.standard_normal((2, 5, 6)).astype(F), dy1, rng.standard_normal((1, 5, 6)).astype(F)])
    assert Q.qlinear_forward(x1, w)[0].tobytes() == Q.qlinear_forward(xb, w)[2].tobytes()
    assert Q.qlinear_backward(dy1, x1, w)[0][0].tobytes() == Q.qlinear_backward(dyb, xb, w)[0][2].tobytes()


def test_input_validation():
    """Bad dtypes, shapes and oversize C raise clear errors ([mm.i8.c2])."""
    x = np.ones((1, 2, 3), F)
    w = np.ones((4, 3), F)
    with pytest.raises(TypeError):
        Q.qlinear_forward(x.astype(np.float64), w)
    with pytest.raises(ValueError):
        Q.qlinear_forward(x, np.ones((4, 2), F))
    with pytest.raises(ValueError):
        Q.qlinear_forward(np.ones((1, 1, Q.MAX_K + 1), F), np.ones((1, Q.MAX_K + 1), F))
    with pytest.raises(ValueError):
        Q.quantize(np.ones((3, 2), F), np.ones(2, F))
    with pytest.raises(TypeError):
        Q.dequantize(np.ones(3, np.int32), F(1))


def test_quantize_random_bit_patterns_match_vectorised_oracle():
    """[quant.quantize.c1] 2^20 random binary32 patterns (NaN, inf, huge and
    tiny values included, loaded per [num.load.c1]) against a NumPy oracle:
    exact float64 product rounded once to binary32 and flushed, np.rint
    (ties to even), clip, NaN -> 0."""
    from refreplay.numerics import load

    rng = np.random.default_rng(13)
    x = load(rng.integers(0, 2**32, 2**20, dtype=np.uint64).astype(np.uint32).view(F))
    for step in (F(1.0), F(0.0078125), F(3.7), F(1e-30)):
        r = recip_oracle(step)
        with np.errstate(all="ignore"):
            v = (x.astype(np.float64) * np.float64(r)).astype(F)
            v = np.where(np.abs(v) < F(FLT_MIN), v * F(0), v)
            want = np.where(np.isnan(v), 0, np.clip(np.rint(v), -128, 127)).astype(np.int8)
        got = Q.quantize(x, step)
        assert np.array_equal(got, want)
        assert (got == 127).any() and (got == -128).any() and (got == 0).any()
