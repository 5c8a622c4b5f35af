"""Sharded streaming top-k search against a numpy brute force, on 8 fake devices and on 1."""
# pylint: disable=protected-access  (the tests check the two-stage path and the jit cache)

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mocheg_jax.parallel import mesh as mesh_lib
from mocheg_jax.retrieval import index as index_lib
from mocheg_jax.retrieval import search


def _mesh(**sizes):
  config = mesh_lib.default_config()
  for name, value in sizes.items():
    config[name] = value
  devices = jax.devices()[:1] if sizes.get("data") == 1 and len(sizes) == 1 else None
  return mesh_lib.make_mesh(config, devices)


MESHES = {
    "8 devices": lambda: _mesh(),
    "2x2x2": lambda: _mesh(data=2, fsdp=2, tensor=2),
    "1 device": lambda: _mesh(data=1),
}


def _brute_force(queries, corpus, k):
  """Best first; equal scores: lower row first (a stable sort of -score)."""
  scores = queries.astype(np.float64) @ corpus.astype(np.float64).T
  rows = np.argsort(-scores, axis=1, kind="stable")[:, :k]
  return np.take_along_axis(scores, rows, axis=1), rows


def _normal(n, d, seed):
  return np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)


# (corpus rows, k, chunk_size): one chunk; several chunks with a padded last one; k larger
# than a chunk's rows per device and than a whole chunk; k above the corpus size; and
# chunks large enough for the two-stage top-k.
CASES = [(50, 5, 4096), (1000, 7, 256), (300, 40, 64), (30, 50, 16), (20000, 5, 8192)]


@pytest.mark.parametrize("mesh_name, n, k, chunk_size", [
    (mesh_name, *case) for mesh_name in ("8 devices", "1 device") for case in CASES
] + [("2x2x2", 1000, 7, 256)])
def test_matches_brute_force(mesh_name, n, k, chunk_size):
  corpus, queries = _normal(n, 24, 0), _normal(19, 24, 1)
  scores, rows = search.top_k(queries, corpus, k, mesh=MESHES[mesh_name](),
                              chunk_size=chunk_size, query_batch=8)
  want_scores, want_rows = _brute_force(queries, corpus, k)
  assert rows.dtype == np.int64 and rows.shape == (19, min(k, n))
  np.testing.assert_array_equal(rows, want_rows)
  np.testing.assert_allclose(scores, want_scores, rtol=1e-5, atol=1e-5)


def test_cases_cover_both_top_k_paths():
  paths = set()
  for n, k, chunk_size in CASES:
    for devices in (1, 8):
      rows = search.chunk_rows(n, chunk_size, devices)
      paths.add(search._block_size(rows, min(k, rows)) > 0)
  assert paths == {True, False}


@pytest.mark.parametrize("mesh_name", ["8 devices", "1 device"])
def test_padding_never_wins_when_every_score_is_negative(mesh_name):
  # Zero padding rows would score 0, above every real row: they must still never win,
  # also in the block that mixes real and padded rows (20000 is no multiple of a block).
  # One padded chunk, so its top-k is the answer, in the two-stage path.
  mesh = MESHES[mesh_name]()
  rows_per_device = search.chunk_rows(40010, 65536, mesh.devices.size)
  block = search._block_size(rows_per_device, 12)
  assert block and 40010 % block
  corpus = np.abs(_normal(40010, 16, 11)) + 0.1
  queries = -np.abs(_normal(6, 16, 12)) - 0.1
  scores, rows = search.top_k(queries, corpus, 12, mesh=mesh, chunk_size=65536)
  want_scores, want_rows = _brute_force(queries, corpus, 12)
  assert (want_scores < 0).all()
  np.testing.assert_array_equal(rows, want_rows)
  np.testing.assert_allclose(scores, want_scores, rtol=1e-5)


def _tied_corpus(n, d, seed):
  """Entries in {0, 1/4, 1/2}: every dot product is exact, so duplicates tie exactly."""
  rng = np.random.default_rng(seed)
  base = rng.integers(0, 3, (12, d)).astype(np.float32) / 4
  return base[rng.integers(0, 12, n)]  # Many exact duplicates, spread over the corpus.


@pytest.mark.parametrize("mesh_name", ["8 devices", "1 device"])
@pytest.mark.parametrize("n, chunk_size", [(700, 128), (20000, 16384)])
def test_ties_rank_the_lower_row_first(mesh_name, n, chunk_size):
  corpus = _tied_corpus(n, 16, 0)
  queries = _tied_corpus(11, 16, 1)
  scores, rows = search.top_k(queries, corpus, 9, mesh=MESHES[mesh_name](),
                              chunk_size=chunk_size)
  want_scores, want_rows = _brute_force(queries, corpus, 9)
  assert (np.diff(want_scores, axis=1) == 0).any()  # There are ties to break.
  np.testing.assert_array_equal(rows, want_rows)
  np.testing.assert_array_equal(scores, want_scores.astype(np.float32))


