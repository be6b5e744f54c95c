"""Environment variables refreplay and Numba read, checked before any of them
is used, so that a bad value is a clear refusal (exit 2) and never a
traceback from deep inside Numba's start-up.

Bits never depend on these values; a wrong one only stops the program.
"""

from __future__ import annotations

import os
import re
import time

from .errors import InputError

MAX_THREADS = 4096
_DECIMAL = re.compile(r"[0-9]{1,6}")


def _threads(name: str, value: str) -> None:
    v = value.strip()
    if not _DECIMAL.fullmatch(v) or not 1 <= int(v) <= MAX_THREADS:
        raise InputError(
            f"environment variable {name}={value!r} must be a whole number of threads "
            f"from 1 to {MAX_THREADS} (unset it to use every core)"
        )


def _flag(name: str, value: str) -> None:
    if value.strip() not in ("", "0", "1"):
        raise InputError(f"environment variable {name}={value!r} must be 0 or 1")


# Numba's threading layers: the names it knows, and the ones that need Intel
# TBB (the ``tbb`` package): "safe" is thread- and fork-safe, which only TBB is.
THREADING_LAYERS = ("default", "workqueue", "omp", "tbb", "forksafe", "threadsafe", "safe")
_NEED_TBB = ("tbb", "safe")


def _threading_layer(name: str, value: str) -> None:
    v = value.strip().lower()
    if v not in THREADING_LAYERS:
        raise InputError(
            f"environment variable {name}={value!r} is not a Numba threading layer; use one of "
            f"{', '.join(THREADING_LAYERS)} (or unset it)"
        )
    if v in _NEED_TBB:
        import importlib.util

        if importlib.util.find_spec("tbb") is None:
            raise InputError(
                f"environment variable {name}={value!r} needs Intel TBB, which is not installed "
                "(pip install tbb), or unset it to use the default layer"
            )


CHECKS = {
    "NUMBA_NUM_THREADS": _threads,  # 0 or less: Numba raises ValueError from deep in its start-up
    "NUMBA_ENABLE_CUDASIM": _flag,  # decides whether --device cuda is the simulator
    "NUMBA_THREADING_LAYER": _threading_layer,  # unknown or absent: ValueError at the first parallel kernel
}


def check(environ=None) -> None:
    """Refuse (``InputError``) the first set variable of ``CHECKS`` whose value
    is unusable."""
    env = os.environ if environ is None else environ
    for name, check_one in CHECKS.items():
        if name in env:
            check_one(name, env[name])


# --- Thread counts: the default policy ------------------------------------
#
# Bits never depend on the thread count (every ``prange`` runs over
# independent outputs, ``refreplay._jit``); speed does, and on a shared
# machine it collapses when a parallel kernel asks for a core another process
# holds: the kernel's slowest chunk then waits for the scheduler (measured on
# 2 cores beside one busy process: a small GPT step 103 ms at 2 Numba threads
# against 12 ms at 1).  So by default refreplay's kernels run on the cores
# that are free: those of the process's affinity set that other processes
# did not keep busy over the last sample, at least 1.  ``REFREPLAY_THREADS=N``
# or ``set_threads(N)`` fixes the count instead (capped by the threads Numba
# launched, ``NUMBA_NUM_THREADS``); ``auto`` or ``set_threads(None)`` is the
# default policy.

THREADS_ENV = "REFREPLAY_THREADS"
# Below this many operand elements an op runs on one thread: waking a pool
# costs some 10-50 us (measured), about the time of an elementwise pass over
# 2^15 binary32 values on one core.
SMALL_WORK = 1 << 15
SAMPLE_S = 0.25  # a load sample is kept this long (seconds)
TAKEN = 0.4  # a core counts as taken when other processes kept it busy this share of the sample
STALE_S = 1.0  # a window longer than this (no op ran for a while) is replaced by the running count now
HOLD_S = 1.0  # a core counts as free only when it was free in every sample of the last HOLD_S


def _threads_or_auto(name: str, value: str) -> None:
    v = value.strip()
    if v.lower() != "auto" and (not _DECIMAL.fullmatch(v) or not 1 <= int(v) <= MAX_THREADS):
        raise InputError(
            f"environment variable {name}={value!r} must be auto or a whole number of threads "
            f"from 1 to {MAX_THREADS} (auto, or unset: the cores other processes leave free)"
        )


CHECKS[THREADS_ENV] = _threads_or_auto

_FIXED: int | None = None  # set_threads(); None: the environment variable, else the policy


def set_threads(n: int | None) -> None:
    """Fix refreplay's kernel thread count to ``n`` (``None``: back to
    ``REFREPLAY_THREADS``, else the default policy).  Bits never depend on it."""
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_THREADS):
        raise InputError(f"thread count must be a whole number from 1 to {MAX_THREADS}, got {n!r}")
    global _FIXED
    _FIXED = n


def fixed_threads(environ=None) -> int | None:
    """The count the user fixed (``set_threads``, else ``REFREPLAY_THREADS``),
    or None when the default policy decides."""
    if _FIXED is not None:
        return _FIXED
    v = (os.environ if environ is None else environ).get(THREADS_ENV, "").strip()
    if v and v.lower() != "auto":
        _threads_or_auto(THREADS_ENV, v)
        return int(v)
    return None


