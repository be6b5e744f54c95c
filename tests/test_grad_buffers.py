"""Issue #32 item 4: the ``out=`` paths of the backward ops and the model's
reused scratch buffers change no bit.

Each op's ``out=`` result is compared bit for bit (uint32 views) with the
allocating path's, with ``out`` NaN-filled beforehand (a kernel that left an
element unwritten, or accumulated into the old contents, fails) and with one
buffer reused for two different inputs (a kernel that depended on the
previous call's contents fails).  Bad ``out`` arrays are refused with a
clear error.  The whole-model and whole-step checks compare a model / trainer
with its workspace against one without (every temporary new).
"""

from __future__ import annotations

import numpy as np
import pytest

from refreplay.ops import embedding, linear, loss
from refreplay.training.model import Model, init_params
from refreplay.training.presets import ModelConfig, preset


def bits(a):
    return np.ascontiguousarray(a).view(np.uint32)


def same(a, b):
    assert a.shape == b.shape and a.dtype == b.dtype
    np.testing.assert_array_equal(bits(a), bits(b))


def nan_like(shape):
    return np.full(shape, np.nan, np.float32)


def rand(rs, *shape):
    return rs.standard_normal(shape).astype(np.float32)


# ---- embedding backward ([emb.bwd.c1]) ------------------------------------------------


