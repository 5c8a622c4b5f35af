r"""Contrastive training steps, ours vs PyTorch: the InfoNCE text step and the CLIP step.

  python benchmarks/bench_contrastive.py [--parts=text,clip --text_size=minilm \
      --clip_sizes=small,base --repeats=5 --threads=2 --dropout=0.0 --precision=float32]

Issue 9's "InfoNCE text step and CLIP contrastive step (vs a PyTorch implementation of the
same loss)". Both sides start from the same weights (random, made by transformers with torch
seed 0 and loaded by our HF converters), see the same batch, and run the same loss and
optimizer; their first losses are compared (a check that the comparison is fair) and the
step times are measured interleaved in one process.

1. InfoNCE text step: the text retriever as configs/retrieval_text.py:small configures it
   (hard negatives on, cosine x 20 fixed, queries 40 / documents 64 tokens, batch 32), on a
   random encoder of all-MiniLM-L6-v2's shape (30,522 vocab, 384-d, 6 layers, 12 heads,
   ffn 1536; the small config fine-tunes the real MiniLM, whose weights do not change the
   cost). Each query is scored against the batch's positives and hard negatives.
   * ours: `text_task.make_task`'s own model and loss (the data layer stubbed out: no world
     is built), run by the trainer's `train.step.make_train_step` and `train.optim`'s
     AdamW from the config's optimizer block, jitted with the state donated, one device.
   * reference: transformers' BertModel (SDPA attention) called on queries, positives and
     negatives, mean pooling over the attention mask (sentence-transformers' Pooling), the
     same masked cross-entropy over scale * cosine (MultipleNegativesRankingLoss with hard
     negatives), loss.backward(), clip_grad_norm_, torch.optim.AdamW.
2. CLIP contrastive step: the image retriever (`image_task.make_task`'s model and loss:
   text -> image InfoNCE with cosine x 20 fixed, the image -> text direction too when the
   config sets `retrieval.symmetric`), vs transformers' CLIPModel (get_text_features /
   get_image_features, the same loss written in torch). Sizes: `small` = the random CLIP
   of configs/retrieval_image.py:small (64-d, 2+2 layers, 64 px images, patch 8, claims of
   64 tokens, batch 64) on a --clip_vocab WordPiece vocabulary; `base` = ViT-B/32's shape
   with the paper variant's settings (claims of 77 tokens, text and vision embeddings +
   block 0 frozen on both sides) at a CPU-sized batch (--clip_base_batch, paper: 480).

Optimizer on both sides: the config's AdamW (learning rate, weight decay, no-decay regex
applied to our parameter names and, through the converter's name table, to torch's
parameter groups, gradient clipping at the config's norm), but a constant learning rate:
the configs warm up from 0, which would make the first update a no-op and the second-step
loss check meaningless. Dropout: --dropout on both sides (0 by default, so the losses can
be compared; the small text config keeps MiniLM's 0.1, whose masks then differ by side
and only the timing is comparable).

Timing: each side runs --warmup steps first (ours: XLA compilation timed apart; torch: its
first step creates the AdamW state), then --repeats rounds of one step each, alternately
ours, torch, so load changes hit both alike. examples/s = batch / median step time; ratio =
ours / reference examples/s (> 1: we are faster); the CPU-time ratio (process CPU seconds,
all threads, median per step) and each round's ratio are recorded too. torch runs with
torch.set_num_threads(--threads) and set_flush_denormal(True) (XLA's CPU backend flushes
denormals); XLA's CPU client uses every CPU. The load average is sampled after every step.
Products: float32 on both sides, or with --precision=bfloat16 bfloat16 operands on both
(benchmarks/timing.py: ours under jax.default_matmul_precision, torch's forward under CPU
autocast); the first losses must then agree to 2e-2 instead of 1e-4.
Prints a markdown table and writes JSON to --out. Not a test.
"""

from __future__ import annotations

if __name__ == "__main__":  # First: a re-exec keeps nothing done before it.
  from mocheg_jax.utils import allocator
  allocator.run_under_preferred_allocator()

import contextlib
import json
import math
import os
import platform
import re
import statistics
import sys
import tempfile
import time
import types
from typing import Any, Callable
from unittest import mock

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:  # `python benchmarks/bench_contrastive.py` from anywhere.
  sys.path.insert(0, _REPO)

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from absl import app, flags  # noqa: E402

