"""A small task of the tests' own for the trainer: a 2-layer BERT classifying token rows.

The label is the first token mod 3 (what the pooled [CLS] position sees), so the loss falls
within a few dozen steps. Knobs in `config.toy`: dropout, a per-batch sleep (to give a kill
signal time to land), a step from which the loss becomes NaN, and an input file.
"""

from __future__ import annotations

import time

import grain
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from flax import nnx

from mocheg_jax.models import bert
from mocheg_jax.parallel import distributed
from mocheg_jax.train import config as config_lib
from mocheg_jax.train.task import Evaluator, Task

VOCAB, LENGTH, EXAMPLES = 64, 12, 512


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  del arg
  c = config_lib.base_config()
  c.task = "tests.toy_task:make_task"
  c.total_steps = 20
  c.batch_size = 16
  c.log_every = 1
  c.checkpoint_every = 10
  c.async_checkpoints = False
  c.optimizer.learning_rate = 3e-3
  c.optimizer.warmup_steps = 2
  c.toy = ml_collections.ConfigDict()
  c.toy.dropout = 0.0
  c.toy.sleep_s = 0.0
  c.toy.nan_from_batch = -1  # Global batch index from which the loss is NaN (-1: never).
  c.toy.dev_scores = ""  # Comma-separated "dev/score" per step (1-based), for early stopping.
  c.toy.input_file = ""  # A data file named by path only (train/inputs.py); not read.
  return c


def input_files(config: ml_collections.ConfigDict) -> list[str]:
  return [config.toy.input_file] if config.toy.input_file else []


def example(index: int) -> dict[str, np.ndarray]:
  rng = np.random.default_rng(index)
  ids = rng.integers(1, VOCAB, LENGTH).astype(np.int32)
  length = int(rng.integers(LENGTH // 2, LENGTH + 1))
  mask = (np.arange(LENGTH) < length).astype(np.int32)
  return {"input_ids": ids * mask, "attention_mask": mask,
          "label": np.int32(ids[0] % 3), "index": np.int32(index)}


class _Poison:
  """Adds `scale` to each batch: 1.0, or NaN from a given batch on."""

  def __init__(self, config):
    self.config = config

  def __call__(self, index: int, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    nan = 0 <= self.config.toy.nan_from_batch <= index
    batch["scale"] = np.full(batch["label"].shape, np.nan if nan else 1.0, np.float32)
    return batch


class _Slow:
  """Sleeps before each batch (in the consumer: grain prefetches, so sleeping in a map would
  not slow the loop), keeping the iterator's state interface."""

  def __init__(self, iterator, seconds: float):
    self._iterator, self._seconds = iterator, seconds

  def __iter__(self):
    return self

  def __next__(self):
    time.sleep(self._seconds)
    return next(self._iterator)

  def get_state(self):
    return self._iterator.get_state()

  def set_state(self, state):
    self._iterator.set_state(state)


def make_task(config: ml_collections.ConfigDict, workdir: str) -> Task:
  del workdir
  model_config = bert.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                                 num_attention_heads=4, intermediate_size=64,
                                 max_position_embeddings=LENGTH,
                                 hidden_dropout_prob=config.toy.dropout,
                                 attention_probs_dropout_prob=config.toy.dropout)

  def model():
    return bert.SequenceClassifier(model_config, 3, rngs=nnx.Rngs(config.seed))

  def loss(model, batch):
    logits = model(batch["input_ids"], batch["attention_mask"], deterministic=False)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"])
    accuracy = jnp.mean(jnp.argmax(logits, -1) == batch["label"])
    return jnp.mean(ce * batch["scale"]), {"accuracy": accuracy}

  def train_data(local_batch: int):
    # Every process batches the same global stream and keeps its own rows, so a run gives
    # the same global batches whatever the number of processes.
    first = jax.process_index() * local_batch
    ds = (grain.MapDataset.range(EXAMPLES).seed(config.seed).shuffle().repeat(None)
          .map(example).batch(config.batch_size, drop_remainder=True)
          .map(lambda b: {k: v[first:first + local_batch] for k, v in b.items()}))
    ds = ds.map_with_index(_Poison(config))
    return _Slow(iter(ds.to_iter_dataset()), config.toy.sleep_s)

  eval_batch = {k: np.stack([example(EXAMPLES + i)[k] for i in range(64)])
                for k in ("input_ids", "attention_mask", "label")}

  @nnx.jit
  def predict(model, input_ids, attention_mask):
    return jnp.argmax(model(input_ids, attention_mask), -1)

  def accuracy(model, step):
    predicted = predict(model, eval_batch["input_ids"], eval_batch["attention_mask"])
    yield "accuracy", float(np.mean(distributed.to_host(predicted) == eval_batch["label"]))
    if config.toy.dev_scores:
      yield "score", float(config.toy.dev_scores.split(",")[step - 1])

  return Task(model=model, loss=loss,
              batch_axes={"input_ids": ("batch", "length"),
                          "attention_mask": ("batch", "length"),
                          "label": ("batch",), "scale": ("batch",)},
              train_data=train_data, evaluators=(Evaluator("dev", accuracy),))
