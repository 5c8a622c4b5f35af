"""Exact (or TPU-approximate) top-k inner-product search, the corpus streamed and sharded.

The corpus is read in chunks of rows; each chunk is split by rows over every device of the
mesh (all mesh axes flattened). For a batch of queries, one jitted step
1. scores the queries against the device's rows: one [query_batch, rows/devices] matmul;
2. takes the device's local top-k, two-staged (below) or with `lax.approx_max_k`;
3. gathers the devices' top-k and merges them with the running top-k of earlier chunks.
The running top-k stays on the devices; the host only reads the next chunk from disk while
the devices work on the current one (one chunk in flight, so memory stays bounded by
about two chunks plus one score matrix, whatever the corpus size). Every chunk, the last
one padded and masked included, has the same shape, so the step compiles once.

Two-stage exact top-k: XLA:CPU's TopK is a partial sort costing ~5 ns per element (a
single-threaded pass as slow as the matmul itself for k=10), while a max over blocks of b
rows is one vectorised pass. The k best rows lie in the k blocks with the highest maxima
(each of those rows makes its block's max at least the k-th best score, and at most k
blocks can have a max that high), so the step takes the top blocks by maximum, then the
exact top-k among the rows of those blocks, with the blocks in row order so that ties
still resolve to the lower row.

Ties: equal scores rank the lower row first (lax.top_k is stable and every merge keeps the
candidates in row order), so results are deterministic and independent of the mesh.

Single-process: chunks are placed with jax.device_put, so every mesh device must be local
(a multi-host job searches on each host with a mesh of its local devices).

Measured (benchmarks/bench_search.py, 2-core CPU, 2,442 x 2,792,639 x 384, k=10): 0.93x
faiss IndexFlatIP's throughput on a loaded machine (2026-11-29), 0.75x on an idle AVX2 one
(2026-12-03, after the aligned buffers of `_chunks`), 2.1-2.9 GB peak against faiss's
6.8 GB, identical top-10 ids (BENCHMARKS.md).
"""

from __future__ import annotations

import functools
from typing import Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from mocheg_jax.retrieval.index import EmbeddingIndex
from mocheg_jax.utils.progress import Progress

# Two-stage top-k: block sizes tried (largest first) and the least number of blocks per
# wanted result, which keeps the second stage's k*b candidates a small part of the rows.
_BLOCKS = (256, 128, 64, 32, 16)
_MIN_BLOCKS_PER_K = 8
# Rows per device are a multiple of this once chunks are large (so every block size fits).
_ROW_ALIGN = 256


def _block_size(rows: int, k: int) -> int:
  """The two-stage block size for `rows` rows per device and top-k, or 0 (one stage)."""
  for b in _BLOCKS:
    if rows % b == 0 and rows // b >= _MIN_BLOCKS_PER_K * (k + 1):
      return b
  return 0


def _local_top_k(q: jax.Array, c: jax.Array, first: jax.Array, n: jax.Array, k: int,
                 approx: bool, recall_target: float) -> tuple[jax.Array, jax.Array]:
  """The top-k of q @ c.T among rows < n: (scores [Q, k], global rows [Q, k] int32).

  `first` is the global row of c[0]; rows at or past `n` (padding) never win.
  """
  rows = c.shape[0]
  s = lax.dot_general(q, c, (((1,), (1,)), ((), ())),
                      preferred_element_type=jnp.float32)  # [Q, R]
  block = 0 if approx else _block_size(rows, k)
  if not block:
    s = jnp.where(first + jnp.arange(rows, dtype=jnp.int32) < n, s, -jnp.inf)
    if approx:
      scores, local = lax.approx_max_k(s, k, recall_target=recall_target)
    else:
      scores, local = lax.top_k(s, k)
    return scores, local.astype(jnp.int32) + first
  nq, nb = s.shape[0], rows // block
  blocks = s.reshape(nq, nb, block)  # [Q, B, b]
  # Masking every score would cost a pass over [Q, R]; instead only whole padding blocks
  # are masked (on the small [Q, B] maxima). Padding is at the end of the corpus, so at
  # most one block per device mixes real and padded rows and may overstate its max: taking
  # k + 1 blocks keeps the k true best blocks. Padded candidates are masked below.
  maxima = blocks.max(axis=-1)  # [Q, B]
  block_first = first + jnp.arange(nb, dtype=jnp.int32) * block
  maxima = jnp.where(block_first < n, maxima, -jnp.inf)
  _, picked = lax.top_k(maxima, min(k + 1, nb))  # [Q, k + 1]
  picked = jnp.sort(picked, axis=-1)  # Row order, so ties below go to the lower row.
  kb = picked.shape[1]
  cand = jnp.take_along_axis(blocks, picked[:, :, None], axis=1)  # [Q, k + 1, b]
  cand_rows = (picked[:, :, None] * block + jnp.arange(block)).reshape(nq, kb * block)
  cand = jnp.where(first + cand_rows < n, cand.reshape(nq, kb * block), -jnp.inf)
  scores, pos = lax.top_k(cand, k)
  return scores, jnp.take_along_axis(cand_rows, pos, axis=1) + first


