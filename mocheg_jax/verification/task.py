"""Claim verification as a trainer task: the stance detector on frozen-CLIP token states.

The frozen CLIP (`verify.clip`) is a trained image retriever's workdir (the main job uses
its own), a local HF CLIP folder (the paper's ViT-B/32), or "random" (a small random CLIP
of shape `verify.clip_shape`, for tests). Claims and text items go through its text tower
(the reference) or, with `verify.text_encoder`, through a frozen MiniLM (the packaged one, a
text retriever's workdir, or a sentence-transformers folder): a small CLIP trained only for
image retrieval has text token states too weak to compare the claim's values with the
evidence's. Its token states for every claim, text item and
image the run needs are computed once into a feature store (`verify.features_dir`, default
WORKDIR/features; stages sharing a CLIP can share one) and training reads only the store.
With `verify.tune_vision_layers = k` (beyond the paper) the CLIP's last k vision blocks are
part of the trained model, started from the CLIP's weights (vision_top.py); the store then
holds the image tokens entering them.

Evidence modes are config switches of one task: `verify.evidence` is "gold" (each claim's
own evidence and proof images) or a retrieval result CSV (system evidence), and
`verify.use_text` / `verify.use_image` keep one modality, both, or neither (the claim-only
model of the "no evidence" row). Loss: class-weighted cross-entropy with
w_c = 3 n_c^-p / sum_j n_j^-p over the training claims (p = `verify.loss_weight_power`).
Model selection: the best `dev/macro_f1`, with early stopping by config.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from mocheg_jax.data import pipelines
from mocheg_jax.data.labels import LABEL_NAMES
from mocheg_jax.data.mocheg import MochegRelease
from mocheg_jax.data.report import MochegInputError
from mocheg_jax.data.tokenizers import load_tokenizer, minilm_dir
from mocheg_jax.metrics.classification import classification_report
from mocheg_jax.models import clip
from mocheg_jax.parallel import distributed
from mocheg_jax.retrieval import image_task
from mocheg_jax.train.data import prepared_data
from mocheg_jax.train.task import Evaluator, Task
from mocheg_jax.utils import paths
from mocheg_jax.verification import evidence as evidence_lib
from mocheg_jax.verification import features
from mocheg_jax.verification import stance
from mocheg_jax.verification import vision_top
from mocheg_jax.verification.data import VerificationBatches

RANDOM = "random"
GOLD = "gold"
CLIP_TEXT = "clip"
MINILM = "minilm"
DEV_SPLIT = "val"
CHECKPOINT_DIR = "checkpoints"  # A training workdir (mocheg_jax.train.loop.CHECKPOINT_DIR).


def verify_config() -> ml_collections.ConfigDict:
  v = ml_collections.ConfigDict()
  v.clip = RANDOM  # A trained image retriever's workdir, a local HF CLIP folder, or random.
  v.clip_shape = image_task.model_config()  # Shape of the random CLIP (ignored otherwise).
  # Token states of claims and text items: "clip" (its text tower, as the reference), or a
  # frozen sentence encoder: "minilm" (the packaged all-MiniLM-L6-v2), a text retriever's
  # training workdir, or a local sentence-transformers folder.
  v.text_encoder = CLIP_TEXT
  v.evidence = GOLD  # "gold", or a retrieval result CSV (system evidence) for training.
  v.use_text = True
  v.use_image = True
  v.hidden = 512  # Fusion output (the stance vector), as the reference.
  v.heads = 1
  v.text_attention = "learned"  # or "cosine" (stance.StanceConfig.text_attention).
  v.token_match = False  # Exact token-id matches as a text feature (stance.StanceConfig).
  # Beyond the paper: also whether neighbouring claim tokens stand side by side in the item
  # (stance.StanceConfig.phrase_match): look-alike names share their words in another order.
  # Measured without gain on the small world's system evidence over five seeds (README,
  # Table 4 notes).
  v.phrase_match = False
  v.item_pool = "mean"  # or "max": how items are pooled (stance.StanceConfig.item_pool).
  v.image_query = "states"  # or "words" (stance.StanceConfig.image_query).
  # Beyond the paper: each image also gives the model CLIP's claim-image cosine
  # (stance.StanceConfig.image_score); the store then keeps CLIP's embeddings.
  v.image_score = False
  # () gives the model that cosine as one number; thresholds give it as soft steps, one per
  # threshold (stance.StanceConfig.score_thresholds), which it learns a cut-off from.
  v.score_thresholds = ()
  # Beyond the paper: each image also gives the model CLIP's image and claim embeddings and
  # their product (stance.StanceConfig.image_embeds); the store then keeps the embeddings.
  # Measured without gain on the small world's system evidence (README, Table 4 notes).
  v.image_embeds = False
  # Beyond the paper: each text item also reads what it says beyond the claim's words
  # (stance.StanceConfig.item_context), meant to tell a restatement of the claim from
  # support; measured without gain on the small world (README, Table 4 notes).
  v.item_context = False
  # Beyond the paper: a learned relevance gate scales each text item before the items are
  # pooled, trained also by `item_gate_weight` x binary cross-entropy against which items are
  # the claim's gold sentences (stance.StanceConfig.item_gate). Meant for training on system
  # evidence; on gold evidence every item is relevant.
  v.item_gate = False
  v.item_gate_weight = 1.0
  # The same gate on the image items, trained against which retrieved images the image
  # qrels match to one of the claim's proof images (stance.StanceConfig.image_gate), with
  # the same weight; measured worse than the text gate alone on the small world (README,
  # Table 4 notes).
  v.image_gate = False
  # Beyond the paper: trained on system evidence (`evidence` a result CSV), each train claim
  # also comes with its gold evidence, as a second example of the epoch (every gold item
  # relevant for the gates). The verifier then reads gold evidence as well as a gold-trained
  # one; model selection stays on the dev claims' `evidence`.
  v.train_also_gold = False
  # "attention" (the reference), "pairs" or "match" (stance.StanceConfig.image_read).
  v.image_read = "attention"
  v.pair_dim = 64
  v.match_heads = 8
  v.match_pool = "patches"  # or "image" or "flat" (stance.StanceConfig.match_pool).
  v.dropout = 0.0
  v.missing_modality = "reference"  # or "zeros" (see stance.py).
  # Beyond the paper: the CLIP's last k vision blocks train with the stance model (the store
  # then caches the tokens entering them; see vision_top.py). 0: all of CLIP frozen.
  v.tune_vision_layers = 0
  v.loss_weight_power = 2.0
  v.max_claim_len = 77
  v.max_text_len = 77
  v.max_text_items = 16
  v.max_images = 4
  v.features_dir = ""  # "": WORKDIR/features.
  v.feature_dtype = "float16"
  v.encode_batch_size = 64
  v.eval_batch_size = 64
  return v


def input_files(config: ml_collections.ConfigDict) -> list[str]:
  """The result CSV of a verifier trained on system evidence (train/inputs.py): a rerun
  after the retrieval stage rewrote it trains anew instead of keeping the old model."""
  return [] if config.verify.evidence == GOLD else [config.verify.evidence]


def config_defaults() -> dict:
  """This task's config sections (train.task.config_defaults: old checkpoints still load)."""
  return {"verify": verify_config()}


