"""An evaluation of trained models, saved with a record of what it read, reused on a rerun.

The main job's stages end by scoring what they trained (Tables 3-5: indexing and searching,
predicting, generating), which costs minutes even when every training is already finished.
`reuse` runs such an evaluation once and saves its result under WORKDIR/evaluations/ with
what it read: the checkpoints it scored (their steps and saved configs), input files (by
content), settings, the matrix-product precision it ran at (models/matmul.py), and a digest
of every output it wrote. A rerun with the same record and
untouched outputs returns the saved result; any difference evaluates again.

Records are compared with `paths.same_record`, so a finished folder copied elsewhere reuses
its evaluations too. The code is not part of the record: after changing how a table is
computed, delete WORKDIR/evaluations/ (or one stage's file) to compute it again.
"""

from __future__ import annotations

import json
import os
from typing import Callable, Sequence

import jax

from mocheg_jax.train import restore
from mocheg_jax.utils import files, paths

RECORDS_DIR = "evaluations"
_FORMAT = 1  # Bumped when the record's layout changes: older records are then not reused.


def trained(stage_dir: str) -> dict:
  """What identifies a trained stage to an evaluation: the step it is scored at (the best,
  as `load_trained`), its latest step and the config saved with that step."""
  checkpoints, step = restore.checkpoint_step(stage_dir)
  try:
    latest = checkpoints.latest_step()
    return {"dir": stage_dir, "step": step, "latest": latest,
            "config": checkpoints.restore_config(latest)}
  finally:
    checkpoints.close()


def file(path: str) -> dict:
  """An input file by content (a missing one recorded as such)."""
  return {"path": path, "sha256": files.sha256(path) if os.path.isfile(path) else None}


def folder_sizes(folder: str) -> dict[str, int]:
  """The files directly in `folder` and their sizes: a cheap identity for a release, whose
  claims and corpus files a replacement would change (images are not listed)."""
  return {name: os.path.getsize(os.path.join(folder, name)) for name in sorted(os.listdir(folder))
          if os.path.isfile(os.path.join(folder, name))}


def _output_digest(workdir: str, relative: str) -> object:
  """A file's sha256; a folder's files (relative names) and sizes, not read (an index may be
  gigabytes); None when missing."""
  path = os.path.join(workdir, relative)
  if os.path.isfile(path):
    return files.sha256(path)
  if os.path.isdir(path):
    return sorted([os.path.relpath(os.path.join(root, name), path),
                   os.path.getsize(os.path.join(root, name))]
                  for root, _, names in os.walk(path) for name in names)
  return None


def _plain(value):
  """`value` as JSON gives it back (tuples as lists...): what a reused result looks like, so
  a fresh one looks the same."""
  return json.loads(json.dumps(value))


def reuse(workdir: str, name: str, inputs: dict, outputs: Sequence[str],
          evaluate: Callable[[], dict], log: Callable[[str], None] = print) -> dict:
  """`evaluate()`'s result, or the one an earlier run saved with the same `inputs` while
  its `outputs` (paths relative to `workdir`, files or folders) are still as it wrote them.

  The record, WORKDIR/evaluations/NAME.json, is written after `evaluate` returns, so an
  evaluation interrupted midway is never reused.
  """
  inputs = _plain({**inputs, "matmul_precision": jax.config.jax_default_matmul_precision})
  path = os.path.join(workdir, RECORDS_DIR, f"{name}.json")
  saved, reason = _saved_result(path, workdir, inputs, outputs)
  if reason is None:
    log(f"{name}: evaluation reused from {path} (same checkpoints, inputs and outputs)")
    return saved
  log(f"{name}: evaluating ({reason})")
  result = _plain(evaluate())
  record = {"format": _FORMAT, "inputs": inputs,
            "outputs": {o: _output_digest(workdir, o) for o in outputs}, "result": result}
  os.makedirs(os.path.dirname(path), exist_ok=True)
  files.write_json(path, record, indent=1)
  return result


def _saved_result(path: str, workdir: str, inputs: dict, outputs: Sequence[str]
                  ) -> tuple[dict | None, str | None]:
  """(the result saved at `path`, None) when it can be reused; (None, why not) otherwise."""
  if not os.path.isfile(path):
    return None, "no earlier evaluation"
  try:
    with open(path, encoding="utf-8") as f:
      saved = json.load(f)
  except (OSError, ValueError) as e:
    return None, f"{path} unreadable ({e})"
  if not isinstance(saved, dict) or saved.get("format") != _FORMAT or "result" not in saved:
    return None, f"{path} is not a record of this version"
  if not paths.same_record(saved.get("inputs"), inputs, None):
    return None, "checkpoints, inputs or settings changed since the earlier evaluation"
  recorded = saved.get("outputs") or {}
  for output in outputs:
    if output not in recorded or recorded[output] != _output_digest(workdir, output):
      return None, (f"{os.path.join(workdir, output)} changed or missing since the earlier "
                    "evaluation")
  return saved["result"], None
