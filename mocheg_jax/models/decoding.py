"""Compiled generation for BART: greedy, beam search and top-k / top-p sampling.

Each strategy is one XLA program: the encoder runs once, then lax.while_loops feed one
token per step through `Bart.decode` with a static-shape KV cache. There is no per-token
Python and no host callback, so `generate_core` also runs inside a jitted training step
(the REINFORCE loop samples from the current policy).

The loop runs in segments over a cache that grows (`segment_lengths`): a step's
self-attention, and beam search's cache reorder, read the cache's whole length, so a single
loop over a max_length cache would pay every step for max_length positions, and texts that
end long before max_length (beam search to the paper's 400 tokens, rulings of ~100) would
read and reorder several times the cache they use.

Semantics follow transformers' `generate` for encoder-decoder models (5.x) step for step:
logits processors in HF's order (no_repeat_ngram, min_length, forced BOS, forced EOS; then
temperature, top-k, top-p when sampling), finished rows padded with the pad id, and HF's
vectorised beam search (2 * num_beams candidates per step, the length-penalised finished
hypotheses, early_stopping True / False / "never" with HF's stopping heuristic).

Output layout is HF's: `sequences` [B, max_length] begin with the decoder start token and
are padded with the pad id after EOS (HF crops to the longest row instead; padding HF's
output to max_length with the pad id gives ours; HF's beam search pads with EOS instead
when the pad id is 0). `max_length` counts the start token.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mocheg_jax.models.bart import Bart, BartConfig

NEG = -1.0e9  # HF's "impossible" score in beam search (a finite number, not -inf).
HF_DEFAULT_NEW_TOKENS = 20  # HF generates 20 new tokens when no max_length is set anywhere.
CACHE_SEGMENT = 64  # Cache positions of the decoding loop's first segment (0: one loop).
_OVERRIDABLE = ("max_length", "min_length", "num_beams", "do_sample", "early_stopping",
                "length_penalty", "no_repeat_ngram_size", "temperature", "top_k", "top_p",
                "decoder_start_token_id", "eos_token_id", "pad_token_id",
                "forced_bos_token_id", "forced_eos_token_id", "cache_segment")


@dataclasses.dataclass(frozen=True)
class GenerationConfig:
  """Generation settings (hashable: one compiled program per distinct config and shape)."""
  max_length: int = HF_DEFAULT_NEW_TOKENS + 1
  min_length: int = 0
  num_beams: int = 1
  do_sample: bool = False
  early_stopping: bool | str = False
  length_penalty: float = 1.0
  no_repeat_ngram_size: int = 0
  temperature: float = 1.0
  top_k: int = 50  # HF's default; used only when sampling (0 turns it off).
  top_p: float = 1.0
  decoder_start_token_id: int = 2
  eos_token_id: tuple[int, ...] = (2,)
  pad_token_id: int = 1
  forced_bos_token_id: int | None = None
  forced_eos_token_id: int | None = None
  cache_segment: int = CACHE_SEGMENT  # Not a generation setting: the loop's first cache
  #   length (segment_lengths); results do not depend on it, compile time and speed do.

  @classmethod
  def from_model(cls, config: BartConfig, **overrides: Any) -> GenerationConfig:
    """The checkpoint's settings (config.json + generation_config.json) with `overrides`.

    As HF: without max_length anywhere, 20 new tokens (max_length 21, capped by the
    position table). An override of None clears an optional id (e.g. forced_bos_token_id).
    """
    unknown = sorted(set(overrides) - set(_OVERRIDABLE))
    if unknown:
      raise ValueError(f"unknown generation setting(s) {unknown}; expected {_OVERRIDABLE}")
    eos = config.eos_token_id
    values: dict[str, Any] = dict(
        decoder_start_token_id=config.decoder_start_token_id,
        eos_token_id=tuple(eos) if isinstance(eos, (tuple, list)) else (eos,),
        pad_token_id=config.pad_token_id, forced_bos_token_id=config.forced_bos_token_id,
        forced_eos_token_id=config.forced_eos_token_id)
    for key in ("num_beams", "no_repeat_ngram_size", "length_penalty", "min_length",
                "max_length", "early_stopping"):
      if getattr(config, key) is not None:
        values[key] = getattr(config, key)
    values.setdefault("max_length", min(HF_DEFAULT_NEW_TOKENS + 1,
                                        config.max_position_embeddings))
    values.update(overrides)
    if isinstance(values["eos_token_id"], int):
      values["eos_token_id"] = (values["eos_token_id"],)
    out = cls(**values)
    out.validate(config.max_position_embeddings)
    return out

  def validate(self, max_positions: int | None = None) -> None:
    """Raises ValueError naming the setting that cannot be used."""
    if self.max_length < 2:
      raise ValueError(f"max_length must be >= 2 (it counts the start token), got "
                       f"{self.max_length}")
    if max_positions is not None and self.max_length - 1 > max_positions:
      raise ValueError(f"max_length {self.max_length} needs {self.max_length - 1} decoder "
                       f"positions; the model has {max_positions}")
    if self.num_beams < 1:
      raise ValueError(f"num_beams must be >= 1, got {self.num_beams}")
    if self.do_sample and self.num_beams > 1:
      raise ValueError("beam sampling (do_sample with num_beams > 1) is not supported")
    if self.early_stopping not in (True, False, "never"):
      raise ValueError(f"early_stopping must be True, False or 'never', got "
                       f"{self.early_stopping!r}")
    if not self.eos_token_id:
      raise ValueError("eos_token_id is required")
    if min(self.min_length, self.no_repeat_ngram_size, self.top_k, self.cache_segment) < 0:
      raise ValueError("min_length, no_repeat_ngram_size, top_k and cache_segment must be "
                       ">= 0")
    if not 0.0 < self.top_p <= 1.0:
      raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
    if not self.temperature > 0.0:
      raise ValueError(f"temperature must be > 0, got {self.temperature}")


@flax.struct.dataclass
class GenerateOutput:
  sequences: jax.Array  # int32 [B, max_length]: start token, tokens, EOS, then pad ids.
  lengths: jax.Array  # int32 [B]: tokens up to and including the first EOS (start counted).
  scores: jax.Array  # float32 [B]: beam: HF's sequences_scores; greedy/sampling: the sum
  #   of the chosen tokens' log-probabilities under the processed distribution.


# ---- static structure and run-time values --------------------------------------------
# Settings that change the program (shapes, loops, which filters run) are static; the
# others travel as arrays, so trying another length penalty, minimum length, early-stopping
# mode, forced token, temperature or top-p reuses the compiled program.
_DYNAMIC_DEFAULTS = dict(min_length=0, length_penalty=1.0, early_stopping=False,
                         forced_bos_token_id=None, forced_eos_token_id=None, temperature=1.0)


@flax.struct.dataclass
class Knobs:
  """The run-time (traced) generation settings."""
  min_length: jax.Array  # int32 []
  penalties: jax.Array  # float32 [max_length + 1]: n ** length_penalty (HF's float64 -> f32)
  stop_when_full: jax.Array  # bool []: early_stopping is True
  never: jax.Array  # bool []: early_stopping == "never" and length_penalty > 0
  forced_bos: jax.Array  # int32 []: -1 for none
  forced_eos: jax.Array  # int32 []: -1 for none
  temperature: jax.Array  # float32 []
  top_p: jax.Array  # float32 []

  @classmethod
  def of(cls, config: GenerationConfig) -> Knobs:
    lp = config.length_penalty
    none = lambda t: -1 if t is None else t  # noqa: E731
    return cls(
        min_length=np.int32(config.min_length),
        penalties=np.array([float(n) ** lp for n in range(config.max_length + 1)], np.float32),
        stop_when_full=np.bool_(config.early_stopping is True),
        never=np.bool_(config.early_stopping == "never" and lp > 0.0),
        forced_bos=np.int32(none(config.forced_bos_token_id)),
        forced_eos=np.int32(none(config.forced_eos_token_id)),
        temperature=np.float32(config.temperature), top_p=np.float32(config.top_p))


def split_config(config: GenerationConfig) -> tuple[GenerationConfig, Knobs]:
  """(the static part, the run-time part); the static part keys the compiled program.

  Whether top-p runs at all stays static (it sorts the vocabulary every step); its value
  does not.
  """
  static = dataclasses.replace(config, **_DYNAMIC_DEFAULTS,
                               top_p=0.5 if config.top_p < 1.0 else 1.0)
  return static, Knobs.of(config)


# ---- logits processors (HF's, on static-shape buffers) -----------------------------------
def _forced_row(scores: jax.Array, token: jax.Array) -> jax.Array:
  return jnp.where(jnp.arange(scores.shape[-1]) == token, 0.0, -jnp.inf).astype(scores.dtype)


def ban_repeated_ngrams(scores: jax.Array, sequences: jax.Array, cur_len: jax.Array,
                        n: int) -> jax.Array:
  """HF's NoRepeatNGramLogitsProcessor on `sequences[:, :cur_len]` (the rest is ignored).

  A window of n tokens already in the sequence whose first n-1 tokens equal the last n-1
  tokens bans its last token.
  """
  rows, length = sequences.shape
  vocab = scores.shape[-1]
  windows = length - n + 1
  prefix = jax.lax.dynamic_slice_in_dim(sequences, jnp.maximum(cur_len - (n - 1), 0), n - 1,
                                        axis=1)  # [N, n-1]
  match = jnp.broadcast_to(jnp.arange(windows) <= cur_len - n, (rows, windows))
  for j in range(n - 1):
    match = match & (sequences[:, j:j + windows] == prefix[:, j:j + 1])
  banned = jnp.where(match, sequences[:, n - 1:], vocab)  # Out of range: dropped below.
  # Written into the scores directly: no [rows, vocab] mask to fill and select through.
  return scores.at[jnp.arange(rows)[:, None], banned].set(-jnp.inf, mode="drop")


def process_logits(scores: jax.Array, sequences: jax.Array, cur_len: jax.Array,
                   config: GenerationConfig, knobs: Knobs) -> jax.Array:
  """HF's processors, in HF's order, for the token at position `cur_len`.

  A min_length of 0 or a forced id of -1 never fires, which is HF leaving them out.
  """
  if config.no_repeat_ngram_size > 0:
    scores = ban_repeated_ngrams(scores, sequences, cur_len, config.no_repeat_ngram_size)
  is_eos = jnp.isin(jnp.arange(scores.shape[-1]), jnp.asarray(config.eos_token_id))
  scores = jnp.where(is_eos & (cur_len < knobs.min_length), -jnp.inf, scores)
  scores = jnp.where((cur_len == 1) & (knobs.forced_bos >= 0),
                     _forced_row(scores, knobs.forced_bos), scores)
  scores = jnp.where((cur_len == config.max_length - 1) & (knobs.forced_eos >= 0),
                     _forced_row(scores, knobs.forced_eos), scores)
  return scores


def top_k_filter(scores: jax.Array, k: int, min_tokens_to_keep: int = 1) -> jax.Array:
  """Keeps the k highest scores (and ties with the k-th), as HF's TopKLogitsWarper."""
  k = min(max(k, min_tokens_to_keep), scores.shape[-1])
  kth = jax.lax.top_k(scores, k)[0][..., -1:]
  return jnp.where(scores < kth, -jnp.inf, scores)