def affinity() -> list[int]:
    """The CPUs this process may run on (all of them where the OS cannot say)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def _cpu_ticks(cpus, path: str = "/proc/stat") -> int | None:
    """Busy clock ticks of ``cpus`` since boot (``/proc/stat``: user, nice,
    system, irq, softirq), None where there is no /proc/stat.  Not steal: on
    a virtual machine it is time the hypervisor ran something else on the
    vCPU, which this process's CPU time does not count either, so it would
    read as another process holding a core (measured on a 2-vCPU Xeon: 19 %
    steal while both vCPUs ran a matmul, a quarter of the kernels cut to
    one thread, a gpt2-124m step at 2 threads 144-170 s against 130 s with
    the count fixed)."""
    want = {f"cpu{c}" for c in cpus}
    try:
        with open(path, "rb") as f:
            text = f.read().decode("ascii", "replace")
    except OSError:
        return None
    busy = 0
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[0] in want:
            v = [int(x) for x in parts[1:9]] + [0] * 8
            busy += v[0] + v[1] + v[2] + v[5] + v[6]
    return busy


def _own_running(task_dir: str = "/proc/self/task") -> int:
    """This process's threads that are running or runnable now (state ``R``
    in ``/proc/self/task/*/stat``), at least 1 (the caller); 1 where there
    is no such directory.  Numba's and PyTorch's pool threads finishing the
    last kernel are this process's own work, not another process's."""
    try:
        names = os.listdir(task_dir)
    except OSError:
        return 1
    running = 0
    for name in names:
        try:
            with open(os.path.join(task_dir, name, "stat"), "rb") as f:
                text = f.read()
        except OSError:
            continue  # the thread ended between the listing and the read
        state = text[text.rfind(b")") + 1 :].split()[:1]  # the name may hold spaces and parentheses
        running += state == [b"R"]
    return max(1, running)


def _running_now(loadavg: str = "/proc/loadavg", task_dir: str = "/proc/self/task") -> float:
    """Other processes' runnable threads at this instant (``/proc/loadavg``'s
    running count less this process's own running threads), else the
    1-minute load less one: the first estimate, before two samples of
    ``/proc/stat`` exist, and the one after a pause."""
    try:
        with open(loadavg) as f:
            running = float(f.read().split()[3].split("/")[0])
        return max(0.0, running - _own_running(task_dir))
    except (OSError, IndexError, ValueError):
        pass
    try:
        return max(0.0, os.getloadavg()[0] - 1)
    except (AttributeError, OSError):
        return 0.0


class _Load:
    """Cores' worth of other processes' work on this process's CPUs, sampled
    at most every ``SAMPLE_S``: (busy ticks of those CPUs - this process's
    CPU time) / wall time since the previous sample (after a pause of more
    than ``STALE_S``: the smaller of that and the running count now, which
    decides until the next sample only).  The free cores follow the largest
    value of the windows of the last ``HOLD_S``.  ``free`` and ``env`` (the
    value of ``REFREPLAY_THREADS``) are kept with the sample, so that a
    kernel's call costs a clock read."""

    def __init__(self):
        self.at = None  # (monotonic, busy ticks, process CPU seconds, cpus)
        self.until = -1.0  # the sample is kept until this monotonic time
        self.others = 0.0
        self.free = 1
        self.env = None
        self.recent = []  # (monotonic, others) of the samples of the last HOLD_S
        self.hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def refresh(self) -> None:
        now = time.monotonic()
        cpus = affinity()
        ticks = _cpu_ticks(cpus)
        own = time.process_time()
        window = None
        if ticks is not None and self.at is not None and self.at[3] == cpus:
            wall = max(now - self.at[0], 1e-6)
            window = max(0.0, ((ticks - self.at[1]) / self.hz - (own - self.at[2])) / wall)
        if window is None or now - self.at[0] > STALE_S:
            # no /proc/stat, no earlier sample of these CPUs, or one from before a
            # pause: the threads running now decide, and only until the next sample.
            # An instant alone misleads: it catches other processes' pools spinning
            # for a few ms before they sleep (measured, 2-vCPU EPYC, idle: most reads
            # right after another process's step saw 1-2 running threads, and held
            # for a second they ran half of a 2.2 s step's ops on one thread).  So
            # where the pause has a window, the other work must show in both: the
            # smaller of the two decides.
            self.others = _running_now() if window is None else min(_running_now(), window)
            self.recent = []
            peak = self.others
        else:
            self.others = window
            # fewer threads at once, more only after HOLD_S of free samples: a core
            # wrongly taken costs at most its share, one wrongly used stalls the kernel
            self.recent = [(t, v) for t, v in self.recent if now - t < HOLD_S] + [(now, self.others)]
            peak = max(v for _, v in self.recent)
        self.at = (now, ticks, own, cpus)
        self.until = now + SAMPLE_S
        self.free = max(1, len(cpus) - int(peak + (1 - TAKEN)))
        self.env = fixed_threads() if _FIXED is None else None

    def current(self) -> "_Load":
        if time.monotonic() >= self.until:
            self.refresh()
        return self


_LOAD = _Load()


def free_cores() -> int:
    """Cores of the affinity set that other processes do not hold (at least
    1): a core counts as held when they kept it busy ``TAKEN`` of the last
    sample or more."""
    return _LOAD.current().free


def policy_free() -> int | None:
    """The free cores (``free_cores``) when the default policy decides, None
    when the user fixed a count (``set_threads``, ``REFREPLAY_THREADS``)."""
    if _FIXED is not None:
        return None
    load = _LOAD.current()
    return load.free if load.env is None else None


def kernel_threads(wanted: int, cap: int) -> int:
    """The thread count for refreplay's kernels: the user's fixed count
    (``set_threads``, ``REFREPLAY_THREADS``) if any, else ``wanted`` (the
    caller's own count: PyTorch's intra-op threads, Numba's) limited to the
    free cores; never above ``cap`` (the threads Numba launched), never below 1."""
    free = policy_free()
    if free is not None:
        n = min(wanted, free)
    else:  # the count the user fixed: the API's, else the variable's (kept with the sample)
        n = _FIXED if _FIXED is not None else _LOAD.env
    return max(1, min(n, cap))
