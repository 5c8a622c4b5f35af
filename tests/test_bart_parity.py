"""BART against transformers' BartForConditionalGeneration (PyTorch, float32)."""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from mocheg_jax.data.report import MochegInputError
from mocheg_jax.models import bart, decoding
from mocheg_jax.models.hf import bart as hf_bart

VOCAB = 200
TINY = dict(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2,
            encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
            decoder_ffn_dim=48, max_position_embeddings=64)


def _hf_model(seed: int = 0, **overrides) -> transformers.BartForConditionalGeneration:
  """A tiny random model with every tensor random (biases and layer norms too), so a
  wrong mapping of any of them shows."""
  torch.manual_seed(seed)
  model = transformers.BartForConditionalGeneration(
      transformers.BartConfig(**{**TINY, **overrides})).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name and name.endswith("weight"):
        p.copy_(1.0 + 0.3 * torch.randn_like(p))
      else:
        p.normal_(0.0, 0.2)
    model.final_logits_bias.normal_(0.0, 1.0)
  return model


pytestmark = pytest.mark.usefixtures("one_torch_thread")


# Jitted entry points: eager JAX would compile every primitive on its own (slow on CPU).
_encode_train = nnx.jit(lambda model, src, mask: model.encode(src, mask, deterministic=False))
_forward_and_memory = nnx.jit(lambda model, src, src_mask, tgt, tgt_mask: (
    model(src, src_mask, tgt, tgt_mask), model.encode(src, src_mask)))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  folder = tmp_path_factory.mktemp("bart")
  model = _hf_model()
  model.save_pretrained(folder, safe_serialization=True)
  return folder, model


def _ragged_batch(seed: int = 0):
  rng = np.random.default_rng(seed)
  src = rng.integers(3, VOCAB, (3, 11))
  src_mask = np.ones_like(src)
  src_mask[1, 7:] = 0
  src_mask[2, 2:] = 0
  src[src_mask == 0] = 1
  tgt = rng.integers(3, VOCAB, (3, 8))
  tgt_mask = np.ones_like(tgt)
  tgt_mask[0, 5:] = 0
  tgt_mask[2, 3:] = 0
  tgt[tgt_mask == 0] = 1
  return src, src_mask, tgt, tgt_mask


def _hf_logits(model, src, src_mask, tgt, tgt_mask=None):
  with torch.no_grad():
    return model(input_ids=torch.tensor(src), attention_mask=torch.tensor(src_mask),
                 decoder_input_ids=torch.tensor(tgt),
                 decoder_attention_mask=None if tgt_mask is None else torch.tensor(tgt_mask)
                 ).logits.numpy()


@pytest.mark.parametrize("overrides", [{}, dict(scale_embedding=True,
                                                activation_function="relu")])
def test_logits_match_hf_with_and_without_padding(tmp_path, overrides):
  reference = _hf_model(seed=1, **overrides)
  reference.save_pretrained(tmp_path, safe_serialization=True)
  ours = hf_bart.load(tmp_path)
  assert ours.config.scale_embedding == bool(overrides)
  src, src_mask, tgt, tgt_mask = _ragged_batch()
  logits, memory = _forward_and_memory(ours, *(jnp.asarray(a) for a in (src, src_mask, tgt,
                                                                         tgt_mask)))
  want = _hf_logits(reference, src, src_mask, tgt, tgt_mask)
  real = tgt_mask == 1  # Padded query positions are don't-care in both.
  np.testing.assert_allclose(np.asarray(logits)[real], want[real], atol=1e-4)
  assert np.abs(want).max() > 1.0  # The comparison is not between near-zero numbers.
  with torch.no_grad():
    hf_memory = reference.model.encoder(input_ids=torch.tensor(src),
                                        attention_mask=torch.tensor(src_mask))[0].numpy()
  np.testing.assert_allclose(np.asarray(memory)[src_mask == 1], hf_memory[src_mask == 1],
                             atol=1e-4)
  # No padding anywhere (the same compiled program, all-ones masks).
  ones = np.ones_like(src)
  src2 = np.where(src == 1, 7, src)
  tgt2 = np.where(tgt == 1, 9, tgt)
  logits, _ = _forward_and_memory(ours, *(jnp.asarray(a) for a in (src2, ones, tgt2,
                                                                    np.ones_like(tgt))))
  np.testing.assert_allclose(np.asarray(logits), _hf_logits(reference, src2, ones, tgt2),
                             atol=1e-4)