def top_p_filter(scores: jax.Array, p: float, min_tokens_to_keep: int = 1) -> jax.Array:
  """Keeps the smallest top set whose probability reaches p, as HF's TopPLogitsWarper."""
  order = jnp.argsort(scores, axis=-1)  # Ascending, as HF.
  ascending = jnp.take_along_axis(scores, order, axis=-1)
  cumulative = jnp.cumsum(jax.nn.softmax(ascending, axis=-1), axis=-1)
  remove = cumulative <= 1.0 - p
  remove = remove.at[..., -min_tokens_to_keep:].set(False)
  remove = jnp.take_along_axis(remove, jnp.argsort(order, axis=-1), axis=-1)  # Unsort.
  return jnp.where(remove, -jnp.inf, scores)


def warp_logits(scores: jax.Array, config: GenerationConfig, knobs: Knobs) -> jax.Array:
  """Temperature, top-k, top-p (HF's sampling warpers, in HF's order; x / 1.0 is exact)."""
  scores = scores / knobs.temperature
  if config.top_k:
    scores = top_k_filter(scores, config.top_k)
  if config.top_p < 1.0:
    scores = top_p_filter(scores, knobs.top_p)
  return scores


def first_argmax(scores: jax.Array) -> jax.Array:
  """jnp.argmax over the last axis (the first of equal maxima), as a max and then a min
  over the indices that reach it: XLA's CPU argmax, one reduction over (value, index)
  pairs, took 0.56 ms of every greedy step at [32, 7350] against 0.14 ms for these two
  plain reductions (2-vCPU AMD EPYC, 2026-12-07; BENCHMARKS.md, "Sampling and argmax")."""
  best = scores.max(axis=-1, keepdims=True)
  index = jnp.arange(scores.shape[-1], dtype=jnp.int32)
  return jnp.min(jnp.where(scores == best, index, scores.shape[-1]), axis=-1)


