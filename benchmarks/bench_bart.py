r"""BART decoding throughput: ours (the whole loop one XLA program) vs transformers `generate`.

  python benchmarks/bench_bart.py [--sizes=base,small --batch=8 --source_length=128 \
      --new_tokens=64 --num_beams=1 --do_sample --max_length=N --repeats=3 --threads=N]

Both sides run in this process on the same random weights (created with transformers and
loaded by our converter), the same inputs and the same settings: greedy (or --num_beams
beam search, or --do_sample sampling), KV cache on (HF use_cache=True), min_length =
max_length so every row generates exactly --new_tokens tokens (the last one the forced
EOS). Sizes: `base` is bart-base (768-d, 6+6 layers, 50k vocabulary), `small` a 256-d 3+3
model.

--max_length emulates generation to a larger limit whose texts end well before it (the
paper's evaluation decodes to 400 tokens; rulings are far shorter): both sides get that
max_length, min_length --new_tokens and an EOS logit bias of +100, so every row still ends
with EOS at its --new_tokens-th token (EOS is banned before by min_length, and wins from
there on), while the generation is set up for max_length (our KV cache, buffers and loop).

Each side is warmed up once (ours includes XLA compilation, reported apart), then the two
are timed alternately --repeats times and the best time of each is used, which resists
load from other processes. torch uses torch.set_num_threads(--threads, default all
CPUs); XLA's CPU client uses all CPUs. For one core each:
`taskset -c 0 python benchmarks/bench_bart.py --threads=1`. On a machine busy with other
work, multi-threaded torch slows down far more than XLA does (spinning worker threads), so
compare there with one core each. Prints a table and writes JSON to --out. Not a test.
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

from absl import app, flags

SIZES = {
    # name: (d_model, layers each side, heads, ffn, vocab)
    "base": (768, 6, 12, 3072, 50265),  # bart-base: memory-bound on a CPU (both sides).
    "small": (256, 3, 4, 1024, 8192),  # Per-step overhead shows.
}
_SIZES = flags.DEFINE_list("sizes", ["base", "small"], f"Model sizes from {sorted(SIZES)}.")
_BATCH = flags.DEFINE_integer("batch", 8, "Sources per batch.")
_SOURCE = flags.DEFINE_integer("source_length", 128, "Source tokens per row.")
_NEW = flags.DEFINE_integer("new_tokens", 64, "Tokens generated per row.")
_BEAMS = flags.DEFINE_integer("num_beams", 1, "1: greedy; more: beam search.")
_SAMPLE = flags.DEFINE_bool(
    "do_sample", False, "Sample from the full distribution on both sides (top_k 0, top_p 1, "
    "as the REINFORCE step does) instead of greedy; needs --num_beams=1. Rows then differ "
    "between the sides (different generators), so 'same rows' means nothing.")
_MAX_LENGTH = flags.DEFINE_integer(
    "max_length", None, "Generation limit counting the start token (default: --new_tokens "
    "+ 1); larger: rows end early with EOS (module docstring).")
_SEGMENT = flags.DEFINE_integer(
    "cache_segment", None, "Our decoding loop's first KV-cache segment (default: the "
    "library's; 0: one loop over a max_length cache, as before segments).")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed runs per side (interleaved).")
_THREADS = flags.DEFINE_integer("threads", None, "torch threads (default: all CPUs).")
_OUT = flags.DEFINE_string("out", "benchmarks/out/bart.json", "JSON output path.")


EOS_BIAS = 100.0  # With --max_length: EOS wins at once when min_length allows it.


def _max_length() -> int:
  """The generation limit in effect (the start token counted): --max_length when it is
  above the default --new_tokens + 1."""
  return max(_MAX_LENGTH.value or 0, _NEW.value + 1)


def bench_size(name: str) -> dict:
  """One model size: both sides, same weights, inputs and settings; interleaved timing."""
  import jax
  import numpy as np
  import torch
  import transformers

  from mocheg_jax.models import decoding
  from mocheg_jax.models.hf import bart as hf_bart

  d_model, layers, heads, ffn, vocab = SIZES[name]
  torch.manual_seed(0)
  config = transformers.BartConfig(
      vocab_size=vocab, d_model=d_model, encoder_layers=layers, decoder_layers=layers,
      encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=ffn,
      decoder_ffn_dim=ffn, max_position_embeddings=max(1024, _SOURCE.value))
  reference = transformers.BartForConditionalGeneration(config).eval()
  early_eos = _max_length() > _NEW.value + 1
  if early_eos:
    with torch.no_grad():
      reference.final_logits_bias[0, config.eos_token_id] = EOS_BIAS
  with tempfile.TemporaryDirectory() as folder:
    reference.save_pretrained(folder, safe_serialization=True)
    ours = hf_bart.load(folder)

  rng = np.random.default_rng(0)
  ids = rng.integers(3, vocab, (_BATCH.value, _SOURCE.value))
  mask = np.ones_like(ids)
  if early_eos:  # EOS at the --new_tokens-th token, the loop set up for --max_length.
    settings = dict(max_length=_max_length(), min_length=_NEW.value)
  else:  # The decoder start token counts; the last token is the forced EOS.
    settings = dict(max_length=_NEW.value + 1, min_length=_NEW.value + 1)
  settings.update(num_beams=_BEAMS.value, do_sample=_SAMPLE.value)
  if _SAMPLE.value:
    settings.update(top_k=0, top_p=1.0)
  ours_settings = dict(settings)
  if _SEGMENT.value is not None:
    ours_settings["cache_segment"] = _SEGMENT.value
  tokens = _BATCH.value * _NEW.value
  torch_ids, torch_mask = torch.tensor(ids), torch.tensor(mask)
  jax_ids, jax_mask = jax.numpy.asarray(ids, np.int32), jax.numpy.asarray(mask, np.int32)

  def run_hf():
    with torch.no_grad():
      return reference.generate(input_ids=torch_ids, attention_mask=torch_mask,
                                use_cache=True, **settings).numpy()

  def run_ours():
    out = decoding.generate(ours, jax_ids, jax_mask, rng=jax.random.key(0), **ours_settings)
    return np.asarray(jax.block_until_ready(out.sequences))

  start = time.perf_counter()
  ours_tokens = run_ours()  # Compiles.
  compile_s = time.perf_counter() - start
  hf_tokens = run_hf()
  ours_times, hf_times = [], []
  for _ in range(_REPEATS.value):  # Interleaved, so load changes hit both sides alike.
    ours_times += _timed(run_ours, 1)
    hf_times += _timed(run_hf, 1)
  same = float((hf_tokens == ours_tokens[:, :hf_tokens.shape[1]]).all(-1).mean())
  generated = (ours_tokens[:, 1:] == config.eos_token_id).argmax(-1) + 1  # Through EOS.
  if not (generated == _NEW.value).all():  # The throughput assumes it.
    raise RuntimeError(f"rows generated {sorted(set(generated.tolist()))} tokens, not "
                       f"{_NEW.value}")
  ours_s, hf_s = min(ours_times), min(hf_times)
  return dict(size=name, d_model=d_model, layers=layers, heads=heads, ffn=ffn, vocab=vocab,
              ours_seconds=ours_times, reference_seconds=hf_times,
              ours_tokens_per_s=tokens / ours_s, reference_tokens_per_s=tokens / hf_s,
              ratio=hf_s / ours_s, identical_rows=same, ours_compile_seconds=compile_s)


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
  import torch

  from mocheg_jax.models import decoding

  unknown = sorted(set(_SIZES.value) - set(SIZES))
  if unknown:
    raise app.UsageError(f"unknown size(s) {unknown}; expected {sorted(SIZES)}")
  cpus = len(os.sched_getaffinity(0))  # What this process may use (taskset honoured).
  threads = _THREADS.value or cpus
  torch.set_num_threads(threads)
  if _SAMPLE.value and _BEAMS.value != 1:
    raise app.UsageError("--do_sample needs --num_beams=1")
  results = [bench_size(name) for name in _SIZES.value]
  mode = (f"beam {_BEAMS.value}" if _BEAMS.value > 1
          else "sampling" if _SAMPLE.value else "greedy")
  limit = f" (max_length {_max_length()})" if _max_length() > _NEW.value + 1 else ""
  print(f"BART {mode} decoding, batch {_BATCH.value} x source {_SOURCE.value}, "
        f"{_NEW.value} new tokens per row{limit}; best of {_REPEATS.value} interleaved runs; "
        f"{threads} torch threads; XLA {jax.devices()[0].platform} on {cpus} CPUs")
  print(f"{'size':24s} {'ours tok/s':>11s} {'HF tok/s':>11s} {'ours/HF':>8s} "
        f"{'same rows':>9s} {'compile s':>9s}")
  for r in results:
    label = f"{r['size']} ({r['d_model']}d, {r['layers']}+{r['layers']}, {r['vocab']//1000}k)"
    print(f"{label:24s} {r['ours_tokens_per_s']:11.1f} {r['reference_tokens_per_s']:11.1f} "
          f"{r['ratio']:7.2f}x {r['identical_rows']:9.0%} {r['ours_compile_seconds']:9.1f}")
  output = dict(benchmark="bart_decoding", mode=mode, batch=_BATCH.value,
                source_length=_SOURCE.value, new_tokens=_NEW.value,
                max_length=_max_length(),
                cache_segment=(decoding.CACHE_SEGMENT if _SEGMENT.value is None
                               else _SEGMENT.value),
                torch_threads=threads,
                cpus=cpus, platform=jax.devices()[0].platform,
                timing="best of interleaved runs", results=results)
  os.makedirs(os.path.dirname(_OUT.value) or ".", exist_ok=True)
  with open(_OUT.value, "w") as f:
    json.dump(output, f, indent=2)
  print(f"-> {_OUT.value}", file=sys.stderr)


if __name__ == "__main__":
  from mocheg_jax.utils import host_memory
  host_memory.keep_freed_memory_if_asked()  # Both sides alike (mocheg_jax/utils/host_memory.py).
  app.run(main)