def emb_case(seed, V=37, B=3, T=11, C=70):
    rs = np.random.RandomState(seed)
    dout = rand(rs, B, T, C)
    dout[0, 0, :3] = -0.0  # a row whose sum stays -0 must not read +0 from a stale buffer
    tokens = rs.randint(0, V // 2, size=(B, T)).astype(np.int32)  # repeats, and ids never seen
    return dout, tokens, V


def test_embedding_out_is_bit_identical_on_garbage_and_reuse():
    out = nan_like((37, 70))
    for seed in (0, 1):
        dout, tokens, V = emb_case(seed)
        ref = embedding.embedding_backward(dout, tokens, V)
        got = embedding.embedding_backward(dout, tokens, V, out=out)
        assert got is out
        same(got, ref)
        # the unseen rows are +0 (the empty sum), the seen ones start at -0: both rewritten
        unseen = np.setdiff1d(np.arange(V), tokens)
        assert (bits(out[unseen]) == 0).all()
        out[:] = np.nan  # garbage again before the reuse


def test_embedding_reuse_with_different_tokens_clears_the_old_rows():
    out = nan_like((37, 70))
    d1, t1, V = emb_case(2)
    embedding.embedding_backward(d1, t1, V, out=out)
    t2 = (t1 + 17) % V  # other rows now: the previous ones must fall back to +0
    same(embedding.embedding_backward(d1, t2, V, out=out), embedding.embedding_backward(d1, t2, V))


def test_embedding_out_is_checked():
    dout, tokens, V = emb_case(0)
    with pytest.raises(ValueError, match="shape"):
        embedding.embedding_backward(dout, tokens, V, out=nan_like((V + 1, 70)))
    with pytest.raises(TypeError, match="float32"):
        embedding.embedding_backward(dout, tokens, V, out=np.zeros((V, 70), np.float64))
    with pytest.raises(ValueError, match="C-contiguous"):
        embedding.embedding_backward(dout, tokens, V, out=nan_like((70, V)).T)
    ro = nan_like((V, 70))
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        embedding.embedding_backward(dout, tokens, V, out=ro)
    with pytest.raises(TypeError, match="numpy array"):
        embedding.embedding_backward(dout, tokens, V, out=[[0.0] * 70] * V)
    big = nan_like((3 * 11 * 70 + V * 70,))  # out overlapping dout
    d = big[: 3 * 11 * 70].reshape(3, 11, 70)
    d[:] = dout
    with pytest.raises(ValueError, match="overlap"):
        embedding.embedding_backward(d, tokens, V, out=big[3 * 11 * 70 - 70 : 3 * 11 * 70 - 70 + V * 70].reshape(V, 70))


# ---- cross-entropy backward ([loss.bwd.c1]) -------------------------------------------


def ce_case(seed, N=13, V=29):
    rs = np.random.RandomState(seed)
    logits = rand(rs, N, V) * 3
    y = rs.randint(0, V, size=N).astype(np.int32)
    y[[2, 7]] = -1  # ignored rows: written +0, not left stale
    return logits, y


def test_cross_entropy_out_is_bit_identical_on_garbage_and_reuse():
    out = nan_like((13, 29))
    for seed in (0, 1):
        logits, y = ce_case(seed)
        ref = loss.cross_entropy_backward(logits, y)
        got = loss.cross_entropy_backward(logits, y, out=out)
        assert got is out
        same(got, ref)
    logits, y = ce_case(3)
    same(
        loss.cross_entropy_backward(logits, y, dloss=np.float32(0.5), count=20, out=out),
        loss.cross_entropy_backward(logits, y, dloss=np.float32(0.5), count=20),
    )


def test_cross_entropy_out_is_checked():
    logits, y = ce_case(0)
    with pytest.raises(ValueError, match="shape"):
        loss.cross_entropy_backward(logits, y, out=nan_like((13, 30)))
    with pytest.raises(TypeError, match="float32"):
        loss.cross_entropy_backward(logits, y, out=np.zeros((13, 29), np.float16))
    with pytest.raises(ValueError, match="C-contiguous"):
        loss.cross_entropy_backward(logits, y, out=nan_like((13, 58))[:, ::2])
    with pytest.raises(ValueError, match="overlap"):
        loss.cross_entropy_backward(logits, y, out=logits)


# ---- linear forward / backward ([linear.fwd.c1] [linear.bwd.c1]) ----------------------


def lin_case(seed, N=19, C=24, OC=33):
    rs = np.random.RandomState(seed)
    return rand(rs, N, OC), rand(rs, N, C), rand(rs, OC, C), rand(rs, OC)


@pytest.mark.parametrize("has_bias", [True, False])
def test_linear_backward_out_is_bit_identical_on_garbage_and_reuse(has_bias):
    outs = (nan_like((19, 24)), nan_like((33, 24)), nan_like((33,)) if has_bias else None)
    for seed in (0, 1):
        dy, x, W, _ = lin_case(seed)
        ref = linear.linear_backward(dy, x, W, has_bias)
        got = linear.linear_backward(dy, x, W, has_bias, out=outs)
        for g, r, o in zip(got, ref, outs):
            if r is None:
                assert g is None
            else:
                assert g is o
                same(g, r)


def test_linear_backward_partial_out():
    dy, x, W, _ = lin_case(4)
    ref = linear.linear_backward(dy, x, W, True)
    dw = nan_like((33, 24))
    got = linear.linear_backward(dy, x, W, True, out=(None, dw, None))
    assert got[1] is dw
    for g, r in zip(got, ref):
        same(g, r)


def test_linear_forward_out():
    out = nan_like((19, 33))
    for seed, with_b in ((0, True), (1, False)):
        _, x, W, b = lin_case(seed)
        b = b if with_b else None
        got = linear.linear_forward(x, W, b, out=out)
        assert got is out
        same(got, linear.linear_forward(x, W, b))


def test_linear_out_is_checked():
    dy, x, W, b = lin_case(0)
    good = (nan_like((19, 24)), nan_like((33, 24)), nan_like((33,)))
    with pytest.raises(TypeError, match="tuple"):
        linear.linear_backward(dy, x, W, True, out=good[0])
    with pytest.raises(ValueError, match=r"out\[1\] \(dW\) must have shape"):
        linear.linear_backward(dy, x, W, True, out=(good[0], nan_like((24, 33)), good[2]))
    with pytest.raises(TypeError, match=r"out\[0\] \(dx\) must be float32"):
        linear.linear_backward(dy, x, W, True, out=(np.zeros((19, 24)), good[1], good[2]))
    with pytest.raises(ValueError, match="C-contiguous"):
        linear.linear_backward(dy, x, W, True, out=(good[0], nan_like((24, 33)).T, good[2]))
    with pytest.raises(ValueError, match="overlap"):  # dx in x: matmul_tn would read the overwritten x
        linear.linear_backward(dy, x, W, True, out=(x, good[1], good[2]))
    both = nan_like((33, 24))
    with pytest.raises(ValueError, match="overlap"):  # two outputs in one buffer
        linear.linear_backward(dy, x, W, True, out=(good[0], both, both[0]))
    with pytest.raises(ValueError, match="has_bias is False"):
        linear.linear_backward(dy, x, W, False, out=good)


def test_linear_forward_refuses_out_in_its_input():
    _, x, W, b = lin_case(0)
    buf = np.zeros(x.size + 19 * 33, np.float32)
    xx = buf[: x.size].reshape(x.shape)
    xx[:] = x
    with pytest.raises(ValueError, match="overlap"):
        linear.linear_forward(xx, W, b, out=buf[x.size - 5 : x.size - 5 + 19 * 33].reshape(19, 33))


# ---- activation backward ([act.gelu.bwd.c1], [act.swiglu.bwd.c1]) ------------------------


def test_activation_backward_out_is_bit_identical_on_garbage_and_reuse():
    from refreplay.ops import activations as act

    dx, da, db = nan_like((7, 45)), nan_like((7, 45)), nan_like((7, 45))
    for seed in (0, 1):
        rs = np.random.RandomState(seed)
        dout, x, b = rand(rs, 7, 45), rand(rs, 7, 45), rand(rs, 7, 45)
        got = act.gelu_backward(dout, x, out=dx)
        assert got is dx
        same(got, act.gelu_backward(dout, x))
        ref = act.swiglu_backward(dout, x, b)
        got = act.swiglu_backward(dout, x, b, out=(da, db))
        assert got[0] is da and got[1] is db
        same(got[0], ref[0]), same(got[1], ref[1])
        got = act.swiglu_backward(dout, x, b, out=(None, db))  # one of the pair new
        same(got[0], ref[0]), same(got[1], ref[1])


def test_activation_backward_out_is_checked():
    from refreplay.ops import activations as act

    rs = np.random.RandomState(2)
    dout, x = rand(rs, 7, 45), rand(rs, 7, 45)
    with pytest.raises(ValueError, match=r"\(dx\) must have shape"):
        act.gelu_backward(dout, x, out=nan_like((45, 7)))
    with pytest.raises(TypeError, match="float32"):
        act.gelu_backward(dout, x, out=np.zeros((7, 45)))
    with pytest.raises(ValueError, match="overlap"):  # dx in dout: read while written
        act.gelu_backward(dout, x, out=dout)
    with pytest.raises(TypeError, match="tuple"):
        act.swiglu_backward(dout, x, x, out=nan_like((7, 45)))
    both = nan_like((7, 45))
    with pytest.raises(ValueError, match="overlap"):
        act.swiglu_backward(dout, x, x, out=(both, both))


# ---- AdamW into new arrays ([optim.adamw.c1]) --------------------------------------------


def _adam_state(seed):
    from refreplay.numerics.elementwise import BLOCK, PARALLEL_MIN

    rs = np.random.RandomState(seed)
    shapes = {"a.w": (5, 7), "b": (PARALLEL_MIN + 3 * BLOCK + 5,), "c": (0,), "z": (2, 2)}  # b: parallel blocks
    p, g, m, v = ({k: rand(rs, *s) for k, s in shapes.items()} for _ in range(4))
    v = {k: np.abs(x) for k, x in v.items()}
    return p, g, m, v


def test_adamw_into_new_arrays_has_the_in_place_bits_and_reads_only():
    from refreplay.ops import optim

    for seed in (0, 1):
        p, g, m, v = _adam_state(seed)
        before = [{k: x.copy() for k, x in d.items()} for d in (p, g, m, v)]
        outs = tuple({k: nan_like(x.shape) for k, x in d.items()} for d in (p, m, v))
        kw = dict(step=3 + seed, lr=np.float32(1e-3), no_decay={"b"})
        optim.adamw_step(p, g, m, v, **kw, out=outs)
        for d, b in zip((p, g, m, v), before):  # the inputs are only read
            for k in d:
                same(d[k], b[k])
        optim.adamw_step(p, g, m, v, **kw)  # in place
        for got, want in zip(outs, (p, m, v)):
            for k in want:
                same(got[k], want[k])


def test_adamw_update_reads_any_layout_and_shared_inputs():
    """adamw_update (new arrays) reads p, m, v of any layout, and inputs that
    share memory, as the copies it made before did."""
    from refreplay.ops import optim

    rs = np.random.RandomState(3)
    wide, g = rand(rs, 6, 8), rand(rs, 6, 4)
    m = np.abs(rand(rs, 6, 4))
    want = optim.adamw_update(np.ascontiguousarray(wide[:, ::2]), g, m, m.copy(), 2, np.float32(1e-3))
    got = optim.adamw_update(wide[:, ::2], g, m, m, 2, np.float32(1e-3))  # strided p; m is v
    for a, b in zip(got, want):
        same(a, b)


def test_adamw_out_is_checked():
    from refreplay.ops import optim

    p, g, m, v = _adam_state(2)
    kw = dict(step=1, lr=np.float32(1e-3))

    def outs():
        return tuple({k: nan_like(x.shape) for k, x in d.items()} for d in (p, m, v))

    with pytest.raises(TypeError, match="tuple"):
        optim.adamw_step(p, g, m, v, **kw, out=list(outs()))
    bad = outs()
    bad[1]["a.w"] = nan_like((7, 5))
    with pytest.raises(ValueError, match="shape"):
        optim.adamw_step(p, g, m, v, **kw, out=bad)
    bad = outs()
    del bad[2]["z"]
    with pytest.raises(ValueError, match="names"):
        optim.adamw_step(p, g, m, v, **kw, out=bad)
    for where in ("same", "grad", "other tensor", "two outputs"):
        bad = outs()
        if where == "same":  # in place belongs to out=None
            bad[0]["a.w"] = p["a.w"]
        elif where == "grad":
            bad[1]["z"] = g["z"]
        elif where == "other tensor":  # the update of "z" would clobber b's input
            bad[2]["z"] = v["b"][10:14].reshape(2, 2)
        else:
            bad[2]["b"] = bad[1]["b"]
        with pytest.raises(ValueError, match="overlaps"):
            optim.adamw_step(p, g, m, v, **kw, out=bad)


# ---- the model and the step ------------------------------------------------------------

# two layers or more, so that each layer's buffer (att) is told apart from the
# others'; one head and one position: split_heads' "copies" are then views
CONFIGS = {
    "tied-rms": ModelConfig(vocab=64, width=16, layers=2, heads=2, seq_len=8, mlp_hidden=32),
    "untied-layer-bias": ModelConfig(
        vocab=64, width=16, layers=3, heads=2, seq_len=8, mlp_hidden=32, norm="layer", tied=False, bias=True
    ),
    "tied-learned-bf16": ModelConfig(
        vocab=64, width=16, layers=2, heads=2, seq_len=8, mlp_hidden=32, pos="learned", precision="bf16", mlp="swiglu"
    ),
    "int8": ModelConfig(vocab=64, width=16, layers=2, heads=2, seq_len=8, mlp_hidden=32, linear="int8"),
    "one-head-one-position": ModelConfig(vocab=64, width=16, layers=2, heads=1, seq_len=1, mlp_hidden=32, bias=True),
}


def _batch(cfg, seed, B=3):
    rs = np.random.RandomState(seed)
    t = rs.randint(0, cfg.vocab, size=(B, cfg.seq_len + 1)).astype(np.int32)
    return np.ascontiguousarray(t[:, :-1]), np.ascontiguousarray(t[:, 1:])


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_model_workspace_gives_the_same_bits_and_allocates_once(name):
    cfg = CONFIGS[name]
    fresh, reuse = Model(cfg), Model(cfg)
    fresh.workspace = None
    assert reuse.workspace is not None
    params = init_params(cfg, seed=5)
    wp = reuse.working_params(params)
    seen = []
    B = 1 if cfg.seq_len == 1 else 3  # one row of one head: split_heads returns views
    for mb in range(3):  # micro-batches, the scratch buffers poisoned between them
        x, y = _batch(cfg, mb, B)
        a = fresh.loss_and_grads(wp, x, y)
        b = reuse.loss_and_grads(wp, x, y)
        same(np.float32(a.loss).reshape(1), np.float32(b.loss).reshape(1))
        assert sorted(a.grads) == sorted(b.grads)
        for k in a.grads:
            same(a.grads[k], b.grads[k])
        seen.append(b.grads)
        if mb == 0:
            made = reuse.workspace.allocations
            assert made >= 3  # logits, dlogits, dnf (+ dwte, dhead when tied)
        for buf in reuse.workspace._bufs.values():
            buf[...] = np.nan
    assert reuse.workspace.allocations == made  # reused, not reallocated
    # the memory estimate counts exactly what the workspace keeps between steps
    from refreplay.training import estimate

    kept = sum(buf.nbytes for buf in reuse.workspace._bufs.values())
    assert kept == estimate.workspace_bytes(cfg, B)
    # no returned gradient lives in a scratch buffer (the TreeFold keeps them)
    for g in seen:
        for k, arr in g.items():
            for buf in reuse.workspace._bufs.values():
                assert not np.may_share_memory(arr, buf), k
    # earlier micro-batches' gradients were not overwritten by later ones
    x, y = _batch(cfg, 0, B)
    again = fresh.loss_and_grads(wp, x, y)
    for k in again.grads:
        same(again.grads[k], seen[0][k])


def test_forward_without_scratch_returns_a_new_logits_array():
    cfg = CONFIGS["tied-rms"]
    m = Model(cfg)
    params = init_params(cfg, seed=1)
    x, y = _batch(cfg, 0)
    _, l1, ctx = m.forward(params, x, y)
    m.loss_and_grads(params, *_batch(cfg, 1))  # uses the scratch logits
    _, l2, _ = m.forward(params, x, y)
    same(l1, l2)
    for buf in m.workspace._bufs.values():
        assert not np.may_share_memory(l1, buf)


def test_a_step_with_reused_buffers_has_the_same_state_root():
    from refreplay.training.data import Batching, Stream
    from refreplay.training.launch.inproc import InProcess
    from refreplay.training.step import Trainer

    mc, tc = preset("tiny")
    rs = np.random.RandomState(0)
    samples = rs.randint(0, 256, size=(2 * tc.micro_batches * tc.micro_batch_size, mc.seq_len + 1))
    stream = Stream(samples.astype(np.uint8), tc.seed, Batching(tc.micro_batches, tc.micro_batch_size))
    roots = []
    for reuse in (False, True):
        tr = Trainer(mc, tc, stream, "00" * 32)
        assert tr.reuse
        if not reuse:
            tr.fresh_buffers()
        st, link = tr.initial_state(), "00" * 32
        rec = []
        for _ in range(2):  # across steps too
            st, r = tr.step(st, link, InProcess(1))
            link = r.chain_link
            rec.append((r.state_root, r.chain_link, r.loss_hex()))
        roots.append(rec)
        if reuse:
            # tied: logits, dlogits, dnf, dhead, and each layer's attention probabilities
            # (the embedding's gradient half is written into a spare, not a buffer), and
            # the four roles' linear input gradients (GELU MLP) and GELU's input
            # gradient, shared by the layers
            assert mc.mlp == "gelu" and mc.linear != "int8"
            assert tr.model.workspace.allocations == 4 + mc.layers + 4 + 1
    assert roots[0] == roots[1]


def _tiny_trainer(steps_of_data=3):
    from refreplay.training.data import Batching, Stream
    from refreplay.training.step import Trainer

    mc, tc = preset("tiny")
    rs = np.random.RandomState(1)
    samples = rs.randint(0, 256, size=(steps_of_data * tc.micro_batches * tc.micro_batch_size, mc.seq_len + 1))
    stream = Stream(samples.astype(np.uint8), tc.seed, Batching(tc.micro_batches, tc.micro_batch_size))
    return Trainer(mc, tc, stream, "00" * 32), mc, tc


def test_spare_gradients_are_reused_whatever_they_hold():
    """The embedding's gradient goes into dead gradients of earlier
    micro-batches: after the first step none is new (M = 8: the fold holds
    at most 4 at once), and the state roots equal a run without reuse even
    when every spare is NaN-filled before each step (a backward that read
    its old contents, or a spare handed out while still in the fold, fails)."""
    from refreplay.training.launch.inproc import InProcess

    fresh, _, _ = _tiny_trainer()
    fresh.fresh_buffers()
    reuse, mc, tc = _tiny_trainer()
    assert reuse.spares.cap == tc.micro_batches.bit_length() == 4
    runs = []
    for tr in (fresh, reuse):
        st, link, rec = tr.initial_state(), "00" * 32, []
        for step in range(3):
            if tr.spares is not None:
                for kept in tr.spares._kept.values():
                    for a in kept:
                        a[...] = np.nan
                before = tr.spares.taken
            st, r = tr.step(st, link, InProcess(1))
            link = r.chain_link
            rec.append((r.state_root, r.loss_hex()))
            if tr.spares is not None:
                taken = tr.spares.taken - before
                # step 1: 4 of the 8 leaves new (the pool starts empty); later: all 8 spares
                assert taken == (4 if step == 0 else tc.micro_batches), (step, taken)
                kept = tr.spares._kept["wte"]
                assert len(kept) == reuse.spares.cap
                assert len({id(a) for a in kept}) == len(kept)
                for a in kept:  # none is a parameter, a moment or the state's arrays
                    for d in (st.params, st.m, st.v):
                        assert not any(np.may_share_memory(a, t) for t in d.values())
        runs.append(rec)
    assert runs[0] == runs[1]


def test_spares_keep_only_whole_owned_arrays_up_to_cap():
    from refreplay.training.workspace import Spares

    sp = Spares(("wte",), 2)
    own = np.zeros((4, 3), np.float32)
    view = np.zeros((8, 3), np.float32)[:4]
    sp.give({"wte": view})  # a view into a bigger buffer: not kept
    sp.give({"wte": own.astype(np.float64)})  # not float32
    ro = np.zeros((4, 3), np.float32)
    ro.flags.writeable = False
    sp.give({"wte": ro})
    sp.give({"other": np.zeros((4, 3), np.float32)})  # a name not asked for
    assert sp.nbytes() == 0 and sp.take("wte", (4, 3)) is None
    sp.give({"wte": own})
    sp.give({"wte": own})  # the same array twice: kept once
    b, c = np.zeros((4, 3), np.float32), np.zeros((4, 3), np.float32)
    sp.give({"wte": b})
    sp.give({"wte": c})  # over the cap: dropped
    assert sp.nbytes() == 2 * own.nbytes
    assert sp.take("wte", (3, 4)) is None  # no array of that shape
    got = {id(sp.take("wte", (4, 3))), id(sp.take("wte", (4, 3)))}
    assert got == {id(own), id(b)} and sp.take("wte", (4, 3)) is None
    with pytest.raises(ValueError):
        Spares(("wte",), -1)


def test_the_estimate_counts_the_spares():
    from refreplay.training import estimate

    mc, tc = preset("gpt2-124m")
    v, c = mc.vocab, mc.width
    assert estimate.spare_bytes(mc, 8) == 4 * 4 * v * c
    assert estimate.workspace_bytes(mc, 1) - estimate.workspace_bytes(mc, 1, spares=True) == 4 * v * c


def test_a_mapped_budget_turns_the_workspace_off():
    from refreplay.training import budget
    from refreplay.training.data import Batching, Stream
    from refreplay.training.step import Trainer

    mc, tc = preset("tiny")
    samples = np.zeros((tc.micro_batches * tc.micro_batch_size, mc.seq_len + 1), np.uint8)
    stream = Stream(samples, tc.seed, Batching(tc.micro_batches, tc.micro_batch_size))
    assert Trainer(mc, tc, stream, "00" * 32).model.workspace is not None
    off = Trainer(mc, tc, stream, "00" * 32, memory=budget.Memory(True))
    assert off.model.workspace is None and not off.reuse


# ---- the TreeFold's nodes in place ([fold.tree.c1]) ---------


def _leaves(seed, M=7):  # M >= 4
    rs = np.random.RandomState(seed)
    leaves = [{"a": rand(rs, 5, 3) * 10 ** rs.randint(-3, 4), "b": rand(rs, 70000)} for _ in range(M)]
    leaves[1]["a"][0, 0] = np.float32(-0.0)
    leaves[2]["a"][0, 0] = np.float32(-0.0)  # -0 + -0 stays -0
    leaves[3]["b"][:4] = [np.inf, -np.inf, np.nan, 1e38]
    return leaves


@pytest.mark.parametrize("ranks", [1, 3])
def test_fold_in_place_gives_the_bits_of_the_allocating_fold(ranks):
    from refreplay.training import treefold
    from refreplay.training.launch.inproc import InProcess

    ref = treefold.scale(InProcess(ranks).fold(lambda i: _leaves(0)[i], 7), 7)
    got = treefold.scale(InProcess(ranks).fold(lambda i: _leaves(0)[i], 7, treefold.merge_into), 7)
    for k in ref:
        same(got[k], ref[k])


def test_merge_into_writes_left_and_refuses_overlap():
    from refreplay.numerics import elementwise
    from refreplay.training import treefold

    left, right = _leaves(1)[2:4]
    want = treefold.merge(left, right)
    keep = {k: right[k].copy() for k in right}
    got = treefold.merge_into(left, right)
    assert got is left
    for k in want:
        same(got[k], want[k])
        same(right[k], keep[k])  # the right operand is read only
    x = np.ones(10, np.float32)
    with pytest.raises(ValueError, match="overlap"):
        elementwise.add_into(x, x)
    with pytest.raises(ValueError, match="shape"):
        elementwise.add_into(x, np.ones(9, np.float32))
    with pytest.raises(ValueError, match="C-contiguous"):
        elementwise.add_into(np.ones(20, np.float32)[::2], x)
    with pytest.raises(ValueError, match="same tensor names"):
        treefold.merge_into({"a": x}, {"b": x.copy()})


def test_add_into_gives_the_bits_of_add_on_both_paths():
    """[num.add.c1] add_into (its own in-place loops) equals add element by
    element, one thread below PARALLEL_MIN and in blocks above it, on
    subnormals (flushed), signed zeros, infinities, NaN payloads and overflow."""
    from refreplay.numerics import elementwise

    special = np.array(
        [
            0x00000001,
            0x80000001,
            0x007FFFFF,
            0x00800000,
            0x80000000,
            0,
            0x7F800000,
            0xFF800000,
            0x7FC00001,
            0xFF812345,
            0x7F7FFFFF,
            0x3F800000,
            0xBF800000,
            0x00400000,
        ],
        np.uint32,
    ).view(np.float32)
    rng = np.random.default_rng(11)
    for n in (7, elementwise.PARALLEL_MIN - 1, elementwise.PARALLEL_MIN + 17):
        a = rng.choice(special, n) if n < 100 else rng.standard_normal(n).astype(np.float32)
        b = rng.choice(special, n)
        a[: len(special)] = special[: min(n, len(special))]
        want = elementwise.add(a, b)
        got = a.copy()
        assert elementwise.add_into(got, b) is got
        same(got, want)


def test_a_step_with_three_ranks_and_reuse_has_the_same_root():
    from refreplay.training.data import Batching, Stream
    from refreplay.training.launch.inproc import InProcess
    from refreplay.training.step import Trainer

    mc, tc = preset("tiny")
    rs = np.random.RandomState(3)
    samples = rs.randint(0, 256, size=(tc.micro_batches * tc.micro_batch_size, mc.seq_len + 1))
    stream = Stream(samples.astype(np.uint8), tc.seed, Batching(tc.micro_batches, tc.micro_batch_size))
    roots = []
    for reuse in (False, True):
        tr = Trainer(mc, tc, stream, "00" * 32)
        if not reuse:
            tr.fresh_buffers()
        s0 = tr.initial_state()
        root0 = s0.root()
        st, rec = tr.step(s0, "00" * 32, InProcess(3))
        assert s0.root() == root0  # the step leaves its input state alone
        roots.append(rec.state_root)
    assert roots[0] == roots[1]


@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (2, 3, 37, 8), (1, 2, 130, 65)])
def test_attention_forward_into_given_buffers_has_the_new_arrays_bits(shape):
    """[attn.scores.c1] [attn.mask.c1] [attn.out.c1] ``out=(out, att)``: every
    element is written (the buffers hold NaNs and -0 beforehand), so the bits
    are those of new arrays; the arrays returned are the ones given."""
    from refreplay.ops import attention as A

    rng = np.random.default_rng(sum(shape))
    q, k, v = (rng.standard_normal(shape).astype(np.float32) for _ in range(3))
    o1, a1 = A.attention_forward(q, k, v)
    B, NH, T, HS = shape
    for fill in (0x7FC01234, 0x80000000):
        ob = np.full(shape, fill, np.uint32).view(np.float32)
        ab = np.full((B, NH, T, T), fill, np.uint32).view(np.float32)
        o2, a2 = A.attention_forward(q, k, v, out=(ob, ab))
        assert o2 is ob and a2 is ab
        same(o1, o2)
        same(a1, a2)
        o3, a3 = A.attention_forward(q, k, v, out=(None, np.full_like(a1, np.nan)))
        same(o1, o3)
        same(a1, a3)