def sample_categorical(key: jax.Array, scores: jax.Array) -> jax.Array:
  """One token per row drawn from softmax(scores) over the last axis (int32).

  By inverse CDF: one uniform per row against the running sum of the unnormalised
  probabilities. jax.random.categorical draws a Gumbel per vocabulary entry, and those
  B x V threefry values were most of a sampling step on CPU (2.1 ms at [32, 7350] against
  0.37 ms for this). The distribution is the same; the draws for a given key are not.
  A -inf score has weight 0 and is never drawn: with u in (0, total], the token is the first
  whose running sum reaches u, and a zero weight leaves the running sum where it was.
  """
  weights = jnp.exp(scores - scores.max(axis=-1, keepdims=True))
  cumulative = jnp.cumsum(weights, axis=-1)
  u = 1.0 - jax.random.uniform(key, scores.shape[:-1] + (1,), cumulative.dtype)  # (0, 1]
  return jnp.sum(cumulative < u * cumulative[..., -1:], axis=-1, dtype=jnp.int32)


def _lengths(sequences: jax.Array, config: GenerationConfig) -> jax.Array:
  """Start token through the first EOS after it; the whole row when there is none."""
  is_eos = jnp.isin(sequences[:, 1:], jnp.asarray(config.eos_token_id))
  first = jnp.argmax(is_eos, axis=-1) + 2
  return jnp.where(is_eos.any(-1), first, sequences.shape[1]).astype(jnp.int32)


