"""The accelerator benchmarks' timer (a module without absl flags, so any script imports it)."""

from __future__ import annotations

import contextlib
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


def loss_and_grad_step(task):
  """A training task's loss and gradient, jitted, at fresh random weights (dropout on): a
  function of a batch that returns once the outputs are ready."""
  import jax
  from flax import nnx

  from mocheg_jax.train import state as state_lib

  spec = state_lib.ModelSpec.of(task.model)
  params = nnx.to_pure_dict(nnx.state(task.model(), nnx.Param))

  @jax.jit
  def step(params, batch):
    def loss(p):
      return task.loss(spec.merge(p, {}, {}, jax.random.key(0)), batch)
    return jax.value_and_grad(loss, has_aux=True)(params)

  return lambda batch: jax.block_until_ready(step(params, batch))


def interleaved_seconds(runs: dict, inputs: list) -> tuple[dict, dict]:
  """(first calls, timed calls): wall seconds of each run on each input, {name: [seconds
  per input]} both. A first pass calls every run on every input (compiling each new shape);
  a second times them interleaved input by input (every run on input 1, then on input 2,
  ...), so that load changes during the benchmark hit every run alike. Each run must
  return once its outputs are ready."""
  def timed(run, batch) -> float:
    start = time.perf_counter()
    run(batch)
    return time.perf_counter() - start

  passes = []
  for _ in range(2):
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for batch in inputs:
      for name, run in runs.items():
        seconds[name].append(timed(run, batch))
    passes.append(seconds)
  return passes[0], passes[1]


PRECISIONS = ("float32", "bfloat16")


def precision_scopes(precision: str):
  """(ours, reference): factories of the context in which each side multiplies at
  `precision`: "float32" throughout (nothing changes), or "bfloat16": ours under
  jax.default_matmul_precision("bfloat16") (bfloat16 operands, float32 sums; on CPU
  mocheg_jax/models/matmul.py does it), PyTorch under CPU autocast to bfloat16 (its linear
  layers and matmuls take bfloat16 operands and return bfloat16)."""
  if precision not in PRECISIONS:
    raise ValueError(f"unknown precision {precision!r}; expected one of {PRECISIONS}")
  if precision == "float32":
    return contextlib.nullcontext, contextlib.nullcontext
  import jax
  import torch
  return (lambda: jax.default_matmul_precision("bfloat16"),
          lambda: torch.autocast("cpu", dtype=torch.bfloat16))
