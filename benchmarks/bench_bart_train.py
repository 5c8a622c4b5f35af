r"""BART training-step throughput: ours (one jitted step) vs transformers' PyTorch BART.

  python benchmarks/bench_bart_train.py [--sizes=base,small --batch=8 --source_length=128 \
      --target_length=64 --repeats=3 --threads=N --reinforce --baseline=greedy \
      --precision=float32]

--precision=bfloat16 runs both sides with bfloat16 products (benchmarks/timing.py: ours
under jax.default_matmul_precision, torch's forward under CPU autocast); float32 otherwise.

1. The NLL training step on the same config, batch and initial weights (random weights
   created with transformers and loaded by our converter, dropout 0 on both sides):
   * ours: the trainer's own pieces without a whole trainer: `train.step.make_train_step`
     (value_and_grad, global norm, non-finite guard) over the explanation task's loss
     `reinforce.explanation_loss` with no reward model (teacher-forced NLL, mean over the
     label-mask tokens), the optimizer from `train.optim.make_optimizer` (AdamW, constant
     learning rate, no clipping, weight decay on every parameter as torch's AdamW does,
     `final_logits_bias` frozen as HF keeps it a buffer), jitted with the state donated.
   * reference: BartForConditionalGeneration in train mode, forward with `labels` (-100 on
     padded target positions, so HF's decoder inputs are the labels shifted right, as
     ours), loss.backward(), torch.optim.AdamW (same lr / betas / eps / weight decay,
     default implementation) step, zero_grad(set_to_none=True).
   Sources and targets are ragged (real lengths drawn in [3/4, 1] of --source_length and
   [1/2, 1] of --target_length; the rest pads), so masks matter on both sides. tokens/s
   counts real tokens: target = label-mask tokens (the NLL's denominator), all = real
   source + real target tokens. The first two steps' losses of both sides are compared
   (same weights, same batch: a correctness check of the comparison; the second also
   checks that one AdamW update did the same thing).
2. --reinforce: the cost of the explanation task's REINFORCE step relative to its NLL-only
   step (ours only; the same batch, weights and jitted step code): `explanation_loss` with
   a reward model and `start_step=0`, i.e. inside the step an autoregressive sample with
   the KV cache (lax.while_loop, --target_length tokens), the --baseline decode (greedy:
   a second, greedy decode), the reward model on the sampled ids, and a teacher-forced
   scoring pass over the sample, all differentiated through where needed. The reward
   model is a small random TruthfulnessClassifier with the `bart_encoder` body (2 layers,
   128-d, reading the generator's vocabulary) rather than a trained one: its cost, not its
   judgement, is what is measured.

Each side is warmed up once (ours: XLA compilation reported apart, then the first step),
then the sides are timed alternately (ours NLL, torch, ours REINFORCE) --repeats times and
the best time of each is used. torch uses torch.set_num_threads(--threads, default all
CPUs) and set_flush_denormal(True) (XLA's CPU backend flushes denormals; Adam's moments of
tiny gradients would otherwise slow torch down); XLA's CPU client uses all CPUs. For one
core each: `taskset -c 0 python benchmarks/bench_bart_train.py --threads=1` (on a shared
machine multi-threaded torch slows down far more than XLA). Memory: the RSS high-water
(VmHWM) reset before each step, minus the RSS before it, i.e. what a step needs on top of
the resident weights and optimizer state (both sides live in one process). Ours frees its
scratch after every step, so every step shows it; torch's allocator keeps freed memory, so
only its first step (gradients, AdamW state, activations) does. Ours also records XLA's
own plan (`compiled.memory_analysis()`: scratch, and the donated state aliased in place).
Prints a table and writes JSON to --out. Not a test.
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
from typing import Any, Callable

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:  # `python benchmarks/bench_bart_train.py` from anywhere.
  sys.path.insert(0, _REPO)

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from absl import app, flags  # noqa: E402

from benchmarks.timing import PRECISIONS, precision_scopes  # noqa: E402
from mocheg_jax.utils import resident_memory  # noqa: E402

SIZES = {
    # name: (d_model, layers each side, heads, ffn, vocab)
    "base": (768, 6, 12, 3072, 50265),  # bart-base.
    "small": (256, 3, 4, 1024, 8192),  # As bench_bart.py's small.
    "tiny": (32, 1, 2, 64, 128),  # For the smoke test only.
}
# The stand-in reward model (bart_encoder TruthfulnessClassifier): width, layers, heads, ffn;
# smaller for the tiny size, whose only job is a quick smoke test.
REWARD_MODEL = (128, 2, 4, 512)
TINY_REWARD_MODEL = (32, 1, 2, 64)
TARGET_RATIO = 1.0  # ours / transformers tokens/s on CPU (issue 7).

_SIZES = flags.DEFINE_list("sizes", ["base", "small"], f"Model sizes from {sorted(SIZES)}.")
_BATCH = flags.DEFINE_integer("batch", 8, "Rows per batch.")
_SOURCE = flags.DEFINE_integer("source_length", 128, "Padded source tokens per row.")
_TARGET = flags.DEFINE_integer("target_length", 64, "Padded target tokens per row (and the "
                               "REINFORCE sample's length).")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed steps per side (interleaved).")
_THREADS = flags.DEFINE_integer("threads", None, "torch threads (default: all CPUs).")
_LR = flags.DEFINE_float("learning_rate", 5e-5, "AdamW learning rate (both sides).")
_WD = flags.DEFINE_float("weight_decay", 0.01, "AdamW weight decay (both sides).")
_REINFORCE = flags.DEFINE_boolean("reinforce", True, "Also time our REINFORCE step.")
_BASELINE = flags.DEFINE_enum("baseline", "greedy", ["none", "greedy", "mean"],
                              "The REINFORCE baseline (greedy: the task's default).")
_FLUSH = flags.DEFINE_boolean("torch_flush_denormal", True,
                              "torch.set_flush_denormal(True), as XLA's CPU backend does.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the weights and the batch.")
_OUT = flags.DEFINE_string("out", "benchmarks/out/bart_train.json", "JSON output path.")
_PRECISION = flags.DEFINE_enum("precision", "float32", PRECISIONS,
                               "Products on both sides (benchmarks/timing.py).")


# ---- memory and timing ----------------------------------------------------------------------
def _status_gb(field: str) -> float:
  """A /proc/self/status memory field (kB) in GB; NaN off Linux."""
  kib = resident_memory.status_kib(field)
  return float("nan") if kib is None else kib / 1e6


def _measured(fn: Callable[[], Any]) -> tuple[Any, dict[str, float]]:
  """(fn(), wall s, CPU s of the process, peak RSS above the RSS before it, GB)."""
  resident_memory.reset_peak()  # A no-op (False) where the system cannot.
  rss = _status_gb("VmRSS")
  start, cpu = time.perf_counter(), time.process_time()
  out = fn()
  wall, cpu = time.perf_counter() - start, time.process_time() - cpu
  return out, dict(wall_s=wall, cpu_s=cpu, extra_peak_gb=_status_gb("VmHWM") - rss,
                   rss_before_gb=rss)


# ---- the batch -------------------------------------------------------------------------------
def make_batch(vocab: int, batch: int, source_length: int, target_length: int, seed: int,
               pad: int = 1, bos: int = 0, eos: int = 2) -> dict[str, Any]:
  """Ragged rows padded to one shape: sources <s> ... </s> and targets ... </s> then pads."""
  import numpy as np
  rng = np.random.default_rng(seed)
  lo = lambda n, f: max(2, int(round(n * f)))  # noqa: E731
  src_len = rng.integers(lo(source_length, 0.75), source_length + 1, batch)
  tgt_len = rng.integers(lo(target_length, 0.5), target_length + 1, batch)
  src_len[0], tgt_len[0] = source_length, target_length  # One full row each.
  source_mask = np.arange(source_length)[None] < src_len[:, None]
  target_mask = np.arange(target_length)[None] < tgt_len[:, None]
  source = np.where(source_mask, rng.integers(3, vocab, (batch, source_length)), pad)
  source[:, 0] = bos
  source[np.arange(batch), src_len - 1] = eos
  target = np.where(target_mask, rng.integers(3, vocab, (batch, target_length)), pad)
  target[np.arange(batch), tgt_len - 1] = eos
  return dict(source_ids=source.astype(np.int32), source_mask=source_mask.astype(np.int32),
              target_ids=target.astype(np.int32), target_mask=target_mask.astype(np.int32),
              label=rng.integers(0, 3, batch).astype(np.int32),
              step=np.zeros(batch, np.int32))


# ---- ours ------------------------------------------------------------------------------------
def _optimizer():
  from mocheg_jax.train import optim
  c = optim.default_config()
  c.name, c.learning_rate, c.weight_decay = "adamw", _LR.value, _WD.value
  c.schedule, c.clip_norm = "constant", 0.0
  c.no_decay = ""  # torch.optim.AdamW(model.parameters()) decays every parameter.
  return optim.make_optimizer(c, total_steps=10**6)


def reward_model_for(config, shape: tuple[int, int, int, int] = REWARD_MODEL) -> Any:
  """The stand-in reward model: a small random bart_encoder TruthfulnessClassifier over the
  generator's vocabulary (`shape`: width, layers, heads, ffn), as a frozen RewardModel."""
  from flax import nnx

  from mocheg_jax.explanation import classifier, reinforce
  from mocheg_jax.models import bart
  width, layers, heads, ffn = shape
  encoder = bart.BartConfig(
      vocab_size=config.vocab_size, d_model=width, encoder_layers=layers, decoder_layers=1,
      encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=ffn,
      decoder_ffn_dim=ffn, max_position_embeddings=max(64, _TARGET.value), dropout=0.0)
  module = classifier.TruthfulnessClassifier(
      classifier.ClassifierConfig(body="bart_encoder", encoder=encoder, pooling="mean"),
      rngs=nnx.Rngs(_SEED.value + 7))
  return reinforce.RewardModel.from_module(module, classifier.label_probabilities)


