"""[conv.version.c1] A spec version replays the runs of the earlier versions
it lists, and only what their own version defines."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from refreplay import spec
from refreplay.training.run import canonical_json

import auditor_keys
from cli_helpers import run_cli

pytestmark = pytest.mark.usefixtures("one_numba_thread")

EARLIER = "0.2.0"


def _train(path, monkeypatch, *extra):
    """A tiny run made by an implementation of spec ``EARLIER``."""
    with monkeypatch.context() as m:
        m.setattr(spec, "version", lambda *a, **k: EARLIER)
        res = run_cli(
            "train",
            "--preset",
            "tiny",
            "--steps",
            2,
            "--out",
            path,
            "--byte-cap",
            1 << 15,
            "--checkpoint-every",
            1,
            "--quiet",
            *extra,
        )
    assert res.returncode == 0, res.stdout + res.stderr
    assert json.loads((path / "recipe.json").read_text())["recipe"]["spec_version"] == EARLIER
    return path


def _relabel(src, dst, **changes):
    """Copy a run and edit its recipe, recomputing the recipe's hash."""
    shutil.copytree(src, dst)
    rj = dst / "recipe.json"
    obj = json.loads(rj.read_text())
    for k, v in changes.items():
        if k == "precision":
            obj["recipe"]["model"]["precision"] = v
        else:
            obj["recipe"][k] = v
    obj["recipe_sha256"] = hashlib.sha256(canonical_json(obj["recipe"])).hexdigest()
    rj.write_text(json.dumps(obj, indent=2, sort_keys=True))
    return dst


@pytest.fixture(scope="module")
def earlier_run(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    try:
        return _train(tmp_path_factory.mktemp("v") / "run", mp)
    finally:
        mp.undo()


def test_this_version_lists_what_it_replays():
    assert spec.replayed_versions()[0] == spec.version() != EARLIER
    assert EARLIER in spec.replayed_versions()
    assert spec.replayed_versions() == ("0.4.0", "0.3.0", "0.2.0")  # 0.4.0 changed no bit of a run
    assert f"replays runs of\n  {EARLIER}" in spec.parse()[
        "conv.version.c1"
    ].text() or f"replays runs of {EARLIER}" in " ".join(spec.parse()["conv.version.c1"].text().split())


def test_a_run_of_the_earlier_version_replays_and_audits(earlier_run, tmp_path):
    res = run_cli("replay", earlier_run, "--step", 2)
    assert res.returncode == 0 and "VERIFIED: step 2" in res.stdout, res.stdout + res.stderr
    private, public = auditor_keys.key_files(tmp_path / "keys")
    res = run_cli(
        "audit",
        earlier_run,
        "--sample",
        2,
        "--beacon",
        "c0ffee",
        "--key",
        private,
        "--auditor",
        "eve",
        "--out",
        tmp_path / "certs",
        "--quiet",
    )
    assert res.returncode == 0, res.stdout + res.stderr
    certs = [json.loads(p.read_text()) for p in (tmp_path / "certs").glob("*.json")]
    this_spec = {"version": spec.version(), "sha256": spec.spec_sha256()}
    assert certs and all(c["verdict"] == "verified" and c["spec"] == this_spec for c in certs)
    res = run_cli("coverage", earlier_run, tmp_path / "certs", "--trust", public)
    assert res.returncode == 0, res.stdout + res.stderr


def test_an_earlier_run_tampered_still_fails(earlier_run, tmp_path):
    """Accepting the earlier version loosens nothing else: a bit flipped in
    a checkpoint of an earlier-version run is a mismatch."""
    run = tmp_path / "run"
    shutil.copytree(earlier_run, run)
    ck = run / "checkpoints" / "step-0000002.safetensors"
    raw = bytearray(ck.read_bytes())
    raw[-3] ^= 0x01
    ck.write_bytes(bytes(raw))
    res = run_cli("replay", run, "--step", 2)
    assert res.returncode == 1 and "VERIFIED" not in res.stdout, res.stdout + res.stderr


@pytest.mark.parametrize("version", ["0.1.0", "9.9.9", "0.2", ""])
def test_a_version_not_listed_is_refused(earlier_run, tmp_path, version):
    run = _relabel(earlier_run, tmp_path / "run", spec_version=version)
    res = run_cli("replay", run, "--step", 1)
    assert res.returncode == 2 and "spec" in res.stderr and "VERIFIED" not in res.stdout, res.stderr


def test_a_field_the_earlier_version_lacks_is_refused(earlier_run, tmp_path):
    """precision exists from spec 0.3.0: an earlier run that carries it is
    refused (exit 2), whatever its value."""
    run = _relabel(earlier_run, tmp_path / "run", precision="bf16")
    res = run_cli("replay", run, "--step", 1)
    assert res.returncode == 2 and "precision" in res.stderr and "VERIFIED" not in res.stdout, res.stderr


@pytest.mark.parametrize("version,accepted", [("0.3.0", True), ("0.4.0", True), ("0.2.0", False)])
def test_precision_is_gated_by_the_version_that_added_it(earlier_run, version, accepted):
    """[conv.version.c1] 0.4.0 replays 0.3.0's bf16 runs: the gate is "0.3.0
    or later", not "this version"."""
    from refreplay.errors import InputError
    from refreplay.training.run import recipe_from_json

    obj = json.loads((earlier_run / "recipe.json").read_text())
    obj["recipe"]["spec_version"] = version
    obj["recipe"]["model"]["precision"] = "bf16"
    obj["recipe_sha256"] = hashlib.sha256(canonical_json(obj["recipe"])).hexdigest()
    if accepted:
        assert recipe_from_json(obj).model.precision == "bf16"
    else:
        with pytest.raises(InputError, match="precision"):
            recipe_from_json(obj)
