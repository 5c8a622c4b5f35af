r"""BART decoding throughput: ours (the whole loop one XLA program) vs transformers `generate`.

  python benchmarks/bench_bart.py [--d_model=768 --layers=6 --batch=8 --source_length=128 \
      --new_tokens=64 --num_beams=1 --repeats=3]

Both sides run in this process on the same random weights (a bart-base-sized config by
default, created with transformers and loaded by our converter), the same inputs and the
same settings: greedy (or --num_beams beam search), KV cache on (HF use_cache=True),
min_length = max_length so every row generates exactly --new_tokens tokens (the last one
the forced EOS). Each side is warmed up once (our warm-up includes XLA compilation, timed
separately), then timed --repeats times; the median is reported. torch uses
torch.set_num_threads(--threads, default: all CPUs); XLA's CPU client uses all CPUs.
Prints a table and writes JSON to --out. Not a test.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time

from absl import app, flags

_D_MODEL = flags.DEFINE_integer("d_model", 768, "Model width (bart-base: 768).")
_LAYERS = flags.DEFINE_integer("layers", 6, "Encoder and decoder layers each.")
_HEADS = flags.DEFINE_integer("heads", 12, "Attention heads.")
_FFN = flags.DEFINE_integer("ffn", 3072, "Feed-forward width.")
_VOCAB = flags.DEFINE_integer("vocab", 50265, "Vocabulary size.")
_BATCH = flags.DEFINE_integer("batch", 8, "Sources per batch.")
_SOURCE = flags.DEFINE_integer("source_length", 128, "Source tokens per row.")
_NEW = flags.DEFINE_integer("new_tokens", 64, "Tokens generated per row.")
_BEAMS = flags.DEFINE_integer("num_beams", 1, "1: greedy; more: beam search.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed runs per side.")
_THREADS = flags.DEFINE_integer("threads", None, "torch threads (default: all CPUs).")
_OUT = flags.DEFINE_string("out", "benchmarks/out/bart.json", "JSON output path.")


def _timed(fn, repeats: int) -> list[float]:
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return times


def main(argv: list[str]) -> None:
  del argv
  import jax
  import numpy as np
  import torch
  import transformers

  from mocheg_jax.models import decoding
  from mocheg_jax.models.hf import bart as hf_bart

  threads = _THREADS.value or os.cpu_count()
  torch.set_num_threads(threads)
  torch.manual_seed(0)
  config = transformers.BartConfig(
      vocab_size=_VOCAB.value, d_model=_D_MODEL.value, encoder_layers=_LAYERS.value,
      decoder_layers=_LAYERS.value, encoder_attention_heads=_HEADS.value,
      decoder_attention_heads=_HEADS.value, encoder_ffn_dim=_FFN.value,
      decoder_ffn_dim=_FFN.value, max_position_embeddings=max(1024, _SOURCE.value))
  reference = transformers.BartForConditionalGeneration(config).eval()
  with tempfile.TemporaryDirectory() as folder:
    reference.save_pretrained(folder, safe_serialization=True)
    ours = hf_bart.load(folder)

  rng = np.random.default_rng(0)
  ids = rng.integers(3, _VOCAB.value, (_BATCH.value, _SOURCE.value))
  mask = np.ones_like(ids)
  max_length = _NEW.value + 1  # The decoder start token counts.
  settings = dict(max_length=max_length, min_length=max_length, num_beams=_BEAMS.value)
  tokens = _BATCH.value * _NEW.value

  torch_ids, torch_mask = torch.tensor(ids), torch.tensor(mask)

  def run_hf():
    with torch.no_grad():
      return reference.generate(input_ids=torch_ids, attention_mask=torch_mask,
                                do_sample=False, use_cache=True, **settings).numpy()

  jax_ids, jax_mask = jax.numpy.asarray(ids, np.int32), jax.numpy.asarray(mask, np.int32)

  def run_ours():
    out = decoding.generate(ours, jax_ids, jax_mask, **settings)
    return np.asarray(jax.block_until_ready(out.sequences))

  start = time.perf_counter()
  ours_tokens = run_ours()  # Compiles.
  compile_s = time.perf_counter() - start
  hf_tokens = run_hf()
  ours_times = _timed(run_ours, _REPEATS.value)
  hf_times = _timed(run_hf, _REPEATS.value)
  same = float((hf_tokens == ours_tokens[:, :hf_tokens.shape[1]]).all(-1).mean())

  ours_s, hf_s = statistics.median(ours_times), statistics.median(hf_times)
  rows = [("ours (JAX, compiled loop)", ours_s, tokens / ours_s),
          ("transformers generate", hf_s, tokens / hf_s)]
  mode = "greedy" if _BEAMS.value == 1 else f"beam {_BEAMS.value}"
  print(f"BART {mode} decoding, d_model={_D_MODEL.value} layers={_LAYERS.value}+"
        f"{_LAYERS.value} vocab={_VOCAB.value}, batch {_BATCH.value} x source "
        f"{_SOURCE.value}, {_NEW.value} new tokens, {threads} torch threads, "
        f"{jax.devices()[0].platform}")
  print(f"{'':28s} {'seconds':>9s} {'tokens/s':>10s}")
  for name, seconds, rate in rows:
    print(f"{name:28s} {seconds:9.3f} {rate:10.1f}")
  ratio = hf_s / ours_s
  print(f"ratio ours/reference (tokens/s): {ratio:.2f}x; identical rows: {same:.0%}; "
        f"our compile: {compile_s:.1f}s")
  result = dict(
      benchmark="bart_decoding", mode=mode, d_model=_D_MODEL.value, layers=_LAYERS.value,
      heads=_HEADS.value, ffn=_FFN.value, vocab=_VOCAB.value, batch=_BATCH.value,
      source_length=_SOURCE.value, new_tokens=_NEW.value, torch_threads=threads,
      cpus=os.cpu_count(), platform=jax.devices()[0].platform,
      ours_seconds=ours_times, reference_seconds=hf_times,
      ours_tokens_per_s=tokens / ours_s, reference_tokens_per_s=tokens / hf_s,
      ratio=ratio, identical_rows=same, ours_compile_seconds=compile_s)
  os.makedirs(os.path.dirname(_OUT.value) or ".", exist_ok=True)
  with open(_OUT.value, "w") as f:
    json.dump(result, f, indent=2)
  print(f"-> {_OUT.value}", file=sys.stderr)


if __name__ == "__main__":
  app.run(main)