def _set_column(buffer: jax.Array, column: jax.Array, index: jax.Array) -> jax.Array:
  """buffer[..., index] = column for a traced index (static shapes)."""
  return jnp.where(jnp.arange(buffer.shape[-1]) == index, column[..., None], buffer)


# ---- strategies -----------------------------------------------------------------------
def segment_lengths(positions: int, first: int) -> list[int]:
  """The cache length of each decoding loop segment, for `positions` decoder positions.

  Doubling from `first` (0: one segment), the last one `positions`; a last step under 1.5x
  joins the segment before it, so that no segment is compiled for a few steps. Each segment
  is one more copy of the loop body to compile; in exchange a step reads at most twice the
  positions written so far (three times in a merged last segment), or `first`.
  """
  lengths = []
  n = first
  while 0 < n < positions:
    lengths.append(n)
    n *= 2
  if lengths and positions < lengths[-1] * 3 // 2:
    lengths.pop()
  return lengths + [positions]


def _segmented_loop(cond, body, carry: dict, config: GenerationConfig) -> dict:
  """lax.while_loop(cond, body, carry) in segments of growing cache length
  (segment_lengths); carry["cache"] starts at the first segment's length. The token at
  position cur_len - 1 is written at cache index cur_len - 1, so a segment of n positions
  runs while cur_len <= n."""
  for n in segment_lengths(config.max_length - 1, config.cache_segment):
    carry = dict(carry, cache=carry["cache"].grow(n))
    carry = jax.lax.while_loop(lambda c, n=n: cond(c) & (c["cur_len"] <= n), body, carry)
  return carry


def _first_segment(config: GenerationConfig) -> int:
  return segment_lengths(config.max_length - 1, config.cache_segment)[0]


def _initial_cache(model: Bart, memory: jax.Array, length: int, repeat: int):
  """The cache, behind an optimisation barrier: otherwise XLA sinks the (loop-invariant)
  cross-attention projections and layout changes into the loop and redoes them per step."""
  return jax.lax.optimization_barrier(model.init_cache(memory, length, repeat=repeat))


def _start_column(config: GenerationConfig, rows: int, start_ids: jax.Array | None
                  ) -> jax.Array:
  """int32 [rows]: each row's decoder start token (the config's, or `start_ids`)."""
  if start_ids is None:
    return jnp.full((rows,), config.decoder_start_token_id, jnp.int32)
  return jnp.asarray(start_ids, jnp.int32).reshape(rows)


