"""refreplay.torch.functional.scaled_dot_product_attention(is_causal=True):
the reference's causal attention bit for bit, forward and backward, and
within tolerance of PyTorch's own op; every uncovered argument refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as TF

from refreplay.ops import attention as A
from refreplay.torch import Unsupported
from refreplay.torch import functional as F


def _qkv(seed, B=2, NH=2, T=7, HS=8):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, NH, T, HS, generator=g).requires_grad_() for _ in range(3)]


@pytest.mark.parametrize("seed", [0, 1])
def test_sdpa_is_the_reference_bit_for_bit_and_near_pytorch(seed):
    q, k, v = _qkv(seed)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=True)
    ref, att = A.attention_forward(q.detach().numpy(), k.detach().numpy(), v.detach().numpy())
    assert np.array_equal(out.detach().numpy().view(np.uint32), ref.view(np.uint32))
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 7))
    out.backward(g)
    dq, dk, dv = A.attention_backward(g.numpy(), q.detach().numpy(), k.detach().numpy(), v.detach().numpy(), att)
    for got, want in ((q.grad, dq), (k.grad, dk), (v.grad, dv)):
        assert np.array_equal(got.numpy().view(np.uint32), want.view(np.uint32))
    q2, k2, v2 = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    theirs = TF.scaled_dot_product_attention(q2, k2, v2, is_causal=True)
    theirs.backward(g)
    assert torch.allclose(out, theirs, rtol=1e-5, atol=1e-6)
    for a, b in ((q.grad, q2.grad), (k.grad, k2.grad), (v.grad, v2.grad)):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "kw",
    [
        dict(is_causal=False),
        dict(is_causal=True, dropout_p=0.1),
        dict(is_causal=True, scale=0.5),
        dict(is_causal=True, enable_gqa=True),
    ],
)
def test_sdpa_refuses_what_the_spec_does_not_cover(kw):
    q, k, v = _qkv(0)
    with pytest.raises(Unsupported, match="scaled_dot_product_attention"):
        F.scaled_dot_product_attention(q, k, v, **kw)
