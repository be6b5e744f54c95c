"""Running the command line inside the test process (compiled code already loaded)."""

import contextlib
import io
import subprocess

from refreplay.cli import main


def run_cli(*args) -> subprocess.CompletedProcess:
    """``refreplay ARGS...`` in this process: (args, exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([str(a) for a in args])
    return subprocess.CompletedProcess(args, rc, out.getvalue(), err.getvalue())
