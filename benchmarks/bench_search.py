"""Exhaustive top-k search on CPU: ours (streamed from an on-disk index) vs faiss IndexFlatIP.

  python benchmarks/bench_search.py                       # paper scale: 2,792,639 x 384
  python benchmarks/bench_search.py --num_docs=200000     # quick mode

A synthetic corpus of L2-normalised float32 N x 384 rows (random normal, like the KB
sentences' MiniLM embeddings in size, not in distribution) is written to --workdir as an
index with IndexWriter (resumable: a later run with the same flags reuses it), and
--num_queries normalised random queries are searched for their top --k rows:
* ours: mocheg_jax.retrieval.search.top_k over the EmbeddingIndex, the corpus streamed from
  disk in --chunk_size rows (the file pages are in the OS cache after writing), on the
  default CPU device; compilation is done before the timing on the first chunk;
* faiss: IndexFlatIP over the same rows loaded into memory (added shard by shard, so no
  second full copy exists; faiss's storage still grows by reallocation, so its peak is
  ~1.6x the corpus), faiss.omp_set_num_threads(CPU count).
XLA's CPU backend uses every core by default; both sides get all CPUs.

Each side runs in its own subprocess, --repeats times, the two interleaved (ours, faiss,
ours, ...) so load changes hit both; the best wall time counts. Peak memory: each
subprocess reads its own VmHWM (peak resident set) from /proc/self/status when done, and
VmRSS after its imports (the baseline), so "peak" is the whole process and "work" is what
the search added. For ours the peak is reset (/proc/self/clear_refs) after the warm-up,
whose in-memory copy of the first chunk is no part of the streamed search; for faiss the
peak includes loading the corpus, which its in-memory search needs. CPU seconds (user +
sys from getrusage) are reported too: on a machine shared with other jobs they show the
work done, independently of the waiting.

The top-k ids of both sides are compared: the number of queries whose ids differ, and the
largest difference between the two sides' scores (exactly equal scores can be ordered
differently: ours puts the lower row first). Prints a table and writes --out as JSON.
"""

from __future__ import annotations

if __name__ == "__main__":  # First: a re-exec keeps nothing done before it.
  from mocheg_jax.utils import allocator
  allocator.run_under_preferred_allocator()

import json
import os
import pathlib
import platform
import resource
import shutil
import subprocess
import sys
import time

from absl import app, flags

from mocheg_jax.utils import resident_memory

_NUM_DOCS = flags.DEFINE_integer("num_docs", 2_792_639, "Corpus rows (paper: 2,792,639).")
_NUM_QUERIES = flags.DEFINE_integer("num_queries", 2442, "Queries (paper test claims: 2,442).")
_K = flags.DEFINE_integer("k", 10, "Results per query.")
_DIM = flags.DEFINE_integer("dim", 384, "Embedding width (MiniLM: 384).")
_CHUNK = flags.DEFINE_integer("chunk_size", 262144, "Our corpus rows per step.")
_QUERY_BATCH = flags.DEFINE_integer("query_batch", 1024, "Our queries per step (at most).")
_REPEATS = flags.DEFINE_integer("repeats", 2, "Timed runs per side (best counts).")
_WORKDIR = flags.DEFINE_string("workdir", "/tmp/mocheg_bench_search",
                               "Where the index and the results of the sides are written.")
_KEEP = flags.DEFINE_boolean("keep_index", False, "Keep the index (else it is deleted).")
_OUT = flags.DEFINE_string("out", "benchmarks/out/search.json", "JSON results file.")
_SIDE = flags.DEFINE_enum("side", None, ["ours", "faiss"], "Internal: run one side.")
_RESULT = flags.DEFINE_string("result", None, "Internal: where a side writes its JSON.")

TARGET_RATIO = 0.8
SHARD_SIZE = 65536
WRITE_BATCH = 65536


def _status_gb(field: str) -> float:
  """A /proc/self/status memory field (kB) in GB."""
  kib = resident_memory.status_kib(field)
  if kib is None:
    raise RuntimeError(f"{field} not in /proc/self/status")
  return kib / 1e6


def _reset_peak() -> None:
  """Resets VmHWM to the current RSS (Linux >= 4.0: clear_refs 5)."""
  if not resident_memory.reset_peak():
    raise RuntimeError("cannot reset the peak resident memory (/proc/self/clear_refs)")


def _cpu_seconds() -> float:
  usage = resource.getrusage(resource.RUSAGE_SELF)
  return usage.ru_utime + usage.ru_stime


def _queries(n: int, dim: int):
  import numpy as np
  q = np.random.default_rng(1).standard_normal((n, dim), dtype=np.float32)
  return q / np.linalg.norm(q, axis=1, keepdims=True)


def _index_dir() -> pathlib.Path:
  return pathlib.Path(_WORKDIR.value) / f"index-{_NUM_DOCS.value}x{_DIM.value}"


