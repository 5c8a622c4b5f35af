"""Training steps on an accelerator: time per step and model FLOP utilisation (JAX only).

  python benchmarks/gpu_train.py [--dtype=bfloat16] [--out=benchmarks/out/gpu_train.json]
  python benchmarks/gpu_train.py --smoke      # tiny shapes on any backend (checks the script)

Each figure is one whole trainer step, built as loop.train builds it: the task's loss under
`train.step.make_train_step` (forward, backward, gradient-norm clip, AdamW update, the
non-finite guard), jitted with the train state donated. Parameters stay float32; --dtype
is the compute dtype of the matrix products (mixed precision). Random weights and tokens:
the step's cost does not depend on them.

* bart_large_nll: BART-large (406M), the explanation stage's loss with the reward term off
  (NLL), batch 32, source 512 and target 256 tokens (the reference truncates to 512 / 400).
* clip_vitb32_contrastive: CLIP ViT-B/32 (151M), the image-retrieval InfoNCE (claims ->
  images, scale 20), batch 480 (the reference's), 77 text tokens, 224 x 224 images.
* minilm_infonce: MiniLM-L6 (22.7M), the text-retrieval InfoNCE of each query against the
  batch's positives and hard negatives, batch 256, queries 32 and documents 128 tokens.

MFU = model FLOPs per step / step time / the device's dense peak for the compute dtype.
Model FLOPs are the matrix products and convolutions of the traced step, forward and
backward (mocheg_jax/utils/flops.py: no rematerialisation in these models, so this is the
conventional 6 x parameters x tokens plus attention); XLA's cost analysis is recorded
beside it, though on a GPU it leaves out the GEMMs that run as library calls (cuBLAS).
Peaks: mocheg_jax/utils/peaks.py (datasheet dense figures by device_kind; --peak_tflops
overrides; an unknown device gets no MFU rather than a guessed one). Times: median and
best of --repeats steps after 2 warm-ups.
The settings that change the program ($MOCHEG_JAX_ATTENTION, JAX_DEFAULT_PRNG_IMPL,
XLA_FLAGS) are recorded with the figures (benchmarks/gpu_ab.sh compares them in one run).
Every figure runs even when another fails; a failure is printed, recorded in the JSON and
makes the exit status non-zero. Fails loudly unless JAX sees a GPU/TPU (`--smoke` excepted).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
import traceback
from typing import Any, Callable

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:  # `python benchmarks/gpu_train.py` from anywhere.
  sys.path.insert(0, _REPO)

from absl import app, flags  # noqa: E402

from mocheg_jax.utils import peaks  # noqa: E402

_DTYPE = flags.DEFINE_enum("dtype", "bfloat16", ["bfloat16", "float32"], "Compute dtype.")
_REPEATS = flags.DEFINE_integer("repeats", 10, "Timed steps per figure.")
_ONLY = flags.DEFINE_list("only", [], "Run only these figures (default: all).")
_PEAK = flags.DEFINE_string("peak_tflops", None, "Per-device dense peak TFLOP/s overriding "
                            "the table (one number, or 'bfloat16=989.4,float32=494.7').")
_PROFILE = flags.DEFINE_string(
    "profile_dir", None, "If set: after timing, trace --profile_steps more steps of each "
    "figure with jax.profiler into DIR/<figure>/, copy the trace to "
    "DIR/<figure>.xplane.pb.gz, save the optimised HLO as DIR/<figure>.hlo.txt.gz and record "
    "where the device time went (benchmarks/profile_summary.py).")
_PROFILE_STEPS = flags.DEFINE_integer("profile_steps", 3, "Steps per profile.")
_SMOKE = flags.DEFINE_bool("smoke", False, "Tiny shapes on any backend (checks the script).")
_OUT = flags.DEFINE_string("out", "benchmarks/out/gpu_train.json", "JSON output path.")

FIGURES = ("bart_large_nll", "clip_vitb32_contrastive", "minilm_infonce")
_SEED = 0


def _tokens(rng, rows: int, length: int, vocab: int) -> tuple[Any, Any]:
  """Random ids [rows, length] (int32) with an all-ones mask: padding would only hide work."""
  import numpy as np
  ids = rng.integers(4, vocab, (rows, length)).astype(np.int32)
  return ids, np.ones_like(ids)


def bart_large(smoke: bool, dtype, rng) -> tuple[Callable, Callable, dict]:
  from flax import nnx

  from mocheg_jax.explanation import reinforce
  from mocheg_jax.models import bart
  shape = dict(model_type="bart", vocab_size=50265, d_model=1024, encoder_layers=12,
               decoder_layers=12, encoder_attention_heads=16, decoder_attention_heads=16,
               encoder_ffn_dim=4096, decoder_ffn_dim=4096, max_position_embeddings=1024)
  batch, source, target = 32, 512, 256
  if smoke:
    shape.update(vocab_size=512, d_model=64, encoder_layers=2, decoder_layers=2,
                 encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                 decoder_ffn_dim=128, max_position_embeddings=64)
    batch, source, target = 4, 32, 16
  config = bart.BartConfig.from_hf(shape)
  settings = reinforce.ReinforceSettings(sc_weight=0.0)

  def loss(model, b):
    return reinforce.explanation_loss(model, b, step=b["step"], key=None, settings=settings)

  src, src_mask = _tokens(rng, batch, source, shape["vocab_size"])
  tgt, tgt_mask = _tokens(rng, batch, target, shape["vocab_size"])
  data = dict(source_ids=src, source_mask=src_mask, target_ids=tgt, target_mask=tgt_mask,
              step=0)
  return (lambda: bart.Bart(config, dtype=dtype, rngs=nnx.Rngs(params=_SEED, dropout=1)),
          loss, data)


def clip_vitb32(smoke: bool, dtype, rng) -> tuple[Callable, Callable, dict]:
  import numpy as np
  from flax import nnx

  from mocheg_jax.models import clip
  from mocheg_jax.retrieval import contrastive
  shape: dict[str, Any] = {"model_type": "clip"}  # transformers' defaults: ViT-B/32.
  batch = 480
  if smoke:
    shape.update(text_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                  num_attention_heads=2, vocab_size=512),
                 vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                    num_attention_heads=2, image_size=64),
                 projection_dim=16)
    batch = 4
  config = clip.CLIPConfig.from_hf(shape)

  def loss(model, b):  # image_task.retrieval_loss's text -> image InfoNCE at a fixed scale.
    text = model.encode_text(b["query_ids"], b["query_mask"])
    images = model.encode_image(b["image"])
    value, accuracy = contrastive.info_nce(text, images, 20.0)
    return value, {"batch_accuracy": accuracy}

  ids, mask = _tokens(rng, batch, config.text.max_position_embeddings, config.text.vocab_size)
  size = config.vision.image_size
  pixels = rng.standard_normal((batch, size, size, 3), dtype=np.float32)
  data = dict(query_ids=ids, query_mask=mask, image=pixels)
  return lambda: clip.CLIPModel(config, dtype=dtype, rngs=nnx.Rngs(_SEED)), loss, data


def minilm(smoke: bool, dtype, rng) -> tuple[Callable, Callable, dict]:
  import jax.numpy as jnp
  from flax import nnx

  from mocheg_jax.models import bert
  from mocheg_jax.retrieval import contrastive
  shape = dict(model_type="bert", vocab_size=30522, hidden_size=384, num_hidden_layers=6,
               num_attention_heads=12, intermediate_size=1536, max_position_embeddings=512)
  batch, query, document = 256, 32, 128
  if smoke:
    shape.update(vocab_size=512, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=64, max_position_embeddings=64)
    batch, query, document = 4, 8, 16
  config = bert.BertConfig.from_hf(shape)

  def loss(model, b):  # text_task's loss: queries vs [positives ; hard negatives].
    queries = model(b["query_ids"], b["query_mask"], deterministic=False)
    docs = jnp.concatenate([model(b["positive_ids"], b["positive_mask"], deterministic=False),
                            model(b["negative_ids"], b["negative_mask"], deterministic=False)])
    value, accuracy = contrastive.info_nce(queries, docs, model.scale())
    return value, {"batch_accuracy": accuracy}

  data = {}
  for name, length in (("query", query), ("positive", document), ("negative", document)):
    data[f"{name}_ids"], data[f"{name}_mask"] = _tokens(rng, batch, length, shape["vocab_size"])
  return (lambda: contrastive.TextBiEncoder(config, dtype=dtype, rngs=nnx.Rngs(_SEED)),
          loss, data)


BUILDERS = {"bart_large_nll": bart_large, "clip_vitb32_contrastive": clip_vitb32,
            "minilm_infonce": minilm}


def _optimizer():
  from mocheg_jax.train import optim
  c = optim.default_config()
  c.name, c.learning_rate, c.schedule = "adamw", 1e-5, "constant"
  return optim.make_optimizer(c, total_steps=10**6)


def _profile(name: str, run_step: Callable[[], None], directory: str, steps: int,
             hlo_text: str) -> dict:
  """Trace `steps` calls of `run_step`; the kernel-time summary of the trace, each op named
  by its HLO instruction (the module is saved beside the trace as <name>.hlo.txt.gz)."""
  import glob
  import gzip
  import shutil

  import jax

  from benchmarks import profile_summary
  trace_dir = os.path.join(directory, name)
  with jax.profiler.trace(trace_dir):
    for _ in range(steps):
      run_step()
  (path,) = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
  # Shallow and compressed (BART-large's trace is over 16 MB raw): easy to fetch and open.
  flat = os.path.join(directory, f"{name}.xplane.pb.gz")
  with open(path, "rb") as src, gzip.open(flat, "wb") as dst:
    shutil.copyfileobj(src, dst)
  with gzip.open(os.path.join(directory, f"{name}.hlo.txt.gz"), "wt") as f:
    f.write(hlo_text)
  rows = profile_summary.annotate(profile_summary.device_op_times(flat),
                                  profile_summary.hlo_index(hlo_text))
  summary = profile_summary.summarize(rows, steps)
  print(f"{name}: {profile_summary.table(summary)}")
  return dict(summary, path=flat)


def measure(name: str, smoke: bool, dtype, repeats: int, peak_tflops: float | None) -> dict:
  """Compile and time one figure's train step; its FLOPs, memory and MFU."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from flax import nnx

  from mocheg_jax.train import state as state_lib
  from mocheg_jax.train import step as step_lib
  from mocheg_jax.utils import flops as flops_lib

  factory, loss, data = BUILDERS[name](smoke, dtype, np.random.default_rng(_SEED))
  spec = state_lib.ModelSpec.of(factory)
  opt = _optimizer()
  params = nnx.to_pure_dict(nnx.state(factory(), nnx.Param))
  trainable, frozen = spec.split_params(params)
  state = state_lib.TrainState(
      step=jnp.zeros((), jnp.int32), params=trainable, opt_state=opt.tx.init(trainable),
      frozen=frozen, others=spec.others_template.to_pure_dict(),
      first_nonfinite_step=jnp.full((), -1, jnp.int32))
  batch = jax.device_put(data)
  rng = jax.random.key(_SEED)
  train_step = step_lib.make_train_step(spec, loss, opt.tx, opt.schedule)
  model_flops = flops_lib.matmul_flops(train_step, state, batch, rng)

  start = time.perf_counter()
  compiled = jax.jit(train_step, donate_argnums=(0,)).lower(state, batch, rng).compile()
  compile_s = time.perf_counter() - start
  analysis = compiled.cost_analysis()
  if isinstance(analysis, (list, tuple)):  # Older JAX: one dict per device.
    analysis = analysis[0]
  memory = compiled.memory_analysis()

  times, losses = [], []

  def run_step() -> None:
    nonlocal state
    state, metrics = compiled(state, batch, rng)
    jax.block_until_ready((state, metrics))
    losses.append(float(metrics["loss"]))

  for i in range(2 + repeats):  # Two warm-ups: the first touches fresh buffers.
    begin = time.perf_counter()
    run_step()
    if i >= 2:
      times.append(time.perf_counter() - begin)
  profile = (_profile(name, run_step, _PROFILE.value, _PROFILE_STEPS.value, compiled.as_text())
             if _PROFILE.value else None)
  if not all(np.isfinite(losses)):
    raise FloatingPointError(f"{name}: non-finite loss in {losses}")
  median = statistics.median(times)
  stats = jax.devices()[0].memory_stats() or {}
  return dict(
      figure=name, parameters=int(sum(x.size for x in jax.tree.leaves(params))),
      batch={k: list(np.shape(v)) for k, v in data.items()}, compile_s=compile_s,
      median_s=median, best_s=min(times), steps_per_s=1 / median,
      model_flops=model_flops, xla_flops=float(analysis.get("flops", 0.0)),
      model_tflops_per_s=model_flops / median / 1e12,
      mfu=None if peak_tflops is None else model_flops / median / (peak_tflops * 1e12),
      temp_gb=None if memory is None else memory.temp_size_in_bytes / 1e9,
      # The allocator's peak since the process started (JAX cannot reset it): the largest
      # figure so far, so only the first figure's is its own; temp_gb is each step's plan.
      process_peak_device_gb=stats.get("peak_bytes_in_use", 0) / 1e9 or None,
      first_loss=losses[0], last_loss=losses[-1], profile=profile)


