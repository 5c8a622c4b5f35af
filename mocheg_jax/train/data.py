"""The data a stage's task trains on, prepared once per workdir (process 0 first)."""

from __future__ import annotations

import os
from typing import Callable

import ml_collections

from mocheg_jax.data import prepare as prepare_lib
from mocheg_jax.parallel import distributed

DATA_DIR = "data"


def prepared_data(config: ml_collections.ConfigDict, workdir: str,
                  log: Callable[[str], None] = print) -> prepare_lib.PreparedData:
  """`config.data.release` prepared under `config.data.dir` (default WORKDIR/data); without
  a release, the synthetic world of scale `config.data.scale` and seed `config.data.world_seed`
  (-1: `config.seed`).

  Process 0 prepares while the others wait, then every process opens the finished folder
  (the workdir is shared storage in multi-host runs, as checkpoints need anyway).
  """
  out = config.data.dir or os.path.join(workdir, DATA_DIR)
  world_seed = config.data.world_seed if config.data.world_seed >= 0 else config.seed
  kwargs = dict(release=config.data.release or None, scale=config.data.scale, seed=world_seed)
  return distributed.primary_first("prepared_data", lambda: prepare_lib.prepare(
      out, log=log if distributed.is_primary() else (lambda _: None), **kwargs))
