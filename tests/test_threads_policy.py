"""The default thread policy (refreplay.environ.kernel_threads): kernels run
on the cores of the affinity set that other processes leave free, 1 when
the machine is full, the user's fixed count when there is one
(``REFREPLAY_THREADS``, ``set_threads``, ``train --threads``), and the bits
never depend on the count.  Not timed: benchmarks/bench_threads.py measures
the speed."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time

import numba
import pytest
import torch

from refreplay import _env, environ
from refreplay.errors import InputError
from refreplay.torch import _bridge

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TWO = pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="needs 2 Numba threads")


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    """A fresh load sample, no fixed count, and the test's own view of the load."""
    monkeypatch.delenv(environ.THREADS_ENV, raising=False)
    monkeypatch.setattr(environ, "_FIXED", None)
    monkeypatch.setattr(environ, "_LOAD", environ._Load())


def others(monkeypatch, value: float, cpus=(0, 1)):
    """Pretend other processes keep ``value`` cores busy on CPUs ``cpus``."""
    monkeypatch.setattr(environ, "affinity", lambda: list(cpus))
    monkeypatch.setattr(environ, "_running_now", lambda: float(value))
    monkeypatch.setattr(environ, "_cpu_ticks", lambda cpus: None)  # every sample asks _running_now
    monkeypatch.setattr(environ, "_LOAD", environ._Load())


@pytest.mark.parametrize("value, free", [(0, 4), (0.3, 4), (0.5, 3), (1, 3), (2.2, 2), (3.9, 1), (40, 1)])
def test_free_cores_count_the_cores_others_hold(monkeypatch, value, free):
    others(monkeypatch, value, cpus=(0, 1, 2, 3))
    assert environ.free_cores() == free
    assert environ.kernel_threads(64, 64) == free


def test_a_fully_loaded_machine_gives_one_thread(monkeypatch):
    others(monkeypatch, 2.0)
    assert environ.kernel_threads(2, 2) == 1
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert _bridge.kernel_threads(1 << 24) == 1


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="needs Linux /proc/stat")
def test_a_machine_really_full_of_spinning_processes_gives_one_thread():
    cpus = environ.affinity()
    spin = [
        subprocess.Popen(
            [sys.executable, "-c", "import time\nt = time.monotonic() + 20\nwhile time.monotonic() < t: pass"]
        )
        for _ in cpus
    ]
    try:
        time.sleep(0.5)
        load = environ._Load()
        load.refresh()
        time.sleep(0.6)  # this process sleeps: the busy ticks are the spinners'
        load.refresh()
        assert load.others > len(cpus) - 0.6, load.others
        assert load.free == 1
    finally:
        for p in spin:
            p.kill()
            p.wait()


def _sampled_load(monkeypatch, tmp_path):
    """A fresh load sampler on CPUs 0 and 1 that reads ``stat`` (written by
    the test) with a fake clock and process CPU time (``clock``), 100 Hz ticks."""
    clock = {"t": 100.0, "cpu": 10.0}

    class FakeTime:
        monotonic = staticmethod(lambda: clock["t"])
        process_time = staticmethod(lambda: clock["cpu"])

    stat = tmp_path / "stat"
    real = environ._cpu_ticks
    monkeypatch.setattr(environ, "_cpu_ticks", lambda cpus: real(cpus, str(stat)))
    monkeypatch.setattr(environ, "time", FakeTime)
    monkeypatch.setattr(environ, "affinity", lambda: [0, 1])
    monkeypatch.setattr(environ, "_running_now", lambda: 0.0)
    load = environ._Load()
    load.hz = 100
    return clock, stat, load


