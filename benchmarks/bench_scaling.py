r"""How our costs grow with the work (issue 9's scaling table); ours only, no reference.

  python benchmarks/bench_scaling.py [--parts=search,train,decode \
      --search_rows=10000,100000,1000000,2792639 --train_batches=4,8,16,32 \
      --train_lengths=64:32,128:64,256:128,512:256 --decode_lengths=16,32,64,128 \
      --sizes=small --batch=8 --source_length=128 --target_length=64 --repeats=3]

1. search: exact top-10 inner-product search (`retrieval.search.top_k`, in-memory corpus,
   the default 262,144-row chunks) of 2,442 queries (the paper's test claims) over a prefix
   of 2,792,639 random unit rows x 384 (the paper's KB and MiniLM's width); one untimed run
   per size compiles.
2. train: the explanation task's NLL training step (benchmarks/bench_bart_train.py's:
   `make_train_step` over `reinforce.explanation_loss`, AdamW, state donated) of a random
   BART of --sizes' first size, over --train_batches at --source_length / --target_length,
   then over --train_lengths (source:target) at --batch; ragged rows as there. With XLA's
   planned scratch memory per step (`compiled.memory_analysis()`).
3. decode: greedy decoding (`decoding.generate`, KV cache, the whole loop one program) of
   --batch sources of --source_length tokens, each row exactly N new tokens (min_length =
   max_length) for N in --decode_lengths.

Each configuration: one untimed run (it compiles; its time is the JSON's first_s, and the
train part also records XLA's compile time), then --repeats timed runs; the best wall time and the CPU time of that run are kept (wall times on a shared
machine are noisy; CPU seconds less so). The flags --sizes, --batch, --source_length,
--target_length, --repeats, --seed and --out are bench_bart_train.py's (their meaning is
the same); its torch flags do nothing here. Prints a table per part and writes JSON to
--out. Not a test.
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
from typing import Any, Callable

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:  # `python benchmarks/bench_scaling.py` from anywhere.
  sys.path.insert(0, _REPO)

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import app, flags  # noqa: E402

from benchmarks import bench_bart_train as bart_train  # noqa: E402  (its flags, shared)

PARTS = ("search", "train", "decode")
PAPER_KB_ROWS = 2_792_639
EMBED_DIM = 384
QUERIES = 2_442
TOP_K = 10

_PARTS = flags.DEFINE_list("parts", list(PARTS), f"Which parts to run, from {PARTS}.")
_SEARCH_ROWS = flags.DEFINE_list("search_rows", ["10000", "100000", "1000000",
                                                 str(PAPER_KB_ROWS)],
                                 "Corpus sizes (rows) of the search part.")
_QUERIES = flags.DEFINE_integer("queries", QUERIES, "Queries per search.")
_TRAIN_BATCHES = flags.DEFINE_list("train_batches", ["4", "8", "16", "32"],
                                   "Batch sizes of the train part (at the flag lengths).")
_TRAIN_LENGTHS = flags.DEFINE_list("train_lengths", ["64:32", "128:64", "256:128", "512:256"],
                                   "source:target lengths of the train part (at --batch).")
_DECODE_LENGTHS = flags.DEFINE_list("decode_lengths", ["16", "32", "64", "128"],
                                    "New tokens per row of the decode part.")
flags.FLAGS.set_default("out", "benchmarks/out/scaling.json")
flags.FLAGS.set_default("sizes", ["small"])


def timed(fn: Callable[[], Any], repeats: int) -> dict[str, Any]:
  """One untimed run, then `repeats` timed ones: the best wall time and that run's CPU time."""
  start = time.perf_counter()
  fn()
  first_s = time.perf_counter() - start
  runs = []
  for _ in range(repeats):
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    runs.append((time.perf_counter() - wall, time.process_time() - cpu))
  best_s, best_cpu_s = min(runs)
  return dict(first_s=first_s, best_s=best_s, cpu_s=best_cpu_s,
              seconds=[w for w, _ in runs])


