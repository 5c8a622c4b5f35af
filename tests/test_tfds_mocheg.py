import sys

import pytest

from mocheg_jax.data import tfds_mocheg
from tests.release_fixture import write_release


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
  root = tmp_path_factory.mktemp("release")
  write_release(str(root))
  data_dir = tmp_path_factory.mktemp("tfds")
  return tfds_mocheg.build(str(root), str(data_dir)), str(root), str(data_dir)


def _text(value):
  return value.decode() if isinstance(value, bytes) else value


def test_builds_without_tensorflow(prepared):
  assert "tensorflow" not in sys.modules
  built, _, _ = prepared
  assert {n: {s: i.num_examples for s, i in p.builder.info.splits.items()}
          for n, p in built.items()} == {
              "claims": {"train": 3, "val": 1, "test": 1},
              "kb_sentences": {"kb": 7},
              "kb_images": {"kb": 2}}


def test_claim_records(prepared):
  built, root, _ = prepared
  train = built["claims"].builder.as_data_source()["train"]
  records = {int(r["claim_id"]): r for r in (train[i] for i in range(len(train)))}
  one, two = records[1], records[2]
  assert [_text(t) for t in one["relevant_sentences"]] == ["It has three arches.",
                                                           "Built in 1901."]
  assert [_text(t) for t in one["relevant_sentence_ids"]] == ["1-7-1", "1-7-2"]
  # Hard negatives: own-article sentences outside the qrels.
  assert [_text(t) for t in one["negative_sentences"]] == ["Dr. Venn opened it."]
  assert [_text(t) for t in two["relevant_sentence_ids"]] == ["2-8-0"]  # RELEVANCY 0 excluded
  with open(f"{root}/train/images/00002-proof-01-bridge.jpg", "rb") as f:
    assert two["proof_image_bytes"][0] == f.read()
  assert len(two["relevant_image_bytes"]) == 1
  assert int(two["label"]) == 0
  assert _text(two["explanation"]).startswith("The photograph shows")


def test_kb_configs_and_skip_report(prepared):
  built, _, _ = prepared
  images = built["kb_images"].builder.as_data_source()["kb"]
  assert sorted(_text(images[i]["name"]) for i in range(len(images))) == [
      "00001-00007-03-photo.jpg", "00002-00008-01-bridge.jpg"]
  sentences = built["kb_sentences"].builder.as_data_source()["kb"]
  assert _text(sentences[0]["corpus_id"]) == "1-7-0"
  assert "skipped 3 records" in built["kb_images"].skipped  # logo, small, unreadable
  report = open(tfds_mocheg.skipped_report_path(built["kb_images"].builder)).read()
  assert "name contains 'logo'" in report


def test_rebuild_reuses_prepared_data(prepared):
  _, root, data_dir = prepared
  again = tfds_mocheg.build(root, data_dir, ("claims",))
  assert again["claims"].skipped == ""
  assert again["claims"].builder.info.splits["train"].num_examples == 3


def test_large_splits_spill_to_local_files_without_tensorflow(tmp_path, monkeypatch, prepared):
  # TFDS spills splits over 1 GB to bucket files through tf.io.gfile; force that path.
  from tensorflow_datasets.core import shuffle
  monkeypatch.setattr(shuffle, "MAX_MEM_BUFFER_SIZE", 64)
  built, root, _ = prepared
  spilled = tfds_mocheg.build(root, str(tmp_path), ("kb_sentences",))
  assert "tensorflow" not in sys.modules
  ours = spilled["kb_sentences"].builder.as_data_source()["kb"]
  reference = built["kb_sentences"].builder.as_data_source()["kb"]
  assert [_text(ours[i]["corpus_id"]) for i in range(len(ours))] == [
      _text(reference[i]["corpus_id"]) for i in range(len(reference))]
