import threading
import time

import grain
import numpy as np
import pytest

from mocheg_jax.data import pipelines, tfds_mocheg, tokenizers
from mocheg_jax.data.mocheg import MochegRelease
from tests.release_fixture import write_release


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  root = tmp_path_factory.mktemp("release")
  write_release(str(root))
  data_dir = str(tmp_path_factory.mktemp("tfds"))
  tfds_mocheg.build(str(root), data_dir, ("claims",))
  release = MochegRelease(root)
  texts = [c.claim + " " + " ".join(c.evidence) + " " + c.explanation
           for s in ("train", "val", "test") for c in release.claims(s)] * 3
  tok = tmp_path_factory.mktemp("tok")
  wordpiece, bpe = str(tok / "wp"), str(tok / "bpe")
  tokenizers.train_wordpiece(texts, wordpiece, vocab_size=300)
  tokenizers.train_byte_bpe(texts, bpe, vocab_size=400)
  return data_dir, wordpiece, bpe


def _loader(**kw):
  return pipelines.LoaderConfig(**{"batch_size": 2, "seed": 3, "shard_index": 0,
                                   "shard_count": 1, **kw})


def _decode(tokenizer_dir, ids):
  return tokenizers.load_tokenizer(tokenizer_dir).decode(ids, skip_special_tokens=True)


def _batches(pipeline, n):
  it = iter(pipeline)
  return [next(it) for _ in range(n)]


def test_text_retrieval_skips_claims_without_evidence(setup):
  data_dir, wp, _ = setup
  p = pipelines.text_retrieval(data_dir, "train", wp, _loader(), max_query_len=16,
                               max_doc_len=12)
  assert (p.num_records, p.skipped) == (2, 1)  # claim 4 has no relevant sentence
  batch = next(iter(p))
  assert batch["query_ids"].shape == (2, 16) and batch["positive_ids"].shape == (2, 12)
  claims = {1: "the bridge has 3 arches.", 2: "a photo shows the varlen bridge."}
  for i in range(2):
    assert _decode(wp, batch["query_ids"][i]) == claims[int(batch["claim_id"][i])]
  one = [i for i in range(2) if batch["claim_id"][i] == 1][0]
  assert _decode(wp, batch["positive_ids"][one]) in ("it has three arches.", "built in 1901.")
  assert _decode(wp, batch["negative_ids"][one]) == "dr. venn opened it."


def test_text_retrieval_draws_extra_negatives_too(setup):
  data_dir, wp, _ = setup
  extra = {1: ["a post claimed it."], 2: ["the varlen bridge is red."]}
  p = pipelines.text_retrieval(data_dir, "train", wp, _loader(), max_query_len=16,
                               max_doc_len=16, extra_negatives=extra)
  drawn = {1: set(), 2: set()}
  for batch in _batches(p, 16):
    assert batch["has_negative"].all()
    for claim_id, negative in zip(batch["claim_id"], batch["negative_ids"]):
      drawn[int(claim_id)].add(_decode(wp, negative))
  # Each claim's own-article negatives (the dataset's) and its extra one.
  assert drawn == {1: {"dr. venn opened it.", "a post claimed it."},
                   2: {"it is not varlen.", "the varlen bridge is red."}}


def test_image_and_verification_batches(setup):
  data_dir, wp, _ = setup
  img = next(iter(pipelines.image_retrieval(data_dir, "train", wp, _loader(batch_size=1),
                                            image_size=32)))
  assert img["image"].shape == (1, 32, 32, 3) and img["image"].dtype == np.float32
  # The fixture's bridge image is plain (200, 30, 30) red: check the CLIP normalisation.
  red = (200 / 255 - 0.48145466) / 0.26862954
  assert abs(float(img["image"][0, 16, 16, 0]) - red) < 0.05
  p = pipelines.verification(data_dir, "train", wp, _loader(batch_size=3, shuffle=False),
                             max_claim_len=16, max_evidence_len=12, max_text_evidence=3,
                             max_images=2, image_size=32)
  batch = next(iter(p))
  assert batch["evidence_ids"].shape == (3, 3, 12) and batch["images"].shape == (3, 2, 32, 32, 3)
  by_id = {int(c): i for i, c in enumerate(batch["claim_id"])}
  assert batch["evidence_present"][by_id[1]].tolist() == [True, True, False]
  assert batch["evidence_present"][by_id[4]].tolist() == [False, False, False]
  assert batch["image_present"][by_id[2]].tolist() == [True, False]
  assert batch["label"][by_id[2]] == 0 and batch["label"][by_id[4]] == 2


