"""The explanation generator as a trainer task: BART, NLL + the classifier's REINFORCE reward.

Source "{label} </s> {claim} </s> {evidence}" (the claim's gold label and evidence; at most
`explain.max_source_len` tokens, the evidence cut first unless `explain.left_truncation`
reproduces the reference), target the gold ruling outline (`explain.max_target_len`).
The loss is `reinforce.explanation_loss`: token NLL, plus sc_weight x the policy-gradient
term from `explain.sc_start_step` on, when a classifier is given.

The model is our NNX `Bart`: random with the `explain` shape on the world's BPE tokenizer
(`explain.init="random"`), or a local HF BART folder (facebook/bart-large for the paper),
whose own tokenizer is then used. The reward model is the frozen truthfulness classifier of
`explain.classifier` (a classifier's training workdir; "" trains on the NLL alone).

The trainer's loss sees only (model, batch), so the data iterator numbers the batches: the
`step` field (the optimizer step, saved and restored with the iterator position) is what
switches the reward term on inside the jitted step. The sample's PRNG key comes from the
model's own RNG stream, which the trainer reseeds from fold_in(rng, step).

Dev evaluation: beam search (`explain.num_beams`, `no_repeat_ngram_size`,
`max_decode_length`) on the dev claims, ROUGE-1/2/L/Lsum against the gold explanations
(best_metric "dev/rougeL"), and with a classifier the share of generated explanations it
assigns the intended label ("dev/classifier_agreement").
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Iterator, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from mocheg_jax.data import pipelines
from mocheg_jax.data.labels import LABEL_NAMES
from mocheg_jax.data.mocheg import Claim, MochegRelease
from mocheg_jax.data.report import MochegInputError
from mocheg_jax.data.tokenizers import load_tokenizer
from mocheg_jax.explanation import reinforce
from mocheg_jax.metrics.generation import rouge_scores
from mocheg_jax.models import bart
from mocheg_jax.models import decoding
from mocheg_jax.parallel import distributed
from mocheg_jax.train.data import prepared_data
from mocheg_jax.train.task import Evaluator, Task
from mocheg_jax.utils.progress import Progress

RANDOM = "random"
DEV_SPLIT = "val"


def explain_config() -> ml_collections.ConfigDict:
  e = ml_collections.ConfigDict()
  e.init = RANDOM  # "random" (the shape below, the world's BPE) or a local HF BART folder.
  e.dtype = "float32"  # Compute dtype (parameters stay float32).
  # Shape of a random BART (ignored when loading a folder).
  e.d_model = 64
  e.layers = 2  # Encoder and decoder layers each.
  e.heads = 4
  e.ffn = 128
  e.dropout = 0.1
  e.normalize_before = False  # Pre-LN layers: for training from scratch (configs/explain.py).
  e.max_positions = 512
  # Inputs.
  e.max_source_len = 512
  e.max_target_len = 400
  e.left_truncation = False  # True: the reference's left truncation (drops label/claim).
  # Training batches' padding: 0 pads every batch to max_source_len / max_target_len (one
  # compiled step, the reference's shapes); N pads each global batch's sources and targets
  # to the next multiple of N of its longest (one compiled step per bucket met:
  # pipelines.LengthBuckets). On GPUs and TPUs the trainer's MFU counts the first batch's
  # shapes.
  e.length_multiple = 0
  # Beyond the paper: the decoder starts with the label's first token (`label_start_ids`)
  # instead of BART's start token, so every decoder position sees the label it argues for
  # through self-attention. The reference gives the label in the source only, which a
  # generator trained from scratch did not learn to read (configs/explain.py).
  e.label_start = False
  # Weight of the auxiliary source-copying NLL (reinforce.source_reconstruction_nll, for
  # training from scratch); 0 for a pretrained BART (the paper's setting).
  e.reconstruction_weight = 0.0
  # The term over every k-th row of a batch only (1: all). It is a third of the small
  # generator's step, but over every 4th row the encoder learnt slower and the 950-step
  # generator came out worse (BENCHMARKS.md, "The generator's copying term").
  e.reconstruction_row_stride = 1
  # The reward (reinforce.ReinforceSettings).
  e.classifier = ""  # A truthfulness classifier's training workdir; "": NLL only.
  # How the classifier reads a sample: "ids" (the generator's token ids, inside the step; the
  # classifier must share the generator's tokenizer) or "text" (decoded and re-tokenised on
  # the host for any classifier's tokenizer, as the reference's BERT: text_reward.py).
  e.reward_input = "ids"
  e.sc_weight = 0.5
  e.sc_start_step = 20
  e.baseline = "greedy"  # none (the reference) | greedy (self-critical) | mean
  e.teacher_forced_sampling = False  # True: the reference's per-position sampling.
  e.sample_max_length = 400  # Generation max_length of a sample (start token counted).
  # The sample's log-probability in the policy-gradient term: "sum" over its tokens (the
  # REINFORCE estimator as written) or "mean" per token, which keeps the term's gradient on
  # the NLL's scale (reinforce.ReinforceSettings.log_prob).
  e.pg_log_prob = "sum"
  # Dev decoding.
  e.num_beams = 4
  e.no_repeat_ngram_size = 3
  e.max_decode_length = 400  # Generation max_length (start token counted).
  e.eval_batch_size = 16
  e.eval_max_claims = 0  # 0: every dev claim with a gold explanation.
  return e


def config_defaults() -> dict:
  """This task's config sections (train.task.config_defaults: old checkpoints still load)."""
  return {"explain": explain_config()}


