"""The explanation generator's loss: token NLL plus a REINFORCE term rewarded by a classifier.

    loss = NLL + w(step) * PG,   w(step) = sc_weight if step >= start_step else 0
    PG   = -mean_b[ (r_b - baseline_b) * sum_t log p(y_bt | y_b<t, x_b) ]
           (or the per-token mean of the log-probabilities: `ReinforceSettings.log_prob`)

over a sequence y_b drawn from the current policy. Everything runs inside the one jitted
train step (DESIGN.md convention 5): the sample is drawn autoregressively with the KV cache
in a lax.while_loop (`decoding.generated_tokens`), the frozen classifier reads the sampled
BPE ids and gives r = p(intended label) - sum of the other two classes' probabilities, and
the log-probabilities come from one differentiable teacher-forced pass over the sample
(the sample and the reward are constants to the gradient). Tokens after the first EOS are
masked out. The policy is the dropout-free model (the sampler and the scoring pass share
one deterministic encoder pass); the NLL pass keeps dropout. Before `start_step` the
sampling and the reward are skipped by a lax.cond on the traced step counter (no
sampling cost, no retrace when the term switches on).

Baselines (`ReinforceSettings.baseline`):
  "none"   the reference's plain REINFORCE.
  "greedy" self-critical: the reward of the greedy decode of the same source.
  "mean"   the mean reward of the other rows of the (micro-)batch (leave-one-out, so the
           estimate stays unbiased). The trainer keeps no state besides parameters, so a
           mean running over steps cannot live inside the step; the batch stands in for it.

`teacher_forced_sampling=True` reproduces the reference instead: each target position is
sampled independently from the NLL pass's teacher-forced logits (over the gold prefix,
dropout on), for as many positions as the gold target has, and those same logits give the
log-probabilities; with the greedy baseline the per-position argmax is the baseline text.

The reward model is anything that maps the generator's ids to class probabilities
(`RewardModel`); its parameters are an explicit pytree, never trained.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx

from mocheg_jax.models import decoding
from mocheg_jax.models.bart import Bart, BartConfig, shift_tokens_right

BASELINES = ("none", "greedy", "mean")
LOG_PROBS = ("sum", "mean")

Probabilities = Callable[[Any, jax.Array, jax.Array], jax.Array]


# ---- the reward model ------------------------------------------------------------------------
def reward_from_probabilities(probabilities: jax.Array, labels: jax.Array) -> jax.Array:
  """r [B] = p(label) - sum of the other classes' probabilities, from [B, 3] and [B]."""
  chosen = jnp.take_along_axis(probabilities, labels[:, None].astype(jnp.int32), axis=-1)[:, 0]
  return chosen - (probabilities.sum(-1) - chosen)


@flax.struct.dataclass
class RewardModel:
  """A frozen classifier of the generator's own token ids, as a pure function + params.

  `apply(params, ids [B, T] int32, mask [B, T] bool) -> probabilities [B, 3] float32` must
  be pure and jittable. `params` is a pytree leaf of this dataclass (so a RewardModel can be
  a jit argument); `apply` is static. Gradients never reach `params`.
  """
  apply: Probabilities = flax.struct.field(pytree_node=False)
  params: Any = None

  def probabilities(self, ids: jax.Array, mask: jax.Array) -> jax.Array:
    return self.apply(jax.lax.stop_gradient(self.params), ids, mask.astype(bool))

  def __call__(self, ids: jax.Array, mask: jax.Array) -> jax.Array:
    return self.probabilities(ids, mask)

  def reward(self, ids: jax.Array, mask: jax.Array, labels: jax.Array) -> jax.Array:
    """r [B] of the texts `ids` for the intended `labels`."""
    return reward_from_probabilities(self.probabilities(ids, mask), labels)

  @classmethod
  def from_module(cls, module: nnx.Module,
                  probabilities: Callable[[nnx.Module, jax.Array, jax.Array], jax.Array]
                  ) -> RewardModel:
    """Wraps an NNX classifier and its `probabilities(module, ids, mask)` function (the
    truthfulness classifier's `label_probabilities`, which runs it without dropout)."""
    graphdef, state = nnx.split(module)

    def apply(params, ids, mask):
      return probabilities(nnx.merge(graphdef, params), ids, mask)

    return cls(apply=apply, params=state)


