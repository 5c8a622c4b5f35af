"""Encodes texts or images into float32 embeddings (a .npy file, rows in input order).

  python scripts/encode.py --model=MINILM_DIR --input=claims.txt --output=claims.npy
  python scripts/encode.py --model=CLIP_DIR --input=captions.txt --output=captions.npy
  python scripts/encode.py --model=CLIP_DIR --images --input=paths.txt --output=images.npy

The model folder is a sentence-transformers folder (modules.json: pooling and normalisation
as it says), a plain HF BERT folder (mean pooling) or an HF CLIP folder (text tower, or the
vision tower with --images); scripts/convert.py's orbax folders work too. config.json's
model_type picks the family.

Input: one item per line, UTF-8. For texts, an empty line is an empty text and gets an
embedding like any other (so row i of the output is always line i + 1); a final line end
does not add an item. Over-long texts are truncated to --max_length tokens (special tokens
included; default: the model's, 77 for CLIP) on --truncation_side. For --images, each line
is an image path (relative to the current directory); an empty or unreadable one is an
error naming its line.

Output: float32 [N, D]. SBERT embeddings are pooled (and normalised if the folder says so);
CLIP embeddings are the projections (as transformers' get_text_features /
get_image_features), not normalised.
"""

if __name__ == "__main__":  # First: a re-exec keeps nothing done before it.
  from mocheg_jax.utils import allocator
  allocator.run_under_preferred_allocator()

import os
import time

from absl import app, flags
import numpy as np

from mocheg_jax.models import encoding
from mocheg_jax.utils import files
from mocheg_jax.utils.cli import friendly_errors

_MODEL = flags.DEFINE_string("model", None, "Model folder (SBERT/BERT or CLIP).", required=True)
_INPUT = flags.DEFINE_string("input", None, "Text file: one text (or image path) per line.",
                             required=True)
_OUTPUT = flags.DEFINE_string("output", None, "The .npy file to write.", required=True)
_IMAGES = flags.DEFINE_bool("images", False, "Lines are image paths (CLIP models only).")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 64, "Items per forward pass.", lower_bound=1)
_MAX_LENGTH = flags.DEFINE_integer(
    "max_length", None, "Tokens per text, special tokens included (default: the model's).",
    lower_bound=2)
_TRUNCATION_SIDE = flags.DEFINE_enum(
    "truncation_side", "right", ["right", "left"],
    "Which end of an over-long text to cut: right keeps the beginning, left keeps the end.")


def _save(path: str, array: np.ndarray) -> None:
  """Writes exactly `path` (np.save would append .npy), replacing it only when complete."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with files.atomic_open(path, "wb") as f:
    np.save(f, array)


@friendly_errors
def main(argv):
  del argv
  items = encoding.read_lines(_INPUT.value)
  encoder = encoding.load_encoder(_MODEL.value, images=_IMAGES.value)
  start = time.perf_counter()
  if _IMAGES.value:
    embeddings = encoder.encode_images(items, batch_size=_BATCH_SIZE.value,
                                       source=_INPUT.value)
  else:
    embeddings = encoder.encode_texts(items, batch_size=_BATCH_SIZE.value,
                                      max_length=_MAX_LENGTH.value,
                                      truncation_side=_TRUNCATION_SIDE.value)
  seconds = time.perf_counter() - start
  _save(_OUTPUT.value, embeddings)
  kind = "images" if _IMAGES.value else "texts"
  rate = f", {len(items) / seconds:.1f} {kind}/s" if items else ""
  print(f"wrote {embeddings.shape[0]} x {embeddings.shape[1]} float32 embeddings of {kind} "
        f"to {_OUTPUT.value} ({encoder.family}{rate})")


if __name__ == "__main__":
  app.run(main)