def reinforce_settings(e: ml_collections.ConfigDict) -> reinforce.ReinforceSettings:
  settings = reinforce.ReinforceSettings(
      sc_weight=float(e.sc_weight), start_step=int(e.sc_start_step), baseline=e.baseline,
      teacher_forced_sampling=bool(e.teacher_forced_sampling),
      sample_max_length=int(e.sample_max_length), log_prob=e.pg_log_prob)
  settings.validate()
  return settings


# ---- the reward model ----------------------------------------------------------------------
REWARD_INPUTS = ("ids", "text")


def load_reward_model(classifier_dir: str, tokenizer, longest: int, reward_input: str = "ids",
                      moved: tuple[str, str] | None = None) -> reinforce.RewardModel:
  """The frozen truthfulness classifier of a classifier training workdir, as a RewardModel.

  This is where the real classifier is wired in (`classifier_task.load_classifier` and
  `classifier.label_probabilities`); everything else sees only the RewardModel. With
  `reward_input="ids"` the classifier must read the generator's token ids (the same
  tokenizer: a `bart_encoder` classifier trained on the generator's BPE) and take `longest`
  of them; with "text" any classifier does (`text_reward`: the samples are decoded and
  re-tokenised on the host inside the step).

  Its parameters reach the jitted train step as an argument (Task.constants), replicated on
  every device. `moved`: the classifier's folder was copied from elsewhere
  (restore.load_trained).
  """
  if reward_input not in REWARD_INPUTS:
    raise MochegInputError(f"config.explain.reward_input {reward_input!r}: expected one of "
                           f"{', '.join(REWARD_INPUTS)}")
  if not os.path.isdir(classifier_dir):
    raise MochegInputError(f"config.explain.classifier {classifier_dir!r} is not a folder "
                           "(expected a truthfulness classifier's training workdir)")
  from mocheg_jax.explanation import classifier, classifier_task, text_reward
  trained = classifier_task.load_classifier(classifier_dir, which="best", moved=moved)
  if reward_input == "text":
    return text_reward.text_reward_model(trained, tokenizer)
  trained.check_reads_ids_of(tokenizer)
  positions = trained.model.config.max_positions
  if longest > positions:
    raise MochegInputError(f"{classifier_dir}: the classifier takes {positions} tokens, the "
                           f"generator's samples and explanations up to {longest} "
                           "(config.explain.sample_max_length / max_decode_length - 1)")
  return reinforce.RewardModel.from_module(trained.model, classifier.label_probabilities)


# ---- the model -------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class GeneratorSource:
  """Where the generator comes from: its config, tokenizer folder and (maybe) weights."""
  config: bart.BartConfig
  tokenizer_dir: str
  folder: str | None  # A local HF BART folder whose weights initialise the model.


