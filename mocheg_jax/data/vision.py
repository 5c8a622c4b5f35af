"""Image decoding for the pipelines: encoded bytes -> normalised float32 pixels.

CLIP-style preprocessing, pixel-identical to transformers' CLIPImageProcessor (PIL backend):
resize the shorter side to `size` (bicubic), centre crop to
`size` x `size`, scale to [0, 1], normalise with the CLIP mean and standard deviation.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

CLIP_MEAN = np.array([0.48145466, 0.4578275, 0.40821073], np.float32)
CLIP_STD = np.array([0.26862954, 0.26130258, 0.27577711], np.float32)


def decode_image(data: bytes, size: int, mean: np.ndarray = CLIP_MEAN,
                 std: np.ndarray = CLIP_STD) -> np.ndarray:
  """Returns [size, size, 3] float32 pixels, normalised."""
  with Image.open(io.BytesIO(data)) as img:
    img = img.convert("RGB")
    width, height = img.size
    short, long = min(width, height), max(width, height)
    new_long = int(size * long / short)  # Truncated, as CLIPImageProcessor does.
    resized = img.resize((size, new_long) if width <= height else (new_long, size),
                         Image.Resampling.BICUBIC)
  left = (resized.width - size) // 2
  top = (resized.height - size) // 2
  crop = resized.crop((left, top, left + size, top + size))
  pixels = np.asarray(crop, dtype=np.float32) / 255.0
  return (pixels - mean) / std