# ---- the frozen CLIP ------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class FrozenClip:
  """The frozen encoders of a verifier: CLIP (images; texts too unless `text_model`)."""
  model: clip.CLIPModel
  tokenizer: Any
  text_model: Any = None  # A bert.SentenceEncoder for the texts, or None: CLIP's text tower.
  text_tokenizer: Any = None

  @property
  def texts_tokenizer(self):
    return self.tokenizer if self.text_model is None else self.text_tokenizer


def _source_kind(field: str, source: str, names: tuple[str, ...], expected: str) -> str:
  """`source` itself when it is one of `names`, else "workdir" (a trainer workdir) or
  "folder" (a model folder); anything else is an error naming config.verify.<field>."""
  if source in names:
    return source
  if not source or not os.path.isdir(source):
    raise MochegInputError(f"config.verify.{field} {source!r} is not a folder (expected "
                           f"{expected})")
  return "workdir" if os.path.isdir(os.path.join(source, CHECKPOINT_DIR)) else "folder"


def _clip_kind(source: str) -> str:
  return _source_kind("clip", source, (RANDOM,), "'random', an image retriever's training "
                      "workdir, or a local HF CLIP folder")


def _text_encoder_kind(source: str) -> str:
  return _source_kind("text_encoder", source, (CLIP_TEXT, MINILM), "'clip', 'minilm', a "
                      "text retriever's training workdir, or a local sentence-transformers "
                      "folder")


