"""The truthfulness classifier (the reward model of explanation generation) as a trainer task.

It learns the label of a claim from its gold explanation (the ruling outline) alone, as the
reference's controllable/classification/train_verify.py. Claims without a gold explanation
are skipped, recorded in a SkipReport and counted in the task's log line and in
`ClassifierInference.skipped`. Texts are tokenised once on the host, cut to
`classifier.max_len` tokens on the left by default (the reference sets
`truncation_side="left"`: a ruling's verdict is at its end) and padded to one fixed length.

Loss: class-weighted cross-entropy, w_c = C n_c^-p / sum_j n_j^-p over the training
explanations (p = `classifier.loss_weight_power`), as verification. Model selection: the
best `dev/macro_f1`.

After training, `load_classifier(workdir)` gives the model with its tokenizer and a host
`predict(texts)`; the jitted path (the generator's own ids) is
`classifier.label_probabilities(model, ids, mask)`.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Callable, Sequence

import grain
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from mocheg_jax.data import pipelines
from mocheg_jax.data import prepare as prepare_lib
from mocheg_jax.data.labels import LABEL_NAMES, NUM_CLASSES
from mocheg_jax.data.mocheg import CLAIMS_FILE, MochegRelease
from mocheg_jax.data.report import MochegInputError, SkipReport
from mocheg_jax.data.tokenizers import load_tokenizer, minilm_dir
from mocheg_jax.explanation import classifier as classifier_lib
from mocheg_jax.metrics.classification import classification_report
from mocheg_jax.models import bart, bert
from mocheg_jax.parallel import distributed
from mocheg_jax.train.data import prepared_data
from mocheg_jax.train.task import Evaluator, Task
from mocheg_jax.verification import stance

RANDOM = "random"
MINILM = "minilm"
AUTO = "auto"
DEV_SPLIT = "val"
TRUNCATION_SIDES = ("left", "right")
LENGTH_MULTIPLE = 32  # Padded lengths are rounded up to this (fewer distinct shapes).
NO_EXPLANATION = "no gold explanation"


def classifier_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.body = "bart_encoder"  # "bart_encoder" (the generator's BPE ids) or "bert".
  # Where the body's weights come from: "random" (a body of the shape below on the world's
  # own tokenizer: BPE for bart_encoder, WordPiece for bert); for bert also "minilm" (the
  # packaged all-MiniLM-L6-v2) or a local HF BERT / sentence-transformers folder (the
  # paper's bert-base-uncased); for bart_encoder a local HF BART folder (its encoder).
  c.init = RANDOM
  c.pooling = AUTO  # auto: BERT's pooler when the body has one, else the masked mean.
  c.dtype = "float32"  # Compute dtype (parameters stay float32).
  # Shape of a random body.
  c.hidden_size = 64
  c.num_layers = 2
  c.num_heads = 4
  c.mlp_size = 128
  c.dropout = 0.1
  c.max_positions = 512
  # The head (the reference's 128 -> 16, LeakyReLU 0.1, dropout 0.3).
  c.head_sizes = classifier_lib.HEAD_SIZES
  c.head_dropout = classifier_lib.HEAD_DROPOUT
  c.leaky_relu_slope = classifier_lib.LEAKY_RELU_SLOPE
  c.max_len = 512  # Tokens per explanation, special tokens included.
  c.truncation_side = "left"  # The reference's; "right" keeps the opening instead.
  c.loss_weight_power = 2.0
  c.eval_batch_size = 64
  return c


def config_defaults() -> dict:
  """This task's config sections (train.task.config_defaults: old checkpoints still load)."""
  return {"classifier": classifier_config()}


# ---- data -----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Explanations:
  """A split's gold explanations with their labels (claims without one left out)."""
  claim_ids: tuple[int, ...]
  texts: tuple[str, ...]
  labels: np.ndarray  # int32 [N]
  skipped: int  # Claims of the split without a gold explanation.


