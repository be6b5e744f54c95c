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
a death by signal, a missing output or one of the wrong size fails the case.
dtypes: f32 (binary32), i8, i32, u16, u32, i64, and bf16 (2 bytes: the
upper half of the binary32 bit pattern, [bf16.format.c1]).  Inputs are
exactly the stored vectors, subnormals and NaN payloads included.

The program is treated as untrusted: it runs in a process group of its own,
and the whole group is killed when it exceeds the timeout (default
``TIMEOUT_S``) and after it exits, so a wrapper script's children never
outlive their case.  Its stdout and stderr go to files, of which only the
tail is read, and every file it writes is capped at ``FILE_LIMIT`` bytes
(RLIMIT_FSIZE): a program that floods its output cannot exhaust memory.
"""

from __future__ import annotations

import json
import os
import resource
import shlex
import signal
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from ...errors import InputError
from ..base.case import BF16, DTYPES, dtype_name
from .kernel import Kernel, KernelError, Unsupported
from ..table import OPS

PROTOCOL = "refreplay-exec/1"
EXIT_UNSUPPORTED = 3
TIMEOUT_S = 120.0  # default of `conform --timeout`, per case
FILE_LIMIT = 1 << 30  # bytes any one file the program writes may have
STDERR_TAIL = 2000  # characters of stderr shown with a failure


def write_case(directory: Path, op_name: str, case_id: str, inputs: list[np.ndarray], out_specs: dict) -> dict:
    op = OPS[op_name]
    desc = {"protocol": PROTOCOL, "op": op_name, "case": case_id, "inputs": [], "outputs": []}
    lines = [f"op {op_name}", f"case {case_id}"]
    for name, a in zip(op.inputs, inputs):
        fname = f"in_{name}.bin"
        (directory / fname).write_bytes(np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<")).tobytes())
        dt = BF16 if f"in/{name}" in op.bf16 else dtype_name(a)
        desc["inputs"].append({"name": name, "dtype": dt, "shape": list(a.shape), "file": fname})
        lines.append(f"input {name} {dt} {a.ndim} {' '.join(map(str, a.shape))} {fname}".replace("  ", " "))
    for name, (dt, shape) in out_specs.items():
        fname = f"out_{name}.bin"
        desc["outputs"].append({"name": name, "dtype": dt, "shape": list(shape), "file": fname})
        lines.append(f"output {name} {dt} {len(shape)} {' '.join(map(str, shape))} {fname}".replace("  ", " "))
    (directory / "case.json").write_text(json.dumps(desc, indent=1) + "\n")
    (directory / "case.txt").write_text("\n".join(lines) + "\n")
    return desc


def _limit_files():  # runs in the child between fork and exec
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))


def _kill_group(pgid: int):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is already gone


def _tail(path: Path) -> str:
    with open(path, "rb") as fh:
        fh.seek(max(0, fh.seek(0, os.SEEK_END) - STDERR_TAIL))
        text = fh.read().decode(errors="replace").strip()
    return "\n".join("      | " + line for line in text.splitlines()) if text else "      (nothing on stderr)"


def exit_text(status: int) -> str:
    """What a non-zero wait status means, signals named."""
    if status < 0:
        try:
            return f"killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"
    text = f"exit status {status}"
    if status > 128:
        try:  # a shell reports a child's death by signal N as 128 + N
            text += f" (a shell's way of saying a child was killed by {signal.Signals(status - 128).name})"
        except ValueError:
            pass
    return text


class ExecKernel(Kernel):
    def __init__(self, command: str, timeout: float = TIMEOUT_S):
        if not timeout > 0:
            raise InputError(f"exec: the timeout must be a positive number of seconds, not {timeout}")
        self.timeout = timeout
        self.name = f"exec:{command}"
        try:
            self.argv = shlex.split(command)
        except ValueError as exc:
            raise InputError(f"exec: cannot parse command {command!r}: {exc}") from None
        if not self.argv:
            raise InputError("exec: empty command")

    def call(self, op_name, inputs, out_specs):
        return self.call_case(op_name, inputs, out_specs, "case")

    def call_case(self, op_name, inputs, out_specs, case_id):
        with tempfile.TemporaryDirectory(prefix="refreplay-case-") as tmp:
            d = Path(tmp) / "case"
            d.mkdir()
            desc = write_case(d, op_name, case_id, inputs, out_specs)
            status = self._execute(d, Path(tmp))
            if status == EXIT_UNSUPPORTED:
                raise Unsupported(f"{self.name} does not implement {op_name} (exit {EXIT_UNSUPPORTED})")
            if status != 0:
                raise KernelError(f"{exit_text(status)}; stderr:\n{_tail(Path(tmp) / 'stderr')}")
            outs = []
            for o in desc["outputs"]:
                path = d / o["file"]
                if not path.is_file():
                    raise KernelError(f"the program wrote no {o['file']}")
                dt = DTYPES[o["dtype"]].newbyteorder("<")
                n = int(np.prod(o["shape"], dtype=np.int64))
                size = path.stat().st_size
                if size != n * dt.itemsize:  # checked before reading: the file may be huge
                    raise KernelError(f"{o['file']} has {size} bytes, expected {n * dt.itemsize}")
                data = path.read_bytes()
                outs.append(np.frombuffer(data, dtype=dt).astype(dt.newbyteorder("=")).reshape(o["shape"]))
            return tuple(outs)

    def _execute(self, case_dir: Path, log_dir: Path) -> int:
        """Run the program on one case directory; its wait status.  The
        process group is killed whole on timeout and after the program ends."""
        with open(log_dir / "stdout", "wb") as out, open(log_dir / "stderr", "wb") as err:
            try:
                proc = subprocess.Popen(
                    self.argv + [str(case_dir)],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,
                    preexec_fn=_limit_files,
                )
            except FileNotFoundError:
                raise InputError(f"exec: program not found: {self.argv[0]}") from None
            except PermissionError:
                raise InputError(f"exec: program not executable: {self.argv[0]}") from None
            try:
                status = proc.wait(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                _kill_group(proc.pid)
                proc.wait()
                raise KernelError(
                    f"timed out after {self.timeout:g} s (--timeout); killed its process group; "
                    f"stderr:\n{_tail(log_dir / 'stderr')}"
                ) from None
            finally:
                _kill_group(proc.pid)  # children it left behind; the group id is the child's pid
        return status
