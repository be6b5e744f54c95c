"""What a conformance case is, the probe families, and how an expected
output is computed.

A case is one call of one op: named input tensors, the expected output
tensors (computed by the reference), the probe family it belongs to, the
property it probes and the spec clauses it checks.  Families are what the
diagnosis reasons about: a kernel that fails every ``fma`` case and passes
every ``order`` case contracts multiply-adds but sums in the spec's order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

# family -> (property probed, clauses it checks beyond the op's own)
FAMILIES = {
    "random": ("random inputs at this shape", ()),
    "edge": (
        "edge-value grid: exponent classes x significand patterns, +-0, subnormals, "
        "FLT_MIN neighbours, max finite, +-inf, NaNs",
        (),
    ),
    "fma": (
        "fused multiply-add: the rounded products cancel exactly, a contracted a*b+c leaves +-2^-24 (scaled)",
        ("num.nofma.c1",),
    ),
    "order": (
        "summation order: reversed, pairwise, blocked/split-k and strided-lane "
        "(SIMD/warp butterfly) sums all give other bits; products are exact so "
        "a fused multiply-add cannot matter",
        (),
    ),
    "ftz_before_rounding": (
        "products whose exact value is 2^-126 (1 - d), 0 < d <= 2^-25: "
        "IEEE rounding gives FLT_MIN, as does x86 FTZ; flush-to-zero with "
        "tininess detected before rounding (ARM FZ) gives 0",
        ("num.flush.c1",),
    ),
    "ftz_after_rounding": (
        "products whose exact value is 2^-126 (1 - d), 2^-25 < d <= 2^-24: "
        "IEEE rounding gives FLT_MIN; flush-to-zero with tininess detected "
        "on the result rounded with an unbounded exponent (x86 MXCSR.FTZ) "
        "gives 0, as does ARM FZ",
        ("num.flush.c1",),
    ),
    "flush": ("results that are subnormal after rounding must become a zero of the same sign", ("num.flush.c1",)),
    "input_zeroing": ("subnormal inputs must be zeroed when loaded; keeping them changes the output", ("num.load.c1",)),
    "nan": ("non-canonical NaN inputs and NaN-producing operations: every NaN output is 0x7FC00000", ("num.nan.c1",)),
    "signed_zero": ("sign of zero: sums of -0 terms start from -0; max/min of +-0", ()),
    "vendor_transcendental": (
        "inputs where the spec's algorithm and the correctly rounded "
        "value differ: a libm, NumPy or CUDA function gives other bits",
        (),
    ),
    "empty": (
        "reductions over zero terms: the empty sum is +0, not the -0 a sum starts from; the empty maximum is -inf",
        ("red.sum.c1",),
    ),
    "sweep": (
        "thin-but-long shapes: reductions of length up to 65,537 (131,071 for int8, T = 1,024 "
        "for attention); a kernel that changes algorithm with shape (split-K, a blocked or online "
        "softmax, tiling) passes the short cases and fails here",
        (),
    ),
    "tf32": (
        "fp32 inputs with low significand bits: rounding them to TF32 (10 bits) or "
        "bfloat16 (7 bits) inside the matmul changes the output",
        ("num.format.c1",),
    ),
    # [bf16.probes.c1]: each checked against its misreading by table.bf16.check_probe
    "bf16_rounding": (
        "binary32 results at and beside ties: truncation and ties away from zero give "
        "other bf16 bits than round to nearest even",
        ("bf16.round.c1", "bf16.probes.c1"),
    ),
    "bf16_accumulation": (
        "sums of exact bf16 products, exact in binary32 in every order, whose partial "
        "sums are not bf16 values: an accumulator rounded to bf16 gives other bits",
        ("bf16.matmul.c1", "bf16.probes.c1"),
    ),
    "bf16_input_zeroing": (
        "bf16 subnormal inputs whose zeroing changes the result",
        ("bf16.load.c1", "bf16.probes.c1"),
    ),
    "bf16_intermediate": (
        "an internal value (probability, normalised value, exponential) rounded to bf16 before use changes the result",
        ("bf16.ops.c1", "bf16.probes.c1"),
    ),
}


def untile(pattern: np.ndarray, shape) -> np.ndarray:
    """[conf.vectors.c2] The tensor of ``shape`` whose flat element i is pattern[i mod P]."""
    n = int(np.prod(shape, dtype=np.int64))
    reps = -(-n // pattern.size)
    return np.ascontiguousarray(np.tile(pattern.reshape(-1), reps)[:n].reshape(shape))


def causal_count(shape) -> int:
    """[conf.vectors.c3] Elements a causal tensor of ``shape`` [..., T, T] stores: T (T + 1) / 2
    for each of its leading indices."""
    t = int(shape[-1])
    return int(np.prod(shape[:-2], dtype=np.int64)) * t * (t + 1) // 2


def pack_causal(a: np.ndarray) -> np.ndarray | None:
    """[conf.vectors.c3] The elements (t, s) with s <= t of every [T, T] matrix of ``a``, in
    row-major order; None unless every element above the diagonal is +0 (all bits zero)."""
    t = a.shape[-1]
    m = np.ascontiguousarray(a).reshape(int(np.prod(a.shape[:-2], dtype=np.int64)), t, t)
    upper = np.triu_indices(t, 1)
    if np.ascontiguousarray(m[:, upper[0], upper[1]]).view(np.uint8).any():
        return None
    lower = np.tril_indices(t)
    return np.ascontiguousarray(m[:, lower[0], lower[1]].reshape(-1))


def unpack_causal(packed: np.ndarray, shape) -> np.ndarray:
    """[conf.vectors.c3] The tensor of ``shape`` [..., T, T] whose elements s <= t are the
    stored ones in row-major order and whose elements s > t are +0."""
    t = int(shape[-1])
    m = np.zeros((int(np.prod(shape[:-2], dtype=np.int64)), t, t), packed.dtype)
    lower = np.tril_indices(t)
    m[:, lower[0], lower[1]] = packed.reshape(len(m), t * (t + 1) // 2)
    return m.reshape(shape)


class Tiled(Mapping):
    """[conf.vectors.c2, c3, c4] A loaded case's tensors (name -> array) whose
    tiled or causal ones are kept as they are stored (a pattern, a lower
    triangle), and whose hashed outputs are kept as nothing, each made whole
    on each access, never kept whole: a reader holds the stored form of every
    case and the whole tensors only of the case it runs."""

    def __init__(self, stored: dict[str, np.ndarray], shapes: dict[str, tuple], causal=frozenset(), made=None):
        self._stored = stored  # name -> the array, or for a tiled tensor its pattern
        self._shapes = shapes  # name -> whole shape, for the tiled, causal and hashed tensors only
        self._causal = causal  # names of the causal tensors
        # [conf.vectors.c4] name -> (its sha256, how the hashed output is recomputed)
        self._made = made or {}

    def sha256(self, name: str) -> str:
        """[conf.vectors.c4] The manifest's sha256 of hashed output ``name``."""
        return self._made[name][0]

    def __getitem__(self, name: str) -> np.ndarray:
        if name in self._made:
            return self._made[name][1]()
        a = self._stored[name]
        if name in self._causal:
            return unpack_causal(a, self._shapes[name])
        return untile(a, self._shapes[name]) if name in self._shapes else a

    def __iter__(self):
        return iter(self._stored)

    def __len__(self) -> int:
        return len(self._stored)

    def shape(self, name: str) -> tuple:
        return tuple(self._shapes.get(name, self._stored[name].shape))

    def dtype(self, name: str) -> np.dtype:
        return self._stored[name].dtype


