"""benchmarks/bench_gemm.py at a tiny shape: its JSON, the two sides' agreement, and the
suite's row from it. The script runs in a subprocess (its absl flags stay out of this
process)."""

from __future__ import annotations

import json
import math

import pytest

from tests.processes import REPO, run_script
from tests.test_bench_run_all import run_all

SCRIPT = REPO / "benchmarks" / "bench_gemm.py"


def test_tiny_run_times_both_kinds_and_the_sides_agree(tmp_path):
  out = tmp_path / "gemm.json"
  proc = run_script(SCRIPT, "--shapes=tiny", "--calls=3", "--repeats=2", "--threads=1",
                    f"--out={out}", cwd=tmp_path)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(out.read_text())
  assert result["benchmark"] == "gemm" and result["torch_threads"] == 1
  forward, gradient = result["shapes"]
  assert (forward["kind"], gradient["kind"]) == ("forward", "weight_gradient")
  for row in result["shapes"]:
    assert (row["shape"], row["m"], row["k"], row["n"]) == ("tiny", 16, 32, 24)
    assert len(row["ours_seconds"]) == len(row["reference_seconds"]) == 2
    # The same products: x @ w, and x^T g through our matmul's custom gradient.
    assert row["max_relative_difference"] < 1e-5
    flops = 2 * 16 * 32 * 24
    assert row["ours_gflops"] == pytest.approx(flops / min(row["ours_seconds"]) / 1e9)
    assert row["ratio"] == pytest.approx(row["ours_gflops"] / row["reference_gflops"])
  # The plain dot that matmul.py replaces is timed for weight gradients only.
  assert forward["plain_ratio"] is None and len(gradient["plain_seconds"]) == 2
  assert gradient["plain_ratio"] == pytest.approx(gradient["plain_gflops"]
                                                  / gradient["reference_gflops"])
  summary = result["summary"]
  assert summary["ratio"] == pytest.approx(math.sqrt(forward["ratio"] * gradient["ratio"]))
  (row,) = run_all.extract_gemm(result)
  assert row["ratio"] == pytest.approx(summary["ratio"]) and row["target"] is None
  assert "| a tiny product (smoke runs) | 16 x 32 x 24 | forward |" in proc.stdout


def test_an_unknown_shape_is_named(tmp_path):
  proc = run_script(SCRIPT, "--shapes=tiny,huge", f"--out={tmp_path / 'g.json'}", cwd=tmp_path)
  assert proc.returncode != 0 and "unknown ['huge']" in proc.stderr
  assert not (tmp_path / "g.json").exists()
