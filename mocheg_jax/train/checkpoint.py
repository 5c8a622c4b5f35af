"""Checkpoints: the train state, the input position and the config saved together by orbax.

One CheckpointManager directory (`WORKDIR/checkpoints/STEP/`) holds per step:
  state/   the TrainState (step, trainable and frozen params, optimizer state), sharded
           arrays written by every process (OCDBT, async)
  data/    grain's iterator state, one JSON file per process
  config/  the run's config as JSON (so a checkpoint says how it was made)
The latest `keep` steps are kept, plus the best by a metric when one is named; a step is
visible only once orbax has finalised it, so a crash mid-save leaves the previous one.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Mapping

import grain
import jax
from absl import logging as absl_logging
import numpy as np
import orbax.checkpoint as ocp
from orbax.checkpoint import checkpoint_managers as policies

STATE, DATA, CONFIG = "state", "data", "config"

# Orbax splits the writing of a replicated array among its replicas, slicing it with a jitted
# op per device and shape. For small arrays the compilations dwarf the writes (9 s for the
# first save of a 2-layer model on 8 CPU devices), so only arrays above this size are split.
_MIN_BYTES_FOR_REPLICA_PARALLEL = 4 << 20
ocp.type_handlers.register_type_handler(
    jax.Array, ocp.type_handlers.ArrayHandler(
        min_slice_bytes_for_replica_parallel=_MIN_BYTES_FOR_REPLICA_PARALLEL), override=True)


def _not_the_read_only_notice(record) -> bool:
  return not str(record.msg).startswith("Given directory is read only")


# Orbax warns at every read-only open, and every evaluation, index and table restores stages
# that way: 118 of the tiny main job's 589 lines of output were that notice.
absl_logging.get_absl_logger().addFilter(_not_the_read_only_notice)


class _IteratorSnapshot:
  """A data iterator's position frozen when the save is requested.

  Saves are asynchronous and the loop keeps reading batches; the checkpoint must hold the
  position that matches the saved state, not wherever the iterator is when orbax gets to it.
  """

  def __init__(self, iterator):
    self._state = json.dumps(iterator.get_state())

  def get_state(self) -> bytes:  # grain's handler writes non-DatasetIterator states as bytes.
    return self._state.encode()


class _IteratorRestorer:
  """Gives grain's handler the bytes interface for any iterator with get/set_state."""

  def __init__(self, iterator):
    self._iterator = iterator

  def set_state(self, state: bytes) -> None:
    self._iterator.set_state(json.loads(state.decode()))

  def start_prefetch(self) -> None:  # grain's handler calls it after set_state.
    if hasattr(self._iterator, "start_prefetch"):
      self._iterator.start_prefetch()


def _reader_options() -> ocp.options.MultiprocessingOptions:
  """A reader that is this process alone: in a multi-process job only process 0 may be
  restoring a model for inference (distributed.primary_only), so orbax must not wait for
  the others at its barriers."""
  if jax.process_count() == 1:
    return ocp.options.MultiprocessingOptions()
  me = jax.process_index()
  return ocp.options.MultiprocessingOptions(primary_host=me, active_processes={me},
                                            barrier_sync_key_prefix=f"reader_{me}")


def _has_state(iterator) -> bool:
  return iterator is not None and hasattr(iterator, "get_state") and hasattr(
      iterator, "set_state")


