"""benchmarks/bench_contrastive.py end to end at tiny sizes: JSON fields and loss agreement.

The script runs in a subprocess (its absl flags stay out of this process) with XLA's backend
optimisation off, which shortens the compile of the two tiny train steps and changes
nothing the test checks.
"""

from __future__ import annotations

import json
import pathlib
import subprocess

from tests.processes import run_script

REPO = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "bench_contrastive.py"


def _run(tmp_path: pathlib.Path, *flags: str) -> subprocess.CompletedProcess:
  return run_script(SCRIPT, *flags, cwd=tmp_path)  # One device, no fakes.


def test_tiny_run_writes_every_field_and_the_two_sides_agree(tmp_path):
  out = tmp_path / "contrastive.json"
  proc = _run(tmp_path, "--text_size=tiny", "--clip_sizes=tiny", "--repeats=1",
              "--text_batch=6", "--query_length=8", "--doc_length=12", "--clip_batch=5",
              "--threads=1", f"--out={out}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(out.read_text())
  assert result["benchmark"] == "contrastive" and result["parts"] == ["text", "clip"]
  assert result["loss_check_failures"] == [] and result["torch_threads"] == 1
  text, (clip,) = result["text"], result["clip"]
  # The text step is the small config's: hard negatives, cosine x 20.
  assert (text["size"], text["batch"], text["query_length"], text["doc_length"]) == (
      "tiny", 6, 8, 12)
  assert text["hard_negatives"] and text["scale"] == 20.0
  assert clip["size"] == "tiny" and clip["batch"] == 5 and clip["symmetric"] is False
  assert clip["config"] == "configs/retrieval_image.py:small" and clip["freeze"] == ""
  for r in (text, clip):
    for side in ("ours", "reference"):
      run = r["runs"][side]
      assert len(run["seconds"]) == 1 and len(run["warmup_s"]) == 1
      assert run["examples_per_s"] == r["batch"] / run["median_s"]
    assert r["ratio"] == (r["runs"]["ours"]["examples_per_s"]
                          / r["runs"]["reference"]["examples_per_s"])
    assert len(r["paired_ratios"]) == 1 and r["ours_compile_s"] > 0
    # Same weights, same batch, dropout off: the same loss before and after one update
    # (clipping, AdamW, the no-decay groups), and after the timed step too.
    assert len(r["ours_losses"]) == len(r["reference_losses"]) == 2
    assert r["first_loss_relative_diff"] < 1e-4, r
    assert r["second_loss_relative_diff"] < 1e-4, r
    assert r["ours_second_loss"] != r["ours_first_loss"]  # The update did something.
  assert "| InfoNCE text (tiny" in proc.stdout and "| CLIP (tiny" in proc.stdout


def test_bfloat16_products_on_both_sides(tmp_path):
  out = tmp_path / "contrastive.json"
  proc = _run(tmp_path, "--parts=text", "--text_size=tiny", "--repeats=1", "--text_batch=6",
              "--query_length=8", "--doc_length=12", "--threads=1", "--precision=bfloat16",
              f"--out={out}")
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(out.read_text())
  assert result["precision"] == "bfloat16" and result["loss_check_failures"] == []
  assert "bfloat16 products" in proc.stdout
  # Both sides round their operands, each in its own way: close, not equal.
  assert 0 < result["text"]["first_loss_relative_diff"] < 2e-2, result["text"]


def test_bad_flags_exit_with_one_line(tmp_path):
  proc = _run(tmp_path, "--clip_sizes=huge", "--repeats=0", f"--out={tmp_path / 'x.json'}")
  assert proc.returncode != 0
  assert proc.stderr.strip().splitlines() == [
      "bad flags: --clip_sizes=huge (from base, small, tiny); --repeats=0 (at least 1)"]
  assert not (tmp_path / "x.json").exists()
