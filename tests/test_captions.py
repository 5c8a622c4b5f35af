"""The caption corpus (data/synthetic/captions.py, data/caption_corpus.py) and caption
pre-training (retrieval/caption_task.py): pairs name what their pictures show, the corpus is
drawn once, the held-out metric scores what it should, and a pretrained workdir is where
the image retriever starts."""

from __future__ import annotations

import importlib.util
import os

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from flax import traverse_util

from mocheg_jax.data import caption_corpus
from mocheg_jax.data.synthetic import captions, lexicon, render
from mocheg_jax.data.synthetic.attributes import ATTRIBUTES
from mocheg_jax.data.vision import decode_image
from mocheg_jax.retrieval import caption_task
from mocheg_jax.retrieval import image_task

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(name: str, variant: str):
  spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "configs", name + ".py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(variant)


def test_pairs_are_fixed_by_seed_and_index_and_name_the_value_they_show():
  pairs = [captions.caption_pair(0, i) for i in range(200)]
  assert pairs == [captions.caption_pair(0, i) for i in range(200)]
  assert captions.caption_pair(1, 0) != pairs[0]
  assert {p.attribute for p in pairs} == {a.key for a in captions.CAPTIONED}
  assert "company.sales_peak" not in {a.key for a in captions.CAPTIONED}  # Charts: no.
  for p in pairs:
    attribute = ATTRIBUTES[p.attribute]
    assert p.value in p.caption and p.job.kind == attribute.render
    data = p.job.params[0]
    if attribute.values.kind == "colour":
      assert data == (p.value,)
    elif attribute.values.kind == "count":
      assert lexicon.COUNT_WORDS[data[0]] == p.value
    else:  # An emblem: "<colour> <shape>".
      assert " ".join(data) == p.value


def test_a_flag_picture_is_mostly_its_caption_colour():
  pair = next(p for p in (captions.caption_pair(0, i) for i in range(100))
              if p.attribute == "town.flag")
  pixels = caption_corpus.picture(pair.job, 64).reshape(-1, 3).astype(float)
  near = {name: int(np.sum(np.linalg.norm(pixels - np.array(rgb), axis=1) < 40))
          for name, rgb in lexicon.COLOURS.items()}
  assert max(near, key=near.get) == pair.value, (pair.value, near)


def test_alternatives_change_only_the_value():
  for i in range(50):
    pair = captions.caption_pair(3, i)
    texts = captions.alternatives(3, i, 3)
    assert texts[0] == pair.caption and len(set(texts)) == 4
    words = pair.caption.split(pair.value)[0].split()
    prefix = " ".join(words[:-1] if words and words[-1] in ("a", "an") else words)
    assert all(t.startswith(prefix) for t in texts), texts
  with pytest.raises(ValueError, match="fewer than"):
    captions.alternatives(3, 0, 50)


def test_the_corpus_is_drawn_once_and_matches_the_renderer(tmp_path):
  logs = []
  folder = caption_corpus.build(str(tmp_path), seed=2, count=12, image_size=32, workers=0,
                                log=logs.append)
  assert len(logs) == 1
  assert os.path.basename(folder) == f"captions-v{captions.VERSION}-seed2-n12-32px"
  pixels_file = os.path.join(folder, caption_corpus.PIXELS)
  stamp = os.stat(pixels_file).st_mtime_ns
  assert caption_corpus.build(str(tmp_path), seed=2, count=12, image_size=32,
                              log=logs.append) == folder
  assert len(logs) == 1 and os.stat(pixels_file).st_mtime_ns == stamp  # Not drawn again.

  source = caption_corpus.CaptionSource(folder)
  assert len(source) == 12 and source.pixels.dtype == np.uint8
  for i in (0, 11):
    pair = captions.caption_pair(2, i)
    record = source[i]
    assert record["caption"] == pair.caption and record["index"] == i
    want = decode_image(render.render_bytes(pair.job), 32)
    np.testing.assert_allclose(caption_corpus.normalise(record["pixels"]), want, atol=0.01)

  pooled = caption_corpus.build(str(tmp_path / "pool"), seed=2, count=12, image_size=32,
                                workers=2, log=logs.append)
  np.testing.assert_array_equal(np.load(os.path.join(pooled, caption_corpus.PIXELS)),
                                source.pixels)
  with pytest.raises(ValueError, match="at least one pair"):
    caption_corpus.build(str(tmp_path), seed=2, count=0, image_size=32)