def read_explanations(release: MochegRelease, split: str,
                      report: SkipReport | None = None) -> Explanations:
  """The gold explanations of `split`; each claim without one is added to `report`."""
  claim_ids, texts, labels, skipped = [], [], [], 0
  path = release.path(split, CLAIMS_FILE)
  for claim in release.claims(split):
    text = claim.explanation.strip()
    if not text:
      skipped += 1
      if report is not None:
        report.add(path, None, NO_EXPLANATION, f"claim {claim.claim_id}")
      continue
    claim_ids.append(claim.claim_id)
    texts.append(text)
    labels.append(claim.label)
  return Explanations(tuple(claim_ids), tuple(texts), np.asarray(labels, np.int32), skipped)


def padded_length(longest: int, max_len: int, multiple: int = LENGTH_MULTIPLE) -> int:
  """The fixed length a set of texts is padded to: the longest, rounded up, at most max_len."""
  return min(max_len, max(multiple, math.ceil(longest / multiple) * multiple))


class _Examples:
  """Tokenised explanations as a grain source of {ids, mask, label} rows (picklable)."""

  def __init__(self, ids: np.ndarray, mask: np.ndarray, labels: np.ndarray):
    self._ids, self._mask, self._labels = ids, mask, labels

  def __len__(self) -> int:
    return len(self._labels)

  def __getitem__(self, i: int) -> dict[str, np.ndarray]:
    return {"ids": self._ids[i], "mask": self._mask[i], "label": self._labels[i]}


# ---- the body and its tokenizer -------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class BodySource:
  """The classifier's architecture, tokenizer and (for a pretrained body) its weights."""
  config: classifier_lib.ClassifierConfig
  tokenizer_dir: str
  weights: Callable[[], dict] | None  # {"body": nested params} for Task.initial_params.


def _pooling(c: ml_collections.ConfigDict, has_pooler: bool, where: str) -> str:
  if c.pooling == AUTO:
    return "pooler" if has_pooler else "mean"
  if c.pooling == "pooler" and not has_pooler:
    raise MochegInputError(f"config.classifier.pooling is 'pooler' but {where} has no pooler "
                           "weights; use 'auto' or 'mean'")
  return c.pooling


def _head_kwargs(c: ml_collections.ConfigDict) -> dict:
  return dict(head_sizes=tuple(int(n) for n in c.head_sizes),
              head_dropout=float(c.head_dropout), leaky_relu_slope=float(c.leaky_relu_slope))


def body_source(c: ml_collections.ConfigDict, data: prepare_lib.PreparedData | None
                ) -> BodySource:
  """What `config.classifier` names: a random body on the world's tokenizer (`data`'s), or
  a folder's body and tokenizer."""
  validate(c)
  head = _head_kwargs(c)
  if c.init == RANDOM:
    tokenizer_dir = data.bpe if c.body == "bart_encoder" else data.wordpiece
    tokenizer = load_tokenizer(tokenizer_dir)
    if c.body == "bert":
      encoder = bert.BertConfig(
          vocab_size=len(tokenizer), hidden_size=c.hidden_size, num_hidden_layers=c.num_layers,
          num_attention_heads=c.num_heads, intermediate_size=c.mlp_size,
          hidden_dropout_prob=c.dropout, attention_probs_dropout_prob=c.dropout,
          max_position_embeddings=c.max_positions, pad_token_id=tokenizer.pad_token_id)
      pooling = _pooling(c, True, "a random BERT")  # A random BertModel has a pooler.
    else:
      encoder = bart.BartConfig(
          vocab_size=len(tokenizer), d_model=c.hidden_size, encoder_layers=c.num_layers,
          decoder_layers=0, encoder_attention_heads=c.num_heads,
          decoder_attention_heads=c.num_heads, encoder_ffn_dim=c.mlp_size,
          decoder_ffn_dim=c.mlp_size, max_position_embeddings=c.max_positions,
          dropout=c.dropout, pad_token_id=tokenizer.pad_token_id,
          bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
          decoder_start_token_id=tokenizer.eos_token_id,
          forced_eos_token_id=tokenizer.eos_token_id)
      pooling = "mean"
    config = classifier_lib.ClassifierConfig(c.body, encoder, pooling, **head)
    return BodySource(config, tokenizer_dir, None)
  if c.body == "bert":
    from mocheg_jax.models import sentence_transformers as st  # Only for folders.
    from mocheg_jax.models.hf import bert as hf_bert
    folder = str(minilm_dir()) if c.init == MINILM else c.init
    transformer = str(st.read_structure(folder)["transformer"])
    model = hf_bert.load(transformer, head="model")
    pooling = _pooling(c, model.pooler is not None, transformer)
    state = nnx.state(model, nnx.Param).to_pure_dict()
    if pooling == "mean":
      state.pop("pooler", None)  # The classifier is then built without one.
    config = classifier_lib.ClassifierConfig("bert", model.config, pooling, **head)
    return BodySource(config, transformer, lambda: {"body": state})
  from mocheg_jax.models.hf import bart as hf_bart  # Only for folders.
  model = hf_bart.load(c.init)
  state = {"shared": nnx.state(model.shared, nnx.Param).to_pure_dict(),
           "encoder": nnx.state(model.encoder, nnx.Param).to_pure_dict()}
  config = classifier_lib.ClassifierConfig("bart_encoder", model.config, "mean", **head)
  return BodySource(config, os.fspath(c.init), lambda: {"body": state})


