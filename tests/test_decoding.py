"""Compiled greedy / beam / sampling generation against transformers' `generate`."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from mocheg_jax.data import tokenizers
from mocheg_jax.models import decoding
from mocheg_jax.models.hf import bart as hf_bart
from tests.processes import script_environment

REPO = pathlib.Path(__file__).resolve().parents[1]
VOCAB, PAD, EOS, BOS = 300, 1, 2, 0  # >= 261: the byte-level BPE's minimum.
MAX_LENGTH = 20
SHAPE = (4, 10)  # Every source batch has this shape, so each strategy compiles once.


def _hf_model(seed: int = 0) -> transformers.BartForConditionalGeneration:
  """A tiny random model whose generations are varied, end at varied lengths, and whose
  beam search has no near-ties (so HF's result is well defined to float32 noise).

  With plain random weights, tied embeddings and order-blind attention make a model repeat
  one token, and permutations of the same tokens then score the same up to ~1e-7. Large
  decoder feed-forward weights (a random function of the current token, so bigram-like
  transitions), small attention outputs, and an EOS row scaled down but biased up (so EOS
  competes in every context) avoid both.
  """
  torch.manual_seed(seed)
  config = transformers.BartConfig(
      vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2,
      encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
      decoder_ffn_dim=64, max_position_embeddings=64, init_std=0.2)
  model = transformers.BartForConditionalGeneration(config).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name == "model.shared.weight":
        p.normal_(0.0, 1.0)
      elif "embed_positions" in name:
        p.normal_(0.0, 0.3)
      elif name.startswith("model.decoder.layers") and "out_proj.weight" in name:
        p.normal_(0.0, 0.1)
      elif name.startswith("model.decoder.layers") and (".fc1.weight" in name
                                                       or ".fc2.weight" in name):
        p.normal_(0.0, 1.0)
    model.model.shared.weight[EOS] *= 0.6
    model.final_logits_bias[0, EOS] = 13.0
  return model


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
  folder = tmp_path_factory.mktemp("bart_gen")
  reference = _hf_model()
  reference.save_pretrained(folder, safe_serialization=True)
  return reference, hf_bart.load(folder), folder


def _sources(seed: int):
  """A batch with ragged right padding (one row unpadded)."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(3, VOCAB, SHAPE)
  lengths = rng.integers(2, SHAPE[1] + 1, SHAPE[0])
  lengths[0] = SHAPE[1]
  mask = (np.arange(SHAPE[1])[None] < lengths[:, None]).astype(np.int64)
  return np.where(mask == 1, ids, PAD), mask


def _hf_generate(reference, ids, mask, **settings) -> tuple[np.ndarray, np.ndarray | None]:
  with torch.no_grad():
    out = reference.generate(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                             max_length=MAX_LENGTH, do_sample=False,
                             return_dict_in_generate=True, output_scores=True, **settings)
  padded = np.full((ids.shape[0], MAX_LENGTH), PAD)
  padded[:, :out.sequences.shape[1]] = out.sequences.numpy()
  scores = getattr(out, "sequences_scores", None)
  return padded, None if scores is None else scores.numpy()


GREEDY_SETTINGS = [
    {},  # The checkpoint's own settings: forced EOS at max_length - 1.
    dict(min_length=6, forced_bos_token_id=BOS),
    dict(forced_eos_token_id=None, min_length=3),
]
BEAM_SETTINGS = [
    dict(length_penalty=1.0, early_stopping=False),
    dict(length_penalty=2.0, early_stopping=True),
    dict(length_penalty=1.0, early_stopping=True, min_length=8, forced_bos_token_id=BOS),
    dict(length_penalty=2.0, early_stopping=False, min_length=5, forced_eos_token_id=None),
    dict(length_penalty=0.5, early_stopping="never", forced_bos_token_id=BOS),
]


# The loop in one segment (MAX_LENGTH is under the default first segment) and in three
# (cache lengths 4, 8, 19: the cache grows twice while rows are still running).
SEGMENTS = [decoding.CACHE_SEGMENT, 4]


@pytest.mark.parametrize("cache_segment", SEGMENTS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_is_token_identical_to_hf(models, seed, cache_segment):
  reference, ours, _ = models
  ids, mask = _sources(seed)
  for settings in GREEDY_SETTINGS:
    want, _ = _hf_generate(reference, ids, mask, **settings)
    out = decoding.generate(ours, ids, mask, max_length=MAX_LENGTH,
                            cache_segment=cache_segment, **settings)
    np.testing.assert_array_equal(out.sequences, want, err_msg=str(settings))
    is_eos = want[:, 1:] == EOS
    expected_lengths = np.where(is_eos.any(1), is_eos.argmax(1) + 2, MAX_LENGTH)
    np.testing.assert_array_equal(out.lengths, expected_lengths)


@pytest.mark.parametrize("cache_segment", SEGMENTS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beam_search_is_token_identical_to_hf(models, seed, cache_segment):
  reference, ours, _ = models
  ids, mask = _sources(seed)
  lengths = set()
  for settings in BEAM_SETTINGS:
    settings = dict(num_beams=4, no_repeat_ngram_size=3, **settings)
    want, want_scores = _hf_generate(reference, ids, mask, **settings)
    out = decoding.generate(ours, ids, mask, max_length=MAX_LENGTH,
                            cache_segment=cache_segment, **settings)
    np.testing.assert_array_equal(out.sequences, want, err_msg=str(settings))
    np.testing.assert_allclose(out.scores, want_scores, atol=1e-4, err_msg=str(settings))
    lengths.update(np.asarray(out.lengths).tolist())
  # The settings exercise hypotheses that end early, not only forced endings.
  assert min(lengths) < MAX_LENGTH - 2, lengths


def test_cache_segments_double_up_to_the_positions():
  assert decoding.segment_lengths(19, 4) == [4, 8, 19]
  assert decoding.segment_lengths(399, 64) == [64, 128, 256, 399]
  assert decoding.segment_lengths(100, 64) == [64, 100]
  assert decoding.segment_lengths(65, 64) == [65]  # No segment for the last step alone.
  assert decoding.segment_lengths(64, 64) == [64]
  assert decoding.segment_lengths(399, 0) == [399]


@pytest.mark.parametrize("num_beams", [1, 4])
def test_per_row_start_tokens_match_hf_decoder_prompts(models, num_beams):
  """`start_ids` (the explanation generator's label start) is HF's generation from a
  one-token decoder prompt per row."""
  reference, ours, _ = models
  ids, mask = _sources(3)
  starts = np.array([7, 120, EOS, 7])
  settings = dict(num_beams=num_beams, no_repeat_ngram_size=3 if num_beams > 1 else 0)
  want, _ = _hf_generate(reference, ids, mask, decoder_input_ids=torch.tensor(starts[:, None]),
                         **settings)
  out = decoding.generate(ours, ids, mask, max_length=MAX_LENGTH, start_ids=starts, **settings)
  np.testing.assert_array_equal(out.sequences, want)
  # Row 2 starts with the model's own start token: as a run without start_ids.
  plain = decoding.generate(ours, ids, mask, max_length=MAX_LENGTH, **settings)
  np.testing.assert_array_equal(out.sequences[2], plain.sequences[2])
  assert (out.sequences[:, 1:] != plain.sequences[:, 1:]).any()


def test_settings_change_run_time_values_not_the_program(models):
  _, ours, _ = models
  ids, mask = _sources(0)
  beam = dict(max_length=MAX_LENGTH, num_beams=4, no_repeat_ngram_size=3)
  decoding.generate(ours, ids, mask, **beam)
  before = decoding._generate_jit._cache_size()
  outputs = [decoding.generate(ours, ids, mask, **beam, **s).sequences for s in BEAM_SETTINGS]
  assert decoding._generate_jit._cache_size() == before  # One compiled program for all.
  assert len({np.asarray(o).tobytes() for o in outputs}) > 1  # ...that does differ.
  # The loop is inside the program: a jaxpr with a while loop, no per-token Python.
  static, knobs = decoding.split_config(decoding.GenerationConfig.from_model(ours.config,
                                                                             **beam))
  graphdef, state = nnx.split(ours)
  jaxpr = jax.make_jaxpr(decoding._generate_jit.__wrapped__, static_argnums=(0, 6))(
      graphdef, state, jnp.asarray(ids), jnp.asarray(mask), None, knobs, static)
  assert "while" in str(jaxpr)


# Sampling runs as a REINFORCE step would: generate_core inside the caller's own jitted,
# differentiated function, followed by the sampled sequences' log-likelihood.
SAMPLE = dict(max_length=MAX_LENGTH, do_sample=True, top_k=5, top_p=0.95)


@nnx.jit(static_argnames=("config",))
def _sample_step(model, ids, mask, key, knobs, config):
  def loss_fn(m):
    out = decoding.generate_core(m, ids, mask, config, key, knobs=knobs)
    log_probs = jax.nn.log_softmax(m(ids, mask, out.sequences[:, :-1]))
    taken = jnp.take_along_axis(log_probs, out.sequences[:, 1:, None], -1)[..., 0]
    real = jnp.arange(1, config.max_length)[None] < out.lengths[:, None]
    return -jnp.where(real, taken, 0.0).sum(), out

  (loss, out), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
  return out, loss, grads


def _sample_with(ours, ids, mask, key, **settings):
  config = decoding.GenerationConfig.from_model(ours.config, **{**SAMPLE, **settings})
  static, knobs = decoding.split_config(config)
  return _sample_step(ours, jnp.asarray(ids), jnp.asarray(mask), key, knobs, static)


def test_sampling_is_reproducible_and_stays_in_the_top_k(models):
  reference, ours, _ = models
  ids, mask = _sources(3)
  a, loss, grads = _sample_with(ours, ids, mask, jax.random.key(0))
  b, _, _ = _sample_with(ours, ids, mask, jax.random.key(0))
  c, _, _ = _sample_with(ours, ids, mask, jax.random.key(1))
  np.testing.assert_array_equal(a.sequences, b.sequences)
  assert not np.array_equal(a.sequences, c.sequences)
  # The step differentiates through the model, not through the (stop-gradient) sampling.
  assert np.isfinite(loss) and loss > 0
  assert np.abs(np.asarray(grads["shared"]["embedding"][...])).sum() > 0
  # Every sampled token (before the forced final EOS) is among the 5 best of HF's
  # teacher-forced logits at its position.
  seqs = np.asarray(c.sequences)
  with torch.no_grad():
    logits = reference(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                       decoder_input_ids=torch.tensor(seqs)).logits.numpy()
  top5 = np.argsort(-logits, axis=-1)[..., :5]
  for row, length in enumerate(np.asarray(c.lengths)):
    for t in range(1, min(length, MAX_LENGTH - 1)):
      assert seqs[row, t] in top5[row, t - 1], (row, t)
  assert (seqs[:, 1:] != seqs[:, 1:2]).any()  # Not a constant row.


def test_sampling_with_a_tiny_nucleus_is_greedy(models):
  _, ours, _ = models
  ids, mask = _sources(4)
  settings = dict(min_length=4, forced_bos_token_id=BOS)
  sampled, _, _ = _sample_with(ours, ids, mask, jax.random.key(7), top_p=1e-6, **settings)
  greedy = decoding.generate(ours, ids, mask, max_length=MAX_LENGTH, **settings)
  np.testing.assert_array_equal(sampled.sequences, greedy.sequences)


def test_sample_categorical_draws_softmax_and_never_a_masked_token():
  """The inverse-CDF sampler draws each token with its softmax probability (200,000 draws
  per row: every frequency within 5 standard errors), never a -inf one, and a row with one
  finite score always that one."""
  rng = np.random.default_rng(0)
  scores = rng.normal(size=(3, 40)).astype(np.float32) * 2
  scores[1, ::3] = -np.inf  # A third of the vocabulary filtered out (top-k / top-p).
  scores[2] = -np.inf
  scores[2, 17] = 0.0
  draws = 200_000
  keys = jax.random.split(jax.random.key(0), draws)
  tokens = np.asarray(jax.jit(jax.vmap(
      lambda key: decoding.sample_categorical(key, jnp.asarray(scores))))(keys))
  assert tokens.shape == (draws, 3) and tokens.dtype == np.int32
  for row in range(3):
    want = np.asarray(jax.nn.softmax(scores[row]))
    seen = np.bincount(tokens[:, row], minlength=40) / draws
    tolerance = 5 * np.sqrt(want * (1 - want) / draws) + 1e-12
    assert (np.abs(seen - want) <= tolerance).all(), row
    assert (seen[want == 0] == 0).all()
  assert (tokens[:, 2] == 17).all()
  # The same key, the same draw.
  again = jax.jit(decoding.sample_categorical)(keys[5], jnp.asarray(scores))
  np.testing.assert_array_equal(np.asarray(again), tokens[5])


def test_first_argmax_is_argmax_with_ties_and_infinities():
  scores = np.array([[1.0, 3.0, 3.0, 0.0],
                     [-np.inf, -np.inf, -np.inf, -np.inf],
                     [-np.inf, 2.0, -np.inf, 2.0],
                     [5.0, 5.0, 5.0, 5.0]], np.float32)
  rng = np.random.default_rng(1)
  scores = np.concatenate([scores, rng.normal(size=(4, 4)).astype(np.float32)])
  got = np.asarray(jax.jit(decoding.first_argmax)(jnp.asarray(scores)))
  np.testing.assert_array_equal(got, np.argmax(scores, axis=-1))
  assert got.dtype == np.int32


def test_filters_match_hf_warpers_and_processors():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(6, 50)).astype(np.float32) * 3
  torch_logits = torch.tensor(logits)
  ids = torch.zeros((6, 1), dtype=torch.long)
  from transformers.generation import logits_process as lp
  top_k = jax.jit(decoding.top_k_filter, static_argnums=1)
  top_p = jax.jit(decoding.top_p_filter, static_argnums=2)
  ban = jax.jit(decoding.ban_repeated_ngrams, static_argnums=3)
  for k in (1, 5, 49):
    want = lp.TopKLogitsWarper(k)(ids, torch_logits.clone()).numpy()
    np.testing.assert_array_equal(top_k(jnp.asarray(logits), k), want)
  for p, keep in ((0.1, 1), (0.5, 1), (0.9, 1), (0.9, 3), (1e-6, 1)):
    want = lp.TopPLogitsWarper(p, min_tokens_to_keep=keep)(ids, torch_logits.clone()).numpy()
    got = np.asarray(top_p(jnp.asarray(logits), p, keep))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want), err_msg=f"p={p}")
    np.testing.assert_array_equal(got[~np.isinf(got)], want[~np.isinf(want)])
  # n-gram bans on sequences with many repeats, at several lengths (the rest of the
  # buffer is junk that must be ignored).
  seqs = rng.integers(0, 4, (6, 16))
  for n in (1, 2, 3):
    for cur_len in (1, 2, 5, 16):
      want = lp.NoRepeatNGramLogitsProcessor(n)(torch.tensor(seqs[:, :cur_len]),
                                                 torch_logits.clone()).numpy()
      got = ban(jnp.asarray(logits), jnp.asarray(seqs), jnp.asarray(cur_len), n)
      np.testing.assert_array_equal(got, want, err_msg=f"n={n} cur_len={cur_len}")