def _greedy_or_sample(model: Bart, memory: jax.Array, memory_mask: jax.Array,
                      config: GenerationConfig, knobs: Knobs, rng: jax.Array | None,
                      start_ids: jax.Array | None) -> GenerateOutput:
  graphdef, state = nnx.split(model)
  rows, length = memory.shape[0], config.max_length
  eos = jnp.asarray(config.eos_token_id)
  sequences = jnp.full((rows, length), config.pad_token_id, jnp.int32)
  sequences = sequences.at[:, 0].set(_start_column(config, rows, start_ids))
  carry = dict(sequences=sequences, cur_len=jnp.asarray(1, jnp.int32),
               unfinished=jnp.ones((rows,), bool), scores=jnp.zeros((rows,), jnp.float32),
               cache=_initial_cache(model, memory, _first_segment(config), 1))

  def body(c):
    m = nnx.merge(graphdef, state)
    cur_len = c["cur_len"]
    last = jax.lax.dynamic_slice_in_dim(c["sequences"], cur_len - 1, 1, axis=1)
    logits, cache = m.decode(last, None, memory_mask, cache=c["cache"])
    scores = process_logits(logits[:, 0], c["sequences"], cur_len, config, knobs)
    if config.do_sample:
      scores = warp_logits(scores, config, knobs)
      token = sample_categorical(jax.random.fold_in(rng, cur_len), scores)
    else:
      token = first_argmax(scores)
    logp = jnp.take_along_axis(jax.nn.log_softmax(scores, axis=-1), token[:, None], -1)[:, 0]
    unfinished = c["unfinished"]
    token = jnp.where(unfinished, token, config.pad_token_id)  # Finished rows get pads.
    done_now = jnp.isin(token, eos) | (cur_len + 1 >= length)
    return dict(sequences=_set_column(c["sequences"], token, cur_len), cur_len=cur_len + 1,
                unfinished=unfinished & ~done_now,
                scores=c["scores"] + jnp.where(unfinished, logp, 0.0), cache=cache)

  def cond(c):
    return c["unfinished"].any() & (c["cur_len"] < length)

  c = _segmented_loop(cond, body, carry, config)
  return GenerateOutput(sequences=c["sequences"], lengths=_lengths(c["sequences"], config),
                        scores=c["scores"])


def _gather(x: jax.Array, index: jax.Array) -> jax.Array:
  """x[b, index[b, j], ...] for x [B, K, ...] and index [B, J]."""
  index = index.reshape(index.shape + (1,) * (x.ndim - 2))
  return jnp.take_along_axis(x, index, axis=1)


