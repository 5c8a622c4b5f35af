"""A trained model back from its training workdir, for indexing, search and evaluation.

The checkpoint holds the config it was trained with, so the task (and with it the model's
structure, tokenizer and data) is rebuilt from that config, and the saved parameters are
poured into it. No training state (optimizer, data position) is read. A workdir inside a
folder that was moved since it trained is loaded with `moved` (utils/paths.py): the saved
config's paths under the old folder are rewritten to the new one first.
"""

from __future__ import annotations

import dataclasses
import inspect
import os

import jax.numpy as jnp
import ml_collections
from flax import nnx
from flax import traverse_util

from mocheg_jax.data.report import MochegInputError
from mocheg_jax.models.hf.convert import materialize
from mocheg_jax.train import config as config_lib
from mocheg_jax.train import task as task_lib
from mocheg_jax.train.checkpoint import Checkpointer
from mocheg_jax.train.loop import CHECKPOINT_DIR
from mocheg_jax.train.state import ModelSpec
from mocheg_jax.utils import paths

WHICH = ("best", "latest")


@dataclasses.dataclass
class Trained:
  config: ml_collections.ConfigDict
  task: task_lib.Task
  model: nnx.Module
  step: int
  workdir: str


def checkpoint_step(workdir: str, which: str = "best") -> tuple[Checkpointer, int]:
  """The step to use: the best by the config's metric (falling back to the latest when no
  step has the metric), or the latest."""
  if which not in WHICH:
    raise ValueError(f"which must be one of {WHICH}, got {which!r}")
  directory = os.path.join(workdir, CHECKPOINT_DIR)
  if not os.path.isdir(directory):
    raise MochegInputError(f"{workdir}: not a training workdir (no {CHECKPOINT_DIR}/ folder)")
  config = None
  checkpoints = Checkpointer(directory, read_only=True)
  latest = checkpoints.latest_step()
  if latest is None:
    checkpoints.close()
    raise MochegInputError(f"{directory}: holds no finished checkpoint")
  if which == "best":
    config = checkpoints.restore_config(latest)
    if config.get("best_metric"):
      checkpoints.close()
      checkpoints = Checkpointer(directory, read_only=True,
                                 best_metric=config["best_metric"],
                                 best_mode=config.get("best_mode", "max"))
      best = checkpoints.best_step()
      if best is not None:
        return checkpoints, best
  return checkpoints, latest


def best_score(workdir: str) -> tuple[str, float] | None:
  """(the config's `best_metric`, its value at the best kept step) of a training workdir;
  None when the config names no metric or no kept step recorded it."""
  checkpoints, _ = checkpoint_step(workdir, "best")
  with checkpoints:
    best = checkpoints.best() if checkpoints.best_metric else None
  return None if best is None else (checkpoints.best_metric, best[1])


def _merged(defaults: dict, saved: dict) -> dict:
  out = dict(defaults)
  for key, value in saved.items():
    if isinstance(value, dict) and isinstance(out.get(key), dict):
      value = _merged(out[key], value)
    out[key] = value
  return out


def saved_config(saved: dict) -> ml_collections.ConfigDict:
  """A checkpoint's config with the trainer's and its task's current defaults under it, so a
  checkpoint written before a field existed (e.g. `data.dir`) still loads."""
  defaults = config_lib.base_config().to_dict()
  if saved.get("task"):
    defaults = _merged(defaults, task_lib.config_defaults(saved["task"]))
  return ml_collections.ConfigDict(_merged(defaults, saved))


def make_task(config: ml_collections.ConfigDict, workdir: str, moved: paths.Moved = None
              ) -> task_lib.Task:
  """`config.task`'s task; `moved` reaches the tasks that take it (those that open stores or
  load other workdirs named in their config), and is needed by no other."""
  factory = task_lib.resolve(config.task)
  if moved is not None and "moved" in inspect.signature(factory).parameters:
    return factory(config, workdir, moved=moved)
  return factory(config, workdir)


def load_trained(workdir: str, which: str = "best", moved: paths.Moved = None) -> Trained:
  """The model of `workdir`'s best (or latest) checkpoint, on the default device.

  `moved` (old root, new root): `workdir` lies in a folder written at the old root and
  copied to the new one; the saved config's paths are relocated before anything is built.
  """
  checkpoints, step = checkpoint_step(workdir, which)
  with checkpoints:
    config = saved_config(paths.relocate(checkpoints.restore_config(step), moved))
    # A run with a moving average was evaluated and selected by it: that is the model.
    params = checkpoints.restore_params(step, "ema" if config.ema_decay > 0 else "params")
  task = make_task(config, workdir, moved)
  spec = ModelSpec.of(task.model, config.freeze)
  model = spec.merge(params["params"], params["frozen"], {}, None)
  return Trained(config, task, model, step, workdir)


def untrained(config: ml_collections.ConfigDict, workdir: str) -> Trained:
  """The model a config starts from (its pretrained weights, or its random init), as step
  0: the zero-shot baseline that fine-tuning is measured against."""
  task = task_lib.resolve(config.task)(config, workdir)
  # Built abstractly, then only what the initial parameters leave is initialised (in one
  # jitted program): an eager build compiles one program per parameter shape (4.5 s of the
  # tiny main job) for values the initial parameters mostly overwrite.
  model = nnx.eval_shape(task.model)
  if task.initial_params is not None:
    flat = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
    for path, value in traverse_util.flatten_dict(dict(task.initial_params())).items():
      name = ".".join(map(str, path))
      if path not in flat:
        raise MochegInputError(f"initial parameters name {name!r}, which the model does "
                               "not have")
      struct = flat[path].get_value()
      if tuple(value.shape) != tuple(struct.shape):
        raise MochegInputError(f"initial parameter {name!r} has shape {tuple(value.shape)}, "
                               f"the model expects {tuple(struct.shape)}")
      flat[path].set_value(jnp.asarray(value, struct.dtype))
  materialize(model, task.model, config.seed)
  return Trained(config, task, model, 0, workdir)
