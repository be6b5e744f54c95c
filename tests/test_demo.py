"""`refreplay demo`, the README's first command: trains, audits two sampled
steps with certificates, prints coverage and the conformance summary (the
golden vectors of three ops, NumPy failing them with diagnoses, and the
golden training steps of [conf.steps.c1]); exit 0 only if all verified."""

from __future__ import annotations

import json

from refreplay import cli


def test_demo_runs_end_to_end(tmp_path, capsys):
    out = tmp_path / "demo"
    assert cli.main(["demo", "--out", str(out), "--steps", "6", "--ranks", "3"]) == 0
    text = capsys.readouterr().out
    assert "Train the `tiny` preset for 6 steps on 3 in-process ranks" in text
    assert text.count("-> VERIFIED") == 2
    assert "reference matmul" in text and "numpy" in text and "diagnosis: matmul: contracts multiply-add" in text
    assert "golden training steps (vectors/steps.json): 32 records" in text and "reproduce bit for bit" in text
    assert "FAILED" not in text
    certs = sorted((out / "certs").glob("*.json"))
    assert len(certs) == 2 and all(json.loads(p.read_text())["verdict"] == "verified" for p in certs)
    # the auditor's key is private to its owner, and the coverage command the demo prints passes
    assert (out / "keys" / "demo-auditor.key").stat().st_mode & 0o777 == 0o600
    trust = out / "keys" / "demo-auditor.pub.pem"
    assert f"--trust {trust}" in text
    assert cli.main(["coverage", str(out / "run"), str(out / "certs"), "--trust", str(trust)]) == 0
    # a second demo replaces the first; a directory that is not a demo's is refused (exit 2)
    assert cli.main(["demo", "--out", str(out), "--steps", "5", "--ranks", "1"]) == 0
    other = tmp_path / "mine"
    other.mkdir()
    (other / "keep.txt").write_text("x")
    capsys.readouterr()
    assert cli.main(["demo", "--out", str(other)]) == 2
    assert "not a previous demo directory" in capsys.readouterr().err and (other / "keep.txt").exists()