def test_pre_layer_norm_matches_hf_mbart(tmp_path):
  """normalize_before=True is mBART's layout: transformers' MBart with the same random
  weights (mapped by the same table plus the stacks' final LayerNorms) gives our logits."""
  from mocheg_jax.models.hf import convert
  torch.manual_seed(3)
  reference = transformers.MBartForConditionalGeneration(
      transformers.MBartConfig(**TINY, scale_embedding=True)).eval()
  with torch.no_grad():
    for name, p in reference.named_parameters():
      p.copy_(1.0 + 0.3 * torch.randn_like(p) if "norm" in name and name.endswith("weight")
              else 0.2 * torch.randn_like(p))
    reference.final_logits_bias.normal_(0.0, 1.0)
  config = bart.BartConfig(**TINY, scale_embedding=True, normalize_before=True)
  state = {k: v.numpy() for k, v in reference.state_dict().items()}
  ours = convert.load_into_abstract(lambda: bart.Bart(config, rngs=nnx.Rngs(0)), state,
                                    hf_bart.rules(config), source="mbart",
                                    ignore=hf_bart.IGNORE)
  assert ours.encoder.layer_norm is not None and ours.decoder.layer_norm is not None
  src, src_mask, tgt, tgt_mask = _ragged_batch()
  logits, memory = _forward_and_memory(ours, *(jnp.asarray(a) for a in (src, src_mask, tgt,
                                                                         tgt_mask)))
  want = _hf_logits(reference, src, src_mask, tgt, tgt_mask)
  real = tgt_mask == 1
  np.testing.assert_allclose(np.asarray(logits)[real], want[real], atol=1e-4)
  assert np.abs(want).max() > 1.0
  with pytest.raises(MochegInputError, match="pre-LN"):
    config.to_hf()


def test_shift_tokens_right_matches_hf():
  labels = np.array([[5, 6, 7, -100], [8, -100, -100, -100]])
  want = transformers.models.bart.modeling_bart.shift_tokens_right(torch.tensor(labels), 1, 2)
  np.testing.assert_array_equal(bart.shift_tokens_right(jnp.asarray(labels), 1, 2),
                                want.numpy())


@pytest.mark.parametrize("pre_layer_norm", [False, True])
def test_incremental_decoding_with_cache_equals_full_forward(checkpoint, pre_layer_norm):
  folder, _ = checkpoint
  if pre_layer_norm:  # Random weights, scaled up so the logits are far from zero.
    ours = bart.Bart(bart.BartConfig(**TINY, normalize_before=True), rngs=nnx.Rngs(5))
    nnx.update(ours, jax.tree.map(lambda x: 5 * x, nnx.state(ours, nnx.Param)))
  else:
    ours = hf_bart.load(folder)
  src, src_mask, tgt, _ = _ragged_batch(seed=3)
  src, src_mask, tgt = jnp.asarray(src), jnp.asarray(src_mask), jnp.asarray(tgt)
  graphdef, state = nnx.split(ours)

  @jax.jit
  def prefill(state, tokens):
    model = nnx.merge(graphdef, state)
    memory = model.encode(src, src_mask)
    full = model.decode(tgt, memory, src_mask)
    cache = model.init_cache(memory, max_length=12)
    return full, model.decode(tokens, None, src_mask, cache=cache)

  @jax.jit
  def step(state, tokens, cache):
    return nnx.merge(graphdef, state).decode(tokens, None, src_mask, cache=cache)

  # A prefill of 3 tokens, then one token at a time (the same compiled step each time).
  full, (logits, cache) = prefill(state, tgt[:, :3])
  full = np.asarray(full)
  pieces = [np.asarray(logits)]
  for t in range(3, tgt.shape[1]):
    logits, cache = step(state, tgt[:, t:t + 1], cache)
    pieces.append(np.asarray(logits))
  assert int(cache.index) == tgt.shape[1]
  assert step._cache_size() == 1
  # Pre-LN's weights are scaled up (logits in the tens): float32 rounding, not a cache bug
  # (that would differ by whole units).
  np.testing.assert_allclose(np.concatenate(pieces, axis=1), full,
                             atol=1e-4 if pre_layer_norm else 1e-5)


