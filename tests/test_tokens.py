"""Token files: the llm.c and flat layouts, the padded vocabulary, and runs
trained from token files ([data.tokenfile.c1], [data.vocab.c1],
[data.shards.c1], [data.hash.c1]).  The files are generated here; nothing is
downloaded."""

import hashlib
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from refreplay.training import data, launch, presets, run, tokens
from refreplay.cli import main
from refreplay.errors import InputError
from refreplay.training.train import train
from refreplay.verify.replay import replay

V = 300  # a small true vocabulary: the model's is 320
T = 32  # the tiny preset's sequence length


pytestmark = pytest.mark.usefixtures("one_numba_thread")


def _ids(n, vocab=V, seed=0):
    return np.random.default_rng(seed).integers(0, vocab, size=n).astype(np.int64)


def _flat(path, ids, dtype="uint16", vocab=V):
    np.asarray(ids, dtype="<u2" if dtype == "uint16" else "<u4").tofile(path)
    (path.parent / (path.name + ".json")).write_text(json.dumps({"dtype": dtype, "vocab": vocab}))
    return path


# ---- the layouts --------------------------------------------------------------


def test_padded_vocab_and_storage_width():
    """[data.vocab.c1] V up to 2^20, padded to 64 (GPT-2: 50,257 -> 50,304);
    one, two or four bytes per stored token."""
    assert tokens.padded_vocab(50257) == 50304
    assert tokens.padded_vocab(300) == 320 and tokens.padded_vocab(256) == 256
    assert tokens.padded_vocab(1) == 64 and tokens.padded_vocab(1 << 20) == 1 << 20
    assert [tokens.token_dtype(v).itemsize for v in (2, 256, 257, 65536, 65537, 1 << 20)] == [1, 1, 2, 2, 4, 4]
    for bad in (0, -1, (1 << 20) + 1, True, 3.0):
        with pytest.raises(InputError, match=r"\[1, 2\^20\]"):
            tokens.padded_vocab(bad)


def test_llmc_and_flat_files_read_back(tmp_path):
    """[data.tokenfile.c1] llm.c header versions 1 and 2, flat uint16/uint32
    with a sidecar; files concatenated in the order given."""
    ids = _ids(1000, vocab=70000)
    a, b, c = tmp_path / "a.bin", tmp_path / "b.bin", tmp_path / "c.bin"
    small = ids % 50257
    tokens.write_llmc(a, small[:400], version=1)
    tokens.write_llmc(b, ids[400:700], version=2)
    _flat(c, ids[700:], "uint32", 70000)
    got, v, src = tokens.load_tokens([a, b, c], vocab=70000)
    assert v == 70000 and got.dtype == np.dtype("<u4")
    assert got.tolist() == small[:400].tolist() + ids[400:].tolist()
    assert [f["layout"] for f in src["files"]] == ["llm.c", "llm.c", "flat"]
    assert src["sha256"] == hashlib.sha256(got.astype("<u4").tobytes()).hexdigest()
    # a 50,257-token file is stored in two bytes
    got, v, _ = tokens.load_tokens([a], vocab=50257)
    assert got.dtype == np.dtype("<u2") and got.tolist() == small[:400].tolist()
    s = tokens.make_samples(got, 9)
    assert s.shape == (40, 10) and s[3].tolist() == small[30:40].tolist()


def _llmc_bytes(ids, version=1, count=None, magic=tokens.LLMC_MAGIC):
    h = np.zeros(256, "<i4")
    h[:3] = magic, version, len(ids) if count is None else count
    return h.tobytes() + np.asarray(ids, "<u2" if version == 1 else "<u4").tobytes()