def test_explanation_source_truncation(setup):
  _, _, bpe = setup
  tok = tokenizers.load_tokenizer(bpe)
  evidence = " ".join(["bridge arches"] * 50)
  kept = pipelines.explanation_source_ids(tok, "refuted", "The bridge has 3 arches.",
                                          evidence, max_len=24)
  assert len(kept) == 24 and kept[0] == tok.bos_token_id and kept[-1] == tok.eos_token_id
  assert tok.decode(kept, skip_special_tokens=False).startswith(
      "<s>refuted</s> The bridge has 3 arches.</s> bridge arches")
  left = pipelines.explanation_source_ids(tok, "refuted", "The bridge has 3 arches.",
                                          evidence, max_len=24, left_truncation=True)
  assert len(left) == 24 and "refuted" not in tok.decode(left)
  short = pipelines.explanation_source_ids(tok, "NEI", "Claim.", "Ev.", max_len=64)
  assert tok.decode(short, skip_special_tokens=False) == "<s>NEI</s> Claim.</s> Ev.</s>"


def test_explanation_batch(setup):
  data_dir, _, bpe = setup
  p = pipelines.explanation(data_dir, "train", bpe, _loader(batch_size=3, shuffle=False),
                            max_source_len=40, max_target_len=20)
  batch = next(iter(p))
  assert batch["source_ids"].shape == (3, 40) and batch["target_ids"].shape == (3, 20)
  row = int(np.where(batch["claim_id"] == 1)[0][0])
  assert _decode(bpe, batch["target_ids"][row]) == "The bridge indeed has three arches."


def test_length_buckets_cut_padding_to_the_longest_row():
  buckets = pipelines.LengthBuckets(4, (("a_mask", ("a_ids",)), ("b_mask", ("b_ids",))))
  a_mask = (np.arange(16) < np.array([[3], [5]])).astype(np.int32)
  batch = {"a_ids": np.arange(32).reshape(2, 16) * a_mask, "a_mask": a_mask,
           "b_ids": np.ones((2, 6), np.int32), "b_mask": np.ones((2, 6), np.int32),
           "label": np.array([0, 2])}
  cut = buckets(batch)
  assert cut["a_ids"].shape == cut["a_mask"].shape == (2, 8)  # 5 -> the next multiple of 4.
  np.testing.assert_array_equal(cut["a_ids"], batch["a_ids"][:, :8])
  assert cut["b_ids"].shape == (2, 6)  # 6 -> 8, capped at the padded width.
  np.testing.assert_array_equal(cut["label"], batch["label"])
  assert batch["a_ids"].shape == (2, 16)  # The input batch is left as it was.
  empty = buckets({**batch, "a_mask": np.zeros_like(a_mask)})
  assert empty["a_ids"].shape == (2, 4)
  with pytest.raises(ValueError, match="positive multiple"):
    pipelines.LengthBuckets(0, ())


def test_explanation_batches_in_length_buckets_agree_across_processes(setup):
  data_dir, _, bpe = setup
  make = lambda batch, index, count, multiple: pipelines.explanation(  # noqa: E731
      data_dir, "train", bpe, _loader(batch_size=batch, shard_index=index, shard_count=count),
      max_source_len=64, max_target_len=40, length_multiple=multiple)
  padded, bucketed = _batches(make(2, 0, 1, 0), 6), _batches(make(2, 0, 1, 8), 6)
  halves = [iter(make(1, i, 2, 8)) for i in range(2)]
  for full, cut in zip(padded, bucketed):
    for name in ("source", "target"):
      longest = int(np.max(np.nonzero(full[f"{name}_mask"].any(0))[0])) + 1
      width = cut[f"{name}_ids"].shape[1]
      assert width % 8 == 0 and longest <= width < longest + 8, (name, longest, width)
      # Only padding was cut.
      np.testing.assert_array_equal(cut[f"{name}_ids"], full[f"{name}_ids"][:, :width])
      assert not full[f"{name}_mask"][:, width:].any()
    # Each process's row has the global batch's width, whatever its own row's length.
    parts = [next(h) for h in halves]
    for key, value in cut.items():
      np.testing.assert_array_equal(np.concatenate([p[key] for p in parts]), value, key)