from benchmarks.timing import PRECISIONS, precision_scopes  # noqa: E402

PARTS = ("text", "clip")
# BERT shapes of the text encoder: vocab, hidden, layers, heads, ffn, positions.
TEXT_SIZES = {
    "minilm": (30522, 384, 6, 12, 1536, 512),  # all-MiniLM-L6-v2.
    "tiny": (256, 32, 1, 2, 64, 128),  # For the smoke test only.
}
# CLIP sizes: the config variant whose settings (loss, optimizer, lengths, batch, freezing)
# apply, and the shape (None: the variant's own random-CLIP fields).
VIT_B32 = dict(text=(49408, 512, 12, 8, 2048, 77), vision=(768, 12, 12, 3072, 224, 32),
               projection=512)
TINY_CLIP = dict(text=(256, 32, 1, 2, 64, 16), vision=(32, 1, 2, 64, 32, 16), projection=16)
CLIP_SIZES = {"small": ("small", None), "base": ("paper", VIT_B32), "tiny": ("small", TINY_CLIP)}
# Token ids of the batches. BERT-style tokenizers (the world's WordPiece, MiniLM's): [PAD] 0,
# [CLS] 2 / 101, [SEP] 3 / 102 (our random CLIP pools the [SEP]); CLIP's BPE: <|startoftext|>
# 49406, <|endoftext|> 49407 (pooled), padding 1 as HF's CLIPTextConfig says.
FIRST_WORD_ID = 5  # Random word ids start above the special tokens of both vocabularies.
TARGET_RATIO = 1.0  # Issue 9: training steps >= 1.0x PyTorch on CPU.

_PARTS = flags.DEFINE_list("parts", list(PARTS), f"Which steps to time, from {PARTS}.")
_TEXT_SIZE = flags.DEFINE_string("text_size", "minilm",
                                 f"Text encoder shape: {sorted(TEXT_SIZES)}.")
_CLIP_SIZES = flags.DEFINE_list("clip_sizes", ["small", "base"],
                                f"CLIP sizes from {sorted(CLIP_SIZES)}.")
_TEXT_BATCH = flags.DEFINE_integer("text_batch", None, "Text rows per batch (default: the "
                                   "config's, 32).")
_QUERY_LEN = flags.DEFINE_integer("query_length", None, "Query tokens (default: the config's "
                                  "max_query_len, 40).")
_DOC_LEN = flags.DEFINE_integer("doc_length", None, "Document tokens (default: the config's "
                                "max_doc_len, 64).")
_CLIP_BATCH = flags.DEFINE_integer("clip_batch", None, "CLIP rows per batch for every size "
                                   "but base (default: the config's, 64 for small).")
_CLIP_BASE_BATCH = flags.DEFINE_integer("clip_base_batch", 16, "CLIP rows per batch at the "
                                        "base size (the paper's 480 is far beyond a CPU).")
_CLIP_VOCAB = flags.DEFINE_integer("clip_vocab", 8000, "Vocabulary of the random CLIPs (the "
                                   "world's WordPiece has at most 8,000 tokens).")
_DROPOUT = flags.DEFINE_float("dropout", 0.0, "Dropout of the text encoder, both sides (> 0: "
                              "the losses are not compared).")
_WARMUP = flags.DEFINE_integer("warmup", 1, "Untimed steps per side before the timed rounds.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed steps per side (interleaved rounds).")
_THREADS = flags.DEFINE_integer("threads", 2, "torch threads.")
_FLUSH = flags.DEFINE_boolean("torch_flush_denormal", True,
                              "torch.set_flush_denormal(True), as XLA's CPU backend does.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the weights and the batches.")
_OUT = flags.DEFINE_string("out", "benchmarks/out/contrastive.json", "JSON output path.")
_PRECISION = flags.DEFINE_enum("precision", "float32", PRECISIONS,
                               "Products on both sides (benchmarks/timing.py).")
# First-step losses may differ this much (relative) at each precision: float32 sums in
# another order; bfloat16 operands (and, in PyTorch's autocast, bfloat16 outputs).
LOSS_TOLERANCE = {"float32": 1e-4, "bfloat16": 2e-2}


