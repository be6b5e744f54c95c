"""The GPT-style decoder of the reference trainer (``spec/20-model.txt``),
composed from the ops of ``refreplay.ops`` (or, on ``device="cuda"``, their
CUDA twins in ``cuda_backend.host``, see ``refreplay.training.backend``); no arithmetic of its own beyond
the residual additions ([model.residual.c1]).

Shapes (spec letters): tokens, targets [B, T] int32; the residual stream
[N, C] with N = B*T; q, k, v [B, NH, T, HS]; logits [N, V].

* [model.config.c1] the configuration (``presets.ModelConfig``);
* [model.params.c1] parameter names and shapes: a flat dict, sorted names;
* [model.init.c1]   initialisation from Philox;
* [model.pos.c1]    positions: rotary (q, k) or a learned table wpe added to
  the token embedding, its gradient the embedding's ordered scatter-add;
* [norm.layer.nobias.c1] LayerNorm without a bias: the bias -0;
* [model.forward.c1] the forward pass, op by op;
* [model.backward.c1] the backward pass: the forward in reverse, with every
  gradient sum (residual, tied weights, SwiGLU branches) in a stated order;
* [model.quant.c1]  int8-QAT linears and their re-pinned step sizes;
* [bf16.tensors.c1] [bf16.ops.c1] under precision "bf16": the forward reads
  the parameters' working copies (``Model.working_params``, made once per
  step), and every activation and every gradient of an activation is rounded
  to bf16 where the op that makes it returns it (``_h``); parameter
  gradients, saved statistics and the loss stay binary32.  The linear
  layers' products then have two bf16 factors and are exact
  ([bf16.matmul.c1]): their bits are decided by chapter 4's accumulation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..numerics.core import F32, mul, sqrt
from . import backend as backends
from .presets import ModelConfig
from .workspace import Workspace


# ---- parameters -------------------------------------------------------------------


def _layer(i: int) -> str:
    return f"h.{i:02d}"


def linear_names(cfg: ModelConfig) -> list[str]:
    """[model.params.c1] The weight names of the linear layers inside the
    blocks (the layers that run int8 under linear = "int8", [model.quant.c1])."""
    out = []
    for i in range(cfg.layers):
        p = _layer(i)
        mlp = ["mlp.fc"] if cfg.mlp == "gelu" else ["mlp.gate", "mlp.up"]
        for lin in ["attn.qkv", "attn.proj"] + mlp + ["mlp.proj"]:
            out.append(f"{p}.{lin}.w")
    return out


def param_shapes(cfg: ModelConfig) -> dict[str, tuple]:
    """[model.params.c1] name -> shape of every parameter, names sorted."""
    C, V, F = cfg.width, cfg.vocab, cfg.mlp_hidden
    shapes: dict[str, tuple] = {"wte": (V, C)}
    if cfg.pos == "learned":  # [model.pos.c1]
        shapes["wpe"] = (cfg.seq_len, C)

    def norm(prefix):
        shapes[f"{prefix}.w"] = (C,)
        if cfg.norm == "layer" and cfg.norm_bias:  # [norm.layer.nobias.c1]
            shapes[f"{prefix}.b"] = (C,)

    def lin(prefix, oc, ic):
        shapes[f"{prefix}.w"] = (oc, ic)
        if cfg.bias:
            shapes[f"{prefix}.b"] = (oc,)

    for i in range(cfg.layers):
        p = _layer(i)
        norm(f"{p}.ln1")
        lin(f"{p}.attn.qkv", 3 * C, C)
        lin(f"{p}.attn.proj", C, C)
        norm(f"{p}.ln2")
        if cfg.mlp == "gelu":
            lin(f"{p}.mlp.fc", F, C)
        else:
            lin(f"{p}.mlp.gate", F, C)
            lin(f"{p}.mlp.up", F, C)
        lin(f"{p}.mlp.proj", C, F)
    norm("lnf")
    if not cfg.tied:
        shapes["head.w"] = (V, C)
    return {k: shapes[k] for k in sorted(shapes)}


def param_count(cfg: ModelConfig) -> int:
    return sum(int(np.prod(s)) for s in param_shapes(cfg).values())


def init_scale(init_std) -> np.float32:
    """[model.init.c1] a = mul(init_std, sqrt(f32(3))): the half-width of a
    uniform distribution whose standard deviation is init_std.  Both operands
    binary32: a compiled kernel's float32 result reaches Python as a float,
    and mul of a float32 and a float would be a binary64 product flushed
    before its rounding ([num.flush.c1] flushes after it)."""
    return F32(mul(F32(init_std), F32(sqrt(F32(3.0)))))


def init_weight(seed: int, name: str, count: int, init_std) -> np.ndarray:
    """[model.init.c1] Elements 0 .. count-1 (row-major) of the initial value
    of the weight ``name``, whatever its shape."""
    return backends.get("cpu").rng.init_uniform(seed, name, (count,), init_scale(init_std))


def init_params(cfg: ModelConfig, seed: int, device=None, keep=None) -> dict[str, np.ndarray]:
    """[model.init.c1] Norm weights +1, biases (".b") +0, every other tensor
    (embeddings wte and wpe, linear weights, head) uniform in [-a, a) from its own Philox
    stream [rng.init.c1].  ``keep`` (``budget.Memory.keep``), when given,
    places each tensor as soon as it is drawn, so that no more than one
    sits in RAM."""
    cfg.validate()
    shapes = param_shapes(cfg)
    rng = backends.get(device).rng
    backends.get("cpu").rng.init_tags(shapes)  # refuses two names that would share a stream
    a = init_scale(cfg.init_std)
    params = {}
    for name, shape in shapes.items():
        if name.endswith(".b"):
            params[name] = np.zeros(shape, np.float32)
        elif ".ln" in name or name.startswith("lnf."):
            params[name] = np.ones(shape, np.float32)
        else:
            params[name] = np.ascontiguousarray(rng.init_uniform(seed, name, shape, a))
        if keep is not None:
            params[name] = keep(params[name])
    return params


def quant_steps(cfg: ModelConfig, params: dict, device=None) -> dict[str, np.ndarray]:
    """[model.quant.c1] The re-pinned per-output-channel step sizes of every
    int8 linear weight ([quant.step.c1]), keyed by weight name; empty for fp32."""
    if cfg.linear != "int8":
        return {}
    quant = backends.get(device).quant
    return {name: quant.step_size_rows(params[name]) for name in linear_names(cfg)}


# ---- residual additions ------------------------------------------------------------


def add(a: np.ndarray, b: np.ndarray, device=None) -> np.ndarray:
    """[model.residual.c1] Elementwise add(a, b), a on the left; a new array
    (computed on ``device``, the CPU reference by default)."""
    return _add(backends.get(device), a, b)


def _add(ops, a, b):
    if a.shape != b.shape or a.dtype != np.float32 or b.dtype != np.float32:
        raise ValueError(f"add: float32 arrays of one shape expected, got {a.shape} and {b.shape}")
    return ops.elementwise.add(ops.arrays.contiguous(a), ops.arrays.contiguous(b))


# ---- building blocks: dispatch on the configuration ---------------------------------


def _h(ops, cfg, x):
    """[bf16.ops.c1] An op's output that the profile makes bf16 ([bf16.tensors.c1]),
    rounded once, in place ([bf16.round.c1]); unchanged in binary32."""
    return ops.bf16.round_inplace(x) if cfg.precision == "bf16" else x


class _Ctx:
    """What one forward pass keeps for its backward (one entry per op)."""

    def __init__(self):
        self.saved: dict = {}


def _norm_fwd(ops, cfg, params, prefix, x, ctx, key, nobias=None):
    if cfg.norm == "rms":
        out, rrms = ops.norms.rmsnorm_forward(x, params[f"{prefix}.w"], cfg.norm_eps)
        ctx.saved[key] = (x, rrms)
    else:
        # [norm.layer.nobias.c1] without a bias parameter, the bias is -0 (``nobias``)
        b = params[f"{prefix}.b"] if cfg.norm_bias else nobias
        out, mean, rstd = ops.norms.layernorm_forward(x, params[f"{prefix}.w"], b, cfg.norm_eps)
        ctx.saved[key] = (x, mean, rstd)
    return _h(ops, cfg, out)


def _norm_bwd(ops, cfg, params, prefix, dout, ctx, key, grads):
    if cfg.norm == "rms":
        x, rrms = ctx.saved[key]
        dx, dw = ops.norms.rmsnorm_backward(dout, x, params[f"{prefix}.w"], rrms)
    else:
        x, mean, rstd = ctx.saved[key]
        dx, dw, db = ops.norms.layernorm_backward(dout, x, params[f"{prefix}.w"], mean, rstd)
        if cfg.norm_bias:  # [norm.layer.nobias.c1]: the constant -0 has no gradient
            grads[f"{prefix}.b"] = db
    grads[f"{prefix}.w"] = dw
    return _h(ops, cfg, dx)


def _lin_fwd(ops, cfg, params, prefix, x, ctx, B, T):
    """x [N, IC] -> y [N, OC]: fp32 [linear.fwd.c1] or int8 [quant.linear.fwd.c1]."""
    w = params[f"{prefix}.w"]
    b = params.get(f"{prefix}.b")
    ctx.saved[prefix] = x
    if cfg.linear == "int8":
        return ops.quant.qlinear_forward(x.reshape(B, T, -1), w, b).reshape(B * T, -1)
    return _h(ops, cfg, ops.linear.linear_forward(x, w, b))


def _lin_bwd(ops, cfg, params, prefix, dy, ctx, B, T, grads, dx_out=None):
    """``dx_out``: where the binary32 path writes dx (a workspace buffer), or None (new)."""
    x = ctx.saved[prefix]
    w = params[f"{prefix}.w"]
    if cfg.linear == "int8":
        dx, dw, db = ops.quant.qlinear_backward(dy.reshape(B, T, -1), x.reshape(B, T, -1), w, cfg.bias)
        dx = dx.reshape(B * T, -1)
    else:
        out = {} if dx_out is None else {"out": (dx_out, None, None)}  # a device's twin takes no out=
        dx, dw, db = ops.linear.linear_backward(dy, x, w, cfg.bias, **out)
    grads[f"{prefix}.w"] = dw
    if cfg.bias:
        grads[f"{prefix}.b"] = db
    return _h(ops, cfg, dx)


# ---- the model ---------------------------------------------------------------------------


@dataclass
class Result:
    """One micro-batch: its mean loss and the gradients of that mean."""

    loss: np.float32
    grads: dict


class Model:
    """The decoder of [model.forward.c1] for one configuration.  Holds the
    rotary tables (computed once, [rope.freq.c1]); parameters are passed in."""

    def __init__(self, cfg: ModelConfig, device=None):
        self.cfg = cfg.validate()
        self.ops = backends.get(device)  # where the ops run ("cpu", the default, or "cuda")
        # backward's scratch buffers, reused across calls (host ops only; ``None``: every
        # temporary new, as the device backend and a mapped memory budget want)
        self.workspace = Workspace() if self.ops.name == "cpu" else None
        # dead gradient arrays to write the embedding's gradient into (``workspace.Spares``;
        # the trainer that fills them sets it; ``None``: a new array every micro-batch)
        self.spares = None
        self.arrays = self.ops.arrays  # where the tensors live: the host, or the device
        self.shapes = param_shapes(cfg)
        self.learned = cfg.pos == "learned"  # [model.pos.c1]
        if self.learned:
            self.cos = self.sin = None
        else:
            self.cos, self.sin = (
                self.arrays.to_device(t) for t in self.ops.rope.rope_tables(cfg.seq_len, cfg.head_size, cfg.rope_theta)
            )
        # [norm.layer.nobias.c1] the bias of a LayerNorm without one: C copies of -0
        self.nobias = (
            self.arrays.to_device(np.full(cfg.width, -0.0, np.float32))
            if cfg.norm == "layer" and not cfg.norm_bias
            else None
        )

    def positions(self, B: int) -> np.ndarray:
        """[model.pos.c1] The position ids p[b, t] = t, [B, T] int32."""
        T = self.cfg.seq_len
        return np.ascontiguousarray(np.broadcast_to(np.arange(T, dtype=np.int32), (B, T)))

    def check_params(self, params: dict) -> None:
        if sorted(params) != list(self.shapes):
            missing = sorted(set(self.shapes) - set(params))
            extra = sorted(set(params) - set(self.shapes))
            raise ValueError(f"parameters do not match the model: missing {missing}, unexpected {extra}")
        for k, shape in self.shapes.items():
            a = params[k]
            if not isinstance(a, np.ndarray) or a.dtype != np.float32 or a.shape != shape:
                raise ValueError(
                    f"parameter {k}: expected float32 {shape}, got "
                    f"{getattr(a, 'dtype', type(a).__name__)} {getattr(a, 'shape', '')}"
                )

    def working_params(self, params: dict, keep=None) -> dict:
        """[bf16.tensors.c1] The parameters the forward reads: under "bf16" a
        new dict of their bf16 working copies, each rounded once from its
        binary32 master ([bf16.round.c1]; ``keep``, when given, decides where
        each copy lives); in binary32 ``params`` itself."""
        if self.cfg.precision != "bf16":
            return params
        keep = keep or (lambda a: a)
        return {k: keep(self.ops.bf16.round_f32(params[k])) for k in sorted(params)}

    def forward(self, params: dict, tokens: np.ndarray, targets: np.ndarray, scratch: bool = False):
        """[model.forward.c1] -> (mean loss, logits [N, V], ctx for backward).
        Under "bf16", ``params`` are the working copies (``working_params``).
        ``scratch``: the logits and each layer's attention probabilities in
        the workspace's buffers, which the next such call overwrites
        (``loss_and_grads``, which drops them after the backward); new
        arrays otherwise."""
        cfg, ops, A = self.cfg, self.ops, self.arrays
        B, T = tokens.shape
        if T != cfg.seq_len or targets.shape != (B, T):
            raise ValueError(f"tokens/targets must be [B, {cfg.seq_len}], got {tokens.shape} / {targets.shape}")
        NH, HS = cfg.heads, cfg.head_size
        ctx = _Ctx()
        ctx.saved["tokens"] = tokens
        r = lambda x: _h(ops, cfg, x)  # noqa: E731  [bf16.ops.c1]
        nb = self.nobias
        h = r(ops.embedding.embedding_forward(params["wte"], tokens).reshape(B * T, cfg.width))
        if self.learned:  # [model.pos.c1] h = add(wte[x], wpe[p]), the token rows on the left
            pe = ops.embedding.embedding_forward(params["wpe"], self.positions(B)).reshape(B * T, cfg.width)
            h = r(_add(ops, h, pe))
        for i in range(cfg.layers):
            p = _layer(i)
            n1 = _norm_fwd(ops, cfg, params, f"{p}.ln1", h, ctx, f"{p}.ln1", nb)
            qkv = _lin_fwd(ops, cfg, params, f"{p}.attn.qkv", n1, ctx, B, T)
            q = A.split_heads(qkv, 0, B, T, NH, HS)
            k = A.split_heads(qkv, 1, B, T, NH, HS)
            if not self.learned:  # step 4: rotary q and k
                q = r(ops.rope.rope_forward(q, self.cos, self.sin))
                k = r(ops.rope.rope_forward(k, self.cos, self.sin))
            v = A.split_heads(qkv, 2, B, T, NH, HS)  # an exact copy: bf16 already
            # in a scratch pass att lives in layer i's workspace buffer: it is read by this
            # pass's backward and by nothing after, so the next micro-batch may overwrite it
            att_buf = self._scratch(f"{p}.att", (B, NH, T, T)).get("out") if scratch else None
            if att_buf is None:
                o, att = ops.attention.attention_forward(q, k, v)
            else:
                o, att = ops.attention.attention_forward(q, k, v, out=(None, att_buf))
            o = r(o)
            ctx.saved[f"{p}.attn"] = (q, k, v, att)
            a = _lin_fwd(ops, cfg, params, f"{p}.attn.proj", A.merge_heads([o], B, T, NH, HS), ctx, B, T)
            h = r(_add(ops, h, a))
            n2 = _norm_fwd(ops, cfg, params, f"{p}.ln2", h, ctx, f"{p}.ln2", nb)
            if cfg.mlp == "gelu":
                u = _lin_fwd(ops, cfg, params, f"{p}.mlp.fc", n2, ctx, B, T)
                g = r(ops.activations.gelu_forward(u))
                ctx.saved[f"{p}.act"] = (u,)
            else:
                ga = _lin_fwd(ops, cfg, params, f"{p}.mlp.gate", n2, ctx, B, T)
                up = _lin_fwd(ops, cfg, params, f"{p}.mlp.up", n2, ctx, B, T)
                g = r(ops.activations.swiglu_forward(ga, up))
                ctx.saved[f"{p}.act"] = (ga, up)
            m = _lin_fwd(ops, cfg, params, f"{p}.mlp.proj", g, ctx, B, T)
            h = r(_add(ops, h, m))
        nf = _norm_fwd(ops, cfg, params, "lnf", h, ctx, "lnf", nb)
        head = params["wte"] if cfg.tied else params["head.w"]
        lg_out = self._scratch("logits", (B * T, cfg.vocab)) if scratch else {}
        logits = r(ops.linear.linear_forward(nf, head, **lg_out))
        ctx.saved["head"] = nf
        y = targets.reshape(-1)
        _, mean, _ = ops.loss.cross_entropy_forward(logits, y)
        ctx.saved["logits"] = (logits, y)
        return np.float32(mean), logits, ctx

    def backward(self, params: dict, ctx: _Ctx, grads=None) -> dict:
        """[model.backward.c1] Gradients of the mean loss, a flat dict with the
        parameter names (sorted).  ``grads``: the empty mapping that receives
        each gradient as it is computed (``budget.SpillingDict`` moves them
        to files); a dict by default."""
        cfg, ops, A = self.cfg, self.ops, self.arrays
        tokens = ctx.saved["tokens"]
        B, T = tokens.shape
        NH, HS = cfg.heads, cfg.head_size
        grads = {} if grads is None else grads
        r = lambda x: _h(ops, cfg, x)  # noqa: E731  [bf16.ops.c1]: gradients of activations
        logits, y = ctx.saved["logits"]
        ws = self._scratch
        N, V, C = logits.shape[0], cfg.vocab, cfg.width
        # the temporaries of this pass (consumed before it returns) in reused buffers
        dlogits = r(ops.loss.cross_entropy_backward(logits, y, **ws("dlogits", (N, V))))
        head = params["wte"] if cfg.tied else params["head.w"]
        # the head's weight gradient is a temporary only when tied (then added to dwte below)
        o_dhead = ws("dhead", (V, C)).get("out") if cfg.tied else None
        head_out = ws("dnf", (N, C))
        head_out = {"out": (head_out["out"], o_dhead, None)} if head_out else {}
        dnf, dhead, _ = ops.linear.linear_backward(dlogits, ctx.saved["head"], head, False, **head_out)
        dnf = r(dnf)
        dh = _norm_bwd(ops, cfg, params, "lnf", dnf, ctx, "lnf", grads)

        def dx(role, width):  # a linear's dx, consumed by the next op: one buffer a role, for every layer
            return ws(f"dx.{role}", (N, width)).get("out") if cfg.linear != "int8" else None

        for i in reversed(range(cfg.layers)):
            p = _layer(i)
            # h = add(h, m): the branch receives dh unchanged
            dg = _lin_bwd(ops, cfg, params, f"{p}.mlp.proj", dh, ctx, B, T, grads, dx("mlp.proj", cfg.mlp_hidden))
            if cfg.mlp == "gelu":
                (u,) = ctx.saved[f"{p}.act"]
                du = r(ops.activations.gelu_backward(dg, u, **ws("du", dg.shape)))  # consumed by the fc's backward
                dn2 = _lin_bwd(ops, cfg, params, f"{p}.mlp.fc", du, ctx, B, T, grads, dx("mlp.fc", C))
            else:
                ga, up = ctx.saved[f"{p}.act"]
                o_da, o_db = (ws(name, dg.shape).get("out") for name in ("dga", "dup"))  # consumed in this layer
                outs = {"out": (o_da, o_db)} if o_da is not None else {}
                dga, dup = (r(d) for d in ops.activations.swiglu_backward(dg, ga, up, **outs))
                dn2 = r(
                    _add(
                        ops,
                        _lin_bwd(ops, cfg, params, f"{p}.mlp.gate", dga, ctx, B, T, grads, dx("mlp.gate", C)),
                        _lin_bwd(ops, cfg, params, f"{p}.mlp.up", dup, ctx, B, T, grads, dx("mlp.up", C)),
                    )
                )
            dh = r(_add(ops, dh, _norm_bwd(ops, cfg, params, f"{p}.ln2", dn2, ctx, f"{p}.ln2", grads)))
            # h = add(h, a)
            do = _lin_bwd(ops, cfg, params, f"{p}.attn.proj", dh, ctx, B, T, grads, dx("attn.proj", C))
            q, k, v, att = ctx.saved[f"{p}.attn"]
            do4 = A.split_heads(do, 0, B, T, NH, HS)
            dq, dk, dv = (r(d) for d in ops.attention.attention_backward(do4, q, k, v, att))
            if not self.learned:
                dq = r(ops.rope.rope_backward(dq, self.cos, self.sin))
                dk = r(ops.rope.rope_backward(dk, self.cos, self.sin))
            dqkv = A.merge_heads([dq, dk, dv], B, T, NH, HS)
            dn1 = _lin_bwd(ops, cfg, params, f"{p}.attn.qkv", dqkv, ctx, B, T, grads, dx("attn.qkv", C))
            dh = r(_add(ops, dh, _norm_bwd(ops, cfg, params, f"{p}.ln1", dn1, ctx, f"{p}.ln1", grads)))
        if self.spares is not None:  # a dead gradient of an earlier micro-batch (or a new array)
            emb_out = {"out": self.spares.take("wte", (V, C))}
        else:  # tied: a temporary until the sum below
            emb_out = ws("dwte", (V, C)) if cfg.tied else {}
        dwte = ops.embedding.embedding_backward(dh.reshape(B, T, cfg.width), tokens, cfg.vocab, **emb_out)
        if self.learned:  # [model.pos.c1] d wpe: [emb.bwd.c1] over the ids p[b, t] = t (b increasing)
            grads["wpe"] = ops.embedding.embedding_backward(dh.reshape(B, T, cfg.width), self.positions(B), cfg.seq_len)
        if cfg.tied and self.spares is not None:  # add(dwte, dhead) over dwte, this pass's own array
            grads["wte"] = ops.elementwise.add_into(dwte, dhead)
        elif cfg.tied:  # parameter gradients stay binary32 ([bf16.tensors.c1])
            grads["wte"] = _add(ops, dwte, dhead)
        else:
            grads["wte"] = dwte
            grads["head.w"] = dhead
        return {k: grads[k] for k in sorted(grads)}

    def _scratch(self, name: str, shape: tuple) -> dict:
        """``{"out": buffer}`` for an op's ``out=``, the workspace buffer of
        ``name``; ``{}`` (a new array) without a workspace."""
        if self.workspace is None:
            return {}
        return {"out": self.workspace.get(name, shape)}

    def loss_and_grads(self, params: dict, tokens: np.ndarray, targets: np.ndarray, grads=None) -> Result:
        """[model.forward.c1] [model.backward.c1] One micro-batch (``grads`` as
        for ``backward``; gradients where the model's tensors live: device
        arrays on a device-resident backend; under "bf16", ``params`` are the
        working copies)."""
        mean, _, ctx = self.forward(params, tokens, targets, scratch=True)
        return Result(mean, self.backward(params, ctx, grads))
