r"""float32 against bfloat16 products on this CPU, at the small main job's own shapes.

  python benchmarks/bench_precision.py [--stages=retrieval_text,classifier,explain] \
      [--batches=4] [--sentences=2000] [--scale=small] [--data_dir=DIR] \
      [--out=benchmarks/precision.json]

Why: the main job's `--matmul_precision=auto` takes bfloat16 products where they were
measured to pay (models/matmul.py: `auto_precision`), and whether they pay depends on the
CPU's bfloat16 instructions (AMX tiles, AVX-512 BF16 dot products, or none) and on the
widths of a stage's products. This measures it for the CPU it runs on, side by side:
- each named stage's training step (configs/STAGE.py:SCALE on that synthetic world,
  prepared in --data_dir or in a temporary folder: about a minute for `small`; `tiny` is
  for smoke runs, its figures are not the job's): the task's own loss and
  gradient at fresh random weights, jitted once per precision (the setting is read while
  tracing), on --batches of its own training batches; a first pass compiles every batch
  shape at both precisions, a second times them interleaved batch by batch (float32, then
  bfloat16, on batch 1, then on batch 2, ...), so that load changes hit both alike;
- MiniLM sentence encoding (the packaged all-MiniLM-L6-v2, what indexing the KB and the
  verifier's feature store run), --sentences sentences, best of 3 interleaved runs.
Printed and written: per row the float32 and bfloat16 seconds and their ratio (bfloat16 /
float32: below 1 is faster), with the CPU's bfloat16 flags. Not a test.
"""

from __future__ import annotations

if __name__ == "__main__":  # First: a re-exec keeps nothing done before it.
  from mocheg_jax.utils import allocator
  allocator.run_under_preferred_allocator()

import json
import os
import platform
import sys
import tempfile
import time

import numpy as np
from absl import app
from absl import flags

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:  # `python benchmarks/NAME.py` from anywhere: `benchmarks.timing`.
  sys.path.insert(0, _REPO)

STAGES = ("retrieval_text", "classifier", "explain")  # Stages whose tasks need only the world.
PRECISIONS = ("float32", "bfloat16")

_STAGES = flags.DEFINE_list("stages", list(STAGES), f"Training steps timed, from {STAGES}.")
_BATCHES = flags.DEFINE_integer("batches", 4, "Training batches timed per stage.",
                                lower_bound=1)
_SENTENCES = flags.DEFINE_integer("sentences", 2000, "Sentences encoded (0: no encoding row).",
                                  lower_bound=0)
_SCALE = flags.DEFINE_enum("scale", "small", ["tiny", "small"], "The world and stage configs.")
_DATA_DIR = flags.DEFINE_string("data_dir", "", "A prepared world of --scale (default: a new "
                                "one in a temporary folder).")
_OUT = flags.DEFINE_string("out", "benchmarks/precision.json", "JSON output.")


def _row(name: str, seconds: dict[str, float], detail: dict) -> dict:
  return {"row": name, **{f"{p}_s": round(seconds[p], 4) for p in PRECISIONS},
          "bfloat16_over_float32": round(seconds["bfloat16"] / seconds["float32"], 3),
          **detail}


def time_stage(stage: str, scale: str, data_dir: str, batches: int) -> dict:
  """The median training step of configs/STAGE.py:SCALE at each precision (interleaved)."""
  import jax
  from benchmarks.timing import interleaved_seconds, loss_and_grad_step

  from mocheg_jax.train.task import resolve
  from mocheg_jax.utils import configs

  config = configs.stage_config(stage, scale, data_dir, 0)
  task = resolve(config.task)(config, os.path.join(data_dir, f"bench_precision_{stage}"))
  steps = {p: loss_and_grad_step(task) for p in PRECISIONS}  # One jit cache each.
  data = iter(task.train_data(config.batch_size))
  inputs = [{k: np.asarray(v) for k, v in next(data).items()} for _ in range(batches)]

  def at(precision: str):
    def run(batch):
      with jax.default_matmul_precision(precision):
        steps[precision](batch)
    return run

  first, times = interleaved_seconds({p: at(p) for p in PRECISIONS}, inputs)
  return _row(f"{stage} training step (batch {config.batch_size})",
              {p: float(np.median(t)) for p, t in times.items()},
              {"first_calls_s": {p: [round(x, 2) for x in v] for p, v in first.items()}})


def time_encoding(sentences: int) -> dict:
  """MiniLM encoding of the benchmark sentences at each precision (best of 3, interleaved)."""
  import jax
  from benchmarks.sample_text import sentences as make_sentences

  from mocheg_jax.data.tokenizers import minilm_dir
  from mocheg_jax.models import sentence_transformers as st

  model, texts = st.load(minilm_dir()), make_sentences(sentences)

  def encode(precision: str):
    with jax.default_matmul_precision(precision):
      return model.encode(texts, batch_size=64)

  out = {p: encode(p) for p in PRECISIONS}  # Compiles every bucket at both precisions.
  cosine = (out["float32"] * out["bfloat16"]).sum(1) / (
      np.linalg.norm(out["float32"], axis=1) * np.linalg.norm(out["bfloat16"], axis=1))
  best = {p: float("inf") for p in PRECISIONS}
  for _ in range(3):
    for p in PRECISIONS:
      start = time.perf_counter()
      encode(p)
      best[p] = min(best[p], time.perf_counter() - start)
  return _row(f"MiniLM encoding ({sentences} sentences, batch 64)", best,
              {"min_cosine": round(float(cosine.min()), 6)})


def main(argv):
  del argv
  from mocheg_jax.data import prepare
  from mocheg_jax.models.matmul import cpu_bfloat16_flags

  unknown = sorted(set(_STAGES.value) - set(STAGES))
  if unknown:
    raise app.UsageError(f"--stages: unknown {unknown}; expected names from {STAGES}")
  rows = []
  if _SENTENCES.value:
    rows.append(time_encoding(_SENTENCES.value))
  with tempfile.TemporaryDirectory() as scratch:
    data_dir = _DATA_DIR.value or scratch
    if _STAGES.value:
      prepare.prepare(data_dir, scale=_SCALE.value, seed=0, log=print)
    rows.extend(time_stage(stage, _SCALE.value, data_dir, _BATCHES.value)
                for stage in _STAGES.value)
  flags_found = list(cpu_bfloat16_flags())
  print(f"CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"bfloat16 flags: {', '.join(flags_found) or 'none'}")
  print("| row | float32 s | bfloat16 s | bfloat16 / float32 |")
  print("|---|---:|---:|---:|")
  for r in rows:
    print(f"| {r['row']} | {r['float32_s']:.3f} | {r['bfloat16_s']:.3f} | "
          f"{r['bfloat16_over_float32']:.2f}x |")
  result = {"scale": _SCALE.value, "cpu_bfloat16_flags": flags_found,
            "cpu_count": os.cpu_count(), "platform": platform.platform(), "rows": rows,
            "loadavg_after": os.getloadavg()}
  os.makedirs(os.path.dirname(_OUT.value) or ".", exist_ok=True)
  with open(_OUT.value, "w", encoding="utf-8") as f:
    json.dump(result, f, indent=2)
  print(f"wrote {_OUT.value}")


if __name__ == "__main__":
  app.run(main)
