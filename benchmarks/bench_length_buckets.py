r"""Length buckets on CPU: a training step on batches cut to their longest row against the same
batches padded to the config's maximum lengths.

  python benchmarks/bench_length_buckets.py [--stages=retrieval_text,explain] \
      [--data_dir=DIR] [--batches=4] [--out=benchmarks/length_buckets.json]

For each stage, the `small` config's task on the small synthetic world (prepared in
--data_dir, or in a temporary folder: about a minute) gives --batches training batches in
length buckets (the config's `length_multiple`, or --multiple where the config has none);
each is also padded back to the config's widths (max_query_len / max_doc_len,
max_source_len / max_target_len). One jitted loss-and-gradient program (the task's own loss,
randomly initialised weights, dropout on) runs on both, interleaved (full, cut, full, cut,
...) so load changes hit both sides; a first pass over all batches compiles (its seconds per
new shape are reported), a second is timed. Printed and written: the widths met, the median
step of each side and their ratio (cut / full), and the compile seconds, per stage.
"""

from __future__ import annotations

if __name__ == "__main__":  # First: a re-exec keeps nothing done before it.
  from mocheg_jax.utils import allocator
  allocator.run_under_preferred_allocator()

import json
import os
import tempfile
import time

import numpy as np
from absl import app
from absl import flags

_STAGES = flags.DEFINE_list("stages", ["retrieval_text", "explain"],
                            "Stages whose training step is timed.")
_DATA_DIR = flags.DEFINE_string("data_dir", "", "A prepared small world (default: a new one "
                                "in a temporary folder).")
_BATCHES = flags.DEFINE_integer("batches", 4, "Training batches per side.", lower_bound=1)
_MULTIPLE = flags.DEFINE_integer("multiple", 32, "Bucket multiple where the config has none.",
                                 lower_bound=1)
_OUT = flags.DEFINE_string("out", "benchmarks/length_buckets.json", "JSON output.")

# Per stage: the config section holding `length_multiple`, and each mask's full width.
_LAYOUT = {
    "retrieval_text": ("retrieval", {"query_mask": "max_query_len",
                                     "positive_mask": "max_doc_len",
                                     "negative_mask": "max_doc_len"}),
    "explain": ("explain", {"source_mask": "max_source_len", "target_mask": "max_target_len"}),
}
_PAD_ID = {"retrieval_text": 0, "explain": 1}  # BERT's [PAD], BART's <pad>.


def _padded(batch: dict, widths: dict[str, int], pad_id: int) -> dict:
  """`batch` with each mask and its ids padded back to the full width."""
  out = dict(batch)
  for mask, width in widths.items():
    ids = mask.replace("_mask", "_ids")
    for name, value in ((mask, 0), (ids, pad_id)):
      extra = width - batch[name].shape[1]
      out[name] = np.pad(batch[name], ((0, 0), (0, extra)), constant_values=value)
  return out


def bench_stage(name: str, data_dir: str, batches: int, multiple: int) -> dict:
  import jax
  from flax import nnx

  from mocheg_jax.train import state as state_lib
  from mocheg_jax.train.task import resolve
  from mocheg_jax.utils import configs

  config = configs.stage_config(name, "small", data_dir, 0)
  section_name, width_fields = _LAYOUT[name]
  section = config[section_name]
  section.length_multiple = section.length_multiple or multiple
  widths = {mask: int(section[field]) for mask, field in width_fields.items()}
  task = resolve(config.task)(config, os.path.join(data_dir, f"bench_{name}"))
  spec = state_lib.ModelSpec.of(task.model)
  params = nnx.to_pure_dict(nnx.state(task.model(), nnx.Param))
  data = iter(task.train_data(config.batch_size))
  cut = [{k: np.asarray(v) for k, v in next(data).items()} for _ in range(batches)]
  full = [_padded(b, widths, _PAD_ID[name]) for b in cut]

  @jax.jit
  def step(params, batch):
    def loss(p):
      return task.loss(spec.merge(p, {}, {}, jax.random.key(0)), batch)
    return jax.value_and_grad(loss, has_aux=True)(params)

  def run(batch) -> float:
    start = time.perf_counter()
    jax.block_until_ready(step(params, batch))
    return time.perf_counter() - start

  compile_s, seen = {}, set()
  for b in (x for pair in zip(full, cut) for x in pair):  # Pass 1: compiles.
    shape = tuple(b[m].shape[1] for m in widths)
    seconds = run(b)
    if shape not in seen:
      seen.add(shape)
      compile_s[str(shape)] = round(seconds, 2)
  times = {"full": [], "cut": []}
  for f, c in zip(full, cut):  # Pass 2: timed.
    times["full"].append(run(f))
    times["cut"].append(run(c))
  medians = {k: float(np.median(v)) for k, v in times.items()}
  return {"stage": name, "batch_size": int(config.batch_size),
          "length_multiple": int(section.length_multiple), "full_widths": widths,
          "cut_widths": [{m: int(b[m].shape[1]) for m in widths} for b in cut],
          "full_step_s": round(medians["full"], 4), "cut_step_s": round(medians["cut"], 4),
          "ratio_cut_over_full": round(medians["cut"] / medians["full"], 3),
          "first_call_s_by_widths": compile_s,
          "steps_s": {k: [round(x, 4) for x in v] for k, v in times.items()}}


def main(argv):
  del argv
  from mocheg_jax.data import prepare

  with tempfile.TemporaryDirectory() as scratch:
    data_dir = _DATA_DIR.value or scratch
    prepare.prepare(data_dir, scale="small", seed=0, log=print)
    rows = [bench_stage(name, data_dir, _BATCHES.value, _MULTIPLE.value)
            for name in _STAGES.value]
  print("| stage | batch | full widths | cut widths | full step s | cut step s | cut / full |")
  print("|---|---:|---|---|---:|---:|---:|")
  for r in rows:
    cut = sorted({tuple(w.values()) for w in r["cut_widths"]})
    print(f"| {r['stage']} | {r['batch_size']} | {tuple(r['full_widths'].values())} | "
          f"{', '.join(map(str, cut))} | {r['full_step_s']:.3f} | {r['cut_step_s']:.3f} | "
          f"{r['ratio_cut_over_full']:.2f}x |")
  with open(_OUT.value, "w", encoding="utf-8") as f:
    json.dump({"rows": rows, "loadavg_after": os.getloadavg()}, f, indent=2)
  print(f"wrote {_OUT.value}")


if __name__ == "__main__":
  app.run(main)
