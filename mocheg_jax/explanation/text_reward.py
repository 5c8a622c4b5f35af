"""The reference's reward path, as an option: the classifier reads re-tokenised text.

The reference decodes every sample to text and tokenises it again for its BERT classifier
(bert-base-uncased: another vocabulary than BART's). Here that decode + re-tokenise step is a
`jax.pure_callback` inside the jitted train step, the step's only host round trip; the
classifier itself still runs compiled, on the re-tokenised ids, with its parameters passed to
the step like the default reward model's.

The default path (`config.explain.reward_input="ids"`) needs no round trip at all: a
classifier trained on the generator's own tokenizer reads the sampled ids directly. This one
(`"text"`) takes any trained classifier, whatever its tokenizer, at the cost of a device ->
host -> device copy of every sample and the host's tokenisation time per step. In a sharded
step the callback sees the whole (global) batch in one process, so it is a single-host
option; multi-host runs use the default path.
"""

from __future__ import annotations

from typing import Callable

import jax
import numpy as np

from mocheg_jax.explanation import classifier as classifier_lib
from mocheg_jax.explanation.classifier_task import TrainedClassifier
from mocheg_jax.explanation.reinforce import RewardModel

Retokenize = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


def retokenizer(generator_tokenizer, classifier: TrainedClassifier, length: int) -> Retokenize:
  """Host function: generator ids [B, T] + mask -> the classifier's (ids, mask) [B, length].

  Each row's kept ids are decoded without special tokens (as the reference decodes its
  samples) and encoded the way the classifier reads text at inference
  (`ClassifierInference.encode`: its special tokens, its truncation side), padded to the
  fixed `length` a callback's result shape needs.
  """
  def retokenize(ids: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ids, mask = np.asarray(ids), np.asarray(mask).astype(bool)
    texts = generator_tokenizer.batch_decode([row[keep] for row, keep in zip(ids, mask)],
                                             skip_special_tokens=True)
    new_ids, new_mask, _ = classifier.inference.encode(texts, length)
    return new_ids, new_mask  # int32 [B, length], as the callback declares.

  return retokenize


def text_reward_model(classifier: TrainedClassifier, generator_tokenizer) -> RewardModel:
  """A RewardModel whose classifier reads the decoded text of the generator's ids.

  The classifier's input length is its own `max_len` (capped by its positions): the sample
  is cut the way the classifier cuts long texts, never rejected for being long.
  """
  length = min(classifier.inference.max_len, classifier.model.config.max_positions)
  host = retokenizer(generator_tokenizer, classifier, length)

  def probabilities(model: classifier_lib.TruthfulnessClassifier, ids: jax.Array,
                    mask: jax.Array) -> jax.Array:
    shape = jax.ShapeDtypeStruct((ids.shape[0], length), np.int32)
    new_ids, new_mask = jax.pure_callback(host, (shape, shape), ids, mask,
                                          vmap_method="sequential")
    return classifier_lib.label_probabilities(model, new_ids, new_mask)

  return RewardModel.from_module(classifier.model, probabilities)