class OursStep:
  """Our jitted train step over `loss` on one model's weights: compile, then run steps."""

  def __init__(self, model, loss, batch: dict[str, Any], constants: Any = None):
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from mocheg_jax.models import bart
    from mocheg_jax.train import state as state_lib
    from mocheg_jax.train import step as step_lib

    config = model.config
    spec = state_lib.ModelSpec.of(
        lambda: bart.Bart(config, rngs=nnx.Rngs(params=0, dropout=1)),
        freeze="final_logits_bias")  # HF's final_logits_bias is a buffer.
    opt = _optimizer()
    # Copies: the step donates its state, and each OursStep owns its own.
    params = jax.tree.map(jnp.array, nnx.to_pure_dict(nnx.state(model, nnx.Param)))
    trainable, frozen = spec.split_params(params)
    self.state = state_lib.TrainState(
        step=jnp.zeros((), jnp.int32), params=trainable, opt_state=opt.tx.init(trainable),
        frozen=frozen, others=spec.others_template.to_pure_dict(),
        first_nonfinite_step=jnp.full((), -1, jnp.int32))
    self.batch = jax.device_put(batch)
    self.rng = jax.random.key(_SEED.value)
    # The reward model reaches the step as an argument (Task.constants), as in the trainer.
    train_step = step_lib.make_train_step(spec, loss, opt.tx, opt.schedule,
                                          with_constants=constants is not None)
    self.constants = None if constants is None else jax.device_put(constants)
    start = time.perf_counter()
    self.compiled = jax.jit(train_step, donate_argnums=(0,)).lower(
        self.state, self.batch, self.rng, self.constants).compile()
    self.compile_s = time.perf_counter() - start
    # What XLA planned for one step: scratch (activations, gradients, temporaries) beyond
    # the donated state, which is updated in place (aliased).
    mem = self.compiled.memory_analysis()
    self.memory_gb = None if mem is None else dict(
        temp=mem.temp_size_in_bytes / 1e9, arguments=mem.argument_size_in_bytes / 1e9,
        outputs=mem.output_size_in_bytes / 1e9, aliased=mem.alias_size_in_bytes / 1e9)
    self.metrics: list[dict[str, float]] = []

  def __call__(self) -> None:
    import jax
    self.state, metrics = self.compiled(self.state, self.batch, self.rng, self.constants)
    jax.block_until_ready((self.state, metrics))
    self.metrics.append({k: float(v) for k, v in metrics.items()})