# ---- timing ---------------------------------------------------------------------------------
def _measured(fn: Callable[[], Any]) -> dict[str, float]:
  start, cpu = time.perf_counter(), time.process_time()
  fn()
  return dict(wall_s=time.perf_counter() - start, cpu_s=time.process_time() - cpu)


def _relative(a: float, b: float) -> float:
  return abs(a - b) / max(abs(b), 1e-12)


def time_sides(label: str, sides: dict[str, Callable[[], None]], batch: int) -> dict[str, Any]:
  """Warm-up, then --repeats interleaved rounds; per-side times, rates and the ratios."""
  runs: dict[str, dict[str, Any]] = {k: dict(seconds=[], cpu_seconds=[], load=[])
                                     for k in sides}
  for key, fn in sides.items():
    warm = [_measured(fn)["wall_s"] for _ in range(_WARMUP.value)]
    runs[key]["warmup_s"] = warm
    print(f"[{label}] warm-up {key}: {', '.join(f'{s:.2f}' for s in warm)} s", flush=True)
  for r in range(_REPEATS.value):
    for key, fn in sides.items():
      m = _measured(fn)
      runs[key]["seconds"].append(m["wall_s"])
      runs[key]["cpu_seconds"].append(m["cpu_s"])
      runs[key]["load"].append(os.getloadavg()[0])
      print(f"[{label}] round {r + 1}/{_REPEATS.value} {key}: {m['wall_s']:.3f} s "
            f"({m['cpu_s']:.2f} CPU-s)", flush=True)
  for run in runs.values():
    median = statistics.median(run["seconds"])
    run.update(median_s=median, best_s=min(run["seconds"]),
               median_cpu_s=statistics.median(run["cpu_seconds"]),
               steps_per_s=1.0 / median, examples_per_s=batch / median)
  ours, ref = runs["ours"], runs["reference"]
  return dict(runs=runs, ratio=ours["examples_per_s"] / ref["examples_per_s"],
              best_ratio=ref["best_s"] / ours["best_s"],
              cpu_ratio=ref["median_cpu_s"] / ours["median_cpu_s"],
              paired_ratios=[t / o for o, t in zip(ours["seconds"], ref["seconds"])])


# ---- ours: the task's model and loss, the trainer's step ------------------------------------
@contextlib.contextmanager
def stubbed_data(module, **replacements):
  """`module.make_task` without a world: its data layer (and whatever else `replacements`
  names) stubbed, so the task's own model factory and loss are what we time."""
  data = types.SimpleNamespace(wordpiece="", release="", tfds="", bpe="", data_dir="")
  with contextlib.ExitStack() as stack:
    stack.enter_context(mock.patch.object(module, "prepared_data", lambda c, w: data))
    for name, value in replacements.items():
      stack.enter_context(mock.patch.object(module, name, value))
    yield


def benchmark_optimizer(config) -> Any:
  """The config's optimizer block with a constant learning rate (see the module docstring)."""
  c = config.optimizer.copy_and_resolve_references()
  c.schedule, c.warmup_steps = "constant", 0
  return c


class OursStep:
  """The trainer's jitted step over a task's loss, from the given weights: compile, run."""

  def __init__(self, task, config, params: dict, batch: dict[str, Any]):
    import jax
    import jax.numpy as jnp

    from mocheg_jax.train import optim
    from mocheg_jax.train import state as state_lib
    from mocheg_jax.train import step as step_lib

    spec = state_lib.ModelSpec.of(task.model, freeze=config.freeze)
    expected = jax.tree.structure(spec.params_template.to_pure_dict())
    if jax.tree.structure(params) != expected:  # The weights must cover the whole model.
      raise ValueError(f"the weights do not match the task's model: {expected} expected")
    opt = optim.make_optimizer(benchmark_optimizer(config), total_steps=10**6)
    trainable, frozen = spec.split_params(jax.tree.map(jnp.array, params))
    self.state = state_lib.TrainState(
        step=jnp.zeros((), jnp.int32), params=trainable, opt_state=opt.tx.init(trainable),
        frozen=frozen, others=spec.others_template.to_pure_dict(),
        first_nonfinite_step=jnp.full((), -1, jnp.int32))
    self.batch = jax.device_put(batch)
    self.rng = jax.random.key(_SEED.value)
    self.spec, self.loss = spec, task.loss  # For profiling the step's parts.
    train_step = step_lib.make_train_step(spec, task.loss, opt.tx, opt.schedule)
    start = time.perf_counter()
    self.compiled = jax.jit(train_step, donate_argnums=(0,)).lower(
        self.state, self.batch, self.rng).compile()
    self.compile_s = time.perf_counter() - start
    self.losses: list[float] = []

  def __call__(self) -> None:
    import jax
    self.state, metrics = self.compiled(self.state, self.batch, self.rng)
    jax.block_until_ready(self.state)
    self.losses.append(float(metrics["loss"]))


