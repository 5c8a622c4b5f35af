"""The tiny main job as two JAX processes (jax.distributed on CPU, gloo) against one.

Two `scripts/run_pipeline.py` processes with one CPU device each run the tiny main job into
one shared workdir (the `two_process_job` fixture); the reference is the session's
one-process run with 2 fake devices (the `tiny_main_job` fixture: more devices per process
cost far more time in gloo than they test). Both are tests/tiny_job.py's shared runs. Every stage trains a few steps only (the trainings are the collective part; the rest
runs on process 0 alone). The two runs must end with the same parameters in every stage, the
same runs, labels and explanations, the same tables, and one report and manifest written by
process 0.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
from flax import traverse_util

from mocheg_jax.train.checkpoint import Checkpointer
from mocheg_jax.train.loop import CHECKPOINT_DIR
from tests.tiny_job import STEPS

RTOL, ATOL = 1e-4, 1e-6
# The REINFORCE generator's tied embedding is what caught YNNPACK computing wrong gradients
# for 2 devices of one process (mocheg_jax/utils/host_devices.py).
STAGES = ("retrieval_text", "rerank", "captions", "retrieval_image", "verify_text_image",
          "verify_text", "verify_image", "verify_none", "explain_classifier", "explain_nll",
          "explain_reinforce")


def _params(stage_dir: Path) -> dict[str, np.ndarray]:
  with Checkpointer(str(stage_dir / CHECKPOINT_DIR), read_only=True) as checkpoints:
    assert checkpoints.latest_step() == STEPS, (stage_dir, checkpoints.all_steps())
    params = checkpoints.restore_params(STEPS)
  return {".".join(map(str, k)): np.asarray(v)
          for k, v in traverse_util.flatten_dict(params).items()}


def _ranking(run_file: Path) -> dict[str, list[tuple[float, str]]]:
  """Per query, (score, document) best first; documents with equal scores (duplicate
  sentences: their order follows the first stage's, which float noise may swap) by id."""
  out: dict[str, list[tuple[float, str]]] = {}
  for line in run_file.read_text().splitlines():
    query, _, doc, _, score, _ = line.split()
    out.setdefault(query, []).append((float(score), doc))
  return {q: sorted(e, key=lambda x: (-round(x[0], 6), x[1])) for q, e in out.items()}


def _csv_rows(path: Path) -> list[dict[str, str]]:
  with open(path, newline="", encoding="utf-8") as f:
    return list(csv.DictReader(f))


def _assert_numbers_close(a, b, where: str) -> None:
  """Equal JSON trees, numbers within RTOL / ATOL."""
  if isinstance(a, dict):
    assert isinstance(b, dict) and sorted(a) == sorted(b), where
    for key in a:
      if not key.endswith("_s"):  # Wall times (generation_s) differ run to run.
        _assert_numbers_close(a[key], b[key], f"{where}.{key}")
  elif isinstance(a, list):
    assert isinstance(b, list) and len(a) == len(b), where
    for i, (x, y) in enumerate(zip(a, b)):
      _assert_numbers_close(x, y, f"{where}[{i}]")
  elif isinstance(a, float) and isinstance(b, (int, float)):
    np.testing.assert_allclose(b, a, rtol=RTOL, atol=ATOL, err_msg=where)
  else:
    assert a == b, f"{where}: {a!r} != {b!r}"


def test_two_processes_run_the_main_job_like_one(tiny_main_job, two_process_job):
  _assert_same_results(tiny_main_job.workdir, two_process_job.workdir)
  # Process 0 alone fact-checks the sample claims and prints the tables.
  outputs = two_process_job.outputs
  assert '{"claim": ' in outputs["process0"] and '{"claim": ' not in outputs["process1"]
  assert "Table 5" in outputs["process0"] and "Table 5" not in outputs["process1"]


def _assert_same_results(single: Path, multi: Path) -> None:
  for name in STAGES:
    reference, params = _params(single / "stages" / name), _params(multi / "stages" / name)
    assert sorted(params) == sorted(reference), name
    for key, value in reference.items():
      np.testing.assert_allclose(params[key], value, rtol=RTOL, atol=ATOL,
                                 err_msg=f"{name}: parameter {key}")

  for table in ("table3.json", "table4.json", "table5.json"):
    _assert_numbers_close(json.loads((single / table).read_text()),
                          json.loads((multi / table).read_text()), table)
  for run in ("text.run", "image.run"):
    reference, ranked = _ranking(single / "runs" / run), _ranking(multi / "runs" / run)
    assert sorted(ranked) == sorted(reference), run
    for query, entries in reference.items():
      assert [d for _, d in ranked[query]] == [d for _, d in entries], (run, query)
      np.testing.assert_allclose([s for s, _ in ranked[query]], [s for s, _ in entries],
                                 rtol=RTOL, atol=ATOL, err_msg=f"{run}: query {query}")
  explanations = sorted(p.name for p in (single / "runs" / "explanations").glob("*.csv"))
  assert len(explanations) == 8, explanations
  for name in ["verify_results.csv", *(f"explanations/{n}" for n in explanations)]:
    reference, rows = _csv_rows(single / "runs" / name), _csv_rows(multi / "runs" / name)
    _assert_numbers_close(
        [{k: float(v) if k.startswith("p_") else v for k, v in r.items()} for r in reference],
        [{k: float(v) if k.startswith("p_") else v for k, v in r.items()} for r in rows], name)

  for name in ("manifest.json", "report.md", "results.json", "summary.json"):
    assert (multi / name).is_file(), name
