"""LayerNorm without a weight ([norm.layer.noaffine.c1]): PyTorch's
``elementwise_affine=False`` and ``F.layer_norm(x, shape)`` through
refreplay.torch give the spec's op with the weight 1 and the bias -0, bit for
bit; the -0 the clause's example keeps is kept; forward and gradients stay
close to PyTorch's own op; ``convert`` swaps such a module."""

import numpy as np
import pytest
import torch
from torch import nn

import refreplay.torch as rt
from refreplay.ops import norms

EPS = np.float32(1e-5)


def _bits(t):
    return np.ascontiguousarray(t.detach().numpy()).view(np.uint32)


def _x(n=6, c=37, seed=0):
    g = np.random.default_rng(seed)
    return g.standard_normal((n, c)).astype(np.float32) * np.float32(3) + np.float32(0.5)


@pytest.mark.parametrize("bias", [False, True])
def test_module_equals_the_op_with_weight_one(bias):
    x = _x()
    c = x.shape[1]
    m = rt.nn.LayerNorm(c, eps=EPS, elementwise_affine=False, bias=bias)
    assert m.weight is None and m.bias is None and not list(m.parameters())
    want, _, _ = norms.layernorm_forward(x, np.ones(c, np.float32), np.full(c, -0.0, np.float32), EPS)
    got = m(torch.from_numpy(x))
    assert (_bits(got) == want.view(np.uint32)).all()


def test_without_weight_but_with_bias_is_the_weight_one():
    x, c = _x(4, 9, 1), 9
    b = np.random.default_rng(2).standard_normal(c).astype(np.float32)
    want, _, _ = norms.layernorm_forward(x, np.ones(c, np.float32), b, EPS)
    got = rt.functional.layer_norm(torch.from_numpy(x), (c,), None, torch.from_numpy(b), EPS)
    assert (_bits(got) == want.view(np.uint32)).all()


def test_the_clause_keeps_minus_zero():
    """The example of [norm.layer.noaffine.c1]: the row (-0, +0) normalises to
    (-0, +0); a bias +0 would give (+0, +0)."""
    x = torch.tensor([[-0.0, 0.0]])
    got = rt.nn.LayerNorm(2, eps=np.float32(np.uint32(0x3727C5AC).view(np.float32)), elementwise_affine=False)(x)
    assert _bits(got).tolist() == [[0x80000000, 0x00000000]]
    plus, _, _ = norms.layernorm_forward(x.numpy(), np.ones(2, np.float32), np.zeros(2, np.float32), EPS)
    assert plus.view(np.uint32).tolist() == [[0, 0]]  # so the bias is -0, not +0


def test_backward_equals_the_op_and_has_no_weight_gradient():
    x = _x(5, 33, 3)
    c = x.shape[1]
    dout = np.random.default_rng(4).standard_normal(x.shape).astype(np.float32)
    w1 = np.ones(c, np.float32)
    _, mean, rstd = norms.layernorm_forward(x, w1, np.full(c, -0.0, np.float32), EPS)
    dx_want, _, _ = norms.layernorm_backward(dout, x, w1, mean, rstd)
    xt = torch.from_numpy(x.copy()).requires_grad_()
    rt.nn.LayerNorm(c, eps=EPS, elementwise_affine=False)(xt).backward(torch.from_numpy(dout))
    assert (_bits(xt.grad) == dx_want.view(np.uint32)).all()


def test_close_to_pytorch_forward_and_gradient():
    x = torch.from_numpy(_x(8, 64, 5)).double().float().requires_grad_()
    xr = x.detach().clone().requires_grad_()
    ours = rt.nn.LayerNorm(64, eps=EPS, elementwise_affine=False)(x)
    theirs = nn.functional.layer_norm(xr, (64,), eps=float(EPS))
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    g = torch.from_numpy(np.random.default_rng(6).standard_normal((8, 64)).astype(np.float32))
    ours.backward(g)
    theirs.backward(g)
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-4, atol=1e-5)


def test_gradcheck_in_float64_against_the_formula():
    """The float32 op against float64 autograd of the textbook formula."""
    x = _x(3, 16, 7)
    x64 = torch.from_numpy(x).double().requires_grad_()
    y64 = (x64 - x64.mean(-1, keepdim=True)) / torch.sqrt(x64.var(-1, unbiased=False, keepdim=True) + float(EPS))
    g = np.random.default_rng(8).standard_normal(x.shape)
    y64.backward(torch.from_numpy(g))
    xt = torch.from_numpy(x).requires_grad_()
    y = rt.nn.LayerNorm(16, eps=EPS, elementwise_affine=False)(xt)
    y.backward(torch.from_numpy(g.astype(np.float32)))
    np.testing.assert_allclose(y.detach().numpy(), y64.detach().numpy(), rtol=0, atol=2e-6)
    np.testing.assert_allclose(xt.grad.numpy(), x64.grad.numpy(), rtol=0, atol=2e-5)


def test_convert_swaps_a_torch_layernorm_without_affine():
    m = nn.Sequential(nn.LayerNorm(8, eps=float(EPS), elementwise_affine=False))
    rt.convert(m)
    assert isinstance(m[0], rt.nn.LayerNorm) and m[0].weight is None and m[0].bias is None
    x = torch.from_numpy(_x(2, 8, 9))
    want, _, _ = norms.layernorm_forward(x.numpy(), np.ones(8, np.float32), np.full(8, -0.0, np.float32), EPS)
    assert (_bits(m(x)) == want.view(np.uint32)).all()


def test_a_weight_of_ones_with_bias_plus_zero_is_not_the_same():
    """The clause is not "w = 1, b = +0": on the -0 row the two differ, so a
    kernel reading it that way is caught."""
    x = torch.tensor([[-0.0, 0.0]])
    ours = rt.nn.LayerNorm(2, eps=EPS, elementwise_affine=False)(x)
    other = rt.functional.layer_norm(x, (2,), torch.ones(2), torch.zeros(2), EPS)
    assert not np.array_equal(_bits(ours), _bits(other))