def _workdir_fingerprint(folder: str) -> dict:
  from mocheg_jax.train.restore import checkpoint_step  # A trainer workdir.
  checkpoints, step = checkpoint_step(folder, "best")
  checkpoints.close()
  return {"workdir": folder, "step": int(step)}


def clip_fingerprint(v: ml_collections.ConfigDict, wordpiece_dir: str, seed: int) -> dict:
  """Who encodes the feature store, known without loading any weights."""
  out = _clip_fingerprint(v, wordpiece_dir, seed)
  if v.tune_vision_layers:  # The store holds the tokens entering the tuned blocks.
    out["tune_vision_layers"] = int(v.tune_vision_layers)
  if _needs_embeddings(v):  # The store holds CLIP's embeddings too.
    out["embeddings"] = True
  kind = _text_encoder_kind(v.text_encoder)
  if kind != CLIP_TEXT:
    folder = os.path.abspath(v.text_encoder)
    out["text_encoder"] = (MINILM if kind == MINILM else _workdir_fingerprint(folder)
                           if kind == "workdir" else {"folder": folder})
  return out


def _clip_fingerprint(v: ml_collections.ConfigDict, wordpiece_dir: str, seed: int) -> dict:
  kind = _clip_kind(v.clip)
  if kind == RANDOM:
    return {"clip": RANDOM, "seed": seed, "shape": v.clip_shape.to_dict(),
            "tokenizer": os.path.abspath(wordpiece_dir)}
  folder = os.path.abspath(v.clip)
  if kind == "workdir":
    return {"clip": folder, "step": _workdir_fingerprint(folder)["step"]}
  return {"clip": folder}


def load_clip(v: ml_collections.ConfigDict, wordpiece_dir: str, seed: int,
              moved: paths.Moved = None) -> FrozenClip:
  """The CLIP named by `verify.clip` and the text encoder named by `verify.text_encoder`
  (`moved`: their workdirs lie in a folder copied from elsewhere; restore.load_trained)."""
  frozen = load_clip_only(v, wordpiece_dir, seed, moved)
  kind = _text_encoder_kind(v.text_encoder)
  if kind == CLIP_TEXT:
    return frozen
  from mocheg_jax.models import sentence_transformers as st  # Only for these options.
  if kind == "workdir":
    from mocheg_jax.train.restore import load_trained
    trained = load_trained(os.path.abspath(v.text_encoder), "best", moved)
    encoder = getattr(trained.model, "encoder", None)
    if encoder is None or not hasattr(trained.task.inference, "tokenizer_dir"):
      raise MochegInputError(f"config.verify.text_encoder {v.text_encoder}: its task "
                             f"({trained.config.task}) is not a text retriever")
    return dataclasses.replace(frozen, text_model=encoder, text_tokenizer=load_tokenizer(
        trained.task.inference.tokenizer_dir))
  folder = str(minilm_dir()) if kind == MINILM else os.path.abspath(v.text_encoder)
  sentence_model = st.load(folder)
  return dataclasses.replace(frozen, text_model=sentence_model.encoder,
                             text_tokenizer=sentence_model.tokenizer)


