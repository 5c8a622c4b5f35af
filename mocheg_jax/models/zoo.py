"""Which model family a checkpoint folder holds, and the family's load / save.

A folder is an HF folder (config.json + weights) or one written by scripts/convert.py
(config.json + an orbax checkpoint of the same tensors); `config.json`'s `model_type`
names the family. Unknown types are an error naming the file.
"""

from __future__ import annotations

import importlib
import os
import shutil
from types import ModuleType

from mocheg_jax.data.report import MochegInputError
from mocheg_jax.models.hf import convert

# model_type -> module with load(folder, ...) and save(model, folder).
FAMILIES: dict[str, str] = {
    "bert": "mocheg_jax.models.hf.bert",
    "clip": "mocheg_jax.models.hf.clip",
    "bart": "mocheg_jax.models.hf.bart",
}


def model_type(folder: str | os.PathLike) -> str:
  config = convert.read_config(folder)
  kind = config.get("model_type")
  if kind not in FAMILIES:
    raise MochegInputError(f"{os.path.join(os.fspath(folder), 'config.json')}: unsupported "
                           f"model_type {kind!r}; expected one of {sorted(FAMILIES)}")
  return kind


def family(folder: str | os.PathLike) -> ModuleType:
  return importlib.import_module(FAMILIES[model_type(folder)])


def load(folder: str | os.PathLike, **kwargs):
  """Our model for the checkpoint in `folder` (family-specific keyword arguments pass on)."""
  return family(folder).load(folder, **kwargs)


def convert_folder(source: str | os.PathLike, target: str | os.PathLike,
                   to_format: str) -> None:
  """Loads `source` into our model and writes it to `target` as `hf` or `orbax`.

  Loading through our model checks every tensor against the conversion table. Files that
  are not weights (tokenizer, sentence-transformers modules, generation config) are copied.
  """
  if to_format not in ("hf", "orbax"):
    raise ValueError(f"unknown format {to_format!r}; expected 'hf' or 'orbax'")
  source, target = os.fspath(source), os.fspath(target)
  module = family(source)
  model = module.load(source)
  os.makedirs(target, exist_ok=True)
  skip = set(convert.WEIGHT_FILES) | {convert.ORBAX_DIR}
  for name in os.listdir(source):
    if name in skip:
      continue
    src, dst = os.path.join(source, name), os.path.join(target, name)
    if os.path.isdir(src):
      shutil.copytree(src, dst, dirs_exist_ok=True)
    else:
      shutil.copy2(src, dst)
  module.save(model, target)  # Writes config.json and model.safetensors (HF layout).
  if to_format == "orbax":
    weights = os.path.join(target, "model.safetensors")
    convert.write_orbax_weights(target, convert.read_state_dict_file(weights))
    os.remove(weights)
  else:
    shutil.rmtree(os.path.join(target, convert.ORBAX_DIR), ignore_errors=True)