# ---- the reference: a torch module, a loss closure, AdamW -----------------------------------
def torch_groups(names_to_ours: dict[str, str], config) -> tuple[set[str], set[str]]:
  """(no-decay, frozen) torch parameter names, from the config's regexes over our names."""
  no_decay = config.optimizer.no_decay
  no_decay_names = {h for h, o in names_to_ours.items() if no_decay and re.search(no_decay, o)}
  frozen = {h for h, o in names_to_ours.items() if config.freeze and re.search(config.freeze, o)}
  return no_decay_names, frozen


class TorchStep:
  """loss() -> backward -> clip_grad_norm_ -> AdamW -> zero_grad, as a torch training loop."""

  def __init__(self, module, loss: Callable[[], Any], names_to_ours: dict[str, str], config):
    import torch
    missing = sorted(n for n, _ in module.named_parameters() if n not in names_to_ours)
    if missing:  # Every torch parameter needs our name, or its group would be guessed.
      raise ValueError(f"torch parameters without a converter rule: {missing[:5]}")
    no_decay, frozen = torch_groups(names_to_ours, config)
    o = config.optimizer
    decay_params, plain_params = [], []
    for name, p in module.named_parameters():
      p.requires_grad_(name not in frozen)
      if name not in frozen:
        (plain_params if name in no_decay else decay_params).append(p)
    self.trainable = decay_params + plain_params
    self.opt = torch.optim.AdamW(
        [dict(params=decay_params, weight_decay=o.weight_decay),
         dict(params=plain_params, weight_decay=0.0)],
        lr=o.learning_rate, betas=(o.b1, o.b2), eps=o.eps)
    self.clip_norm = o.clip_norm
    self.module, self.loss = module.train(), loss
    self.losses: list[float] = []
    self.frozen_count = len(frozen)

  def __call__(self) -> None:
    import torch
    with precision_scopes(_PRECISION.value)[1]():
      loss = self.loss()
    loss.backward()
    if self.clip_norm > 0:
      torch.nn.utils.clip_grad_norm_(self.trainable, self.clip_norm)
    self.opt.step()
    self.opt.zero_grad(set_to_none=True)
    self.losses.append(float(loss.detach()))


def torch_info_nce(queries, docs, scale: float, doc_mask):
  """Mean cross-entropy of scale * cos(query i, doc j) towards doc i, masked docs excluded
  (contrastive.info_nce in torch)."""
  import torch
  import torch.nn.functional as F
  logits = scale * F.normalize(queries, dim=-1) @ F.normalize(docs, dim=-1).T  # [B, M]
  logits = logits.masked_fill(~doc_mask, -1e9)
  return F.cross_entropy(logits, torch.arange(queries.shape[0]))


def torch_key_mask(keys, doc_keys):
  """contrastive.same_key_mask in torch: rows sharing a key are not negatives."""
  import torch
  own = torch.arange(doc_keys.shape[0])[None, :] == torch.arange(keys.shape[0])[:, None]
  return (keys[:, None] != doc_keys[None, :]) | own


def _compare(ours: OursStep, ref: TorchStep, compare: bool) -> dict[str, Any]:
  first = dict(ours_losses=ours.losses, reference_losses=ref.losses,
               ours_first_loss=ours.losses[0], reference_first_loss=ref.losses[0],
               ours_second_loss=ours.losses[1] if len(ours.losses) > 1 else None,
               reference_second_loss=ref.losses[1] if len(ref.losses) > 1 else None,
               losses_compared=compare)
  first["first_loss_relative_diff"] = (_relative(ours.losses[0], ref.losses[0]) if compare
                                       else None)
  first["second_loss_relative_diff"] = (
      _relative(ours.losses[1], ref.losses[1]) if compare and len(ref.losses) > 1 else None)
  return first