@pytest.mark.parametrize("mesh_name", ["8 devices", "1 device"])
def test_ties_across_blocks_with_different_maxima(mesh_name):
  # Block 7 holds the best row (score 2) and a row scoring 1; block 2 holds another row
  # scoring 1. The tie must go to block 2's row (the lower one), although block 7 ranks
  # first by its maximum.
  mesh = MESHES[mesh_name]()
  n = 16384
  block = search._block_size(search.chunk_rows(n, n, mesh.devices.size), 2)
  assert block
  corpus = np.zeros((n, 4), np.float32)
  corpus[7 * block + 3, 0] = 2
  corpus[7 * block + 5, 0] = 1
  corpus[2 * block + 1, 0] = 1
  queries = np.eye(4, dtype=np.float32)[:1]
  scores, rows = search.top_k(queries, corpus, 2, mesh=mesh, chunk_size=n)
  assert rows.tolist() == [[7 * block + 3, 2 * block + 1]]
  assert scores.tolist() == [[2.0, 1.0]]


def test_searching_the_index_on_disk_equals_searching_the_array(tmp_path):
  corpus = _normal(1500, 32, 2)
  corpus /= np.linalg.norm(corpus, axis=1, keepdims=True)
  ids = [f"img-{i:04d}.jpg" for i in range(1500)]
  index_lib.encode_to_index(tmp_path, ids, lambda r: corpus[r.start:r.stop], kind="image",
                            dim=32, encoder={"model": "clip"}, shard_size=400,
                            progress=False)
  index = index_lib.EmbeddingIndex.open(tmp_path, expect_encoder={"model": "clip"})
  queries = _normal(13, 32, 3)
  from_disk = search.top_k(queries, index, 10, chunk_size=512)
  in_memory = search.top_k(queries, corpus, 10, chunk_size=512)
  np.testing.assert_array_equal(from_disk[1], in_memory[1])
  np.testing.assert_array_equal(from_disk[0], in_memory[0])

  results = search.search(queries, index, 3, chunk_size=512)
  assert len(results) == 13 and len(results[0]) == 3
  assert [i for i, _ in results[4]] == [ids[r] for r in in_memory[1][4, :3]]
  assert results[4][0][1] == pytest.approx(float(in_memory[0][4, 0]))


def test_bfloat16_keeps_well_separated_ids():
  rng = np.random.default_rng(4)
  d, n, k = 64, 5000, 6
  corpus = _normal(n, d, 5)
  corpus /= np.linalg.norm(corpus, axis=1, keepdims=True)
  queries = _normal(17, d, 6)
  queries /= np.linalg.norm(queries, axis=1, keepdims=True)
  # Plant k rows per query at cosines 0.95, 0.9, ... 0.7; random rows stay below ~0.6.
  for qi, q in enumerate(queries):
    for j, cos in enumerate(np.linspace(0.95, 0.7, k)):
      noise = rng.standard_normal(d)
      noise -= noise @ q * q
      corpus[qi * 50 + j * 7] = cos * q + np.sqrt(1 - cos**2) * noise / np.linalg.norm(noise)
  want_scores, want_rows = _brute_force(queries, corpus, k)
  assert (want_scores[:, :-1] - want_scores[:, 1:]).min() > 0.04  # Well separated.
  scores, rows = search.top_k(queries, corpus, k, dtype=jnp.bfloat16, chunk_size=2048)
  np.testing.assert_array_equal(rows, want_rows)
  np.testing.assert_allclose(scores, want_scores, atol=2e-2)


def test_approx_max_k_option():
  corpus, queries = _normal(3000, 16, 7), _normal(9, 16, 8)
  scores, rows = search.top_k(queries, corpus, 10, approx=True, chunk_size=1024)
  _, want_rows = _brute_force(queries, corpus, 10)
  recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(rows, want_rows)])
  assert recall >= 0.95
  assert (np.diff(scores, axis=1) <= 0).all()


def test_one_program_for_every_chunk():
  mesh = MESHES["8 devices"]()
  corpus, queries = _normal(5000, 16, 9), _normal(20, 16, 10)
  # 5000 rows in chunks of 8 x 128: four full chunks and a padded fifth, 3 query batches.
  search.top_k(queries, corpus, 4, mesh=mesh, chunk_size=1024, query_batch=8)
  step = search.chunk_step(mesh, search.chunk_rows(5000, 1024, 8), 4,
                         jnp.dtype(jnp.float32), False, 0.95)
  assert step._cache_size() == 1
  search.top_k(queries[:7], corpus[:3000], 4, mesh=mesh, chunk_size=1024, query_batch=8)
  assert step._cache_size() == 1  # Another corpus size: the same program.


def test_bad_arguments():
  corpus = _normal(10, 8, 0)
  with pytest.raises(ValueError, match=r"queries of shape \(2, 4\) do not match the "
                     r"corpus's 8-d rows"):
    search.top_k(_normal(2, 4, 0), corpus, 3)
  queries = _normal(2, 8, 0)
  queries[1, 0] = np.inf
  with pytest.raises(ValueError, match=r"query 1 is not finite"):
    search.top_k(queries, corpus, 3)
  with pytest.raises(ValueError, match=r"k must be positive"):
    search.top_k(queries[:1], corpus, 0)
  with pytest.raises(ValueError, match=r"searching an array needs its ids"):
    search.search(queries[:1], corpus, 3)


def test_inside_another_mesh_context():
  """An evaluator runs inside the trainer's mesh (here two of the eight devices); the search
  uses its own mesh over every device and must not clash with the caller's."""
  corpus, queries = _normal(300, 16, 4), _normal(5, 16, 5)
  trainer_mesh = mesh_lib.make_mesh(mesh_lib.default_config(), jax.devices()[:2])
  with jax.set_mesh(trainer_mesh):
    _, rows = search.top_k(queries, corpus, 6)
  np.testing.assert_array_equal(rows, _brute_force(queries, corpus, 6)[1])