def test_export_round_trip_loads_in_transformers(checkpoint, tmp_path):
  folder, reference = checkpoint
  ours = hf_bart.load(folder)
  hf_bart.save(ours, tmp_path)
  reloaded = transformers.BartForConditionalGeneration.from_pretrained(tmp_path).eval()
  src, src_mask, tgt, tgt_mask = _ragged_batch(seed=5)
  np.testing.assert_allclose(_hf_logits(reloaded, src, src_mask, tgt),
                             _hf_logits(reference, src, src_mask, tgt), atol=1e-6)
  # Generation settings survive in generation_config.json.
  ours2 = hf_bart.load(folder)
  ours2.config = dataclasses.replace(ours.config, num_beams=4,
                                    no_repeat_ngram_size=3, forced_bos_token_id=0)
  hf_bart.save(ours2, tmp_path / "gen")
  generation = transformers.GenerationConfig.from_pretrained(tmp_path / "gen")
  assert (generation.num_beams, generation.no_repeat_ngram_size,
          generation.forced_bos_token_id, generation.forced_eos_token_id) == (4, 3, 0, 2)
  again = hf_bart.load(tmp_path / "gen")
  assert again.config == ours2.config
  for a, b in zip(jax.tree.leaves(nnx.state(again, nnx.Param)),
                  jax.tree.leaves(nnx.state(ours, nnx.Param))):
    np.testing.assert_array_equal(a, b)


def _copy_folder(src, dst):
  os.makedirs(dst, exist_ok=True)
  for name in os.listdir(src):
    with open(os.path.join(src, name), "rb") as f, open(os.path.join(dst, name), "wb") as g:
      g.write(f.read())


def test_errors_name_the_file_and_parameter(checkpoint, tmp_path):
  folder, _ = checkpoint
  with pytest.raises(MochegInputError, match="no weights found"):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text(json.dumps({"model_type": "bart"}))
    hf_bart.load(tmp_path / "empty")

  other = tmp_path / "mbart"
  _copy_folder(folder, other)
  config = json.loads((other / "config.json").read_text())
  (other / "config.json").write_text(json.dumps({**config, "model_type": "mbart"}))
  with pytest.raises(MochegInputError, match=r"config.json: model_type 'mbart' is not supported"):
    hf_bart.load(other)

  wider = tmp_path / "wider"
  _copy_folder(folder, wider)
  (wider / "config.json").write_text(json.dumps({**config, "decoder_ffn_dim": 40}))
  with pytest.raises(MochegInputError,
                     match=r"mismatched shapes .*model\.decoder\.layers\.0\.fc1\.weight"):
    hf_bart.load(wider)

  from safetensors.numpy import load_file, save_file
  state = load_file(folder / "model.safetensors")
  missing = tmp_path / "missing"
  _copy_folder(folder, missing)
  save_file({k: v for k, v in state.items() if k != "model.encoder.layers.1.fc2.bias"},
            missing / "model.safetensors")
  with pytest.raises(MochegInputError, match=r"missing weights \['model\.encoder\.layers\.1"):
    hf_bart.load(missing)

  untied = tmp_path / "untied"
  _copy_folder(folder, untied)
  save_file({**state, "lm_head.weight": state["model.shared.weight"] + 1.0},
            untied / "model.safetensors")
  with pytest.raises(MochegInputError, match="lm_head.weight differs"):
    hf_bart.load(untied)

  # dont_load keeps a freshly initialised part; everything else is loaded.
  fresh = tmp_path / "fresh"
  _copy_folder(folder, fresh)
  save_file({k: v for k, v in state.items() if ".decoder.layers.1.fc2." not in k},
            fresh / "model.safetensors")
  model = hf_bart.load(fresh, dont_load=r"^decoder\.layers\.1\.mlp\.fc2\.")
  kernel = np.asarray(model.decoder.layers[1].mlp.fc2.kernel[...])
  assert kernel.shape == (48, 32) and 0.005 < kernel.std() < 0.05  # BART's init (0.02).
  np.testing.assert_array_equal(model.decoder.layers[1].mlp.fc1.kernel[...],
                                state["model.decoder.layers.1.fc1.weight"].T)

  with pytest.raises(MochegInputError, match="normalize_before"):
    bart.BartConfig.from_hf({**config, "normalize_before": True})


