"""Tensor files: deterministic layout [state.file.c1] and the validating
reader [state.fileread.c1]."""

import json
import os
import struct

import numpy as np
import pytest
from safetensors.numpy import load_file

from refreplay import tensorio
from refreplay.errors import InputError


def f32_bits(*bits):
    return np.array(bits, dtype=np.uint32).view(np.float32)


def sample():
    return {
        "w": f32_bits(
            0x7FC00001, 0xFFC12345, 0x7F800001, 0x80000000, 0x00000001, 0x807FFFFF, 0x3F800000, 0xFF800000
        ).reshape(2, 4),
        "q": np.array([-128, 127, 0], dtype=np.int8),
        "step": np.int64(-3),
        "n": np.array(2**31 - 1, dtype=np.int32),
        "bf16": np.array([0x3F80, 0xFFC1, 0x0001], dtype=np.uint16),
        "rng": np.array([[2**64 - 1]], dtype=np.uint64),
        "u": np.array([0xDEADBEEF], dtype=np.uint32),
        "tok": np.arange(5, dtype=np.uint8),
        "empty": np.zeros((3, 0), dtype=np.float32),
        "ñame": np.float32(1),
    }


def same_bits(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def test_round_trip_is_bit_exact(tmp_path):
    """[state.file.c1] [state.fileread.c1] storage copies bits: NaN payloads,
    -0, subnormals, every dtype, 0-d and empty tensors, unicode metadata."""
    s = sample()
    meta = json.dumps({"recipe": "tiny", "note": 'é\n"x" \U0001f600'})
    tensorio.save(tmp_path / "a.safetensors", s, meta)
    got, got_meta = tensorio.load(tmp_path / "a.safetensors")
    assert got_meta == meta
    assert list(got) == sorted(s, key=lambda n: n.encode())
    for name, arr in s.items():
        assert same_bits(got[name], np.asarray(arr)), name
        assert got[name].flags.c_contiguous and got[name].flags.writeable and got[name].flags.aligned
    tensorio.save(tmp_path / "b.safetensors", {"x": np.float32(2)})
    assert tensorio.load(tmp_path / "b.safetensors")[1] is None


def py_file(tensors, metadata):
    """[state.file.c1] the layout transcribed from the spec text."""
    names = sorted(tensors, key=lambda n: n.encode())
    header, data, off = {}, b"", 0
    for n in names:
        a = np.asarray(tensors[n])
        code = {
            "float32": "F32",
            "int8": "I8",
            "int32": "I32",
            "int64": "I64",
            "uint32": "U32",
            "uint64": "U64",
            "uint16": "U16",
            "uint8": "U8",
        }[a.dtype.name]
        b = a.astype(a.dtype.newbyteorder("<")).tobytes()
        header[n] = {"data_offsets": [off, off + len(b)], "dtype": code, "shape": list(a.shape)}
        data += b
        off += len(b)
    if metadata is not None:
        header["__metadata__"] = {"refreplay": metadata}
    text = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def test_bytes_are_deterministic_and_match_the_spec_layout(tmp_path):
    """[state.file.c1] same contents -> same bytes, whatever the dict order."""
    s = sample()
    tensorio.save(tmp_path / "a", s, "m")
    tensorio.save(tmp_path / "b", dict(reversed(list(s.items()))), "m")
    a, b = (tmp_path / "a").read_bytes(), (tmp_path / "b").read_bytes()
    assert a == b == py_file(s, "m")
    assert struct.unpack("<Q", a[:8])[0] % 8 == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]  # no temp files left


def test_files_are_ordinary_safetensors(tmp_path):
    """[state.file.c1] the safetensors package reads refreplay files unchanged."""
    s = sample()
    tensorio.save(tmp_path / "a", s, "m")
    other = load_file(tmp_path / "a")
    for name, arr in s.items():
        assert same_bits(other[name], np.asarray(arr))


def test_save_refuses_what_it_cannot_store(tmp_path):
    with pytest.raises(TypeError, match="float64 is not a state dtype"):
        tensorio.save(tmp_path / "x", {"a": np.zeros(2)})
    with pytest.raises(ValueError, match="reserved"):
        tensorio.save(tmp_path / "x", {"__metadata__": np.zeros(2, np.float32)})
    with pytest.raises(TypeError, match="metadata must be a str"):
        tensorio.save(tmp_path / "x", {}, {"a": "b"})
    assert list(tmp_path.iterdir()) == []


# ---- malformed files: each refused with InputError naming file and reason ----------------


def raw_file(path, header, data=b"", hlen=None):
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text) if hlen is None else hlen) + text + data)
    return path


def refused(path, pattern):
    with pytest.raises(InputError, match=pattern) as exc:
        tensorio.load(path)
    assert str(path) in str(exc.value)


def entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def test_truncated_files(tmp_path):
    """[state.fileread.c1]"""
    tensorio.save(tmp_path / "ok", sample(), "m")
    good = (tmp_path / "ok").read_bytes()
    (tmp_path / "short").write_bytes(good[:5])
    refused(tmp_path / "short", "truncated: 5 bytes")
    (tmp_path / "cut").write_bytes(good[:-1])
    refused(tmp_path / "cut", "tensors cover|run past the data section")
    (tmp_path / "cut_header").write_bytes(good[:40])
    refused(tmp_path / "cut_header", "exceeds the 32 bytes that follow")
    refused(tmp_path / "missing", "cannot open")


def test_absurd_header_length_is_refused_before_allocating(tmp_path):
    """[state.fileread.c1] a header claiming 2^60 bytes is refused from the file size."""
    p = raw_file(tmp_path / "huge", {}, hlen=1 << 60)
    refused(p, f"header length {1 << 60} exceeds")


