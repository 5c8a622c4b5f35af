"""InfoNCE against sentence-transformers' MultipleNegativesRankingLoss (the reference's loss)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mocheg_jax.retrieval import contrastive

B, D = 6, 16


@pytest.fixture
def embeddings():
  rng = np.random.default_rng(0)
  return [rng.normal(size=(B, D)).astype(np.float32) for _ in range(3)]


def reference_loss(embeddings, scale):
  import torch
  from sentence_transformers.losses import MultipleNegativesRankingLoss
  loss = MultipleNegativesRankingLoss(model=None, scale=scale)
  tensors = [torch.from_numpy(e) for e in embeddings]
  return float(loss.compute_loss_from_embeddings(tensors, torch.arange(B)))


@pytest.mark.parametrize("with_negatives", [False, True])
def test_info_nce_matches_sentence_transformers(embeddings, with_negatives, one_torch_thread):
  """float32, 1e-5 relative: the same cosine x scale cross-entropy over [positives; negatives]."""
  queries, positives, negatives = embeddings
  docs = np.concatenate([positives, negatives]) if with_negatives else positives
  ours, _ = contrastive.info_nce(jnp.asarray(queries), jnp.asarray(docs), 20.0)
  want = reference_loss(embeddings if with_negatives else embeddings[:2], 20.0)
  np.testing.assert_allclose(float(ours), want, rtol=1e-5)


def test_masked_documents_do_not_count(embeddings):
  queries, positives, negatives = embeddings
  docs = jnp.concatenate([positives, negatives])
  mask = jnp.concatenate([jnp.ones(B, bool), jnp.zeros(B, bool)])  # No hard negatives present.
  masked, _ = contrastive.info_nce(queries, docs, 20.0, doc_mask=mask)
  plain, _ = contrastive.info_nce(queries, positives, 20.0)
  np.testing.assert_allclose(float(masked), float(plain), rtol=1e-6)


def test_same_claim_twice_is_not_its_own_negative():
  keys = jnp.asarray([7, 3, 7])
  mask = contrastive.same_key_mask(keys, keys, jnp.arange(3))
  np.testing.assert_array_equal(np.asarray(mask), [[1, 1, 0], [1, 1, 1], [0, 1, 1]])


def test_learnable_scale_is_clamped_like_clip():
  scale = contrastive.LogitScale(20.0, learnable=True)
  np.testing.assert_allclose(float(scale()), 20.0, rtol=1e-6)
  scale.log_scale.set_value(jnp.asarray(10.0))
  np.testing.assert_allclose(float(scale()), 100.0, rtol=1e-6)
  assert float(contrastive.LogitScale(20.0, learnable=False)()) == 20.0
  grad = jax.grad(lambda s: contrastive.info_nce(jnp.eye(3), jnp.eye(3), jnp.exp(s))[0])(1.0)
  assert grad < 0  # A larger scale sharpens correct matches: the loss falls.
