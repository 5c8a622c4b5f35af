"""Training batches of examples of similar length (length-grouped sampling).

A batch padded to its longest row costs the model that length for every row. Drawn at
random, a batch of 32 nearly always holds one of the longest examples: the small world's
generator sources and rulings average 143 tokens together, yet random batches pad to 255;
the reranker's claim-sentence pairs average 41 tokens and pad to 56-64 of 64. Grouping
draws each epoch's examples in a fresh random order as usual, cuts that order into
megabatches of `groups` global batches, sorts each megabatch by length and cuts it into
batches, then shuffles the epoch's batches, so neighbours in length share a batch while
which examples meet, and in which order the batches come, stay random (the megabatch
scheme of HF transformers' `group_by_length`, with the batch order shuffled across the
whole epoch rather than kept sorted within each megabatch).

Everything is a function of (seed, epoch), so every process draws the same global batches
and a resumed run the same ones as an uninterrupted run. An epoch is
floor(examples / batch) batches; the examples left over differ by epoch.
"""

from __future__ import annotations

import grain
import numpy as np


class LengthGroupedBatches:
  """Global batch number -> the example indices of that batch (int64 [batch_size])."""

  def __init__(self, lengths: np.ndarray, batch_size: int, groups: int, seed: int):
    self.lengths = np.asarray(lengths, np.int64)
    if self.lengths.ndim != 1:
      raise ValueError(f"lengths must be one per example, got shape {self.lengths.shape}")
    if batch_size < 1 or groups < 1:
      raise ValueError(f"batch_size ({batch_size}) and groups ({groups}) must be positive")
    if len(self.lengths) < batch_size:
      raise ValueError(f"{len(self.lengths)} examples: fewer than one batch of {batch_size}")
    self.batch_size, self.groups, self.seed = batch_size, groups, seed
    self.batches_per_epoch = len(self.lengths) // batch_size
    # The last epochs planned: reader threads ask for neighbouring batch numbers.
    self._recent: dict[int, np.ndarray] = {}

  def epoch(self, epoch: int) -> np.ndarray:
    """[batches_per_epoch, batch_size] example indices of one epoch's batches, in order."""
    batches = self._recent.get(epoch)
    if batches is None:
      batches = self._plan(epoch)
      self._recent = {e: b for e, b in self._recent.items() if e >= epoch - 1}
      self._recent[epoch] = batches
    return batches

  def _plan(self, epoch: int) -> np.ndarray:
    rng = np.random.default_rng([self.seed, epoch])
    order = rng.permutation(len(self.lengths))[:self.batches_per_epoch * self.batch_size]
    mega = self.groups * self.batch_size
    for start in range(0, len(order), mega):
      part = order[start:start + mega]
      # Stable on a random order: equal lengths stay randomly arranged.
      order[start:start + mega] = part[np.argsort(-self.lengths[part], kind="stable")]
    batches = order.reshape(self.batches_per_epoch, self.batch_size)
    return batches[rng.permutation(self.batches_per_epoch)]

  def __call__(self, batch_number: int) -> np.ndarray:
    epoch, k = divmod(int(batch_number), self.batches_per_epoch)
    return self.epoch(epoch)[k]


def index_batches(lengths: np.ndarray, batch_size: int, groups: int, seed: int
                  ) -> grain.MapDataset:
  """An endless MapDataset of global batches of example indices, grouped by length."""
  plan = LengthGroupedBatches(lengths, batch_size, groups, seed)
  return (grain.MapDataset.range(plan.batches_per_epoch).repeat(None)
          .map_with_index(lambda number, _: plan(number)))


def padded_length(longest: int, multiple: int, max_len: int) -> int:
  """The width a batch whose longest row has `longest` tokens is padded to: the next
  multiple of `multiple` (at least one), at most `max_len`; `multiple` 0: `max_len`."""
  if multiple <= 0:
    return max_len
  return min(max_len, max(1, -(-int(longest) // multiple)) * multiple)
