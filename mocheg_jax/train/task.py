"""What a stage plugs into the shared trainer: a model factory, a loss, data and evaluators.

The trainer owns everything else (mesh, sharding, optimizer, the jitted step, checkpoints,
metrics), so retrieval, verification and explanation each write a `make_task(config,
workdir) -> Task` function and no training loop.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable, Iterable, Iterator, Mapping, Protocol, Sequence

import jax
import ml_collections
import numpy as np
from flax import nnx

Batch = Mapping[str, Any]
Metrics = Mapping[str, jax.Array]
Axes = tuple[str | None, ...]


class DataIterator(Protocol):
  """An iterator of numpy batches whose position can be saved (grain's DatasetIterator)."""

  def __next__(self) -> dict[str, np.ndarray]: ...
  def get_state(self) -> dict: ...
  def set_state(self, state: dict) -> None: ...


@dataclasses.dataclass(frozen=True)
class Evaluator:
  """Runs on the current model every `eval_every` steps and at the end of training.

  `run(model, step)` yields (name, value) pairs (names like "dev/macro_f1"); it runs on every
  process (it may use collectives), the model in inference mode.
  """
  name: str
  run: Callable[[nnx.Module, int], Iterable[tuple[str, float]]]


@dataclasses.dataclass(frozen=True)
class Task:
  """A training stage.

  Attributes:
    model: builds the model with freshly initialised weights. It must create its own
      `nnx.Rngs` from a seed (it is traced under `nnx.eval_shape` and under jit).
    loss: `loss(model, batch) -> (scalar loss, {name: scalar})`, the mean over the
      (micro-)batch; the model is in training mode (dropout on; its RNG streams are reseeded
      by the trainer from `fold_in(rng, step)` for every micro-batch).
    batch_axes: logical axes of every batch field; the leading one is "batch".
    train_data: `train_data(local_batch_size) -> DataIterator` yielding this process's part
      of each global batch.
    evaluators: run every `eval_every` steps and at the end.
    initial_params: optional; returns a nested dict (any subset of the parameter tree, numpy
      arrays) that overwrites the random initialisation on a fresh start (pretrained weights).
    constants: optional; returns a pytree the loss reads but never trains (a frozen reward
      model). The trainer places it on the devices once, replicated, and passes it to the
      jitted step as an argument, so large arrays are not baked into the compiled program;
      the loss is then called as `loss(model, batch, constants)`.
    inference: optional stage-specific helpers for using the trained model after training
      (a retriever's query and document encoders, say); scripts reach them through
      `train.restore.load_trained(workdir).task.inference`.
  """
  model: Callable[[], nnx.Module]
  loss: Callable[[nnx.Module, Batch], tuple[jax.Array, Metrics]]
  batch_axes: Mapping[str, Axes]
  train_data: Callable[[int], DataIterator | Iterator]
  evaluators: Sequence[Evaluator] = ()
  initial_params: Callable[[], Mapping[str, Any]] | None = None
  constants: Callable[[], Any] | None = None
  inference: Any = None


# Short names of the stages' tasks, filled in as the stages arrive.
REGISTRY: dict[str, str] = {}


def _module_and_attr(name: str):
  target = REGISTRY.get(name, name)
  module_name, sep, attr = target.partition(":")
  if not sep or not module_name or not attr:
    known = ", ".join(sorted(REGISTRY)) or "none yet"
    raise ValueError(f"config.task {name!r} is neither a registered task ({known}) nor "
                     "'module:function'")
  try:
    module = importlib.import_module(module_name)
  except ImportError as e:
    raise ValueError(f"config.task {name!r}: cannot import {module_name!r} ({e})") from e
  return module, attr


def resolve(name: str) -> Callable[[ml_collections.ConfigDict, str], Task]:
  """The `make_task` function named by `config.task` ("module:function" or a short name)."""
  module, attr = _module_and_attr(name)
  if not hasattr(module, attr):
    raise ValueError(f"config.task {name!r}: module {module.__name__!r} has no {attr!r}")
  return getattr(module, attr)


def config_defaults(name: str) -> dict:
  """The task's own config sections with their current defaults ({} if it declares none).

  A task module may define `config_defaults() -> dict` (e.g. {"verify": verify_config()}),
  so a checkpoint written before one of its fields existed still loads.
  """
  module, _ = _module_and_attr(name)
  defaults = getattr(module, "config_defaults", None)
  if defaults is None:
    return {}
  return {key: value.to_dict() if isinstance(value, ml_collections.ConfigDict) else value
          for key, value in defaults().items()}


def input_files(config: ml_collections.ConfigDict) -> list[str]:
  """The data files the task's training reads that its config names by path only (their
  contents are recorded: train/inputs.py); [] when the task module declares none.

  A task module may define `input_files(config) -> list[str]`.
  """
  module, _ = _module_and_attr(config.task)
  declared = getattr(module, "input_files", None)
  return [] if declared is None else list(declared(config))
