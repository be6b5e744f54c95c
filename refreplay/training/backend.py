"""Where a training step's arithmetic runs: the CPU reference or the CUDA twin.

The model ([model.forward.c1], [model.backward.c1]), the gradient fold
([fold.tree.c1], [fold.scale.c1]) and the optimiser ([optim.clip.c1],
[optim.adamw.c1]) call their ops through a ``Backend``: a bundle of modules
with the reference's function names and calling conventions (host NumPy
arrays in and out), plus ``arrays``: where the step's tensors live
(``to_device``/``to_host``) and the exact copies between layouts.

* ``cpu``  — ``refreplay.ops``, ``refreplay.numerics.elementwise``,
  ``refreplay.training.treefold`` and ``refreplay.rng``: the reference itself.
* ``cuda`` — ``cuda_backend.host``: every op runs as numba.cuda kernels on
  the GPU (or in numba-cuda's simulator under ``NUMBA_ENABLE_CUDASIM=1``),
  implementing the same clauses, so the same bits come out.

The device is not part of a run's recipe: a step trained on either replays
on the other with the same state root, data hash and chain link.  State
hashing, data loading and checkpoints stay on the host.

On ``cuda`` the step is device-resident: the model and the
step hand device arrays to the ops, which then keep their results on the
device, so parameters, optimizer state, activations and the TreeFold's
gradient sets stay there for the whole step and across steps; what crosses
to the host is what the spec hashes or publishes (the state tensors for the
state root and checkpoints, the loss) plus each micro-batch's tokens and a
few scalars.  On ``cpu`` the same calls are the identity.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from ..errors import InputError

DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class Backend:
    """The op modules one device provides, under the reference's module names."""

    name: str
    embedding: ModuleType
    linear: ModuleType
    norms: ModuleType
    activations: ModuleType
    attention: ModuleType
    loss: ModuleType
    quant: ModuleType
    rope: ModuleType
    optim: ModuleType
    elementwise: ModuleType
    treefold: ModuleType
    rng: ModuleType
    arrays: ModuleType  # where the step's tensors live, and exact copies between layouts
    bf16: ModuleType  # round_f32 / round_inplace of the bf16 profile ([bf16.round.c1])


def _cpu() -> Backend:
    from .. import rng
    from ..numerics import bf16, elementwise
    from ..ops import activations, attention, embedding, linear, loss, norms, optim, quant, rope
    from . import arrays, treefold

    return Backend(
        "cpu",
        embedding,
        linear,
        norms,
        activations,
        attention,
        loss,
        quant,
        rope,
        optim,
        elementwise,
        treefold,
        rng,
        arrays,
        bf16,
    )


def _cuda() -> Backend:
    try:
        from numba import cuda
    except Exception as exc:  # numba-cuda missing or broken
        raise InputError(
            f"--device cuda needs numba-cuda: pip install -e '.[cuda]' ({type(exc).__name__}: {exc})"
        ) from None
    try:
        from cuda_backend._jit import SIMULATOR
        from cuda_backend.host import arrays, bf16, numerics, rng, treefold
        from cuda_backend.host.ops import activations, attention, embedding, linear, loss, norms, optim, quant, rope
    except ImportError as exc:
        raise InputError(
            f"--device cuda needs the cuda_backend package next to refreplay (a source checkout): {exc}"
        ) from None
    if not SIMULATOR and not cuda.is_available():
        raise InputError(
            "--device cuda: no usable CUDA GPU or driver on this machine "
            "(numba.cuda.is_available() is False); set NUMBA_ENABLE_CUDASIM=1 to run "
            "the same kernels in numba-cuda's simulator (slow)"
        )
    return Backend(
        "cuda",
        embedding,
        linear,
        norms,
        activations,
        attention,
        loss,
        quant,
        rope,
        optim,
        numerics,
        treefold,
        rng,
        arrays,
        bf16,
    )


_CACHE: dict[str, Backend] = {}


def get(device: str | Backend | None = None) -> Backend:
    """The backend of ``device`` ("cpu", the default, or "cuda"); InputError
    (exit 2) when the device is unknown or cannot run here."""
    if isinstance(device, Backend):
        return device
    device = "cpu" if device is None else device
    if device not in DEVICES:
        raise InputError(f"--device must be one of {', '.join(DEVICES)}, got {device!r}")
    if device not in _CACHE:
        _CACHE[device] = _cpu() if device == "cpu" else _cuda()
    return _CACHE[device]


def describe(device=None) -> str:
    """One line naming where the ops run, for command output and audit
    certificates: "cpu", "cuda (simulator)" or "cuda: <GPU name>, compute
    capability <major>.<minor>"."""
    b = get(device)
    if b.name == "cpu":
        return "cpu"
    from cuda_backend._jit import SIMULATOR

    if SIMULATOR:
        return "cuda (numba-cuda simulator)"
    from numba import cuda

    dev = cuda.get_current_device()
    name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
    major, minor = dev.compute_capability
    return f"cuda: {name}, compute capability {major}.{minor}"


def add_argument(parser) -> None:
    """The ``--device`` option of the commands that compute steps."""
    parser.add_argument(
        "--device",
        choices=DEVICES,
        default="cpu",
        help="where the step's ops run: cpu (the reference, default) or cuda (the "
        "cuda_backend twin on a GPU, or in numba-cuda's simulator under "
        "NUMBA_ENABLE_CUDASIM=1); the bits are the same",
    )


def availability() -> dict:
    """Which devices ``--device`` can use here, without starting any work:
    {"cpu": "ready", "cuda": "<state and what to do>"} (``refreplay doctor``)."""
    import importlib.util

    out = {"cpu": "ready (the reference)"}
    if importlib.util.find_spec("numba_cuda") is None:
        out["cuda"] = "numba-cuda not installed (pip install -e '.[cuda]')"
        return out
    from importlib.metadata import version

    v = version("numba-cuda")
    try:
        out["cuda"] = f"numba-cuda {v}, " + describe("cuda")
    except InputError:
        out["cuda"] = (
            f"numba-cuda {v}, no usable GPU or driver: --device cuda is refused here "
            "(NUMBA_ENABLE_CUDASIM=1 runs the simulator)"
        )
    return out