# ---- batches --------------------------------------------------------------------------------
def token_rows(rng, rows: int, length: int, vocab: int, first: int, last: int, pad: int,
               min_fraction: float = 0.25):
  """Ragged rows padded to `length`: first id, random words, last id, then `pad`s."""
  import numpy as np
  lengths = rng.integers(max(2, int(length * min_fraction)), length + 1, rows)
  lengths[0] = length  # One full row.
  mask = np.arange(length)[None] < lengths[:, None]
  ids = np.where(mask, rng.integers(FIRST_WORD_ID, vocab, (rows, length)), pad)
  ids[:, 0] = first
  ids[np.arange(rows), lengths - 1] = last
  return ids.astype(np.int32), mask.astype(np.int32)


# ---- 1. the InfoNCE text step ---------------------------------------------------------------
def bench_text(size: str) -> dict[str, Any]:
  import numpy as np
  import torch
  import transformers
  from flax import nnx

  from configs import retrieval_text
  from mocheg_jax.models.hf import bert as hf_bert
  from mocheg_jax.retrieval import text_task

  config = retrieval_text.get_config("small")
  r = config.retrieval
  vocab, hidden, layers, heads, ffn, positions = TEXT_SIZES[size]
  batch = _TEXT_BATCH.value or config.batch_size
  query_len, doc_len = _QUERY_LEN.value or r.max_query_len, _DOC_LEN.value or r.max_doc_len
  torch.manual_seed(_SEED.value)
  reference = transformers.BertModel(transformers.BertConfig(
      vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
      intermediate_size=ffn, max_position_embeddings=positions,
      hidden_dropout_prob=_DROPOUT.value, attention_probs_dropout_prob=_DROPOUT.value))
  with tempfile.TemporaryDirectory() as folder:
    reference.save_pretrained(folder, safe_serialization=True)
    encoder = hf_bert.load(folder, head="sentence")
  weights = nnx.state(encoder, nnx.Param).to_pure_dict()
  source = text_task.BertSource(encoder.config, "", "mean", encoder.bert.pooler is not None,
                                lambda: weights)
  with stubbed_data(text_task, bert_source=lambda m, wordpiece: source,
                    _dev_evaluator=lambda *a, **k: None):
    task = text_task.make_task(config, "")

  rng = np.random.default_rng(_SEED.value)
  cls, sep = (101, 102) if vocab > 1000 else (2, 3)
  q_ids, q_mask = token_rows(rng, batch, query_len, vocab, cls, sep, 0)
  p_ids, p_mask = token_rows(rng, batch, doc_len, vocab, cls, sep, 0)
  n_ids, n_mask = token_rows(rng, batch, doc_len, vocab, cls, sep, 0)
  data = dict(query_ids=q_ids, query_mask=q_mask, positive_ids=p_ids, positive_mask=p_mask,
              negative_ids=n_ids, negative_mask=n_mask,
              has_negative=np.ones(batch, bool), claim_id=np.arange(batch, dtype=np.int32))

  label = f"text {size}"
  print(f"[{label}] compiling our step ...", flush=True)
  ours = OursStep(task, config, {"encoder": weights}, data)

  t = {k: torch.tensor(v) for k, v in data.items()}
  t = {k: (v.long() if v.dtype == torch.int32 else v) for k, v in t.items()}

  def embed(ids, mask):  # BertModel + sentence-transformers' mean pooling.
    hidden_states = reference(input_ids=ids, attention_mask=mask).last_hidden_state
    m = mask.unsqueeze(-1).to(hidden_states.dtype)
    return (hidden_states * m).sum(1) / m.sum(1).clamp(min=1e-9)

  def loss():  # text_task's loss: queries vs positives + hard negatives, same-claim masking.
    queries = embed(t["query_ids"], t["query_mask"])
    docs = [embed(t["positive_ids"], t["positive_mask"])]
    keys = t["claim_id"]
    if r.hard_negatives:
      docs.append(embed(t["negative_ids"], t["negative_mask"]))
      doc_keys = torch.cat([keys, torch.full_like(keys, -1)])
      present = torch.cat([torch.ones(batch, dtype=torch.bool), t["has_negative"]])
      mask = torch_key_mask(keys, doc_keys) & present[None, :]
    else:
      mask = torch_key_mask(keys, keys)
    return torch_info_nce(queries, torch.cat(docs), r.scale, mask)

  names = {rule.hf: "encoder." + rule.ours for rule in hf_bert.rules(encoder)}
  ref = TorchStep(reference, loss, names, config)
  timing = time_sides(label, dict(ours=ours, reference=ref), batch)
  return dict(size=size, config="configs/retrieval_text.py:small", vocab=vocab, hidden=hidden,
              layers=layers, heads=heads, ffn=ffn, batch=batch, query_length=query_len,
              doc_length=doc_len, hard_negatives=bool(r.hard_negatives), scale=r.scale,
              dropout=_DROPOUT.value, real_query_tokens=int(q_mask.sum()),
              real_doc_tokens=int(p_mask.sum() + n_mask.sum()),
              parameters=sum(p.numel() for p in reference.parameters()),
              reference_attention=getattr(reference.config, "_attn_implementation", None),
              ours_compile_s=ours.compile_s, **timing,
              **_compare(ours, ref, compare=_DROPOUT.value == 0.0))


