"""The explanation generator: NLL, the compiled REINFORCE term, sampling, baselines,
truncation, and the task training on the tiny world with a stand-in reward model."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from mocheg_jax.data import tokenizers
from mocheg_jax.data.labels import LABEL_NAMES
from mocheg_jax.data.report import MochegInputError
from mocheg_jax.explanation import generator_task
from mocheg_jax.explanation import reinforce
from mocheg_jax.models import bart, decoding
from mocheg_jax.train import loop
from mocheg_jax.train.restore import load_trained
from mocheg_jax.train.state import ModelSpec
from mocheg_jax.train.writer import read_metrics
from mocheg_jax.utils.configs import load_config

VOCAB, PAD, EOS, BOS = 40, 1, 2, 0
B, S, T = 4, 10, 8
SAMPLE_MAX = 12  # Generation max_length: 11 sampled tokens.


def _config(dropout: float = 0.0) -> bart.BartConfig:
  return bart.BartConfig(vocab_size=VOCAB, d_model=16, encoder_layers=1, decoder_layers=1,
                         encoder_attention_heads=2, decoder_attention_heads=2,
                         encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32,
                         dropout=dropout)


def _model(seed: int = 0, **kw) -> bart.Bart:
  return bart.Bart(_config(**kw), rngs=nnx.Rngs(params=seed, dropout=seed + 1))


def _batch(seed: int = 0) -> dict[str, jnp.ndarray]:
  rng = np.random.default_rng(seed)
  target_lengths = np.array([T, 5, 3, 6])
  target_mask = np.arange(T)[None] < target_lengths[:, None]
  targets = np.where(target_mask, rng.integers(3, VOCAB, (B, T)), PAD)
  targets[np.arange(B), target_lengths - 1] = EOS
  source_mask = np.arange(S)[None] < np.array([S, 7, 4, 9])[:, None]
  return {"source_ids": jnp.asarray(np.where(source_mask, rng.integers(3, VOCAB, (B, S)), PAD),
                                    jnp.int32),
          "source_mask": jnp.asarray(source_mask, jnp.int32),
          "target_ids": jnp.asarray(targets, jnp.int32),
          "target_mask": jnp.asarray(target_mask, jnp.int32),
          "label": jnp.asarray([0, 1, 2, 1], jnp.int32)}


class BagOfIds(nnx.Module):
  """The stand-in classifier: a mean of per-token class scores over the masked ids."""

  def __init__(self, vocab: int, seed: int = 7):
    self.scores = nnx.Param(jax.random.normal(jax.random.key(seed), (vocab, 3)) * 3.0)

  def __call__(self, ids, mask):
    m = mask.astype(jnp.float32)[..., None]
    pooled = (self.scores[...][ids] * m).sum(1) / jnp.maximum(m.sum(1), 1.0)
    return jax.nn.softmax(pooled, axis=-1)


def _stand_in(vocab: int = VOCAB) -> reinforce.RewardModel:
  return reinforce.RewardModel.from_module(BagOfIds(vocab), lambda m, ids, mask: m(ids, mask))


def _log_softmax(x: np.ndarray) -> np.ndarray:
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


# ---- NLL and the policy-gradient loss ----------------------------------------------------------
@pytest.mark.parametrize("start_ids", [None, (5, 9, 7, 9)])
def test_nll_equals_a_hand_computation(start_ids):
  """With `start_ids` (the label start) each row's decoder begins with its own token."""
  model, batch = _model(), _batch()
  targets, mask = np.asarray(batch["target_ids"]), np.asarray(batch["target_mask"]) == 1
  starts = np.full((B, 1), EOS) if start_ids is None else np.array(start_ids)[:, None]
  decoder_inputs = np.concatenate([starts, targets[:, :-1]], axis=1)

  @jax.jit
  def run(batch, decoder_inputs):
    loss = reinforce.explanation_loss(
        model, batch, step=jnp.int32(0), key=None, settings=reinforce.ReinforceSettings(),
        reward_model=None, start_ids=None if start_ids is None else jnp.asarray(start_ids))
    # Dropout is 0, so this is the same pass with hand-made decoder inputs.
    return loss, model(batch["source_ids"], batch["source_mask"], decoder_inputs)

  (loss, metrics), logits = run(batch, jnp.asarray(decoder_inputs))
  picked = np.take_along_axis(_log_softmax(np.asarray(logits)), targets[..., None], -1)[..., 0]
  want = -picked[mask].mean()  # Mean over the real tokens of the whole batch.
  np.testing.assert_allclose(float(loss), want, rtol=1e-5)
  assert float(metrics["nll"]) == float(loss) and float(metrics["target_tokens"]) == mask.sum()
  assert set(metrics) == {"nll", "target_tokens"}  # No reward model: no reward metrics.