def generator_source(e: ml_collections.ConfigDict, bpe_dir: str) -> GeneratorSource:
  if e.init == RANDOM:
    tokenizer = load_tokenizer(bpe_dir)
    config = bart.BartConfig(
        vocab_size=len(tokenizer), d_model=e.d_model, encoder_layers=e.layers,
        decoder_layers=e.layers, encoder_attention_heads=e.heads,
        decoder_attention_heads=e.heads, encoder_ffn_dim=e.ffn, decoder_ffn_dim=e.ffn,
        max_position_embeddings=e.max_positions, dropout=e.dropout,
        normalize_before=e.normalize_before,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, decoder_start_token_id=tokenizer.eos_token_id,
        forced_eos_token_id=tokenizer.eos_token_id)
    source = GeneratorSource(config, bpe_dir, None)
  else:
    folder = os.path.abspath(e.init) if e.init else ""
    if not folder or not os.path.isdir(folder):
      raise MochegInputError(f"config.explain.init {e.init!r} is neither 'random' nor a "
                             "folder (expected a local HF BART folder)")
    from mocheg_jax.models.hf import bart as hf_bart
    source = GeneratorSource(hf_bart.read_configs(folder), folder, folder)
    tokenizer = load_tokenizer(folder)  # The checkpoint's own tokenizer.
    if len(tokenizer) > source.config.vocab_size:
      raise MochegInputError(f"{folder}: the tokenizer has {len(tokenizer)} tokens, the "
                             f"model's vocabulary {source.config.vocab_size}")
  _check_lengths(e, source.config)
  return source


def _check_lengths(e: ml_collections.ConfigDict, config: bart.BartConfig) -> None:
  """Every length the task uses must fit the position table."""
  positions = config.max_position_embeddings
  needs = {"max_source_len": e.max_source_len, "max_target_len": e.max_target_len,
           "sample_max_length - 1": e.sample_max_length - 1,
           "max_decode_length - 1": e.max_decode_length - 1}
  for name, value in needs.items():
    if value > positions:
      raise MochegInputError(f"config.explain.{name} = {value} exceeds the model's "
                             f"{positions} positions")
  if e.max_source_len < 8 or e.max_target_len < 4:
    raise MochegInputError("config.explain.max_source_len must be >= 8 and max_target_len "
                           ">= 4")
  if e.length_multiple < 0:
    raise MochegInputError(f"config.explain.length_multiple must be >= 0 (0: no buckets), "
                           f"got {e.length_multiple}")
  if e.reconstruction_row_stride < 1:
    raise MochegInputError("config.explain.reconstruction_row_stride must be >= 1 (1: every "
                           f"row), got {e.reconstruction_row_stride}")


def build_model(source: GeneratorSource, seed: int, dtype: str = "float32") -> bart.Bart:
  compute = None if jnp.dtype(dtype) == jnp.float32 else jnp.dtype(dtype)
  return bart.Bart(source.config, dtype=compute,
                   rngs=nnx.Rngs(params=seed, dropout=seed + 1))


def _initial_params(folder: str):
  def load() -> dict:
    from mocheg_jax.models.hf import bart as hf_bart
    return nnx.to_pure_dict(nnx.state(hf_bart.load(folder), nnx.Param))
  return load


# ---- data ------------------------------------------------------------------------------------
BATCH_AXES = {"source_ids": ("batch", "length"), "source_mask": ("batch", "length"),
              "target_ids": ("batch", "length"), "target_mask": ("batch", "length"),
              "label": ("batch",), "step": ("batch",)}


class StepNumbered:
  """Adds `step` (int32 [rows], the batch's number) to every batch of a grain iterator.

  Batch n is what the trainer's step n consumes, so the field is the optimizer step inside
  the jitted loss; the count is saved and restored with the iterator's position.
  """

  def __init__(self, inner: Iterator[dict[str, np.ndarray]]):
    self._inner, self._step = inner, 0

  def __iter__(self) -> StepNumbered:
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    batch = dict(next(self._inner))
    rows = len(batch["source_ids"])
    batch["step"] = np.full((rows,), self._step, np.int32)
    self._step += 1
    return batch

  def get_state(self) -> dict:
    return {"inner": self._inner.get_state(), "step": self._step}

  def set_state(self, state: dict) -> None:
    self._inner.set_state(state["inner"])
    self._step = int(state["step"])

  def start_prefetch(self) -> None:
    if hasattr(self._inner, "start_prefetch"):
      self._inner.start_prefetch()