def test_attention_forward_refuses_bad_buffers():
    from refreplay.ops import attention as A

    q = np.zeros((1, 2, 5, 3), np.float32)
    att = np.zeros((1, 2, 5, 5), np.float32)
    with pytest.raises(TypeError, match=r"out must be a tuple \(out, att\)"):
        A.attention_forward(q, q, q, out=att)
    with pytest.raises(ValueError, match=r"out\[1\] \(att\) must have shape"):
        A.attention_forward(q, q, q, out=(None, np.zeros((1, 2, 5, 4), np.float32)))
    with pytest.raises(TypeError, match=r"out\[1\] \(att\) must be float32"):
        A.attention_forward(q, q, q, out=(None, att.astype(np.float64)))
    with pytest.raises(ValueError, match=r"out\[0\] \(out\) must not overlap an input"):
        A.attention_forward(q, q.copy(), q.copy(), out=(q, None))
    with pytest.raises(ValueError, match=r"out\[0\] \(out\) must be C-contiguous"):
        A.attention_forward(q, q.copy(), q.copy(), out=(att[..., :3], None))
    both = np.zeros(30 + 50, np.float32)  # out and att in one buffer, overlapping
    with pytest.raises(ValueError, match=r"out\[0\] \(out\) must not overlap an input"):  # each other
        A.attention_forward(q, q.copy(), q.copy(), out=(both[:30].reshape(q.shape), both[20:70].reshape(att.shape)))