# ---- settings ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ReinforceSettings:
  """How the reward term is computed (static: one compiled step per distinct value).

  Attributes:
    sc_weight: weight of the policy-gradient term (0: NLL only).
    start_step: the term is on from this optimizer step on (traced comparison).
    baseline: one of BASELINES.
    teacher_forced_sampling: the reference's per-position sampling (see the module doc).
    sample_max_length: generation's max_length for the sample (counts the start token), so
      samples have at most sample_max_length - 1 tokens.
    log_prob: "sum" scores a sample by sum_t log p (the estimator as written); "mean" by
      the per-token mean, which divides the term's gradient by the sample's length. Why:
      on the small world the summed term's gradient norm was 17-25 against the NLL's 0.85
      over ~100-token samples, so clipping the global norm to 1 scaled the NLL's gradient
      down ~20x: the NLL stalled (2.15 -> 2.13 over 200 steps, against 1.73 -> 1.35 without
      the term) while the noisy term collapsed the outputs to 9-14 distinct texts. Measured
      with "mean" (same run, steps 200-400): the NLL no longer stalls (1.40 at step 400)
      and the gradient norm stays ~1, but the dev outputs shrink (31 tokens against 79;
      dev ROUGE-L 11.4 against 29.7 NLL-only and 22.4 "sum"; 20 distinct texts of 143;
      classifier agreement 27.3% against 32.2% "sum"): a per-token mean rewards short
      samples. Neither setting raises the agreement yet.
  """
  sc_weight: float = 0.5
  start_step: int = 20
  baseline: str = "greedy"
  teacher_forced_sampling: bool = False
  sample_max_length: int = 400
  log_prob: str = "sum"

  def validate(self) -> None:
    if self.baseline not in BASELINES:
      raise ValueError(f"explain.baseline must be one of {BASELINES}, got {self.baseline!r}")
    if self.sc_weight < 0:
      raise ValueError(f"explain.sc_weight must be >= 0, got {self.sc_weight}")
    if self.start_step < 0:
      raise ValueError(f"explain.sc_start_step must be >= 0, got {self.start_step}")
    if self.log_prob not in LOG_PROBS:
      raise ValueError(f"explain.pg_log_prob must be one of {LOG_PROBS}, got "
                       f"{self.log_prob!r}")
    if self.sample_max_length < 2:
      raise ValueError(f"explain.sample_max_length must be >= 2 (it counts the decoder "
                       f"start token), got {self.sample_max_length}")


def policy_generation_config(config: BartConfig, max_length: int, *, sample: bool
                             ) -> decoding.GenerationConfig:
  """Generation from the unmodified policy: no top-k/top-p, temperature 1, no n-gram ban,
  no forced or minimum-length tokens, so a sampled token's probability is the model's own."""
  return decoding.GenerationConfig.from_model(
      config, max_length=max_length, min_length=0, num_beams=1, do_sample=sample, top_k=0,
      top_p=1.0, temperature=1.0, no_repeat_ngram_size=0, early_stopping=False,
      length_penalty=1.0, forced_bos_token_id=None, forced_eos_token_id=None)


# ---- loss pieces ------------------------------------------------------------------------------
def token_log_probs(logits: jax.Array, ids: jax.Array) -> jax.Array:
  """log softmax(logits)[ids]: [B, T] from logits [B, T, V] (float32).

  Written as logits[ids] - logsumexp(logits) with the pick as a masked sum: its gradient is
  then one fused elementwise pass (softmax minus the one-hot), where indexing's gradient
  fills a zero tensor the size of the logits and scatters into it (~2% of a BART step on
  CPU), and no [B, T, V] log-probability tensor is written."""
  logits = logits.astype(jnp.float32)
  vocab = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
  picked = jnp.sum(jnp.where(vocab == ids[..., None].astype(jnp.int32), logits, 0.0), axis=-1)
  return picked - jax.nn.logsumexp(logits, axis=-1)


