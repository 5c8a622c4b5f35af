"""The on-disk embedding index: shards, resumption, reading back, and clear errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mocheg_jax.data.report import MochegInputError
from mocheg_jax.retrieval import index as index_lib
from mocheg_jax.utils import paths

ENCODER = {"model": "minilm", "checkpoint": "/work/ckpt", "step": 100}
DIM = 8


def _rows(n: int, seed: int = 0) -> np.ndarray:
  x = np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)
  return x / np.linalg.norm(x, axis=1, keepdims=True)


def _ids(n: int) -> list[str]:
  return [f"{i}-{i % 7}-{i % 3}" for i in range(n)]


def _write(path, n=23, shard_size=7, adds=(5, 9, 9), **kwargs):
  rows, ids = _rows(n), _ids(n)
  writer = index_lib.IndexWriter(path, "text", DIM, ENCODER, shard_size=shard_size, **kwargs)
  at = 0
  for size in adds:
    writer.add(ids[at:at + size], rows[at:at + size])
    at += size
  return writer, rows, ids


def test_round_trip_in_shards(tmp_path):
  writer, rows, ids = _write(tmp_path)
  manifest = writer.close()
  assert manifest.num_items == 23 and manifest.shard_size == 7
  assert manifest.shards == [index_lib.shard_name(i) for i in range(4)]
  assert (manifest.kind, manifest.dim, manifest.dtype, manifest.normalized) == (
      "text", DIM, "float32", True)
  assert not list(tmp_path.glob("*.tmp"))

  index = index_lib.EmbeddingIndex.open(tmp_path, expect_encoder=dict(ENCODER),
                                        expect_dim=DIM)
  assert index.ids == ids and len(index) == 23 and index.dim == DIM
  assert index.manifest == manifest
  np.testing.assert_array_equal(index.embeddings(), rows)
  inside = index.embeddings(8, 12)  # Inside shard 1: a memory map, not a copy.
  assert isinstance(inside, np.memmap)
  np.testing.assert_array_equal(inside, rows[8:12])
  np.testing.assert_array_equal(index.embeddings(5, 16), rows[5:16])  # Across 3 shards.
  np.testing.assert_array_equal(index.read(3, 22), rows[3:22])
  chunks = list(index.chunks(10))
  assert [start for start, _ in chunks] == [0, 10, 20]
  np.testing.assert_array_equal(np.concatenate([c for _, c in chunks]), rows)
  with pytest.raises(IndexError):
    index.embeddings(20, 24)


def test_float16_storage(tmp_path):
  writer, rows, _ = _write(tmp_path, dtype="float16")
  writer.close()
  index = index_lib.EmbeddingIndex.open(tmp_path)
  assert index.dtype == np.float16 and index.read(0, 23).dtype == np.float16
  np.testing.assert_allclose(index.read(0, 23).astype(np.float32), rows, atol=1e-3)


def test_resume_after_a_crash_encodes_only_the_rest(tmp_path):
  rows, ids = _rows(23), _ids(23)
  writer = index_lib.IndexWriter(tmp_path, "text", DIM, ENCODER, shard_size=7)
  writer.add(ids[:17], rows[:17])  # Two full shards on disk, 3 rows only in memory.
  del writer  # The run dies without close().
  (tmp_path / "shard-00002.npy.tmp").write_bytes(b"half a file")

  calls = []

  def encode(batch):
    calls.append(list(batch))
    return rows[batch.start:batch.stop]

  manifest = index_lib.encode_to_index(tmp_path, ids, encode, kind="text", dim=DIM,
                                       encoder=ENCODER, batch_size=4, shard_size=7,
                                       progress=False)
  assert calls[0][0] == 14 and sum(map(len, calls)) == 9  # Rows 14..22 only.
  assert manifest.num_items == 23 and not list(tmp_path.glob("*.tmp"))
  index = index_lib.EmbeddingIndex.open(tmp_path)
  assert index.ids == ids
  np.testing.assert_array_equal(index.read(0, 23), rows)

  calls.clear()  # A finished index: nothing to do, same manifest.
  again = index_lib.encode_to_index(tmp_path, ids, encode, kind="text", dim=DIM,
                                    encoder=ENCODER, shard_size=7, progress=False)
  assert calls == [] and again == manifest


def test_appending_to_a_finished_index_rewrites_its_last_shard(tmp_path):
  rows, ids = _rows(30), _ids(30)
  index_lib.encode_to_index(tmp_path, ids[:10], lambda r: rows[r.start:r.stop], kind="text",
                            dim=DIM, encoder=ENCODER, shard_size=7, progress=False)
  manifest = index_lib.encode_to_index(tmp_path, ids, lambda r: rows[r.start:r.stop],
                                       kind="text", dim=DIM, encoder=ENCODER, shard_size=7,
                                       progress=False)
  assert manifest.num_items == 30 and len(manifest.shards) == 5
  np.testing.assert_array_equal(index_lib.EmbeddingIndex.open(tmp_path).read(0, 30), rows)


@pytest.mark.parametrize("change, field", [
    (dict(encoder={**ENCODER, "step": 200}), "encoder"),
    (dict(dim=16), "dim"),
    (dict(shard_size=8), "shard_size"),
    (dict(kind="image"), "kind"),
])
def test_a_different_header_is_refused(tmp_path, change, field):
  _write(tmp_path)  # Not closed: an interrupted run.
  args = dict(kind="text", dim=DIM, encoder=ENCODER, shard_size=7) | change
  with pytest.raises(MochegInputError, match=rf"header.json.*{field}="):
    index_lib.IndexWriter(tmp_path, **args)


def test_resuming_with_other_ids_is_refused(tmp_path):
  _write(tmp_path)
  ids = _ids(23)
  ids[3] = "other"
  with pytest.raises(MochegInputError, match=r"row 3: '3-3-0' there, 'other' in this run"):
    index_lib.encode_to_index(tmp_path, ids, lambda r: _rows(23)[r.start:r.stop],
                              kind="text", dim=DIM, encoder=ENCODER, shard_size=7,
                              progress=False)


def test_bad_rows_are_refused_naming_the_id(tmp_path):
  writer = index_lib.IndexWriter(tmp_path, "image", DIM, ENCODER, shard_size=4)
  rows = _rows(3)
  writer.add(["a.jpg", "b.jpg"], rows[:2])
  with pytest.raises(MochegInputError, match=r"duplicate id 'a.jpg' \(rows 0 and 3\)"):
    writer.add(["c.jpg", "a.jpg"], rows[:2])
  assert writer.done_items() == 2  # A refused batch leaves nothing behind.
  with pytest.raises(MochegInputError, match=r"'c.jpg' has norm 2.0000"):
    writer.add(["c.jpg"], 2 * rows[2:])
  bad = rows[2:].copy()
  bad[0, 1] = np.nan
  with pytest.raises(MochegInputError, match=r"'c.jpg' is not finite"):
    writer.add(["c.jpg"], bad)
  with pytest.raises(MochegInputError, match=r"expected \(2, 8\)"):
    writer.add(["c.jpg", "d.jpg"], rows[:1])
  with pytest.raises(MochegInputError, match=r"not a non-empty string"):
    writer.add([""], rows[:1])
  writer.add(["c.jpg"], rows[2:])
  assert writer.close().num_items == 3


def _finished(tmp_path):
  writer, _, _ = _write(tmp_path)
  writer.close()
  return tmp_path


def test_open_errors_name_the_file(tmp_path):
  with pytest.raises(MochegInputError, match=r"manifest.json: missing; not an index folder"):
    index_lib.EmbeddingIndex.open(tmp_path)
  _write(tmp_path)  # Unfinished.
  with pytest.raises(MochegInputError, match=r"manifest.json: missing; the index was not "
                     "finished"):
    index_lib.EmbeddingIndex.open(tmp_path)


def test_open_refuses_another_encoder_or_dim(tmp_path):
  _finished(tmp_path)
  with pytest.raises(MochegInputError, match=r"built by another encoder \(\{.*'step': 100\}\); "
                     r"this search encodes with \{.*'step': 5\}"):
    index_lib.EmbeddingIndex.open(tmp_path, expect_encoder={**ENCODER, "step": 5})
  with pytest.raises(MochegInputError, match=r"holds 8-d embeddings, but the encoder gives "
                     "384-d"):
    index_lib.EmbeddingIndex.open(tmp_path, expect_dim=384)


def test_an_index_moved_with_its_encoders_folder_opens(tmp_path):
  """A pipeline folder copied elsewhere: the index names its encoder's old workdir."""
  import shutil

  old, new = tmp_path / "cluster" / "run", tmp_path / "home" / "run"
  encoder = {"workdir": str(old / "stages" / "retrieval_text"), "step": 100, "task": "t"}
  rows, ids = _rows(9), _ids(9)
  with index_lib.IndexWriter(old / "index" / "text", "text", DIM, encoder) as writer:
    writer.add(ids, rows)
  shutil.copytree(old, new)
  shutil.rmtree(old)
  now = {**encoder, "workdir": str(new / "stages" / "retrieval_text")}
  moved = (str(old), str(new))
  index = index_lib.EmbeddingIndex.open(new / "index" / "text", expect_encoder=now,
                                        moved=moved)
  assert index.ids == ids
  np.testing.assert_array_equal(index.embeddings(), rows)
  # Expecting the old name (a fingerprint read from a moved config) matches as well.
  index_lib.EmbeddingIndex.open(new / "index" / "text", expect_encoder=encoder, moved=moved)
  with pytest.raises(MochegInputError, match="built by another encoder"):  # Not told.
    index_lib.EmbeddingIndex.open(new / "index" / "text", expect_encoder=now)
  with pytest.raises(MochegInputError, match="built by another encoder"):  # Another step.
    index_lib.EmbeddingIndex.open(new / "index" / "text", expect_encoder={**now, "step": 5},
                                  moved=moved)
  elsewhere = {**now, "workdir": str(tmp_path / "other" / "stages" / "retrieval_text")}
  with pytest.raises(MochegInputError, match="built by another encoder"):
    index_lib.EmbeddingIndex.open(new / "index" / "text", expect_encoder=elsewhere,
                                  moved=moved)
  # The main job rerun in the moved folder resumes the writer there with today's encoder.
  with pytest.raises(MochegInputError, match="encoder"):
    index_lib.IndexWriter(new / "index" / "text", "text", DIM, now)
  with paths.moved_folder(moved):
    with index_lib.IndexWriter(new / "index" / "text", "text", DIM, now) as writer:
      assert writer.ids == ids