def write_index() -> float:
  """Writes (or finishes, or reuses) the synthetic index; returns the seconds spent."""
  import numpy as np
  from mocheg_jax.retrieval import index as index_lib

  n, dim = _NUM_DOCS.value, _DIM.value

  def encode(rows: range) -> np.ndarray:
    # One generator per batch, so a resumed run writes the same rows.
    rng = np.random.default_rng([0, rows.start])
    x = rng.standard_normal((len(rows), dim), dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)

  start = time.perf_counter()
  index_lib.encode_to_index(
      _index_dir(), [str(i) for i in range(n)], encode, kind="text", dim=dim,
      encoder={"synthetic": "normal", "seed": 0, "num_docs": n}, batch_size=WRITE_BATCH,
      shard_size=SHARD_SIZE)
  return time.perf_counter() - start


def run_ours() -> dict:
  import jax
  import numpy as np
  from mocheg_jax.retrieval import index as index_lib
  from mocheg_jax.retrieval import search

  baseline = _status_gb("VmRSS")
  index = index_lib.EmbeddingIndex.open(_index_dir())
  queries = _queries(_NUM_QUERIES.value, index.dim)
  kwargs = dict(chunk_size=_CHUNK.value, query_batch=_QUERY_BATCH.value)
  # Compile outside the timing: one chunk of the same shape (the step is shape-generic in N).
  start = time.perf_counter()
  search.top_k(queries, index.read(0, min(len(index), _CHUNK.value)), _K.value, **kwargs)
  compile_s = time.perf_counter() - start
  _reset_peak()  # The peak of the timed search only, not of the warm-up's extra copy.
  cpu, start = _cpu_seconds(), time.perf_counter()
  scores, rows = search.top_k(queries, index, _K.value, **kwargs)
  seconds, cpu = time.perf_counter() - start, _cpu_seconds() - cpu
  np.save(pathlib.Path(_WORKDIR.value) / "ours_rows.npy", rows)
  np.save(pathlib.Path(_WORKDIR.value) / "ours_scores.npy", scores)
  return dict(seconds=seconds, cpu_seconds=cpu, first_chunk_with_compile_s=compile_s,
              peak_rss_gb=_status_gb("VmHWM"), baseline_rss_gb=baseline,
              devices=str(jax.devices()))


def run_faiss() -> dict:
  import faiss
  import numpy as np
  from mocheg_jax.retrieval import index as index_lib

  baseline = _status_gb("VmRSS")
  faiss.omp_set_num_threads(os.cpu_count() or 1)
  index = index_lib.EmbeddingIndex.open(_index_dir())
  queries = _queries(_NUM_QUERIES.value, index.dim)
  start = time.perf_counter()
  flat = faiss.IndexFlatIP(index.dim)
  for _, rows in index.chunks(SHARD_SIZE):
    flat.add(np.ascontiguousarray(rows, np.float32))
  load_s = time.perf_counter() - start
  cpu, start = _cpu_seconds(), time.perf_counter()
  scores, rows = flat.search(queries, _K.value)
  seconds, cpu = time.perf_counter() - start, _cpu_seconds() - cpu
  np.save(pathlib.Path(_WORKDIR.value) / "faiss_rows.npy", rows.astype(np.int64))
  np.save(pathlib.Path(_WORKDIR.value) / "faiss_scores.npy", scores)
  return dict(seconds=seconds, cpu_seconds=cpu, load_s=load_s,
              peak_rss_gb=_status_gb("VmHWM"), baseline_rss_gb=baseline,
              omp_threads=faiss.omp_get_max_threads(), faiss_version=faiss.__version__)


def _run_side(side: str) -> dict:
  result = pathlib.Path(_WORKDIR.value) / f"{side}.json"
  cmd = [sys.executable, os.path.abspath(__file__), f"--side={side}", f"--result={result}",
         f"--num_docs={_NUM_DOCS.value}", f"--num_queries={_NUM_QUERIES.value}",
         f"--k={_K.value}", f"--dim={_DIM.value}", f"--chunk_size={_CHUNK.value}",
         f"--query_batch={_QUERY_BATCH.value}", f"--workdir={_WORKDIR.value}"]
  load_before = os.getloadavg()[0]
  proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
  if proc.returncode:
    sys.exit(f"the {side} side failed:\n{proc.stderr[-3000:]}")
  # The 1-minute load average before and after: how busy the shared machine was.
  return json.loads(result.read_text()) | {"load_before": load_before,
                                           "load_after": os.getloadavg()[0]}


