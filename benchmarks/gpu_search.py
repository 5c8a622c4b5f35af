"""Exact top-k corpus search on an accelerator, against the HBM-bandwidth / matmul roofline.

  python benchmarks/gpu_search.py [--repeats=10] [--out=benchmarks/out/gpu_search.json]
  python benchmarks/gpu_search.py --smoke       # tiny shapes on any backend

Paper scale: 2,442 queries (the test claims), top-10 of 2,792,639 x 384 unit-norm rows
(random normal, generated on the devices chunk by chunk, never built on the host), for
float32 and bfloat16 matmul inputs (scores accumulate in float32 either way).

What is timed (best of --repeats after a warm-up), per dtype:
* resident: the corpus already in device memory, in the chunks that
  mocheg_jax.retrieval.search.top_k would stream (search.chunk_rows rows per device, each
  chunk split by rows over every device of the default mesh), run through search.top_k's
  own compiled step, in top_k's order (chunks outer, equalised query batches inner). This
  is our search minus the host: the figure the roofline is about. top_k itself only takes
  host arrays or on-disk indexes, so it cannot be handed a device-resident corpus.
* host_streamed (--host_streamed): the public search.top_k on a host copy of the same
  float32 corpus (the way an EmbeddingIndex is searched): adds host copies and
  host-to-device transfers. Its ids are compared with the resident run's.

Roofline, per search: max(corpus bytes / HBM bandwidth, 2*Q*N*D / peak FLOP/s), with the
corpus read once (N*D*itemsize) and the peak for the matmul's input type (bfloat16; for
float32, whatever the default matmul precision makes of it: TF32 tensor cores on
Ampere/Hopper GPUs, one bfloat16 pass on TPUs). The peaks are dense (no structured
sparsity) figures per device kind, times the device count. "floor" adds what our
algorithm moves on top of that: the corpus read once per query batch and the float32
[queries x rows] score matrix written by the matmul and read back for the block maxima.

Correctness: the ids of our search are checked against a plain
`lax.top_k(q @ corpus.T)` in exact float32 (precision HIGHEST) on --check_queries queries:
the exact scores of our picks (recomputed in float32) must match the reference's top-k
scores within the worst-case error of the matmul precision in use; the share of queries
with identical ids (ordered and as sets) and the recall of the reference's top-k are
recorded for both dtypes. Fails loudly unless JAX sees a GPU/TPU (`--smoke` excepted).
Writes JSON (--out) and prints a table. Installs nothing.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:  # `python benchmarks/gpu_search.py` from anywhere.
  sys.path.insert(0, _REPO)

from absl import app, flags  # noqa: E402

from mocheg_jax.utils.peaks import ACCELERATORS, DTYPES  # noqa: E402
from mocheg_jax.utils.peaks import matmul_mode, parse_peak_override, peaks_for  # noqa: E402

_REPEATS = flags.DEFINE_integer("repeats", 10, "Timed runs per figure (best is kept).")
_HOST_REPEATS = flags.DEFINE_integer("host_repeats", 2, "Timed runs of the host-streamed top_k.")
_HOST = flags.DEFINE_bool("host_streamed", True, "Also time the public top_k from host memory.")
_NUM_DOCS = flags.DEFINE_integer("num_docs", 2_792_639, "Corpus rows (paper: 2,792,639).")
_NUM_QUERIES = flags.DEFINE_integer("num_queries", 2442, "Queries (paper test claims: 2,442).")
_DIM = flags.DEFINE_integer("dim", 384, "Embedding width (MiniLM: 384).")
_K = flags.DEFINE_integer("k", 10, "Results per query.")
_CHUNK = flags.DEFINE_integer("chunk_size", 262144, "Corpus rows per step (top_k's default).")
_QUERY_BATCH = flags.DEFINE_integer("query_batch", 1024, "Queries per step, at most.")
_CHECK = flags.DEFINE_integer("check_queries", 2048, "Queries checked against the reference.")
_PEAK = flags.DEFINE_string(
    "peak_tflops", None, "Per-device dense peak TFLOP/s overriding the table: one number for "
    "both dtypes, or 'bfloat16=989.4,float32=494.7'.")
_HBM = flags.DEFINE_float("hbm_gbps", None, "Per-device HBM GB/s overriding the table.")
_SMOKE = flags.DEFINE_bool("smoke", False, "Any backend, tiny shapes unless given (a check).")
_OUT = flags.DEFINE_string("out", "benchmarks/out/gpu_search.json", "JSON output path.")

REFERENCE_BATCH = 256  # Reference queries per step: a [256, N] float32 score matrix.

# Relative rounding of a matmul input per precision mode (truncation, the worst case).
_UNIT_ROUNDOFF = {"fp32": 0.0, "tf32": 2.0**-10, "bf16": 2.0**-8, "bf16x3": 2.0**-16,
                  "bf16x6": 2.0**-22}


def roofline(flops: float, corpus_bytes: float, moved_bytes: float, devices: int,
             tflops: float | None, gbps: float | None) -> dict:
  """The roofline (corpus read once) and our algorithm's floor (everything it moves)."""
  if tflops is None or gbps is None:
    return dict(roofline_s=None, roofline_bound=None, floor_s=None)
  compute = flops / (tflops * 1e12 * devices)
  memory = corpus_bytes / (gbps * 1e9 * devices)
  return dict(roofline_s=max(compute, memory),
              roofline_bound="compute" if compute >= memory else "memory",
              floor_s=max(compute, moved_bytes / (gbps * 1e9 * devices)))


