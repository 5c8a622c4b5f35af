"""Loading the experiment configs in the repository's configs/ folder from library code."""

from __future__ import annotations

import importlib.util
import os
from typing import Any, Mapping

import ml_collections

from mocheg_jax.data.report import MochegInputError

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "configs")


def load_config(name: str, variant: str) -> ml_collections.ConfigDict:
  """configs/NAME.py's `get_config(variant)` (what `--config=configs/NAME.py:VARIANT` gives)."""
  path = os.path.join(CONFIG_DIR, f"{name}.py")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"no config {path} (an editable install keeps configs/ beside "
                            "the package)")
  spec = importlib.util.spec_from_file_location(f"mocheg_configs.{name}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(variant)


# The main job's stages (retrieval, verification, explanation) share these.
Overrides = Mapping[str, Mapping[str, Any]]  # config name -> {dotted key: value}


def release_dir(workdir: str, release: str = "") -> str:
  """The release a main job works on: `release`, or its synthetic world WORKDIR/release."""
  return release or os.path.join(workdir, "release")


def stage_config(name: str, scale: str, workdir: str, seed: int, *, release: str = "",
                 overrides: Overrides | None = None) -> ml_collections.ConfigDict:
  """configs/NAME.py:SCALE on the main job's world: the data the main job prepared in
  `workdir` (`release`, or the synthetic world of `scale`), its seed, and the job's
  overrides for NAME (e.g. {"retrieval_image": {"model.init": "/models/clip"}})."""
  config = load_config(name, scale)
  config.data.dir = workdir  # Every stage reads the world the main job prepared.
  config.data.scale = scale
  config.data.release = release
  config.seed = seed
  return apply_overrides(config, name, overrides)


def apply_overrides(config: ml_collections.ConfigDict, name: str,
                    overrides: Overrides | None) -> ml_collections.ConfigDict:
  """Sets `overrides[name]`'s dotted keys in `config` (in place; returned); a key the config
  lacks is an error naming it."""
  for key, value in ((overrides or {}).get(name) or {}).items():
    *parents, leaf = key.split(".")
    node = config
    for part in parents:
      node = node.get(part) if isinstance(node, ml_collections.ConfigDict) else None
    if not isinstance(node, ml_collections.ConfigDict) or leaf not in node:
      raise MochegInputError(f"configs/{name}.py has no field {key!r}")
    node[leaf] = value
  return config