@functools.lru_cache(maxsize=32)
def chunk_step(mesh: jax.sharding.Mesh, rows: int, k: int, dtype: jnp.dtype, approx: bool,
             recall_target: float):
  """jit(queries, chunk, first, n, best_scores, best_rows) -> the merged running top-k.

  The compiled step `top_k` runs per corpus chunk; public so that a caller whose corpus is
  already in device memory (benchmarks/gpu_search.py) times exactly this program.

  queries [Q, D] and the running top-k [Q, k] are replicated; chunk [rows * devices, D] is
  split by rows over all mesh axes; first (the chunk's global row) and n (the corpus size)
  are int32 scalars, so one program serves every chunk and every corpus size.
  """
  axes = tuple(mesh.axis_names)
  local_k = min(k, rows)

  def step(q, c, first, n, best_scores, best_rows):
    device = lax.axis_index(axes)
    q, c = q.astype(dtype), c.astype(dtype)
    scores, found = _local_top_k(q, c, first + device * rows, n, local_k, approx,
                                 recall_target)
    # Device order is row order: the gathered candidates stay sorted by row for ties.
    scores = lax.all_gather(scores, axes, axis=1, tiled=True)  # [Q, devices * local_k]
    found = lax.all_gather(found, axes, axis=1, tiled=True)
    # Earlier chunks first: on equal scores their (lower) rows win.
    scores = jnp.concatenate([best_scores, scores], axis=1)
    found = jnp.concatenate([best_rows, found], axis=1)
    top, pos = lax.top_k(scores, k)
    return top, jnp.take_along_axis(found, pos, axis=1)

  # check_vma off: after the all_gather every device merges the same candidates, so the
  # outputs are replicated, which the checker cannot infer through all_gather.
  sharded = jax.shard_map(step, mesh=mesh, in_specs=(P(), P(axes), P(), P(), P(), P()),
                          out_specs=(P(), P()), check_vma=False)
  return jax.jit(sharded)  # No donation: the loop waits on the previous top-k.


def _default_mesh() -> jax.sharding.Mesh:
  """This process's devices: in a multi-process job each process searches alone."""
  from mocheg_jax.parallel import mesh as mesh_lib
  return mesh_lib.make_mesh(mesh_lib.default_config(), jax.local_devices())