# ---- 2. the CLIP contrastive step -----------------------------------------------------------
def clip_hf_config(size: str, m, scale: float):
  """transformers' CLIPConfig of a size: the variant's random-CLIP fields, or a fixed shape."""
  import transformers
  _, shape = CLIP_SIZES[size]
  if shape is None:
    text = (_CLIP_VOCAB.value, m.text_hidden, m.text_layers, m.text_heads, m.text_mlp,
            m.max_positions)
    vision = (m.vision_hidden, m.vision_layers, m.vision_heads, m.vision_mlp, m.image_size,
              m.patch_size)
    projection = m.projection_dim
  else:
    text, vision, projection = shape["text"], shape["vision"], shape["projection"]
  bpe = text[0] == 49408
  ids = dict(pad_token_id=1, bos_token_id=49406, eos_token_id=49407) if bpe else dict(
      pad_token_id=0, bos_token_id=2, eos_token_id=3)
  return transformers.CLIPConfig(
      text_config=dict(vocab_size=text[0], hidden_size=text[1], num_hidden_layers=text[2],
                       num_attention_heads=text[3], intermediate_size=text[4],
                       max_position_embeddings=text[5], **ids),
      vision_config=dict(hidden_size=vision[0], num_hidden_layers=vision[1],
                         num_attention_heads=vision[2], intermediate_size=vision[3],
                         image_size=vision[4], patch_size=vision[5]),
      projection_dim=projection, logit_scale_init_value=math.log(scale))