def load_clip_only(v: ml_collections.ConfigDict, wordpiece_dir: str, seed: int,
                   moved: paths.Moved = None) -> FrozenClip:
  """The CLIP named by `verify.clip`, without any separate text encoder."""
  kind = _clip_kind(v.clip)
  if kind == RANDOM:
    tokenizer = load_tokenizer(wordpiece_dir)
    config = image_task.random_clip_config(v.clip_shape, 20.0, tokenizer)
    return FrozenClip(clip.CLIPModel(config, rngs=nnx.Rngs(seed)), tokenizer)
  folder = os.path.abspath(v.clip)
  if kind == "workdir":
    from mocheg_jax.train.restore import load_trained
    trained = load_trained(folder, "best", moved)
    if not isinstance(trained.model, clip.CLIPModel):
      raise MochegInputError(f"config.verify.clip {folder}: its task ({trained.config.task})"
                             " does not train a CLIP")
    return FrozenClip(trained.model, load_tokenizer(trained.task.inference.tokenizer_dir))
  from mocheg_jax.models.hf import clip as hf_clip  # A local HF CLIP folder.
  return FrozenClip(hf_clip.load(folder), load_tokenizer(folder))


# ---- the model and its inputs ---------------------------------------------------------------
class ExtraInputs(NamedTuple):
  """Which optional inputs the model reads (each needs the modality it belongs to)."""
  token_match: bool  # text_match
  phrase_match: bool  # text_phrase_match
  word_queries: bool  # claim_ids
  image_score: bool  # image_score
  image_embeds: bool  # image_embed, claim_embed


def _extra_inputs(v: ml_collections.ConfigDict) -> ExtraInputs:
  return ExtraInputs(token_match=bool(v.use_text and v.token_match),
                     phrase_match=bool(v.use_text and v.phrase_match),
                     word_queries=bool(v.use_image and v.image_query == "words"),
                     image_score=bool(v.use_image and v.image_score),
                     image_embeds=bool(v.use_image and v.image_embeds))


def _needs_embeddings(v: ml_collections.ConfigDict) -> bool:
  return bool(v.image_score or v.image_embeds)


def stance_config(v: ml_collections.ConfigDict, manifest: features.StoreManifest
                  ) -> stance.StanceConfig:
  extra = _extra_inputs(v)
  return stance.StanceConfig(text_dim=manifest.text_dim, image_dim=manifest.image_dim,
                             hidden=v.hidden, heads=v.heads, dropout=v.dropout,
                             use_text=v.use_text, use_image=v.use_image,
                             missing_modality=v.missing_modality,
                             text_attention=v.text_attention,
                             token_match=extra.token_match,
                             phrase_match=extra.phrase_match, item_pool=v.item_pool,
                             image_query="words" if extra.word_queries else "states",
                             image_read=v.image_read,
                             pair_dim=v.pair_dim, match_heads=v.match_heads,
                             match_pool=v.match_pool, patches=manifest.patches,
                             image_score=extra.image_score,
                             score_thresholds=(tuple(float(t) for t in v.score_thresholds)
                                               if extra.image_score else ()),
                             image_embeds=extra.image_embeds,
                             embed_dim=manifest.embed_dim if extra.image_embeds else 0,
                             item_context=bool(v.use_text and v.item_context),
                             item_gate=_item_gate(v), image_gate=_image_gate(v))


def _item_gate(v: ml_collections.ConfigDict) -> bool:
  return bool(v.use_text and v.item_gate)


def _image_gate(v: ml_collections.ConfigDict) -> bool:
  return bool(v.use_image and v.image_gate)


def _gated(v: ml_collections.ConfigDict) -> dict[str, tuple[str, str]]:
  """The gated modalities: name -> (the batch field of its items' mask, of their
  relevance)."""
  return {**({"text": ("text_mask", "text_relevant")} if _item_gate(v) else {}),
          **({"image": ("image_mask", "image_relevant")} if _image_gate(v) else {})}


