"""The exec protocol ([conf.exec.c1]): check a kernel written in any
language, no bindings.

For every case the runner makes a fresh directory holding
  case.json        {"protocol": "refreplay-exec/1", "op": ..., "case": ...,
                    "inputs":  [{"name", "dtype", "shape", "file"}, ...],
                    "outputs": [{"name", "dtype", "shape", "file"}, ...]}
  case.txt         the same, one line per item, for readers without JSON:
                     op NAME
                     case ID
                     input NAME DTYPE NDIM D0 D1 ... FILE
                     output NAME DTYPE NDIM D0 D1 ... FILE
  in_<name>.bin    each input: raw little-endian, row-major, no header
and runs ``COMMAND DIR`` (COMMAND split like a shell command line, the
directory appended as the last argument).  The program writes each output
as ``out_<name>.bin`` in the same raw format and exits 0.  Exit status 3
means "op not implemented" (the case is skipped); any other non-zero status,
a missing output or one of the wrong size fails the case.  dtypes: f32
(binary32), i8, i32, u16, u32, i64.  Inputs are exactly the stored vectors,
subnormals and NaN payloads included.
"""
from __future__ import annotations

import json
import shlex
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from ..errors import InputError
from .cases import DTYPES, dtype_name
from .kernels import Kernel, KernelError, Unsupported
from .registry import OPS

PROTOCOL = "refreplay-exec/1"
EXIT_UNSUPPORTED = 3
TIMEOUT_S = 120


def write_case(directory: Path, op_name: str, case_id: str, inputs: list[np.ndarray], out_specs: dict) -> dict:
    op = OPS[op_name]
    desc = {"protocol": PROTOCOL, "op": op_name, "case": case_id, "inputs": [], "outputs": []}
    lines = [f"op {op_name}", f"case {case_id}"]
    for name, a in zip(op.inputs, inputs):
        fname = f"in_{name}.bin"
        (directory / fname).write_bytes(np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<")).tobytes())
        desc["inputs"].append({"name": name, "dtype": dtype_name(a), "shape": list(a.shape), "file": fname})
        lines.append(f"input {name} {dtype_name(a)} {a.ndim} {' '.join(map(str, a.shape))} {fname}".replace("  ", " "))
    for name, (dt, shape) in out_specs.items():
        fname = f"out_{name}.bin"
        desc["outputs"].append({"name": name, "dtype": dt, "shape": list(shape), "file": fname})
        lines.append(f"output {name} {dt} {len(shape)} {' '.join(map(str, shape))} {fname}".replace("  ", " "))
    (directory / "case.json").write_text(json.dumps(desc, indent=1) + "\n")
    (directory / "case.txt").write_text("\n".join(lines) + "\n")
    return desc


class ExecKernel(Kernel):
    def __init__(self, command: str):
        self.name = f"exec:{command}"
        try:
            self.argv = shlex.split(command)
        except ValueError as exc:
            raise InputError(f"exec: cannot parse command {command!r}: {exc}") from None
        if not self.argv:
            raise InputError("exec: empty command")

    def call(self, op_name, inputs, out_specs):
        with tempfile.TemporaryDirectory(prefix="refreplay-case-") as tmp:
            d = Path(tmp)
            desc = write_case(d, op_name, "case", inputs, out_specs)
            try:
                proc = subprocess.run(self.argv + [str(d)], capture_output=True, timeout=TIMEOUT_S)
            except FileNotFoundError:
                raise InputError(f"exec: program not found: {self.argv[0]}") from None
            except PermissionError:
                raise InputError(f"exec: program not executable: {self.argv[0]}") from None
            except subprocess.TimeoutExpired:
                raise KernelError(f"timed out after {TIMEOUT_S} s") from None
            if proc.returncode == EXIT_UNSUPPORTED:
                raise Unsupported(f"{self.name} does not implement {op_name} (exit {EXIT_UNSUPPORTED})")
            if proc.returncode != 0:
                tail = proc.stderr.decode(errors="replace").strip()[-300:]
                raise KernelError(f"exit status {proc.returncode}: {tail}")
            outs = []
            for o in desc["outputs"]:
                path = d / o["file"]
                if not path.is_file():
                    raise KernelError(f"the program wrote no {o['file']}")
                dt = DTYPES[o["dtype"]].newbyteorder("<")
                data = path.read_bytes()
                n = int(np.prod(o["shape"], dtype=np.int64))
                if len(data) != n * dt.itemsize:
                    raise KernelError(f"{o['file']} has {len(data)} bytes, expected {n * dt.itemsize}")
                outs.append(np.frombuffer(data, dtype=dt).astype(dt.newbyteorder("=")).reshape(o["shape"]))
            return tuple(outs)
