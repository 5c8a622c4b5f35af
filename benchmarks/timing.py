"""The accelerator benchmarks' timer (a module without absl flags, so any script imports it)."""

from __future__ import annotations

import time


def best_time(fn, *args, repeats: int) -> float:
  """Best wall seconds of `repeats` calls of fn(*args) after one warm-up (compilation and
  first transfers), each waited on until its outputs are ready."""
  import jax
  jax.block_until_ready(fn(*args))
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    best = min(best, time.perf_counter() - start)
  return best
