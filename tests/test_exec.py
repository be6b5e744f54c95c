"""The exec: protocol treats the program as untrusted ([conf.exec.c1]): real
case ids in case.json and case.txt, a timeout that kills the whole process
group, deaths by signal named, the stderr tail and skip reasons reported,
and output floods bounded."""

import sys
import textwrap
import time
from pathlib import Path

import pytest

from refreplay import cli
from refreplay.conformance.running import execproto
from refreplay.conformance.golden import store
from refreplay.conformance.base.case import dtype_name
from refreplay.conformance.running.kernel import KernelError, Unsupported

OP = "embedding_forward"  # the op with the fewest cases: every case spawns the program


def program(tmp_path, name, body):
    """An executable Python program; `exec:` runs it as PROGRAM DIR."""
    path = tmp_path / name
    path.write_text(f"#!{sys.executable}\nimport os, sys, signal, time, json\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return path


def run_one(kernel):
    """The kernel's outputs on the op's first case."""
    c = store.load_cases(store.VECTOR_DIR, {OP})[1][0]
    specs = {n: (dtype_name(a), a.shape) for n, a in c.outputs.items()}
    return kernel.run(c.op, list(c.inputs.values()), specs, c.id)


def _dead(pid):
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in state  # a zombie runs nothing


def test_case_files_carry_the_real_case_id(tmp_path, capsys):
    log = tmp_path / "log"
    prog = program(
        tmp_path,
        "logger",
        f"""
        d = sys.argv[1]
        with open({str(log)!r}, "a") as fh:
            fh.write(json.load(open(os.path.join(d, "case.json")))["case"] + " | ")
            fh.write(open(os.path.join(d, "case.txt")).read().splitlines()[1] + "\\n")
        sys.exit(3)
    """,
    )
    rc = cli.main(["conform", f"exec:{prog}", "--op", OP])
    assert rc == 1  # every case declined: not conformant
    ids = [c["id"] for c in store.read_manifest()["cases"] if c["op"] == OP]
    assert log.read_text().splitlines() == [f"{i} | case {i}" for i in ids]
    out = capsys.readouterr().out
    # the skip reason is in the summary without -v
    assert f"does not implement {OP} (exit 3)" in out and f"{len(ids)} cases" in out


def test_timeout_kills_the_wrapper_and_its_child(tmp_path):
    pids = tmp_path / "pids"
    child = program(
        tmp_path,
        "child",
        f"""
        open({str(pids)!r}, "a").write(f"{{os.getpid()}}\\n")
        time.sleep(600)
    """,
    )
    wrapper = tmp_path / "wrapper.sh"
    wrapper.write_text(f'#!/bin/sh\necho wrapper starting >&2\n{child} "$1"\necho never >&2\n')
    wrapper.chmod(0o755)
    kernel = execproto.ExecKernel(str(wrapper), timeout=5)
    t0 = time.monotonic()
    with pytest.raises(KernelError) as exc:
        run_one(kernel)
    assert time.monotonic() - t0 < 30
    msg = str(exc.value)
    assert "timed out after 5 s" in msg and "wrapper starting" in msg and "never" not in msg
    (pid,) = [int(p) for p in pids.read_text().split()]
    deadline = time.monotonic() + 10
    while not _dead(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _dead(pid), "the hanging grandchild outlived its case"


def test_timeout_option_reaches_the_program(tmp_path, capsys):
    prog = program(tmp_path, "sleeper", "time.sleep(600)\n")
    rc = cli.main(["conform", f"exec:{prog}", "--op", OP, "--timeout", "0.5"])
    out = capsys.readouterr().out
    assert rc == 1 and "timed out after 0.5 s" in out
    assert cli.main(["conform", f"exec:{prog}", "--op", OP, "--timeout", "0"]) == 2


def test_background_children_do_not_outlive_a_finished_case(tmp_path):
    pids = tmp_path / "pids"
    prog = program(
        tmp_path,
        "leaver",
        f"""
        pid = os.fork()
        if pid == 0:
            time.sleep(600)
            os._exit(0)
        open({str(pids)!r}, "a").write(f"{{pid}}\\n")
        sys.exit(3)
    """,
    )
    with pytest.raises(Unsupported):  # the program exits 3: "not implemented" ([conf.exec.c1])
        run_one(execproto.ExecKernel(str(prog)))
    (pid,) = [int(p) for p in pids.read_text().split()]
    deadline = time.monotonic() + 10
    while not _dead(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _dead(pid)


def test_a_crash_is_named_by_its_signal_with_the_stderr_tail(tmp_path, capsys):
    prog = program(
        tmp_path,
        "crasher",
        """
        print("about to crash", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGSEGV)
    """,
    )
    with pytest.raises(KernelError) as exc:
        run_one(execproto.ExecKernel(str(prog)))
    assert "killed by SIGSEGV" in str(exc.value) and "about to crash" in str(exc.value)
    assert cli.main(["conform", f"exec:{prog}", "--op", OP]) == 1
    assert "killed by SIGSEGV" in capsys.readouterr().out
    shell = tmp_path / "via_shell.sh"  # a shell reports its child's death as 128 + N
    shell.write_text(f'#!/bin/sh\n{prog} "$1"\n')
    shell.chmod(0o755)
    with pytest.raises(KernelError) as exc:
        run_one(execproto.ExecKernel(str(shell)))
    assert "exit status 139" in str(exc.value) and "SIGSEGV" in str(exc.value)


def test_a_flood_of_output_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(execproto, "FILE_LIMIT", 1 << 20)
    flood = tmp_path / "flood.sh"  # `yes` writes to stdout for ever
    flood.write_text("#!/bin/sh\nexec yes\n")
    flood.chmod(0o755)
    with pytest.raises(KernelError) as exc:
        run_one(execproto.ExecKernel(str(flood), timeout=60))
    assert "killed by SIGXFSZ" in str(exc.value)
    huge = program(
        tmp_path,
        "huge_output",
        """
        d = sys.argv[1]
        spec = json.load(open(os.path.join(d, "case.json")))
        for o in spec["outputs"]:
            with open(os.path.join(d, o["file"]), "wb") as fh:
                fh.write(b"\\0" * (1 << 21))   # larger than the cap
    """,
    )
    with pytest.raises(KernelError) as exc:
        run_one(execproto.ExecKernel(str(huge)))
    assert "File too large" in str(exc.value)  # Python ignores SIGXFSZ: its write fails instead