def test_deterministic_and_resumable(setup):
  data_dir, wp, _ = setup
  make = lambda seed=3: pipelines.text_retrieval(  # noqa: E731
      data_dir, "train", wp, _loader(batch_size=1, seed=seed), max_query_len=8, max_doc_len=8)
  first, again = _batches(make(), 6), _batches(make(), 6)
  for a, b in zip(first, again):
    np.testing.assert_array_equal(a["positive_ids"], b["positive_ids"])
  orders = {tuple(int(b["claim_id"][0]) for b in _batches(make(seed), 6)) for seed in range(6)}
  assert len(orders) > 1  # the seed changes the order
  it = iter(make())
  for _ in range(3):
    next(it)
  state = it.get_state()
  tail = [next(it) for _ in range(3)]
  resumed = iter(make())
  resumed.set_state(state)
  for a in tail:
    b = next(resumed)
    np.testing.assert_array_equal(a["claim_id"], b["claim_id"])
    np.testing.assert_array_equal(a["positive_ids"], b["positive_ids"])


def test_process_shards_are_disjoint_and_make_the_one_process_batches(setup):
  data_dir, wp, _ = setup
  ids = []
  for index in range(2):
    p = pipelines.verification(data_dir, "train", wp,
                               _loader(batch_size=1, num_epochs=1, drop_remainder=False,
                                       shard_index=index, shard_count=2),
                               max_claim_len=8, max_evidence_len=8, image_size=8)
    ids.append({int(b["claim_id"][0]) for b in p})
  assert ids[0].isdisjoint(ids[1]) and ids[0] | ids[1] == {1, 2, 4}

  # Forever, shuffled and transformed: process 0's row then process 1's make each global
  # batch of 2 of one process (so training does not depend on the number of processes).
  make = lambda batch, index, count: pipelines.text_retrieval(  # noqa: E731
      data_dir, "train", wp, _loader(batch_size=batch, shard_index=index, shard_count=count),
      max_query_len=8, max_doc_len=8)
  halves = [iter(make(1, i, 2)) for i in range(2)]
  for whole in _batches(make(2, 0, 1), 6):
    parts = [next(h) for h in halves]
    for key, value in whole.items():
      np.testing.assert_array_equal(np.concatenate([p[key] for p in parts]), value, key)


def test_worker_processes_give_the_same_batches(setup):
  data_dir, wp, _ = setup
  make = lambda workers: pipelines.text_retrieval(  # noqa: E731
      data_dir, "train", wp, _loader(batch_size=1, worker_count=workers), max_query_len=8,
      max_doc_len=8)
  for a, b in zip(_batches(make(0), 4), _batches(make(1), 4)):
    np.testing.assert_array_equal(a["positive_ids"], b["positive_ids"])


