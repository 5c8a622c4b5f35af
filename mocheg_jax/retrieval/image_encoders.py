"""How a trained image retriever (CLIP) embeds queries (claims) and documents (KB images)."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from mocheg_jax.data.tokenizers import load_tokenizer
from mocheg_jax.models import encoding


@dataclasses.dataclass(frozen=True)
class ImageEncoders:
  kind = "image"
  tokenizer_dir: str
  max_query_len: int
  batch_size: int

  def encode_queries(self, model, texts: Sequence[str]) -> np.ndarray:
    return encoding.encode_clip_texts(model, load_tokenizer(self.tokenizer_dir), list(texts),
                                      batch_size=self.batch_size,
                                      max_length=self.max_query_len)

  def encode_documents(self, model, paths: Sequence[str]) -> np.ndarray:
    return encoding.encode_clip_images(model, list(paths), batch_size=self.batch_size)
