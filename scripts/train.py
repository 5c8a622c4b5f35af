r"""Trains one stage with the shared trainer.

  python scripts/train.py --config=configs/NAME.py:VARIANT --workdir=DIR \
      [--config.total_steps=1000 --config.optimizer.learning_rate=1e-4 ...]

Rerunning the same command resumes from DIR's latest checkpoint. SIGTERM or Ctrl-C saves a
checkpoint and exits 0; a NaN/Inf loss, an invalid config or unusable data print one line
and exit 1. Multi-host: run the same command on every host; JAX's distributed runtime
starts when the environment (Cloud TPU pod, SLURM, Open MPI) or --config.distributed.*
asks for it.
"""

from __future__ import annotations

if __name__ == "__main__":  # First: a re-exec keeps nothing done before it.
  from mocheg_jax.utils import allocator
  allocator.run_under_preferred_allocator()

import json
import sys

from absl import app
from absl import flags
from ml_collections import config_flags

from mocheg_jax.parallel import distributed
from mocheg_jax.train import loop
from mocheg_jax.utils.cli import friendly_errors

_CONFIG = config_flags.DEFINE_config_file("config", None, "configs/NAME.py:VARIANT",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Checkpoints, metrics.jsonl and TensorBoard "
                               "files go here; an existing one is resumed.", required=True)
flags.mark_flag_as_required("config")


@friendly_errors
def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  config = _CONFIG.value
  d = config.distributed
  distributed.maybe_initialize(
      d.mode, coordinator=d.coordinator or None,
      num_processes=d.num_processes or None,
      process_id=d.process_id if d.process_id >= 0 else None,
      heartbeat_timeout_s=d.heartbeat_timeout_s)
  try:
    result = loop.train(config, _WORKDIR.value)
  except (loop.NonFiniteLossError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)
  if distributed.is_primary():
    print(json.dumps({"status": result.status, "step": result.step, **result.metrics}))


if __name__ == "__main__":
  app.run(main)