def test_each_reader_thread_has_its_own_tokenizer(setup):
  # HF fast tokenizers keep truncation/padding state per call; grain reads in threads.
  import threading
  _, wp, _ = setup
  seen = []
  threads = [threading.Thread(target=lambda: seen.append(pipelines._tokenizer(wp)))
             for _ in range(2)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert seen[0] is not seen[1]
  assert pipelines._tokenizer(wp) is pipelines._tokenizer(wp)


class _CountingSource:
  """1000 records that count how many have been read."""

  def __init__(self):
    self.reads = 0
    self._lock = threading.Lock()

  def __len__(self):
    return 1000

  def __getitem__(self, i):
    with self._lock:
      self.reads += 1
    return np.int32(i)


@pytest.mark.parametrize("read_ahead", [pipelines.ReadAhead(), pipelines.ReadAhead(3, 9)])
def test_readers_stay_a_few_batches_ahead(read_ahead):
  source = _CountingSource()
  ds = pipelines.process_batches(grain.MapDataset.source(source).repeat(None), 5, True, 0, 1)
  it = iter(pipelines.iterate(ds, read_ahead))
  first = next(it)
  np.testing.assert_array_equal(first, np.arange(5))
  time.sleep(0.5)  # Time for the readers to run as far ahead as they may.
  # The readers fill the buffer, and each may hold one batch more in flight; grain's defaults
  # (16 threads, 500 elements) read hundreds of batches here.
  assert 5 < source.reads <= 5 * (1 + read_ahead.batches + read_ahead.threads), source.reads
  np.testing.assert_array_equal(next(it), np.arange(5, 10))  # In order, nothing lost.


def test_read_ahead_must_be_positive():
  ds = grain.MapDataset.range(4)
  for bad in (pipelines.ReadAhead(0, 4), pipelines.ReadAhead(2, 0)):
    with pytest.raises(ValueError, match="read-ahead threads and batches must be positive"):
      pipelines.iterate(ds, bad)


def test_training_loaders_read_ahead_as_the_config_says():
  from mocheg_jax.train import config as config_lib

  data = config_lib.base_config().data
  data.read_threads, data.read_ahead_batches, data.workers = 5, 7, 0
  loader = pipelines.LoaderConfig.training(8, 1, data)
  assert (loader.batch_size, loader.seed, loader.worker_count) == (8, 1, 0)
  assert loader.read_ahead == pipelines.ReadAhead(5, 7)


def test_explanation_batches_grouped_by_length(setup):
  data_dir, _, bpe = setup
  make = lambda batch, index, count, groups=2, **kw: pipelines.explanation(  # noqa: E731
      data_dir, "train", bpe, _loader(batch_size=batch, shard_index=index, shard_count=count,
                                      length_groups=groups, **kw),
      max_source_len=64, max_target_len=40, length_multiple=8)
  grouped = make(1, 0, 1, groups=1)
  assert grouped.num_records >= 2
  # One-example batches, one batch a megabatch: each epoch is a fresh shuffle of the claims.
  epochs = [[int(b["claim_id"][0]) for b in _batches(grouped, grouped.num_records)]]
  epochs.append([int(b["claim_id"][0]) for b in _batches(grouped, 2 * grouped.num_records)
                 ][grouped.num_records:])
  assert all(sorted(e) == sorted(epochs[0]) for e in epochs)
  # Two processes with one row each make the one-process batches of two, widths included.
  whole = _batches(make(2, 0, 1), 6)
  halves = [iter(make(1, i, 2)) for i in range(2)]
  for batch in whole:
    parts = [next(h) for h in halves]
    for key, value in batch.items():
      np.testing.assert_array_equal(np.concatenate([p[key] for p in parts]), value, key)
  it = iter(make(2, 0, 1))
  for _ in range(3):
    next(it)
  state = it.get_state()
  tail = [next(it) for _ in range(4)]
  resumed = iter(make(2, 0, 1))
  resumed.set_state(state)
  for batch in tail:
    np.testing.assert_array_equal(next(resumed)["source_ids"], batch["source_ids"])


def test_pipelines_without_lengths_or_not_training_refuse_groups(setup):
  data_dir, wp, bpe = setup
  text = pipelines.text_retrieval(data_dir, "train", wp, _loader(length_groups=2),
                                  max_query_len=8, max_doc_len=8, length_multiple=4)
  assert next(iter(text))["query_ids"].shape[0] == 2  # Text retrieval knows its lengths.
  with pytest.raises(ValueError, match="does not group batches by length"):
    pipelines.verification(data_dir, "train", wp, _loader(length_groups=2), max_claim_len=8,
                           max_evidence_len=8, image_size=8)
  with pytest.raises(ValueError, match="for training"):
    pipelines.explanation(data_dir, "train", bpe, _loader(length_groups=2, num_epochs=1),
                          max_source_len=64, max_target_len=40)
