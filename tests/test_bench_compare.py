"""benchmarks/compare.py: a row more than 10 % slower relative to its yardstick fails the check."""

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "compare.py"


def matmul(of_peak_512, of_peak_1024, peak=100.0):
    rows = [
        dict(name="square 512", of_peak=of_peak_512, refreplay_gflops=of_peak_512 * peak),
        dict(name="square 1024", of_peak=of_peak_1024, refreplay_gflops=of_peak_1024 * peak),
    ]
    return dict(runs=[dict(threads=1, peak_gflops=peak, rows=rows)])


def ops(ms, peak):
    return dict(rows=[dict(op="gelu", threads=1, refreplay_ms=ms, peak_gflops=peak)])


def run(tmp_path, old, new, *extra):
    (tmp_path / "old.json").write_text(json.dumps(old))
    (tmp_path / "new.json").write_text(json.dumps(new))
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "old.json"), str(tmp_path / "new.json"), *extra],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_regressed_row_fails(tmp_path):
    out = run(tmp_path, matmul(0.80, 0.80), matmul(0.80, 0.70))  # 1024: 0.70 < 0.80 / 1.1
    assert out.returncode == 1, out.stdout + out.stderr
    assert "square 1024" in out.stdout and "SLOWER" in out.stdout
    assert out.stdout.count("SLOWER") == 1


def test_within_ten_percent_passes(tmp_path):
    out = run(tmp_path, matmul(0.80, 0.80), matmul(0.74, 0.95))  # 0.74 > 0.80 / 1.1 = 0.727
    assert out.returncode == 0, out.stdout + out.stderr
    assert run(tmp_path, matmul(0.80, 0.80), matmul(0.74, 0.95), "--threshold", "0.05").returncode == 1


def test_ops_rows_scale_by_the_peak(tmp_path):
    # twice the time on a machine with half the peak: not a regression; the same time at the
    # same peak plus 20 %: a regression
    assert run(tmp_path, ops(10.0, 100.0), ops(20.0, 50.0)).returncode == 0
    assert run(tmp_path, ops(10.0, 100.0), ops(12.0, 100.0)).returncode == 1


def test_machine_file_sections(tmp_path):
    old = {"machine": {"cpu": "x"}, "matmul": matmul(0.8, 0.8), "ops-small": ops(10.0, 100.0)}
    new = {"machine": {"cpu": "x"}, "matmul": matmul(0.8, 0.8), "ops-small": ops(13.0, 100.0)}
    out = run(tmp_path, old, new)
    assert out.returncode == 1 and "ops-small" in out.stdout


def test_bench_result_against_machine_file(tmp_path):
    """A bench_matmul result matches the machine file's matmul section row by row."""
    out = run(tmp_path, matmul(0.8, 0.8), {"machine": {}, "matmul": matmul(0.8, 0.6)})
    assert out.returncode == 1 and out.stdout.count("SLOWER") == 1


def test_bad_input_is_exit_2(tmp_path):
    assert run(tmp_path, {"rows": []}, {"rows": []}).returncode == 2  # nothing comparable
    (tmp_path / "junk.json").write_text("{not json")
    out = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "junk.json"), str(tmp_path / "junk.json")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    out = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