def test_generation_defaults_from_config_and_generation_config():
  legacy = {**TINY, "model_type": "bart", "num_beams": 4, "no_repeat_ngram_size": 3,
            "max_length": 30, "early_stopping": True, "forced_bos_token_id": 0}
  config = bart.BartConfig.from_hf(legacy, {"num_beams": 2, "length_penalty": 2.0})
  assert (config.num_beams, config.no_repeat_ngram_size, config.max_length,
          config.early_stopping, config.length_penalty, config.forced_bos_token_id) == (
              2, 3, 30, True, 2.0, 0)
  generation = decoding.GenerationConfig.from_model(config, num_beams=5)
  assert (generation.num_beams, generation.max_length, generation.forced_eos_token_id) == (
      5, 30, 2)
  # Nothing set: HF's 20 new tokens after the start token.
  plain = bart.BartConfig.from_hf({**TINY, "model_type": "bart"})
  assert decoding.GenerationConfig.from_model(plain).max_length == 21
  with pytest.raises(ValueError, match="needs 79 decoder positions"):
    decoding.GenerationConfig.from_model(plain, max_length=80)


def test_dropout_is_off_when_deterministic_and_random_otherwise(checkpoint):
  folder, _ = checkpoint
  ours = hf_bart.load(folder, seed=3)
  batch = [jnp.asarray(a) for a in _ragged_batch()]
  a = _forward_and_memory(ours, *batch)
  np.testing.assert_array_equal(a[0], _forward_and_memory(ours, *batch)[0])
  b = _encode_train(ours, batch[0], batch[1])
  c = _encode_train(ours, batch[0], batch[1])  # The dropout stream advanced.
  assert not np.allclose(b, a[1], atol=1e-3) and not np.allclose(b, c, atol=1e-3)


def test_bfloat16_smoke(checkpoint):
  folder, reference = checkpoint
  ours = hf_bart.load(folder, dtype=jnp.bfloat16)
  src, src_mask, tgt, tgt_mask = _ragged_batch(seed=7)
  got = np.asarray(_forward_and_memory(ours, *(jnp.asarray(a) for a in (
      src, src_mask, tgt, tgt_mask)))[0])
  assert got.dtype == np.float32  # Logits come back in float32 for the loss.
  want = _hf_logits(reference, src, src_mask, tgt, tgt_mask)
  real = tgt_mask == 1
  scale = np.abs(want[real]).max()
  assert np.abs(got[real] - want[real]).max() < 0.1 * scale
  assert ours.shared.embedding[...].dtype == jnp.float32  # Parameters stay float32.
  out = decoding.generate(ours, src, src_mask, max_length=6)
  assert out.sequences.shape == (3, 6) and (np.asarray(out.sequences)[:, 0] == 2).all()