def _meta(tensors, name):
    """(dtype, shape) of tensor ``name`` without making a tiled one whole."""
    if isinstance(tensors, Tiled):
        return tensors.dtype(name), tensors.shape(name)
    a = tensors[name]
    return a.dtype, a.shape


@dataclass
class Case:
    id: str
    op: str
    family: str
    probes: str
    clauses: list[str]
    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    # tensors ("in/NAME", "out/NAME") that hold bf16 bit patterns as uint16 ([bf16.format.c1])
    bf16: frozenset[str] = frozenset()
    # [conf.vectors.c2] tensors ("in/NAME", "out/NAME") stored as their first P elements, tiled to
    # their shape: key -> P.  Every array read from ``inputs`` and ``outputs`` is whole; a loaded
    # case keeps only the pattern (``Tiled``), so its whole tensors exist only while it runs.
    tiles: dict[str, int] = field(default_factory=dict)
    # [conf.vectors.c3] tensors ("in/NAME", "out/NAME") [..., T, T] stored as their lower triangles
    causal: frozenset[str] = frozenset()
    # [conf.vectors.c4] outputs ("out/NAME") held by their sha256 only, not in the file
    hashed: frozenset[str] = frozenset()

    def dtype(self, key: str) -> str:
        """The dtype name of tensor ``key`` ("in/NAME" or "out/NAME"): "bf16"
        for a bf16 tensor, else the name of its array's dtype."""
        kind, _, name = key.partition("/")
        dt, _ = _meta(self.inputs if kind == "in" else self.outputs, name)
        return BF16 if key in self.bf16 else DTYPE_NAMES[np.dtype(dt)]

    def shape(self, key: str) -> tuple:
        """The shape of tensor ``key``, without making a tiled one whole."""
        kind, _, name = key.partition("/")
        return tuple(_meta(self.inputs if kind == "in" else self.outputs, name)[1])


DTYPE_NAMES = {
    np.dtype(np.float32): "f32",
    np.dtype(np.int8): "i8",
    np.dtype(np.int32): "i32",
    np.dtype(np.uint16): "u16",
    np.dtype(np.int64): "i64",
    np.dtype(np.uint32): "u32",
}
BF16 = "bf16"  # carried as uint16 bit patterns; a tensor's dtype name says which uint16 tensors are bf16
DTYPES = {**{v: k for k, v in DTYPE_NAMES.items()}, BF16: np.dtype(np.uint16)}


def dtype_name(a: np.ndarray) -> str:
    return DTYPE_NAMES[np.dtype(a.dtype)]


def load_inputs(inputs) -> list[np.ndarray]:
    """[num.load.c1] what the reference does to every float32 tensor it is
    given: zero subnormals, canonicalise NaNs.  Other dtypes pass unchanged."""
    from ...numerics import load

    return [load(x) if x.dtype == np.float32 else np.ascontiguousarray(x) for x in inputs]


def as_outputs(result, names) -> dict[str, np.ndarray]:
    if not isinstance(result, (tuple, list)):
        result = (result,)
    if len(result) != len(names):
        raise ValueError(f"expected {len(names)} outputs ({', '.join(names)}), got {len(result)}")
    return {n: np.ascontiguousarray(r) for n, r in zip(names, result)}