def build_model(v: ml_collections.ConfigDict, manifest: features.StoreManifest, seed: int,
                param_dtype=jnp.float32, vision: clip.CLIPVisionConfig | None = None
                ) -> nnx.Module:
  """The model of `v`'s mode; `vision` (the frozen CLIP's) is needed iff tune_vision_layers."""
  rngs = nnx.Rngs(seed)
  if not (v.use_text or v.use_image):
    return stance.ClaimOnlyClassifier(manifest.text_dim, param_dtype=param_dtype, rngs=rngs)
  if v.tune_vision_layers:
    if vision is None:
      raise ValueError("tune_vision_layers needs the CLIP's vision config")
    return vision_top.TunedVisionStance(stance_config(v, manifest), vision,
                                        v.tune_vision_layers, param_dtype=param_dtype,
                                        rngs=rngs)
  return stance.StanceDetector(stance_config(v, manifest), param_dtype=param_dtype, rngs=rngs)


def image_blocks(v: ml_collections.ConfigDict, vision: clip.CLIPVisionConfig) -> int | None:
  """The vision blocks the feature store runs (None: all, the frozen stance model's input)."""
  if not v.tune_vision_layers:
    return None
  if not 0 < v.tune_vision_layers <= vision.num_hidden_layers:
    raise MochegInputError(f"config.verify.tune_vision_layers {v.tune_vision_layers} must be "
                           f"in [0, {vision.num_hidden_layers}] (the CLIP's vision blocks)")
  return vision.num_hidden_layers - v.tune_vision_layers


def batch_axes(v: ml_collections.ConfigDict) -> dict[str, tuple]:
  """The batch fields the model reads (only those travel to the devices)."""
  axes = {"claim": ("batch", None, None), "claim_mask": ("batch", None),
          "label": ("batch",), "valid": ("batch",)}
  extra = _extra_inputs(v)
  if v.use_text:
    axes.update(text=("batch", None, None, None), text_mask=("batch", None, None))
  if extra.token_match:
    axes.update(text_match=("batch", None, None))
  if extra.phrase_match:
    axes.update(text_phrase_match=("batch", None, None))
  if extra.word_queries:
    axes.update(claim_ids=("batch", None))
  if v.use_image:
    axes.update(image=("batch", None, None, None), image_mask=("batch", None))
  if extra.image_score:
    axes.update(image_score=("batch", None))
  if extra.image_embeds:
    axes.update(image_embed=("batch", None, None), claim_embed=("batch", None))
  for _, relevant in _gated(v).values():
    axes[relevant] = ("batch", None)
  return axes


def forward(model: nnx.Module, batch: dict, *, deterministic: bool = True, **gates):
  """Logits [B, 3] from a batch of `VerificationBatches` fields (`return_item_gates=True`:
  also the item gates' logits by modality, stance.StanceDetector)."""
  return model(batch["claim"], batch["claim_mask"], text=batch.get("text"),
               text_mask=batch.get("text_mask"), image=batch.get("image"),
               image_mask=batch.get("image_mask"), text_match=batch.get("text_match"),
               claim_ids=batch.get("claim_ids"), image_score=batch.get("image_score"),
               text_phrase_match=batch.get("text_phrase_match"),
               image_embed=batch.get("image_embed"), claim_embed=batch.get("claim_embed"),
               deterministic=deterministic, **gates)


# ---- evidence, store and prediction ---------------------------------------------------------
def split_evidence(release_dir: str, split: str, source: str, v: ml_collections.ConfigDict
                   ) -> list[evidence_lib.ClaimEvidence]:
  """A split's claims with gold evidence or a result CSV's, restricted to the modes."""
  release = MochegRelease(release_dir)
  if source == GOLD:
    claims = evidence_lib.gold_evidence(release, split)
  else:
    claims = evidence_lib.system_evidence(release, split, source)
  return evidence_lib.restrict(claims, text=v.use_text, images=v.use_image)


