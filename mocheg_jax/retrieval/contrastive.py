"""InfoNCE over the global batch: every query against every document of every device.

Under jit the batch arrays are global (sharded over the mesh), so `queries @ docs.T` is the
full [B, M] similarity matrix and XLA gathers the document embeddings across devices; the
in-batch negatives of a step are the whole global batch, as with one big GPU, whatever
the mesh.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from mocheg_jax.models import bert
from mocheg_jax.models import layers

NEG_INF = -1e9  # Masked logits: finite so an all-masked row cannot produce NaN.
MAX_LOG_SCALE = math.log(100.0)  # CLIP's clamp on a learnable logit scale.


def l2_normalize(x: jax.Array, eps: float = 1e-12) -> jax.Array:
  x = x.astype(jnp.float32)
  return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), eps)


def info_nce(queries: jax.Array, docs: jax.Array, scale: jax.Array | float, *,
             labels: jax.Array | None = None, doc_mask: jax.Array | None = None,
             ) -> tuple[jax.Array, jax.Array]:
  """Mean cross-entropy of scale * cos(query, doc) against each query's positive document.

  Args:
    queries: [B, D] embeddings.
    docs: [M, D] embeddings; by default document i is query i's positive (labels = arange).
    scale: the logit scale (20 in sentence-transformers; 1 / temperature).
    labels: [B] index of each query's positive document.
    doc_mask: [B, M] or [M] booleans, False for documents a query must not be scored
      against (absent hard negatives, another copy of its own positive).

  Returns:
    (loss, accuracy): the mean loss and the fraction of queries whose positive scores highest.
  """
  logits = scale * (l2_normalize(queries) @ l2_normalize(docs).T)  # [B, M]
  logits = layers.constrain(logits, ("batch", None))
  if doc_mask is not None:
    logits = jnp.where(jnp.broadcast_to(doc_mask, logits.shape), logits, NEG_INF)
  if labels is None:
    labels = jnp.arange(queries.shape[0])
  loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  accuracy = jnp.mean(jnp.argmax(logits, axis=-1) == labels)
  return jnp.mean(loss), accuracy


def same_key_mask(query_keys: jax.Array, doc_keys: jax.Array, labels: jax.Array) -> jax.Array:
  """[B, M] False where document j shares query i's key (the same claim drawn twice in a
  batch: its positive is not a negative) unless j is i's own positive."""
  same = query_keys[:, None] == doc_keys[None, :]
  own = jnp.arange(doc_keys.shape[0])[None, :] == labels[:, None]
  return ~same | own


class LogitScale(nnx.Module):
  """The similarity scale: fixed, or learnt as log(scale) (CLIP's parameterisation)."""

  def __init__(self, scale: float, learnable: bool):
    self.learnable = learnable
    value = jnp.asarray(math.log(scale), jnp.float32)
    self.log_scale = nnx.Param(value, out_sharding=()) if learnable else None
    self.fixed = scale

  def __call__(self) -> jax.Array:
    if not self.learnable:
      return jnp.asarray(self.fixed, jnp.float32)
    return jnp.exp(jnp.minimum(self.log_scale[...], MAX_LOG_SCALE))


class TextBiEncoder(nnx.Module):
  """One SBERT encoder for queries and documents, plus the logit scale."""

  def __init__(self, config: bert.BertConfig, *, pooling: str = "mean",
               add_pooler: bool = True, scale: float = 20.0, learnable_scale: bool = False,
               dtype=None, rngs: nnx.Rngs):
    self.encoder = bert.SentenceEncoder(config, pooling=pooling, normalize=False,
                                        add_pooler=add_pooler, dtype=dtype, rngs=rngs)
    self.scale = LogitScale(scale, learnable_scale)

  def __call__(self, ids: jax.Array, mask: jax.Array, *, deterministic: bool = True):
    return self.encoder(ids, mask, deterministic=deterministic)
