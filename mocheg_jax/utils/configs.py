"""Loading the experiment configs in the repository's configs/ folder from library code."""

from __future__ import annotations

import importlib.util
import os

import ml_collections

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