@dataclasses.dataclass
class Verifier:
  """Predicts with a trained stance model: encodes what the store lacks, then batches.

  The frozen CLIP is loaded only when the store needs new entries.
  """
  config: ml_collections.ConfigDict
  release: str
  features_dir: str
  clip_loader: Callable[[], FrozenClip]
  fingerprint: dict
  moved: paths.Moved = None  # The store's folder was copied from elsewhere (utils/paths.py).
  _opened: features.FeatureStore | None = dataclasses.field(default=None, repr=False)

  def store(self, *claims: Sequence[evidence_lib.ClaimEvidence]) -> features.FeatureStore:
    """The store, extended with the texts and images of `claims` (process 0 writes).

    The opened store is kept: every dev evaluation asks for the same claims again."""
    texts, images = evidence_lib.store_inputs(*claims)
    if self._opened is not None and _holds(self._opened, texts, images):
      return self._opened
    store = _open_if_complete(self.features_dir, self.fingerprint, texts, images,
                              self.moved)
    if store is None:

      def build() -> None:
        frozen = self.clip_loader()
        v = self.config.verify
        features.build_store(self.features_dir, frozen.model, frozen.texts_tokenizer, texts,
                             images, fingerprint=self.fingerprint,
                             max_text_len=v.max_text_len, batch_size=v.encode_batch_size,
                             dtype=v.feature_dtype, text_model=frozen.text_model,
                             image_blocks=image_blocks(v, frozen.model.config.vision),
                             moved=self.moved, embeddings=_needs_embeddings(v),
                             clip_tokenizer=frozen.tokenizer)

      distributed.primary_only("verification-feature-store", build)  # The others wait.
      store = features.open_store(self.features_dir, expect_fingerprint=self.fingerprint,
                                  moved=self.moved)
    self._opened = store
    return store

  def batches(self, claims: Sequence[evidence_lib.ClaimEvidence]) -> VerificationBatches:
    v = self.config.verify
    extra = _extra_inputs(v)
    return VerificationBatches(claims, self.store(claims), max_claim_len=v.max_claim_len,
                               max_text_len=v.max_text_len, max_text_items=v.max_text_items,
                               max_images=v.max_images, token_match=extra.token_match,
                               phrase_match=extra.phrase_match,
                               claim_ids=extra.word_queries, image_score=extra.image_score,
                               image_embeds=extra.image_embeds,
                               item_relevance=bool(_gated(v)))

  def evidence(self, split: str, source: str = GOLD) -> list[evidence_lib.ClaimEvidence]:
    return split_evidence(self.release, split, source, self.config.verify)

  def predict(self, model: nnx.Module, claims: Sequence[evidence_lib.ClaimEvidence]
              ) -> np.ndarray:
    """Class probabilities [N, 3] (refuted, supported, NEI), rows in `claims` order."""
    data = self.batches(claims)
    axes = batch_axes(self.config.verify)
    out = []
    for batch in data.eval_batches(self.config.verify.eval_batch_size):
      probs = _probabilities(model, {k: batch[k] for k in axes})
      out.append(np.asarray(distributed.to_host(probs))[batch["valid"]])
    return np.concatenate(out)


@nnx.jit
def _probabilities(model: nnx.Module, batch: dict) -> jax.Array:
  return jax.nn.softmax(forward(model, batch), axis=-1)


def _open_if_complete(store_dir: str, fingerprint: dict, texts: Sequence[str],
                      images: Sequence[str], moved: paths.Moved = None
                      ) -> features.FeatureStore | None:
  """The store if it exists and holds everything asked for, else None."""
  if not os.path.exists(os.path.join(store_dir, features.MANIFEST)):
    return None
  store = features.open_store(store_dir, expect_fingerprint=fingerprint, moved=moved)
  return store if _holds(store, texts, images) else None


def _holds(store: features.FeatureStore, texts: Sequence[str], images: Sequence[str]) -> bool:
  return all(store.has_text(t) for t in texts) and all(store.has_image(p) for p in images)


def scores(gold: Sequence[int], probabilities: np.ndarray) -> dict[str, float]:
  """micro/macro F1 and per-class F1 of the argmax predictions."""
  report = classification_report(np.asarray(gold), probabilities.argmax(-1))
  out = {"micro_f1": report["micro_f1"], "macro_f1": report["macro_f1"]}
  out.update({f"f1/{name}": report[f"f1/{name}"] for name in LABEL_NAMES})
  return out


