"""A benchmark task for the trainer: a shared-tower SBERT encoder trained with in-batch InfoNCE.

Queries and documents go through the same `bert.SentenceEncoder` (mean pooling); the loss
is the cross-entropy of each query against every document of the global batch, scored by
cosine similarity x `scale` (20, as sentence-transformers' MultipleNegativesRankingLoss),
with the matching document as the target. The token ids are random: the benchmark measures
time, not learning, and a small pool of pre-built batches keeps the input pipeline's cost
near zero so that the trainer's own overhead is what shows.

Model size and lengths come from `config.contrastive` (see `get_config`): "minilm" is the
all-MiniLM-L6-v2 shape, "small" a 2-layer, 64-wide model whose step on 8 fake CPU devices
costs ~0.1 CPU-second (~50 ms on two idle cores): the trainer-overhead benchmark's task.
"""

from __future__ import annotations

import grain
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx

from mocheg_jax.data import pipelines
from mocheg_jax.models import bert
from mocheg_jax.train import config as config_lib
from mocheg_jax.train.task import Task

# Fields of config.contrastive per variant: the BERT shape and the two token lengths.
VARIANTS = {
    "minilm": dict(vocab_size=30522, hidden_size=384, num_hidden_layers=6,
                   num_attention_heads=12, intermediate_size=1536,
                   max_position_embeddings=512, query_length=32, doc_length=64),
    "small": dict(vocab_size=4096, hidden_size=64, num_hidden_layers=2,
                  num_attention_heads=4, intermediate_size=256,
                  max_position_embeddings=128, query_length=16, doc_length=32),
}
BATCH_POOL = 8  # Distinct pre-built batches the input cycles through.


def get_config(arg: str = "minilm") -> ml_collections.ConfigDict:
  """The trainer config of this task; `arg` is a VARIANTS key."""
  if arg not in VARIANTS:
    raise ValueError(f"unknown contrastive variant {arg!r}; expected one of {sorted(VARIANTS)}")
  c = config_lib.base_config()
  c.task = "benchmarks.contrastive_task:make_task"
  c.batch_size = 32
  c.total_steps = 100
  c.log_every = 50
  c.checkpoint_every = 1_000_000  # Checkpoint cost is measured on its own.
  c.optimizer.learning_rate = 2e-5
  c.contrastive = ml_collections.ConfigDict(dict(VARIANTS[arg], scale=20.0, dropout=0.1))
  return c


def _bert_config(c: ml_collections.ConfigDict) -> bert.BertConfig:
  return bert.BertConfig(vocab_size=c.vocab_size, hidden_size=c.hidden_size,
                         num_hidden_layers=c.num_hidden_layers,
                         num_attention_heads=c.num_attention_heads,
                         intermediate_size=c.intermediate_size,
                         max_position_embeddings=c.max_position_embeddings,
                         hidden_dropout_prob=c.dropout, attention_probs_dropout_prob=c.dropout)


def info_nce(queries: jax.Array, docs: jax.Array, scale: float) -> tuple[jax.Array, jax.Array]:
  """(mean loss, in-batch top-1 accuracy) of queries [B, D] against documents [B, D]."""
  q = queries / jnp.maximum(jnp.linalg.norm(queries, axis=-1, keepdims=True), 1e-12)
  d = docs / jnp.maximum(jnp.linalg.norm(docs, axis=-1, keepdims=True), 1e-12)
  logits = scale * q @ d.T  # [B, B]: row i scores query i against every document.
  labels = jnp.arange(q.shape[0])
  loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
  return loss, jnp.mean(jnp.argmax(logits, -1) == labels)


def make_batch(rng: np.random.Generator, rows: int, length: int, vocab: int,
               prefix: str) -> dict[str, np.ndarray]:
  """Random token rows with a [CLS]-like first token and random lengths (right padding)."""
  ids = rng.integers(1000, vocab, (rows, length)).astype(np.int32)
  ids[:, 0] = 101
  lengths = rng.integers(length // 4, length + 1, rows)
  mask = (np.arange(length)[None, :] < lengths[:, None]).astype(np.int32)
  return {f"{prefix}_ids": ids * mask, f"{prefix}_mask": mask}


def make_task(config: ml_collections.ConfigDict, workdir: str) -> Task:
  del workdir
  c = config.contrastive
  model_config = _bert_config(c)

  def model() -> bert.SentenceEncoder:
    return bert.SentenceEncoder(model_config, pooling="mean", add_pooler=False,
                                rngs=nnx.Rngs(config.seed))

  def loss(model, batch):
    q = model(batch["query_ids"], batch["query_mask"], deterministic=False)  # [B, D]
    d = model(batch["doc_ids"], batch["doc_mask"], deterministic=False)  # [B, D]
    value, accuracy = info_nce(q, d, c.scale)
    return value, {"accuracy": accuracy}

  def train_data(local_batch: int):
    rng = np.random.default_rng(config.seed + jax.process_index())
    pool = []
    for _ in range(BATCH_POOL):
      batch = make_batch(rng, local_batch, c.query_length, c.vocab_size, "query")
      batch.update(make_batch(rng, local_batch, c.doc_length, c.vocab_size, "doc"))
      pool.append(batch)
    # A fresh dict per step (as a real pipeline yields); the arrays themselves are shared.
    ds = grain.MapDataset.range(BATCH_POOL).repeat(None).map(lambda i: dict(pool[i]))
    return iter(pipelines.iterate(ds, pipelines.ReadAhead.of(config.data)))

  axes = ("batch", "length")
  return Task(model=model, loss=loss,
              batch_axes={"query_ids": axes, "query_mask": axes, "doc_ids": axes,
                          "doc_mask": axes},
              train_data=train_data)