def _beam_search(model: Bart, memory: jax.Array, memory_mask: jax.Array,
                 config: GenerationConfig, knobs: Knobs, start_ids: jax.Array | None
                 ) -> GenerateOutput:
  graphdef, state = nnx.split(model)
  batch, beams, length = memory.shape[0], config.num_beams, config.max_length
  vocab = model.config.vocab_size
  keep = max(2, 1 + len(config.eos_token_id)) * beams  # Candidates kept per step (HF).
  top_beams = jnp.arange(keep) < beams
  eos = jnp.asarray(config.eos_token_id)
  penalty = knobs.penalties
  flat_mask = jnp.repeat(memory_mask, beams, axis=0)

  sequences = jnp.full((batch, beams, length), config.pad_token_id, jnp.int32)
  sequences = sequences.at[:, :, 0].set(_start_column(config, batch, start_ids)[:, None])
  carry = dict(
      running=sequences, running_scores=jnp.zeros((batch, beams)).at[:, 1:].set(NEG),
      sequences=sequences, scores=jnp.full((batch, beams), NEG),
      finished=jnp.zeros((batch, beams), bool), unsatisfied=jnp.ones((batch, 1), bool),
      done=jnp.asarray(False), cur_len=jnp.asarray(1, jnp.int32),
      cache=_initial_cache(model, memory, _first_segment(config), beams))

  def body(c):
    m = nnx.merge(graphdef, state)
    cur_len = c["cur_len"]
    flat = c["running"].reshape(batch * beams, length)
    last = jax.lax.dynamic_slice_in_dim(flat, cur_len - 1, 1, axis=1)
    logits, cache = m.decode(last, None, flat_mask, cache=c["cache"])
    log_probs = process_logits(jax.nn.log_softmax(logits[:, 0], axis=-1), flat, cur_len,
                               config, knobs)
    log_probs = log_probs.reshape(batch, beams, vocab) + c["running_scores"][:, :, None]
    # Top 2K continuations over all beams of each source.
    top_scores, top_index = jax.lax.top_k(log_probs.reshape(batch, beams * vocab), keep)
    source_beam, token = top_index // vocab, (top_index % vocab).astype(jnp.int32)
    candidates = _set_column(_gather(c["running"], source_beam), token, cur_len)
    hits = jnp.isin(token, eos) | (cur_len + 1 >= length)  # [B, 2K]
    # The best K unfinished continuations run on.
    running_scores = top_scores + hits * NEG
    next_index = jax.lax.top_k(running_scores, beams)[1]
    running = _gather(candidates, next_index)
    running_scores = _gather(running_scores, next_index)
    rows = _gather(source_beam, next_index) + jnp.arange(batch)[:, None] * beams
    # Finished hypotheses among the top K enter the length-penalised pool of K best.
    just_finished = hits & top_beams[None]
    finished_scores = top_scores / penalty[cur_len]
    # Adding 0 * NEG = -0.0 changes nothing, so these are HF's conditional additions.
    full = c["finished"].all(-1, keepdims=True) & knobs.stop_when_full
    finished_scores = finished_scores + full * NEG
    finished_scores = finished_scores + (~c["unsatisfied"]) * NEG
    finished_scores = finished_scores + (~just_finished) * NEG
    merged_scores = jnp.concatenate([c["scores"], finished_scores], axis=1)
    best = jax.lax.top_k(merged_scores, beams)[1]
    sequences = _gather(jnp.concatenate([c["sequences"], candidates], axis=1), best)
    scores = _gather(merged_scores, best)
    finished = _gather(jnp.concatenate([c["finished"], just_finished], axis=1), best)
    # HF's early-stopping heuristic, at the new length.
    cur_len = cur_len + 1
    best_length = jnp.where(knobs.never, length - 1, cur_len - 1)
    best_possible = running_scores[:, :1] / penalty[best_length]
    worst_finished = jnp.where(finished, scores.min(axis=1, keepdims=True), NEG)
    unsatisfied = c["unsatisfied"] & (best_possible > worst_finished).any(-1, keepdims=True)
    go_on = unsatisfied.any() & ~hits.all() & ~(finished.all() & knobs.stop_when_full)
    return dict(running=running, running_scores=running_scores, sequences=sequences,
                scores=scores, finished=finished, unsatisfied=unsatisfied, done=~go_on,
                cur_len=cur_len, cache=cache.reorder(rows.reshape(-1)))

  def cond(c):
    return ~c["done"] & (c["cur_len"] < length)

  c = _segmented_loop(cond, body, carry, config)
  best = c["sequences"][:, 0]
  return GenerateOutput(sequences=best, lengths=_lengths(best, config),
                        scores=c["scores"][:, 0])


# ---- entry points -------------------------------------------------------------------------
def generate_core(model: Bart, input_ids: jax.Array, attention_mask: jax.Array,
                  config: GenerationConfig, rng: jax.Array | None = None, *,
                  knobs: Knobs | None = None, memory: jax.Array | None = None,
                  start_ids: jax.Array | None = None) -> GenerateOutput:
  """Generation as a pure, traceable function (call it inside jax.jit / nnx.jit).

  Args:
    model: the BART model (read only; dropout off).
    input_ids: int [B, S] source tokens.
    attention_mask: 0/1 [B, S].
    config: the settings (static).
    rng: a PRNG key, required when config.do_sample.
    knobs: run-time values of the dynamic settings; by default those of `config` (then
      `config` may be the full config; with knobs, only its static part is read).
    memory: the encoder memory of `input_ids` [B, S, D] when the caller already has it
      (a loss that also scores the generation); no gradient flows into it from here.
    start_ids: int [B], each row's decoder start token (default: the config's
      decoder_start_token_id for every row); a generator conditioned on something per row
      through its start token (the explanation generator's `label_start`).
  """
  config.validate(model.config.max_position_embeddings)
  if config.do_sample and rng is None:
    raise ValueError("sampling needs an explicit PRNG key (rng=jax.random.key(seed))")
  if knobs is None:
    knobs = Knobs.of(config)
  knobs = jax.tree.map(jnp.asarray, knobs)
  # Generation is never differentiated (a while loop has no reverse mode), so a loss that
  # samples from the model it trains (REINFORCE) can call this inside its grad function.
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  model = nnx.merge(graphdef, jax.lax.stop_gradient(params), rest)
  if memory is None:
    memory = model.encode(input_ids, attention_mask)
  else:
    memory = jax.lax.stop_gradient(memory)
  if config.num_beams > 1:
    return _beam_search(model, memory, attention_mask, config, knobs, start_ids)
  return _greedy_or_sample(model, memory, attention_mask, config, knobs, rng, start_ids)


