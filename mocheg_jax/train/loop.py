"""The training loop every stage shares: `train(config, workdir) -> TrainResult`.

The loop is host bookkeeping around one jitted step. It reads the device only at log,
evaluation and checkpoint steps, so the host runs ahead and dispatch overlaps compute.
Resuming is automatic: if WORKDIR/checkpoints holds a step, the state and the input
position are restored from it and the run continues as if never stopped; a run of the same
config that already reached its last step returns at once, unless the data files it read
changed since (train/inputs.py: the old training is then moved aside).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import threading
import time
from typing import Callable, Mapping, Sequence

import jax
import ml_collections
import numpy as np
from flax import nnx

from mocheg_jax.models import matmul
from mocheg_jax.parallel import distributed
from mocheg_jax.parallel import mesh as mesh_lib
from mocheg_jax.parallel import rules as rules_lib
from mocheg_jax.train import config as config_lib
from mocheg_jax.train import inputs as inputs_lib
from mocheg_jax.train import optim
from mocheg_jax.train import state as state_lib
from mocheg_jax.train import task as task_lib
from mocheg_jax.train.checkpoint import Checkpointer
from mocheg_jax.train.step import make_train_step
from mocheg_jax.train.writer import MetricWriter
from mocheg_jax.utils import flops as flops_lib
from mocheg_jax.utils import paths
from mocheg_jax.utils import peaks
from mocheg_jax.utils.cli import Stopped
from mocheg_jax.utils.progress import Progress

CHECKPOINT_DIR = "checkpoints"


class NonFiniteLossError(RuntimeError):
  """The loss or the gradient became NaN or Inf; training stopped."""


@dataclasses.dataclass
class TrainResult:
  status: str  # "finished", "preempted" or "early_stopped"
  step: int
  metrics: dict[str, float]  # The last logged training metrics and evaluation results.
  stop: str | None = None  # "preempted": what stopped it ("SIGTERM", "SIGINT", "preemption").


def train_stage(config: ml_collections.ConfigDict, workdir: str,
                log: Callable[[str], None] = print, **train_kwargs) -> TrainResult:
  """`train` as one step of a longer job: a stop signal ends the whole job (raises
  `Stopped`, its checkpoint saved), so the next step never starts from an unfinished model
  and the job does not go on after it was told to stop."""
  result = train(config, workdir, log=log, **train_kwargs)
  if result.status == "preempted":
    stop = result.stop or "SIGTERM"
    number = signal.Signals[stop] if stop in signal.Signals.__members__ else signal.SIGTERM
    raise Stopped(f"{workdir}: training stopped at step {result.step} by {stop}; checkpoint "
                  "saved; rerun the same command to resume", int(number))
  return result


class _StopSignals:
  """Turns SIGTERM (preemption, scheduler) and SIGINT into a request to save and stop."""

  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self):
    self.received: str | None = None
    self._previous = {}

  def __enter__(self) -> "_StopSignals":
    if threading.current_thread() is threading.main_thread():
      for sig in self.SIGNALS:
        self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def _handle(self, signum, frame) -> None:
    del frame
    self.received = signal.Signals(signum).name

  def __exit__(self, *exc) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)


def _rules(config: ml_collections.ConfigDict) -> tuple:
  return tuple((name, tuple(t) if isinstance(t, (list, tuple)) else t)
               for name, t in config.sharding.rules)


class _LogWindow:
  """The step metrics since the last log line, kept on device until it is written.

  With the step's model FLOPs known (`count_flops`, which the loop calls on devices of
  known bf16 peak: GPUs and TPUs), each line also has the achieved `model_tflops_per_s`
  (all devices) and `mfu`.
  """

  def __init__(self, global_batch: int):
    self._global_batch = global_batch
    self._metrics: list[Mapping[str, jax.Array]] = []
    self._start = time.perf_counter()
    self._step_flops: float | None = None
    self._peak_flops: float | None = None  # All devices together, FLOP/s.

  def count_flops(self, step_fn: Callable, args: tuple, devices: Sequence[jax.Device]
                  ) -> str:
    """Counts the matmul FLOPs of one step (traced, not run); says what it found."""
    try:
      self._step_flops = flops_lib.matmul_flops(step_fn, *args)
    except ValueError as e:  # A while loop in the step (e.g. sampling): no static count.
      return f"model FLOPs per step: not counted ({e})"
    peak = peaks.bf16_peak_tflops(devices[0].device_kind)
    self._peak_flops = None if peak is None else peak * 1e12 * len(devices)
    return (f"model FLOPs per step: {self._step_flops / 1e12:.4g} TFLOP (matrix products, "
            f"forward and backward); MFU against "
            + (f"{peak:g} TFLOP/s bf16 x {len(devices)} devices" if peak else
               f"no known peak for {devices[0].device_kind!r}: not reported"))

  def __bool__(self) -> bool:
    return bool(self._metrics)

  def add(self, metrics: Mapping[str, jax.Array]) -> None:
    self._metrics.append(metrics)

  def flush(self) -> dict[str, float]:
    """Means over the window plus step time and throughput; starts a new window."""
    host = jax.device_get(self._metrics)  # The one host sync of a log interval.
    elapsed, steps = time.perf_counter() - self._start, len(host)
    means = {k: float(np.mean([h[k] for h in host])) for k in host[0]}
    means.update(step_time_s=elapsed / steps, examples_per_s=steps * self._global_batch / elapsed)
    if self._step_flops:
      achieved = self._step_flops * steps / elapsed
      means["model_tflops_per_s"] = achieved / 1e12
      if self._peak_flops:
        means["mfu"] = achieved / self._peak_flops
    self._metrics, self._start = [], time.perf_counter()
    return means


class _EarlyStopping:
  """Counts evaluations since the best `best_metric`; survives a restart because the best
  checkpoint (kept with its metrics) says where the best was."""

  def __init__(self, config: ml_collections.ConfigDict, best: tuple[int, float] | None,
               start: int):
    self.patience, self.metric = config.early_stopping_patience, config.best_metric
    self.sign = 1.0 if config.best_mode == "max" else -1.0
    best_step, self.best_value = best if best else (None, None)
    self.waited = (start // config.eval_every - best_step // config.eval_every
                   if best and config.eval_every else 0)

  @property
  def exhausted(self) -> bool:
    return bool(self.patience) and self.waited >= self.patience

  def update(self, results: Mapping[str, float]) -> bool:
    """Records one evaluation; True when training should stop."""
    if self.metric not in results:
      return False
    value = results[self.metric]
    # A tie counts as the new best, as the checkpointer keeps the later of equal steps.
    if self.best_value is None or self.sign * value >= self.sign * self.best_value:
      self.best_value, self.waited = value, 0
    else:
      self.waited += 1
    return self.exhausted

  def describe(self) -> str:
    return (f"{self.metric} has not improved on {self.best_value:.4g} for {self.waited} "
            f"evaluations (patience {self.patience})")


def _check_local_batch(batch: Mapping[str, np.ndarray], expected: int,
                       axes: Mapping[str, tuple]) -> None:
  missing = sorted(set(axes) - set(batch))
  if missing:
    raise ValueError(f"the training data has no field(s) {missing} that the task's "
                     f"batch_axes name; it has {sorted(batch)}")
  for name in axes:
    if np.shape(batch[name])[:1] != (expected,):
      raise ValueError(f"batch field {name!r} has shape {np.shape(batch[name])}; this process "
                       f"expects {expected} rows (config.batch_size / process count)")


def _finished_before(config: ml_collections.ConfigDict, workdir: str) -> int | None:
  """The last step, when an earlier run of this config (compared as `paths.same_record`:
  a moved folder's too) already reached `total_steps`; None otherwise. A rerun of a
  finished training then builds no task, model or state; anything else resumes as usual
  (and a changed config continues, or fails to restore, as it would)."""
  directory = os.path.join(workdir, CHECKPOINT_DIR)
  if not os.path.isdir(directory):
    return None
  with Checkpointer(directory, read_only=True) as checkpoints:
    latest = checkpoints.latest_step()
    if latest is None or latest != config.total_steps:
      return None
    saved = checkpoints.restore_config(latest)
  # Fields added since that run read as their defaults, as when its checkpoint is loaded.
  from mocheg_jax.train import restore  # Here: restore imports this module.
  saved = restore.saved_config(saved).to_dict()
  return latest if paths.same_record(json.loads(json.dumps(saved)),
                                     json.loads(json.dumps(config.to_dict())), None) else None


def train(config: ml_collections.ConfigDict, workdir: str, *,
          devices: Sequence[jax.Device] | None = None,
          log: Callable[[str], None] = print) -> TrainResult:
  """Trains `config.task` in `workdir`, resuming from its latest checkpoint if any.

  `devices` (default: all) is what the mesh is laid over; `log` receives the console lines
  (process 0 only).

  Raises:
    NonFiniteLossError: the loss or gradient became NaN/Inf (the update of that step was
      skipped and nothing after the last good checkpoint was saved).
    ValueError: an invalid config or data that do not match the task.
  """
  config_lib.validate(config)
  with matmul.precision_scope(config.matmul_precision):
    return _train(config, workdir, devices, log)


def _train(config: ml_collections.ConfigDict, workdir: str,
           devices: Sequence[jax.Device] | None, log: Callable[[str], None]) -> TrainResult:
  primary = distributed.is_primary()
  say = log if primary else (lambda _: None)
  os.makedirs(workdir, exist_ok=True)
  inputs_lib.check(config, workdir, say)
  finished = _finished_before(config, workdir)
  if finished is not None:
    say(f"finished before: {os.path.join(workdir, CHECKPOINT_DIR)}/{finished} is the last "
        "step of the same config; nothing to do")
    return TrainResult("finished", finished, {})
  if jax.config.jax_default_matmul_precision:  # The products differ with it: say so.
    say(f"matrix products at {jax.config.jax_default_matmul_precision} precision "
        "(jax_default_matmul_precision)")
  mesh = mesh_lib.make_mesh(config.mesh, devices)
  rules = _rules(config)
  processes = jax.process_count()
  if config.batch_size % processes:
    raise ValueError(f"config.batch_size {config.batch_size} is not divisible by the "
                     f"{processes} processes")
  local_batch = config.batch_size // processes

  task = task_lib.resolve(config.task)(config, workdir)
  optimizer = optim.make_optimizer(config.optimizer, config.total_steps)
  with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
    spec = state_lib.ModelSpec.of(task.model, config.freeze)
    shardings = state_lib.state_shardings(spec, optimizer.tx, mesh, rules,
                                          ema=config.ema_decay > 0)
    batch_shardings = rules_lib.batch_shardings(dict(task.batch_axes), mesh, rules)
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    data = iter(task.train_data(local_batch))

    checkpoints = Checkpointer(os.path.join(workdir, CHECKPOINT_DIR),
                               keep=config.keep_checkpoints, best_metric=config.best_metric,
                               best_mode=config.best_mode,
                               async_save=config.async_checkpoints)
    latest = checkpoints.latest_step()
    if latest is not None:
      if config.ema_decay > 0 and not checkpoints.has_moving_average(latest):
        raise ValueError(f"{checkpoints.directory}/{latest} was saved without a moving "
                         "average of the parameters: resume it with config.ema_decay=0, or "
                         "train with a moving average in a new workdir")
      target = state_lib.abstract_state(spec, task.model, optimizer.tx, shardings)
      state = checkpoints.restore(latest, target, data_iterator=data)
      say(f"resumed from {checkpoints.directory}/{latest}")
    else:
      state = state_lib.init_state(spec, task.model, optimizer.tx, shardings)
      if task.initial_params is not None:
        state = state_lib.load_initial_params(state, spec, task.initial_params(), shardings)
    start = latest or 0

    micro_sharding = {k: jax.sharding.NamedSharding(mesh, s.spec)
                      for k, s in batch_shardings.items()}
    constrain_micro = lambda b: jax.lax.with_sharding_constraint(
        b, {k: micro_sharding[k] for k in b})
    train_step = make_train_step(spec, task.loss, optimizer.tx, optimizer.schedule,
                                 config.accum_steps, constrain_micro,
                                 with_constants=task.constants is not None,
                                 ema_decay=config.ema_decay)
    step_fn = jax.jit(
        train_step,
        in_shardings=(shardings, batch_shardings, replicated, replicated),
        out_shardings=(shardings, replicated), donate_argnums=(0,))
    rng = jax.random.key(config.seed)
    # Frozen inputs of the loss: on the devices once, a jit argument at every step.
    constants = (distributed.place(task.constants(), replicated)
                 if task.constants is not None else None)
    config_dict = config.to_dict()

    def evaluate(step: int) -> dict[str, float]:
      # With a moving average, the averaged model is the one selected and later loaded.
      model = spec.merge(state.ema or state.params, state.frozen, state.others, None)
      results = {}
      for evaluator in task.evaluators:
        for name, value in evaluator.run(model, step):
          results[f"{evaluator.name}/{name}"] = float(value)
      return results

    writer = MetricWriter(workdir, resume_step=start, enabled=primary)
    window = _LogWindow(config.batch_size)

    def log_window(step: int) -> dict[str, float]:
      metrics = window.flush()
      writer.write(step, metrics)
      say(f"step {step}: " + " ".join(f"{k}={v:.4g}" for k, v in metrics.items()))
      return metrics

    def check_finite(step: int) -> None:
      bad = int(state.first_nonfinite_step)
      if bad < 0:
        return
      if window:
        log_window(step)  # The user should see the NaN in metrics.jsonl too.
      good = checkpoints.latest_step()
      raise NonFiniteLossError(
          f"the loss or gradient became NaN/Inf at step {bad + 1}; training stopped at step "
          f"{step} (that step's update was skipped). Last good checkpoint: "
          f"{'step ' + str(good) if good is not None else 'none'} in "
          f"{checkpoints.directory}. Lower optimizer.learning_rate or set "
          f"optimizer.clip_norm, then rerun to resume from it.")

    def save(step: int, metrics: Mapping[str, float] | None = None) -> None:
      check_finite(step)
      checkpoints.save(step, state, data_iterator=data, config=config_dict, metrics=metrics)

    stopping = _EarlyStopping(config, checkpoints.best(), start)
    step, last = start, {}
    # The previous step's metrics, counted done in the progress line once the device has
    # them: at most one step is in flight (the host still prepares the next batch while the
    # device runs the current one), so the line's rate and ETA are the device's. Counting
    # dispatches instead ran ~25 steps ahead of the device on the small explanation stage.
    in_flight = None
    try:
      if stopping.exhausted:
        say(f"stopped early at step {start} before ({stopping.describe()}); nothing to do")
        return TrainResult("early_stopped", start, last)
      with _StopSignals() as signals, Progress(
          "train", total=config.total_steps - start, unit="step", enabled=primary,
          interval=10.0) as progress:
        while step < config.total_steps:
          try:
            local = next(data)
          except StopIteration:
            raise ValueError(f"the training data ran out at step {step} of "
                             f"{config.total_steps}; repeat it (num_epochs=None)") from None
          if step == start:
            _check_local_batch(local, local_batch, task.batch_axes)
          batch = distributed.global_batch({k: local[k] for k in task.batch_axes},
                                           batch_shardings)
          if step == start and peaks.bf16_peak_tflops(mesh.devices.flat[0].device_kind):
            # Only where MFU can be reported: the count traces the step once more, which
            # cost up to ~15 s on CPU (the REINFORCE step), a share of a CPU run's time.
            say(window.count_flops(train_step, (state, batch, rng, constants),
                                   mesh.devices.flatten().tolist()))
          state, metrics = step_fn(state, batch, rng, constants)
          step += 1
          window.add(metrics)
          if in_flight is not None:
            jax.block_until_ready(in_flight)
            progress.update()
          in_flight = metrics

          if step % config.log_every == 0 or step == config.total_steps:
            last = log_window(step)
            check_finite(step)

          results = None
          final = step == config.total_steps
          if final or (config.eval_every and step % config.eval_every == 0):
            if task.evaluators:
              results = evaluate(step)
              writer.write(step, results)
              last.update(results)
              say(f"eval {step}: " + " ".join(f"{k}={v:.4g}" for k, v in results.items()))
          saved = final or step % config.checkpoint_every == 0 or bool(
              results and config.best_metric)
          if saved:
            save(step, results)
          if results and stopping.update(results) and not final:
            checkpoints.wait()
            say(f"early stop at step {step}: {stopping.describe()}")
            return TrainResult("early_stopped", step, last)

          stop = signals.received if processes == 1 else (
              "preemption" if checkpoints.reached_preemption(step) else None)
          if stop and not final:
            if not saved:  # A step saved above cannot be saved twice (orbax refuses).
              save(step)
            checkpoints.wait()
            say(f"received {stop} at step {step}: checkpoint saved; rerun the same command "
                "to resume")
            return TrainResult("preempted", step, last, stop)
        if in_flight is not None:  # The last step: the final log line synced on it.
          progress.update()
      checkpoints.wait()
      return TrainResult("finished", step, last)
    finally:
      writer.close()
      checkpoints.close()
