r"""Length buckets on CPU: a training step on batches cut to their longest row against the same
batches padded to the config's maximum lengths; with --mode=groups, length-grouped batches
(data/length_groups.py) against batches drawn freely.

  python benchmarks/bench_length_buckets.py [--stages=retrieval_text,explain] \
      [--data_dir=DIR] [--batches=4] [--out=benchmarks/length_buckets.json]
  python benchmarks/bench_length_buckets.py --mode=groups --stages=rerank,explain \
      [--groups=50] [--batches=8] --out=benchmarks/length_groups.json

For each stage, the `small` config's task on the small synthetic world (prepared in
--data_dir, or in a temporary folder: about a minute) gives --batches training batches in
length buckets (the config's `length_multiple`, or --multiple where the config has none);
each is also padded back to the config's widths (max_query_len / max_doc_len,
max_source_len / max_target_len). One jitted loss-and-gradient program (the task's own loss,
randomly initialised weights, dropout on) runs on both, interleaved (full, cut, full, cut,
...) so load changes hit both sides; a first pass over all batches compiles (its seconds per
new shape are reported), a second is timed. Printed and written: the widths met, the median
step of each side and their ratio (cut / full), and the compile seconds, per stage.

--mode=groups: the two sides are different batches of the same task: the first --batches of
the config's training input drawn freely, padded as the config pads them (the reranker's to
max_len, as before its length buckets), against the first --batches of the same input in
length groups of --groups batches, cut to the next multiple of the config's length_multiple
(--multiple where it has none) of their longest.
"""

from __future__ import annotations

if __name__ == "__main__":  # First: a re-exec keeps nothing done before it.
  from mocheg_jax.utils import allocator
  allocator.run_under_preferred_allocator()

import json
import os
import sys
import tempfile
import time

import numpy as np
from absl import app
from absl import flags

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:  # `python benchmarks/NAME.py` from anywhere: `benchmarks.timing`.
  sys.path.insert(0, _REPO)

_STAGES = flags.DEFINE_list("stages", ["retrieval_text", "explain"],
                            "Stages whose training step is timed.")
_DATA_DIR = flags.DEFINE_string("data_dir", "", "A prepared small world (default: a new one "
                                "in a temporary folder).")
_BATCHES = flags.DEFINE_integer("batches", 4, "Training batches per side.", lower_bound=1)
_MULTIPLE = flags.DEFINE_integer("multiple", 32, "Bucket multiple where the config has none.",
                                 lower_bound=1)
_OUT = flags.DEFINE_string("out", "benchmarks/length_buckets.json", "JSON output.")
_MODE = flags.DEFINE_enum("mode", "cut", ["cut", "groups"], "cut: the same batches cut and "
                          "padded; groups: length-grouped batches against free ones.")
_PRECISION = flags.DEFINE_enum("matmul_precision", "float32", ["float32", "bfloat16"],
                               "Matrix-product precision of the timed steps (the main job "
                               "takes bfloat16 on CPUs with AMX, the reranker excepted).")
_GROUPS = flags.DEFINE_integer("groups", 50, "--mode=groups: batches per sorted megabatch.",
                               lower_bound=1)