def test_the_held_out_metric_scores_value_reading(monkeypatch):
  """Stand-in embeddings: one-hot per caption text; a picture's embedding is the one-hot of
  its own caption (a model that reads the value: 1.0) or of an alternative's (0.0)."""
  count, alternatives = 24, 3
  indices = range(caption_task.HELD_OUT_START, caption_task.HELD_OUT_START + count)
  texts = [captions.alternatives(0, i, alternatives) for i in indices]
  rows = {t: n for n, t in enumerate(sorted({t for ts in texts for t in ts}))}
  onehot = lambda text: np.eye(len(rows), dtype=np.float32)[rows[text]]
  monkeypatch.setattr(image_task.ImageEncoders, "encode_queries",
                      lambda self, model, batch: np.stack([onehot(t) for t in batch]))
  encoders = image_task.ImageEncoders("unused", 16, 8)
  for shown, want in ((0, 1.0), (2, 0.0)):
    monkeypatch.setattr(caption_task.encoding, "encode_clip_pixels",
                        lambda model, pixels, batch_size, shown=shown: np.stack(
                            [onehot(ts[shown]) for ts in texts[:len(pixels)]]))
    run = caption_task.held_out_evaluator(0, count, alternatives, 16, encoders)
    metrics = dict(run(None, 0))
    assert metrics["value_accuracy"] == want, metrics
    kinds = {caption_task.value_kind(captions.caption_pair(0, i).attribute) for i in indices}
    assert set(metrics) == {"value_accuracy"} | {f"value_accuracy_{k}" for k in kinds}
  with pytest.raises(ValueError, match="eval_pairs must be positive"):
    caption_task.held_out_evaluator(0, 0, alternatives, 16, encoders)


def test_caption_pretraining_is_where_the_image_retriever_starts(tiny_main_job, tmp_path):
  """The shared tiny main job's captions stage (4 steps) is the CLIP its image retriever
  started from."""
  from mocheg_jax.train import restore
  from mocheg_jax.train import writer

  stages = tiny_main_job.workdir / "stages"
  workdir = str(stages / "captions")
  accuracies = [r["dev/value_accuracy"] for r in writer.read_metrics(workdir)
                if "dev/value_accuracy" in r]
  assert accuracies and all(0.0 <= a <= 1.0 for a in accuracies)
  checkpoints, step = restore.checkpoint_step(str(stages / "retrieval_image"), "best")
  with checkpoints:
    assert checkpoints.restore_config(step)["model"]["init"] == workdir
  trained = restore.load_trained(workdir, "best")

  image = _config("retrieval_image", "tiny")
  image.model.init = workdir
  source = image_task.clip_source(image.model, image.retrieval, "unused", jnp.float32)
  assert source.config == trained.model.config
  assert source.tokenizer_dir == trained.task.inference.tokenizer_dir
  want = traverse_util.flatten_dict(nnx.state(trained.model, nnx.Param).to_pure_dict())
  got = traverse_util.flatten_dict(source.weights())
  assert set(got) == set(want)
  for path, value in want.items():
    if path != ("logit_scale",):  # The retriever's fixed scale replaces it.
      np.testing.assert_array_equal(np.asarray(got[path]), np.asarray(value))
  np.testing.assert_allclose(float(got[("logit_scale",)]), np.log(image.retrieval.scale),
                             rtol=1e-6)

  image.model.init = str(tmp_path / "nothing")
  with pytest.raises(image_task.MochegInputError, match="does not exist"):
    image_task.clip_source(image.model, image.retrieval, "unused", jnp.float32)