def _copying_inputs(batch):
  """The copied source's first T tokens, their mask, and the decoder inputs (BOS first)."""
  source, mask = np.asarray(batch["source_ids"])[:, :T], np.asarray(batch["source_mask"])[:, :T]
  return source, mask, np.concatenate([np.full((B, 1), BOS), source[:, :-1]], axis=1)


def test_source_reconstruction_term_is_the_nll_of_copying_the_source_after_bos():
  """The auxiliary term: the decoder, started with BOS (not the explanation's EOS start),
  re-writes the source's first T tokens from the same encoder pass; weighted into the loss."""
  model, batch = _model(), _batch()
  source, mask, decoder_inputs = _copying_inputs(batch)

  @jax.jit
  def run(batch, decoder_inputs):
    plain = reinforce.explanation_loss(model, batch, step=jnp.int32(0), key=None,
                                       settings=reinforce.ReinforceSettings())
    weighted = reinforce.explanation_loss(model, batch, step=jnp.int32(0), key=None,
                                          settings=reinforce.ReinforceSettings(),
                                          reconstruction_weight=0.25)
    return plain, weighted, model(batch["source_ids"], batch["source_mask"], decoder_inputs)

  (plain, _), (weighted, metrics), logits = run(batch, jnp.asarray(decoder_inputs))
  picked = np.take_along_axis(_log_softmax(np.asarray(logits)), source[..., None], -1)[..., 0]
  want = -picked[mask == 1].mean()
  np.testing.assert_allclose(float(metrics["reconstruction_nll"]), want, rtol=1e-5)
  np.testing.assert_allclose(float(weighted), float(plain) + 0.25 * want, rtol=1e-5)
  assert float(metrics["nll"]) == pytest.approx(float(plain))


def test_source_reconstruction_over_every_kth_row_is_those_rows_nll():
  """reconstruction_row_stride=2: the term is the copying NLL of rows 0, 2, ... alone (their
  tokens pooled), the explanation's NLL unchanged."""
  model, batch = _model(), _batch()
  source, mask, decoder_inputs = _copying_inputs(batch)

  @jax.jit
  def run(batch, decoder_inputs):
    every = reinforce.explanation_loss(model, batch, step=jnp.int32(0), key=None,
                                       settings=reinforce.ReinforceSettings(),
                                       reconstruction_weight=1.0)
    strided = reinforce.explanation_loss(model, batch, step=jnp.int32(0), key=None,
                                         settings=reinforce.ReinforceSettings(),
                                         reconstruction_weight=1.0,
                                         reconstruction_row_stride=2)
    return every, strided, model(batch["source_ids"], batch["source_mask"], decoder_inputs)

  (_, every), (_, strided), logits = run(batch, jnp.asarray(decoder_inputs))
  picked = np.take_along_axis(_log_softmax(np.asarray(logits)), source[..., None], -1)[..., 0]
  rows = np.arange(B) % 2 == 0
  want = -picked[rows][mask[rows] == 1].mean()
  assert B > 2 and want != pytest.approx(-picked[mask == 1].mean())  # A different term.
  np.testing.assert_allclose(float(strided["reconstruction_nll"]), want, rtol=1e-5)
  assert float(strided["nll"]) == pytest.approx(float(every["nll"]))


def test_cutting_padding_to_a_length_bucket_leaves_the_loss_and_gradients_alone():
  """pipelines.LengthBuckets cuts a batch to its longest rows; with the copying term's
  length fixed (the task passes max_target_len), loss, metrics and gradients are those of
  the batch padded to the full width."""
  from mocheg_jax.data import pipelines
  model, batch = _model(), _batch()
  wide = {k: jnp.pad(v, ((0, 0), (0, 6)), constant_values=PAD if k.endswith("ids") else 0)
          if v.ndim == 2 else v for k, v in batch.items()}  # Sources 16 wide, targets 14.
  cut = pipelines.LengthBuckets(4, pipelines.EXPLANATION_LENGTHS)(
      {k: np.asarray(v) for k, v in wide.items()})
  assert cut["source_ids"].shape == (B, 12) and cut["target_ids"].shape == (B, T)
  settings = reinforce.ReinforceSettings(sc_weight=0.5, start_step=0,
                                        sample_max_length=SAMPLE_MAX)
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)

  @jax.jit
  def loss_and_grads(params, batch):
    def loss(params):
      m = nnx.merge(graphdef, params, rest)
      return reinforce.explanation_loss(m, batch, step=jnp.int32(0), key=jax.random.key(4),
                                        settings=settings, reward_model=_stand_in(),
                                        reconstruction_weight=0.5, reconstruction_length=14)
    return jax.value_and_grad(loss, has_aux=True)(params)

  (full, full_metrics), full_grads = loss_and_grads(params, wide)
  (ours, metrics), grads = loss_and_grads(params, {k: jnp.asarray(v) for k, v in cut.items()})
  np.testing.assert_allclose(float(ours), float(full), rtol=1e-5)
  for name, value in full_metrics.items():
    np.testing.assert_allclose(float(metrics[name]), float(value), rtol=1e-5, atol=1e-6,
                               err_msg=name)
  assert float(metrics["sample_tokens"]) > 0 and float(metrics["reconstruction_nll"]) > 0
  for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(full_grads)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)


