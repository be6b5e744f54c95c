"""Launching a few real torch.distributed processes (gloo, 127.0.0.1) for
the distributed tests: every process has a timeout and is killed at the end."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "torch_gpt" / "train_dist.py"
CORPUS_WORDS = "the of a to in is refreplay tree fold rank bits step loss grad".split()


def corpus(path: Path) -> Path:
    """A small deterministic text corpus (54 KB)."""
    import random

    r = random.Random(1)
    path.write_text(" ".join(r.choice(CORPUS_WORDS) for _ in range(12000)))
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(extra=None) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="1")
    env.update(extra or {})
    return env


def torchrun(ranks: int, *args, timeout: float = 300) -> subprocess.CompletedProcess:
    """``torchrun --nproc-per-node R SCRIPT ARGS`` as a user runs it."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(ranks),
        "--max-restarts",
        "0",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        str(SCRIPT),
        *map(str, args),
    ]
    return subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=timeout)


_WARM = []


def warm(tmp: Path, text: Path) -> None:
    """Once per session: one process runs a step first, so that the
    compiled kernels are in the on-disk cache before several ranks start
    at once (each would compile them all by itself on a cold cache)."""
    if not _WARM:
        res = ranks(1, "--out", tmp / "warm", "--steps", 1, "--data", text, timeout=900)
        assert res[0][0] == 0, res
        _WARM.append(True)


def ranks(
    world: int, *args, script: Path = SCRIPT, timeout: float = 300, grace: float = 5
) -> list[tuple[int, str, str]]:
    """One process per rank (RANK, WORLD_SIZE, MASTER_* set as torchrun sets
    them), without torchrun's agent, so a survivor's own error is seen;
    returns (exit status, stdout, stderr) per rank.  Every process still
    alive at the timeout, or ``grace`` seconds after another rank failed,
    is killed (its status is then -9)."""
    port = free_port()
    procs = []
    for q in range(world):
        env = _env(
            {
                "RANK": str(q),
                "LOCAL_RANK": str(q),
                "WORLD_SIZE": str(world),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
            }
        )
        files = (tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+"))  # no pipe can fill up
        procs.append(
            (
                subprocess.Popen(
                    [sys.executable, str(script), *map(str, args)], env=env, stdout=files[0], stderr=files[1], text=True
                ),
                files,
            )
        )
    import time

    deadline = time.monotonic() + timeout
    failed_at = None
    while any(p.poll() is None for p, _ in procs) and time.monotonic() < deadline:
        if failed_at is None and any(p.poll() not in (None, 0) for p, _ in procs):
            failed_at = time.monotonic()  # as torchrun's agent: a failed rank ends the job
        if failed_at is not None and time.monotonic() > failed_at + grace:
            break
        time.sleep(0.1)
    out = []
    for p, files in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
        text = []
        for f in files:
            f.seek(0)
            text.append(f.read())
            f.close()
        out.append((p.returncode, *text))
    return out