def compare(k: int) -> dict:
  import numpy as np
  work = pathlib.Path(_WORKDIR.value)
  ours, theirs = np.load(work / "ours_rows.npy"), np.load(work / "faiss_rows.npy")
  ours_s, theirs_s = np.load(work / "ours_scores.npy"), np.load(work / "faiss_scores.npy")
  differ = (ours != theirs).any(axis=1)
  return dict(queries_with_different_ids=int(differ.sum()),
              queries_with_different_id_sets=int(sum(
                  set(a) != set(b) for a, b in zip(ours.tolist(), theirs.tolist()))),
              max_abs_score_difference=float(np.abs(ours_s - theirs_s).max()),
              k=k)


def main(argv: list[str]) -> None:
  del argv
  if _SIDE.value:
    result = run_ours() if _SIDE.value == "ours" else run_faiss()
    pathlib.Path(_RESULT.value).write_text(json.dumps(result))
    return
  if _NUM_DOCS.value < _K.value or _NUM_QUERIES.value < 1 or _K.value < 1:
    sys.exit(f"need num_docs >= k >= 1 and num_queries >= 1 (got {_NUM_DOCS.value}, "
             f"{_K.value}, {_NUM_QUERIES.value})")
  try:
    import faiss  # noqa: F401  pylint: disable=unused-import,import-outside-toplevel
  except ImportError:
    sys.exit("faiss is not installed: pip install faiss-cpu (the bench extra)")
  gb = _NUM_DOCS.value * _DIM.value * 4 / 1e9
  print(f"corpus {_NUM_DOCS.value:,} x {_DIM.value} float32 ({gb:.2f} GB) in "
        f"{_index_dir()}", flush=True)
  write_s = write_index()
  runs: dict[str, list[dict]] = {"ours": [], "faiss": []}
  for r in range(_REPEATS.value):
    for side in runs:
      runs[side].append(_run_side(side))
      run = runs[side][-1]
      print(f"run {r + 1}/{_REPEATS.value} {side}: {run['seconds']:.2f} s (cpu "
            f"{run['cpu_seconds']:.1f} s, load {run['load_before']:.1f} -> "
            f"{run['load_after']:.1f})", flush=True)
  # Both sides' ids and scores on disk are from their last runs; compare those.
  agreement = compare(_K.value)
  best = {side: min(rs, key=lambda x: x["seconds"]) for side, rs in runs.items()}
  nq = _NUM_QUERIES.value
  gflop = 2 * nq * _NUM_DOCS.value * _DIM.value / 1e9
  ratio = best["faiss"]["seconds"] / best["ours"]["seconds"]
  cpu_ratio = (min(r["cpu_seconds"] for r in runs["faiss"])
               / min(r["cpu_seconds"] for r in runs["ours"]))
  threads = os.cpu_count()
  load = os.getloadavg()
  print(f"\ntop-{_K.value} inner-product search, {nq:,} queries x {_NUM_DOCS.value:,} x "
        f"{_DIM.value} float32, CPU x{threads} (load average {load[0]:.1f})")
  print(f"{'system':38s} {'seconds':>8s} {'queries/s':>10s} {'GFLOP/s':>8s} "
        f"{'cpu s':>7s} {'peak GB':>8s} {'work GB':>8s}")
  names = {"ours": "ours (JAX, streamed from disk)", "faiss": "faiss IndexFlatIP (in memory)"}
  for side, r in best.items():
    print(f"{names[side]:38s} {r['seconds']:8.2f} {nq / r['seconds']:10.1f} "
          f"{gflop / r['seconds']:8.1f} {r['cpu_seconds']:7.1f} {r['peak_rss_gb']:8.2f} "
          f"{r['peak_rss_gb'] - r['baseline_rss_gb']:8.2f}")
  print(f"throughput ratio ours/faiss: {ratio:.2f}x (target >= {TARGET_RATIO}x); CPU-time "
        f"ratio {cpu_ratio:.2f}x; queries with different top-{_K.value} ids: "
        f"{agreement['queries_with_different_ids']} (different sets: "
        f"{agreement['queries_with_different_id_sets']}), max score difference "
        f"{agreement['max_abs_score_difference']:.2e}; index written in {write_s:.1f} s")
  result = dict(
      benchmark="search_top_k", num_docs=_NUM_DOCS.value, num_queries=nq, k=_K.value,
      dim=_DIM.value, chunk_size=_CHUNK.value, query_batch=_QUERY_BATCH.value,
      cpu_count=threads, load_average=load, platform=platform.platform(),
      index_write_s=write_s, runs=runs, best=best, ratio=ratio, cpu_time_ratio=cpu_ratio,
      target=TARGET_RATIO, agreement=agreement, gflop=gflop)
  os.makedirs(os.path.dirname(_OUT.value) or ".", exist_ok=True)
  with open(_OUT.value, "w") as f:
    json.dump(result, f, indent=2)
  if not _KEEP.value:
    shutil.rmtree(_index_dir(), ignore_errors=True)


if __name__ == "__main__":
  from mocheg_jax.utils import host_memory
  host_memory.keep_freed_memory_if_asked()  # Both sides alike (mocheg_jax/utils/host_memory.py).
  app.run(main)