def _copy_batch(rng: np.random.Generator, batch: int = 16, length: int = 6):
  """Sources of random tokens; the target is the source again (BOS ... EOS)."""
  body = rng.integers(3, VOCAB, (batch, length))
  source = np.concatenate([np.full((batch, 1), BOS), body, np.full((batch, 1), EOS)], 1)
  ones = np.ones_like(source)
  return {"source_ids": jnp.asarray(source, jnp.int32), "source_mask": jnp.asarray(ones),
          "target_ids": jnp.asarray(source, jnp.int32), "target_mask": jnp.asarray(ones),
          "label": jnp.zeros((batch,), jnp.int32)}


@pytest.mark.parametrize("normalize_before", [False, True])
def test_the_generator_learns_to_read_its_source(normalize_before):
  """A guard on the whole path from source to loss (masks, memory, cross-attention,
  gradients): trained on copying random tokens, the model's NLL with the right source must
  fall far below its NLL with another row's source. (On the small world the post-LN
  generator trained from scratch did not get there in 400 steps; see reinforce.py.)"""
  config = bart.BartConfig(vocab_size=VOCAB, d_model=32, encoder_layers=1, decoder_layers=1,
                           encoder_attention_heads=2, decoder_attention_heads=2,
                           encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=16,
                           dropout=0.0, normalize_before=normalize_before)
  model = bart.Bart(config, rngs=nnx.Rngs(0))
  optimizer = nnx.Optimizer(model, optax.adam(3e-3), wrt=nnx.Param)
  settings = reinforce.ReinforceSettings()

  def nll(model, batch):
    return reinforce.explanation_loss(model, batch, step=jnp.int32(0), key=None,
                                      settings=settings)[0]

  @nnx.jit
  def train_step(model, optimizer, batch):
    loss, grads = nnx.value_and_grad(nll)(model, batch)
    optimizer.update(model, grads)
    return loss

  rng = np.random.default_rng(0)
  for _ in range(300):
    train_step(model, optimizer, _copy_batch(rng))
  test = _copy_batch(rng)
  shuffled = dict(test, source_ids=jnp.roll(test["source_ids"], 1, axis=0))
  right, wrong = float(nnx.jit(nll)(model, test)), float(nnx.jit(nll)(model, shuffled))
  assert right < 0.5 * wrong, (right, wrong)


def test_policy_gradient_matches_hand_and_finite_differences():
  rng = np.random.default_rng(1)
  logits = jnp.asarray(rng.normal(size=(3, 5, 7)), jnp.float32)
  ids = jnp.asarray(rng.integers(0, 7, (3, 5)), jnp.int32)
  mask = jnp.asarray(np.arange(5)[None] < np.array([5, 2, 4])[:, None])
  rewards, baselines = jnp.asarray([0.5, -0.2, 0.9]), jnp.asarray([0.1, 0.1, -0.3])

  @jax.jit
  def loss(lg, r):
    return reinforce.policy_gradient_loss(reinforce.sequence_log_probs(lg, ids, mask), r,
                                          baselines)

  grad_logits, grad_rewards = jax.jit(jax.grad(loss, argnums=(0, 1)))(logits, rewards)
  # d/dlogits of -(r - b) log softmax(logits)[y] / B = -(r - b) (onehot(y) - softmax) / B.
  probs = np.exp(_log_softmax(np.asarray(logits)))
  onehot = np.eye(7)[np.asarray(ids)]
  advantage = np.asarray(rewards - baselines)[:, None, None]
  want = -advantage * (onehot - probs) * np.asarray(mask)[..., None] / 3
  np.testing.assert_allclose(np.asarray(grad_logits), want, atol=1e-6)
  assert not np.asarray(grad_rewards).any()  # The reward is a constant to the gradient.
  for index in [(0, 0, 0), (1, 1, 3), (2, 3, int(ids[2, 3]))]:
    step = np.zeros(logits.shape, np.float32)
    step[index] = 1e-2
    numeric = (loss(logits + step, rewards) - loss(logits - step, rewards)) / 2e-2
    np.testing.assert_allclose(float(numeric), want[index], atol=2e-4)
  masked = (1, 3, 0)  # Past row 1's EOS: no gradient.
  assert want[masked] == 0 and float(grad_logits[masked]) == 0