@pytest.mark.parametrize(
    "content, vocab, message",
    [
        (_llmc_bytes([1, 2, 300]), V, r"token id 300 at position 2 is outside the vocabulary \[0, 300\)"),
        (_llmc_bytes([1, 2, 3])[:-1], V, "truncated"),
        (_llmc_bytes([1, 2, 3], count=4), V, "declares 4 tokens .*truncated"),
        (_llmc_bytes([1, 2, 3], count=2), V, "trailing bytes"),
        (_llmc_bytes([1, 2, 3], count=(1 << 31) - 1), V, "declares 2147483647 tokens"),
        (_llmc_bytes([1, 2, 3], count=-5), V, "declares -5 tokens"),
        (_llmc_bytes([1, 2, 3], count=0), V, "declares 0 tokens"),
        (_llmc_bytes([1, 2, 3], version=3), V, "version 3"),
        (_llmc_bytes([1, 2, 3], magic=20240521), V, "no llm.c header"),
        (b"\x01\x00" * 10, V, "shorter than the llm.c header"),
        (_llmc_bytes([1, 2, 3]), None, "vocabulary size is not known"),
        (_llmc_bytes([1, 2, 3]), 1 << 21, r"--vocab must be an integer in \[1, 2\^20\]"),
    ],
    ids=[
        "id-ge-V",
        "cut",
        "count-over",
        "count-under",
        "count-absurd",
        "count-negative",
        "count-zero",
        "version",
        "magic",
        "short",
        "no-vocab",
        "vocab-absurd",
    ],
)
def test_bad_llmc_files_are_refused(tmp_path, content, vocab, message):
    """[data.tokenfile.c1] ids >= V, truncation, header lies, absurd sizes."""
    p = tmp_path / "t.bin"
    p.write_bytes(content)
    with pytest.raises(InputError, match=message):
        tokens.load_tokens([p], vocab)


@pytest.mark.parametrize(
    "content, sidecar, vocab, message",
    [
        (b"\x01\x00\x02", {"dtype": "uint16", "vocab": V}, None, "odd byte count"),
        (b"\x01\x00\x02\x00\x03\x00", {"dtype": "uint32", "vocab": V}, None, "not a whole number of uint32"),
        (b"", {"dtype": "uint16", "vocab": V}, None, "empty token file"),
        (b"\x01\x00", {"dtype": "int16", "vocab": V}, None, "dtype must be one of"),
        (b"\x01\x00", {"dtype": "uint16", "vocab": 2**40}, None, r"vocab must be an integer in \[1, 2\^20\]"),
        (b"\x01\x00", {"dtype": "uint16", "vocab": "300"}, None, "vocab must be an integer"),
        (b"\x01\x00", {"dtype": "uint16", "vocab": V, "bos": 0}, None, "expected a JSON object with keys"),
        (b"\x01\x00", {"dtype": "uint16", "vocab": V}, 301, r"different vocabulary sizes \[300, 301\]"),
        (b"\x01\x00\xff\xff", {"dtype": "uint16", "vocab": V}, None, "token id 65535 at position 1"),
    ],
    ids=["odd", "u32-odd", "empty", "dtype", "vocab-absurd", "vocab-str", "extra-key", "vocab-differs", "id-ge-V"],
)
def test_bad_flat_files_are_refused(tmp_path, content, sidecar, vocab, message):
    """[data.tokenfile.c1] the sidecar is checked field by field."""
    p = tmp_path / "t.bin"
    p.write_bytes(content)
    (tmp_path / "t.bin.json").write_text(json.dumps(sidecar))
    with pytest.raises(InputError, match=message):
        tokens.load_tokens([p], vocab)


def test_sidecar_that_is_not_json_or_huge(tmp_path):
    p = tmp_path / "t.bin"
    p.write_bytes(b"\x01\x00")
    side = tmp_path / "t.bin.json"
    side.write_text("{")
    with pytest.raises(InputError, match="not valid JSON"):
        tokens.load_tokens([p])
    side.write_text("[" * 60000)
    with pytest.raises(InputError, match="not valid JSON"):
        tokens.load_tokens([p])
    side.write_text('{"dtype": ["uint16"], "vocab": 300}')
    with pytest.raises(InputError, match="dtype must be one of"):
        tokens.load_tokens([p])
    side.write_text(" " * (tokens.MAX_SIDECAR + 1))
    with pytest.raises(InputError, match="limit"):
        tokens.load_tokens([p])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    head=st.lists(st.integers(-(2**31), 2**31 - 1), min_size=3, max_size=3),
    body=st.binary(max_size=64),
    magic=st.booleans(),
)
def test_fuzzed_llmc_files_are_read_or_refused(tmp_path, head, body, magic):
    """[data.tokenfile.c1] any header and body: tokens that match the header
    exactly, or an InputError; never another exception."""
    h = np.zeros(256, "<i4")
    h[:3] = head
    if magic:
        h[0] = tokens.LLMC_MAGIC
    p = tmp_path / "f.bin"
    p.write_bytes(h.tobytes() + body)
    try:
        got, v, _ = tokens.load_tokens([p], 1 << 20)
    except InputError:
        return
    dt = tokens.LLMC_DTYPES[int(h[1])]
    assert len(body) == int(h[2]) * dt.itemsize
    assert got.tolist() == np.frombuffer(body, dt).tolist()


