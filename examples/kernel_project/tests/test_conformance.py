"""The kernels against refreplay's golden vectors, through the Python API."""

import pytest

import refreplay.conformance as conformance
from mykernels import conformant, plus_zero_start


def test_conformant_kernels(refreplay_conformance):
    report = refreplay_conformance(conformant, ops=["add", "sum"])
    assert report.counts["fail"] == 0 and report.counts["pass"] > 0


def test_plus_zero_start_is_diagnosed():
    report = conformance.check(plus_zero_start, ops=["sum"])
    assert not report.conformant
    failed = [c for c in report.cases if c["status"] == "fail"]
    assert failed and {c["family"] for c in failed} == {"signed_zero"}
    (finding,) = report.diagnosis
    assert "start the sum from -0, not +0" in finding["message"]
    with pytest.raises(AssertionError, match="sign of zero differs"):
        report.assert_conformant()