def validate(c: ml_collections.ConfigDict) -> None:
  """Checks `config.classifier`; errors name the field."""
  if c.body not in classifier_lib.BODIES:
    raise ValueError(f"config.classifier.body {c.body!r} is not one of "
                     f"{classifier_lib.BODIES}")
  if c.pooling not in (AUTO, *classifier_lib.POOLINGS):
    raise ValueError(f"config.classifier.pooling {c.pooling!r} is not one of "
                     f"{(AUTO, *classifier_lib.POOLINGS)}")
  if c.body == "bart_encoder" and c.pooling == "pooler":
    raise ValueError("config.classifier.pooling 'pooler' needs body 'bert' (the BART encoder "
                     "has no pooler)")
  if c.truncation_side not in TRUNCATION_SIDES:
    raise ValueError(f"config.classifier.truncation_side {c.truncation_side!r} is not one of "
                     f"{TRUNCATION_SIDES}")
  if not isinstance(c.max_len, int) or c.max_len < 3:
    raise ValueError(f"config.classifier.max_len must be an integer of at least 3, got "
                     f"{c.max_len!r}")
  expected = ("'random', 'minilm' or a local HF BERT / sentence-transformers folder"
              if c.body == "bert" else "'random' or a local HF BART folder")
  if not c.init:
    raise MochegInputError(f"config.classifier.init is empty: pass {expected}")
  if c.init == MINILM and c.body != "bert":
    raise ValueError("config.classifier.init 'minilm' needs body 'bert'")
  if c.init not in (RANDOM, MINILM) and not os.path.isdir(c.init):
    raise MochegInputError(f"config.classifier.init {c.init!r} is not a folder (expected "
                           f"{expected})")


