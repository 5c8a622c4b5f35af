"""benchmarks/bench_bart_train.py end to end at a tiny size: JSON fields and loss agreement.

The script runs in a subprocess (its absl flags stay out of this process) with XLA's backend
optimisation off, which halves the compile time of the two tiny train steps and changes
nothing the test checks.
"""

from __future__ import annotations

import json
import pathlib
import subprocess

from tests.processes import run_script

REPO = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "bench_bart_train.py"


def _run(tmp_path: pathlib.Path, *flags: str) -> subprocess.CompletedProcess:
  return run_script(SCRIPT, *flags, cwd=tmp_path)  # One device, no fakes.


def test_tiny_run_writes_every_field_and_the_two_sides_agree(tmp_path):
  out = tmp_path / "bart_train.json"
  proc = _run(tmp_path, "--sizes=tiny", "--repeats=1", "--batch=3", "--source_length=10",
              "--target_length=6", "--threads=1", "--noreinforce", f"--out={out}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(out.read_text())
  assert result["benchmark"] == "bart_train" and result["batch"] == 3
  (r,) = result["results"]
  assert r["size"] == "tiny" and r["d_model"] == 32
  # Real tokens only: the first row is full, the others ragged (so masks are exercised).
  assert 6 < r["target_tokens"] < 3 * 6 and r["target_tokens"] + 3 * 10 >= r["all_tokens"]
  # The REINFORCE step is left out here (its compile doubles the test's cost); its loss is
  # tested in tests/test_explanation_generator.py.
  assert sorted(r["runs"]) == ["ours", "reference"] and "reinforce" not in r
  for side in ("ours", "reference"):
    run = r["runs"][side]
    assert len(run["seconds"]) == 1 and run["best_s"] > 0
    assert run["target_tokens_per_s"] == r["target_tokens"] / run["best_s"]
    assert run["tokens_per_s"] == r["all_tokens"] / run["best_s"]
    assert run["first_step_s"] > 0 and "peak_extra_gb" in run
  assert r["ratio"] == r["runs"]["ours"]["tokens_per_s"] / r["runs"]["reference"]["tokens_per_s"]
  assert r["ours_compile_s"] > 0
  # Same weights, same batch, dropout off: the same loss, before and after one AdamW step.
  assert len(r["ours_losses"]) == len(r["reference_losses"]) == 2
  assert r["first_loss_relative_diff"] < 1e-4, r
  assert r["second_loss_relative_diff"] < 1e-4, r
  assert r["ours_second_loss"] != r["ours_first_loss"]  # The update did something.
  assert "ours/HF" in proc.stdout


def test_bad_flags_exit_with_one_line(tmp_path):
  proc = _run(tmp_path, "--sizes=huge", f"--out={tmp_path / 'x.json'}")
  assert proc.returncode != 0
  assert proc.stderr.strip().splitlines() == ["unknown --sizes ['huge']; expected some of "
                                              "['base', 'small', 'tiny']"]
  assert not (tmp_path / "x.json").exists()