def test_bad_settings_are_named(models):
  _, ours, _ = models
  ids, mask = _sources(0)
  with pytest.raises(ValueError, match="PRNG key"):
    decoding.generate(ours, ids, mask, do_sample=True)
  with pytest.raises(ValueError, match="early_stopping"):
    decoding.generate(ours, ids, mask, num_beams=2, early_stopping="sometimes")
  with pytest.raises(ValueError, match="unknown generation setting"):
    decoding.GenerationConfig.from_model(ours.config, beams=4)
  with pytest.raises(ValueError, match="beam sampling"):
    decoding.generate(ours, ids, mask, num_beams=2, do_sample=True, rng=jax.random.key(0))


def _run_script(*args: str) -> subprocess.CompletedProcess:
  env = script_environment()  # One device is enough (and faster) for the script.
  python = REPO / ".venv" / "bin" / "python"
  return subprocess.run([str(python) if python.exists() else sys.executable,
                         "scripts/generate.py", *args], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=300)


def test_generate_script_end_to_end(models, tmp_path):
  reference, _, folder = models
  texts = ["the claim is false because the photo is old",
           "a video shows the mayor at the rally",
           "officials said the report was accurate"] * 20
  tokenizer = tokenizers.train_byte_bpe(texts, tmp_path / "tok", vocab_size=VOCAB)
  assert len(tokenizer) <= VOCAB
  model_dir = tmp_path / "model"
  model_dir.mkdir()
  for source in (folder, tmp_path / "tok"):
    for name in os.listdir(source):
      (model_dir / name).write_bytes((source / name).read_bytes())
  lines = ["the photo is old", "", "a video shows the mayor at the rally and more words",
           "officials said"]
  inputs = tmp_path / "in.txt"
  inputs.write_text("\n".join(lines) + "\n")
  out = tmp_path / "out.txt"
  proc = _run_script(f"--model={model_dir}", f"--input={inputs}", f"--output={out}",
                     "--max_length=12", "--min_length=5", "--no_repeat_ngram_size=2",
                     "--batch_size=2", "--max_source_length=8", "--truncation_side=left")
  assert proc.returncode == 0, proc.stderr
  got = out.read_text().split("\n")
  assert len(got) == len(lines) + 1 and got[-1] == ""  # One line per input, in order.
  assert got[1] == ""  # An empty input gives an empty output.
  # Each line is what HF's generate gives for that (truncated) source, decoded.
  for line, text in zip(lines, got):
    if not line:
      continue
    tokenizer.truncation_side = "left"
    enc = tokenizer([line], truncation=True, max_length=8, return_tensors="pt")
    with torch.no_grad():
      ids = reference.generate(**enc, max_length=12, min_length=5, no_repeat_ngram_size=2)
    want = tokenizer.decode(ids[0], skip_special_tokens=True).replace("\n", " ").strip()
    assert text == want
  missing = _run_script(f"--model={tmp_path / 'nope'}", f"--input={inputs}",
                        f"--output={out}")
  assert missing.returncode == 1
  assert missing.stderr.strip().splitlines()[-1].startswith("error: ")
  assert "Traceback" not in missing.stderr
