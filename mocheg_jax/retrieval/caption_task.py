"""Caption pre-training of a small CLIP: the synthetic worlds' stand-in for web pre-training.

The paper's CLIP is pretrained on web image-text pairs and so knows colours, counts and
shapes before it sees a claim. A CLIP initialised at random on a synthetic world does not,
and the few hundred claims about facts that only pictures show do not teach it. This task
trains the image retriever's CLIP (the same model config, the same tokenizer, the same
InfoNCE loss and batch layout: image_task.clip_loss) on the synthetic caption corpus
(data/synthetic/captions.py: pictures drawn by the world's renderer, captions naming what
they show; no claim of any split is used). The image retriever then starts from it
(`--config.model.init=THIS_WORKDIR`, configs/retrieval_image.py).

Dev metric (`dev/value_accuracy`, the model selection): on held-out pairs, how often the
picture's own caption scores above the same caption with `alternatives` other values of its
attribute ("... is mostly pink" against "... is mostly green"); chance 1 / (1 +
alternatives). Also per kind of value: `dev/value_accuracy_colour`, `_count`, `_emblem`.
"""

from __future__ import annotations

import collections
import os

import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from mocheg_jax.data import caption_corpus
from mocheg_jax.data import pipelines
from mocheg_jax.data.synthetic import captions
from mocheg_jax.data.synthetic.attributes import ATTRIBUTES
from mocheg_jax.data.tokenizers import load_tokenizer
from mocheg_jax.models import clip
from mocheg_jax.models import encoding
from mocheg_jax.parallel import distributed
from mocheg_jax.retrieval import image_task
from mocheg_jax.retrieval.image_encoders import ImageEncoders
from mocheg_jax.train.data import prepared_data
from mocheg_jax.train.task import Evaluator, Task

CORPUS_DIR = "corpus"  # Under the workdir.
# Held-out pairs are drawn from indices no training corpus reaches.
HELD_OUT_START = 1 << 40


def captions_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.pairs = 20000  # Training pairs (drawn once into WORKDIR/corpus).
  c.corpus_seed = 0
  c.eval_pairs = 400
  c.alternatives = 3  # Other values each held-out picture's caption competes with.
  c.workers = -1  # Processes drawing the corpus; -1: the CPU count for large corpora.
  return c


def config_defaults() -> dict:
  return {"captions": captions_config(), "model": image_task.model_config(),
          "retrieval": image_task.retrieval_config()}


def value_kind(attribute_key: str) -> str:
  return ATTRIBUTES[attribute_key].values.kind


def held_out_evaluator(corpus_seed: int, count: int, alternatives: int, image_size: int,
                       encoders: ImageEncoders):
  """`run(model, step)`: value accuracy on `count` held-out pairs (pictures drawn on the
  first run, not when the task is built, so loading a trained model draws nothing)."""
  if count <= 0:
    raise ValueError(f"config.captions.eval_pairs must be positive, got {count}")
  drawn: list = []

  def draw():
    indices = range(HELD_OUT_START, HELD_OUT_START + count)
    pairs = [captions.caption_pair(corpus_seed, i) for i in indices]
    pixels = np.stack([caption_corpus.normalise(caption_corpus.picture(p.job, image_size))
                       for p in pairs])
    texts = [t for i in indices for t in captions.alternatives(corpus_seed, i, alternatives)]
    return [value_kind(p.attribute) for p in pairs], pixels, texts

  def run(model: clip.CLIPModel, step: int):
    del step
    if not drawn:
      drawn.append(draw())
    kinds, pixels, texts = drawn[0]
    images = encoding.encode_clip_pixels(model, pixels, batch_size=encoders.batch_size)
    queries = encoders.encode_queries(model, texts).reshape(len(kinds), 1 + alternatives, -1)
    right = np.einsum("nap,np->na", queries, images).argmax(-1) == 0  # First: the true one.
    yield "value_accuracy", float(right.mean())
    by_kind = collections.defaultdict(list)
    for kind, ok in zip(kinds, right):
      by_kind[kind].append(ok)
    for kind, oks in sorted(by_kind.items()):
      yield f"value_accuracy_{kind}", float(np.mean(oks))

  return run


def make_task(config: ml_collections.ConfigDict, workdir: str) -> Task:
  m, r, c = config.model, config.retrieval, config.captions
  if m.init != image_task.RANDOM:
    raise ValueError(f"caption pre-training starts from a random CLIP; config.model.init is "
                     f"{m.init!r}")
  data = prepared_data(config, workdir)  # The world's WordPiece vocabulary.
  param_dtype = jnp.dtype(config.param_dtype)
  source = image_task.clip_source(m, r, data.wordpiece, param_dtype)
  size = source.config.vision.image_size
  max_query_len = min(r.max_query_len, source.config.text.max_position_embeddings)
  workers = None if c.workers < 0 else c.workers

  def model() -> clip.CLIPModel:
    return clip.CLIPModel(source.config, dtype=jnp.dtype(m.dtype), param_dtype=param_dtype,
                          rngs=nnx.Rngs(config.seed))

  def train_data(local_batch: int):
    folder = distributed.primary_first("caption_corpus", lambda: caption_corpus.build(
        os.path.join(workdir, CORPUS_DIR), seed=c.corpus_seed, count=c.pairs,
        image_size=size, workers=workers))
    loader = pipelines.LoaderConfig.training(local_batch, config.seed, config.data)
    return iter(pipelines.caption_pairs(folder, source.tokenizer_dir, loader,
                                        max_query_len).dataset)

  encoders = ImageEncoders(source.tokenizer_dir, max_query_len, r.eval_batch_size)
  load_tokenizer(source.tokenizer_dir)  # Fail here, not at the first evaluation.
  return Task(model=model, loss=image_task.clip_loss(r), batch_axes=image_task.BATCH_AXES,
              train_data=train_data,
              evaluators=(Evaluator("dev", held_out_evaluator(
                  c.corpus_seed, c.eval_pairs, c.alternatives, size, encoders)),),
              inference=encoders)
