"""Writes a deterministic synthetic Mocheg world in the release layout.

  python scripts/make_world.py --scale=tiny|small|paper --seed=0 --out=DIR [--workers=N] \
      [--overwrite]

The same scale and seed always give byte-identical files. "tiny" (about 100 claims) takes
seconds, "small" (about 1,500 claims) well under a minute, "paper" (the release's sizes:
15,601 claims, ~92K articles, ~2.8M sentences, ~122K images, several GB) some minutes.
Refuses to write into a non-empty folder unless --overwrite (which replaces only the
release's own files and folders there).
"""

from __future__ import annotations

if __name__ == "__main__":  # First: a re-exec keeps nothing done before it.
  from mocheg_jax.utils import allocator
  allocator.run_under_preferred_allocator()

import os

from absl import app
from absl import flags

from mocheg_jax.data.synthetic import SCALES, write_world
from mocheg_jax.utils.cli import friendly_errors

_SCALE = flags.DEFINE_enum("scale", "tiny", sorted(SCALES), "Size preset.")
_SEED = flags.DEFINE_integer("seed", 0, "World seed.")
_OUT = flags.DEFINE_string("out", None, "Release root folder to write.", required=True)
_WORKERS = flags.DEFINE_integer(
    "workers", None, "Image worker processes (default: the CPU count for large worlds, "
    "in-process for small ones; 0 or 1: in-process).", lower_bound=0)
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace a release already in --out.")
_PROGRESS = flags.DEFINE_bool("progress", True, "Print progress with ETA to stderr.")


@friendly_errors
def main(argv):
  del argv
  out = _OUT.value
  if os.path.exists(out) and not os.path.isdir(out):
    raise NotADirectoryError(f"--out={out} exists and is not a folder")
  if os.path.isdir(out) and os.listdir(out) and not _OVERWRITE.value:
    raise FileExistsError(f"--out={out} is not empty; pass --overwrite to replace the "
                          "release in it")
  summary = write_world(out, scale=_SCALE.value, seed=_SEED.value, workers=_WORKERS.value,
                        progress=_PROGRESS.value, overwrite=_OVERWRITE.value)
  print("\n".join(summary.lines()))


if __name__ == "__main__":
  app.run(main)