# ---- inference ------------------------------------------------------------------------------
@dataclasses.dataclass
class ClassifierInference:
  """How a trained classifier reads text: its tokenizer, cut and batching."""
  tokenizer_dir: str
  body: str
  max_len: int
  truncation_side: str
  batch_size: int
  class_weights: tuple[float, ...] = ()
  skipped: dict[str, int] = dataclasses.field(default_factory=dict)  # Per split.
  _tokenizer: Any = dataclasses.field(default=None, repr=False)

  @property
  def tokenizer(self):
    if self._tokenizer is None:
      self._tokenizer = load_tokenizer(self.tokenizer_dir)
    return self._tokenizer

  def encode(self, texts: Sequence[str], length: int | None = None
             ) -> tuple[np.ndarray, np.ndarray, int]:
    """(ids [N, length] int32, mask [N, length] int32, how many texts were cut).

    Texts longer than `max_len` tokens keep their first (CLS / <s>) and last (SEP / </s>)
    special tokens and lose content on `truncation_side`, as HF truncation does.
    `length` defaults to the longest, rounded up, at most max_len.
    """
    tok = self.tokenizer
    if tok.num_special_tokens_to_add(pair=False) != 2:
      raise MochegInputError(f"tokenizer {self.tokenizer_dir} adds "
                             f"{tok.num_special_tokens_to_add(pair=False)} special tokens "
                             "to a text; the classifier expects one before and one after")
    rows = tok(list(texts), add_special_tokens=True, truncation=False, verbose=False,
               return_attention_mask=False)["input_ids"]
    cut = 0
    for i, ids in enumerate(rows):
      if len(ids) > self.max_len:
        cut += 1
        keep = self.max_len - 2
        body = ids[-1 - keep:-1] if self.truncation_side == "left" else ids[1:1 + keep]
        rows[i] = [ids[0], *body, ids[-1]]
    if length is None:
      length = padded_length(max((len(r) for r in rows), default=1), self.max_len)
    ids = np.full((len(rows), length), tok.pad_token_id, np.int32)
    mask = np.zeros((len(rows), length), np.int32)
    for i, r in enumerate(rows):
      ids[i, :len(r)], mask[i, :len(r)] = r, 1
    return ids, mask, cut

  def predict(self, model: classifier_lib.TruthfulnessClassifier, texts: Sequence[str]
              ) -> np.ndarray:
    """Class probabilities [N, 3] (refuted, supported, NEI) of `texts`, in order."""
    if not len(texts):
      return np.zeros((0, NUM_CLASSES), np.float32)
    ids, mask, _ = self.encode(texts)
    out = []
    b = self.batch_size
    for start in range(0, len(ids), b):
      chunk_ids, chunk_mask = ids[start:start + b], mask[start:start + b]
      rows = len(chunk_ids)
      if rows < b:  # A fixed batch shape; filler rows hold one token so nothing is empty.
        chunk_ids = np.concatenate([chunk_ids, np.zeros((b - rows, ids.shape[1]), np.int32)])
        filler = np.zeros((b - rows, ids.shape[1]), np.int32)
        filler[:, 0] = 1
        chunk_mask = np.concatenate([chunk_mask, filler])
      probs = _probabilities(model, chunk_ids, chunk_mask)
      out.append(np.asarray(distributed.to_host(probs))[:rows])
    return np.concatenate(out)


_probabilities = nnx.jit(classifier_lib.label_probabilities)


def scores(gold: Sequence[int], probabilities: np.ndarray) -> dict[str, float]:
  """micro/macro F1 and per-class F1 of the argmax predictions, and the mean reward the
  gold explanations earn (what a generated one is measured against)."""
  gold = np.asarray(gold)
  report = classification_report(gold, probabilities.argmax(-1))
  out = {"micro_f1": report["micro_f1"], "macro_f1": report["macro_f1"]}
  out.update({f"f1/{name}": report[f"f1/{name}"] for name in LABEL_NAMES})
  p_gold = probabilities[np.arange(len(gold)), gold]
  out["mean_reward"] = float(np.mean(p_gold - (probabilities.sum(-1) - p_gold)))
  return out