def source_ids(tokenizer, claim: Claim, e: ml_collections.ConfigDict) -> list[int]:
  """The generator's source for a claim with its gold label (as the training pipeline)."""
  return pipelines.explanation_source_ids(
      tokenizer, LABEL_NAMES[claim.label], claim.claim, " ".join(claim.evidence),
      e.max_source_len, e.left_truncation)


def label_start_ids(tokenizer) -> np.ndarray:
  """int32 [3]: the decoder start token of each class (`explain.label_start`): the first
  token of " {label name}" in the generator's tokenizer, which must differ by class."""
  ids = [tokenizer(" " + name, add_special_tokens=False)["input_ids"][:1]
         for name in LABEL_NAMES]
  if any(not i for i in ids) or len({i[0] for i in ids}) < len(ids):
    raise MochegInputError(f"config.explain.label_start: the tokenizer's first tokens of the "
                           f"label names {list(LABEL_NAMES)} are {ids}; they must be three "
                           "different tokens")
  return np.array([i[0] for i in ids], np.int32)


# ---- evaluation ------------------------------------------------------------------------------
def generation_config(model: bart.Bart, e: ml_collections.ConfigDict
                      ) -> decoding.GenerationConfig:
  """The checkpoint's generation settings with the task's beam search."""
  return decoding.GenerationConfig.from_model(
      model.config, num_beams=e.num_beams, no_repeat_ngram_size=e.no_repeat_ngram_size,
      max_length=e.max_decode_length)


