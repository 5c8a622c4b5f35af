r"""Memory per device of every stage under every sharding preset (configs/presets.py).

  python launch/memory.py                        # the table (markdown), all presets
  python launch/memory.py --preset=tpu-v4-32     # one preset
  python launch/memory.py --flags --preset=tpu-v4-32 --stage=explain   # train.py flags

The model (bytes per device; the workload is each stage's `paper` config):

  params      = 4 (P_train + P_frozen) / S + 4 P_const
  gradients   = 4 P_train / S, twice that with accum_steps > 1 (the accumulator)
  Adam        = 8 P_train / S (first and second moments, float32)
  activations = 4 b E(t)

with S = fsdp x tensor (all of them, dcn included: fsdp shards each weight's "embed"
dimension, tensor its heads / MLP / vocabulary), b = batch_size / accum_steps / (data x
fsdp) rows per device, t = tensor, float32 parameters and compute (the configs' default
dtypes), and P_const the parameters the step reads but never trains (the generator's reward
classifier, a replicated step argument (Task.constants): every device holds all of it).

E(t), the float32 values per example kept for the backward pass, sums over the stage's
transformer layers (sequence s, width h, heads a, MLP f, without rematerialisation):

  encoder layer          s (4h + (4h + 2f)/t) + 2 a s^2 / t
      (LayerNorm inputs and the inputs of the QKV and MLP matmuls, s 4h; Q, K, V and the
       attention context, s 4h/t; MLP pre- and post-activation, s 2f/t; attention logits
       and probabilities, 2 a s^2/t)
  decoder layer (BART)   encoder layer(s_tgt) + s_tgt (2h + 2h/t) + 2 s_src h/t
                         + 2 a s_tgt s_src / t        (cross-attention)
  LM logits              2 s_tgt V / t                (logits and their softmax)

A term is divided by t only when its dimension (heads, MLP features, vocabulary) divides
by t, as the sharding rules replicate the others. The explanation generator counts two
decoder passes (the gold explanation's NLL and the sampled one's REINFORCE term) and the
KV cache of one decoding, 2 L (s_tgt + s_src) h / t. The verifier's E is the stance
model's attention over CLIP token states read from the feature store (CLIP itself does not
run in its step). Parameter counts are of our own modules (nnx.eval_shape) at the
checkpoints' sizes.

The formula counts what the backward pass must keep, not XLA's working buffers: compiling
the gradient of a BERT stack on CPU (memory_analysis().temp_size_in_bytes; MiniLM-L6 at
8 x 128 tokens and BERT-base at 2 x 512) needed 1.6x the formula's activations (352 vs
216 MiB and 1,823 vs 1,152 MiB). "peak" is therefore params + gradients + Adam +
1.6 x activations, and a preset "fits" when its peak is at most 90% of a device's memory
(the rest: the input batch, the compiled program, fragmentation).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
from typing import Any, Callable, Sequence

if __package__ in (None, ""):  # Run as a file: make `configs` and `launch` importable.
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import app, flags  # noqa: E402

from configs import presets  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIB = 2.0 ** 30
BYTES = 4  # float32 parameters, gradients, Adam moments and activations.
XLA_RATIO = 1.6  # XLA's temporaries / the formula's activations, measured (docstring).
FIT_FRACTION = 0.9  # Of a device's memory, for the peak (the batch and program need the rest).


@dataclasses.dataclass(frozen=True)
class Tower:
  """A transformer stack: layers, width h, heads a, MLP features f."""
  layers: int
  hidden: int
  heads: int
  ffn: int


MINILM_L6 = Tower(6, 384, 12, 1536)  # all-MiniLM-L6 / multi-qa-MiniLM / ms-marco-MiniLM-L-6.
BERT_BASE = Tower(12, 768, 12, 3072)
CLIP_TEXT = Tower(12, 512, 8, 2048)  # CLIP ViT-B/32.
CLIP_VISION = Tower(12, 768, 12, 3072)
CLIP_IMAGE_TOKENS = (224 // 32) ** 2 + 1  # 7 x 7 patches + the class token.
BART_LARGE = Tower(12, 1024, 16, 4096)  # Encoder and decoder alike.
BART_VOCAB = 50265


@dataclasses.dataclass(frozen=True)
class Params:
  """Parameter counts: trained, frozen but sharded with them, replicated constants."""
  train: int
  frozen: int = 0
  const: int = 0


# Counted with nnx.eval_shape on our modules at the paper checkpoints' sizes, with each
# paper config's freeze regex.
PARAMS = {
    "retrieval_text": Params(22_713_216),  # bert.SentenceEncoder, MiniLM-L6 with pooler.
    "rerank": Params(22_713_601),  # bert.CrossEncoder: MiniLM-L6 + a 1-logit head.
    # clip.CLIPModel ViT-B/32 151,277,313; embeddings and block 0 of both towers frozen.
    "retrieval_image": Params(151_277_313 - 37_976_576, 37_976_576),
    "verify": Params(2_892_806),  # stance.StanceDetector (512-d text, 768-d image, 1 head).
    # TruthfulnessClassifier on bert-base-uncased 109,582,787; embeddings + layer 0 frozen.
    "classifier": Params(109_582_787 - 30_925_056, 30_925_056),
    # bart.Bart large 406,341,721 (final_logits_bias frozen) + the reward model, a
    # TruthfulnessClassifier on a BART-large encoder (203,812,035), closed over.
    "explain": Params(406_341_721 - 50_265, 50_265, 203_812_035),
}


def _split(n: float, size: int, t: int) -> float:
  """n / t when the dimension `size` divides by t (else replicated: n)."""
  return n / t if size % t == 0 else n


def encoder_layer(s: int, tower: Tower, t: int) -> float:
  """float32 values one encoder layer keeps per sequence of s tokens (module docstring)."""
  h, a, f = tower.hidden, tower.heads, tower.ffn
  return (s * 4 * h + _split(s * 4 * h, a, t) + _split(s * 2 * f, f, t)
          + _split(2 * a * s * s, a, t))


def decoder_layer(s: int, s_src: int, tower: Tower, t: int) -> float:
  h, a = tower.hidden, tower.heads
  cross = s * 2 * h + _split(s * 2 * h + 2 * s_src * h + 2 * a * s * s_src, a, t)
  return encoder_layer(s, tower, t) + cross


def _stack(s: int, tower: Tower, t: int) -> float:
  return tower.layers * encoder_layer(s, tower, t)


def _activation_fns() -> dict[str, Callable[[Any], Callable[[int], float]]]:
  """stage -> (config -> (tensor -> E per example))."""

  def text(c):
    r = c.retrieval  # A claim, its positive sentence and (hard_negatives) a negative one.
    lengths = [r.max_query_len, r.max_doc_len] + ([r.max_doc_len] if r.hard_negatives else [])
    return lambda t: sum(_stack(s, MINILM_L6, t) for s in lengths)

  def rerank(c):
    return lambda t: _stack(c.rerank.max_len, MINILM_L6, t)

  def image(c):
    pixels = 3 * 224 * 224
    return lambda t: (_stack(c.retrieval.max_query_len, CLIP_TEXT, t)
                      + _stack(CLIP_IMAGE_TOKENS, CLIP_VISION, t) + pixels)

  def verify(c):
    v, d = c.verify, 512  # CLIP ViT-B/32 text width: the claim's and the fusion's.
    claim, texts = v.max_claim_len, v.max_text_items * v.max_text_len
    images = v.max_images * CLIP_IMAGE_TOKENS
    inputs = claim * d + texts * d + images * 768
    attention = 2 * (texts + images) * d + 2 * v.heads * claim * (texts + images)
    return lambda t: inputs + attention + 8 * claim * d + 2 * v.hidden

  def classifier(c):
    return lambda t: _stack(c.classifier.max_len, BERT_BASE, t)

  def explain(c):
    e, L = c.explain, BART_LARGE.layers
    src, tgt = e.max_source_len, e.max_target_len

    def fn(t):
      decoder_t = L * decoder_layer(tgt, src, BART_LARGE, t)
      logits = _split(2 * tgt * BART_VOCAB, BART_VOCAB, t)
      cache = _split(2 * L * (tgt + src) * BART_LARGE.hidden, BART_LARGE.heads, t)
      return _stack(src, BART_LARGE, t) + 2 * (decoder_t + logits) + cache

    return fn

  return {"retrieval_text": text, "rerank": rerank, "retrieval_image": image,
          "verify": verify, "classifier": classifier, "explain": explain}


ACTIVATIONS = _activation_fns()


def load_config(stage: str, variant: str = "paper"):
  """configs/STAGE.py's get_config(variant)."""
  path = os.path.join(REPO, "configs", f"{stage}.py")
  spec = importlib.util.spec_from_file_location(f"_mocheg_config_{stage}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(variant)


@dataclasses.dataclass(frozen=True)
class Estimate:
  """One row of the table; sizes in GiB per device."""
  preset: str
  stage: str
  mesh: dict[str, int]
  accum_steps: int
  rows: float  # Rows of a micro-batch per device.
  params: float
  grads: float
  adam: float
  activations: float
  hbm: float

  @property
  def total(self) -> float:
    return self.params + self.grads + self.adam + self.activations

  @property
  def peak(self) -> float:
    """The total with activations scaled to XLA's measured working set."""
    return self.params + self.grads + self.adam + XLA_RATIO * self.activations

  @property
  def fits(self) -> bool:
    return self.peak <= FIT_FRACTION * self.hbm


def estimate(preset: str, stage: str, config=None) -> Estimate:
  """The memory model (module docstring) for `stage`'s config under `preset`.

  Args:
    preset: a name of presets.PRESETS.
    stage: a name of presets.STAGES.
    config: the stage's config; None: its `paper` variant.
  """
  config = load_config(stage) if config is None else config
  chosen = presets.plan(preset, stage)
  mesh, accum = chosen["mesh"], chosen["accum_steps"] or config.accum_steps
  shards, t = presets.param_shards(mesh), mesh["tensor"] * mesh["dcn_tensor"]
  p = PARAMS[stage]
  rows = config.batch_size / accum / presets.dp_ways(mesh)
  per_example = ACTIVATIONS[stage](config)(t)
  return Estimate(
      preset=preset, stage=stage, mesh=mesh, accum_steps=accum, rows=rows,
      params=BYTES * ((p.train + p.frozen) / shards + p.const) / GIB,
      grads=BYTES * p.train / shards * (2 if accum > 1 else 1) / GIB,
      adam=2 * BYTES * p.train / shards / GIB,
      activations=BYTES * rows * per_example / GIB,
      hbm=presets.hardware(preset).hbm_gib)


@dataclasses.dataclass(frozen=True)
class Unsupported:
  """A stage a preset cannot run at its paper batch."""
  preset: str
  stage: str
  reason: str


def describe_mesh(mesh: dict[str, int]) -> str:
  text = f"{mesh['data']}x{mesh['fsdp']}x{mesh['tensor']}"
  dcn = [f"{k}={v}" for k, v in mesh.items() if k.startswith("dcn_") and v > 1]
  return text + (f" ({', '.join(dcn)})" if dcn else "")


def table(rows: Sequence[Estimate | Unsupported]) -> str:
  """The estimates as a markdown table (unsupported stages as one cell with the reason)."""
  head = ("| preset | stage | data x fsdp x tensor | accum | rows/device | params | grads | "
          f"Adam | activations | total | peak ({XLA_RATIO:g}x act.) | HBM | fits |")
  lines = [head, "|" + "---|" * 13]
  for r in rows:
    if isinstance(r, Unsupported):
      lines.append(f"| {r.preset} | {r.stage} | not supported: {r.reason} |" + " |" * 10)
      continue
    lines.append(
        f"| {r.preset} | {r.stage} | {describe_mesh(r.mesh)} | {r.accum_steps} | "
        f"{r.rows:g} | {r.params:.2f} | {r.grads:.2f} | {r.adam:.2f} | "
        f"{r.activations:.2f} | {r.total:.2f} | {r.peak:.2f} | {r.hbm:.1f} | "
        f"{'yes' if r.fits else 'NO'} ({100 * r.peak / r.hbm:.0f}%) |")
  return "\n".join(lines)


def all_estimates(preset_names: Sequence[str] | None = None
                  ) -> list[Estimate | Unsupported]:
  """Every (preset, stage) row, presets in order, stages in presets.STAGES order."""
  configs = {stage: load_config(stage) for stage in presets.STAGES}
  rows = []
  for p in preset_names or presets.preset_names():
    for s in presets.STAGES:
      if presets.supported(p, s):
        rows.append(estimate(p, s, configs[s]))
      else:
        rows.append(Unsupported(p, s, presets.PRESETS[p][s]["reason"]))
  return rows


def define_flags() -> None:
  """The command-line flags (defined only when run as a script)."""
  flags.DEFINE_string("preset", None, "One preset (default: all).")
  flags.DEFINE_string("stage", None, "With --flags: the stage (a configs/ name).")
  flags.DEFINE_bool("flags", False, "Print the scripts/train.py flags of --preset and "
                    "--stage instead of the table.")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  f = flags.FLAGS
  try:
    if f.flags:
      if not (f.preset and f.stage):
        raise presets.PresetError("--flags needs --preset and --stage")
      print(" ".join(presets.preset_flags(f.preset, f.stage)))
      return
    names = None
    if f.preset:
      presets.hardware(f.preset)
      names = [f.preset]
    print(table(all_estimates(names)))
  except presets.PresetError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
  define_flags()
  app.run(main)