def test_open_refuses_a_missing_shard(tmp_path):
  (_finished(tmp_path) / "shard-00002.npy").unlink()
  with pytest.raises(MochegInputError, match=r"shard-00002.npy: missing shard"):
    index_lib.EmbeddingIndex.open(tmp_path)


def test_open_refuses_rows_that_disagree_with_ids(tmp_path):
  path = _finished(tmp_path) / "shard-00001.ids.json"
  path.write_text(json.dumps(_ids(23)[7:13]))
  with pytest.raises(MochegInputError, match=r"shard-00001.npy: 7 rows, but "
                     r"shard-00001.ids.json lists 6 ids"):
    index_lib.EmbeddingIndex.open(tmp_path)


def test_open_refuses_duplicate_ids(tmp_path):
  path = _finished(tmp_path) / "shard-00002.ids.json"
  ids = json.loads(path.read_text())
  ids[4] = "2-2-2"  # Row 2's id, in shard 0.
  path.write_text(json.dumps(ids))
  with pytest.raises(MochegInputError, match=r"shard-00002.ids.json: duplicate id '2-2-2' "
                     r"\(rows 2 and 18\)"):
    index_lib.EmbeddingIndex.open(tmp_path)


def test_open_refuses_a_wrong_item_count_or_shape(tmp_path):
  manifest_path = _finished(tmp_path) / "manifest.json"
  manifest = json.loads(manifest_path.read_text())
  manifest_path.write_text(json.dumps(manifest | {"num_items": 24}))
  with pytest.raises(MochegInputError, match=r"num_items is 24, but the shards hold 23"):
    index_lib.EmbeddingIndex.open(tmp_path)
  manifest_path.write_text(json.dumps(manifest))
  np.save(tmp_path / "shard-00000.npy", np.zeros((7, 4), np.float32))
  with pytest.raises(MochegInputError, match=r"shard-00000.npy: float32 array of shape "
                     r"\(7, 4\); the manifest says float32 rows of width 8"):
    index_lib.EmbeddingIndex.open(tmp_path)


def test_a_truncated_shard_is_reported_on_read(tmp_path):
  path = _finished(tmp_path) / "shard-00003.npy"
  path.write_bytes(path.read_bytes()[:-8])
  index = index_lib.EmbeddingIndex.open(tmp_path)
  with pytest.raises(MochegInputError, match=r"shard-00003.npy: truncated"):
    index.read(0, 23)