# ---- parts ----------------------------------------------------------------------------------
def search_part(sizes: list[int], repeats: int, seed: int) -> list[dict[str, Any]]:
  import numpy as np

  from mocheg_jax.retrieval import search

  rng = np.random.default_rng(seed)

  def unit_rows(n: int) -> np.ndarray:
    rows = rng.standard_normal((n, EMBED_DIM), dtype=np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    return rows

  corpus = unit_rows(max(sizes))  # Each size searches a prefix of the same rows.
  queries = unit_rows(_QUERIES.value)
  results = []
  for n in sorted(sizes):
    rows = corpus[:n]
    t = timed(lambda: search.top_k(queries, rows, TOP_K), repeats)
    scored = len(queries) * n
    results.append(dict(rows=n, queries=len(queries), k=TOP_K, **t,
                        ns_per_score=1e9 * t["best_s"] / scored,
                        cpu_ns_per_score=1e9 * t["cpu_s"] / scored))
    print(f"[search] {n:>9,} rows: {t['best_s']:.3f} s ({t['cpu_s']:.2f} CPU-s)", flush=True)
  return results


def _bart(size: str, max_positions: int, seed: int):
  from flax import nnx

  from mocheg_jax.models import bart
  d_model, layers, heads, ffn, vocab = bart_train.SIZES[size]
  config = bart.BartConfig(
      vocab_size=vocab, d_model=d_model, encoder_layers=layers, decoder_layers=layers,
      encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=ffn,
      decoder_ffn_dim=ffn, max_position_embeddings=max_positions, dropout=0.0,
      attention_dropout=0.0, activation_dropout=0.0)
  return bart.Bart(config, rngs=nnx.Rngs(seed))


def train_part(size: str, shapes: list[tuple[int, int, int]], repeats: int,
               seed: int) -> list[dict[str, Any]]:
  from mocheg_jax.explanation import reinforce

  loss = bart_train._losses(reinforce.ReinforceSettings())  # NLL only.
  model = _bart(size, max(max(s, t) for _, s, t in shapes), seed)
  c = model.config
  results = []
  for batch, source, target in shapes:
    data = bart_train.make_batch(c.vocab_size, batch, source, target, seed,
                                 pad=c.pad_token_id, bos=c.bos_token_id, eos=c.eos_token_id)
    step = bart_train.OursStep(model, loss, data)
    t = timed(step, repeats)
    tokens = int(data["source_mask"].sum() + data["target_mask"].sum())
    memory = step.memory_gb or {}
    results.append(dict(batch=batch, source_length=source, target_length=target,
                        real_tokens=tokens, compile_s=step.compile_s, **t,
                        tokens_per_s=tokens / t["best_s"],
                        cpu_us_per_token=1e6 * t["cpu_s"] / tokens,
                        xla_temp_gb=memory.get("temp")))
    print(f"[train] batch {batch:3d}, {source}:{target}: {t['best_s']:.3f} s "
          f"({t['cpu_s']:.2f} CPU-s), {tokens / t['best_s']:.0f} tok/s", flush=True)
  return results


def decode_part(size: str, lengths: list[int], batch: int, source: int, repeats: int,
                seed: int) -> list[dict[str, Any]]:
  import jax
  import numpy as np

  from mocheg_jax.models import decoding

  model = _bart(size, max(source, max(lengths) + 1), seed)
  rng = np.random.default_rng(seed)
  ids = jax.numpy.asarray(rng.integers(3, model.config.vocab_size, (batch, source)), np.int32)
  mask = jax.numpy.ones_like(ids)
  results = []
  for n in lengths:
    settings = dict(max_length=n + 1, min_length=n + 1, num_beams=1)  # + the start token.
    run = lambda: jax.block_until_ready(  # noqa: E731
        decoding.generate(model, ids, mask, **settings).sequences)
    t = timed(run, repeats)
    results.append(dict(new_tokens=n, batch=batch, source_length=source, **t,
                        tokens_per_s=batch * n / t["best_s"],
                        ms_per_step=1e3 * t["best_s"] / n))
    print(f"[decode] {n:4d} new tokens: {t['best_s']:.3f} s, {batch * n / t['best_s']:.0f} "
          "tok/s", flush=True)
  return results


# ---- main -----------------------------------------------------------------------------------
def _ints(name: str, values: list[str]) -> list[int]:
  try:
    out = [int(v) for v in values]
  except ValueError:
    sys.exit(f"--{name} must be integers, got {values}")
  if not out or min(out) <= 0:
    sys.exit(f"--{name} must be positive integers, got {values}")
  return out


def _lengths(values: list[str]) -> list[tuple[int, int]]:
  pairs = [v.split(":") for v in values]
  if not pairs or any(len(p) != 2 for p in pairs):
    sys.exit(f"--train_lengths must be source:target pairs, got {values}")
  return [tuple(_ints("train_lengths", p)) for p in pairs]


def _parsed_flags() -> dict[str, Any]:
  """Every sweep flag checked before any part runs (a typo fails at once, not after the
  search part's minutes)."""
  unknown = sorted(set(_PARTS.value) - set(PARTS))
  if unknown:
    sys.exit(f"unknown --parts {unknown}; expected some of {list(PARTS)}")
  if bart_train._SIZES.value[0] not in bart_train.SIZES:
    sys.exit(f"unknown --sizes {bart_train._SIZES.value}; expected one of "
             f"{sorted(bart_train.SIZES)}")
  return dict(search_rows=_ints("search_rows", _SEARCH_ROWS.value),
              train_batches=_ints("train_batches", _TRAIN_BATCHES.value),
              train_lengths=_lengths(_TRAIN_LENGTHS.value),
              decode_lengths=_ints("decode_lengths", _DECODE_LENGTHS.value))


def _print_table(title: str, header: list[str], rows: list[list[str]]) -> None:
  print(f"\n{title}\n| " + " | ".join(header) + " |\n|" + "---|" * len(header))
  for row in rows:
    print("| " + " | ".join(row) + " |")


def main(argv: list[str]) -> None:
  del argv
  sweeps = _parsed_flags()
  import jax

  repeats, seed = bart_train._REPEATS.value, bart_train._SEED.value
  size, batch = bart_train._SIZES.value[0], bart_train._BATCH.value
  source, target = bart_train._SOURCE.value, bart_train._TARGET.value
  load_before = os.getloadavg()
  output: dict[str, Any] = dict(benchmark="scaling", date=time.strftime("%Y-%m-%d %H:%M"),
                                repeats=repeats, seed=seed, size=size,
                                cpus=len(os.sched_getaffinity(0)),
                                platform=jax.devices()[0].platform,
                                machine=platform.platform(), jax=jax.__version__)
  if "search" in _PARTS.value:
    output["search"] = search_part(sweeps["search_rows"], repeats, seed)
  if "train" in _PARTS.value:
    shapes = ([(b, source, target) for b in sweeps["train_batches"]]
              + [(batch, s, t) for s, t in sweeps["train_lengths"]])
    output["train"] = train_part(size, list(dict.fromkeys(shapes)), repeats, seed)
  if "decode" in _PARTS.value:
    output["decode"] = decode_part(size, sweeps["decode_lengths"],
                                   batch, source, repeats, seed)
  output["load_before"], output["load_after"] = load_before, os.getloadavg()

  if "search" in output:
    _print_table(f"Exact top-{TOP_K} search, {_QUERIES.value:,} queries x {EMBED_DIM}-d rows",
                 ["rows", "best s", "CPU-s", "ns / score", "CPU-ns / score"],
                 [[f"{r['rows']:,}", f"{r['best_s']:.3f}", f"{r['cpu_s']:.2f}",
                   f"{r['ns_per_score']:.3f}", f"{r['cpu_ns_per_score']:.3f}"]
                  for r in output["search"]])
  if "train" in output:
    _print_table(f"BART {size} NLL training step (AdamW), ragged rows",
                 ["batch", "source:target", "real tokens", "best s", "CPU-s", "tokens/s",
                  "CPU-us / token", "XLA temp GB", "compile s"],
                 [[str(r["batch"]), f"{r['source_length']}:{r['target_length']}",
                   str(r["real_tokens"]), f"{r['best_s']:.3f}", f"{r['cpu_s']:.2f}",
                   f"{r['tokens_per_s']:.0f}", f"{r['cpu_us_per_token']:.1f}",
                   "-" if r["xla_temp_gb"] is None else f"{r['xla_temp_gb']:.3f}",
                   f"{r['compile_s']:.1f}"] for r in output["train"]])
  if "decode" in output:
    _print_table(f"BART {size} greedy decoding, batch {batch}, source {source}",
                 ["new tokens", "best s", "CPU-s", "tokens/s", "ms / step"],
                 [[str(r["new_tokens"]), f"{r['best_s']:.3f}", f"{r['cpu_s']:.2f}",
                   f"{r['tokens_per_s']:.0f}", f"{r['ms_per_step']:.2f}"]
                  for r in output["decode"]])
  out = bart_train._OUT.value
  os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
  with open(out, "w") as f:
    json.dump(output, f, indent=2)
  print(f"-> {out}", file=sys.stderr)


if __name__ == "__main__":
  from mocheg_jax.utils import host_memory
  host_memory.keep_freed_memory_if_asked()  # Both sides alike (mocheg_jax/utils/host_memory.py).
  app.run(main)
