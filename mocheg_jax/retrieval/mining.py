"""Hard negatives mined once per workdir and cached there (the reranker's and the text
retriever's training pairs).

The cache is a JSON file holding the settings it was mined with; opening it with other
settings is an error (delete it or use a new workdir), so a resumed run trains on exactly
the negatives it started with.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable

from mocheg_jax.data.report import MochegInputError
from mocheg_jax.parallel import distributed
from mocheg_jax.utils import files, paths

MINED_FILE = "mined_negatives.json"


def world_name(config) -> str:
  """What a cache's settings call the data it was mined on: the release, or the world."""
  return config.data.release or f"synthetic/{config.data.scale}"


def cached_mining(path: str, settings: dict[str, Any], make: Callable[[], dict],
                  log: Callable[[str], None] = print) -> dict[str, Any]:
  """`make()` once: process 0 writes `path` (atomically), every process reads it."""
  def read() -> dict | None:
    if not os.path.exists(path):
      return None
    try:
      with open(path, encoding="utf-8") as f:
        cached = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
      raise MochegInputError(f"{path}: unreadable mining cache ({e}); delete it to mine "
                             "again") from e
    if not paths.same_record(cached.get("settings"), settings, None):
      found = paths.relocate(cached.get("settings") or {}, None)
      diff = sorted(k for k in settings if found.get(k) != paths.relocate(settings[k], None))
      raise MochegInputError(f"{path} was mined with other settings ({', '.join(diff)} "
                             "differ from the config); delete it or use a new workdir")
    return cached

  def mine() -> None:
    if read() is None:
      mined = {"settings": settings, **make()}
      os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
      files.write_json(path, mined)
      log(f"mined negatives written to {path}")

  distributed.primary_only("negative_mining", mine)  # The others wait for the file.
  return read()