def score_tolerance(mode: str | None, dim: int) -> float:
  """How far an exact pick's score may fall below the true j-th best under `mode`.

  A score of unit vectors computed from inputs rounded by a relative u, accumulated over
  `dim` products in float32, is off by at most 2u + dim * 2^-24 (|q|,|c| <= 1); a search
  ranking by such scores can pick a row whose true score is short by twice that.
  """
  u = _UNIT_ROUNDOFF.get(mode or "bf16", _UNIT_ROUNDOFF["bf16"])
  return 2 * (2 * u + dim * 2.0**-24)


def agreement(rows, true_scores, ref_rows, ref_scores, n: int) -> dict:
  """Our [Q, k] picks (with their exact scores) against the exact reference top-k."""
  import numpy as np
  k = ref_rows.shape[1]
  valid = bool(((rows >= 0) & (rows < n)).all()) and all(
      len(set(r)) == len(r) for r in rows.tolist())
  overlap = [len(set(a) & set(b)) for a, b in zip(rows.tolist(), ref_rows.tolist())]
  picked = -np.sort(-true_scores, axis=1)  # Our picks' exact scores, best first.
  return dict(queries=int(len(rows)), valid_distinct_ids=valid,
              ids_equal_rate=float((rows == ref_rows).all(axis=1).mean()),
              id_sets_equal_rate=float(np.mean([o == k for o in overlap])),
              recall_at_k=float(np.mean(overlap) / k),
              max_score_difference=float(np.abs(picked - ref_scores).max()))


def _best_time(fn, repeats: int):
  """(best seconds of `repeats` calls after a warm-up, the last call's output)."""
  import jax
  out = jax.block_until_ready(fn())  # Warm-up: compilation and first touches.
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    out = jax.block_until_ready(fn())
    best = min(best, time.perf_counter() - start)
  return best, out


def _validate() -> None:
  n, nq, k = _NUM_DOCS.value, _NUM_QUERIES.value, _K.value
  if not (1 <= k <= n < 2**31 and nq >= 1 and _DIM.value >= 1 and _CHUNK.value >= 1
          and _QUERY_BATCH.value >= 1 and _CHECK.value >= 1 and _REPEATS.value >= 1
          and _HOST_REPEATS.value >= 1):
    raise SystemExit(f"error: need 1 <= k ({k}) <= num_docs ({n}) < 2**31 and positive "
                     "num_queries, dim, chunk_size, query_batch, check_queries, repeats, "
                     "host_repeats")


