"""Golden vectors: regeneration is byte-identical to what is committed, the
manifest is complete and cites real clauses, probes cannot be vacuous, and a
corrupted file or manifest is refused with exit 2 ([conf.vectors.c1],
[conf.verify.c1], [conf.probes.c1])."""

import json
import shutil

import numpy as np
import pytest

from refreplay import cli, spec
from refreplay.conformance.inputs import builders, separation
from refreplay.conformance.base import deviant as fp
from refreplay.conformance.golden import generate
from refreplay.conformance.readings import orders
from refreplay.conformance.golden import store
from refreplay.conformance.golden import regenerate as verify
from refreplay.conformance.base.case import FAMILIES

# 24.5 MB before the axis sweeps of [conf.domain.c1] (issue 31), 37.2 MB with them: the cap the
# issue allows, with the reason in refreplay/conformance/shapes/axes.py
MAX_BYTES = 40 * 1000 * 1000


@pytest.fixture(scope="module")
def fresh():
    """One in-memory regeneration, shared by the tests of this module."""
    return store.encode(generate.build_all(), spec.version(), generate.GENERATOR_VERSION, generate.SEED)


def test_regeneration_is_byte_identical_to_committed(fresh):
    # [conf.verify.c1] what `refreplay vectors verify` checks
    assert verify.compare(fresh, store.VECTOR_DIR) == []


def test_vectors_verify_command_passes(capsys, fresh, monkeypatch):
    monkeypatch.setattr(generate, "build_all", lambda: _cases_of(fresh))
    assert cli.main(["vectors", "verify"]) == 0
    assert "identical" in capsys.readouterr().out


def _cases_of(files):
    # decode the fixture back into cases so the command does not regenerate a second time
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        store.write(files, Path(d))
        return store.load_cases(Path(d))[1]


def test_total_size_within_budget():
    total = sum(p.stat().st_size for p in store.VECTOR_DIR.iterdir() if p.is_file())
    assert 0 < total <= MAX_BYTES


def test_manifest_is_complete_and_cites_existing_clauses():
    m = store.read_manifest()
    clauses = spec.parse()
    assert m["spec_version"] == spec.version() and m["seed"] == generate.SEED
    assert m["generator_version"] == generate.GENERATOR_VERSION
    ops = {c["op"] for c in m["cases"]}
    assert {"sum", "max", "dot", "matmul", "matmul_nt", "matmul_tn", "matmul_i8", "exp", "add"} <= ops
    for c in m["cases"]:
        assert c["family"] in FAMILIES
        assert c["clauses"] and all(lb.strip("[]") in clauses for lb in c["clauses"]), c["id"]
        assert all(len(t["sha256"]) == 64 for t in c["outputs"])
    for name, entry in m["files"].items():
        assert store.sha256((store.VECTOR_DIR / name).read_bytes()) == entry["sha256"]


def test_matmul_has_every_probe_family():
    fams = {c["family"] for c in store.read_manifest()["cases"] if c["op"] == "matmul"}
    assert fams >= {
        "random",
        "edge",
        "fma",
        "order",
        "ftz_before_rounding",
        "flush",
        "input_zeroing",
        "nan",
        "signed_zero",
        "tf32",
    }


def test_ftz_window_probe_products_round_up_to_flt_min():
    # [num.flush.c1] exact products in [2^-126 (1 - 2^-24), 2^-126)
    from fractions import Fraction

    _, cases = store.load_cases(ops={"mul"})
    case = next(c for c in cases if c.family == "ftz_before_rounding")
    lo, hi = Fraction(2) ** -126 * (1 - Fraction(2) ** -24), Fraction(2) ** -126
    for a, b, y in zip(case.inputs["a"], case.inputs["b"], case.outputs["out"]):
        p = abs(Fraction(float(a)) * Fraction(float(b)))
        assert lo <= p < hi
        assert fp.bits(np.abs(y)) == 0x00800000