def token_nll(logits: jax.Array, targets: jax.Array, mask: jax.Array
              ) -> tuple[jax.Array, jax.Array]:
  """(mean negative log-likelihood over the real target tokens, their count).

  The mean is over every real token of the batch, as transformers' BART loss with -100
  labels (so long targets weigh more than short ones).
  """
  mask = mask.astype(jnp.float32)
  count = mask.sum()
  total = -(token_log_probs(logits, targets) * mask).sum()
  return total / jnp.maximum(count, 1.0), count


def sequence_log_probs(logits: jax.Array, ids: jax.Array, mask: jax.Array) -> jax.Array:
  """sum_t log p(ids_t | ...) over the masked-in positions: [B]."""
  return (token_log_probs(logits, ids) * mask.astype(jnp.float32)).sum(-1)


def leave_one_out_mean(rewards: jax.Array) -> jax.Array:
  """b_i = mean of the other rows' rewards (0 for a batch of one)."""
  n = rewards.shape[0]
  if n == 1:
    return jnp.zeros_like(rewards)
  return (rewards.sum() - rewards) / (n - 1)


def policy_gradient_loss(log_probs: jax.Array, rewards: jax.Array,
                         baselines: jax.Array) -> jax.Array:
  """-mean_b[(r_b - b_b) * log p(y_b)]; the advantage is a constant to the gradient."""
  advantage = jax.lax.stop_gradient(rewards - baselines)
  return -jnp.mean(advantage * log_probs)


def teacher_forced_logits(model: Bart, source_ids: jax.Array, source_mask: jax.Array,
                          labels: jax.Array, *, deterministic: bool,
                          memory: jax.Array | None = None,
                          start_ids: jax.Array | None = None) -> jax.Array:
  """Logits [B, T, V] for `labels` [B, T] (decoder inputs: labels shifted right after the
  start token: the model's, or each row's of `start_ids` [B]); `memory`: the encoder pass
  of the source when the caller has it."""
  decoder_inputs = _decoder_inputs(model, labels, start_ids)
  if memory is None:
    memory = model.encode(source_ids, source_mask, deterministic=deterministic)
  return model.decode(decoder_inputs, memory, source_mask, deterministic=deterministic)


def _decoder_inputs(model: Bart, ids: jax.Array, start_ids: jax.Array | None) -> jax.Array:
  c = model.config
  start = c.decoder_start_token_id if start_ids is None else start_ids
  return shift_tokens_right(ids, c.pad_token_id, start)


def source_reconstruction_nll(model: Bart, memory: jax.Array, source_ids: jax.Array,
                              source_mask: jax.Array, length: int, row_stride: int = 1
                              ) -> jax.Array:
  """NLL of re-writing the source's first `length` tokens from its encoder memory, for every
  `row_stride`-th row of the batch.

  An auxiliary objective for a randomly initialised generator (a pretrained BART has learnt
  it as its denoising pre-training): without it the decoder of the small synthetic world
  learnt to ignore the source altogether: after 400 steps its NLL was the same with the
  right, a shuffled or an empty source, the encoder's output had collapsed to one vector per
  position, and every test claim got the same text. Copying rewards an encoder that keeps
  the tokens apart and a cross-attention that finds them, which the rulings need for the
  claim's names and facts. Measured: alone, on the post-LN stack, it did not stop the
  collapse (100 steps); with pre-LN layers (BartConfig.normalize_before) the two together
  kept the encoder alive over 400 steps (configs/explain.py). The decoder is told which text
  to write by its start token: BOS here, BART's decoder start (EOS) for explanations, so
  generation is unchanged.

  The copying pass costs as much as the explanation's own (a vocabulary projection at every
  position: a third of the small generator's step, BENCHMARKS.md); `row_stride` > 1 copies
  only rows 0, k, 2k, ... (on the small world that made the encoder learn slower: not
  used there). A stride rather than the first rows: each device's block of a sharded batch
  keeps its share.
  """
  c = model.config
  rows = slice(None, None, row_stride)
  targets, mask = source_ids[rows, :length], source_mask[rows, :length]
  inputs = shift_tokens_right(targets, c.pad_token_id, c.bos_token_id)
  logits = model.decode(inputs, memory[rows], source_mask[rows], deterministic=False)
  return token_nll(logits, targets, mask)[0]


