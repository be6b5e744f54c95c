"""Data: corpus, samples, shards and the topology-invariant stream
([data.tokens.c1], [data.corpus.c1], [data.samples.c1], [data.shards.c1],
[data.stream.c1], [data.batch.c1], [data.hash.c1])."""

import hashlib
import json

import numpy as np
import pytest

from refreplay import rng
from refreplay.training import data, treefold
from refreplay.errors import InputError


def test_default_corpus_is_stdlib_sources_in_byte_order():
    """[data.corpus.c1] sorted by UTF-8 relative path, no site-packages, capped."""
    files = data.default_corpus_files()
    rels = [r for r, _ in files]
    assert len(rels) > 100 and all(r.endswith(".py") for r in rels)
    assert rels == sorted(rels, key=lambda r: r.encode())
    assert not any("site-packages" in r.split("/")[:-1] for r in rels)
    corpus, source = data.build_corpus(byte_cap=200_000)
    assert len(corpus) == 200_000 == source["bytes"]
    want = b"".join(p.read_bytes() for _, p in files[: source["files_used"]])[:200_000]
    assert corpus == want
    assert source["sha256"] == hashlib.sha256(corpus).hexdigest()


def test_user_files_in_given_order(tmp_path):
    """[data.corpus.c1] named files concatenated in the order named."""
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_bytes(b"hello ")
    b.write_bytes(b"world")
    corpus, _ = data.build_corpus([b, a], byte_cap=8)
    assert corpus == b"worldhel"
    with pytest.raises(InputError, match="not found"):
        data.build_corpus([tmp_path / "missing.txt"])


def test_samples_are_consecutive_slices():
    """[data.samples.c1] [data.tokens.c1] sample i = bytes [i(T+1), (i+1)(T+1)); tail dropped."""
    corpus = bytes(range(256)) * 2
    s = data.make_samples(corpus, 9)
    assert s.shape == (51, 10) and s.dtype == np.uint8
    assert s[3].tolist() == list(range(30, 40))
    x, y = data.inputs_targets(s[:2])
    assert x.dtype == np.int32 and x.shape == (2, 9)
    assert y[1].tolist() == list(range(11, 20))
    with pytest.raises(InputError):
        data.make_samples(b"abc", 5)


def _shards(tmp_path, n=9000, t=7):
    samples = np.random.default_rng(0).integers(0, 256, size=(n, t + 1), dtype=np.uint8)
    manifest = data.write_shards(samples, tmp_path, {"kind": "test"})
    return samples, manifest


def test_shards_round_trip_and_hashes(tmp_path):
    """[data.shards.c1] shards of 4096 samples, content SHA-256 in the manifest."""
    samples, manifest = _shards(tmp_path)
    assert [s["samples"] for s in manifest["shards"]] == [4096, 4096, 808]
    assert manifest["shards"][1]["sha256"] == hashlib.sha256(samples[4096:8192].tobytes()).hexdigest()
    back, m2 = data.read_shards(tmp_path)
    assert m2 == manifest and back.tobytes() == samples.tobytes()


def test_corrupt_missing_or_tampered_shards_are_refused(tmp_path):
    """[data.shards.c1] a reader refuses any mismatch with a clear InputError."""
    import zstandard

    samples, manifest = _shards(tmp_path)
    # a changed token, recompressed so that the zstd frame itself is valid
    bad = samples[8192:].copy()
    bad[5, 3] ^= 1
    raw = (tmp_path / "shard-00002.zst").read_bytes()
    (tmp_path / "shard-00002.zst").write_bytes(zstandard.ZstdCompressor().compress(bad.tobytes()))
    with pytest.raises(InputError, match="shard-00002.zst: content sha256"):
        data.read_shards(tmp_path)
    (tmp_path / "shard-00002.zst").write_bytes(raw[:-7] + b"garbage")
    with pytest.raises(InputError, match="corrupt"):
        data.read_shards(tmp_path)
    (tmp_path / "shard-00002.zst").unlink()
    with pytest.raises(InputError, match="missing data shard"):
        data.read_shards(tmp_path)
    m = json.loads((tmp_path / "manifest.json").read_text())
    m["shards"][0]["file"] = "../../etc/passwd"
    (tmp_path / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(InputError, match="must be named shard-00000.zst"):
        data.read_shards(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        data.read_shards(tmp_path)
    (tmp_path / "manifest.json").unlink()
    with pytest.raises(InputError, match="missing shard manifest"):
        data.read_shards(tmp_path)


def test_step_samples_follow_the_epoch_permutation():
    """[data.stream.c1] step n = entries [jG, (j+1)G) of epoch e's permutation,
    written out from the spec with the permutation of [rng.data.c1]."""
    seed, g, n = 1234, 6, 40  # E = 6 steps per epoch, 4 samples unused per epoch
    for step in range(1, 20):
        e, j = (step - 1) // 6, (step - 1) % 6
        perm = rng.permutation(seed, rng.STREAM_DATA, e, n)
        want = perm[j * g : (j + 1) * g]
        assert data.step_sample_ids(seed, step, g, n).tolist() == want.tolist()
    epoch0 = np.concatenate([data.step_sample_ids(seed, s, g, n) for s in range(1, 7)])
    assert len(set(epoch0.tolist())) == 36  # no sample twice in an epoch
    assert data.step_sample_ids(seed + 1, 1, g, n).tolist() != data.step_sample_ids(seed, 1, g, n).tolist()
    with pytest.raises(InputError, match="fewer than one global batch"):
        data.step_sample_ids(seed, 1, 50, 40)


def test_stream_is_rank_invariant():
    """[data.batch.c1] micro-batch m = samples [mB, (m+1)B); the ranks' shares
    concatenated give the same batch for every R."""
    samples = np.random.default_rng(1).integers(0, 256, size=(500, 9), dtype=np.uint8)
    stream = data.Stream(samples, 99, data.Batching(micro_batches=8, micro_batch_size=3))
    for step in (1, 2, 20, 21, 45):
        ids = stream.sample_ids(step)
        assert ids.tolist() == data.step_sample_ids(99, step, 24, 500).tolist()
        batch = stream.batch(step)
        assert batch.tobytes() == samples[ids].tobytes()
        for r in range(1, 9):
            got = [stream.micro_batch(step, m) for a, b in treefold.rank_ranges(8, r) for m in range(a, b)]
            assert np.concatenate(got).tobytes() == batch.tobytes()
        assert stream.micro_batch(step, 5).tobytes() == samples[ids[15:18]].tobytes()


def test_data_hash_is_sha256_of_the_batch_bytes():
    """[data.hash.c1] SHA-256 of the G(T+1) bytes in stream order."""
    samples = np.arange(40 * 5, dtype=np.uint32).astype(np.uint8).reshape(40, 5)
    stream = data.Stream(samples, 5, data.Batching(2, 2))
    ids = data.step_sample_ids(5, 3, 4, 40)
    want = hashlib.sha256(b"".join(samples[i].tobytes() for i in ids)).digest()
    assert stream.data_hash(3) == want
    assert stream.data_hash(4) != want
