"""The image retriever's training task: CLIP, claim text as the query, KB images as documents.

Each example is (claim, one of its relevant KB images). Every claim of the global batch is
scored against every image of the global batch (in-batch negatives from all devices) with
the same InfoNCE as the text retriever (contrastive.info_nce): cosine similarity times a
scale, cross-entropy towards the claim's own image. Copies of one claim in a batch do not
count as each other's negatives (contrastive.same_key_mask).

Loss direction and scale. The reference trains CLIP through sentence-transformers'
MultipleNegativesRankingLoss: query -> document only, cosine x 20, CLIP's own `logit_scale`
unused. That is the default here (`retrieval.scale = 20`, `learnable_scale = False`,
`symmetric = False`). `learnable_scale = True` uses CLIP's `logit_scale` parameter instead
(exp, clamped at 100 as CLIP does; a loaded checkpoint keeps its value, a random model
starts at `retrieval.scale`); `symmetric = True` adds the image -> text direction and
averages the two, as CLIP's own pre-training does. With a fixed scale `logit_scale` gets
no gradient, and its path matches the optimizer's default no-decay regex, so it stays put.

The model (`model.init`): a local HF CLIPModel folder (ViT-B/32 for the paper), whose
tokenizer must be in the same folder; a CLIP training workdir (its best checkpoint and its
tokenizer: caption pre-training, caption_task.py, for the synthetic worlds); or "random": a
small CLIP on the world's own WordPiece vocabulary. That text tower pools the first [SEP]
(the last token the tokenizer adds), so `eos_token_id` is the tokenizer's [SEP] id and
padding uses its [PAD] id.

Freezing. `model.freeze_text_layers = n` freezes the text tower's embeddings (token and
position) and its blocks 0..n-1; `model.freeze_vision_layers = n` the vision tower's
embeddings (patch, class, position), its pre-layernorm and blocks 0..n-1. The task turns
the two numbers into the trainer's `config.freeze` regex (`freeze_pattern`) before the
trainer reads it: `make_task` runs before the trainer builds the model (in training and in
restore.load_trained), and a locked ConfigDict still accepts new values for existing
fields. The derived regex is saved with the checkpoint's config; a `config.freeze` set by
hand is kept when both numbers are 0 and is an error otherwise (ambiguous). The
reference's `freeze_part_bert(model, 17, 20)` freezes the first 18 text and 21 vision
parameter tensors of HF's CLIP, which are exactly the embeddings (+ pre-LN) and block 0 of
each tower: `freeze_text_layers = freeze_vision_layers = 1` (the `paper` variant).

What a random CLIP can learn on the synthetic worlds: the kind of picture a claim's words
ask for (bridges, medals, a crest, a chart) and, less reliably, colours and counts. Most
gold images are signs or captions whose text names the entity and value; matching those
takes reading, which a pretrained CLIP brings and a small random one does not learn from
a few hundred claims. So on the small world gold images rise to about the top tenth of
the KB, but rarely into the top 10 (dev R@10 about 5x chance).
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from mocheg_jax.data import pipelines
from mocheg_jax.data.mocheg import MochegRelease
from mocheg_jax.data.report import MochegInputError
from mocheg_jax.data.tokenizers import load_tokenizer
from mocheg_jax.models import clip
from mocheg_jax.models.hf import convert as hf_convert
from mocheg_jax.retrieval import contrastive
from mocheg_jax.retrieval import evaluation
from mocheg_jax.retrieval.image_encoders import ImageEncoders
from mocheg_jax.train.data import prepared_data
from mocheg_jax.train.task import Evaluator, Task
from mocheg_jax.utils import paths

DEV_SPLIT = "val"
RANDOM = "random"
CHECKPOINT_DIR = "checkpoints"  # A training workdir (mocheg_jax.train.loop.CHECKPOINT_DIR).

# Parameters below block 0 of each tower: they are frozen with the lowest block.
_TEXT_STEM = ("token_embedding", "position_embedding")
_VISION_STEM = ("patch_embedding", "class_embedding", "position_embedding", "pre_layrnorm")


def model_config() -> ml_collections.ConfigDict:
  m = ml_collections.ConfigDict()
  m.init = RANDOM  # "random", or a local HF CLIPModel folder (with its tokenizer).
  m.dtype = "float32"  # Compute dtype (parameters stay config.param_dtype).
  m.freeze_text_layers = 0  # Embeddings + this many lowest text blocks are not trained.
  m.freeze_vision_layers = 0  # Embeddings, pre-LN + this many lowest vision blocks.
  # Shape of a randomly initialised CLIP (ignored when loading a folder).
  m.text_hidden = 64
  m.text_layers = 2
  m.text_heads = 4
  m.text_mlp = 128
  m.max_positions = 64
  m.image_size = 64
  m.patch_size = 16
  m.vision_hidden = 64
  m.vision_layers = 2
  m.vision_heads = 4
  m.vision_mlp = 128
  m.projection_dim = 64
  return m


def retrieval_config() -> ml_collections.ConfigDict:
  r = ml_collections.ConfigDict()
  r.scale = 20.0  # Fixed logit scale (the reference's), or the random model's initial one.
  r.learnable_scale = False  # True: CLIP's own logit_scale parameter, learnt.
  r.symmetric = False  # True: average the text -> image and image -> text losses (CLIP).
  r.max_query_len = 77  # Claim tokens, special tokens included (capped by the model).
  r.eval_max_corpus = 20000  # Dev search over gold + random kept KB images up to this (0: all).
  r.eval_batch_size = 64
  return r


# ---- the model ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ClipSource:
  """Where the CLIP comes from: its config, tokenizer folder and (maybe) weights."""
  config: clip.CLIPConfig
  tokenizer_dir: str
  weights: Callable[[], dict] | None  # Pure nested dict of every parameter, loaded lazily.


def _check_pooling_token(tokenizer, config: clip.CLIPTextConfig, source: str) -> None:
  """The text tower pools the first `eos_token_id`: the tokenizer must end texts with it."""
  if config.eos_token_id == clip.LEGACY_EOS_TOKEN_ID:
    return  # HF's legacy rule pools the highest id; CLIP's own BPE puts EOT there.
  ids = tokenizer("")["input_ids"]
  if not ids or ids[-1] != config.eos_token_id:
    raise MochegInputError(
        f"{source}: the tokenizer ends a text with id {ids[-1] if ids else None}, but the "
        f"CLIP text tower pools token id {config.eos_token_id} (eos_token_id)")


def random_clip_config(m: ml_collections.ConfigDict, scale: float, tokenizer
                       ) -> clip.CLIPConfig:
  """A small CLIP on a BERT-style tokenizer: it pools the [SEP] the tokenizer appends."""
  sep, pad = tokenizer.sep_token_id, tokenizer.pad_token_id
  if sep is None or sep == clip.LEGACY_EOS_TOKEN_ID:
    # Id 2 would switch the tower to HF's legacy pooling (the highest id in the row).
    raise MochegInputError(f"tokenizer {tokenizer.name_or_path}: its [SEP] id {sep} cannot "
                           "be the pooled token of a random CLIP (needs a [SEP] id other "
                           f"than {clip.LEGACY_EOS_TOKEN_ID})")
  text = clip.CLIPTextConfig(
      vocab_size=len(tokenizer), hidden_size=m.text_hidden, intermediate_size=m.text_mlp,
      num_attention_heads=m.text_heads, num_hidden_layers=m.text_layers,
      max_position_embeddings=m.max_positions, pad_token_id=pad,
      bos_token_id=tokenizer.cls_token_id, eos_token_id=sep)
  vision = clip.CLIPVisionConfig(
      hidden_size=m.vision_hidden, intermediate_size=m.vision_mlp,
      num_attention_heads=m.vision_heads, num_hidden_layers=m.vision_layers,
      image_size=m.image_size, patch_size=m.patch_size)
  if m.image_size % m.patch_size:
    raise ValueError(f"config.model.image_size {m.image_size} is not a multiple of "
                     f"config.model.patch_size {m.patch_size}")
  return clip.CLIPConfig(text=text, vision=vision, projection_dim=m.projection_dim,
                         logit_scale_init_value=math.log(scale))


def clip_source(m: ml_collections.ConfigDict, r: ml_collections.ConfigDict,
                wordpiece_dir: str, param_dtype, moved: paths.Moved = None) -> ClipSource:
  """Where `model.init` (m) says the CLIP comes from; `moved`: a workdir it names lies in a
  folder copied from elsewhere (its saved paths are read as under the copy)."""
  if not m.init:
    raise ValueError("config.model.init is empty: give a local HF CLIP folder "
                     "(--config.model.init=PATH, e.g. clip-vit-base-patch32) or 'random'")
  if m.init == RANDOM:
    tokenizer = load_tokenizer(wordpiece_dir)
    config = random_clip_config(m, r.scale, tokenizer)
    _check_pooling_token(tokenizer, config.text, wordpiece_dir)
    return ClipSource(config, wordpiece_dir, None)
  folder = os.fspath(m.init)
  if not os.path.isdir(folder):
    what = "is not a folder" if os.path.exists(folder) else "does not exist"
    raise MochegInputError(f"config.model.init {folder!r} {what} (expected 'random', a "
                           "CLIP training workdir or a local HF CLIPModel folder)")
  if os.path.isdir(os.path.join(folder, CHECKPOINT_DIR)):
    return _workdir_source(folder, r, moved)
  config = clip.CLIPConfig.from_hf(hf_convert.read_config(folder),
                                   source=os.path.join(folder, "config.json"))
  _check_pooling_token(load_tokenizer(folder), config.text, folder)

  def weights() -> dict:
    from mocheg_jax.models.hf import clip as hf_clip  # Read only on a fresh start.
    model = hf_clip.load(folder, param_dtype=param_dtype)
    return _with_scale(nnx.state(model, nnx.Param).to_pure_dict(), r)

  return ClipSource(config, folder, weights)


def _with_scale(values: dict, r: ml_collections.ConfigDict) -> dict:
  if not r.learnable_scale:  # The saved model then says which scale the loss used.
    values["logit_scale"] = jnp.log(jnp.asarray(r.scale, jnp.float32))
  return values


def _workdir_source(workdir: str, r: ml_collections.ConfigDict,
                    moved: paths.Moved = None) -> ClipSource:
  """The best CLIP of a training workdir (caption pre-training, or an image retriever) and
  the tokenizer it was trained with."""
  from mocheg_jax.train.restore import load_trained  # restore imports the task modules.
  trained = load_trained(workdir, "best", moved)
  if not isinstance(trained.model, clip.CLIPModel):
    raise MochegInputError(f"config.model.init {workdir}: its task ({trained.config.task}) "
                           "does not train a CLIP")
  return ClipSource(trained.model.config, trained.task.inference.tokenizer_dir, lambda: (
      _with_scale(nnx.state(trained.model, nnx.Param).to_pure_dict(), r)))


def freeze_pattern(text_layers: int, vision_layers: int, config: clip.CLIPConfig) -> str:
  """The `config.freeze` regex for the lowest layers of both towers ("" when none).

  A tower's embeddings (and the vision pre-layernorm) lie below block 0 and are frozen with
  it; the final / post layer norms and the projections stay trainable.

  Raises:
    ValueError: a count outside [0, the tower's number of blocks], naming the field.
  """
  parts = []
  for field, count, tower, stem, total in (
      ("freeze_text_layers", text_layers, "text_model", _TEXT_STEM,
       config.text.num_hidden_layers),
      ("freeze_vision_layers", vision_layers, "vision_model", _VISION_STEM,
       config.vision.num_hidden_layers)):
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= total:
      raise ValueError(f"config.model.{field} must be an integer in [0, {total}] (the "
                       f"tower's blocks), got {count!r}")
    if count:
      blocks = "|".join(str(i) for i in range(count))
      parts.append(rf"^{tower}\.({'|'.join(stem)}|layers\.({blocks}))(\.|$)")
  return "|".join(parts)


def _apply_freeze(config: ml_collections.ConfigDict, derived: str) -> None:
  """Writes the derived regex into config.freeze (see the module docstring)."""
  if not derived or config.freeze == derived:
    return
  if config.freeze:
    raise ValueError(
        f"config.freeze is set ({config.freeze!r}) and config.model.freeze_text_layers / "
        f"freeze_vision_layers ask for {derived!r}: use one of the two (set both counts to "
        "0 to freeze by regex alone)")
  config.freeze = derived


# ---- the loss -------------------------------------------------------------------------------
def retrieval_loss(text: jax.Array, images: jax.Array, keys: jax.Array, scale: jax.Array,
                   symmetric: bool = False) -> tuple[jax.Array, jax.Array]:
  """InfoNCE of claims [B, P] against their images [B, P] (row i's positive is image i).

  Rows sharing a key (one claim drawn twice) are not negatives of each other.

  Returns:
    (loss, accuracy): text -> image, or the mean of both directions when `symmetric`.
  """
  labels = jnp.arange(text.shape[0])
  mask = contrastive.same_key_mask(keys, keys, labels)  # [B, B], symmetric.
  loss, accuracy = contrastive.info_nce(text, images, scale, labels=labels, doc_mask=mask)
  if symmetric:
    back, back_accuracy = contrastive.info_nce(images, text, scale, labels=labels,
                                               doc_mask=mask.T)
    loss, accuracy = (loss + back) / 2, (accuracy + back_accuracy) / 2
  return loss, accuracy


def logit_scale(model: clip.CLIPModel) -> jax.Array:
  """CLIP's learnt scale, exp(logit_scale) clamped at 100 as CLIP does."""
  return jnp.exp(jnp.minimum(model.logit_scale[...].astype(jnp.float32),
                             contrastive.MAX_LOG_SCALE))


# The batch layout of the task (and of caption pre-training, caption_task.py).
BATCH_AXES = {"query_ids": ("batch", "length"), "query_mask": ("batch", "length"),
              "image": ("batch", None, None, None), "claim_id": ("batch",)}


def clip_loss(r: ml_collections.ConfigDict) -> Callable:
  """`loss(model, batch)`: `retrieval_loss` of a batch in BATCH_AXES' layout, with the scale
  and directions of `config.retrieval` (r)."""
  learnable, fixed, symmetric = bool(r.learnable_scale), float(r.scale), bool(r.symmetric)
  if not fixed > 0:
    raise ValueError(f"config.retrieval.scale must be positive, got {r.scale!r}")

  def loss(model: clip.CLIPModel, batch: dict[str, Any]):
    text = model.encode_text(batch["query_ids"], batch["query_mask"])  # [B, P]
    images = model.encode_image(batch["image"])  # [B, P]
    scale = logit_scale(model) if learnable else jnp.asarray(fixed, jnp.float32)
    value, accuracy = retrieval_loss(text, images, batch["claim_id"], scale, symmetric)
    return value, {"batch_accuracy": accuracy, "scale": scale}

  return loss


# ---- the task -------------------------------------------------------------------------------
def make_task(config: ml_collections.ConfigDict, workdir: str, moved: paths.Moved = None
              ) -> Task:
  """`moved`: the workdir was trained elsewhere and copied (restore.load_trained relocated
  `config`); a CLIP workdir it starts from is copied along and is read the same way."""
  data = prepared_data(config, workdir)
  m, r = config.model, config.retrieval
  param_dtype = jnp.dtype(config.param_dtype)
  source = clip_source(m, r, data.wordpiece, param_dtype, moved)
  _apply_freeze(config, freeze_pattern(m.freeze_text_layers, m.freeze_vision_layers,
                                       source.config))
  dtype = jnp.dtype(m.dtype)
  max_query_len = min(r.max_query_len, source.config.text.max_position_embeddings)
  if max_query_len < 2:
    raise ValueError(f"config.retrieval.max_query_len must be at least 2, got "
                     f"{r.max_query_len}")

  def model() -> clip.CLIPModel:
    return clip.CLIPModel(source.config, dtype=dtype, param_dtype=param_dtype,
                          rngs=nnx.Rngs(config.seed))

  def train_data(local_batch: int):
    loader = pipelines.LoaderConfig.training(local_batch, config.seed, config.data)
    pipeline = pipelines.image_retrieval(data.tfds, "train", source.tokenizer_dir, loader,
                                         max_query_len=max_query_len,
                                         image_size=source.config.vision.image_size)
    return iter(pipeline.dataset)

  encoders = ImageEncoders(source.tokenizer_dir, max_query_len, r.eval_batch_size)
  return Task(model=model, loss=clip_loss(r), batch_axes=BATCH_AXES, train_data=train_data,
              evaluators=(Evaluator("dev", dev_evaluator(
                  data.release, encoders, r.eval_max_corpus, config.seed)),),
              initial_params=source.weights,
              inference=encoders)


# ---- the dev evaluator ----------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class DevCorpus:
  """The dev queries (claims with image qrels) and the KB images they are searched in."""
  query_keys: list[str]  # str(claim_id)
  query_texts: list[str]
  image_names: list[str]  # Kept (cleaned) KB images, capped by eval_max_corpus.
  image_paths: list[str]
  qrels: dict[str, dict[str, int]]  # str(claim_id) -> {image name: relevancy}


def dev_corpus(release_dir: str, max_corpus: int, seed: int,
               split: str = DEV_SPLIT) -> DevCorpus:
  release = MochegRelease(release_dir)
  qrels = {str(c): judged for c, judged in release.image_qrels(split).items()
           if any(rel > 0 for rel in judged.values())}
  claims = [c for c in release.claims(split) if str(c.claim_id) in qrels]
  names = release.kb_images(clean=True)
  keep = evaluation.candidate_corpus(names, qrels, max_corpus, seed)
  names = [names[i] for i in keep]
  return DevCorpus([str(c.claim_id) for c in claims], [c.claim for c in claims], names,
                   [release.image_path(n) for n in names], qrels)


def dev_evaluator(release_dir: str, encoders: ImageEncoders, max_corpus: int, seed: int,
                  split: str = DEV_SPLIT):
  """`run(model, step)`: recall / NDCG / MRR of `split`'s claims over the kept KB images,
  both sides embedded as the trained model's users embed them (`encoders`).

  The corpus is listed on the first run, not when the task is built, so rebuilding a task
  to load a trained model (restore.load_trained) does not scan the KB's images.
  """
  built: list[Callable] = []

  def build() -> Callable:
    corpus = dev_corpus(release_dir, max_corpus, seed, split)
    return evaluation.retrieval_evaluator(
        corpus.query_keys, lambda model: encoders.encode_queries(model, corpus.query_texts),
        corpus.image_names, lambda model: encoders.encode_documents(model, corpus.image_paths),
        corpus.qrels)

  def run(model: clip.CLIPModel, step: int):
    if not built:
      built.append(build())
    yield from built[0](model, step)

  return run
