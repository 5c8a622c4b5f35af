r"""The small generator's source-copying term on CPU: what it costs a training step, over every
row of a batch and over every k-th row (config.explain.reconstruction_row_stride).

  python benchmarks/bench_copy_term.py [--strides=1,2,4] [--batches=6] [--data_dir=DIR] \
      [--out=benchmarks/copy_term.json]

The `small` config's generator task on the small synthetic world (prepared in --data_dir, or
in a temporary folder: about a minute) gives --batches training batches (its own length
buckets). One jitted loss-and-gradient program per variant (the task's own loss, randomly
initialised weights, dropout on): the term off (weight 0), then the shipped weight at each
stride. A first pass compiles every variant on every batch; a second times them
interleaved batch by batch (off, stride 1, stride 2, ... on batch 1, then on batch 2, ...)
so that load changes hit every variant alike. Printed and written: each variant's median
step, its ratio to stride 1, and its first-call seconds (compilation) per batch shape.
"""

from __future__ import annotations

if __name__ == "__main__":  # First: a re-exec keeps nothing done before it.
  from mocheg_jax.utils import allocator
  allocator.run_under_preferred_allocator()

import json
import os
import sys
import tempfile

import numpy as np
from absl import app
from absl import flags

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:  # `python benchmarks/NAME.py` from anywhere: `benchmarks.timing`.
  sys.path.insert(0, _REPO)

_STRIDES = flags.DEFINE_list("strides", ["1", "2", "4"], "Row strides of the copying term.")
_BATCHES = flags.DEFINE_integer("batches", 6, "Training batches timed.", lower_bound=1)
_DATA_DIR = flags.DEFINE_string("data_dir", "", "A prepared small world (default: a new one "
                                "in a temporary folder).")
_OUT = flags.DEFINE_string("out", "benchmarks/copy_term.json", "JSON output.")


def bench(data_dir: str, strides: list[int], batches: int) -> dict:
  from benchmarks.timing import interleaved_seconds, loss_and_grad_step

  from mocheg_jax.train.task import resolve
  from mocheg_jax.utils import configs

  shipped = configs.stage_config("explain", "small", data_dir, 0)
  variants = {"off": (0.0, 1)}
  variants.update({f"stride {k}": (shipped.explain.reconstruction_weight, k) for k in strides})
  steps, task, config = {}, None, None
  for name, (weight, stride) in variants.items():
    config = configs.stage_config("explain", "small", data_dir, 0)
    config.explain.reconstruction_weight = weight
    config.explain.reconstruction_row_stride = stride
    task = resolve(config.task)(config, os.path.join(data_dir, "bench_copy_term"))
    steps[name] = loss_and_grad_step(task)
  data = iter(task.train_data(config.batch_size))  # The same batches for every variant.
  inputs = [{k: np.asarray(v) for k, v in next(data).items()} for _ in range(batches)]

  first, times = interleaved_seconds(steps, inputs)
  compile_s: dict[str, dict[str, float]] = {name: {} for name in steps}
  for i, batch in enumerate(inputs):  # The first call at each new width pair compiled.
    shape = str((batch["source_ids"].shape[1], batch["target_ids"].shape[1]))
    for name in steps:
      compile_s[name].setdefault(shape, round(first[name][i], 2))
  medians = {name: float(np.median(t)) for name, t in times.items()}
  every = medians["stride 1"] if "stride 1" in medians else None
  return {"batch_size": int(config.batch_size),
          "weight": float(shipped.explain.reconstruction_weight),
          "widths": [[int(b["source_ids"].shape[1]), int(b["target_ids"].shape[1])]
                     for b in inputs],
          "rows": [{"variant": name, "median_step_s": round(m, 4),
                    "ratio_to_stride_1": round(m / every, 3) if every else None,
                    "first_call_s_by_widths": compile_s[name],
                    "steps_s": [round(x, 4) for x in times[name]]}
                   for name, m in medians.items()]}


def main(argv):
  del argv
  import jax
  jax.config.update("jax_default_matmul_precision", "float32")
  from mocheg_jax.data import prepare

  strides = [int(s) for s in _STRIDES.value]
  if any(s < 1 for s in strides):
    raise app.UsageError(f"--strides must be >= 1, got {strides}")
  with tempfile.TemporaryDirectory() as scratch:
    data_dir = _DATA_DIR.value or scratch
    prepare.prepare(data_dir, scale="small", seed=0, log=print)
    result = bench(data_dir, strides, _BATCHES.value)
  print("| copying term | median step s | / stride 1 | first call s (mean) |")
  print("|---|---:|---:|---:|")
  for r in result["rows"]:
    ratio = "-" if r["ratio_to_stride_1"] is None else f"{r['ratio_to_stride_1']:.2f}x"
    print(f"| {r['variant']} | {r['median_step_s']:.3f} | {ratio} | "
          f"{np.mean(list(r['first_call_s_by_widths'].values())):.1f} |")
  result["loadavg_after"] = os.getloadavg()
  with open(_OUT.value, "w", encoding="utf-8") as f:
    json.dump(result, f, indent=2)
  print(f"wrote {_OUT.value}")


if __name__ == "__main__":
  app.run(main)
