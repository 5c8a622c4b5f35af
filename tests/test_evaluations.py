"""A stage's evaluation reused on a rerun (mocheg_jax/train/evaluations.py): what keeps the
saved result, and what makes the evaluation run again."""

import json
import os
import shutil

import jax

from mocheg_jax.train import evaluations, loop
from mocheg_jax.utils import paths
from tests import toy_task


class _Evaluation:
  """An evaluation that writes one output file and a folder, and counts its runs."""

  def __init__(self, workdir):
    self.workdir, self.runs = str(workdir), 0

  def __call__(self) -> dict:
    self.runs += 1
    with open(os.path.join(self.workdir, "table.md"), "w") as f:
      f.write(f"| run {self.runs} |\n")
    os.makedirs(os.path.join(self.workdir, "index"), exist_ok=True)
    with open(os.path.join(self.workdir, "index", "part0"), "w") as f:
      f.write("ids")
    return {"rows": [{"name": "x", "score": 0.5}], "shape": (2, 3), "run": self.runs}

  def reuse(self, inputs: dict, log=None) -> dict:
    return evaluations.reuse(self.workdir, "stage", inputs, ("table.md", "index"), self,
                             log or (lambda _: None))


def _inputs(workdir, step=4) -> dict:
  return {"trained": {"dir": os.path.join(str(workdir), "stages", "a"), "step": step},
          "settings": {"top_k": 10}}


def test_a_rerun_with_the_same_inputs_reuses_the_saved_result(tmp_path):
  evaluate = _Evaluation(tmp_path)
  first = evaluate.reuse(_inputs(tmp_path))
  # A fresh result is returned as JSON reads it back, so a reused one is the same value.
  assert first == {"rows": [{"name": "x", "score": 0.5}], "shape": [2, 3], "run": 1}
  lines = []
  assert evaluate.reuse(_inputs(tmp_path), lines.append) == first
  assert evaluate.runs == 1
  assert "evaluation reused from" in lines[0]


def test_changed_inputs_or_outputs_evaluate_again(tmp_path):
  evaluate = _Evaluation(tmp_path)
  evaluate.reuse(_inputs(tmp_path))
  lines = []
  assert evaluate.reuse(_inputs(tmp_path, step=8), lines.append)["run"] == 2
  assert "inputs or settings changed" in lines[0]
  (tmp_path / "table.md").write_text("edited by hand\n")
  lines.clear()
  assert evaluate.reuse(_inputs(tmp_path, step=8), lines.append)["run"] == 3
  assert "table.md changed or missing" in lines[0]
  shutil.rmtree(tmp_path / "index")
  assert evaluate.reuse(_inputs(tmp_path, step=8))["run"] == 4
  (tmp_path / "index" / "part1").write_text("more")  # A folder output: its file list.
  assert evaluate.reuse(_inputs(tmp_path, step=8))["run"] == 5
  assert evaluate.reuse(_inputs(tmp_path, step=8))["run"] == 5
  with jax.default_matmul_precision("bfloat16"):  # Other products: other figures.
    assert evaluate.reuse(_inputs(tmp_path, step=8))["run"] == 6
    assert evaluate.reuse(_inputs(tmp_path, step=8))["run"] == 6
  assert evaluate.reuse(_inputs(tmp_path, step=8))["run"] == 7


def test_an_unreadable_or_interrupted_record_evaluates_again(tmp_path):
  evaluate = _Evaluation(tmp_path)
  evaluate.reuse(_inputs(tmp_path))
  record = tmp_path / evaluations.RECORDS_DIR / "stage.json"
  record.write_text('{"format": 1, "inputs": ')  # Cut short.
  lines = []
  assert evaluate.reuse(_inputs(tmp_path), lines.append)["run"] == 2
  assert "unreadable" in lines[0]
  saved = json.loads(record.read_text())
  record.write_text(json.dumps({**saved, "format": 0}))
  assert evaluate.reuse(_inputs(tmp_path))["run"] == 3

  def crash():
    raise KeyboardInterrupt

  record.unlink()
  try:
    evaluations.reuse(str(tmp_path), "stage", _inputs(tmp_path), ("table.md",), crash)
  except KeyboardInterrupt:
    pass
  assert not record.exists()  # Nothing saved: the next run evaluates.


def test_a_moved_folder_reuses_its_evaluations(tmp_path):
  original = tmp_path / "original"
  original.mkdir()
  _Evaluation(original).reuse(_inputs(original))
  copy = tmp_path / "copy"
  shutil.copytree(original, copy)
  evaluate = _Evaluation(copy)
  evaluate.reuse(_inputs(copy))
  assert evaluate.runs == 1  # The recorded paths name the original: not the same inputs.
  shutil.rmtree(copy)
  shutil.copytree(original, copy)
  evaluate = _Evaluation(copy)
  with paths.moved_folder((str(original), str(copy))):
    assert evaluate.reuse(_inputs(copy))["run"] == 1  # The original's result.
  assert evaluate.runs == 0


def test_trained_names_the_scored_step_and_the_saved_config(tmp_path):
  config = toy_task.get_config()
  config.best_metric = ""  # Scored at the latest step.
  loop.train(config, str(tmp_path), devices=jax.devices()[:1], log=lambda _: None)
  record = evaluations.trained(str(tmp_path))
  assert (record["step"], record["latest"]) == (20, 20)
  assert record["config"]["total_steps"] == 20
  assert record["config"]["task"] == "tests.toy_task:make_task"
  assert json.loads(json.dumps(record)) == record  # Plain JSON, as the record stores it.


def test_input_files_count_by_content(tmp_path):
  path = tmp_path / "results.csv"
  assert evaluations.file(str(path))["sha256"] is None
  path.write_text("claim_id,label\n1,refuted\n")
  before = evaluations.file(str(path))
  os.utime(path, (0, 0))  # A copy's new modification time is no change.
  assert evaluations.file(str(path)) == before
  path.write_text("claim_id,label\n1,supported\n")
  assert evaluations.file(str(path)) != before
  (tmp_path / "sub").mkdir()
  assert evaluations.folder_sizes(str(tmp_path)) == {"results.csv": path.stat().st_size}