def main(argv):
  del argv
  import jax
  import jax.numpy as jnp
  import numpy as np
  from jax import lax
  from jax.sharding import NamedSharding
  from jax.sharding import PartitionSpec as P

  from mocheg_jax.parallel import mesh as mesh_lib
  from mocheg_jax.retrieval import search

  backend, smoke = jax.default_backend(), _SMOKE.value
  if backend not in ACCELERATORS and not smoke:
    raise SystemExit(f"error: JAX sees no accelerator (backend {backend!r}, devices "
                     f"{jax.devices()}); install jax with CUDA support or pass --smoke")
  if smoke:  # Several chunks, a padded last one, the two-stage top-k, several query batches.
    for flag, value in ((_NUM_DOCS, 20_000), (_NUM_QUERIES, 50), (_DIM, 32),
                        (_CHUNK, 16384), (_QUERY_BATCH, 16)):
      if not flags.FLAGS[flag.name].present:  # Shapes given on the command line win.
        flags.FLAGS[flag.name].value = value
  _validate()
  try:
    override = parse_peak_override(_PEAK.value)
  except ValueError as e:
    raise SystemExit(f"error: {e}") from None
  if _HBM.value is not None and not 0 < _HBM.value < math.inf:
    raise SystemExit(f"error: --hbm_gbps must be positive, not {_HBM.value}")

  n, nq, dim, k = _NUM_DOCS.value, _NUM_QUERIES.value, _DIM.value, _K.value
  platform = "gpu" if backend in ("cuda", "rocm") else backend
  device_kind = jax.devices()[0].device_kind
  precision = jax.config.jax_default_matmul_precision
  mesh = mesh_lib.make_mesh(mesh_lib.default_config())
  devices = mesh.devices.size
  rows = search.chunk_rows(n, _CHUNK.value, devices)
  size = rows * devices
  num_chunks = -(-n // size)
  split = NamedSharding(mesh, P(tuple(mesh.axis_names)))
  replicated = NamedSharding(mesh, P())

  # The corpus, chunk by chunk on the devices, in top_k's layout (zero rows pad the last).
  def generate(key, start):
    x = jax.random.normal(jax.random.fold_in(key, start), (size, dim), jnp.float32)
    x = x / jnp.linalg.norm(x, axis=1, keepdims=True)
    return jnp.where((start + jnp.arange(size) < n)[:, None], x, 0.0)

  gen = jax.jit(generate, out_shardings=split)
  key = jax.random.key(0)
  corpus32 = [gen(key, jnp.int32(i * size)) for i in range(num_chunks)]
  rng = np.random.default_rng(1)
  queries = rng.standard_normal((nq, dim), dtype=np.float32)
  queries /= np.linalg.norm(queries, axis=1, keepdims=True)

  # Exact reference on the checked subset: plain top-k of the full score matrix.
  check = min(_CHECK.value, nq)
  rb = min(REFERENCE_BATCH, check)

  @jax.jit
  def reference(q, chunks):
    s = jnp.concatenate([jnp.matmul(q, c.T, precision=lax.Precision.HIGHEST)
                         for c in chunks], axis=1)[:, :n]
    return lax.top_k(s, k)

  @jax.jit
  def exact_scores(q, found, chunks):  # q [B, D], found [B, k] global rows -> [B, k]
    out = jnp.full(found.shape, jnp.nan, jnp.float32)
    for i, c in enumerate(chunks):
      local = found - i * size
      rows_ = jnp.take(c, jnp.clip(local, 0, size - 1), axis=0).astype(jnp.float32)
      inside = (local >= 0) & (local < size)
      out = jnp.where(inside, jnp.sum(rows_ * q[:, None, :], axis=-1), out)
    return out

  def batched(fn, *arrays):  # fn over [rb]-row batches of the checked queries, padded.
    pad = -(-check // rb) * rb - check
    padded = [np.concatenate([a[:check], np.zeros((pad,) + a.shape[1:], a.dtype)])
              for a in arrays]
    parts = [jax.device_get(fn(*[jax.device_put(p[i:i + rb], replicated) for p in padded]))
             for i in range(0, check + pad, rb)]
    return [np.concatenate(xs)[:check] for xs in zip(*parts)]

  start = time.perf_counter()
  ref_scores, ref_rows = batched(lambda q: reference(q, corpus32), queries)
  reference_s = time.perf_counter() - start

  host = None
  if _HOST.value:  # The float32 corpus in host memory, as an EmbeddingIndex would be read.
    host = np.empty((n, dim), np.float32)
    for i, c in enumerate(corpus32):
      host[i * size:min((i + 1) * size, n)] = np.asarray(c)[:min(size, n - i * size)]

  # top_k's query batches: equalised, padded to a multiple of 8.
  batches = -(-nq // _QUERY_BATCH.value)
  qb = -(-nq // batches)
  qb = -(-qb // 8) * 8
  padded_q = np.zeros((batches * qb, dim), np.float32)
  padded_q[:nq] = queries
  q_dev = [jax.device_put(padded_q[b * qb:(b + 1) * qb], replicated) for b in range(batches)]
  best0 = [(jax.device_put(np.full((qb, k), -np.inf, np.float32), replicated),
            jax.device_put(np.full((qb, k), -1, np.int32), replicated))
           for _ in range(batches)]
  firsts = [jax.device_put(np.int32(i * size), replicated) for i in range(num_chunks)]
  n_dev = jax.device_put(np.int32(n), replicated)
  to_bf16 = jax.jit(lambda c: c.astype(jnp.bfloat16), out_shardings=split)

  flops = 2.0 * nq * n * dim
  notes, results = [], []
  for dtype in DTYPES:
    jdtype = jnp.dtype(dtype)
    chunks = corpus32 if dtype == "float32" else [to_bf16(c) for c in corpus32]
    step = search.chunk_step(mesh, rows, k, jdtype, False, 0.95)

    def resident(chunks=chunks, step=step):
      best = best0
      with jax.set_mesh(mesh):
        for c, first in zip(chunks, firsts):
          best = [step(q, c, first, n_dev, *b) for q, b in zip(q_dev, best)]
      return best

    seconds, best = _best_time(resident, _REPEATS.value)
    found = np.concatenate([np.asarray(r) for _, r in best])[:nq].astype(np.int64)
    mode = matmul_mode(platform, dtype, precision, os.environ.get("NVIDIA_TF32_OVERRIDE"))
    (true_scores,) = batched(lambda q, f: (exact_scores(q, f, corpus32),), queries,
                             found.astype(np.int32))
    check_result = agreement(found[:check], true_scores, ref_rows, ref_scores, n)
    tol = score_tolerance(mode, dim)
    check_result.update(score_tolerance=tol, passed=None if dtype != "float32" else bool(
        check_result["valid_distinct_ids"] and check_result["max_score_difference"] <= tol))

    itemsize = jdtype.itemsize
    corpus_bytes = n * dim * itemsize
    streamed = batches * num_chunks * size * dim * itemsize
    score_bytes = batches * qb * num_chunks * size * 4
    tflops, gbps, source = peaks_for(device_kind, dtype, mode, override, _HBM.value)
    line = roofline(flops, corpus_bytes, streamed + 2 * score_bytes, devices, tflops, gbps)
    if line["roofline_s"] is None:
      notes.append(f"{dtype}: no roofline: {source}, matmul mode {mode}, peak {tflops} "
                   f"TFLOP/s, HBM {gbps} GB/s per device; pass --peak_tflops and --hbm_gbps")
    ratio = lambda r: None if r is None else seconds / r  # noqa: E731
    result = dict(
        dtype=dtype, matmul_mode=mode, seconds=seconds, queries_per_s=nq / seconds,
        tflops_per_s=flops / seconds / 1e12, flops=flops, corpus_bytes=corpus_bytes,
        corpus_bytes_streamed=streamed, score_matrix_bytes=score_bytes,
        peak_tflops_per_device=tflops, hbm_gbps_per_device=gbps, peak_source=source, **line,
        time_over_roofline=ratio(line["roofline_s"]),
        roofline_fraction=None if line["roofline_s"] is None else line["roofline_s"] / seconds,
        time_over_floor=ratio(line["floor_s"]), check=check_result, host_streamed=None)

    if host is not None:
      def public(dtype=jdtype):
        return search.top_k(queries, host, k, mesh=mesh, chunk_size=_CHUNK.value,
                            query_batch=_QUERY_BATCH.value, dtype=dtype)
      host_s, (_, host_rows) = _best_time(public, _HOST_REPEATS.value)
      result["host_streamed"] = dict(
          seconds=host_s, queries_per_s=nq / host_s,
          ids_equal_to_resident_rate=float((host_rows == found).all(axis=1).mean()))
    results.append(result)
    del chunks, best

  print(f"backend {backend}, {devices} x {device_kind}, mesh {mesh_lib.describe(mesh)}, "
        f"default matmul precision {precision}")
  print(f"top-{k} of {n:,} x {dim} for {nq:,} queries: {num_chunks} chunks of {size:,} rows "
        f"({rows:,} per device), {batches} query batches of {qb}; "
        f"{flops / 1e12:.3f} TFLOP per search")
  print("| dtype | mode | ms | queries/s | TFLOP/s | corpus GB | roofline ms (bound) | "
        "time/roofline | time/floor | host top_k ms | check |\n|---|---|---|---|---|---|---|"
        "---|---|---|---|")
  fmt = lambda x, spec, scale=1.0: "null" if x is None else format(x * scale, spec)  # noqa: E731
  for r in results:
    c = r["check"]
    verdict = ("passed" if c["passed"] else "FAILED") if c["passed"] is not None else "-"
    bound = f" ({r['roofline_bound']})" if r["roofline_bound"] else ""
    host_ms = (f"{r['host_streamed']['seconds'] * 1e3:.1f}" if r["host_streamed"] else "-")
    print(f"| {r['dtype']} | {r['matmul_mode']} | {r['seconds'] * 1e3:.2f} | "
          f"{r['queries_per_s']:,.0f} | {r['tflops_per_s']:.2f} | "
          f"{r['corpus_bytes'] / 1e9:.3f} | "
          f"{fmt(r['roofline_s'], '.2f', 1e3)}{bound} | "
          f"{fmt(r['time_over_roofline'], '.2f')} | {fmt(r['time_over_floor'], '.2f')} | "
          f"{host_ms} | {verdict}: ids equal {c['ids_equal_rate']:.4f}, recall@{k} "
          f"{c['recall_at_k']:.4f}, max score diff {c['max_score_difference']:.1e} |")
  for note in notes:
    print(f"note: {note}")
  os.makedirs(os.path.dirname(_OUT.value) or ".", exist_ok=True)
  with open(_OUT.value, "w") as f:
    json.dump(dict(
        benchmark="gpu_search", backend=backend, device_kind=device_kind,
        devices=[str(d) for d in jax.devices()], num_devices=devices,
        mesh=mesh_lib.describe(mesh), jax_version=jax.__version__,
        default_matmul_precision=precision, smoke=smoke, num_docs=n, num_queries=nq,
        dim=dim, k=k, chunk_size=_CHUNK.value, rows_per_device=rows, chunks=num_chunks,
        query_batches=batches, query_batch_rows=qb, repeats=_REPEATS.value,
        check_queries=check, reference_s=reference_s, notes=notes, results=results),
        f, indent=2)
  print(f"wrote {_OUT.value}")
  failed = [r["dtype"] for r in results if r["check"]["passed"] is False]
  if failed:
    raise SystemExit(f"error: the top-{k} check failed for {', '.join(failed)} (see "
                     f"{_OUT.value})")


if __name__ == "__main__":
  from mocheg_jax.utils import host_memory
  host_memory.keep_freed_memory_if_asked()  # Both sides alike (mocheg_jax/utils/host_memory.py).
  app.run(main)