def test_the_load_window_subtracts_this_process_and_counts_only_its_cpus(monkeypatch, tmp_path):
    """Two samples of /proc/stat 1 s apart: CPU 1 (ours) busy 100 ticks, CPU
    7 (not ours) busy too; this process used 0.5 s of it: others = 0.5."""
    clock, stat, load = _sampled_load(monkeypatch, tmp_path)

    def write(busy1, busy7):
        stat.write_text(
            f"cpu  1 1 1 1 1 1 1 1\ncpu0 5 0 0 900 0 0 0 0 0 0\ncpu1 {busy1} 0 0 5 0 0 0 0 0 0\n"
            f"cpu7 {busy7} 0 0 5 0 0 0 0 0 0\nintr 1 2 3\n"
        )

    write(1000, 1000)
    load.refresh()
    clock["t"] += 1.0
    clock["cpu"] += 0.5
    write(1100, 1100)
    load.refresh()
    assert load.others == pytest.approx(0.5)
    assert load.free == 1  # half a core held by others counts as held (TAKEN = 0.4)
    clock["t"] += 1.0
    clock["cpu"] += 0.9
    write(1200, 1200)
    load.refresh()
    assert load.others == pytest.approx(0.1) and load.free == 2
    assert load.until == clock["t"] + environ.SAMPLE_S
    clock["t"] += 0.5
    clock["cpu"] += 0.5
    write(1300, 1300)  # others 1.0 for half a second: one core taken at once
    load.refresh()
    assert load.others == pytest.approx(1.0) and load.free == 1
    clock["t"] += 0.5
    clock["cpu"] += 0.5
    write(1350, 1350)  # others 0 again, but within HOLD_S of the busy sample: still taken
    load.refresh()
    assert load.others == pytest.approx(0.0) and load.free == 1
    clock["t"] += 5.0
    write(1400, 1400)  # after a pause the window is stale: the running count now (0)
    load.refresh()
    assert load.others == 0.0 and load.free == 2


def test_the_running_count_after_a_pause_decides_until_the_next_sample_only(monkeypatch, tmp_path):
    """After a pause two threads of another process are running at that
    instant (a pool spinning before it sleeps): where there is no window
    over the pause, one core each is taken for that sample, but the next
    window (idle) frees them at once; where the window over the pause was
    idle the instant alone takes nothing; a busy window is still held for
    HOLD_S."""
    clock, stat, load = _sampled_load(monkeypatch, tmp_path)
    running = {"n": 2.0}
    monkeypatch.setattr(environ, "_running_now", lambda: running["n"])

    def write(busy0, busy1=None):
        busy1 = busy0 if busy1 is None else busy1
        stat.write_text(f"cpu0 {busy0} 0 0 900 0 0 0 0 0 0\ncpu1 {busy1} 0 0 900 0 0 0 0 0 0\n")

    write(1000)
    load.refresh()  # the first sample: the running count
    assert load.others == 2.0 and load.free == 1
    clock["t"] += environ.SAMPLE_S
    clock["cpu"] += 2 * environ.SAMPLE_S  # this process kept both CPUs busy
    write(1000 + int(100 * environ.SAMPLE_S))
    load.refresh()
    assert load.others == pytest.approx(0.0) and load.free == 2  # not held: the instant is over
    clock["t"] += 5.0
    clock["cpu"] += 2 * 5.0  # this process's own work over the pause
    base = 1000 + int(100 * environ.SAMPLE_S) + 500 + 5  # others: 0.01 of a core per CPU over the pause
    write(base)
    load.refresh()
    assert load.others == pytest.approx(0.02) and load.free == 2  # the instant's two threads did not last
    clock["t"] += 5.0
    base += 500
    write(base)
    load.refresh()  # a pause, busy: both the window and the instant see the others
    assert load.others == pytest.approx(2.0) and load.free == 1
    clock["t"] += environ.SAMPLE_S
    write(base + int(100 * environ.SAMPLE_S), base)  # others kept CPU 0 busy the whole window
    load.refresh()
    assert load.others == pytest.approx(1.0) and load.free == 1
    clock["t"] += environ.SAMPLE_S
    clock["cpu"] += 2 * environ.SAMPLE_S
    write(base + int(200 * environ.SAMPLE_S), base + int(100 * environ.SAMPLE_S))
    load.refresh()
    assert load.others == pytest.approx(0.0) and load.free == 1  # a window's peak is held for HOLD_S


def test_the_affinity_set_bounds_the_count(monkeypatch):
    monkeypatch.setattr(environ, "_running_now", lambda: 0.0)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3})
    monkeypatch.setattr(environ, "_LOAD", environ._Load())
    assert environ.affinity() == [3] and environ.kernel_threads(8, 8) == 1
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 5, 6})
    monkeypatch.setattr(environ, "_LOAD", environ._Load())
    assert environ.kernel_threads(8, 8) == 5
    assert environ.kernel_threads(2, 8) == 2  # never more than the caller wants
    assert environ.kernel_threads(8, 3) == 3  # nor than Numba launched