@dataclasses.dataclass
class Explainer:
  """Generates explanations with a trained generator (dev evaluation and inference)."""
  config: ml_collections.ConfigDict
  tokenizer_dir: str

  @functools.cached_property
  def tokenizer(self):
    return load_tokenizer(self.tokenizer_dir)

  @functools.cached_property
  def label_starts(self) -> np.ndarray | None:
    """Each class's decoder start token with `explain.label_start`, else None."""
    return label_start_ids(self.tokenizer) if self.config.explain.label_start else None

  def generate(self, model: bart.Bart, claims: Sequence[Claim]
               ) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(texts, ids [N, L-1], mask [N, L-1]) of beam-searched explanations, in order."""
    e = self.config.explain
    tokenizer = self.tokenizer
    config = generation_config(model, e)
    rows = [source_ids(tokenizer, c, e) for c in claims]
    batch = e.eval_batch_size
    all_ids, all_mask = [], []
    with Progress("generating explanations", total=len(rows), unit="claims",
                  enabled=distributed.is_primary()) as progress:
      for start in range(0, len(rows), batch):
        chunk = rows[start:start + batch]
        filler = batch - len(chunk)  # Rows repeating the first, for a fixed shape.
        ids = np.full((batch, e.max_source_len), model.config.pad_token_id, np.int32)
        mask = np.zeros((batch, e.max_source_len), np.int32)
        for i, row in enumerate(chunk + [chunk[0]] * filler):
          ids[i, :len(row)], mask[i, :len(row)] = row, 1
        starts = None
        if self.label_starts is not None:
          labels = [c.label for c in claims[start:start + batch]]
          starts = self.label_starts[labels + [labels[0]] * filler]
        tokens, token_mask = decoding.tokens_and_mask(decoding.generate(
            model, ids, mask, config, start_ids=starts))
        all_ids.append(distributed.to_host(tokens)[:len(chunk)])
        all_mask.append(distributed.to_host(token_mask)[:len(chunk)])
        progress.update(len(chunk))
    ids, mask = np.concatenate(all_ids), np.concatenate(all_mask)
    texts = [tokenizer.decode(row[m], skip_special_tokens=True).strip()
             for row, m in zip(ids, mask)]
    return texts, ids, mask


@jax.jit
def _agreement(reward_model: reinforce.RewardModel, ids: jax.Array, mask: jax.Array,
               labels: jax.Array) -> jax.Array:
  return jnp.argmax(reward_model(ids, mask), -1) == labels


def agreement_by_label(agree: np.ndarray, labels: np.ndarray) -> dict[str, float]:
  """{"classifier_agreement_<label name>": the agreement on the claims of that label} for
  each label some claim has. Why: the overall figure hid that one class carried it (on the
  small world the NLL generator's dev texts read as intended for 19% of the refuted claims,
  71% of the supported and 100% of the NEI ones)."""
  return {f"classifier_agreement_{name}": float(np.mean(agree[labels == k]))
          for k, name in enumerate(LABEL_NAMES) if np.any(labels == k)}


def dev_claims(release_dir: str, e: ml_collections.ConfigDict) -> list[Claim]:
  claims = [c for c in MochegRelease(release_dir).claims(DEV_SPLIT) if c.explanation.strip()]
  if not claims:
    raise MochegInputError(f"{release_dir}: no {DEV_SPLIT} claim has a gold explanation")
  return claims[:e.eval_max_claims] if e.eval_max_claims else claims


def _dev_evaluator(explainer: Explainer, claims: Sequence[Claim],
                   reward_model: reinforce.RewardModel | None):
  references = [c.explanation for c in claims]
  labels = np.array([c.label for c in claims], np.int32)

  def run(model: bart.Bart, step: int):
    del step
    texts, ids, mask = explainer.generate(model, claims)
    yield from rouge_scores(texts, references).items()
    yield "generated_tokens", float(mask.sum(-1).mean())
    # The share of distinct texts: near 1/N when the generator ignores its source (a
    # from-scratch post-LN BART wrote one text for every claim while its ROUGE looked fine).
    yield "distinct_outputs", len(set(texts)) / max(len(texts), 1)
    if reward_model is not None:
      agree = _agreement(reward_model, jnp.asarray(ids), jnp.asarray(mask),
                         jnp.asarray(labels))
      agree = np.asarray(distributed.to_host(agree))
      yield "classifier_agreement", float(np.mean(agree))
      yield from agreement_by_label(agree, labels).items()

  return run


# ---- the task --------------------------------------------------------------------------------
def make_task(config: ml_collections.ConfigDict, workdir: str,
              moved: tuple[str, str] | None = None) -> Task:
  """`moved`: the workdir was copied from elsewhere (restore.load_trained relocated `config`;
  the reward classifier's own workdir is loaded the same way)."""
  data = prepared_data(config, workdir)
  e = config.explain
  source = generator_source(e, data.bpe)
  reward_model = None
  if e.classifier:
    longest = max(e.sample_max_length, e.max_decode_length) - 1
    reward_model = load_reward_model(e.classifier, load_tokenizer(source.tokenizer_dir),
                                     longest, e.reward_input, moved=moved)
  settings = reinforce_settings(e)
  seed = config.seed
  explainer = Explainer(config, source.tokenizer_dir)
  label_starts = explainer.label_starts

  def model() -> bart.Bart:
    return build_model(source, seed, e.dtype)

  def loss(model: bart.Bart, batch: dict[str, Any],
           reward: reinforce.RewardModel | None = None):
    # `reward` is Task.constants: the trainer passes the classifier's parameters to the
    # jitted step as an argument (not baked into the program as constants).
    key = reinforce.policy_key(model) if reward is not None else None
    starts = None if label_starts is None else jnp.asarray(label_starts)[batch["label"]]
    return reinforce.explanation_loss(model, batch, step=jnp.max(batch["step"]), key=key,
                                      settings=settings, reward_model=reward,
                                      reconstruction_weight=e.reconstruction_weight,
                                      reconstruction_length=e.max_target_len,
                                      reconstruction_row_stride=e.reconstruction_row_stride,
                                      start_ids=starts)

  def train_data(local_batch: int):
    loader = pipelines.LoaderConfig.training(local_batch, seed, config.data)
    pipeline = pipelines.explanation(data.tfds, "train", source.tokenizer_dir, loader,
                                     max_source_len=e.max_source_len,
                                     max_target_len=e.max_target_len,
                                     left_truncation=e.left_truncation,
                                     length_multiple=e.length_multiple)
    return StepNumbered(iter(pipeline.dataset))

  evaluator = _dev_evaluator(explainer, dev_claims(data.release, e), reward_model)
  return Task(model=model, loss=loss, batch_axes=BATCH_AXES, train_data=train_data,
              evaluators=(Evaluator("dev", evaluator),),
              initial_params=_initial_params(source.folder) if source.folder else None,
              constants=(lambda: reward_model) if reward_model is not None else None,
              inference=explainer)