@functools.partial(jax.jit, static_argnames=("graphdef", "static"))
def _generate_jit(graphdef, state, input_ids, attention_mask, rng, knobs, static,
                  start_ids=None):
  return generate_core(nnx.merge(graphdef, state), input_ids, attention_mask, static, rng,
                       knobs=knobs, start_ids=start_ids)


def generate(model: Bart, input_ids: jax.Array, attention_mask: jax.Array | None = None,
             config: GenerationConfig | None = None, *, rng: jax.Array | None = None,
             start_ids: jax.Array | None = None, **overrides: Any) -> GenerateOutput:
  """Generates with one compiled program per static structure and shapes.

  `config` defaults to the checkpoint's settings (`GenerationConfig.from_model`) with
  `overrides` (e.g. num_beams=4, max_length=400). Programs are keyed by max_length,
  num_beams, do_sample, no_repeat_ngram_size, top_k, whether top-p is on, the special
  token ids and the input shapes; other settings are run-time values (`split_config`).
  `start_ids`: per-row decoder start tokens (`generate_core`).
  """
  if config is None:
    config = GenerationConfig.from_model(model.config, **overrides)
  elif overrides:
    config = dataclasses.replace(config, **overrides)
  config.validate(model.config.max_position_embeddings)
  if config.do_sample and rng is None:
    raise ValueError("sampling needs an explicit PRNG key (rng=jax.random.key(seed))")
  input_ids = jnp.asarray(input_ids, jnp.int32)
  if attention_mask is None:
    attention_mask = jnp.ones_like(input_ids)
  static, knobs = split_config(config)
  graphdef, state = nnx.split(model)
  if start_ids is not None:
    start_ids = jnp.asarray(start_ids, jnp.int32)
  return _generate_jit(graphdef, state, input_ids, jnp.asarray(attention_mask, jnp.int32), rng,
                       knobs, static, start_ids)


def generated_tokens(model: Bart, input_ids: jax.Array, attention_mask: jax.Array,
                     config: GenerationConfig, rng: jax.Array | None = None, *,
                     memory: jax.Array | None = None, start_ids: jax.Array | None = None
                     ) -> tuple[jax.Array, jax.Array]:
  """The generated tokens and their mask, for use inside another jitted function.

  The decoder start token is dropped, so row b is what a teacher-forced pass would take as
  labels: `ids[b, t]` is the token generated after `ids[b, :t]` (decoder inputs are the
  start token followed by `ids[:, :-1]`). No gradient flows through the tokens.

  Args:
    model, input_ids, attention_mask, config, rng, memory, start_ids: as `generate_core`
      (greedy, sampling or beam search; `rng` is required when sampling).

  Returns:
    ids: int32 [B, max_length - 1]: the tokens, then pad ids after the first EOS.
    mask: bool [B, max_length - 1]: True up to and including the first EOS (every
      position of a row that never produced one).
  """
  return tokens_and_mask(generate_core(model, input_ids, attention_mask, config, rng,
                                       memory=memory, start_ids=start_ids))


def tokens_and_mask(out: GenerateOutput) -> tuple[jax.Array, jax.Array]:
  """A generation's tokens without the decoder start token, and their mask (True up to and
  including the first EOS): ids int32 [B, L - 1], mask bool [B, L - 1]."""
  ids = out.sequences[:, 1:]
  mask = jnp.arange(ids.shape[1])[None, :] < (out.lengths - 1)[:, None]
  return ids, mask