def test_an_explicit_count_is_kept_on_a_full_machine(monkeypatch):
    others(monkeypatch, 50.0)
    monkeypatch.setenv(environ.THREADS_ENV, "2")
    monkeypatch.setattr(environ, "_LOAD", environ._Load())
    assert environ.kernel_threads(1, 8) == 2  # fixed: neither the load nor torch's count decides
    assert environ.kernel_threads(8, 1) == 1  # but never more than Numba launched
    environ.set_threads(3)
    assert environ.kernel_threads(1, 8) == 3  # the API wins over the variable
    environ.set_threads(None)
    monkeypatch.setenv(environ.THREADS_ENV, "auto")
    monkeypatch.setattr(environ, "_LOAD", environ._Load())
    assert environ.kernel_threads(8, 8) == 1


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2", environ.MAX_THREADS + 1])
def test_set_threads_refuses_a_count_that_is_not_one(bad):
    with pytest.raises(InputError):
        environ.set_threads(bad)


@pytest.mark.parametrize(
    "value, ok", [("auto", True), ("AUTO", True), ("3", True), ("0", False), ("two", False), ("-1", False)]
)
def test_the_variable_is_checked(value, ok):
    if ok:
        environ.check({environ.THREADS_ENV: value})
    else:
        with pytest.raises(InputError, match=environ.THREADS_ENV):
            environ.check({environ.THREADS_ENV: value})


