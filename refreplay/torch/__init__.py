"""Bring your own PyTorch model: modules, functions and an optimizer whose
bits are the spec's (docs/torch.md).

    refreplay.torch.functional  autograd Functions over the reference ops
                                (linear, norms, embedding, activations, rope,
                                causal attention, softmax, cross-entropy,
                                the residual add and fork)
    refreplay.torch.nn          drop-in modules built on them
    refreplay.torch.optim       AdamW, clip_grad_norm_, the LR schedule
    refreplay.torch.fold        TreeFold of micro-batch gradients, the
                                training state (out and back in), its hash
                                and chain link
    refreplay.torch.convert     swap supported submodules in place
    refreplay.torch.guard       refuse any PyTorch arithmetic the spec does
                                not define, at run time

Every forward and backward calls the reference kernels (``refreplay.ops``)
on CPU tensors and the CUDA twin (``cuda_backend.host``) on CUDA tensors;
an input the spec does not cover raises ``Unsupported``, never falls back
to PyTorch's own kernel.

PyTorch is an optional dependency (the ``torch`` extra): ``import
refreplay`` never imports it, and this package says so clearly when it is
missing.
"""

from __future__ import annotations

try:
    import torch as _torch  # noqa: F401  (absolute import: the real PyTorch)
except ImportError as exc:  # pragma: no cover - exercised in a venv without torch
    raise ImportError(
        "refreplay.torch needs PyTorch: pip install 'refreplay[torch]' "
        f"(or any torch build with float32 CPU tensors); {exc}"
    ) from None

from . import functional, nn, optim  # noqa: E402
from ._bridge import Unsupported, load_  # noqa: E402
from .convert import ConversionError, ConvertReport, convert  # noqa: E402
from .fold import GradFold, chain_link, fold_ranks, load_state, train_state  # noqa: E402
from .guard import guard  # noqa: E402

__all__ = [
    "functional",
    "nn",
    "optim",
    "Unsupported",
    "load_",
    "convert",
    "ConvertReport",
    "ConversionError",
    "GradFold",
    "fold_ranks",
    "train_state",
    "load_state",
    "chain_link",
    "guard",
]