# Per stage: the config section holding `length_multiple`, and each mask's full width.
_LAYOUT = {
    "retrieval_text": ("retrieval", {"query_mask": "max_query_len",
                                     "positive_mask": "max_doc_len",
                                     "negative_mask": "max_doc_len"}),
    "explain": ("explain", {"source_mask": "max_source_len", "target_mask": "max_target_len"}),
    "rerank": ("rerank", {"attention_mask": "max_len"}),  # --mode=groups only.
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


def _task(name: str, data_dir: str, multiple: int, groups: int):
  """The stage's `small` config and task with these length settings."""
  from mocheg_jax.train.task import resolve
  from mocheg_jax.utils import configs

  config = configs.stage_config(name, "small", data_dir, 0)
  config[_LAYOUT[name][0]].length_multiple = multiple
  config.data.length_groups = groups
  return config, resolve(config.task)(config, os.path.join(data_dir, f"bench_{name}"))


def _first_batches(task, config, count: int) -> list[dict]:
  data = iter(task.train_data(config.batch_size))
  return [{k: np.asarray(v) for k, v in next(data).items()} for _ in range(count)]


def _time_interleaved(task, sides: dict[str, list[dict]], masks) -> tuple[dict, dict]:
  """Median seconds of one jitted loss-and-gradient step per side (the sides' batches
  interleaved, after a first pass that compiles) and the first call's seconds per new
  shape of `masks`' widths."""
  from benchmarks.timing import loss_and_grad_step

  step = loss_and_grad_step(task)

  def run(batch) -> float:
    start = time.perf_counter()
    step(batch)
    return time.perf_counter() - start

  names = list(sides)
  rounds = list(zip(*sides.values()))
  compile_s = {}
  for batches in rounds:  # Pass 1: compiles.
    for b in batches:
      shape = str(tuple(b[m].shape[1] for m in masks))
      seconds = run(b)
      compile_s.setdefault(shape, round(seconds, 2))
  times = {name: [] for name in names}
  for batches in rounds:  # Pass 2: timed.
    for name, b in zip(names, batches):
      times[name].append(run(b))
  return times, compile_s


def bench_stage(name: str, data_dir: str, batches: int, multiple: int) -> dict:
  from mocheg_jax.utils import configs

  section_name, width_fields = _LAYOUT[name]
  section = configs.stage_config(name, "small", data_dir, 0)[section_name]
  widths = {mask: int(section[field]) for mask, field in width_fields.items()}
  multiple = section.length_multiple or multiple
  config, task = _task(name, data_dir, multiple, 0)
  cut = _first_batches(task, config, batches)
  full = [_padded(b, widths, _PAD_ID[name]) for b in cut]
  times, compile_s = _time_interleaved(task, {"full": full, "cut": cut}, widths)
  medians = {k: float(np.median(v)) for k, v in times.items()}
  return {"stage": name, "batch_size": int(config.batch_size),
          "length_multiple": int(multiple), "full_widths": widths,
          "cut_widths": [{m: int(b[m].shape[1]) for m in widths} for b in cut],
          "full_step_s": round(medians["full"], 4), "cut_step_s": round(medians["cut"], 4),
          "ratio_cut_over_full": round(medians["cut"] / medians["full"], 3),
          "first_call_s_by_widths": compile_s,
          "steps_s": {k: [round(x, 4) for x in v] for k, v in times.items()}}


def bench_groups(name: str, data_dir: str, batches: int, multiple: int, groups: int
                 ) -> dict:
  """Length-grouped batches against free ones (--mode=groups)."""
  from mocheg_jax.utils import configs

  masks = list(_LAYOUT[name][1])
  shipped = configs.stage_config(name, "small", data_dir, 0)[_LAYOUT[name][0]]
  free_multiple = 0 if name == "rerank" else shipped.length_multiple
  cut_multiple = shipped.length_multiple or multiple
  config, free_task = _task(name, data_dir, free_multiple, 0)
  free = _first_batches(free_task, config, batches)
  _, grouped_task = _task(name, data_dir, cut_multiple, groups)
  grouped = _first_batches(grouped_task, config, batches)
  times, compile_s = _time_interleaved(free_task, {"free": free, "grouped": grouped}, masks)
  medians = {k: float(np.median(v)) for k, v in times.items()}
  widths = lambda side: [{m: int(b[m].shape[1]) for m in masks} for b in side]  # noqa: E731
  return {"stage": name, "batch_size": int(config.batch_size), "groups": groups,
          "free_length_multiple": int(free_multiple), "length_multiple": int(cut_multiple),
          "free_widths": widths(free), "grouped_widths": widths(grouped),
          "free_step_s": round(medians["free"], 4),
          "grouped_step_s": round(medians["grouped"], 4),
          "ratio_grouped_over_free": round(medians["grouped"] / medians["free"], 3),
          "first_call_s_by_widths": compile_s,
          "steps_s": {k: [round(x, 4) for x in v] for k, v in times.items()}}


def _print_cut(rows: list[dict]) -> None:
  print("| stage | batch | full widths | cut widths | full step s | cut step s | cut / full |")
  print("|---|---:|---|---|---:|---:|---:|")
  for r in rows:
    cut = sorted({tuple(w.values()) for w in r["cut_widths"]})
    print(f"| {r['stage']} | {r['batch_size']} | {tuple(r['full_widths'].values())} | "
          f"{', '.join(map(str, cut))} | {r['full_step_s']:.3f} | {r['cut_step_s']:.3f} | "
          f"{r['ratio_cut_over_full']:.2f}x |")


def _print_groups(rows: list[dict]) -> None:
  print("| stage | batch | groups | free widths (mean) | grouped widths (mean) | free step s | "
        "grouped step s | grouped / free |")
  print("|---|---:|---:|---|---|---:|---:|---:|")
  mean = lambda ws: tuple(round(float(np.mean(c)), 1)  # noqa: E731
                          for c in zip(*(w.values() for w in ws)))
  for r in rows:
    print(f"| {r['stage']} | {r['batch_size']} | {r['groups']} | {mean(r['free_widths'])} | "
          f"{mean(r['grouped_widths'])} | {r['free_step_s']:.3f} | {r['grouped_step_s']:.3f} | "
          f"{r['ratio_grouped_over_free']:.2f}x |")


def main(argv):
  del argv
  import jax
  jax.config.update("jax_default_matmul_precision", _PRECISION.value)
  from mocheg_jax.data import prepare

  with tempfile.TemporaryDirectory() as scratch:
    data_dir = _DATA_DIR.value or scratch
    prepare.prepare(data_dir, scale="small", seed=0, log=print)
    if _MODE.value == "groups":
      rows = [bench_groups(name, data_dir, _BATCHES.value, _MULTIPLE.value, _GROUPS.value)
              for name in _STAGES.value]
    else:
      unknown = set(_STAGES.value) - {"retrieval_text", "explain"}
      if unknown:
        raise app.UsageError(f"--mode=cut times retrieval_text and explain, not {unknown}")
      rows = [bench_stage(name, data_dir, _BATCHES.value, _MULTIPLE.value)
              for name in _STAGES.value]
  (_print_groups if _MODE.value == "groups" else _print_cut)(rows)
  with open(_OUT.value, "w", encoding="utf-8") as f:
    json.dump({"mode": _MODE.value, "matmul_precision": _PRECISION.value, "rows": rows, "loadavg_after": os.getloadavg()}, f,
              indent=2)
  print(f"wrote {_OUT.value}")


if __name__ == "__main__":
  app.run(main)