def _losses(settings):
  """The task's loss (as generator_task.make_task builds it): NLL-only, or with the reward
  model the step passes as its constants."""
  import jax.numpy as jnp

  from mocheg_jax.explanation import reinforce

  def loss(model, batch, reward_model=None):
    key = reinforce.policy_key(model) if reward_model is not None else None
    return reinforce.explanation_loss(model, batch, step=jnp.max(batch["step"]), key=key,
                                      settings=settings, reward_model=reward_model)
  return loss


# ---- transformers ----------------------------------------------------------------------------
class TorchStep:
  """BartForConditionalGeneration's training step: forward with labels, backward, AdamW."""

  def __init__(self, reference, batch: dict[str, Any]):
    import numpy as np
    import torch
    self.model = reference.train()
    self.opt = torch.optim.AdamW(self.model.parameters(), lr=_LR.value, betas=(0.9, 0.999),
                                 eps=1e-8, weight_decay=_WD.value)
    labels = np.where(batch["target_mask"] == 1, batch["target_ids"], -100)
    self.inputs = dict(input_ids=torch.tensor(batch["source_ids"], dtype=torch.long),
                       attention_mask=torch.tensor(batch["source_mask"], dtype=torch.long),
                       labels=torch.tensor(labels, dtype=torch.long))
    self.losses: list[float] = []

  def __call__(self) -> None:
    with precision_scopes(_PRECISION.value)[1]():
      loss = self.model(**self.inputs).loss
    loss.backward()
    self.opt.step()
    self.opt.zero_grad(set_to_none=True)
    self.losses.append(float(loss.detach()))


