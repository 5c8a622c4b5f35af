"""The image retriever (retrieval/image_task.py): freezing, the loss masking, and a tiny CLIP
trained end to end that retrieves dev images above chance and above its untrained self."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx
from flax import traverse_util

from mocheg_jax.models import clip
from mocheg_jax.retrieval import image_task
from mocheg_jax.train import state as state_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _get_config(variant: str) -> ml_collections.ConfigDict:
  spec = importlib.util.spec_from_file_location(
      "retrieval_image_config", os.path.join(ROOT, "configs", "retrieval_image.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(variant)


def _param_paths(config: clip.CLIPConfig) -> list[str]:
  abstract = nnx.eval_shape(lambda: clip.CLIPModel(config, rngs=nnx.Rngs(0)))
  params = nnx.state(abstract, nnx.Param).to_pure_dict()
  return sorted(state_lib.path_string(p) for p in traverse_util.flatten_dict(params))


# 12 text blocks, so that freezing block 1 must not freeze blocks 10 and 11.
SMALL = clip.CLIPConfig(
    text=clip.CLIPTextConfig(vocab_size=50, hidden_size=8, intermediate_size=16,
                             num_attention_heads=2, num_hidden_layers=12,
                             max_position_embeddings=8, eos_token_id=3),
    vision=clip.CLIPVisionConfig(hidden_size=8, intermediate_size=16, num_attention_heads=2,
                                 num_hidden_layers=3, image_size=16, patch_size=8),
    projection_dim=4)


def test_freeze_pattern_takes_the_stem_and_the_lowest_blocks():
  paths = _param_paths(SMALL)
  pattern = image_task.freeze_pattern(2, 1, SMALL)
  _, frozen = state_lib.split_by_regex(
      traverse_util.unflatten_dict({tuple(p.split(".")): 0 for p in paths}), pattern)
  frozen = {state_lib.path_string(p) for p in traverse_util.flatten_dict(frozen)}
  expected = {p for p in paths if p.startswith((
      "text_model.token_embedding.", "text_model.position_embedding.",
      "text_model.layers.0.", "text_model.layers.1.",
      "vision_model.patch_embedding.", "vision_model.position_embedding.",
      "vision_model.pre_layrnorm.", "vision_model.layers.0."))}
  expected.add("vision_model.class_embedding")
  assert frozen == expected
  assert not any(".layers.10." in p or ".layers.11." in p for p in frozen)
  assert image_task.freeze_pattern(0, 0, SMALL) == ""
  with pytest.raises(ValueError, match="freeze_vision_layers"):
    image_task.freeze_pattern(0, 4, SMALL)


def test_freeze_counts_and_a_hand_written_regex_do_not_mix():
  config = ml_collections.ConfigDict({"freeze": ""})
  pattern = image_task.freeze_pattern(1, 1, SMALL)
  image_task._apply_freeze(config, pattern)
  assert config.freeze == pattern
  image_task._apply_freeze(config, pattern)  # A rebuilt task (load_trained): unchanged.
  assert config.freeze == pattern
  config.freeze = "logit_scale"
  image_task._apply_freeze(config, "")  # No counts: the hand-written regex stays.
  assert config.freeze == "logit_scale"
  with pytest.raises(ValueError, match="config.freeze is set"):
    image_task._apply_freeze(config, pattern)


def _clip_folder(path, eos_token_id: int) -> str:
  """A one-block CLIP saved as an HF folder, with a WordPiece tokenizer beside it."""
  from mocheg_jax.data import tokenizers
  from mocheg_jax.models.hf import clip as hf_clip
  folder = str(path)
  tokenizer = tokenizers.train_wordpiece(["a red flag", "three bridges"] * 5, folder,
                                         vocab_size=60)
  text = dict(SMALL.text.__dict__, vocab_size=len(tokenizer), eos_token_id=eos_token_id,
              num_hidden_layers=1)
  vision = dict(SMALL.vision.__dict__, num_hidden_layers=1)
  config = clip.CLIPConfig(text=clip.CLIPTextConfig(**text),
                           vision=clip.CLIPVisionConfig(**vision), projection_dim=4)
  # Random values poured into the abstract model: no per-op init programs to compile.
  graphdef, params, rest = nnx.split(
      nnx.eval_shape(lambda: clip.CLIPModel(config, rngs=nnx.Rngs(0))), nnx.Param, ...)
  rng = np.random.default_rng(0)
  values = jax.tree.map(lambda s: rng.normal(0.0, 0.1, s.shape).astype(s.dtype),
                        params.to_pure_dict())
  values["logit_scale"] = np.asarray(4.6, np.float32)
  nnx.replace_by_pure_dict(params, values)
  hf_clip.save(nnx.merge(graphdef, params, rest), folder)
  return folder


def test_a_local_hf_folder_is_the_starting_point(tmp_path):
  m, r = image_task.model_config(), image_task.retrieval_config()
  m.init = _clip_folder(tmp_path / "good", eos_token_id=3)  # [SEP] ends every text.
  source = image_task.clip_source(m, r, "unused", jnp.float32)
  assert source.tokenizer_dir == m.init and source.config.text.eos_token_id == 3
  weights = source.weights()
  assert weights["vision_model"]["class_embedding"].shape == (8,)
  np.testing.assert_allclose(float(weights["logit_scale"]), np.log(20.0), rtol=1e-6)
  r.learnable_scale = True  # CLIP's own scale: the checkpoint's value is kept.
  np.testing.assert_allclose(float(image_task.clip_source(m, r, "", jnp.float32).weights()[
      "logit_scale"]), 4.6, rtol=1e-6)

  bad = tmp_path / "bad"
  shutil.copytree(m.init, bad)
  config = json.loads((bad / "config.json").read_text())
  config["text_config"]["eos_token_id"] = 4  # Would pool [MASK], which texts never hold.
  (bad / "config.json").write_text(json.dumps(config))
  m.init = str(bad)
  with pytest.raises(image_task.MochegInputError, match="pools token id 4"):
    image_task.clip_source(m, r, "unused", jnp.float32)
  m.init = str(tmp_path / "missing")
  with pytest.raises(image_task.MochegInputError, match="does not exist"):
    image_task.clip_source(m, r, "unused", jnp.float32)


def _masked_nce(q: np.ndarray, d: np.ndarray, keys: np.ndarray, scale: float) -> float:
  """Cross-entropy by hand: row i against the documents of other keys and its own."""
  q = q / np.linalg.norm(q, axis=1, keepdims=True)
  d = d / np.linalg.norm(d, axis=1, keepdims=True)
  logits = scale * q @ d.T
  losses = []
  for i in range(len(q)):
    allowed = [j for j in range(len(d)) if j == i or keys[j] != keys[i]]
    row = logits[i, allowed]
    losses.append(np.log(np.exp(row - row.max()).sum()) + row.max() - logits[i, i])
  return float(np.mean(losses))


def test_loss_ignores_a_second_copy_of_the_same_claim():
  rng = np.random.default_rng(0)
  text = rng.normal(size=(4, 8)).astype(np.float32)
  images = rng.normal(size=(4, 8)).astype(np.float32)
  images[2] = text[0]  # Claim 7's second image matches its text best of all.
  keys = np.array([7, 3, 7, 5], np.int32)
  loss, _ = image_task.retrieval_loss(jnp.asarray(text), jnp.asarray(images),
                                      jnp.asarray(keys), 20.0)
  np.testing.assert_allclose(float(loss), _masked_nce(text, images, keys, 20.0), rtol=1e-5)
  unmasked, _ = image_task.retrieval_loss(jnp.asarray(text), jnp.asarray(images),
                                          jnp.arange(4), 20.0)
  assert float(unmasked) > float(loss) + 1.0  # The copy would have been a strong negative.
  both, _ = image_task.retrieval_loss(jnp.asarray(text), jnp.asarray(images),
                                      jnp.asarray(keys), 20.0, symmetric=True)
  want = (_masked_nce(text, images, keys, 20.0) + _masked_nce(images, text, keys, 20.0)) / 2
  np.testing.assert_allclose(float(both), want, rtol=1e-5)


def _chance_recall(corpus: image_task.DevCorpus, k: int = 10) -> float:
  """Expected recall@k of a random ranking: k * |relevant in the corpus| / N / |relevant|."""
  names = set(corpus.image_names)
  values = []
  for key in corpus.query_keys:
    relevant = [n for n, rel in corpus.qrels[key].items() if rel > 0]
    values.append(k * sum(n in names for n in relevant) / len(names) / len(relevant))
  return float(np.mean(values))


def test_tiny_clip_trains_end_to_end(tmp_path):
  """The tiny variant through the shared trainer: data, pooling, loss, checkpoint, restore.

  The tiny world has 46 training claims with image evidence, too few for a random CLIP to
  generalise to new claims (dev ranks stay near random; the `small` variant is where that is
  measured), so the learning check is on the training claims: a broken pooling token,
  label or mask would keep them at chance, as they are before training.
  """
  from mocheg_jax.train import loop
  from mocheg_jax.train import restore

  workdir = str(tmp_path)
  config = _get_config("tiny")
  config.total_steps = 60
  config.eval_every = 0
  config.checkpoint_every = 60
  config.retrieval.eval_max_corpus = 200  # Gold images + random others: quicker to encode.
  config.async_checkpoints = False
  task = image_task.make_task(config, workdir)
  data = os.path.join(workdir, "data")
  release = os.path.join(data, "release")
  seen = image_task.dev_evaluator(release, task.inference, config.retrieval.eval_max_corpus,
                                  config.seed, split="train")
  before = dict(seen(task.model(), 0))

  result = loop.train(config, workdir, log=lambda _: None)
  assert result.status == "finished"
  dev = {k: v for k, v in result.metrics.items() if k.startswith("dev/")}
  assert set(dev) >= {"dev/recall@5", "dev/recall@10", "dev/ndcg@10", "dev/mrr@10"}
  assert all(0.0 <= v <= 1.0 for v in dev.values())

  trained = restore.load_trained(workdir, "latest")
  after = dict(seen(trained.model, 0))
  chance = _chance_recall(image_task.dev_corpus(release, config.retrieval.eval_max_corpus,
                                                config.seed, split="train"))
  print(f"chance {chance:.3f} before {before} after {after}")
  assert before["recall@10"] < 3 * chance + 0.05
  assert after["recall@10"] > max(10 * chance, before["recall@10"] + 0.3), (before, after)