# ---- the task -------------------------------------------------------------------------------
def make_task(config: ml_collections.ConfigDict, workdir: str) -> Task:
  c = config.classifier
  validate(c)  # Before preparing data: a paper-scale world takes a while to write.
  data = prepared_data(config, workdir)
  source = body_source(c, data)
  if c.max_len > source.config.max_positions:
    raise ValueError(f"config.classifier.max_len {c.max_len} exceeds the body's "
                     f"{source.config.max_positions} positions")
  release = MochegRelease(data.release)
  report = SkipReport()
  train = read_explanations(release, "train", report)
  dev = read_explanations(release, DEV_SPLIT, report)
  if not len(train.labels):
    raise MochegInputError(f"{data.release}: no training claim has a gold explanation")
  counts = np.bincount(train.labels, minlength=NUM_CLASSES)
  if (counts == 0).any():
    raise MochegInputError(f"{data.release}: no training explanation of class "
                           f"{LABEL_NAMES[int(np.argmin(counts))]}; class weights need all "
                           "three")
  weights = stance.class_weights(counts, c.loss_weight_power)
  inference = ClassifierInference(source.tokenizer_dir, c.body, c.max_len, c.truncation_side,
                                  c.eval_batch_size, tuple(float(w) for w in weights),
                                  {"train": train.skipped, DEV_SPLIT: dev.skipped})
  if distributed.is_primary():
    print(f"truthfulness classifier ({c.body}, {source.config.pooling} pooling): "
          f"{len(train.labels)} train and {len(dev.labels)} dev explanations; "
          f"{report.summary()}")
  dtype = None if c.dtype == "float32" else jnp.dtype(c.dtype)
  seed = config.seed
  weights_j = jnp.asarray(weights)

  def model() -> classifier_lib.TruthfulnessClassifier:
    return classifier_lib.TruthfulnessClassifier(source.config, dtype=dtype,
                                                 rngs=nnx.Rngs(seed))

  def loss(model: classifier_lib.TruthfulnessClassifier, batch: dict[str, Any]):
    logits = model(batch["ids"], batch["mask"], deterministic=False)
    value = stance.weighted_cross_entropy(logits, batch["label"], weights_j)
    accuracy = jnp.mean(jnp.argmax(logits, -1) == batch["label"])
    return value, {"batch_accuracy": accuracy}

  def train_data(local_batch: int):
    ids, mask, cut = inference.encode(train.texts)
    if distributed.is_primary():
      print(f"classifier train data: {len(ids)} explanations padded to {ids.shape[1]} tokens; "
            f"{cut} longer than {c.max_len} cut on the {c.truncation_side}")
    source_ds = _Examples(ids, mask, train.labels)
    ds = grain.MapDataset.source(source_ds).seed(seed).shuffle().repeat(None)
    return iter(pipelines.iterate(pipelines.process_batches(ds, local_batch),
                                  pipelines.ReadAhead.of(config.data)))

  def dev_scores(model: classifier_lib.TruthfulnessClassifier, step: int):
    del step
    yield from scores(dev.labels, inference.predict(model, dev.texts)).items()

  evaluators = (Evaluator("dev", dev_scores),) if len(dev.labels) else ()
  return Task(model=model, loss=loss,
              batch_axes={"ids": ("batch", "length"), "mask": ("batch", "length"),
                          "label": ("batch",)},
              train_data=train_data, evaluators=evaluators,
              initial_params=source.weights, inference=inference)


# ---- a trained classifier -------------------------------------------------------------------
@dataclasses.dataclass
class TrainedClassifier:
  """A trained classifier with its tokenizer, for the host path and for the jitted one."""
  model: classifier_lib.TruthfulnessClassifier
  inference: ClassifierInference
  step: int
  workdir: str

  @property
  def tokenizer(self):
    return self.inference.tokenizer

  def predict(self, texts: Sequence[str]) -> np.ndarray:
    """Class probabilities [N, 3] of texts tokenised on the host."""
    return self.inference.predict(self.model, texts)

  def check_reads_ids_of(self, tokenizer, what: str = "the generator") -> None:
    """Raises unless `tokenizer`'s ids mean the same tokens to this classifier, as scoring
    another model's token ids inside jit (`label_probabilities`) needs."""
    if tokenizer.get_vocab() != self.tokenizer.get_vocab():
      raise MochegInputError(f"{self.workdir}: the classifier's tokenizer "
                             f"({self.inference.tokenizer_dir}, {len(self.tokenizer)} tokens) "
                             f"differs from {what}'s ({len(tokenizer)} tokens), so it cannot "
                             "read its token ids; train the classifier on that tokenizer "
                             "(body bart_encoder), or let it read decoded text: "
                             "config.explain.reward_input=text")


def load_classifier(workdir: str, which: str = "best", moved: tuple[str, str] | None = None
                    ) -> TrainedClassifier:
  """The classifier of a training workdir (its best dev macro F1 step, or the latest);
  `moved`: its folder was copied from elsewhere (restore.load_trained)."""
  from mocheg_jax.train.restore import load_trained  # Imports the trainer only here.
  trained = load_trained(workdir, which, moved)
  if not isinstance(trained.task.inference, ClassifierInference):
    raise MochegInputError(f"{workdir}: its task ({trained.config.task}) is not the "
                           "truthfulness classifier")
  return TrainedClassifier(trained.model, trained.task.inference, trained.step, workdir)