# ---- shards of wide tokens -------------------------------------------------------


def test_wide_token_shards_round_trip_and_refuse_ids_out_of_range(tmp_path):
    """[data.shards.c1] [data.hash.c1] two-byte tokens in shards; a shard
    holding an id >= V is refused, or, when damage is tolerated, unusable."""
    import zstandard

    samples = tokens.make_samples(_ids(5000 * 10).astype("<u2"), 9)
    m = data.write_shards(samples, tmp_path, {"kind": "test"}, V)
    assert m["vocab"] == V and len(m["shards"]) == 2
    back, _ = data.read_shards(tmp_path)
    assert back.dtype == np.dtype("<u2") and np.array_equal(back, samples)
    assert m["shards"][0]["sha256"] == hashlib.sha256(samples[:4096].astype("<u2").tobytes()).hexdigest()
    stream = data.Stream(back, 3, data.Batching(2, 2))
    assert stream.data_hash(1) == hashlib.sha256(stream.batch(1).astype("<u2").tobytes()).digest()
    bad = samples[:4096].copy()
    bad[7, 3] = V
    (tmp_path / "shard-00000.zst").write_bytes(zstandard.ZstdCompressor().compress(bad.tobytes()))
    with pytest.raises(InputError, match=r"token id 300 is outside the vocabulary \[0, 300\)"):
        data.read_shards(tmp_path)
    # tolerating damage (an auditor's replay), the shard is unusable: its
    # samples are never handed to the model, and the steps drawing them are named
    sh = data.read_shards(tmp_path, verify=False, problems=True)
    assert [(lo, hi) for lo, hi, _ in sh.unreadable] == [(0, 4096)]
    assert "token id 300 is outside the vocabulary" in sh.unreadable[0][2]
    assert not sh.samples[:4096].any() and np.array_equal(sh.samples[4096:], samples[4096:])
    assert sh.unreadable_in([5]) and not sh.unreadable_in([4096])
    with pytest.raises(ValueError, match="uint16"):
        data.write_shards(samples.astype(np.uint32), tmp_path / "x", {}, V)


# ---- runs from token files ------------------------------------------------------------


@pytest.fixture(scope="module")
def token_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    ids = _ids(60 * (T + 1), seed=7)
    tokens.write_llmc(d / "a.bin", ids[:1000])
    _flat(d / "b.bin", ids[1000:])
    out = d / "run"
    m, t = presets.preset("tiny")
    s = train(
        m,
        t,
        steps=3,
        checkpoint_every=2,
        out=out,
        launcher=launch.get("inproc", 1),
        preset="tiny",
        token_files=[d / "a.bin", d / "b.bin"],
        progress=None,
    )
    return d, out, s


def test_token_run_replays_and_binds_the_vocabulary(token_run):
    """[data.tokenfile.c1] [data.vocab.c1] the model's V is 320; step 3
    replays bit for bit from the step-2 checkpoint."""
    _, out, _ = token_run
    r = run.open_run(out, strict=False)
    assert r.recipe.model.vocab == 320 and r.manifest["vocab"] == V
    assert r.recipe.model.vocab == presets.ModelConfig(vocab=320).vocab
    assert r.stream().samples.dtype == np.dtype("<u2")
    res = replay(r, 3)
    assert res.verified and res.start == 2


def test_token_run_is_rank_count_invariant(token_run, tmp_path):
    """[data.stream.c1] [fold.ranks.c1] 1, 3 and 8 ranks: the same records."""
    d, out, s1 = token_run
    m, t = presets.preset("tiny")
    for ranks in (3, 8):
        o = tmp_path / f"r{ranks}"
        s = train(
            m,
            t,
            steps=3,
            checkpoint_every=2,
            out=o,
            launcher=launch.get("inproc", ranks),
            preset="tiny",
            token_files=[d / "a.bin", d / "b.bin"],
            progress=None,
        )
        assert s.head == s1.head
        assert (o / "steps.jsonl").read_text() == (out / "steps.jsonl").read_text()