def _round_up(x: int, m: int) -> int:
  return -(-x // m) * m


def chunk_rows(num_rows: int, chunk_size: int, devices: int) -> int:
  """Rows per device per chunk: at most chunk_size / devices, at least one, aligned."""
  per_device = -(-min(chunk_size, max(num_rows, 1)) // devices)
  return _round_up(per_device, _ROW_ALIGN if per_device >= 16 * _ROW_ALIGN else 8)


def _aligned_empty(shape: tuple[int, ...], dtype, align: int = 64) -> np.ndarray:
  """np.empty starting on an `align`-byte boundary (numpy guarantees 16): XLA:CPU's
  device_put aliases such host memory instead of copying it."""
  nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
  raw = np.empty(nbytes + align, np.uint8)
  offset = -raw.ctypes.data % align
  return raw[offset:offset + nbytes].view(dtype).reshape(shape)


def _chunks(index: EmbeddingIndex | np.ndarray, size: int) -> Iterator[tuple[int, np.ndarray]]:
  """(first row, rows [size, D]) with the last chunk zero-padded to `size` rows.

  Two aligned buffers take the chunks in turn, so chunk i + 1 overwrites chunk i - 1: the
  caller must be done with a chunk (every computation reading it, whose input may alias
  the buffer) before it asks for the chunk after the next one. Reused buffers cost no fresh
  pages per chunk (on the project's VMs, faulting in a fresh 400 MB buffer took 0.5 s and
  more, a third of a chunk's matmul), and aligned ones no device_put copy on CPU.
  """
  n = len(index)
  if isinstance(index, np.ndarray):
    dtype = index.dtype if index.dtype in (np.float32, np.float16) else np.float32
    dim = index.shape[1]
  else:
    dtype, dim = index.dtype, index.dim
  buffers = [_aligned_empty((size, dim), dtype) for _ in range(min(2, -(-n // size)))]
  for i, start in enumerate(range(0, n, size)):
    stop = min(start + size, n)
    buf = buffers[i % 2]
    if isinstance(index, np.ndarray):
      buf[:stop - start] = index[start:stop]
    else:
      index.read(start, stop, out=buf[:stop - start])
    buf[stop - start:] = 0
    yield start, buf


def top_k(queries: np.ndarray, index: EmbeddingIndex | np.ndarray, k: int, *,
          mesh: jax.sharding.Mesh | None = None, chunk_size: int = 262144,
          query_batch: int = 1024, dtype=jnp.float32, approx: bool = False,
          recall_target: float = 0.95, progress: bool = False
          ) -> tuple[np.ndarray, np.ndarray]:
  """The k rows of `index` with the highest inner product with each query.

  Args:
    queries: [Q, D] float.
    index: an EmbeddingIndex (streamed from disk) or an [N, D] array.
    k: results per query; capped at N.
    mesh: the devices to shard each chunk over (every axis, flattened); None: this
      process's devices.
    chunk_size: corpus rows per step, over all devices. Memory holds about two chunks
      (stored dtype) and one [query_batch, chunk_size] float32 score matrix.
    query_batch: the most queries per step; batches are equalised (2,442 queries with
      1,024 run as 3 x 816) so little is padded.
    dtype: the matmul's input type (jnp.float32 or jnp.bfloat16; scores accumulate in
      float32). bfloat16 pays off on TPUs and GPUs, not on CPUs.
    approx: use lax.approx_max_k per device (fast on TPUs; exact elsewhere).
    recall_target: approx_max_k's expected recall.
    progress: print rows searched with an ETA.

  Returns:
    (scores [Q, k'] float32, rows [Q, k'] int64), k' = min(k, N), best first; equal scores
    rank the lower row first.
  """
  queries = np.asarray(queries, np.float32)
  dim = index.dim if isinstance(index, EmbeddingIndex) else np.shape(index)[1]
  if isinstance(index, np.ndarray) and index.ndim != 2:
    raise ValueError(f"the corpus must be [N, D], got shape {index.shape}")
  if queries.ndim != 2 or queries.shape[1] != dim:
    raise ValueError(f"queries of shape {queries.shape} do not match the corpus's "
                     f"{dim}-d rows")
  if not np.isfinite(queries).all():
    raise ValueError(f"query {int(np.argmin(np.isfinite(queries).all(axis=1)))} is not finite")
  if k < 1:
    raise ValueError(f"k must be positive, not {k}")
  if chunk_size < 1 or query_batch < 1:
    raise ValueError(f"chunk_size ({chunk_size}) and query_batch ({query_batch}) must be "
                     "positive")
  n, nq = len(index), len(queries)
  k = min(k, n)
  if n >= 2**31:
    raise ValueError(f"{n} rows: int32 row numbers cap the corpus at 2**31 - 1 rows")
  if nq == 0 or k == 0:
    return np.zeros((nq, k), np.float32), np.zeros((nq, k), np.int64)

  mesh = _default_mesh() if mesh is None else mesh
  devices = mesh.devices.size
  rows = chunk_rows(n, chunk_size, devices)
  step = chunk_step(mesh, rows, k, jnp.dtype(dtype), bool(approx), float(recall_target))
  batches = -(-nq // query_batch)
  qb = _round_up(-(-nq // batches), 8)
  padded = np.zeros((batches * qb, dim), np.float32)
  padded[:nq] = queries
  replicated = NamedSharding(mesh, P())
  split = NamedSharding(mesh, P(tuple(mesh.axis_names)))
  q_dev = [jax.device_put(padded[b * qb:(b + 1) * qb], replicated) for b in range(batches)]
  best = [(jax.device_put(np.full((qb, k), -np.inf, np.float32), replicated),
           jax.device_put(np.full((qb, k), -1, np.int32), replicated))
          for _ in range(batches)]
  n_dev = jax.device_put(np.int32(n), replicated)
  size = rows * devices
  previous = None
  # The search's own mesh is the context mesh while it runs: a caller inside another mesh
  # (an evaluator in the trainer's loop, on a subset of the devices) would otherwise clash
  # with shard_map's.
  with jax.set_mesh(mesh), Progress("searching", total=n, unit="rows",
                                    enabled=progress) as bar:
    for start, chunk in _chunks(index, size):
      c_dev = jax.device_put(chunk, split)
      first = jax.device_put(np.int32(start), replicated)
      best = [step(q, c_dev, first, n_dev, *b) for q, b in zip(q_dev, best)]
      del c_dev, chunk
      if previous is not None:
        # Wait for the previous chunk (not this one) before reading the next: one chunk
        # computes while the host reads, and no more than two chunks are ever alive
        # (_chunks reuses the previous chunk's buffer for the next).
        jax.block_until_ready(previous)
        bar.update(size)
      previous = best
    jax.block_until_ready(best)
    bar.update(n - bar.done)
  scores = np.concatenate([np.asarray(s) for s, _ in best])[:nq]
  found = np.concatenate([np.asarray(r) for _, r in best])[:nq].astype(np.int64)
  return scores, found


def search(queries: np.ndarray, index: EmbeddingIndex | np.ndarray, k: int, *,
           ids: Sequence[str] | None = None, **kwargs) -> list[list[tuple[str, float]]]:
  """top_k with rows mapped to ids: per query, [(id, score)] best first.

  Args:
    ids: the row ids when `index` is an array (an EmbeddingIndex has its own).
    **kwargs: passed to top_k.
  """
  if ids is None:
    if not isinstance(index, EmbeddingIndex):
      raise ValueError("searching an array needs its ids")
    ids = index.ids
  if len(ids) != len(index):
    raise ValueError(f"{len(ids)} ids for {len(index)} rows")
  scores, rows = top_k(queries, index, k, **kwargs)
  return [[(ids[r], float(s)) for r, s in zip(row_ids, row_scores)]
          for row_ids, row_scores in zip(rows.tolist(), scores.tolist())]

