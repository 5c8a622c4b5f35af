"""Length-grouped training batches (data/length_groups.py)."""

import numpy as np
import pytest

from mocheg_jax.data import length_groups


def _lengths(n=103, seed=0):
  return np.random.default_rng(seed).integers(5, 90, n)


def test_an_epoch_is_a_random_draw_cut_into_batches_of_neighbours_in_length():
  lengths = _lengths()
  plan = length_groups.LengthGroupedBatches(lengths, batch_size=4, groups=5, seed=1)
  assert plan.batches_per_epoch == 25  # 103 // 4: three examples sit out each epoch.
  epoch = plan.epoch(0)
  assert epoch.shape == (25, 4) and len(np.unique(epoch)) == 100
  # Batches of neighbours in a sorted megabatch of 20 span far less than random fours.
  spans = [(lengths[b].min(), lengths[b].max()) for b in epoch]
  mean_span = np.mean([hi - lo for lo, hi in spans])
  rng = np.random.default_rng(0)
  random_span = np.mean([np.ptp(lengths[rng.choice(103, 4, replace=False)])
                         for _ in range(200)])
  assert mean_span < random_span / 3
  # The batch order is shuffled: not longest first, not the megabatches' order.
  maxima = [lengths[b].max() for b in epoch]
  assert maxima != sorted(maxima, reverse=True)


def test_megabatches_are_sorted_then_cut():
  """With one megabatch per epoch, the batches are the sorted draw cut in order."""
  lengths = _lengths(40)
  plan = length_groups.LengthGroupedBatches(lengths, batch_size=8, groups=5, seed=2)
  batches = sorted(sorted(lengths[b].tolist()) for b in plan.epoch(3))
  ordered = sorted(lengths.tolist())
  assert batches == [ordered[i:i + 8] for i in range(0, 40, 8)]


def test_the_plan_is_a_function_of_seed_and_epoch():
  lengths = _lengths()
  a = length_groups.LengthGroupedBatches(lengths, 4, 5, seed=1)
  b = length_groups.LengthGroupedBatches(lengths, 4, 5, seed=1)
  c = length_groups.LengthGroupedBatches(lengths, 4, 5, seed=2)
  for number in (0, 7, 25, 60, 3):  # Out of order, across epochs, back again.
    np.testing.assert_array_equal(a(number), b(number))
  assert not np.array_equal(a.epoch(0), c.epoch(0))
  assert not np.array_equal(a.epoch(0), a.epoch(1))
  np.testing.assert_array_equal(a(27), a.epoch(1)[2])


def test_the_dataset_is_endless_and_resumes():
  lengths = _lengths(30)
  ds = length_groups.index_batches(lengths, batch_size=4, groups=2, seed=0)
  plan = length_groups.LengthGroupedBatches(lengths, 4, 2, seed=0)
  for number in (0, 6, 7, 50):
    np.testing.assert_array_equal(ds[number], plan(number))
  it = iter(ds.to_iter_dataset())
  for _ in range(5):
    next(it)
  state = it.get_state()
  want = [next(it) for _ in range(9)]  # Across the epoch boundary (7 batches an epoch).
  again = iter(ds.to_iter_dataset())
  again.set_state(state)
  for expected in want:
    np.testing.assert_array_equal(next(again), expected)


def test_bad_plans_are_refused():
  with pytest.raises(ValueError, match="fewer than one batch"):
    length_groups.LengthGroupedBatches(np.ones(3), 4, 1, 0)
  with pytest.raises(ValueError, match="must be positive"):
    length_groups.LengthGroupedBatches(np.ones(8), 4, 0, 0)
  with pytest.raises(ValueError, match="one per example"):
    length_groups.LengthGroupedBatches(np.ones((8, 2)), 4, 1, 0)


@pytest.mark.parametrize("longest,multiple,max_len,want", [
    (41, 8, 64, 48), (48, 8, 64, 48), (63, 16, 64, 64), (70, 16, 64, 64), (0, 8, 64, 8),
    (41, 0, 64, 64)])
def test_padded_length(longest, multiple, max_len, want):
  assert length_groups.padded_length(longest, multiple, max_len) == want


@pytest.mark.parametrize("bad", [-1, True])
def test_the_config_refuses_a_bad_group_count(bad):
  from mocheg_jax.train import config as config_lib

  config = config_lib.base_config()
  config.task = "tests.toy_task:make_task"
  config.data.length_groups = 4
  config_lib.validate(config)
  config.data.length_groups = bad
  with pytest.raises(ValueError, match="config.data.length_groups must be a non-negative"):
    config_lib.validate(config)