def test_the_reinforce_term_alone_teaches_what_the_reward_model_wants():
  """A sign and alignment guard for the whole term (sampler, scoring pass, baseline): the
  reward model wants token 3 + label; the label is the source's first token; training on the
  policy-gradient term alone (no NLL) must raise the sampled reward well above its start.
  Measured (2026-12-07, keys offset by 0-4 and with either sampler, Gumbel or inverse CDF):
  -0.31 to -0.33 over the first 20 steps, 0.07-0.21 over the last 20 of 400 at lr 1e-3; it
  plateaus for ~200 steps while the policy learns to read the label. At lr 3e-3 over 200
  steps (this test until then) it passed or failed by the keys' draw: the reward rose,
  then collapsed to -0.34 for 2 of 7 key offsets with each sampler."""
  model = _model(dropout=0.0)
  bag = BagOfIds(VOCAB)
  bag.scores[...] = jnp.zeros((VOCAB, 3)).at[jnp.arange(3) + 3, jnp.arange(3)].set(4.0)
  reward_model = reinforce.RewardModel.from_module(bag, lambda m, ids, mask: m(ids, mask))
  settings = reinforce.ReinforceSettings(sc_weight=1.0, start_step=0, baseline="mean",
                                         sample_max_length=SAMPLE_MAX)
  batch = {k: jnp.concatenate([v] * 4) for k, v in _batch().items()}
  batch["label"] = jnp.asarray(np.arange(4 * B) % 3, jnp.int32)
  batch["source_ids"] = batch["source_ids"].at[:, 0].set(20 + batch["label"])
  optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)

  @nnx.jit
  def train_step(model, optimizer, key, step):
    def policy_gradient(m):
      loss, metrics = reinforce.explanation_loss(m, batch, step=step, key=key,
                                                 settings=settings, reward_model=reward_model)
      return loss - metrics["nll"], metrics["reward"]
    (_, reward), grads = nnx.value_and_grad(policy_gradient, has_aux=True)(model)
    optimizer.update(model, grads)
    return reward

  rewards = [float(train_step(model, optimizer, jax.random.key(i), jnp.int32(i)))
             for i in range(400)]
  assert np.mean(rewards[-20:]) > np.mean(rewards[:20]) + 0.3, rewards[::20]


