"""The data files a training reads that its config names by path only, identified by content.

A config that names a file (the verifier trained on the retrieval stage's result CSV) is the
same config after the file is rewritten, so a rerun would find the old training finished and
keep a model trained on evidence that no longer exists. A task module may therefore define
`input_files(config) -> list[str]`; the loop records their sha256 in WORKDIR/inputs.json when
a training starts, and a rerun that finds different contents moves the old training aside
(WORKDIR/stale-N/, nothing deleted) and trains anew.
"""

from __future__ import annotations

import json
import os
from typing import Callable

import ml_collections

from mocheg_jax.parallel import distributed
from mocheg_jax.train import task as task_lib
from mocheg_jax.utils import files

RECORD = "inputs.json"
STALE_PREFIX = "stale-"


def digests(config: ml_collections.ConfigDict) -> list[dict]:
  """[{"path", "sha256"}] of the task's input files (sha256 None for a missing file)."""
  return [{"path": p, "sha256": files.sha256(p) if os.path.isfile(p) else None}
          for p in task_lib.input_files(config)]


def _stale_folder(workdir: str) -> str:
  taken = {name for name in os.listdir(workdir) if name.startswith(STALE_PREFIX)}
  n = 1
  while f"{STALE_PREFIX}{n}" in taken:
    n += 1
  return os.path.join(workdir, f"{STALE_PREFIX}{n}")


def _check(config: ml_collections.ConfigDict, workdir: str, say: Callable[[str], None]) -> None:
  current = digests(config)
  record = os.path.join(workdir, RECORD)
  if os.path.isfile(record):
    with open(record) as f:
      saved = json.load(f)
    # Compared by content alone: a moved workdir names its files under another root.
    if [d["sha256"] for d in saved] == [d["sha256"] for d in current]:
      return
    aside = _stale_folder(workdir)
    os.makedirs(aside)
    for name in sorted(os.listdir(workdir)):
      if not name.startswith(STALE_PREFIX):
        os.replace(os.path.join(workdir, name), os.path.join(aside, name))
    changed = [c["path"] for s, c in zip(saved, current) if s["sha256"] != c["sha256"]]
    say(f"{workdir}: the training's input file(s) {changed or [c['path'] for c in current]} "
        f"changed since it was trained; the old training moved to {aside}, training anew")
  elif os.listdir(workdir):
    # Written before inputs were recorded: nothing tells what it read; taken as current.
    say(f"{workdir}: no record of the input files this training read; taken as current")
  files.write_json(record, current, indent=1)


def check(config: ml_collections.ConfigDict, workdir: str, say: Callable[[str], None]) -> None:
  """Before a training starts or resumes: moves an earlier training of other contents of the
  task's input files aside, and records the current contents. Nothing for a task without
  input files."""
  if task_lib.input_files(config):
    distributed.primary_only("training_inputs", lambda: _check(config, workdir, say))
