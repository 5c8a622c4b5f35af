"""benchmarks/bench_precision.py on the tiny world: both precisions timed per row, the ratio
theirs, the encodings alike. The script runs in a subprocess (its absl flags stay out of
this process)."""

from __future__ import annotations

import json

import pytest

from tests.processes import REPO, run_script

SCRIPT = REPO / "benchmarks" / "bench_precision.py"


def test_tiny_run_times_each_row_at_both_precisions(tmp_path):
  out = tmp_path / "precision.json"
  proc = run_script(SCRIPT, "--scale=tiny", "--stages=classifier", "--batches=2",
                    "--sentences=16", f"--data_dir={tmp_path / 'world'}", f"--out={out}",
                    cwd=tmp_path)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(out.read_text())
  assert result["scale"] == "tiny"
  encoding, classifier = result["rows"]
  assert encoding["row"].startswith("MiniLM encoding (16 sentences")
  assert encoding["min_cosine"] > 0.999  # bfloat16 operands, float32 sums: the same vectors.
  assert classifier["row"].startswith("classifier training step")
  assert [len(v) for v in classifier["first_calls_s"].values()] == [2, 2]
  for row in result["rows"]:
    assert row["float32_s"] > 0 and row["bfloat16_s"] > 0
    assert row["bfloat16_over_float32"] == pytest.approx(
        row["bfloat16_s"] / row["float32_s"], abs=2e-3)
  assert "| classifier training step" in proc.stdout


def test_an_unknown_stage_is_named(tmp_path):
  proc = run_script(SCRIPT, "--stages=classifier,rerank", f"--out={tmp_path / 'p.json'}",
                    cwd=tmp_path)
  assert proc.returncode != 0 and "unknown ['rerank']" in proc.stderr
  assert not (tmp_path / "p.json").exists()