def bench_clip(size: str) -> dict[str, Any]:
  import numpy as np
  import torch
  import transformers
  from flax import nnx

  from configs import retrieval_image
  from mocheg_jax.models.hf import clip as hf_clip
  from mocheg_jax.retrieval import image_task

  variant, _ = CLIP_SIZES[size]
  config = retrieval_image.get_config(variant)
  r = config.retrieval
  torch.manual_seed(_SEED.value)
  hf_config = clip_hf_config(size, config.model, r.scale)
  reference = transformers.CLIPModel(hf_config)
  with tempfile.TemporaryDirectory() as folder:
    reference.save_pretrained(folder, safe_serialization=True)
    model = hf_clip.load(folder)
  weights = nnx.state(model, nnx.Param).to_pure_dict()
  source = image_task.ClipSource(model.config, "", lambda: weights)
  with stubbed_data(image_task, clip_source=lambda *unused: source):
    task = image_task.make_task(config, "")  # Also derives config.freeze (paper: block 0).

  c = model.config
  batch = (_CLIP_BASE_BATCH.value if size == "base" else _CLIP_BATCH.value) or config.batch_size
  query_len = min(r.max_query_len, c.text.max_position_embeddings)
  rng = np.random.default_rng(_SEED.value)
  ids, mask = token_rows(rng, batch, query_len, c.text.vocab_size - 2, c.text.bos_token_id,
                         c.text.eos_token_id, c.text.pad_token_id)
  pixels = rng.uniform(-1.8, 2.1, (batch, c.vision.image_size, c.vision.image_size, 3))
  data = dict(query_ids=ids, query_mask=mask, image=pixels.astype(np.float32),
              claim_id=np.arange(batch, dtype=np.int32))

  label = f"clip {size}"
  print(f"[{label}] compiling our step ...", flush=True)
  ours = OursStep(task, config, weights, data)

  t_ids, t_mask = torch.tensor(ids).long(), torch.tensor(mask).long()
  t_pixels = torch.tensor(data["image"]).permute(0, 3, 1, 2).contiguous()  # NCHW.
  keys = torch.tensor(data["claim_id"])
  symmetric = bool(r.symmetric)
  if r.learnable_scale:
    raise NotImplementedError("the benchmark times the configs' fixed scale only")

  def loss():  # image_task.retrieval_loss in torch.
    text = reference.get_text_features(input_ids=t_ids, attention_mask=t_mask).pooler_output
    images = reference.get_image_features(pixel_values=t_pixels).pooler_output
    key_mask = torch_key_mask(keys, keys)
    value = torch_info_nce(text, images, r.scale, key_mask)
    if symmetric:
      value = (value + torch_info_nce(images, text, r.scale, key_mask.T)) / 2
    return value

  names = {rule.hf: rule.ours for rule in hf_clip.rules(c)}
  ref = TorchStep(reference, loss, names, config)
  timing = time_sides(label, dict(ours=ours, reference=ref), batch)
  params = sum(p.numel() for p in reference.parameters())
  return dict(size=size, config=f"configs/retrieval_image.py:{variant}",
              text=dict(vocab=c.text.vocab_size, hidden=c.text.hidden_size,
                        layers=c.text.num_hidden_layers, heads=c.text.num_attention_heads,
                        ffn=c.text.intermediate_size),
              vision=dict(hidden=c.vision.hidden_size, layers=c.vision.num_hidden_layers,
                          heads=c.vision.num_attention_heads, ffn=c.vision.intermediate_size,
                          image_size=c.vision.image_size, patch_size=c.vision.patch_size),
              projection=c.projection_dim, batch=batch, query_length=query_len,
              symmetric=symmetric, scale=r.scale, freeze=config.freeze,
              frozen_tensors=ref.frozen_count, parameters=params,
              trainable_parameters=sum(p.numel() for p in ref.trainable),
              reference_attention=getattr(reference.config, "_attn_implementation", None),
              ours_compile_s=ours.compile_s, **timing, **_compare(ours, ref, compare=True))


# ---- main -----------------------------------------------------------------------------------
def _check_flags() -> None:
  bad = []
  if not _PARTS.value or set(_PARTS.value) - set(PARTS):
    bad.append(f"--parts={','.join(_PARTS.value)} (from {', '.join(PARTS)})")
  if _TEXT_SIZE.value not in TEXT_SIZES:
    bad.append(f"--text_size={_TEXT_SIZE.value} (from {', '.join(sorted(TEXT_SIZES))})")
  if not _CLIP_SIZES.value or set(_CLIP_SIZES.value) - set(CLIP_SIZES):
    bad.append(f"--clip_sizes={','.join(_CLIP_SIZES.value)} "
               f"(from {', '.join(sorted(CLIP_SIZES))})")
  for name, value, low in (("repeats", _REPEATS.value, 1), ("warmup", _WARMUP.value, 0),
                           ("threads", _THREADS.value, 1), ("clip_vocab", _CLIP_VOCAB.value, 8),
                           ("text_batch", _TEXT_BATCH.value, 2),
                           ("clip_batch", _CLIP_BATCH.value, 2),
                           ("clip_base_batch", _CLIP_BASE_BATCH.value, 2),
                           ("query_length", _QUERY_LEN.value, 2),
                           ("doc_length", _DOC_LEN.value, 2)):
    if value is not None and value < low:
      bad.append(f"--{name}={value} (at least {low})")
  if not 0.0 <= _DROPOUT.value < 1.0:
    bad.append(f"--dropout={_DROPOUT.value} (in [0, 1))")
  if bad:
    sys.exit("bad flags: " + "; ".join(bad))


