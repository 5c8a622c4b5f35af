"""benchmarks/bench_scaling.py end to end at tiny sizes: every part's JSON rows and table.

The script runs in a subprocess (its absl flags stay out of this process), as the other
benchmark smoke tests do.
"""

from __future__ import annotations

import json
import pathlib
import subprocess

from tests.processes import run_script

REPO = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "bench_scaling.py"


def _run(tmp_path: pathlib.Path, *flags: str) -> subprocess.CompletedProcess:
  return run_script(SCRIPT, *flags, cwd=tmp_path)  # One device, no fakes.


def test_tiny_run_measures_every_part_and_size(tmp_path):
  out = tmp_path / "scaling.json"
  proc = _run(tmp_path, "--sizes=tiny", "--search_rows=3000,600", "--queries=7",
              "--train_batches=2,3", "--train_lengths=8:4,12:6", "--batch=2",
              "--source_length=12", "--target_length=6", "--decode_lengths=3,5",
              "--repeats=1", f"--out={out}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(out.read_text())
  assert result["benchmark"] == "scaling" and result["size"] == "tiny"
  assert [r["rows"] for r in result["search"]] == [600, 3000]  # Smallest first.
  for r in result["search"]:
    assert r["queries"] == 7 and r["k"] == 10 and r["best_s"] > 0
    assert r["ns_per_score"] == 1e9 * r["best_s"] / (7 * r["rows"])
  # Batches at the flag lengths, then lengths at --batch; (2, 12, 6) is listed once.
  shapes = [(r["batch"], r["source_length"], r["target_length"]) for r in result["train"]]
  assert shapes == [(2, 12, 6), (3, 12, 6), (2, 8, 4)]
  for r in result["train"]:
    # Ragged rows: real tokens between the padded shape's and its first (full) row's.
    padded = r["batch"] * (r["source_length"] + r["target_length"])
    assert r["source_length"] + r["target_length"] <= r["real_tokens"] <= padded
    assert r["tokens_per_s"] == r["real_tokens"] / r["best_s"] and r["compile_s"] > 0
  assert [r["new_tokens"] for r in result["decode"]] == [3, 5]
  for r in result["decode"]:
    assert r["tokens_per_s"] == 2 * r["new_tokens"] / r["best_s"]
  assert "| 3,000 |" in proc.stdout and "greedy decoding" in proc.stdout


def test_bad_flags_exit_with_one_line(tmp_path):
  proc = _run(tmp_path, "--parts=search,warp", f"--out={tmp_path / 'x.json'}")
  assert proc.returncode != 0
  assert proc.stderr.strip().splitlines() == ["unknown --parts ['warp']; expected some of "
                                              "['search', 'train', 'decode']"]
  assert not (tmp_path / "x.json").exists()


def test_a_bad_sweep_value_fails_before_any_part_runs(tmp_path):
  proc = _run(tmp_path, "--search_rows=1000", "--train_lengths=64:32,128",
              f"--out={tmp_path / 'x.json'}")
  assert proc.returncode != 0
  assert proc.stderr.strip().splitlines() == [
      "--train_lengths must be source:target pairs, got ['64:32', '128']"]
  assert "[search]" not in proc.stdout  # Nothing was measured first.