# ---- one size --------------------------------------------------------------------------------
def _relative(a: float, b: float) -> float:
  return abs(a - b) / max(abs(b), 1e-12)


def bench_size(name: str) -> dict[str, Any]:
  import numpy as np
  import torch
  import transformers

  from mocheg_jax.explanation import reinforce
  from mocheg_jax.models.hf import bart as hf_bart

  d_model, layers, heads, ffn, vocab = SIZES[name]
  torch.manual_seed(_SEED.value)
  config = transformers.BartConfig(
      vocab_size=vocab, d_model=d_model, encoder_layers=layers, decoder_layers=layers,
      encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=ffn,
      decoder_ffn_dim=ffn, max_position_embeddings=max(1024, _SOURCE.value, _TARGET.value),
      dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
  reference = transformers.BartForConditionalGeneration(config)
  with tempfile.TemporaryDirectory() as folder:
    reference.save_pretrained(folder, safe_serialization=True)
    model = hf_bart.load(folder)
  c = model.config
  batch = make_batch(vocab, _BATCH.value, _SOURCE.value, _TARGET.value, _SEED.value,
                     pad=c.pad_token_id, bos=c.bos_token_id, eos=c.eos_token_id)
  target_tokens = int(batch["target_mask"].sum())
  all_tokens = target_tokens + int(batch["source_mask"].sum())

  sides: dict[str, Callable[[], None]] = {}
  print(f"[{name}] compiling our NLL step ...", flush=True)
  nll = OursStep(model, _losses(reinforce.ReinforceSettings()), batch)
  sides["ours"] = nll
  sides["reference"] = TorchStep(reference, batch)
  rl = None
  if _REINFORCE.value:
    settings = reinforce.ReinforceSettings(sc_weight=0.5, start_step=0,
                                           baseline=_BASELINE.value,
                                           sample_max_length=_TARGET.value + 1)
    print(f"[{name}] compiling our REINFORCE step ...", flush=True)
    reward_shape = TINY_REWARD_MODEL if name == "tiny" else REWARD_MODEL
    rl = OursStep(model, _losses(settings), batch, reward_model_for(c, reward_shape))
    sides["ours_reinforce"] = rl

  runs = {k: dict(seconds=[], cpu_seconds=[], extra_peak_gb=[]) for k in sides}
  for key, fn in sides.items():  # Warm-up (ours: the first run after compilation).
    _, m = _measured(fn)
    runs[key].update(first_step_s=m["wall_s"], first_step_extra_peak_gb=m["extra_peak_gb"])
    print(f"[{name}] first step {key}: {m['wall_s']:.2f} s", flush=True)
  for r in range(_REPEATS.value):  # Interleaved, so load changes hit every side alike.
    for key, fn in sides.items():
      _, m = _measured(fn)
      runs[key]["seconds"].append(m["wall_s"])
      runs[key]["cpu_seconds"].append(m["cpu_s"])
      runs[key]["extra_peak_gb"].append(m["extra_peak_gb"])
      runs[key].setdefault("load", []).append(os.getloadavg()[0])
      print(f"[{name}] round {r + 1}/{_REPEATS.value} {key}: {m['wall_s']:.2f} s "
            f"({m['cpu_s']:.2f} CPU-s)", flush=True)
  for key, run in runs.items():
    best = min(run["seconds"])
    run.update(best_s=best, target_tokens_per_s=target_tokens / best,
               tokens_per_s=all_tokens / best, peak_extra_gb=max(run["extra_peak_gb"]))

  ours_losses = [m["loss"] for m in nll.metrics]
  ref_losses = sides["reference"].losses
  check = dict(ours_first_loss=ours_losses[0], reference_first_loss=ref_losses[0],
               first_loss_relative_diff=_relative(ours_losses[0], ref_losses[0]),
               ours_second_loss=ours_losses[1], reference_second_loss=ref_losses[1],
               second_loss_relative_diff=_relative(ours_losses[1], ref_losses[1]),
               ours_losses=ours_losses, reference_losses=ref_losses)
  params = sum(int(np.prod(p.shape)) for p in reference.parameters())
  out = dict(size=name, d_model=d_model, layers=layers, heads=heads, ffn=ffn, vocab=vocab,
             parameters=params, target_tokens=target_tokens, all_tokens=all_tokens,
             ours_compile_s=nll.compile_s, ours_compiled_memory_gb=nll.memory_gb,
             reference_attention=getattr(reference.config, "_attn_implementation", None),
             runs=runs, ratio=runs["ours"]["tokens_per_s"] / runs["reference"]["tokens_per_s"],
             cpu_ratio=min(runs["reference"]["cpu_seconds"]) / min(runs["ours"]["cpu_seconds"]),
             paired_ratios=[t / o for o, t in zip(runs["ours"]["seconds"],
                                                  runs["reference"]["seconds"])],
             **check)
  if rl is not None:
    last = rl.metrics[-1]
    out["reinforce"] = dict(
        baseline=_BASELINE.value, sample_max_length=_TARGET.value + 1,
        compile_s=rl.compile_s, compiled_memory_gb=rl.memory_gb,
        cost_vs_nll=runs["ours_reinforce"]["best_s"] / runs["ours"]["best_s"],
        paired_costs=[r / o for o, r in zip(runs["ours"]["seconds"],
                                            runs["ours_reinforce"]["seconds"])],
        sample_tokens=last["sample_tokens"], reward=last["reward"], pg_loss=last["pg_loss"],
        nll=last["nll"], sc_weight=last["sc_weight"],
        reward_model=dict(kind="random bart_encoder TruthfulnessClassifier",
                          **dict(zip(("d_model", "layers", "heads", "ffn"), reward_shape))))
  return out


def _check_flags() -> None:
  unknown = sorted(set(_SIZES.value) - set(SIZES))
  if unknown:
    sys.exit(f"unknown --sizes {unknown}; expected some of {sorted(SIZES)}")
  counts = dict(batch=_BATCH.value, source_length=_SOURCE.value,
                target_length=_TARGET.value, repeats=_REPEATS.value)
  bad = [f"--{k}={v}" for k, v in counts.items() if v < 1]
  if _SOURCE.value < 4 or _TARGET.value < 2:
    bad.append("--source_length must be >= 4 and --target_length >= 2")
  if _THREADS.value is not None and _THREADS.value < 1:
    bad.append(f"--threads={_THREADS.value}")
  if _LR.value <= 0 or _WD.value < 0:
    bad.append(f"--learning_rate={_LR.value} (> 0) / --weight_decay={_WD.value} (>= 0)")
  if bad:
    sys.exit(f"bad flags: {'; '.join(bad)} (counts must be >= 1)")


def main(argv: list[str]) -> None:
  del argv
  _check_flags()
  import jax
  import torch
  import transformers

  cpus = len(os.sched_getaffinity(0))  # What this process may use (taskset honoured).
  threads = _THREADS.value or cpus
  torch.set_num_threads(threads)
  if _PRECISION.value == "bfloat16":  # Ours compiles ahead of time: set for the process.
    jax.config.update("jax_default_matmul_precision", "bfloat16")
  if _FLUSH.value and not torch.set_flush_denormal(True):
    print("this CPU cannot flush denormals in torch; timing without", flush=True)
  load_before = os.getloadavg()
  results = [bench_size(name) for name in _SIZES.value]
  load_after = os.getloadavg()

  print(f"\nBART training step (NLL, AdamW, {_PRECISION.value} products), batch "
        f"{_BATCH.value} x source {_SOURCE.value} "
        f"/ target {_TARGET.value} (ragged); best of {_REPEATS.value} interleaved steps; "
        f"{threads} torch threads; XLA {jax.devices()[0].platform} on {cpus} CPUs; load "
        f"{load_before[0]:.1f} -> {load_after[0]:.1f}")
  print(f"{'size':24s} {'ours tgt tok/s':>14s} {'HF tgt tok/s':>12s} {'ours all/s':>10s} "
        f"{'HF all/s':>9s} {'ours/HF':>7s} {'loss ours':>10s} {'loss HF':>10s} {'rel':>8s} "
        f"{'compile s':>9s}")
  for r in results:
    o, h = r["runs"]["ours"], r["runs"]["reference"]
    label = f"{r['size']} ({r['d_model']}d, {r['layers']}+{r['layers']}, {r['vocab']})"
    print(f"{label:24s} {o['target_tokens_per_s']:14.1f} {h['target_tokens_per_s']:12.1f} "
          f"{o['tokens_per_s']:10.1f} {h['tokens_per_s']:9.1f} {r['ratio']:6.2f}x "
          f"{r['ours_first_loss']:10.5f} {r['reference_first_loss']:10.5f} "
          f"{r['first_loss_relative_diff']:8.1e} {r['ours_compile_s']:9.1f}")
  # Memory: RSS high-water of a step above the RSS before it. Ours frees its scratch after
  # every step, so each step shows it; torch's allocator keeps freed memory mapped, so only
  # its first step (gradients, AdamW state, activations) shows growth.
  print(f"{'size':24s} {'ours s/step':>11s} {'HF s/step':>9s} {'ours CPU-s':>10s} "
        f"{'HF CPU-s':>8s} {'ours +GB':>8s} {'XLA temp GB':>11s} {'HF 1st +GB':>10s} "
        f"{'RL s/step':>9s} {'RL/NLL':>7s} {'RL compile s':>12s}")
  for r in results:
    o, h = r["runs"]["ours"], r["runs"]["reference"]
    rl = r.get("reinforce")
    temp = (r["ours_compiled_memory_gb"] or {}).get("temp", float("nan"))
    extra = (f"{r['runs']['ours_reinforce']['best_s']:9.2f} {rl['cost_vs_nll']:6.2f}x "
             f"{rl['compile_s']:12.1f}" if rl else "")
    print(f"{r['size']:24s} {o['best_s']:11.3f} {h['best_s']:9.3f} "
          f"{min(o['cpu_seconds']):10.2f} {min(h['cpu_seconds']):8.2f} "
          f"{o['peak_extra_gb']:8.2f} {temp:11.2f} {h['first_step_extra_peak_gb']:10.2f} "
          f"{extra}")
  output = dict(benchmark="bart_train", date=time.strftime("%Y-%m-%d %H:%M"),
                batch=_BATCH.value, source_length=_SOURCE.value, target_length=_TARGET.value,
                repeats=_REPEATS.value, learning_rate=_LR.value, weight_decay=_WD.value,
                torch_threads=threads, torch_flush_denormal=_FLUSH.value, cpus=cpus,
                platform=jax.devices()[0].platform, machine=platform.platform(),
                jax=jax.__version__, torch=torch.__version__,
                transformers=transformers.__version__, load_before=load_before,
                load_after=load_after, target_ratio=TARGET_RATIO,
                timing="best of interleaved runs", precision=_PRECISION.value,
                results=results)
  os.makedirs(os.path.dirname(_OUT.value) or ".", exist_ok=True)
  with open(_OUT.value, "w") as f:
    json.dump(output, f, indent=2)
  print(f"-> {_OUT.value}", file=sys.stderr)


if __name__ == "__main__":
  from mocheg_jax.utils import host_memory
  host_memory.keep_freed_memory_if_asked()  # Both sides alike (mocheg_jax/utils/host_memory.py).
  app.run(main)