def main(argv):
  del argv
  import jax
  import jax.numpy as jnp

  backend, smoke = jax.default_backend(), _SMOKE.value
  if backend not in peaks.ACCELERATORS and not smoke:
    raise SystemExit(f"error: JAX sees no accelerator (backend {backend!r}, devices "
                     f"{jax.devices()}); install jax with CUDA support or pass --smoke")
  unknown = sorted(set(_ONLY.value) - set(FIGURES))
  if unknown:
    raise SystemExit(f"error: --only: unknown figures {unknown}; expected some of {FIGURES}")
  try:
    override = peaks.parse_peak_override(_PEAK.value)
  except ValueError as e:
    raise SystemExit(f"error: {e}") from None
  dtype_name = _DTYPE.value
  device_kind = jax.devices()[0].device_kind
  platform = "gpu" if backend in ("cuda", "rocm") else backend
  mode = peaks.matmul_mode(platform, dtype_name, jax.config.jax_default_matmul_precision,
                                os.environ.get("NVIDIA_TF32_OVERRIDE"))
  peak, _, source = peaks.peaks_for(device_kind, dtype_name, mode, override, None)
  dtype = jnp.bfloat16 if dtype_name == "bfloat16" else jnp.float32

  from mocheg_jax.models import layers
  settings = dict(attention=layers.attention_implementation(),
                  prng_impl=str(jax.config.jax_default_prng_impl),
                  xla_flags=os.environ.get("XLA_FLAGS", ""))
  results, failures = [], []
  for name in _ONLY.value or FIGURES:
    try:
      results.append(measure(name, smoke, dtype, _REPEATS.value, peak))
    except Exception as e:  # noqa: BLE001  (the other figures still run; the exit says so)
      traceback.print_exc()
      failures.append(dict(figure=name, error=f"{type(e).__name__}: {e}"))

  print(f"backend {backend}, {jax.device_count()} x {device_kind}, jax {jax.__version__}, "
        f"compute dtype {dtype_name} (matmul mode {mode}), peak "
        f"{'unknown' if peak is None else f'{peak:g} TFLOP/s'} ({source}); {settings}")
  print("| figure | params M | median ms | best ms | model TFLOP/step | TFLOP/s | MFU | "
        "XLA TFLOP/step | compile s | temp GB |\n|---|---|---|---|---|---|---|---|---|---|")
  for r in results:
    mfu = "-" if r["mfu"] is None else f"{r['mfu']:.1%}"
    temp_gb = "-" if r["temp_gb"] is None else f"{r['temp_gb']:.1f}"
    print(f"| {r['figure']} | {r['parameters'] / 1e6:.1f} | {r['median_s'] * 1e3:.2f} | "
          f"{r['best_s'] * 1e3:.2f} | {r['model_flops'] / 1e12:.3f} | "
          f"{r['model_tflops_per_s']:.1f} | {mfu} | {r['xla_flops'] / 1e12:.3f} | "
          f"{r['compile_s']:.1f} | {temp_gb} |")
  for f in failures:
    print(f"FAILED {f['figure']}: {f['error']}")
  os.makedirs(os.path.dirname(_OUT.value) or ".", exist_ok=True)
  with open(_OUT.value, "w") as f:
    json.dump(dict(benchmark="gpu_train", backend=backend, device_kind=device_kind,
                   devices=[str(d) for d in jax.devices()], jax_version=jax.__version__,
                   dtype=dtype_name, matmul_mode=mode, peak_tflops_per_device=peak,
                   peak_source=source, settings=settings, smoke=smoke,
                   repeats=_REPEATS.value,
                   results=results, failures=failures), f, indent=2)
  print(f"wrote {_OUT.value}")
  if failures:
    raise SystemExit(f"error: {len(failures)} figure(s) failed: "
                     f"{', '.join(f['figure'] for f in failures)}")


if __name__ == "__main__":
  from mocheg_jax.utils import host_memory
  host_memory.keep_freed_memory_if_asked()  # Both sides alike (mocheg_jax/utils/host_memory.py).
  app.run(main)