def test_a_bad_variable_stops_the_command_line_with_exit_2():
    env = dict(os.environ, PYTHONPATH=REPO, REFREPLAY_THREADS="zero")
    out = subprocess.run(
        [sys.executable, "-m", "refreplay", "doctor"], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 2 and "REFREPLAY_THREADS" in out.stderr and "Traceback" not in out.stderr


def test_small_ops_run_on_one_thread_whatever_the_setting(monkeypatch):
    others(monkeypatch, 0.0, cpus=range(8))
    environ.set_threads(4)
    assert _bridge.kernel_threads(_bridge.SMALL_WORK - 1) == 1
    assert _bridge.kernel_threads(_bridge.SMALL_WORK) == min(4, numba.config.NUMBA_NUM_THREADS)


def test_the_trainer_paces_its_threads(monkeypatch):
    from refreplay.training import step

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("needs 2 Numba threads")
    before = numba.get_num_threads()
    try:
        others(monkeypatch, 9.0)
        step.pace_threads()
        assert numba.get_num_threads() == 1
        others(monkeypatch, 0.0)
        step.pace_threads()
        assert numba.get_num_threads() == 2
        step.pace_threads(environ.SMALL_WORK - 1)  # a model whose ops are all small
        assert numba.get_num_threads() == 1
        others(monkeypatch, 9.0)
        environ.set_threads(2)  # train --threads 2
        step.pace_threads()
        assert numba.get_num_threads() == 2
    finally:
        numba.set_num_threads(before)


# --- bits never depend on the count -------------------------------------------


def _port_step_hash() -> tuple[str, list[int]]:
    """sha256 of the loss and every gradient of one step of the small
    nanoGPT-style model, and the thread counts its ops ran on."""
    sys.path.insert(0, os.path.join(REPO, "examples", "nanogpt_port"))
    from model import Config, build

    seen = []
    real = _bridge.kernel_threads

    def spy(elements, wanted=None):
        n = real(elements, wanted)
        seen.append(n)
        return n

    cfg = Config(vocab=64, block=16, layers=1, heads=2, width=128)
    net = build(cfg)
    gen = torch.Generator().manual_seed(3)
    idx = torch.randint(0, cfg.vocab, (4, cfg.block), generator=gen)
    y = torch.randint(0, cfg.vocab, (4, cfg.block), generator=gen)
    _bridge.kernel_threads = spy
    try:
        loss = net(idx, y)
        loss.backward()
    finally:
        _bridge.kernel_threads = real
    h = hashlib.sha256(loss.detach().numpy().tobytes())
    for name, p in sorted(net.named_parameters()):
        h.update(name.encode() + p.grad.numpy().tobytes())
    return h.hexdigest(), seen


@TWO
def test_a_step_at_the_capped_count_has_the_bits_of_one_thread(monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(_bridge, "SMALL_WORK", 1 << 10)  # so that this small model's big ops go parallel
    environ.set_threads(1)
    one, seen1 = _port_step_hash()
    environ.set_threads(None)
    others(monkeypatch, 0.0)  # an idle machine: the policy gives 2
    two, seen2 = _port_step_hash()
    assert set(seen1) == {1} and 2 in seen2  # the two runs really differ in threads
    assert two == one
    others(monkeypatch, 5.0)  # a full one: 1
    full, seen3 = _port_step_hash()
    assert set(seen3) == {1} and full == one


@TWO
def test_a_trainer_step_has_the_same_state_root_at_1_and_2_threads():
    code = """
import json, numpy as np, numba
from refreplay import environ
from refreplay.training.data import Batching, Stream
from refreplay.training.launch.inproc import InProcess
from refreplay.training.presets import preset
from refreplay.training.step import Trainer
environ.SMALL_WORK = 1  # so that the tiny preset's steps run on the fixed count
mc, tc = preset("tiny")
rs = np.random.RandomState(0)
samples = rs.randint(0, 256, size=(2 * tc.micro_batches * tc.micro_batch_size, mc.seq_len + 1))
stream = Stream(samples.astype(np.uint8), tc.seed, Batching(tc.micro_batches, tc.micro_batch_size))
tr = Trainer(mc, tc, stream, "00" * 32)
st, rec = tr.step(tr.initial_state(), "00" * 32, InProcess(1))
print(json.dumps([rec.state_root, numba.get_num_threads()]))
"""
    roots = []
    for n in ("1", "2"):
        env = dict(os.environ, PYTHONPATH=REPO, REFREPLAY_THREADS=n)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
        assert out.returncode == 0, out.stderr[-2000:]
        roots.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert roots[0][1] == 1 and roots[1][1] == 2
    assert roots[0][0] == roots[1][0]


def test_the_step_hash_sees_a_flipped_input_bit():
    """The hash compared above can fail: one flipped bit of one weight changes it."""
    sys.path.insert(0, os.path.join(REPO, "examples", "nanogpt_port"))
    import model as port

    a, _ = _port_step_hash()
    real = port.build

    def tampered(cfg, plain=False, seed=0):
        net = real(cfg, plain, seed)
        with torch.no_grad():
            w = next(iter(net.parameters())).view(-1)
            i = int(w.abs().argmax())
            w[i : i + 1].view(torch.int32).bitwise_xor_(1)  # the last bit of its largest element
        return net

    port.build = tampered
    try:
        b, _ = _port_step_hash()
    finally:
        port.build = real
    assert a != b


# --- the OpenMP layer: sleeping pools only --------------------------------------


def _layer(code_first: str) -> list:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "NUMBA_THREADING_LAYER")}
    env["PYTHONPATH"] = REPO
    code = code_first + (
        "; import refreplay, os, json, numba; from refreplay import _env; "
        "print(json.dumps([os.environ.get('OMP_WAIT_POLICY'), numba.config.THREADING_LAYER, "
        "_env._numba_omp_shared()]))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _numba_omp_names() -> list[str]:
    from pathlib import Path

    pools = sorted(Path(numba.__file__).parent.joinpath("np", "ufunc").glob("omppool*"))
    return [n for p in pools[:1] for n in _env._needed(p) if "omp" in n]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ELF and /proc/self/maps")
def test_numbas_own_runtime_is_found_in_its_pool():
    names = _numba_omp_names()
    if not names:
        pytest.skip("this Numba has no OpenMP pool")
    assert all(".so" in n for n in names)
    assert _env._needed(__import__("pathlib").Path(__file__)) == []  # not an ELF file: nothing


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ELF and /proc/self/maps")
def test_torch_first_keeps_the_sleeping_pool_when_numbas_runtime_is_its_own():
    policy, layer, shared = _layer("import torch")
    if shared:  # here torch shares Numba's runtime: the workqueue is right
        assert layer == "workqueue"
    else:
        assert policy == "PASSIVE" and layer == "default"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ELF and /proc/self/maps")
def test_numbas_runtime_loaded_first_sends_numba_to_the_workqueue():
    names = _numba_omp_names()
    if not names:
        pytest.skip("this Numba has no OpenMP pool")
    policy, layer, shared = _layer(f"import ctypes; ctypes.CDLL({names[0]!r})")
    assert shared and policy == "PASSIVE" and layer == "workqueue"


def test_steal_is_not_another_process(monkeypatch, tmp_path):
    """Steal ticks (the 8th field: the hypervisor ran something else on the
    vCPU) are not other processes' work: with this process's own CPU time
    covering all the user ticks, a second of steal on each CPU leaves both
    cores free; the same second as user time of others takes them."""
    clock, stat, load = _sampled_load(monkeypatch, tmp_path)

    def write(user, steal):
        rows = "".join(f"cpu{c} {user} 0 0 5 0 0 0 {steal} 0 0\n" for c in (0, 1))
        stat.write_text(f"cpu  1 1 1 1 1 1 1 1\n{rows}intr 1 2 3\n")

    write(1000, 50)
    load.refresh()
    clock["t"] += 1.0
    clock["cpu"] += 1.0  # both CPUs half busy with this process: 2 x 50 ticks
    write(1050, 150)  # and a whole second of steal on each
    load.refresh()
    assert load.others == pytest.approx(0.0) and load.free == 2
    clock["t"] += 1.0
    clock["cpu"] += 1.0
    write(1150, 150)  # 200 user ticks, 100 more than this process ran: others hold a core
    load.refresh()
    assert load.others == pytest.approx(1.0) and load.free == 1


def _proc(tmp_path, running: int, states: list[str]):
    """A fabricated ``/proc/loadavg`` (``running`` runnable threads on the
    machine) and ``/proc/self/task`` (this process's threads in ``states``;
    one name holds a space and a parenthesis, as a thread's name may)."""
    (tmp_path / "loadavg").write_text(f"0.50 0.40 0.30 {running}/321 4567\n")
    tasks = tmp_path / "task"
    for i, state in enumerate(states):
        (tasks / str(100 + i)).mkdir(parents=True)
        name = "(numba (worker) 1)" if i else "(python)"
        (tasks / str(100 + i) / "stat").write_text(f"{100 + i} {name} {state} 1 100 100 0 -1\n")
    return str(tmp_path / "loadavg"), str(tasks)


@pytest.mark.parametrize(
    "running, states, want",
    [
        (1, ["R"], 0.0),  # only the caller runs
        (2, ["R", "R"], 0.0),  # the caller and its own pool thread finishing the last kernel
        (3, ["R", "R", "S"], 1.0),  # one thread of another process
        (3, ["R", "S", "S"], 2.0),
        (2, ["S", "S"], 1.0),  # the caller is counted running even where its stat said not
    ],
)
def test_the_running_count_leaves_out_this_processs_own_threads(tmp_path, running, states, want):
    """After a pause the policy asks how many threads run now.  Numba's
    OpenMP pool spins for a while after a kernel (measured on the Intel
    kind: the thread still running in 11 of 20 reads right after a
    matmul), so counting it as another process's gave one core away for a
    whole gpt2-124m micro-batch."""
    loadavg, tasks = _proc(tmp_path, running, states)
    assert environ._running_now(loadavg, tasks) == want


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc/self/task")
def test_a_real_thread_of_this_process_is_counted_as_its_own():
    """A thread that hashes with the GIL released runs beside the caller:
    it shows in this process's running count (the caller alone is 1)."""
    import threading

    stop = threading.Event()
    data = b"\0" * (1 << 24)

    def spin():
        while not stop.is_set():
            hashlib.sha256(data).digest()  # releases the GIL: a running native thread

    t = threading.Thread(target=spin, name="busy (hash)")
    t.start()
    try:
        time.sleep(0.1)
        seen = [environ._own_running() for _ in range(50)]
    finally:
        stop.set()
        t.join()
    assert max(seen) >= 2, seen
    assert environ._own_running("/nonexistent/task") == 1
