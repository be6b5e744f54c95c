"""refreplay.torch.functional: every function's forward and backward equal
the reference ops bit for bit (random and edge inputs, CPU), agree with
PyTorch's own float64 autograd within tolerance (an independent sanity
check), and refuse what the spec does not cover instead of computing it
with a PyTorch kernel.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as TF
from hypothesis import given, settings
from hypothesis import strategies as st

from refreplay.numerics import elementwise as EW
from refreplay.ops import activations as A
from refreplay.ops import attention as AT
from refreplay.ops import embedding as E
from refreplay.ops import linear as L
from refreplay.ops import loss as LO
from refreplay.ops import norms as N
from refreplay.ops import quant as Q
from refreplay.ops import rope as R
from refreplay.ops import softmax as S
from refreplay.torch import Unsupported, load_
from refreplay.torch import _bridge
from refreplay.torch import functional as rF
from torch_oracle import autograd, rel_err

ROOT = Path(__file__).resolve().parents[1]
EPS = rF.EPS
FLT_MIN = np.float32(2.0**-126)
# Values that exercise signs of zero, the smallest normal, saturation and
# specials; "wild" ones (inf, NaN, near-overflow) only where every element
# is independent or a row op handles them by clause.
TAME = [0.0, -0.0, FLT_MIN, -FLT_MIN, 1e4, -1e4, 30.0, -30.0]
WILD = TAME + [3e38, -3e38, np.inf, -np.inf, np.nan]


def bits(a) -> np.ndarray:
    if isinstance(a, torch.Tensor):
        a = a.detach().numpy()
    return np.ascontiguousarray(np.asarray(a, dtype=np.float32)).view(np.uint32)


def same_bits(got, want) -> bool:
    return got.shape == np.shape(want) and np.array_equal(bits(got), bits(want))


def rand(rng, shape, scale=1.0, edge=None):
    a = (rng.standard_normal(shape) * scale).astype(np.float32)
    if edge:
        flat = a.reshape(-1)
        pos = rng.choice(flat.size, size=min(len(edge), flat.size), replace=False)
        flat[pos] = np.array(edge[: len(pos)], np.float32)
    return a


def _ln_ref(x, w, b):
    return N.layernorm_forward(x.reshape(-1, x.shape[-1]), w, b, EPS)


def _rms_ref(x, w):
    return N.rmsnorm_forward(x.reshape(-1, x.shape[-1]), w, EPS)


def _rope_tables():
    return R.rope_tables(6, 8)


def _rope64(x, cos, sin):
    H2 = x.shape[-1] // 2
    c = torch.tensor(cos, dtype=torch.float64)
    s = torch.tensor(sin, dtype=torch.float64)
    x1, x2 = x[..., :H2], x[..., H2:]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def _rms64(x, w):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + float(EPS)) * w


TOKENS = np.array([[3, 1, 3, 0, 10], [1, 1, 7, 3, 2]], np.int64)  # repeats: ordered scatter-add
TARGETS = np.array([2, 0, -1, 6, 6, 1], np.int64)  # one ignored token

# name -> (make(rng, edge) -> inputs (float32 arrays; differentiable first n_diff),
#          n_diff, ours(*tensors), ref_fwd(*arrays), ref_bwd(dout, *arrays) -> grads,
#          torch64(*float64 tensors) or None, tolerance of the float64 check, edge values)
CASES = {
    "linear": (
        lambda rng, e: [rand(rng, (2, 3, 8), 1, e), rand(rng, (5, 8), 0.5), rand(rng, (5,))],
        3,
        rF.linear,
        lambda x, W, b: L.linear_forward(x.reshape(-1, 8), W, b).reshape(2, 3, 5),
        lambda d, x, W, b: (lambda r: (r[0].reshape(x.shape), r[1], r[2]))(
            L.linear_backward(d.reshape(-1, 5), x.reshape(-1, 8), W, True)
        ),
        TF.linear,
        1e-5,
        TAME,
    ),
    "linear_no_bias": (
        lambda rng, e: [rand(rng, (6, 8), 1, e), rand(rng, (5, 8), 0.5)],
        2,
        rF.linear,
        L.linear_forward,
        lambda d, x, W: L.linear_backward(d, x, W, False)[:2],
        TF.linear,
        1e-5,
        TAME,
    ),
    "qlinear": (
        lambda rng, e: [rand(rng, (2, 4, 8), 1, e), rand(rng, (5, 8), 0.5), rand(rng, (5,))],
        3,
        rF.qlinear,
        Q.qlinear_forward,
        lambda d, x, W, b: Q.qlinear_backward(d, x, W, True),
        TF.linear,
        0.05,
        TAME[:4],
    ),  # int8 rounding: a loose sanity bound
    "layer_norm": (
        lambda rng, e: [rand(rng, (2, 3, 16), 2, e), rand(rng, (16,)), rand(rng, (16,))],
        3,
        lambda x, w, b: rF.layer_norm(x, (16,), w, b),
        lambda x, w, b: _ln_ref(x, w, b)[0].reshape(x.shape),
        lambda d, x, w, b: (lambda r: (r[0].reshape(x.shape), r[1], r[2]))(
            N.layernorm_backward(d.reshape(-1, 16), x.reshape(-1, 16), w, *_ln_ref(x, w, b)[1:])
        ),
        lambda x, w, b: TF.layer_norm(x, (16,), w, b, float(EPS)),
        1e-4,
        TAME,
    ),
    "rms_norm": (
        lambda rng, e: [rand(rng, (2, 3, 16), 2, e), rand(rng, (16,))],
        2,
        lambda x, w: rF.rms_norm(x, (16,), w),
        lambda x, w: _rms_ref(x, w)[0].reshape(x.shape),
        lambda d, x, w: (lambda r: (r[0].reshape(x.shape), r[1]))(
            N.rmsnorm_backward(d.reshape(-1, 16), x.reshape(-1, 16), w, _rms_ref(x, w)[1])
        ),
        _rms64,
        1e-4,
        TAME,
    ),
    "embedding": (
        lambda rng, e: [rand(rng, (11, 8), 1, e)],
        1,
        lambda w: rF.embedding(torch.from_numpy(TOKENS), w),
        lambda w: E.embedding_forward(w, TOKENS.astype(np.int32)),
        lambda d, w: (E.embedding_backward(d, TOKENS.astype(np.int32), 11),),
        lambda w: TF.embedding(torch.from_numpy(TOKENS), w),
        1e-6,
        TAME,
    ),
    "gelu": (
        lambda rng, e: [rand(rng, (3, 50), 3, e)],
        1,
        rF.gelu,
        A.gelu_forward,
        lambda d, x: (A.gelu_backward(d, x),),
        lambda x: TF.gelu(x, approximate="tanh"),
        1e-4,
        WILD,
    ),
    "silu": (
        lambda rng, e: [rand(rng, (3, 50), 3, e)],
        1,
        rF.silu,
        A.silu_forward,
        lambda d, x: (A.silu_backward(d, x),),
        TF.silu,
        1e-4,
        WILD,
    ),
    "swiglu": (
        lambda rng, e: [rand(rng, (3, 50), 3, e), rand(rng, (3, 50), 1, e)],
        2,
        rF.swiglu,
        A.swiglu_forward,
        A.swiglu_backward,
        lambda a, b: TF.silu(a) * b,
        1e-4,
        WILD,
    ),
    "rope": (
        lambda rng, e: [rand(rng, (2, 2, 6, 8), 1, e)],
        1,
        lambda x: rF.rope(x, *(torch.from_numpy(t) for t in _rope_tables())),
        lambda x: R.rope_forward(x, *_rope_tables()),
        lambda d, x: (R.rope_backward(d, *_rope_tables()),),
        lambda x: _rope64(x, *_rope_tables()),
        1e-5,
        TAME,
    ),
    "causal_attention": (
        lambda rng, e: [rand(rng, (2, 2, 5, 4), 1, e), rand(rng, (2, 2, 5, 4)), rand(rng, (2, 2, 5, 4))],
        3,
        rF.causal_attention,
        lambda q, k, v: AT.attention_forward(q, k, v)[0],
        lambda d, q, k, v: AT.attention_backward(d, q, k, v, AT.attention_forward(q, k, v)[1]),
        lambda q, k, v: TF.scaled_dot_product_attention(q, k, v, is_causal=True),
        1e-4,
        TAME[:4],
    ),
    "softmax": (
        lambda rng, e: [rand(rng, (4, 9), 2, e)],
        1,
        rF.softmax,
        S.softmax_forward,
        lambda d, x: (S.softmax_backward(d, S.softmax_forward(x)),),
        lambda x: torch.softmax(x, -1),
        1e-4,
        WILD,
    ),
    "log_softmax": (
        lambda rng, e: [rand(rng, (4, 9), 2, e)],
        1,
        rF.log_softmax,
        S.log_softmax_forward,
        lambda d, x: (S.log_softmax_backward(d, S.log_softmax_forward(x)),),
        lambda x: torch.log_softmax(x, -1),
        1e-4,
        WILD,
    ),
    "cross_entropy": (
        lambda rng, e: [rand(rng, (6, 7), 2, e)],
        1,
        lambda z: rF.cross_entropy(z, torch.from_numpy(TARGETS)),
        lambda z: np.float32(LO.cross_entropy_forward(z, TARGETS.astype(np.int32))[1]),
        lambda d, z: (LO.cross_entropy_backward(z, TARGETS.astype(np.int32), dloss=np.float32(d)),),
        lambda z: TF.cross_entropy(z, torch.from_numpy(TARGETS), ignore_index=-1),
        1e-4,
        TAME,
    ),
    "add": (
        lambda rng, e: [rand(rng, (3, 7), 1, e), rand(rng, (3, 7), 1, e)],
        2,
        rF.add,
        EW.add,
        lambda d, a, b: (d, d),
        lambda a, b: a + b,
        1e-6,
        WILD,
    ),
}


def _run_ours(name, inputs, dout):
    make, n_diff, ours, *_ = CASES[name]
    ts = [torch.from_numpy(a.copy()).requires_grad_(i < n_diff) for i, a in enumerate(inputs)]
    out = ours(*ts)
    out.backward(torch.from_numpy(np.asarray(dout, np.float32).copy()))
    return out, [t.grad for t in ts[:n_diff]]


@pytest.mark.parametrize("edge", [False, True], ids=["random", "edge"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_and_backward_equal_the_reference_bit_for_bit(name, edge):
    """Each function's forward and backward are the reference op's bits
    ([linear.fwd.c1] [linear.bwd.c1] [quant.linear.fwd.c1] [quant.linear.bwd.c1]
    [norm.layer.fwd.c1] [norm.layer.bwd.c1] [norm.rms.fwd.c1] [norm.rms.bwd.c1]
    [emb.fwd.c1] [emb.bwd.c1] [act.gelu.fwd.c1] [act.gelu.bwd.c1] [act.silu.fwd.c1]
    [act.silu.bwd.c1] [act.swiglu.fwd.c1] [act.swiglu.bwd.c1] [rope.fwd.c1] [rope.bwd.c1]
    [attn.out.c1] [attn.bwd.c1] [softmax.fwd.c1] [softmax.bwd.c1] [softmax.log.c1]
    [softmax.log.bwd.c1] [loss.mean.c1] [loss.bwd.c1] [model.residual.c1])."""
    make, n_diff, ours, ref_fwd, ref_bwd, _, _, edges = CASES[name]
    rng = np.random.default_rng([sum(map(ord, name)), edge])
    inputs = make(rng, edges if edge else None)
    want = np.asarray(ref_fwd(*inputs), np.float32)
    dout = rand(rng, want.shape, 1, [0.0, -0.0, FLT_MIN] if edge and want.size > 3 else None)
    out, grads = _run_ours(name, inputs, dout)
    assert out.dtype == torch.float32
    assert same_bits(out, want), name
    want_grads = ref_bwd(dout, *inputs)
    assert len(grads) == n_diff == len(want_grads)
    for k, (g, w) in enumerate(zip(grads, want_grads)):
        assert same_bits(g, w), f"{name}: gradient of input {k}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradients_agree_with_pytorch_float64(name):
    """Sanity, independent of the reference: the same math in float64 with
    PyTorch's autograd is within the case's normwise tolerance."""
    make, n_diff, ours, _, _, torch64, tol, _ = CASES[name]
    rng = np.random.default_rng(sum(map(ord, name)) + 7)
    inputs = make(rng, None)
    diff, rest = inputs[:n_diff], inputs[n_diff:]
    out64 = torch64(*[torch.tensor(a, dtype=torch.float64) for a in inputs])
    dout = rand(rng, tuple(out64.shape))
    want_out, want_grads = autograd(
        lambda *t: torch64(*t, *[torch.tensor(a, dtype=torch.float64) for a in rest]), diff, dout
    )
    out, grads = _run_ours(name, inputs, dout)
    assert rel_err(out.detach().numpy(), want_out) <= tol, name
    for k, (g, w) in enumerate(zip(grads, want_grads)):
        assert rel_err(g.numpy(), w) <= tol, f"{name}: gradient {k}, error {rel_err(g.numpy(), w):.2e}"


def test_a_wrong_gradient_fails_the_bit_check():
    """The bit check can fail: one ulp off in one gradient element is seen."""
    x = rand(np.random.default_rng(1), (3, 50), 3)
    d = rand(np.random.default_rng(2), (3, 50))
    _, (g,) = _run_ours("gelu", [x], d)
    want = A.gelu_backward(d, x)
    assert same_bits(g, want)
    want.reshape(-1)[17] = np.nextafter(want.reshape(-1)[17], np.float32(np.inf))
    assert not same_bits(g, want)


# ---- fork: the spec's gradient sum, not autograd's ------------------------------------


def test_fork_sums_gradients_with_the_spec_add_first_use_on_the_left():
    """[model.residual.c1] fork's backward is add(g_first, g_second): bits of
    the reference's add, including the flush that PyTorch's own sum lacks."""
    rng = np.random.default_rng(5)
    x = torch.from_numpy(rand(rng, (4, 6))).requires_grad_()
    a, b = rF.fork(x)
    out = rF.add(rF.gelu(a), rF.silu(b))
    d = rand(rng, (4, 6))
    out.backward(torch.from_numpy(d))
    xn = x.detach().numpy()
    want = EW.add(A.gelu_backward(d, xn), A.silu_backward(d, xn))
    assert same_bits(x.grad, want)
    # two gradients whose exact sum is subnormal: the spec flushes it to +0,
    # PyTorch's autograd sum (what a tensor used twice would get) keeps it
    g0 = torch.tensor([1.5 * 2.0**-126], dtype=torch.float32)
    g1 = torch.tensor([-(2.0**-126)], dtype=torch.float32)
    y = torch.zeros(1, requires_grad=True)
    torch.autograd.backward(list(rF.fork(y)), [g0, g1])
    assert bits(y.grad)[0] == 0x00000000
    assert bits(g0 + g1)[0] != 0  # what PyTorch's add gives: a subnormal


# ---- zero copy and the CPU layout -----------------------------------------------------


def test_contiguous_cpu_tensors_cross_without_a_copy_others_are_copied_exactly():
    rng = np.random.default_rng(9)
    x = torch.from_numpy(rand(rng, (16, 8)))
    before = _bridge.COPIES["in"]
    assert np.shares_memory(_bridge.to_numpy("x", x), x.numpy())
    y = rF.gelu(x)
    assert _bridge.COPIES["in"] == before
    xt = x.t()  # a non-contiguous view: copied once, exactly
    yt = rF.gelu(xt)
    assert _bridge.COPIES["in"] == before + 1
    assert same_bits(yt, A.gelu_forward(np.ascontiguousarray(x.numpy().T)))
    assert same_bits(y, A.gelu_forward(x.numpy()))


# ---- fail closed --------------------------------------------------------------------------


def _x(shape=(2, 4), dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0)).to(dtype)


def _no_pytorch_kernels(monkeypatch):
    """Make every PyTorch kernel these functions could fall back to raise,
    so a refusal cannot hide a silent fallback."""
    for fn in (
        "linear",
        "layer_norm",
        "rms_norm",
        "embedding",
        "gelu",
        "silu",
        "softmax",
        "log_softmax",
        "cross_entropy",
        "scaled_dot_product_attention",
    ):
        monkeypatch.setattr(TF, fn, lambda *a, **k: (_ for _ in ()).throw(AssertionError("fell back")))


REFUSED = {
    "float64 input": lambda: rF.gelu(_x(dtype=torch.float64)),
    "float16 input": lambda: rF.silu(_x(dtype=torch.float16)),
    "bfloat16 weight": lambda: rF.linear(_x(), _x((3, 4), torch.bfloat16)),
    "meta device": lambda: rF.gelu(torch.empty(3, device="meta")),
    "mixed devices": lambda: rF.add(_x(), torch.empty(2, 4, device="meta")),
    "sparse layout": lambda: rF.gelu(_x().to_sparse()),
    "integer input": lambda: rF.softmax(torch.arange(6).reshape(2, 3)),
    "erf GELU": lambda: rF.gelu(_x(), approximate="none"),
    "inplace SiLU": lambda: rF.silu(_x(), inplace=True),
    "softmax over dim 0": lambda: rF.softmax(_x(), dim=0),
    "softmax with dtype": lambda: rF.log_softmax(_x(), dtype=torch.float64),
    "sum reduction": lambda: rF.cross_entropy(_x(), torch.tensor([0, 1]), reduction="sum"),
    "label smoothing": lambda: rF.cross_entropy(_x(), torch.tensor([0, 1]), label_smoothing=0.1),
    "torch's ignore index": lambda: rF.cross_entropy(_x(), torch.tensor([0, 1]), ignore_index=-100),
    "class weights": lambda: rF.cross_entropy(_x(), torch.tensor([0, 1]), weight=torch.ones(4)),
    "probability targets": lambda: rF.cross_entropy(_x(), torch.softmax(_x(), -1)),
    "non-causal attention": lambda: rF.scaled_dot_product_attention(
        _x((1, 1, 3, 4)), _x((1, 1, 3, 4)), _x((1, 1, 3, 4)), is_causal=False
    ),
    "attention mask": lambda: rF.scaled_dot_product_attention(
        *[_x((1, 1, 3, 4))] * 3, is_causal=True, attn_mask=torch.ones(3, 3, dtype=torch.bool)
    ),
    "dropout": lambda: rF.scaled_dot_product_attention(*[_x((1, 1, 3, 4))] * 3, is_causal=True, dropout_p=0.1),
    "custom scale": lambda: rF.scaled_dot_product_attention(*[_x((1, 1, 3, 4))] * 3, is_causal=True, scale=0.5),
    "eps not a binary32": lambda: rF.layer_norm(_x(), (4,), torch.ones(4), torch.zeros(4), eps=1e-5),
    "norm over two axes": lambda: rF.rms_norm(_x(), (2, 4), torch.ones(2, 4)),
    "padding_idx": lambda: rF.embedding(torch.tensor([1]), _x(), padding_idx=0),
    "sparse embedding": lambda: rF.embedding(torch.tensor([1]), _x(), sparse=True),
    "broadcasting add": lambda: rF.add(_x(), _x((1, 4))),
    "2-D int8 linear": lambda: rF.qlinear(_x(), _x((3, 4))),
    "subnormal input": lambda: rF.gelu(torch.tensor([1.0, 1e-40])),
    "non-canonical NaN": lambda: rF.gelu(torch.from_numpy(np.array([0xFFC00000], np.uint32).view(np.float32))),
}


@pytest.mark.parametrize("what", sorted(REFUSED))
def test_unsupported_inputs_raise_and_never_fall_back(what, monkeypatch):
    _no_pytorch_kernels(monkeypatch)
    with pytest.raises(Unsupported):
        REFUSED[what]()


def test_a_cuda_tensor_without_a_usable_twin_is_refused(monkeypatch):
    """Where the CUDA twin cannot run (no GPU, no numba-cuda), a CUDA tensor
    is refused with the reason, never computed by PyTorch on the GPU."""
    from refreplay.training import backend as backends

    class FakeCuda:
        device = torch.device("cuda")

    def no_twin(device=None):
        raise backends.InputError("--device cuda: no usable CUDA GPU")

    monkeypatch.setattr(backends, "get", no_twin)
    with pytest.raises(Unsupported, match="cuda.*no usable CUDA GPU"):
        _bridge.backend_of(FakeCuda())


def test_double_backward_is_refused():
    x = _x().requires_grad_()
    y = rF.gelu(x)
    dy = torch.ones_like(y).requires_grad_()
    (g,) = torch.autograd.grad(y, x, dy, create_graph=True)
    assert g.grad_fn is not None
    with pytest.raises(RuntimeError, match="once_differentiable"):
        g.backward(torch.ones_like(g))


def test_load_flushes_subnormals_and_canonicalises_nans_in_place():
    """[num.load.c1] load_ is how a tensor from outside enters the ops."""
    t = torch.from_numpy(np.array([0x00000001, 0x807FFFFF, 0x7F800001, 0x3F800000], np.uint32).view(np.float32))
    assert load_(t) is t
    assert list(bits(t)) == [0x00000000, 0x80000000, 0x7FC00000, 0x3F800000]
    assert same_bits(rF.gelu(t), A.gelu_forward(t.numpy()))


# ---- torch stays optional ---------------------------------------------------------------


def _py(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_import_refreplay_never_imports_torch():
    r = _py(
        "import sys, refreplay, refreplay.training.step, refreplay.cli, refreplay.ops, "
        "refreplay.training.treefold\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\nprint('ok')"
    )
    assert r.returncode == 0 and "ok" in r.stdout, r.stderr


def test_refreplay_torch_without_torch_says_how_to_install():
    r = _py("import sys\nsys.modules['torch'] = None\nimport refreplay.torch")
    assert r.returncode != 0
    assert "refreplay[torch]" in r.stderr and "Traceback" in r.stderr


def test_the_subpackage_does_not_shadow_torch():
    """Inside refreplay.torch, ``import torch`` is the real PyTorch."""
    import refreplay.torch.functional as mod

    assert mod.torch is torch and hasattr(mod.torch, "autograd")


def test_inside_torch_compile_the_functions_run_eagerly_with_the_reference_bits():
    """Dynamo traces NumPy code into PyTorch kernels; the functions are
    excluded from tracing (graph breaks), so a compiled model still gets the
    reference's forward and backward bits."""
    rng = np.random.default_rng(12)
    xn, wn = rand(rng, (4, 16)), rand(rng, (6, 16))
    d = rand(rng, (4, 6))

    def f(x, w):
        a, b = rF.fork(x)
        return rF.linear(rF.add(rF.gelu(a), rF.silu(b)), w)

    outs = []
    for fn in (f, torch.compile(f, backend="eager")):
        x, w = torch.from_numpy(xn.copy()).requires_grad_(), torch.from_numpy(wn.copy()).requires_grad_()
        y = fn(x, w)
        y.backward(torch.from_numpy(d))
        outs.append([bits(y), bits(x.grad), bits(w.grad)])
    h = EW.add(A.gelu_forward(xn), A.silu_forward(xn))
    assert np.array_equal(outs[0][0], bits(L.linear_forward(h, wn)))
    for eager_bits, compiled_bits in zip(*outs):
        assert np.array_equal(eager_bits, compiled_bits)


