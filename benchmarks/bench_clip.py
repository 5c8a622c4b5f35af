"""CLIP image encoding, side by side: ours (jitted Flax NNX) vs transformers' CLIPModel.

  python benchmarks/bench_clip.py [--batch=32 --iters=10 --out=benchmarks/out/clip.json]

Both run ViT-B/32 (CLIPConfig() defaults: vision hidden 768, 12 layers, patch 32, image 224)
with the same random weights: transformers initialises a CLIPModel, saves it as safetensors,
and our loader reads that folder. Same pixels (ours channels-last, torch channels-first),
float32, CPU, one process; torch uses torch.set_num_threads(os.cpu_count()) and XLA its
default (all cores). Each side is warmed up (compiled) first; the figure is the median of
`iters` timed batches, the two sides alternating batch by batch so that other load on the
machine hits both alike. Prints a table with the ratio ours/reference (images/s; > 1 means
we are faster), also in process CPU seconds, and writes JSON. The target is >= 1.0x.
"""

from __future__ import annotations

if __name__ == "__main__":  # First: a re-exec keeps nothing done before it.
  from mocheg_jax.utils import allocator
  allocator.run_under_preferred_allocator()

import json
import os
import platform
import statistics
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from absl import app, flags  # noqa: E402

_BATCH = flags.DEFINE_integer("batch", 32, "Images per batch.")
_ITERS = flags.DEFINE_integer("iters", 10, "Timed batches per side (median reported).")
_WARMUP = flags.DEFINE_integer("warmup", 2, "Untimed batches per side first.")
_OUT = flags.DEFINE_string("out", "benchmarks/out/clip.json", "JSON results file.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the random weights and pixels.")


def _time_interleaved(fns, warmup: int, iters: int) -> list[tuple[list[float], list[float]]]:
  """(wall seconds, process CPU seconds) per call of each fn, alternating between them.

  Alternating shares whatever else the machine is doing fairly between the sides (CI
  machines are often busy); CPU seconds (all threads of this process) are a second view
  that load does not inflate.
  """
  for _ in range(warmup):
    for fn in fns:
      fn()
  results = [([], []) for _ in fns]
  for _ in range(iters):
    for fn, (wall, cpu) in zip(fns, results):
      start, start_cpu = time.perf_counter(), time.process_time()
      fn()
      wall.append(time.perf_counter() - start)
      cpu.append(time.process_time() - start_cpu)
  return results


def main(argv: list[str]) -> None:
  del argv
  import jax
  import numpy as np
  import torch
  import transformers
  from flax import nnx

  from mocheg_jax.models.hf import clip as hf_clip

  threads = os.cpu_count() or 1
  torch.set_num_threads(threads)
  torch.manual_seed(_SEED.value)
  config = transformers.CLIPConfig()  # ViT-B/32 sizes.
  reference = transformers.CLIPModel(config).eval()
  with tempfile.TemporaryDirectory() as folder:
    reference.save_pretrained(folder, safe_serialization=True)
    ours = hf_clip.load(folder)

  vision = config.vision_config
  batch = _BATCH.value
  pixels = np.random.default_rng(_SEED.value).normal(
      size=(batch, vision.image_size, vision.image_size, vision.num_channels)
  ).astype(np.float32)
  pixels_nchw = torch.from_numpy(np.ascontiguousarray(pixels.transpose(0, 3, 1, 2)))
  pixels_jax = jax.device_put(pixels)

  encode = nnx.jit(lambda model, x: model.encode_image(x))

  def run_ours():
    return encode(ours, pixels_jax).block_until_ready()

  def run_reference():
    with torch.inference_mode():
      return reference.get_image_features(pixel_values=pixels_nchw).pooler_output

  load_before = os.getloadavg()[0]
  max_diff = float(np.abs(np.asarray(run_ours()) - run_reference().numpy()).max())
  (ours_times, ours_cpu), (reference_times, reference_cpu) = _time_interleaved(
      [run_ours, run_reference], _WARMUP.value, _ITERS.value)

  ours_ips = batch / statistics.median(ours_times)
  reference_ips = batch / statistics.median(reference_times)
  ratio = ours_ips / reference_ips
  cpu_ratio = statistics.median(reference_cpu) / statistics.median(ours_cpu)
  rows = [("ours (jax, jit)", ours_ips, ours_times, ours_cpu),
          ("transformers (torch)", reference_ips, reference_times, reference_cpu)]
  print(f"CLIP ViT-B/32 image encoding, batch {batch}, float32, CPU ({threads} threads), "
        f"load average before: {load_before:.1f}")
  print(f"{'':24s} {'images/s':>10s} {'s/batch':>10s} {'cpu s/batch':>12s}")
  for name, ips, wall, cpu in rows:
    print(f"{name:24s} {ips:10.2f} {statistics.median(wall):10.3f} "
          f"{statistics.median(cpu):12.3f}")
  print(f"{'ratio ours/reference':24s} {ratio:10.2f}x {'':10s} {cpu_ratio:11.2f}x"
        "   (target >= 1.0x)")
  print(f"max |ours - reference| of the embeddings: {max_diff:.2e}")

  result = {
      "benchmark": "clip_image_encoding", "model": "ViT-B/32 (random weights)",
      "batch": batch, "dtype": "float32", "iters": _ITERS.value, "warmup": _WARMUP.value,
      "ours_images_per_s": ours_ips, "reference_images_per_s": reference_ips,
      "ratio_ours_over_reference": ratio, "target_ratio": 1.0,
      "ours_seconds": ours_times, "reference_seconds": reference_times,
      "ours_cpu_seconds": ours_cpu, "reference_cpu_seconds": reference_cpu,
      "cpu_time_ratio_reference_over_ours": cpu_ratio, "load_average_before": load_before,
      "max_abs_diff": max_diff, "threads": threads, "torch_threads": torch.get_num_threads(),
      "jax": jax.__version__, "torch": torch.__version__,
      "transformers": transformers.__version__, "jax_backend": jax.default_backend(),
      "machine": platform.machine(), "processor": platform.processor(),
  }
  os.makedirs(os.path.dirname(_OUT.value) or ".", exist_ok=True)
  with open(_OUT.value, "w") as f:
    json.dump(result, f, indent=2)
  print(f"wrote {_OUT.value}")


if __name__ == "__main__":
  from mocheg_jax.utils import host_memory
  host_memory.keep_freed_memory_if_asked()  # Both sides alike (mocheg_jax/utils/host_memory.py).
  app.run(main)