def policy_key(model: Bart) -> jax.Array:
  """A sampling key from the model's own RNG state (the decoder's dropout stream).

  The trainer reseeds every stream from fold_in(rng, step) for each micro-batch, so the
  samples of step s are the same in a resumed run. The key is read, not drawn: the
  stream's count (and so every dropout mask) stays as in an NLL-only run, and the salt is
  a count no step reaches.
  """
  stream = getattr(getattr(model.decoder, "dropout", None), "rngs", None)
  if stream is None:
    raise ValueError("the generator has no decoder dropout RNG stream to sample with; build "
                     "Bart with nnx.Rngs")
  return jax.random.fold_in(stream.key[...], _SAMPLE_SALT)


_SAMPLE_SALT = 0x5A3D0000


# ---- the reward term --------------------------------------------------------------------------
def baseline_rewards(mode: str, rewards: jax.Array,
                     greedy_rewards: Callable[[], jax.Array]) -> jax.Array:
  """The per-row baseline b [B] of `mode` (BASELINES); `greedy_rewards` is called only for
  the self-critical mode."""
  if mode == "greedy":
    return greedy_rewards()
  if mode == "mean":
    return leave_one_out_mean(rewards)
  if mode == "none":
    return jnp.zeros_like(rewards)
  raise ValueError(f"unknown baseline {mode!r}; expected one of {BASELINES}")


def _no_model_grad(model: Bart) -> Bart:
  """The same model with its parameters behind stop_gradient (sampling is not a function
  the gradient goes through)."""
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  return nnx.merge(graphdef, jax.lax.stop_gradient(params), rest)