def test_reward_and_baselines():
  probs = jnp.asarray([[0.7, 0.2, 0.1], [0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])
  np.testing.assert_allclose(reinforce.reward_from_probabilities(probs, jnp.asarray([0, 1, 2])),
                             [0.4, -0.6, 0.6], atol=1e-6)
  rewards = jnp.asarray([1.0, 2.0, 6.0])
  greedy = lambda: jnp.asarray([0.5, 0.5, 0.5])  # noqa: E731
  np.testing.assert_allclose(reinforce.baseline_rewards("none", rewards, greedy), [0, 0, 0])
  np.testing.assert_allclose(reinforce.baseline_rewards("mean", rewards, greedy), [4, 3.5, 1.5])
  np.testing.assert_allclose(reinforce.baseline_rewards("greedy", rewards, greedy), [0.5] * 3)
  assert float(reinforce.leave_one_out_mean(jnp.asarray([3.0]))[0]) == 0.0
  with pytest.raises(ValueError, match="baseline must be one of"):
    reinforce.ReinforceSettings(baseline="ema").validate()


def test_the_sampling_key_leaves_the_dropout_masks_alone():
  """Reading the key does not advance the stream: before the start step a run with a reward
  model draws the dropout masks of an NLL-only run."""
  model = _model(dropout=0.1)
  stream = model.decoder.dropout.rngs
  key = reinforce.policy_key(model)
  assert int(stream.count[...]) == 0
  assert not np.array_equal(jax.random.key_data(key), jax.random.key_data(stream()))
  np.testing.assert_array_equal(jax.random.key_data(reinforce.policy_key(_model(dropout=0.1))),
                                jax.random.key_data(key))


# ---- sampling inside jit ----------------------------------------------------------------------
def test_sampling_inside_jit_gives_valid_ids_masked_after_eos():
  model = _model(seed=3)
  batch = _batch(2)
  config = reinforce.policy_generation_config(model.config, SAMPLE_MAX, sample=True)
  graphdef, state = nnx.split(model)

  @jax.jit
  def sample(state, key):
    m = nnx.merge(graphdef, state)
    out = decoding.generate_core(m, batch["source_ids"], batch["source_mask"], config, key)
    ids, mask = decoding.generated_tokens(m, batch["source_ids"], batch["source_mask"],
                                          config, key)
    logits = reinforce.teacher_forced_logits(m, batch["source_ids"], batch["source_mask"],
                                             ids, deterministic=True)
    return ids, mask, out.scores, reinforce.sequence_log_probs(logits, ids, mask)

  def with_eos_bias(value: float):
    model.final_logits_bias[...] = jnp.zeros((VOCAB,)).at[EOS].set(value)
    return nnx.split(model)[1]  # Same structure: the compiled program is reused.

  runs = {bias: [sample(with_eos_bias(bias), jax.random.key(k)) for k in range(3)]
          for bias in (0.0, 2.5, 40.0, -40.0)}
  ended_early = 0
  for bias, outs in runs.items():
    for ids, mask, sampler_logp, scored_logp in outs:
      ids, mask = np.asarray(ids), np.asarray(mask)
      assert ids.shape == mask.shape == (B, SAMPLE_MAX - 1)
      assert ((ids >= 0) & (ids < VOCAB)).all()
      for row, keep in zip(ids, mask):
        eos = np.flatnonzero(row == EOS)
        n = eos[0] + 1 if len(eos) else SAMPLE_MAX - 1
        assert keep.tolist() == [True] * n + [False] * (SAMPLE_MAX - 1 - n)
        assert (row[n:] == PAD).all()  # After EOS: pads.
        ended_early += n < SAMPLE_MAX - 1
      # The scoring pass gives the sampler's own log-probabilities (the same policy).
      np.testing.assert_allclose(np.asarray(scored_logp), np.asarray(sampler_logp),
                                 rtol=1e-4, atol=1e-4)
  assert ended_early > 0
  assert (np.asarray(runs[40.0][0][1]).sum(-1) == 1).all()  # EOS first: one token.
  assert np.asarray(runs[-40.0][0][1]).all()  # Never EOS: every position is kept.
  first, second = runs[2.5][0][0], runs[2.5][1][0]
  assert not np.array_equal(first, second)  # Other keys, other samples;
  np.testing.assert_array_equal(first, sample(with_eos_bias(2.5), jax.random.key(0))[0])


def test_the_sample_and_its_scoring_pass_share_the_rows_start_tokens():
  """With per-row start tokens the sampler, the scoring pass and the REINFORCE term all
  condition on them: the scored log-probabilities are the sampler's own, and a sample
  started with the model's start token has other ones."""
  model, batch = _model(seed=3), _batch(2)
  starts = jnp.asarray([5, 9, 7, 9], jnp.int32)
  config = reinforce.policy_generation_config(model.config, SAMPLE_MAX, sample=True)

  @jax.jit
  def sample(key, starts):
    out = decoding.generate_core(model, batch["source_ids"], batch["source_mask"], config, key,
                                 start_ids=starts)
    ids, mask = decoding.tokens_and_mask(out)
    logits = reinforce.teacher_forced_logits(model, batch["source_ids"], batch["source_mask"],
                                             ids, deterministic=True, start_ids=starts)
    return out, reinforce.sequence_log_probs(logits, ids, mask)

  out, scored = sample(jax.random.key(0), starts)
  np.testing.assert_array_equal(np.asarray(out.sequences[:, 0]), np.asarray(starts))
  np.testing.assert_allclose(np.asarray(scored), np.asarray(out.scores), rtol=1e-4, atol=1e-4)
  plain, _ = sample(jax.random.key(0), jnp.full((B,), EOS, jnp.int32))
  assert not np.allclose(np.asarray(plain.scores), np.asarray(out.scores))

  # The term's log-probabilities (so pg_loss, without a baseline) and the NLL see them too.
  settings = reinforce.ReinforceSettings(sc_weight=1.0, start_step=0, baseline="none",
                                         sample_max_length=SAMPLE_MAX)
  loss = jax.jit(lambda starts: reinforce.explanation_loss(
      model, batch, step=jnp.int32(0), key=jax.random.key(1), settings=settings,
      reward_model=_stand_in(), start_ids=starts)[1])
  with_starts, without = loss(starts), loss(jnp.full((B,), EOS, jnp.int32))
  assert float(with_starts["pg_loss"]) != float(without["pg_loss"])
  assert float(with_starts["nll"]) != float(without["nll"])


# ---- the reward term, per-position (the reference's sampling) --------------------------------
def test_every_baseline_with_the_reference_per_position_sampling():
  """One program computes the loss with each baseline (the autoregressive sampler with the
  greedy baseline runs in the task test below)."""
  model, batch, reward_model = _model(dropout=0.1), _batch(), _stand_in()
  spec = ModelSpec.of(lambda: _model(dropout=0.1))
  params = nnx.to_pure_dict(nnx.state(model, nnx.Param))

  @jax.jit
  def run(params, step, key, reward_model):
    out = {}
    for baseline in reinforce.BASELINES:
      settings = reinforce.ReinforceSettings(sc_weight=0.5, start_step=1, baseline=baseline,
                                             teacher_forced_sampling=True)
      out[baseline] = reinforce.explanation_loss(
          spec.merge(params, {}, {}, key), batch, step=step, key=key, settings=settings,
          reward_model=reward_model)
    return out

  before = run(params, jnp.int32(0), jax.random.key(1), reward_model)
  after = run(params, jnp.int32(1), jax.random.key(1), reward_model)
  gold_lengths = np.asarray(batch["target_mask"]).sum(-1)
  for baseline in reinforce.BASELINES:
    loss, m = before[baseline]
    assert float(m["sc_weight"]) == 0 and float(loss) == float(m["nll"])
    loss, m = after[baseline]
    assert float(m["sc_weight"]) == 0.5 and float(m["pg_loss"]) != 0
    # Every gold position is sampled, however short the target: the gold mask is the mask.
    assert float(m["sample_tokens"]) == gold_lengths.mean()
    np.testing.assert_allclose(float(loss), float(m["nll"]) + 0.5 * float(m["pg_loss"]),
                               rtol=1e-5)
  # The same sample (same key) in every mode, so the same reward; the baselines differ.
  rewards = {b: float(after[b][1]["reward"]) for b in reinforce.BASELINES}
  assert len(set(rewards.values())) == 1 and rewards["none"] != 0
  assert float(after["none"][1]["baseline"]) == 0
  assert abs(float(after["mean"][1]["advantage"])) < 1e-6  # Leave-one-out sums to ~0.
  assert float(after["greedy"][1]["baseline"]) not in (0.0, rewards["none"])


def test_per_token_log_probabilities_divide_the_term_by_the_sample_length():
  """pg_log_prob="mean": the same sample (per-position sampling over full-length targets,
  so every sample has T tokens) gives the summed term divided by T."""
  model, batch, reward_model = _model(), _batch(), _stand_in()
  batch["target_mask"] = jnp.ones_like(batch["target_mask"])
  out = {}
  for log_prob in reinforce.LOG_PROBS:
    settings = reinforce.ReinforceSettings(sc_weight=1.0, start_step=0, baseline="mean",
                                           teacher_forced_sampling=True, log_prob=log_prob)
    _, m = reinforce.explanation_loss(model, batch, step=jnp.int32(0), key=jax.random.key(3),
                                      settings=settings, reward_model=reward_model)
    out[log_prob] = float(m["pg_loss"])
  assert out["sum"] != 0
  np.testing.assert_allclose(out["mean"] * T, out["sum"], rtol=1e-5)
  with pytest.raises(ValueError, match="pg_log_prob must be one of"):
    reinforce.ReinforceSettings(log_prob="max").validate()


# ---- truncation and the data the task trains on ------------------------------------------------
def test_truncation_keeps_label_and_claim_unless_the_reference_flag_is_set(tmp_path):
  texts = ["The bridge has 3 arches. It was built in 1901 by the city council."] * 20
  tok = tokenizers.train_byte_bpe(texts + ["refuted supported NEI"] * 5, tmp_path / "bpe",
                                  vocab_size=300)
  e = generator_task.explain_config()
  e.max_source_len = 24
  from mocheg_jax.data.mocheg import Claim
  claim = Claim(1, "The bridge has 3 arches.", 0, ("It was built in 1901.",) * 20,
                "x", (), "")
  kept = generator_task.source_ids(tok, claim, e)
  text = tok.decode(kept, skip_special_tokens=False)
  assert len(kept) == 24 and text.startswith("<s>refuted</s> The bridge has 3 arches.</s> It")
  assert text.endswith("</s>")
  e.left_truncation = True
  left = generator_task.source_ids(tok, claim, e)
  assert len(left) == 24 and left[0] == BOS and left[-1] == EOS
  plain = lambda ids: tok.decode(ids, skip_special_tokens=True)  # noqa: E731
  assert "refuted" not in plain(left) and "bridge" not in plain(left)
  assert plain(left).endswith("It was built in 1901.")  # The end of the evidence.
  short = Claim(2, "Claim.", 2, ("Ev.",), "x", (), "")
  assert plain(generator_task.source_ids(tok, short, e)) == "NEI Claim. Ev."


def test_the_generator_starts_from_a_local_hf_bart_folder(tmp_path):
  import transformers
  texts = ["The bridge has 3 arches. It was built in 1901."] * 20
  folder = tmp_path / "bart"
  tok = tokenizers.train_byte_bpe(texts, folder, vocab_size=300)
  hf = transformers.BartForConditionalGeneration(transformers.BartConfig(
      vocab_size=len(tok), d_model=16, encoder_layers=1, decoder_layers=1,
      encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
      decoder_ffn_dim=32, max_position_embeddings=64))
  hf.save_pretrained(folder, safe_serialization=True)
  e = generator_task.explain_config()
  e.init, e.max_source_len, e.max_target_len = str(folder), 48, 48
  e.sample_max_length = e.max_decode_length = 40
  source = generator_task.generator_source(e, "unused-world-bpe")
  assert source.tokenizer_dir == str(folder)  # The checkpoint's own tokenizer.
  assert (source.config.d_model, source.config.vocab_size) == (16, len(tok))
  abstract = nnx.eval_shape(lambda: generator_task.build_model(source, 0))
  want = jax.tree.map(lambda x: x.shape, nnx.to_pure_dict(nnx.state(abstract, nnx.Param)))
  loaded = generator_task._initial_params(str(folder))()  # pylint: disable=protected-access
  assert jax.tree.map(np.shape, loaded) == want
  np.testing.assert_allclose(loaded["shared"]["embedding"],
                             hf.model.shared.weight.detach().numpy())
  e.max_source_len = 100  # More than the 64 positions.
  with pytest.raises(MochegInputError, match="max_source_len = 100 exceeds the model's 64"):
    generator_task.generator_source(e, "unused")
  e.max_source_len, e.reconstruction_row_stride = 48, 0
  with pytest.raises(MochegInputError, match="reconstruction_row_stride must be >= 1"):
    generator_task.generator_source(e, "unused")
  e.init = ""
  with pytest.raises(MochegInputError, match="explain.init '' is neither 'random' nor"):
    generator_task.generator_source(e, "unused")


class _Counting:
  def __init__(self):
    self.step = 0

  def __next__(self):
    self.step += 1
    return {"source_ids": np.zeros((2, 3), np.int32)}

  def get_state(self):
    return {"position": self.step}

  def set_state(self, state):
    self.step = state["position"]


def test_batches_carry_the_optimizer_step_across_a_restore():
  data = generator_task.StepNumbered(_Counting())
  steps = [int(next(data)["step"][0]) for _ in range(3)]
  assert steps == [0, 1, 2]
  state = data.get_state()
  resumed = generator_task.StepNumbered(_Counting())
  resumed.set_state(state)
  batch = next(resumed)
  assert batch["step"].tolist() == [3, 3] and resumed.get_state()["inner"] == {"position": 4}


# ---- the task on the tiny world ----------------------------------------------------------------
def _tiny_config(data_dir, **explain):
  config = load_config("explain", "tiny")
  config.data.dir = str(data_dir)
  config.mesh.data = 1
  config.total_steps, config.batch_size, config.log_every = 4, 4, 1
  config.eval_every, config.checkpoint_every = 0, 4
  config.optimizer.warmup_steps = 0
  e = config.explain
  e.d_model, e.layers, e.heads, e.ffn, e.max_positions = 16, 1, 2, 32, 64
  e.max_source_len, e.max_target_len = 48, 48
  e.sample_max_length, e.max_decode_length = 12, 12
  e.eval_batch_size, e.eval_max_claims = 4, 6
  e.sc_start_step = 2  # The default baseline: greedy (self-critical).
  for key, value in explain.items():
    e[key] = value
  return config


def test_task_trains_with_the_reward_on_the_tiny_world(tmp_path, monkeypatch):
  bpe_vocab = []

  def stand_in_loader(path, tokenizer, longest, reward_input, moved=None):
    assert path == "stand-in" and len(tokenizer) == bpe_vocab[0] and longest == 11
    assert moved is None  # Trained in place.
    assert reward_input == "ids"  # The default: no host round trip.
    return _stand_in(bpe_vocab[0])

  traces = []
  real_loss = reinforce.explanation_loss

  def counting_loss(*args, **kwargs):
    traces.append(1)
    return real_loss(*args, **kwargs)

  monkeypatch.setattr(generator_task, "load_reward_model", stand_in_loader)
  monkeypatch.setattr(reinforce, "explanation_loss", counting_loss)
  config = _tiny_config(tmp_path / "data", classifier="stand-in", label_start=True)
  from mocheg_jax.train.data import prepared_data
  data = prepared_data(config, str(tmp_path / "w"), log=lambda _: None)
  bpe = tokenizers.load_tokenizer(data.bpe)
  bpe_vocab.append(len(bpe))

  # The training batches: gold label and claim first, the step number alongside.
  task = generator_task.make_task(config, str(tmp_path / "w"))
  first = next(task.train_data(4))
  assert first["step"].tolist() == [0] * 4 and set(generator_task.BATCH_AXES) <= set(first)
  for row, label in zip(first["source_ids"], first["label"]):
    text = bpe.decode(row, skip_special_tokens=False)
    assert text.startswith(f"<s>{LABEL_NAMES[label]}</s> ")
  left = generator_task.make_task(_tiny_config(tmp_path / "data", max_source_len=16,
                                               left_truncation=True), str(tmp_path / "w"))
  rows = next(left.train_data(4))["source_ids"]
  assert not any(bpe.decode(r, skip_special_tokens=False).startswith(
      f"<s>{LABEL_NAMES[lab]}</s>") for r, lab in zip(rows, first["label"]))

  result = loop.train(config, str(tmp_path / "w"), devices=jax.devices()[:1],
                      log=lambda _: None)
  assert result.status == "finished" and result.step == 4
  assert len(traces) == 1  # The jitted step was traced once for steps 0..3.
  records = [r for r in read_metrics(tmp_path / "w") if "loss" in r]
  assert [r["sc_weight"] for r in records] == [0.0, 0.0, 0.5, 0.5]
  copy_weight = config.explain.reconstruction_weight  # The tiny config's copying term.
  assert copy_weight > 0
  for r in records[:2]:
    assert r["sample_tokens"] == 0
    np.testing.assert_allclose(r["loss"], r["nll"] + copy_weight * r["reconstruction_nll"],
                               rtol=1e-5)
  for r in records[2:]:
    assert 0 < r["sample_tokens"] <= 11
    assert -1 <= r["reward"] <= 1 and -1 <= r["baseline"] <= 1 and r["baseline"] != 0
    np.testing.assert_allclose(r["loss"], r["nll"] + copy_weight * r["reconstruction_nll"]
                               + 0.5 * r["pg_loss"], rtol=1e-4)
  for name in ("dev/rouge1", "dev/rougeL", "dev/classifier_agreement",
               "dev/distinct_outputs"):
    assert 0 <= result.metrics[name] <= 1
  assert 0 < result.metrics["dev/generated_tokens"] <= 11
  # The per-label agreements are the overall one split by the dev claims' labels.
  dev_labels = np.array([c.label for c in generator_task.dev_claims(data.release,
                                                                    config.explain)])
  counts = np.bincount(dev_labels, minlength=3)
  per_label = [result.metrics.get(f"dev/classifier_agreement_{n}") for n in LABEL_NAMES]
  assert [p is not None for p in per_label] == list(counts > 0)
  np.testing.assert_allclose(
      sum(n * p for n, p in zip(counts, per_label) if p is not None) / counts.sum(),
      result.metrics["dev/classifier_agreement"], rtol=1e-6)
  trained = load_trained(str(tmp_path / "w"))
  model = trained.model
  assert isinstance(model, bart.Bart) and model.config.vocab_size == len(bpe)

  # explain.label_start: each class starts the decoder with its own token, in training (the
  # loss above) and in generation, where each row starts with its claim's label.
  starts = generator_task.label_start_ids(bpe)
  assert len(set(starts.tolist())) == 3
  for token, name in zip(starts, LABEL_NAMES):
    assert name.lower().startswith(bpe.decode([int(token)]).strip().lower())
  seen = []
  real_generate = decoding.generate

  def recording_generate(*args, start_ids=None, **kwargs):
    seen.append(np.asarray(start_ids).tolist())
    return real_generate(*args, start_ids=start_ids, **kwargs)

  monkeypatch.setattr(decoding, "generate", recording_generate)
  claims = generator_task.dev_claims(data.release, config.explain)[:5]
  labels = [c.label for c in claims]
  trained.task.inference.generate(model, claims)  # Batches of 4: 4 rows, then 1 + 3 fillers.
  assert seen == [starts[labels[:4]].tolist(), starts[[labels[4]] * 4].tolist()]


class _CollidingTokenizer:
  def __call__(self, text, add_special_tokens=False):
    return {"input_ids": [11, len(text)]}  # Every label name starts with token 11.


def test_label_start_needs_three_different_first_tokens():
  with pytest.raises(MochegInputError, match="label_start.*three different tokens"):
    generator_task.label_start_ids(_CollidingTokenizer())


def test_agreement_by_label_splits_the_agreement_by_class():
  agree = np.array([True, False, True, True, False])
  labels = np.array([0, 0, 1, 1, 1])
  assert generator_task.agreement_by_label(agree, labels) == {
      "classifier_agreement_refuted": 0.5, "classifier_agreement_supported": 2 / 3}