def test_a_changed_token_changes_the_run(token_run, tmp_path):
    """[data.hash.c1] one token id different: another manifest, recipe and head."""
    d, _, s1 = token_run
    ids = np.fromfile(d / "b.bin", "<u2")
    ids[5] = (int(ids[5]) + 1) % V
    _flat(tmp_path / "b.bin", ids)
    m, t = presets.preset("tiny")
    s = train(
        m,
        t,
        steps=1,
        checkpoint_every=1,
        out=tmp_path / "o",
        launcher=launch.get("inproc", 1),
        preset="tiny",
        token_files=[d / "a.bin", tmp_path / "b.bin"],
        progress=None,
    )
    assert s.recipe_sha256 != s1.recipe_sha256


def test_manifest_vocabulary_must_pad_to_the_model(token_run, tmp_path):
    """[data.vocab.c1] a run whose manifest vocabulary does not pad to the
    recipe's V is refused on open."""
    import shutil

    _, out, _ = token_run
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    mp = bad / "data" / "manifest.json"
    m = json.loads(mp.read_text())
    m["vocab"] = 200
    mp.write_bytes(data.manifest_bytes(m))
    with pytest.raises(InputError, match="does not pad to"):
        run.open_run(bad, strict=False)


def test_cli_trains_from_token_files_and_refuses_bad_ones(token_run, tmp_path, capsys):
    """`train --tokens` exits 0 on good files and 2 on an id >= V, a
    truncated file, or --vocab without --tokens."""
    d, _, s1 = token_run
    ok = main(
        [
            "train",
            "--preset",
            "tiny",
            "--steps",
            "3",
            "--checkpoint-every",
            "2",
            "--quiet",
            "--tokens",
            str(d / "a.bin"),
            str(d / "b.bin"),
            "--out",
            str(tmp_path / "ok"),
        ]
    )
    cap = capsys.readouterr()
    assert ok == 0, cap.err
    assert s1.head in cap.out
    assert main(["replay", str(tmp_path / "ok"), "--step", "1", "--quiet"]) == 0
    capsys.readouterr()
    ids = np.fromfile(d / "b.bin", "<u2")
    high = tmp_path / "high.bin"
    tokens.write_llmc(high, np.concatenate([ids[:100], [V], ids[100:]]))
    short = tmp_path / "short.bin"
    short.write_bytes((d / "a.bin").read_bytes()[:-2])
    cases = [
        (["--tokens", str(high), "--vocab", str(V)], "token id 300 at position 100 is outside"),
        (["--tokens", str(short), "--vocab", str(V)], "truncated"),
        (["--vocab", "300"], "--vocab applies to --tokens files only"),
    ]
    for i, (extra, message) in enumerate(cases):
        code = main(["train", "--preset", "tiny", "--steps", "1", "--quiet", "--out", str(tmp_path / f"b{i}"), *extra])
        cap = capsys.readouterr()
        assert code == 2, (extra, cap.err)
        assert message in cap.err and "Traceback" not in cap.err


def test_embedding_backward_at_gpt2_vocabulary():
    """[emb.bwd.c1] at V = 50,304 with few tokens (the rows are initialised
    in one pass): per-id sums in increasing index from -0, unseen ids +0."""
    from refreplay.ops import embedding

    g = np.random.default_rng(3)
    tok = g.choice([7, 50303, 4096, 50256], size=(1, 40)).astype(np.int32)
    dout = g.standard_normal((1, 40, 96), dtype=np.float32)
    dout[0, tok[0] == 4096] = -0.0
    got = embedding.embedding_backward(dout, tok, 50304)
    bits = got.view(np.uint32)
    for v in (7, 50303, 50256):
        want = np.full(96, -0.0, np.float32)
        for i in np.flatnonzero(tok[0] == v):
            want = want + dout[0, i]  # float32 adds, one by one in increasing i
        assert np.array_equal(bits[v], want.view(np.uint32)), v
    assert np.all(bits[4096] == 0x80000000)  # only -0 contributions: stays -0
    seen = np.zeros(50304, bool)
    seen[[7, 50303, 4096, 50256]] = True
    assert not bits[~seen].any()  # +0 everywhere else
