"""Test-only fault injection (never imported by refreplay): run
``refreplay train ARGS...`` and SIGKILL this process at the N-th event of one
kind, chosen by the test from a seed:

    python tests/_fault_train.py KIND N -- train ARGS...

KIND  fsync       just before the N-th os.fsync (a write done, not yet synced
                  or renamed: temporaries are left behind)
      replace     just before the N-th os.replace (a synced temporary not
                  yet renamed into place)
      line        in the N-th os.write: half the bytes written, then killed
                  (a torn record line)
      bytes       after N bytes written into files of the run (inside a
                  checkpoint or shard write: the kill lands mid-file)

The hooks wrap os functions and ``refreplay.files.atomic_file`` in this
process only, so the normative code path is the one that runs.  Without a
kill (N beyond the run's events) the command finishes normally.
"""

import contextlib
import os
import signal
import sys


def _die():
    os.kill(os.getpid(), signal.SIGKILL)


def main(argv):
    kind, n = argv[0], int(argv[1])
    assert argv[2] == "--"
    args = argv[3:]
    count = [0]

    def tick():
        count[0] += 1
        return count[0] >= n

    if kind in ("fsync", "replace"):
        real = getattr(os, kind)

        def hooked(*a, **kw):
            if tick():
                _die()
            return real(*a, **kw)

        setattr(os, kind, hooked)
    elif kind == "line":
        real_write = os.write

        def hooked_write(fd, data):
            if tick():
                real_write(fd, bytes(data[: max(1, len(data) // 2)]))
                _die()
            return real_write(fd, data)

        os.write = hooked_write
    elif kind == "bytes":
        from refreplay import files

        real_atomic = files.atomic_file

        class Counting:
            def __init__(self, f):
                self.f = f

            def write(self, data):
                data = memoryview(data).cast("B")
                room = n - count[0]
                if len(data) >= room:
                    self.f.write(data[:room])
                    self.f.flush()
                    _die()
                count[0] += len(data)
                return self.f.write(data)

            def __getattr__(self, name):
                return getattr(self.f, name)

        @contextlib.contextmanager
        def counting_atomic(path, *a, **kw):
            with real_atomic(path, *a, **kw) as f:
                yield Counting(f)

        files.atomic_file = counting_atomic
    else:
        raise SystemExit(f"unknown fault kind {kind!r}")
    from refreplay.cli import main as cli

    return cli(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