def _sample_and_score(model: Bart, memory: jax.Array, batch: Mapping[str, jax.Array],
                      key: jax.Array, settings: ReinforceSettings, reward_model: RewardModel,
                      start_ids: jax.Array | None
                      ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """(ids, mask, rewards, baselines) of a sample from the policy; no gradient inside."""
  source_ids, source_mask, labels = batch["source_ids"], batch["source_mask"], batch["label"]
  model = _no_model_grad(model)

  def generate(sample: bool, rng: jax.Array | None):
    config = policy_generation_config(model.config, settings.sample_max_length, sample=sample)
    return decoding.generated_tokens(model, source_ids, source_mask, config, rng,
                                     memory=memory, start_ids=start_ids)

  ids, mask = generate(True, key)
  rewards = reward_model.reward(ids, mask, labels)
  baselines = baseline_rewards(settings.baseline, rewards,
                               lambda: reward_model.reward(*generate(False, None), labels))
  return ids, mask, rewards, baselines


def _per_position_sample(logits: jax.Array, batch: Mapping[str, jax.Array], key: jax.Array,
                         settings: ReinforceSettings, reward_model: RewardModel
                         ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """The reference's sample: every target position drawn independently from the
  teacher-forced logits, as many positions as the gold target has."""
  logits = jax.lax.stop_gradient(logits)
  mask = batch["target_mask"].astype(bool)
  ids = decoding.sample_categorical(key, logits)
  ids = jnp.where(mask, ids, batch["target_ids"])  # Pads stay pads.
  labels = batch["label"]
  rewards = reward_model.reward(ids, mask, labels)
  greedy = lambda: reward_model.reward(  # noqa: E731
      jnp.where(mask, decoding.first_argmax(logits), batch["target_ids"]), mask,
      labels)
  return ids, mask, rewards, baseline_rewards(settings.baseline, rewards, greedy)


def explanation_loss(model: Bart, batch: Mapping[str, jax.Array], *, step: jax.Array,
                     key: jax.Array | None, settings: ReinforceSettings,
                     reward_model: RewardModel | None = None,
                     reconstruction_weight: float = 0.0,
                     reconstruction_length: int | None = None,
                     reconstruction_row_stride: int = 1,
                     start_ids: jax.Array | None = None
                     ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """NLL (+ the weighted REINFORCE term once `step >= settings.start_step`) of a batch.

  Only the sampling and the reward sit in the lax.cond (they need no gradient); the
  teacher-forced scoring pass runs every step (before the start on an empty sample, with
  weight 0), because a cond around differentiated code made XLA's CPU compile about 3x
  slower (110 s against 36 s for a 1-layer model).

  Args:
    model: the generator, in training mode (dropout on in the NLL pass).
    batch: `source_ids`, `source_mask` [B, S]; `target_ids`, `target_mask` [B, T] (the
      tokenized explanation, BOS ... EOS then pads); `label` [B] (the intended class).
    step: int32 scalar, the optimizer step (traced: changing it never recompiles).
    key: PRNG key of the sample (needed with a reward model).
    settings: the static settings.
    reward_model: the frozen classifier; None (or sc_weight 0) gives the NLL alone.
    reconstruction_weight: weight of `source_reconstruction_nll` over the first
      `reconstruction_length` source tokens (0: off; for randomly initialised generators).
    reconstruction_length: default T; a fixed length (the task's max_target_len) keeps the
      term the same whatever padding a batch's length bucket cut.
    reconstruction_row_stride: the term over every k-th row of the batch only.
    start_ids: int [B], each row's decoder start token for the explanation (the NLL pass,
      the sample and its scoring pass); None: the model's decoder_start_token_id.

  Returns:
    (loss, metrics): scalars "nll", "target_tokens", and with a reward model "sc_weight"
    (the weight in effect), "pg_loss", "reward", "baseline", "advantage", "sample_tokens"
    (0 before the start step).
  """
  settings.validate()
  source_ids, source_mask = batch["source_ids"], batch["source_mask"]
  targets, target_mask = batch["target_ids"], batch["target_mask"]
  train_memory = model.encode(source_ids, source_mask, deterministic=False)
  logits = teacher_forced_logits(model, source_ids, source_mask, targets, deterministic=False,
                                 memory=train_memory, start_ids=start_ids)
  nll, count = token_nll(logits, targets, target_mask)
  metrics = {"nll": nll, "target_tokens": count}
  loss = nll
  if reconstruction_weight:
    copy_nll = source_reconstruction_nll(model, train_memory, source_ids, source_mask,
                                         reconstruction_length or targets.shape[1],
                                         reconstruction_row_stride)
    metrics["reconstruction_nll"] = copy_nll
    loss = loss + reconstruction_weight * copy_nll
  if reward_model is None or settings.sc_weight == 0:
    return loss, metrics

  if key is None:
    raise ValueError("the REINFORCE term needs a PRNG key to sample with")
  active = jnp.asarray(step) >= settings.start_step
  batch_size = targets.shape[0]
  if settings.teacher_forced_sampling:
    length = targets.shape[1]
    sample = lambda: _per_position_sample(logits, batch, key, settings,  # noqa: E731
                                          reward_model)
  else:
    length = settings.sample_max_length - 1
    # The policy is the dropout-free model: the sampler and the scoring pass share one
    # deterministic encoder pass (a constant to the sampler, differentiated for scoring).
    memory = model.encode(source_ids, source_mask, deterministic=True)
    sample = lambda: _sample_and_score(  # noqa: E731
        model, jax.lax.stop_gradient(memory), batch, key, settings, reward_model, start_ids)

  def nothing():
    zeros = jnp.zeros((batch_size,), jnp.float32)
    return (jnp.zeros((batch_size, length), jnp.int32),
            jnp.zeros((batch_size, length), bool), zeros, zeros)

  ids, mask, rewards, baselines = jax.lax.cond(active, sample, nothing)
  if settings.teacher_forced_sampling:
    log_probs = sequence_log_probs(logits, ids, mask)
  else:
    sample_logits = model.decode(_decoder_inputs(model, ids, start_ids), memory, source_mask,
                                 deterministic=True)
    log_probs = sequence_log_probs(sample_logits, ids, mask)
  if settings.log_prob == "mean":
    log_probs = log_probs / jnp.maximum(mask.astype(jnp.float32).sum(-1), 1.0)
  pg = policy_gradient_loss(log_probs, rewards, baselines)
  weight = jnp.where(active, jnp.float32(settings.sc_weight), 0.0)
  metrics.update(sc_weight=weight, pg_loss=pg, reward=rewards.mean(),
                 baseline=baselines.mean(), advantage=(rewards - baselines).mean(),
                 sample_tokens=mask.astype(jnp.float32).sum(-1).mean())
  return loss + weight * pg, metrics
