"""Replay within a memory budget and the cost estimate: tensors kept in
memory-mapped files give the same bits ([step.order.c1], [state.fileread.c1]),
and ``--estimate`` reports without running."""

import mmap

import numpy as np
import pytest

from refreplay import tensorio
from refreplay.training import budget, estimate, launch, presets, run
from refreplay.cli import main
from refreplay.errors import InputError
from refreplay.training.train import train
from refreplay.verify.replay import replay

import auditor_keys

BYTE_CAP = 1 << 15


pytestmark = pytest.mark.usefixtures("one_numba_thread")


def _mapped(a) -> bool:
    base = a
    while base is not None and not isinstance(base, mmap.mmap):
        base = getattr(base, "base", None)
    return base is not None


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("b") / "run"
    m, t = presets.preset("tiny")
    s = train(
        m,
        t,
        steps=3,
        checkpoint_every=2,
        out=out,
        launcher=launch.get("inproc", 1),
        preset="tiny",
        byte_cap=BYTE_CAP,
        progress=None,
    )
    return out, s


def test_memory_keeps_bytes_in_mapped_files():
    mem = budget.Memory(True, min_bytes=0)
    a = np.arange(1000, dtype=np.float32)
    k = mem.keep(a)
    assert _mapped(k) and type(k) is np.ndarray and k.dtype == a.dtype and np.array_equal(k, a)
    k[3] = 7  # writable, and the original is untouched
    assert a[3] == 3 and k[3] == 7
    budget.release(k)  # pages handed back, data kept
    assert k[3] == 7 and k[999] == 999
    assert not _mapped(budget.Memory(True).keep(a))  # below min_bytes: RAM
    assert not _mapped(budget.Memory().keep(a))
    budget.release(a)  # a no-op on RAM
    d = budget.SpillingDict(mem)
    d["x"] = a
    assert _mapped(d["x"]) and mem.files == 2


