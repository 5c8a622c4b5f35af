"""The fields every training config has; a stage's config file starts from `base_config()`.

Configs are Python files under configs/ with `get_config(arg)`, where `arg` picks a variant
(`tiny`, `small`, `paper`, ...); scripts/train.py loads them with `lock_config=True`, so a
mistyped `--config.x.y=...` override is an error rather than a silently ignored field.
"""

from __future__ import annotations

import jax
import ml_collections

from mocheg_jax.parallel import mesh as mesh_lib
from mocheg_jax.parallel import rules as rules_lib
from mocheg_jax.train import optim

BEST_MODES = ("max", "min")


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  # "module:function" returning a Task (see train/task.py), or a registered short name.
  c.task = ""
  c.seed = 0
  c.total_steps = 100
  c.batch_size = 32  # Global: summed over every device and process.
  c.accum_steps = 1  # Micro-batches per step (gradient accumulation inside the jitted step).
  c.log_every = 10
  c.eval_every = 0  # 0: evaluate only at the end.
  c.checkpoint_every = 100
  c.keep_checkpoints = 2  # The latest N are kept, and the best one when best_metric is set.
  c.best_metric = ""  # An evaluator's metric name, e.g. "dev/macro_f1".
  c.best_mode = "max"
  # Stop after this many evaluations in a row without a better best_metric (0: never).
  c.early_stopping_patience = 0
  c.async_checkpoints = True
  c.freeze = ""  # Regex of parameter paths that are not trained (no gradients, no state).
  c.param_dtype = "float32"
  # jax_default_matmul_precision while this config trains and evaluates ("": the process's
  # own setting). E.g. "float32" keeps one stage's products exact in a job run under
  # "bfloat16" (models/matmul.py says what that setting does on CPU).
  c.matmul_precision = ""
  # > 0: keep an exponential moving average of the trainable parameters with this decay
  # (ramped up over the first steps: train/step.py), and evaluate, select and load for
  # inference the averaged model instead of the last parameters.
  c.ema_decay = 0.0

  c.mesh = mesh_lib.default_config()
  c.sharding = ml_collections.ConfigDict()
  c.sharding.rules = rules_lib.DEFAULT_RULES  # Logical axis -> mesh axis, first match wins.
  c.optimizer = optim.default_config()

  c.data = ml_collections.ConfigDict()
  c.data.release = ""  # A Mocheg release folder; empty: a synthetic world, made on demand,
  c.data.scale = "tiny"  # of this scale (tiny / small / paper)
  c.data.world_seed = -1  # and this seed; -1: the run's `seed`. Fix it to vary only the model.
  c.data.dir = ""  # Where it is prepared; empty: WORKDIR/data. The main job's stages share one.
  c.data.workers = 0  # grain worker processes for the training input.
  c.data.read_threads = 2  # grain reader threads (data/pipelines.py: ReadAhead says why so few)
  c.data.read_ahead_batches = 4  # and how many batches they read ahead of the step.
  # > 0: training batches of examples of similar length, sorted within megabatches of this
  # many global batches (data/length_groups.py; the tasks whose inputs know their lengths:
  # text retrieval, reranking, explanation); 0: batches drawn freely.
  c.data.length_groups = 0

  c.distributed = ml_collections.ConfigDict()
  c.distributed.mode = "auto"  # auto | on | off (see parallel/distributed.py).
  c.distributed.coordinator = ""
  c.distributed.num_processes = 0
  c.distributed.process_id = -1
  c.distributed.heartbeat_timeout_s = 0  # 0: JAX's default (100 s).
  return c


def validate(c: ml_collections.ConfigDict) -> None:
  """Checks the trainer's own fields; raises ValueError naming the field."""
  def positive(name: str, allow_zero: bool = False) -> None:
    value = c[name]
    if not isinstance(value, int) or value < 0 or (value == 0 and not allow_zero):
      raise ValueError(f"config.{name} must be a {'non-negative' if allow_zero else 'positive'}"
                       f" integer, got {value!r}")

  if not c.task:
    raise ValueError("config.task is empty: name the task (module:function)")
  for name in ("total_steps", "batch_size", "accum_steps", "log_every", "checkpoint_every",
               "keep_checkpoints"):
    positive(name)
  positive("eval_every", allow_zero=True)
  if c.batch_size % c.accum_steps:
    raise ValueError(f"config.batch_size {c.batch_size} is not divisible by "
                     f"config.accum_steps {c.accum_steps}")
  positive("early_stopping_patience", allow_zero=True)
  groups = c.data.get("length_groups", 0)
  if isinstance(groups, bool) or not isinstance(groups, int) or groups < 0:
    raise ValueError(f"config.data.length_groups must be a non-negative integer, got "
                     f"{groups!r}")
  if c.early_stopping_patience and not (c.best_metric and c.eval_every):
    raise ValueError("config.early_stopping_patience needs config.best_metric and a positive "
                     "config.eval_every")
  if isinstance(c.ema_decay, bool) or not isinstance(c.ema_decay, (int, float)) \
      or not 0.0 <= c.ema_decay < 1.0:
    raise ValueError(f"config.ema_decay must be a number in [0, 1), got {c.ema_decay!r}")
  if c.matmul_precision:
    try:  # JAX's own check, so every name it accepts is accepted.
      with jax.default_matmul_precision(c.matmul_precision):
        pass
    except ValueError as e:
      raise ValueError(f"config.matmul_precision: {e}") from None
  if c.best_mode not in BEST_MODES:
    raise ValueError(f"config.best_mode must be one of {BEST_MODES}, got {c.best_mode!r}")
