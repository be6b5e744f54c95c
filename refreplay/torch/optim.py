"""AdamW, global gradient-norm clipping and the learning-rate schedule of
``spec/15-optim.txt`` on torch parameters, computed by the reference
(``refreplay.ops.optim``) or its CUDA twin, in place.

Hyper-parameters are binary32 values, refused when a Python number is not
exactly a binary32 ([step.hparams.c1], ``ops.check_scalar_f32``): write
``np.float32(0.9)`` to mean the binary32 nearest 0.9.  PyTorch's own
defaults (betas (0.9, 0.999), eps 1e-8, weight decay 1e-2) are not binary32
and are not used; the defaults here are the reference's.

Clipping sums the per-tensor squared norms in sorted *name* order
([optim.clip.c1]), so it takes named parameters: the names you publish in
the state ([step.state.c1]).
"""

from __future__ import annotations

import numpy as np
import torch

from ..ops import optim as ref_optim
from ._bridge import Unsupported, backend_of, eager, f32_scalar, from_numpy, inside_reference, named_tensors, to_numpy

_DEFAULTS = ref_optim.AdamW()  # beta1 f32(0x3F666666), beta2 f32(0x3F733333), eps, weight decay


def _write_back(t: torch.Tensor, a: np.ndarray) -> None:
    """After an in-place update of ``a``: nothing to do when ``a`` is ``t``'s
    own memory (a contiguous CPU tensor), else copy the bits back."""
    if t.device.type != "cpu" or a.ctypes.data != t.data_ptr():
        with torch.no_grad():
            t.copy_(from_numpy(a, t))


class AdamW(torch.optim.Optimizer):
    """[optim.adamw.c1] [optim.adamw.bias.c1] AdamW with the spec's update.

    ``lr`` is required (set it each step from ``LRSchedule``); betas, eps and
    weight_decay default to the reference's binary32 values.  Use two
    parameter groups, weight_decay 0 for tensors with one axis, as
    [step.hparams.c1] does.  The state of a parameter holds ``step`` (the t
    of the bias corrections: the training step number, an int),
    ``exp_avg`` (m) and ``exp_avg_sq`` (v), float32 like the parameter.
    No amsgrad, maximize, foreach, fused or capturable variants.
    """

    def __init__(
        self,
        params,
        lr,
        betas=(_DEFAULTS.beta1, _DEFAULTS.beta2),
        eps=_DEFAULTS.eps,
        weight_decay=_DEFAULTS.weight_decay,
        *,
        amsgrad=False,
        maximize=False,
        foreach=None,
        capturable=False,
        differentiable=False,
        fused=None,
    ):
        for name, given, covered in (
            ("amsgrad", amsgrad, False),
            ("maximize", maximize, False),
            ("foreach", foreach, None),
            ("capturable", capturable, False),
            ("differentiable", differentiable, False),
            ("fused", fused, None),
        ):
            if given != covered:
                raise Unsupported(f"AdamW: {name}={given!r} is not covered by the spec")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)
        for group in self.param_groups:
            self._hparams(group)
            for p in group["params"]:
                if p.dtype != torch.float32:
                    raise Unsupported(f"AdamW: parameters must be float32, got {p.dtype}")

    @staticmethod
    def _hparams(group) -> tuple:
        """(lr, AdamW hyper-parameters) of a group as binary32, refused
        when a value is not exactly a binary32."""
        if len(group["betas"]) != 2:
            raise Unsupported(f"AdamW: betas must be two values, got {group['betas']!r}")
        lr = f32_scalar("lr", group["lr"])
        hp = ref_optim.AdamW(
            f32_scalar("beta1", group["betas"][0]),
            f32_scalar("beta2", group["betas"][1]),
            f32_scalar("eps", group["eps"]),
            f32_scalar("weight_decay", group["weight_decay"]),
        )
        return lr, hp

    @eager
    @torch.no_grad()
    def step(self, closure=None):
        """One update of every parameter that has a gradient, in place."""
        if closure is not None:
            raise Unsupported("AdamW.step: closures are not covered (compute the loss before the step)")
        for group in self.param_groups:
            lr, hp = self._hparams(group)
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
                state["step"] = int(state["step"]) + 1
                ops = backend_of(p, p.grad, state["exp_avg"], state["exp_avg_sq"])
                with inside_reference():
                    pn, g = to_numpy("param", p), to_numpy("grad", p.grad)
                    m, v = to_numpy("exp_avg", state["exp_avg"]), to_numpy("exp_avg_sq", state["exp_avg_sq"])
                    ops.optim.adamw_step({"p": pn}, {"p": g}, {"p": m}, {"p": v}, step=state["step"], lr=lr, hp=hp)
                    _write_back(p, pn)
                    _write_back(state["exp_avg"], m)
                    _write_back(state["exp_avg_sq"], v)
        return None


@eager
def clip_grad_norm_(named_parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None):
    """[optim.clip.c1] Global-norm clipping of the gradients, in place.
    The squared norms of the tensors are summed in sorted name order.
    Returns (norm, coef) as binary32 numbers; the gradients were scaled by
    coef exactly when coef < 1."""
    if norm_type != 2.0 or error_if_nonfinite or foreach is not None:
        raise Unsupported("clip_grad_norm_: only the 2-norm, without error_if_nonfinite or foreach, is covered")
    named = named_tensors(named_parameters, "clip_grad_norm_")
    missing = sorted(k for k, p in named.items() if p.grad is None)
    if missing:
        raise Unsupported(f"clip_grad_norm_: no gradient for {missing[:5]}: every named tensor takes part")
    grads = {k: named[k].grad for k in sorted(named)}
    ops = backend_of(*grads.values())
    with inside_reference():
        arrays = {k: to_numpy(f"grad of {k}", g) for k, g in grads.items()}
        norm, coef = ops.optim.clip_grad_norm(arrays, f32_scalar("max_norm", max_norm))
        for k in sorted(grads):
            _write_back(grads[k], arrays[k])
    return np.float32(norm), np.float32(coef)


class LRSchedule:
    """[optim.lr.c1] Linear warmup, then "cosine" or "linear" decay to lr_min
    at step ``total``, or "constant".  Like torch's schedulers: building it
    sets every group's lr to that of update 1; ``step()`` after each
    ``optimizer.step()`` sets the lr of the next update."""

    def __init__(
        self, optimizer: AdamW, warmup: int, total: int, lr_max, lr_min, kind: str = "cosine", next_update: int = 1
    ):
        """``next_update``: the number of the update the optimizer makes next
        (state.step + 1 when resuming from a checkpoint)."""
        self.optimizer = optimizer
        self.args = (int(warmup), int(total), f32_scalar("lr_max", lr_max), f32_scalar("lr_min", lr_min), kind)
        self.next_update = int(next_update)
        self._apply()

    def lr_at(self, n: int) -> np.float32:
        """[optim.lr.c1] The binary32 learning rate of update n (1-based)."""
        warmup, total, lr_max, lr_min, kind = self.args
        try:
            return ref_optim.lr_at(n, warmup, total, lr_max, lr_min, kind)
        except ValueError as exc:
            raise Unsupported(f"LRSchedule: {exc}") from None

    def _apply(self):
        lr = self.lr_at(self.next_update)
        for group in self.optimizer.param_groups:
            group["lr"] = float(lr)  # a Python float that is exactly the binary32

    def step(self):
        self.next_update += 1
        self._apply()

    def get_last_lr(self) -> list[float]:
        return [g["lr"] for g in self.optimizer.param_groups]


__all__ = ["AdamW", "clip_grad_norm_", "LRSchedule"]