def test_mapped_load_equals_load_and_refuses_the_same_files(tiny_run, tmp_path):
    """[state.fileread.c1] the mapped reader validates exactly like the reader."""
    out, _ = tiny_run
    path = out / "checkpoints" / run.checkpoint_name(2)
    a, ma = tensorio.load(path)
    b, mb = tensorio.load_mapped(path)
    assert ma == mb and list(a) == list(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and a[k].tobytes() == b[k].tobytes()
    assert any(_mapped(v) for v in b.values())
    raw = path.read_bytes()
    for name, content in (("short", raw[:-4]), ("header", raw[:8][::-1] + raw[8:]), ("tiny", raw[:5])):
        p = tmp_path / name
        p.write_bytes(content)
        with pytest.raises(InputError) as e1:
            tensorio.load(p)
        with pytest.raises(InputError) as e2:
            tensorio.load_mapped(p)
        assert str(e1.value) == str(e2.value)


def test_mapped_replay_gives_the_same_bits(tiny_run):
    """Bits never depend on the budget: replay with every tensor in mapped
    files verifies the same records."""
    out, _ = tiny_run
    mem = budget.Memory(True, min_bytes=0)
    r = run.open_run(out, strict=False)
    res = replay(r, 3, memory=mem)
    assert res.verified and mem.files > 0
    st = r.load_checkpoint(2, mem)
    assert all(_mapped(v) for k, v in st.params.items())
    new, rec = r.replay_step(st, memory=mem)
    assert rec.state_root == r.records[3].state_root
    assert _mapped(new.params["wte"]) and _mapped(new.m["wte"])


def test_mapped_training_gives_the_same_run(tiny_run, tmp_path):
    """The trainer under a mapped budget publishes byte-identical records."""
    out, s = tiny_run
    m, t = presets.preset("tiny")
    mem = budget.Memory(True, min_bytes=0)
    s2 = train(
        m,
        t,
        steps=3,
        checkpoint_every=2,
        out=tmp_path / "m",
        launcher=launch.get("inproc", 2),
        preset="tiny",
        byte_cap=BYTE_CAP,
        progress=None,
        memory=mem,
    )
    assert s2.head == s.head and mem.files > 0
    assert (tmp_path / "m" / "steps.jsonl").read_bytes() == (out / "steps.jsonl").read_bytes()


def test_cli_max_memory_and_estimate(tiny_run, tmp_path, capsys):
    out, s = tiny_run
    assert main(["replay", str(out), "--step", "3", "--max-memory", "0.00001", "--quiet"]) == 0
    cap = capsys.readouterr()
    assert "memory-mapped files" in cap.out and "VERIFIED" in cap.out
    key = str(auditor_keys.key_files(tmp_path / "keys")[0])
    assert (
        main(
            [
                "audit",
                str(out),
                "--sample",
                "1",
                "--beacon",
                "ab",
                "--auditor",
                "me",
                "--key",
                key,
                "--out",
                str(tmp_path / "certs"),
                "--max-memory",
                "0.00001",
                "--quiet",
            ]
        )
        == 0
    )
    capsys.readouterr()
    assert main(["replay", str(out), "--step", "3", "--estimate", "--max-memory", "8"]) == 0
    cap = capsys.readouterr()
    for word in (
        "FLOPs per step",
        "bytes moved",
        "peak memory",
        "predicted time",
        "fits in RAM",
        "steps 3..3 from the checkpoint at step 2",
    ):
        assert word in cap.out
    assert "VERIFIED" not in cap.out
    for bad in ("0", "-1", "lots", "nan"):
        assert main(["replay", str(out), "--step", "3", "--max-memory", bad]) == 2
        assert "--max-memory" in capsys.readouterr().err
    assert main(["replay", str(out), "--step", "9", "--estimate"]) == 2
    capsys.readouterr()
    o = tmp_path / "never"
    assert main(["train", "--preset", "tiny", "--steps", "4", "--out", str(o), "--estimate"]) == 0
    cap = capsys.readouterr()
    assert "predicted total" in cap.out and not o.exists()


def test_cost_counts():
    """FLOPs and memory follow the configuration: 6 per weight and token plus
    attention; the mapped plan needs far less than every tensor in RAM."""
    m, t = presets.preset("gpt2-124m")
    c = estimate.cost(m, t)
    assert c.params == 123_689_472 and c.tokens == 8 * 1024
    assert c.flops > 6 * c.params * c.tokens
    assert c.flops < 6.2 * c.params * c.tokens + 6 * 1024 * 768 * 12 * c.tokens
    import dataclasses

    m, t = presets.preset("gpt2-xl")
    full = estimate.cost(m, t)
    xl = estimate.cost(dataclasses.replace(m, seq_len=256), dataclasses.replace(t, micro_batches=4))
    assert xl.peak_ram > 2 * 12 * xl.params  # the state and its update at least
    assert xl.peak_mapped < 12 << 30 < xl.peak_ram
    assert full.peak_mapped > 12 << 30  # T = 1024: one micro-batch's activations alone are ~13 GiB
    lines = xl.lines(10 << 30)
    assert any("mapped files" in ln for ln in lines)
    assert budget.Memory.for_budget(10 << 30, xl.peak_ram).mapped
    assert not budget.Memory.for_budget(None, xl.peak_ram).mapped
    assert not budget.Memory.for_budget(100 << 30, xl.peak_ram).mapped


def test_state_zero_from_the_recipe_is_built_in_mapped_files(tiny_run):
    """Under a mapped budget, state 0 recomputed from the recipe (to check a
    published step 0, or to start from) lives in mapped files tensor by
    tensor, with the same bits as in RAM; the moments are files of +0."""
    out, _ = tiny_run
    r = run.open_run(out, strict=False)
    mem = budget.Memory(True, min_bytes=0)
    mapped, plain = r.trainer(None, mem).initial_state(), r.trainer().initial_state()
    assert mapped.root() == plain.root() == r.records[0].state_root
    for group in ("params", "m", "v"):
        for k, v in getattr(mapped, group).items():
            assert _mapped(v), (group, k)
            assert v.tobytes() == getattr(plain, group)[k].tobytes()
    assert not np.any(mapped.m["wte"].view(np.uint32)) and not np.any(mapped.v["wte"].view(np.uint32))
    z = budget.Memory(True, min_bytes=1 << 30).zeros((3, 2), np.float32)  # below min_bytes: RAM
    assert not _mapped(z) and z.shape == (3, 2) and not np.any(z)


def test_calibration_scales_by_the_step_flops():
    """The calibration's FLOP model of one micro-batch agrees with the step's
    count (a whole step is M micro-batches plus the optimizer's few FLOPs per
    parameter), for a tied and an untied model, and a model cut to fewer
    layers or a shorter sequence has fewer FLOPs."""
    import dataclasses

    for name in ("gpt2-124m", "small"):
        m, t = presets.preset(name)
        step = estimate.cost(m, t).flops
        micro = estimate.micro_flops(m, m.layers, m.seq_len) * t.micro_batch_size
        optim = (t.micro_batches + 23) * estimate.param_count(m)
        assert abs(t.micro_batches * micro + optim - step) <= 0.01 * step, name
        assert estimate.micro_flops(m, 1, m.seq_len) < estimate.micro_flops(m, m.layers, m.seq_len)
        assert (
            estimate.micro_flops(m, m.layers, m.seq_len // 2)
            < estimate.micro_flops(m, m.layers, m.seq_len) / 2 + 3.0 * m.vocab * m.width * m.seq_len
        )
    untied = dataclasses.replace(presets.preset("small")[0], tied=False)
    assert estimate.micro_flops(untied, 1, 64) == estimate.micro_flops(presets.preset("small")[0], 1, 64)
