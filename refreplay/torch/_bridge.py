"""Tensors into and out of the reference kernels: the only place that
touches both PyTorch and NumPy memory.

* CPU tensors: a C-contiguous float32 tensor is handed to the kernel as a
  NumPy view of its own memory (``Tensor.numpy()``, no copy), and the
  kernel's result array becomes the output tensor's memory
  (``torch.from_numpy``, no copy).  A non-contiguous tensor (a transposed
  view, say) is first copied into C order; the copy is exact and counted in
  ``COPIES`` so tests can see when it happens.
* CUDA tensors: the CUDA twin's host entry points (``cuda_backend.host``,
  through ``refreplay.training.backend``) take host NumPy arrays and launch the
  device kernels themselves, so a CUDA tensor is copied to the host, the op
  runs on the GPU, and the result is copied back to the tensor's device.
  Not zero-copy (two host round trips per op), and never run on a GPU in
  this repository's tests: see docs/torch.md, "Limits".
* Anything else (another dtype, a sparse or quantized layout, a device that
  is neither cpu nor cuda, a tensor with subnormal elements or a
  non-canonical NaN) raises ``Unsupported``: the spec defines no result for
  it, so no PyTorch kernel computes one instead.

Threads: each op's kernels run on ``kernel_threads`` Numba threads: one
for an op whose operands hold fewer than ``SMALL_WORK`` values (its
parallel launch would cost more than it saves), else PyTorch's intra-op
count (``torch.get_num_threads()``, whatever the user set) limited to the
cores other processes leave free and to the threads Numba launched
(``refreplay.environ.kernel_threads``: the load is sampled from
/proc/stat at most every 0.25 s); ``REFREPLAY_THREADS=N`` or
``refreplay.environ.set_threads(N)`` fixes the count instead.  Under the
default policy PyTorch's own pool is lowered to the free cores too while
other processes hold some, and given the user's count back when they
leave (``torch_threads``).  Bits never depend on the count (every
``prange`` runs over independent outputs, ``refreplay._jit``).  The
waiting policy of the pool is ``refreplay._env``'s.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

import numba
import numpy as np
import torch

from .. import environ
from ..errors import InputError
from ..training import backend as backends
from ..numerics.core import load as np_load

COPIES = {"in": 0}  # inputs that had to be copied (non-contiguous, or on a GPU)
_STATE = threading.local()
# Numba's workqueue layer (refreplay._env picks it when a spinning OpenMP
# pool was loaded first) aborts the process on two parallel kernels at
# once: ops from several Python threads then take turns.
_ONE_AT_A_TIME = threading.Lock() if numba.config.THREADING_LAYER == "workqueue" else None

_EXP_MASK = np.uint32(0x7F800000)
_ABS_MASK = np.uint32(0x7FFFFFFF)
_CANONICAL_NAN = np.uint32(0x7FC00000)


class Unsupported(ValueError):
    """An input, argument or device that the spec does not cover: refreplay
    will not compute it, and neither will PyTorch in its place."""


SMALL_WORK = environ.SMALL_WORK  # below this many operand elements an op runs on one thread


class _TorchPool:
    """PyTorch's intra-op count as the user left it (``user``: what
    ``torch.get_num_threads()`` said at the first op, or after the user
    changed it since) and the count refreplay last gave it (``given``)."""

    user: int | None = None
    given: int | None = None


_POOL = _TorchPool()


def torch_threads() -> int:
    """Lower PyTorch's own intra-op pool to the free cores while other
    processes hold some, and give the user's count back when they are free
    again or a fixed count is set (``refreplay.environ.policy_free``).
    PyTorch's ops between refreplay's (copies, views' ``contiguous``) then
    do not spin a pool on a core another process needs (measured on a
    2-vCPU EPYC beside one busy process: a nanoGPT-small step 2.72 s with
    torch at 1 thread, 3.33 s at 2, refreplay's kernels on 1 thread in
    both; benchmarks/results/threads-amd-epyc.json).  A count the user sets meanwhile is the new ceiling.  Returns
    the user's count: what refreplay's kernels may use at most."""
    now = torch.get_num_threads()
    if now != _POOL.given:  # the first op, or the user set a count since
        _POOL.user = now
    free = environ.policy_free()
    want = _POOL.user if free is None else max(1, min(_POOL.user, free))
    if want != now:
        torch.set_num_threads(want)
    _POOL.given = want
    return _POOL.user


def kernel_threads(elements: int, wanted: int | None = None) -> int:
    """Numba threads for an op whose operands hold ``elements`` values: 1
    below ``SMALL_WORK``, else ``refreplay.environ.kernel_threads`` of
    ``wanted`` (the user's PyTorch intra-op count, ``torch_threads``; the
    user's fixed count instead where there is one, else capped by the free
    cores), never more than Numba launched (``NUMBA_NUM_THREADS``)."""
    if elements < SMALL_WORK:
        return 1
    if wanted is None:
        now = torch.get_num_threads()
        wanted = _POOL.user if now == _POOL.given else now
    return environ.kernel_threads(wanted, numba.config.NUMBA_NUM_THREADS)


@contextmanager
def inside_reference():
    """Marks the running thread as inside a refreplay op, so that
    ``refreplay.torch.guard`` lets the op's own tensor plumbing through.
    The outermost one also owns the op's thread count: ``to_numpy`` adds
    each operand's size and sets ``kernel_threads`` of the total; the count
    the caller had is restored on the way out."""
    depth = getattr(_STATE, "depth", 0)
    if depth == 0:
        if _ONE_AT_A_TIME is not None:
            _ONE_AT_A_TIME.acquire()
        _STATE.elements = 0
        _STATE.threads = _STATE.before = numba.get_num_threads()
        _STATE.wanted = torch_threads()
    _STATE.depth = depth + 1
    try:
        yield
    finally:
        _STATE.depth = depth
        if depth == 0:
            if _STATE.threads != _STATE.before:
                numba.set_num_threads(_STATE.before)
            if _ONE_AT_A_TIME is not None:
                _ONE_AT_A_TIME.release()


def _count_operand(a: np.ndarray) -> None:
    """Inside an op: add ``a``'s size to the op's and set its thread count."""
    if getattr(_STATE, "depth", 0) == 0:
        return
    _STATE.elements += a.size
    n = kernel_threads(_STATE.elements, _STATE.wanted)
    if n != _STATE.threads:
        numba.set_num_threads(n)
        _STATE.threads = n


def is_inside() -> bool:
    return getattr(_STATE, "depth", 0) > 0


def backend_of(*tensors):
    """The refreplay backend of the tensors' device: "cpu" -> the reference,
    "cuda" -> the CUDA twin.  All tensors must share one device."""
    devices = {t.device for t in tensors if t is not None}
    if len(devices) != 1:
        raise Unsupported(f"tensors on different devices: {sorted(str(d) for d in devices)}")
    (dev,) = devices
    if dev.type not in ("cpu", "cuda"):
        raise Unsupported(
            f"device {dev} is not covered: refreplay runs on cpu (the reference) or cuda (its numba.cuda twin)"
        )
    try:
        return backends.get(dev.type)
    except InputError as exc:  # numba-cuda missing, no GPU: say so, compute nothing
        raise Unsupported(f"{dev}: {exc}") from None


def _check_loaded(name: str, a: np.ndarray) -> None:
    """[num.load.c1] Operands are already loaded: no subnormal element and
    every NaN canonical.  A tensor from outside (torch's own init, a file)
    must pass through ``load_`` first."""
    bits = a.reshape(-1).view(np.uint32)
    mag = bits & _ABS_MASK
    sub = (mag - np.uint32(1)) < np.uint32(0x007FFFFF)  # 1 <= mag <= 0x007FFFFF (0 - 1 wraps around)
    if sub.any():
        i = int(np.flatnonzero(sub)[0])
        raise Unsupported(
            f"{name} holds a subnormal value (element {i}, bits 0x{int(bits[i]):08X}); "
            "the reference takes loaded tensors only ([num.load.c1]): call "
            "refreplay.torch.load_(tensor) first"
        )
    nan = mag > _EXP_MASK
    if nan.any() and (bits[nan] != _CANONICAL_NAN).any():
        i = int(np.flatnonzero(nan & (bits != _CANONICAL_NAN))[0])
        raise Unsupported(
            f"{name} holds a non-canonical NaN (element {i}, bits 0x{int(bits[i]):08X}); "
            "call refreplay.torch.load_(tensor) first ([num.load.c1])"
        )


def _plain(name: str, t) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise Unsupported(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided:
        raise Unsupported(f"{name}: layout {t.layout} is not covered (dense strided tensors only)")
    if t.is_quantized or t.is_complex() or t.is_conj() or t.is_neg():
        raise Unsupported(f"{name}: quantized, complex or lazily conjugated/negated tensors are not covered")
    return t.detach()


def to_numpy(name: str, t, check_loaded: bool = True) -> np.ndarray:
    """A float32 tensor as a C-contiguous float32 ndarray: its own memory on
    the CPU when it is already C-contiguous, else an exact copy.  Backward
    passes skip the loaded check for the tensors their forward saved (checked
    then; autograd's version counter refuses them if changed since)."""
    t = _plain(name, t)
    if t.dtype != torch.float32:
        raise Unsupported(
            f"{name} must be float32, got {t.dtype}: the spec defines binary32 arithmetic only (no silent cast)"
        )
    a = _host(t)
    if check_loaded:
        _check_loaded(name, a)
    _count_operand(a)
    return a


def tokens_to_numpy(name: str, t) -> np.ndarray:
    """An integer index tensor as C-contiguous int32 (ids are range-checked
    by the op; a value outside int32 is refused here)."""
    t = _plain(name, t)
    if t.dtype not in (torch.int32, torch.int64, torch.int16, torch.uint8, torch.int8):
        raise Unsupported(f"{name} must be an integer tensor, got {t.dtype}")
    a = _host(t)
    if a.dtype != np.int32:
        if a.size and (a.min() < -(2**31) or a.max() >= 2**31):
            raise Unsupported(f"{name} holds values outside int32")
        a = a.astype(np.int32)  # exact: checked to fit
    return a


def _host(t: torch.Tensor) -> np.ndarray:
    if t.device.type == "cpu" and t.is_contiguous():
        return t.numpy()
    COPIES["in"] += 1
    return np.ascontiguousarray(t.contiguous().cpu().numpy())


def from_numpy(a: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    """The result array as a tensor on ``like``'s device (its memory on the CPU)."""
    out = torch.from_numpy(a if a.flags.c_contiguous else np.ascontiguousarray(a))  # keeps 0-d as 0-d
    return out if like.device.type == "cpu" else out.to(like.device)


def f32_scalar(name: str, x) -> np.float32:
    """A hyper-parameter or op argument as binary32, refused when the value
    is not exactly a binary32 (the reference's rule, ``ops.check_scalar_f32``):
    pass ``np.float32(x)`` to mean the nearest binary32."""
    from ..ops import check_scalar_f32

    if isinstance(x, torch.Tensor):
        if x.numel() != 1 or x.dtype != torch.float32:
            raise Unsupported(f"{name} must be a binary32 scalar, got a {x.dtype} tensor of shape {tuple(x.shape)}")
        return np.float32(x.item())
    try:
        return check_scalar_f32(name, x)
    except (TypeError, ValueError) as exc:
        raise Unsupported(str(exc)) from None


def named_tensors(named_parameters, what: str) -> dict:
    """{name: tensor} from a dict or (name, tensor) pairs: names, not
    positions, order tensors in the spec ([optim.state.c1])."""
    if isinstance(named_parameters, dict):
        items = list(named_parameters.items())
    else:
        items = list(named_parameters)
    if not all(isinstance(it, tuple) and len(it) == 2 and isinstance(it[0], str) for it in items):
        raise Unsupported(
            f"{what}: pass named parameters (a dict or (name, parameter) pairs): the spec "
            "orders tensors by name ([optim.state.c1]), not by position"
        )
    out = dict(items)
    if len(out) != len(items):
        raise Unsupported(f"{what}: a parameter name occurs twice")
    bad = sorted(k for k, t in out.items() if not isinstance(t, torch.Tensor))
    if bad:
        raise Unsupported(f"{what}: {bad[:5]} are not tensors")
    return out


def eager(fn):
    """Run ``fn`` and everything it calls eagerly, even inside torch.compile:
    Dynamo would otherwise trace the NumPy plumbing into PyTorch kernels
    (measured: it rewrites the loaded check into a torch op), so that a
    compiled graph computed what should be the reference's."""
    return torch.compiler.disable(fn, recursive=True)


def load_(t: torch.Tensor) -> torch.Tensor:
    """[num.load.c1] In place: zero every subnormal element of a float32
    tensor (sign kept) and make every NaN canonical, so the tensor can enter
    the reference (a tensor from torch's own initialisers or from a file).
    Returns ``t``."""
    with inside_reference(), torch.no_grad():
        t.copy_(from_numpy(np_load(to_numpy("tensor", t, check_loaded=False)), t))
    return t