class Checkpointer:
  """Saves and restores training checkpoints in `directory`.

  Args:
    directory: WORKDIR/checkpoints.
    keep: how many of the latest steps to keep.
    best_metric: a metric name passed in `save(metrics=...)`; the best step by it is kept
      too (empty: no best tracking).
    best_mode: "max" or "min".
    async_save: write in a background thread once arrays are copied to host memory.
    read_only: open an existing directory for restoring only (evaluation, indexing).
  """

  def __init__(self, directory: str, *, keep: int = 2, best_metric: str = "",
               best_mode: str = "max", async_save: bool = True, read_only: bool = False):
    self.directory = os.path.abspath(directory)
    self.best_metric, self.best_mode = best_metric, best_mode
    preserve: list[policies.PreservationPolicy] = [policies.LatestN(n=keep)]
    worst = -math.inf if best_mode == "max" else math.inf
    metric = lambda m: m.get(best_metric, worst)  # Steps saved without an evaluation.
    if best_metric:
      preserve.append(policies.BestN(get_metric_fn=metric, reverse=best_mode == "min", n=1,
                                     keep_checkpoints_without_metrics=False))
    options = ocp.CheckpointManagerOptions(
        # best_fn is what makes orbax write a step's metrics at all; without it BestN sees
        # none and the best step would silently be lost.
        best_fn=metric if best_metric else None, best_mode=best_mode,
        preservation_policy=policies.AnyPreservationPolicy(preserve),
        enable_async_checkpointing=async_save, read_only=read_only, create=not read_only,
        save_interval_steps=0 if read_only else 1,  # What orbax sets (with a warning) anyway.
        cleanup_tmp_directories=not read_only,
        multiprocessing_options=_reader_options() if read_only else
        ocp.options.MultiprocessingOptions())
    self._manager = ocp.CheckpointManager(
        self.directory, options=options,
        item_handlers={STATE: ocp.PyTreeCheckpointHandler(),
                       DATA: grain.checkpoint.CheckpointHandler(),
                       CONFIG: ocp.JsonCheckpointHandler()})

  # ---- queries ---------------------------------------------------------------------------
  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def best(self) -> tuple[int, float] | None:
    """(step, value) of the kept step with the best `best_metric` (None without metrics)."""
    scored = []
    for step in self.all_steps():
      metrics = self._manager.metrics(step) or {}
      if self.best_metric in metrics:
        scored.append((metrics[self.best_metric], step))
    if not scored:
      return None
    value, step = (max if self.best_mode == "max" else min)(scored)
    return step, float(value)

  def best_step(self) -> int | None:
    """The kept step with the best `best_metric` (None without metrics)."""
    best = self.best()
    return None if best is None else best[0]

  def reached_preemption(self, step: int) -> bool:
    """True on every process once any received a preemption notice (multi-host sync)."""
    return self._manager.reached_preemption(step)

  # ---- save / restore --------------------------------------------------------------------
  def save(self, step: int, state: Any, *, data_iterator=None,
           config: Mapping | None = None, metrics: Mapping[str, float] | None = None) -> None:
    items: dict[str, Any] = {STATE: ocp.args.PyTreeSave(state)}
    if _has_state(data_iterator):
      items[DATA] = grain.checkpoint.CheckpointSave(_IteratorSnapshot(data_iterator))
    if config is not None:
      items[CONFIG] = ocp.args.JsonSave(dict(config))
    self._manager.save(step, args=ocp.args.Composite(**items),
                       metrics=dict(metrics or {}) if self.best_metric else None,
                       force=True)

  def restore(self, step: int, target: Any, *, data_iterator=None) -> Any:
    """The state at `step`, restored into `target`'s shapes, dtypes and shardings.

    `target` is a tree of jax.ShapeDtypeStruct with shardings. With `data_iterator`, its
    position is restored too (an error if the checkpoint has none for this process).
    """
    # Partial: a state saved before a field existed (the empty `ema` of a run without a
    # moving average) restores into today's state. A field the target needs and the
    # checkpoint lacks is the caller's to refuse first (`has_moving_average`).
    items: dict[str, Any] = {STATE: ocp.args.PyTreeRestore(
        item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target),
        partial_restore=True)}
    if _has_state(data_iterator):
      items[DATA] = grain.checkpoint.CheckpointRestore(_IteratorRestorer(data_iterator))
    restored = self._manager.restore(step, args=ocp.args.Composite(**items))
    return restored[STATE]

  def has_moving_average(self, step: int) -> bool:
    """Whether the state saved at `step` holds a moving average of the parameters (a run
    without one saves an empty `ema`, and one from before the field existed none)."""
    saved = self._manager.item_metadata(step)[STATE].tree.get("ema")
    return isinstance(saved, Mapping) and bool(saved)

  def restore_params(self, step: int, trainable: str = "params") -> dict:
    """Only the parameters, as host arrays, for inference: {"params": the trainable ones
    (the state's `trainable` entry: "params", or "ema" for their moving average),
    "frozen": the frozen ones}."""
    metadata = self._manager.item_metadata(step)[STATE].tree
    if not isinstance(metadata.get(trainable), Mapping) or not metadata[trainable]:
      raise ValueError(f"{self.directory}/{step}: the saved state has no {trainable!r}")
    wanted = {k: metadata[k] for k in (trainable, "frozen")}
    restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), wanted)
    restored = self._manager.restore(step, args=ocp.args.Composite(**{
        STATE: ocp.args.PyTreeRestore(item=wanted, restore_args=restore_args,
                                      partial_restore=True)}))
    return {"params": restored[STATE][trainable], "frozen": restored[STATE]["frozen"]}

  def restore_config(self, step: int) -> dict:
    return self._manager.restore(step, args=ocp.args.Composite(
        **{CONFIG: ocp.args.JsonRestore()}))[CONFIG]

  def wait(self) -> None:
    """Blocks until pending asynchronous saves are on disk."""
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.close()

  def __enter__(self) -> "Checkpointer":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