def test_vendor_probe_inputs_are_not_correctly_rounded_by_the_spec():
    # [num.exp.c1] the probe holds inputs where the algorithm's result is not
    # the correctly rounded one (mpmath oracle, tests only)
    import mpmath

    _, cases = store.load_cases(ops={"exp"})
    case = next(c for c in cases if c.family == "vendor_transcendental")
    xs, ys = case.inputs["x"][:40], case.outputs["out"][:40]
    mpmath.mp.prec = 100
    for x, y in zip(xs, ys):
        cr = np.float32(float(mpmath.exp(mpmath.mpf(float(x)))))
        assert fp.bits(cr) != fp.bits(y)


def test_isolation_check_rejects_a_vacuous_probe():
    # exact products: contraction cannot change anything, so this is no fma probe
    a = np.ones((1, 2), np.float32)
    b = np.array([[1.0, -1.0]], np.float32)
    with pytest.raises(separation.ProbeError):
        builders.check_isolation("fma", (a, b), np.zeros(1, np.float32))
    # an order-sensitive sum is no nan probe
    x = np.array([[1.0, 2.0**-24, 2.0**-24]], np.float32)
    with pytest.raises(separation.ProbeError):
        builders.check_isolation("nan", (x, None), orders.spec_order(False)(x))


def _copy_vectors(tmp_path):
    d = tmp_path / "vectors"
    shutil.copytree(store.VECTOR_DIR, d)
    return d


def _offset(data: bytes, key: str) -> int:
    """Byte offset of a tensor's data in a safetensors file."""
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    return 8 + n + header[key]["data_offsets"][0]


def test_verify_names_the_corrupted_case(tmp_path, fresh):
    d = _copy_vectors(tmp_path)
    data = bytearray((d / "matmul.safetensors").read_bytes())
    data[_offset(bytes(data), "matmul-fma-03/out/C")] ^= 0x01
    (d / "matmul.safetensors").write_bytes(bytes(data))
    problems = verify.compare(fresh, d)
    assert any("case matmul-fma-03 differs" in p for p in problems)
    assert len([p for p in problems if "matmul.safetensors" in p]) == 1


def test_corrupted_vector_file_exits_2(tmp_path, capsys):
    d = _copy_vectors(tmp_path)
    data = bytearray((d / "sum.safetensors").read_bytes())
    data[-3] ^= 0x40
    (d / "sum.safetensors").write_bytes(bytes(data))
    assert cli.main(["conform", "reference", "--op", "sum", "--vectors", str(d)]) == 2
    err = capsys.readouterr().err
    assert "sum.safetensors" in err and "sha256" in err


def test_corrupted_manifest_exits_2(tmp_path, capsys):
    d = _copy_vectors(tmp_path)
    (d / "manifest.json").write_text((d / "manifest.json").read_text()[:-40])
    assert cli.main(["conform", "reference", "--op", "sum", "--vectors", str(d)]) == 2
    assert "corrupt manifest" in capsys.readouterr().err


def test_edited_expected_digest_exits_2(tmp_path, capsys):
    d = _copy_vectors(tmp_path)
    m = json.loads((d / "manifest.json").read_text())
    case = next(c for c in m["cases"] if c["op"] == "sum")
    case["outputs"][0]["sha256"] = "0" * 64
    (d / "manifest.json").write_text(json.dumps(m))
    assert cli.main(["conform", "reference", "--op", "sum", "--vectors", str(d)]) == 2
    assert "sha256" in capsys.readouterr().err


def test_vectors_for_another_spec_version_exit_2(tmp_path, capsys):
    d = _copy_vectors(tmp_path)
    m = json.loads((d / "manifest.json").read_text())
    m["spec_version"] = "0.0.0-other"
    (d / "manifest.json").write_text(json.dumps(m))
    assert cli.main(["conform", "reference", "--op", "sum", "--vectors", str(d)]) == 2
    assert "spec 0.0.0-other" in capsys.readouterr().err
