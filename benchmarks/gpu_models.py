"""Model-zoo throughput and achieved TFLOP/s on an accelerator (JAX only, random weights).

  python benchmarks/gpu_models.py [--dtype=bfloat16] [--out=benchmarks/out/gpu_models.json]

Figures: MiniLM-L6 sentence encoding (batch 256 x 128 tokens), CLIP ViT-B/32 image
encoding (batch 256), BART-large greedy decoding (batch 1 and 64, 128 new tokens). FLOPs
are the matrix products of each traced program (mocheg_jax/utils/flops.py); XLA's cost
analysis is recorded beside them, but on a GPU it leaves out the GEMMs that become library
calls (cuBLAS), so it undercounts there (30x for MiniLM on an H200). Times are the best of
--repeats after a warm-up. Fails loudly unless JAX sees a GPU/TPU (`--smoke` runs tiny shapes on any
backend, to check the script itself). Writes JSON and prints a table. Installs nothing.
"""

from __future__ import annotations

import json
import os
import sys
import time

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:  # `python benchmarks/gpu_models.py` from anywhere.
  sys.path.insert(0, _REPO)

from absl import app, flags  # noqa: E402

from benchmarks import timing  # noqa: E402

_DTYPE = flags.DEFINE_enum("dtype", "bfloat16", ["bfloat16", "float32"], "Compute dtype.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed runs per figure (best is kept).")
_SMOKE = flags.DEFINE_bool("smoke", False, "Tiny shapes on any backend (checks the script).")
_OUT = flags.DEFINE_string("out", "benchmarks/out/gpu_models.json", "JSON output path.")


def _xla_flops(jitted, *args) -> float:
  analysis = jitted.lower(*args).compile().cost_analysis()
  if isinstance(analysis, (list, tuple)):  # Older JAX returns one dict per device.
    analysis = analysis[0]
  return float(analysis.get("flops", 0.0))


def _figure(name, graphdef_state_fn, args, items: int, unit: str, repeats: int) -> dict:
  import jax

  from mocheg_jax.utils.flops import matmul_flops
  jitted = jax.jit(graphdef_state_fn)
  seconds = timing.best_time(jitted, *args, repeats=repeats)
  flops = matmul_flops(graphdef_state_fn, *args)
  return {"figure": name, "seconds": seconds, f"{unit}_per_s": items / seconds,
          "tflops_per_s": flops / seconds / 1e12, "flops": flops,
          "xla_flops": _xla_flops(jitted, *args)}


def main(argv):
  del argv
  import jax
  import jax.numpy as jnp
  import numpy as np
  from flax import nnx

  from mocheg_jax.models import bart, bert, clip, decoding

  backend = jax.default_backend()
  if backend not in ("gpu", "cuda", "rocm", "tpu") and not _SMOKE.value:
    raise SystemExit(f"error: JAX sees no accelerator (backend {backend!r}, devices "
                     f"{jax.devices()}); install jax with CUDA support or pass --smoke")
  dtype = jnp.bfloat16 if _DTYPE.value == "bfloat16" else jnp.float32
  smoke, repeats = _SMOKE.value, _REPEATS.value
  rng = np.random.default_rng(0)
  results = []

  # MiniLM-L6 (all-MiniLM-L6-v2 shapes).
  minilm = bert.BertConfig.from_hf(dict(
      model_type="bert", vocab_size=30522, hidden_size=384, num_hidden_layers=6,
      num_attention_heads=12, intermediate_size=1536, max_position_embeddings=512))
  encoder = bert.SentenceEncoder(minilm, dtype=dtype, rngs=nnx.Rngs(0))
  gd, st = nnx.split(encoder)
  batch, length = (8, 16) if smoke else (256, 128)
  ids = jnp.asarray(rng.integers(1000, 30000, (batch, length)), jnp.int32)
  mask = jnp.ones((batch, length), jnp.int32)
  results.append(_figure("minilm_encode", lambda s, i, m: nnx.merge(gd, s)(i, m),
                         (st, ids, mask), batch, "sentences", repeats))

  # CLIP ViT-B/32 image tower (transformers' CLIPConfig defaults).
  config = clip.CLIPConfig.from_hf({"model_type": "clip"})
  model = clip.CLIPModel(config, dtype=dtype, rngs=nnx.Rngs(0))
  gd_c, st_c = nnx.split(model)
  n = 4 if smoke else 256
  size = config.vision.image_size
  pixels = jnp.asarray(rng.normal(size=(n, size, size, 3)), jnp.float32)
  results.append(_figure("clip_image_encode",
                         lambda s, p: nnx.merge(gd_c, s).encode_image(p), (st_c, pixels), n,
                         "images", repeats))

  # BART-large greedy decoding.
  large = dict(model_type="bart", vocab_size=50265, d_model=1024, encoder_layers=12,
               decoder_layers=12, encoder_attention_heads=16, decoder_attention_heads=16,
               encoder_ffn_dim=4096, decoder_ffn_dim=4096, max_position_embeddings=1024)
  if smoke:
    large.update(vocab_size=512, d_model=64, encoder_layers=2, decoder_layers=2,
                 encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                 decoder_ffn_dim=128)
  generator = bart.Bart(bart.BartConfig.from_hf(large), dtype=dtype, rngs=nnx.Rngs(0))
  new_tokens = 8 if smoke else 128
  for b in (1, 64):
    src = jnp.asarray(rng.integers(4, large["vocab_size"], (b, 16 if smoke else 256)), jnp.int32)
    src_mask = jnp.ones_like(src)
    start = time.perf_counter()
    out = decoding.generate(generator, src, src_mask, max_length=new_tokens + 1,
                            min_length=new_tokens + 1, num_beams=1)
    jax.block_until_ready(out.sequences)
    first = time.perf_counter() - start
    best = float("inf")
    for _ in range(repeats):
      start = time.perf_counter()
      jax.block_until_ready(decoding.generate(
          generator, src, src_mask, max_length=new_tokens + 1, min_length=new_tokens + 1,
          num_beams=1).sequences)
      best = min(best, time.perf_counter() - start)
    results.append({"figure": f"bart_large_greedy_batch{b}", "seconds": best,
                    "tokens_per_s": b * new_tokens / best, "first_call_s": first})

  print(f"backend {backend}, devices {jax.devices()}, dtype {_DTYPE.value}")
  print("| figure | seconds | throughput | TFLOP/s |\n|---|---|---|---|")
  for r in results:
    rate = next(f"{v:,.1f} {k[:-6]}/s" for k, v in r.items() if k.endswith("_per_s")
                and not k.startswith("tflops"))
    tflops = f"{r['tflops_per_s']:.1f}" if "tflops_per_s" in r else "-"
    print(f"| {r['figure']} | {r['seconds']:.4f} | {rate} | {tflops} |")
  os.makedirs(os.path.dirname(_OUT.value) or ".", exist_ok=True)
  with open(_OUT.value, "w") as f:
    json.dump({"backend": backend, "devices": [str(d) for d in jax.devices()],
               "dtype": _DTYPE.value, "smoke": smoke, "results": results}, f, indent=2)
  print(f"wrote {_OUT.value}")


if __name__ == "__main__":
  from mocheg_jax.utils import host_memory
  host_memory.keep_freed_memory_if_asked()  # Both sides alike (mocheg_jax/utils/host_memory.py).
  app.run(main)