def _table(text: dict | None, clips: list[dict], header: str) -> str:
  lines = [header, "",
           "| step | ours ex/s | PyTorch ex/s | ratio | CPU-time ratio | per-round ratios | "
           "first loss ours / PyTorch (rel. diff) | compile s |",
           "|---|---|---|---|---|---|---|---|"]
  rows = []
  if text:
    rows.append((f"InfoNCE text ({text['size']}: {text['layers']}x{text['hidden']}, batch "
                 f"{text['batch']}, {text['query_length']}/{text['doc_length']} tokens"
                 f"{' + hard negatives' if text['hard_negatives'] else ''})", text))
  for c in clips:
    v = c["vision"]
    rows.append((f"CLIP ({c['size']}: text {c['text']['layers']}x{c['text']['hidden']}, "
                 f"vision {v['layers']}x{v['hidden']} {v['image_size']}px/{v['patch_size']}, "
                 f"batch {c['batch']}{', symmetric' if c['symmetric'] else ''})", c))
  for name, r in rows:
    o, h = r["runs"]["ours"], r["runs"]["reference"]
    diff = r["first_loss_relative_diff"]
    check = (f"{r['ours_first_loss']:.5f} / {r['reference_first_loss']:.5f} ({diff:.1e})"
             if diff is not None else "not compared (dropout)")
    paired = ", ".join(f"{p:.2f}" for p in r["paired_ratios"])
    rows_text = (f"| {name} | {o['examples_per_s']:.2f} | {h['examples_per_s']:.2f} | "
                 f"{r['ratio']:.2f}x | {r['cpu_ratio']:.2f}x | {paired} | {check} | "
                 f"{r['ours_compile_s']:.1f} |")
    lines.append(rows_text)
  return "\n".join(lines)


def main(argv: list[str]) -> None:
  del argv
  _check_flags()
  import jax
  import torch
  import transformers

  torch.set_num_threads(_THREADS.value)
  if _PRECISION.value == "bfloat16":  # Ours compiles ahead of time: set for the process.
    jax.config.update("jax_default_matmul_precision", "bfloat16")
  if _FLUSH.value and not torch.set_flush_denormal(True):
    print("this CPU cannot flush denormals in torch; timing without", flush=True)
  load_before = os.getloadavg()
  text = bench_text(_TEXT_SIZE.value) if "text" in _PARTS.value else None
  clips = ([bench_clip(s) for s in _CLIP_SIZES.value] if "clip" in _PARTS.value else [])
  load_after = os.getloadavg()

  failures = [f"{name}: first-step losses differ by {r['first_loss_relative_diff']:.1e}"
              for name, r in ([("text", text)] if text else [])
              + [(f"clip {c['size']}", c) for c in clips]
              if r["first_loss_relative_diff"] is not None
              and r["first_loss_relative_diff"] > LOSS_TOLERANCE[_PRECISION.value]]
  cpus = len(os.sched_getaffinity(0))
  header = (f"Contrastive training steps, {_PRECISION.value} products, median of "
            f"{_REPEATS.value} interleaved steps after "
            f"{_WARMUP.value} warm-up; {_THREADS.value} torch threads, XLA on {cpus} CPUs; "
            f"load average {load_before[0]:.1f} -> {load_after[0]:.1f}")
  print("\n" + _table(text, clips, header))
  output = dict(benchmark="contrastive", date=time.strftime("%Y-%m-%d %H:%M"),
                parts=[p for p in PARTS if p in _PARTS.value], repeats=_REPEATS.value,
                warmup=_WARMUP.value, torch_threads=_THREADS.value,
                torch_flush_denormal=_FLUSH.value, cpus=cpus,
                platform=jax.devices()[0].platform, machine=platform.platform(),
                jax=jax.__version__, torch=torch.__version__,
                transformers=transformers.__version__, load_before=load_before,
                load_after=load_after, target_ratio=TARGET_RATIO,
                timing="median of interleaved steps", precision=_PRECISION.value,
                text=text, clip=clips,
                loss_check_failures=failures)
  os.makedirs(os.path.dirname(_OUT.value) or ".", exist_ok=True)
  with open(_OUT.value, "w") as f:
    json.dump(output, f, indent=2)
  print(f"-> {_OUT.value}", file=sys.stderr)
  if failures:  # The timings of a comparison whose sides compute different things mislead.
    sys.exit("loss check failed: " + "; ".join(failures))


if __name__ == "__main__":
  from mocheg_jax.utils import host_memory
  host_memory.keep_freed_memory_if_asked()  # Both sides alike (mocheg_jax/utils/host_memory.py).
  app.run(main)