# ---- shapes and layouts, fuzzed ------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(
    lead=st.lists(st.integers(1, 3), min_size=0, max_size=3),
    C=st.integers(1, 9),
    OC=st.integers(1, 5),
    transpose=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_any_leading_shape_and_layout_gives_the_row_ops_bits(lead, C, OC, transpose, seed):
    """Linear, the norms and the softmaxes flatten any leading axes into
    rows (row n of the flattened input is row n of the op); a transposed
    (non-contiguous) input is copied exactly first."""
    rng = np.random.default_rng(seed)
    shape = (*lead, C)
    xn = rand(rng, shape[::-1] if transpose else shape, 2)
    x = torch.from_numpy(xn)
    if transpose:
        x = x.permute(*reversed(range(x.dim())))  # a view whose logical shape is `shape`
        xn = np.ascontiguousarray(xn.transpose())
    rows = xn.reshape(-1, C)
    w, b, W, bo = rand(rng, (C,)), rand(rng, (C,)), rand(rng, (OC, C)), rand(rng, (OC,))
    tw, tb, tW, tbo = (torch.from_numpy(a) for a in (w, b, W, bo))
    checks = [
        (rF.linear(x, tW, tbo), L.linear_forward(rows, W, bo)),
        (rF.linear(x, tW), L.linear_forward(rows, W)),
        (rF.layer_norm(x, (C,), tw, tb), N.layernorm_forward(rows, w, b, EPS)[0]),
        (rF.rms_norm(x, (C,), tw), N.rmsnorm_forward(rows, w, EPS)[0]),
        (rF.softmax(x), S.softmax_forward(rows)),
        (rF.log_softmax(x), S.log_softmax_forward(rows)),
    ]
    for got, want in checks:
        assert tuple(got.shape[:-1]) == tuple(shape[:-1])
        assert np.array_equal(bits(got).reshape(-1), bits(want).reshape(-1))