def test_overlapping_and_gapped_offsets(tmp_path):
    """[state.fileread.c1] tensors must tile the data exactly."""
    over = {"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 4, 12)}
    refused(raw_file(tmp_path / "over", over, bytes(12)), "'b': bytes \\[4, 12\\) overlap tensor 'a'")
    gap = {"a": entry("F32", [1], 0, 4), "b": entry("F32", [1], 8, 12)}
    refused(raw_file(tmp_path / "gap", gap, bytes(12)), "leaving bytes \\[4, 8\\) unused")
    past = {"a": entry("F32", [4], 0, 16)}
    refused(raw_file(tmp_path / "past", past, bytes(8)), "run past the data section")
    extra = {"a": entry("F32", [1], 0, 4)}
    refused(raw_file(tmp_path / "extra", extra, bytes(8)), "tensors cover 4 bytes of a 8-byte")
    dup = {"a": entry("F32", [1], 0, 4), "b": entry("F32", [1], 0, 4)}
    refused(raw_file(tmp_path / "dup", dup, bytes(4)), "overlap tensor 'a'")


def test_bad_json_and_bad_entries(tmp_path):
    """[state.fileread.c1]"""
    refused(raw_file(tmp_path / "json", b'{"a": {"dtype": "F32",'), "not valid JSON")
    refused(raw_file(tmp_path / "utf8", b'{"\xff": 1}'), "not UTF-8")
    refused(raw_file(tmp_path / "list", b"[1, 2]"), "must be a JSON object")
    refused(raw_file(tmp_path / "dupkey", b'{"a": 1, "a": 2}'), "duplicate key 'a'")
    refused(raw_file(tmp_path / "nan", b'{"a": NaN}'), "non-standard JSON constant NaN")
    refused(raw_file(tmp_path / "deep", b"[" * 100_000), "not valid JSON")
    refused(raw_file(tmp_path / "dtype", {"a": entry("F16", [1], 0, 2)}, bytes(2)), "unknown dtype 'F16'")
    refused(raw_file(tmp_path / "bf16", {"a": entry("BF16", [1], 0, 2)}, bytes(2)), "stored as U16 bits")
    refused(
        raw_file(tmp_path / "shape", {"a": entry("F32", [3], 0, 8)}, bytes(8)),
        "needs 12 bytes but data_offsets \\[0, 8\\] span 8",
    )
    refused(raw_file(tmp_path / "neg", {"a": entry("F32", [-1], 0, 0)}), "shape must be")
    refused(raw_file(tmp_path / "boolshape", {"a": entry("U8", [True], 0, 1)}, bytes(1)), "shape must be")
    refused(raw_file(tmp_path / "offs", {"a": entry("U8", [1], 1, 0)}, bytes(1)), "data_offsets must be")
    refused(raw_file(tmp_path / "keys", {"a": {"dtype": "U8", "shape": [1]}}, bytes(1)), "exactly the keys")
    meta2 = {"__metadata__": {"refreplay": "x", "other": "y"}}
    refused(raw_file(tmp_path / "meta", meta2), "__metadata__ must be")
    refused(raw_file(tmp_path / "metatype", {"__metadata__": {"refreplay": 3}}), "__metadata__ must be")
    refused(raw_file(tmp_path / "empty_name", {"": entry("U8", [0], 0, 0)}), "empty name")


def test_reader_accepts_any_valid_layout(tmp_path):
    """[state.fileread.c1] a non-canonical but valid file (unsorted offsets,
    unaligned float32) is read; unaligned data is copied to aligned memory."""
    hdr = {"b": entry("F32", [1], 1, 5), "a": entry("U8", [1], 0, 1)}
    p = raw_file(tmp_path / "alt", hdr, b"\x07" + np.float32(1.5).tobytes())
    got, meta = tensorio.load(p)
    assert meta is None and got["a"].tolist() == [7] and got["b"].tolist() == [1.5]
    assert got["b"].flags.aligned


@pytest.mark.parametrize("dtype", [["F32"], {"F32": 1}, 7, None])
def test_header_dtype_of_another_json_type_is_refused(tmp_path, dtype):
    """[state.fileread.c1] a dtype that is not a string (a list is unhashable:
    it used to escape as TypeError) is refused like an unknown name."""
    header = json.dumps({"a": {"data_offsets": [0, 4], "dtype": dtype, "shape": [1]}}).encode()
    header += b" " * (-len(header) % 8)
    p = tmp_path / "f.safetensors"
    p.write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 4)
    with pytest.raises(InputError, match="unknown dtype"):
        tensorio.load(p)


@pytest.mark.parametrize("loader", [tensorio.load, tensorio.load_mapped])
def test_a_fifo_or_directory_is_refused_without_blocking(tmp_path, loader):
    """[state.fileread.c1] Opening a FIFO for reading would block forever."""
    fifo = tmp_path / "ckpt.safetensors"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="not a regular file"):
        loader(fifo)
    with pytest.raises(InputError, match="not a regular file"):
        loader(tmp_path)


def test_mapped_and_read_loads_agree(tmp_path):
    """[state.fileread.c1] One validating reader: the same tensors, mapped read-only or read writable."""
    t = {
        "a": np.arange(6, dtype=np.float32).reshape(2, 3),
        "b": np.array([1, 2], np.int64),
        "c": np.zeros((0,), np.float32),
    }
    tensorio.save(tmp_path / "x", t, "m")
    (r, m), (q, n) = tensorio.load(tmp_path / "x"), tensorio.load_mapped(tmp_path / "x")
    assert m == n == "m" and list(r) == list(q) == sorted(t)
    for k in t:
        assert r[k].dtype == q[k].dtype and np.array_equal(r[k], q[k]) and np.array_equal(r[k], t[k])
        assert r[k].flags.writeable and not q[k].flags.writeable
