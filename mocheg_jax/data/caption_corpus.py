"""The synthetic caption corpus (data/synthetic/captions.py), rendered once into a folder.

Rendering a 400-pixel picture and resizing it costs a few milliseconds, more than a small
CLIP's training step spends per pair, so the pairs are drawn once and every epoch (and a
resumed run) reads them back:
```
captions.json   the captions, in row order
pixels.npy      uint8 [count, size, size, 3]: resized and centre-cropped as CLIP's image
                processor does, not yet normalised (a quarter of float32's size)
.complete       written last (prepare.once): a folder without it is redone
```
The small world's 20,000 pairs at 64 pixels take 236 MB.
"""

from __future__ import annotations

import json
import multiprocessing
import os
from typing import Any, Callable

import numpy as np

from mocheg_jax.data.prepare import once
from mocheg_jax.data.synthetic import captions, render
from mocheg_jax.data.vision import CLIP_MEAN, CLIP_STD, decode_image

CAPTIONS = "captions.json"
PIXELS = "pixels.npy"
# Below this many pairs the corpus is drawn in-process (worker start-up costs more).
_MIN_PAIRS_FOR_WORKERS = 2000


def folder_name(seed: int, count: int, image_size: int) -> str:
  return f"captions-v{captions.VERSION}-seed{seed}-n{count}-{image_size}px"


def picture(job: render.ImageJob, size: int) -> np.ndarray:
  """A rendered picture as uint8 [size, size, 3], resized and cropped as CLIP's processor."""
  unit = decode_image(render.render_bytes(job), size, mean=np.zeros(3), std=np.ones(3))
  return np.rint(unit * 255.0).astype(np.uint8)


def normalise(pixels: np.ndarray) -> np.ndarray:
  """uint8 pictures [..., 3] -> CLIP-normalised float32 (what decode_image returns)."""
  return ((pixels.astype(np.float32) / 255.0 - CLIP_MEAN) / CLIP_STD).astype(np.float32)


def _draw(args: tuple[int, int, int]) -> tuple[str, np.ndarray]:
  seed, index, size = args
  pair = captions.caption_pair(seed, index)
  return pair.caption, picture(pair.job, size)


def build(parent: str, *, seed: int, count: int, image_size: int, workers: int | None = None,
          log: Callable[[str], None] = print) -> str:
  """The corpus folder for (seed, count, image_size) under `parent`, drawn unless an earlier
  run finished it. `workers`: drawing processes (None: the CPU count for large corpora)."""
  if count <= 0:
    raise ValueError(f"a caption corpus needs at least one pair, got count={count}")
  folder = os.path.join(parent, folder_name(seed, count, image_size))

  def make(path: str) -> None:
    os.makedirs(path)
    jobs = [(seed, i, image_size) for i in range(count)]
    n = (os.cpu_count() or 1) if workers is None and count >= _MIN_PAIRS_FOR_WORKERS else (
        workers or 1)
    if n > 1:
      with multiprocessing.get_context("spawn").Pool(n) as pool:
        pairs = pool.map(_draw, jobs, chunksize=64)
    else:
      pairs = [_draw(job) for job in jobs]
    np.save(os.path.join(path, PIXELS), np.stack([p for _, p in pairs]))
    with open(os.path.join(path, CAPTIONS), "w") as f:
      json.dump([c for c, _ in pairs], f)

  if once(folder, make):
    log(f"caption corpus: {count:,} pairs drawn into {folder}")
  return folder


class CaptionSource:
  """Random access to a built corpus (picklable: grain workers reopen the memory map)."""

  def __init__(self, folder: str):
    self.folder = folder
    with open(os.path.join(folder, CAPTIONS)) as f:
      self.captions: list[str] = json.load(f)
    self._pixels: np.ndarray | None = None
    if len(self) != len(self.captions):
      raise ValueError(f"{folder}: {len(self.captions)} captions but {len(self)} pictures")

  @property
  def pixels(self) -> np.ndarray:
    if self._pixels is None:
      self._pixels = np.load(os.path.join(self.folder, PIXELS), mmap_mode="r")
    return self._pixels

  def __getstate__(self) -> dict[str, Any]:
    return {**self.__dict__, "_pixels": None}

  def __len__(self) -> int:
    return int(self.pixels.shape[0])

  def __getitem__(self, i: int) -> dict[str, Any]:
    return {"index": i, "caption": self.captions[i], "pixels": np.asarray(self.pixels[i])}