# ---- the task -------------------------------------------------------------------------------
def make_task(config: ml_collections.ConfigDict, workdir: str, moved: paths.Moved = None
              ) -> Task:
  """`moved`: the workdir was trained elsewhere and copied (restore.load_trained relocated
  `config`); its feature store and frozen CLIP workdir still name the old folder."""
  data = prepared_data(config, workdir)
  v = config.verify
  seed = config.seed
  features_dir = v.features_dir or os.path.join(workdir, "features")
  if v.tune_vision_layers and not v.use_image:
    raise MochegInputError("config.verify.tune_vision_layers needs use_image=True")
  if v.train_also_gold and v.evidence == GOLD:
    raise MochegInputError("config.verify.train_also_gold adds the gold evidence to system "
                           "evidence; set verify.evidence to a result CSV")
  if v.tune_vision_layers and _gated(v):
    raise MochegInputError("config.verify.item_gate and image_gate do not combine with "
                           "tune_vision_layers")
  clip_loader = functools.cache(lambda: load_clip(v, data.wordpiece, seed, moved))
  verifier = Verifier(config, data.release, features_dir, clip_loader,
                      clip_fingerprint(v, data.wordpiece, seed), moved)
  train = verifier.evidence("train", v.evidence)
  if v.train_also_gold:
    train += verifier.evidence("train", GOLD)
  dev = verifier.evidence(DEV_SPLIT, v.evidence)
  store = verifier.store(train, dev)  # One build for both, before training starts.
  counts = np.bincount([c.label for c in train], minlength=len(LABEL_NAMES))
  if (counts == 0).any():
    raise MochegInputError(f"{data.release}: the train split has no claims of class "
                           f"{LABEL_NAMES[int(np.argmin(counts))]}; class weights need all "
                           "three")
  weights = jnp.asarray(stance.class_weights(counts, v.loss_weight_power))
  manifest = store.manifest
  param_dtype = jnp.dtype(config.param_dtype)
  # Tuned vision blocks take their shape and first values from the CLIP (loaded once).
  vision = clip_loader().model.config.vision if v.tune_vision_layers else None
  initial_params = None
  if v.tune_vision_layers:
    initial_params = lambda: vision_top.initial_params(clip_loader().model,
                                                       v.tune_vision_layers)

  def model() -> nnx.Module:
    return build_model(v, manifest, seed, param_dtype, vision)

  gated = _gated(v)

  def loss(model: nnx.Module, batch: dict[str, Any]):
    if gated:
      logits, gates = forward(model, batch, deterministic=False, return_item_gates=True)
    else:  # The claim-only and tuned-vision models have no gates.
      logits = forward(model, batch, deterministic=False)
    value = stance.weighted_cross_entropy(logits, batch["label"], weights, batch["valid"])
    metrics = {"batch_accuracy": jnp.mean(jnp.argmax(logits, -1) == batch["label"])}
    for name, (mask, relevant) in gated.items():
      present = batch[mask]
      if present.ndim == 3:  # Text items: present iff any of their tokens is.
        present = present.any(-1)
      present = present & batch["valid"][:, None]
      relevance = stance.item_relevance_loss(gates[name], batch[relevant], present)
      value = value + v.item_gate_weight * relevance
      prefix = "item" if name == "text" else name  # item_*: the text gate's first names.
      metrics[f"{prefix}_relevance_loss"] = relevance
      metrics[f"{prefix}_gate_accuracy"] = (
          jnp.where(present, (gates[name] > 0) == (batch[relevant] > 0.5), False).sum()
          / jnp.maximum(present.sum(), 1))
    return value, metrics

  def train_data(local_batch: int):
    return iter(verifier.batches(train).train_dataset(
        local_batch, seed, read_ahead=pipelines.ReadAhead.of(config.data)))

  def dev_scores(model: nnx.Module, step: int):
    del step
    yield from scores([c.label for c in dev], verifier.predict(model, dev)).items()

  return Task(model=model, loss=loss, batch_axes=batch_axes(v), train_data=train_data,
              evaluators=(Evaluator("dev", dev_scores),), initial_params=initial_params,
              inference=verifier)

