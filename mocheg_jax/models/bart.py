"""BART (facebook/bart-large and friends) as a Flax NNX encoder-decoder with a KV cache.

The layout follows transformers' BartForConditionalGeneration so weights convert one to one
(mocheg_jax/models/hf/bart.py): a shared token embedding tied to the encoder, the decoder and
the LM head; learned positions with BART's offset of 2; layernorm_embedding; post-LN encoder
and decoder layers; a final_logits_bias added to the logits. `normalize_before=True` gives
the pre-LN layout instead (mBART's: a LayerNorm before each sublayer and one after each
stack), for generators trained from scratch.

Incremental decoding keeps a `DecoderCache` pytree: per decoder layer the self-attention
keys and values of max_length positions, written in place with lax.dynamic_update_slice,
and the cross-attention keys/values projected once from the encoder memory. Keys are stored
[B, H, D, L] and values [B, H, L, D], the layouts the attention dots read, so a step does
not transpose the whole cache (XLA would copy it every step for [B, L, H, D]). All shapes
are static, so one decoding step compiles once (decoding.py runs it in a lax.while_loop).

Model-specific logical axes: "positions" (the position table's rows).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx

from mocheg_jax.data.report import MochegInputError
from mocheg_jax.models import layers
from mocheg_jax.models.layers import Dtype

POSITION_OFFSET = 2  # BART's learned positions start at row 2 (a fairseq padding legacy).
SUPPORTED_MODEL_TYPES = ("bart",)
# Keys of old (fairseq-era) configs whose non-default values mean another architecture.
_FIXED_KEYS = {"normalize_before": False, "add_final_layer_norm": False,
               "static_position_embeddings": False, "normalize_embedding": True,
               "add_bias_logits": False}
# Generation defaults a checkpoint may carry (config.json in old ones, else
# generation_config.json); None when the checkpoint does not set them.
GENERATION_KEYS = ("num_beams", "no_repeat_ngram_size", "length_penalty", "min_length",
                   "max_length", "early_stopping", "forced_bos_token_id")


@dataclasses.dataclass(frozen=True)
class BartConfig:
  """The architecture of a BART checkpoint, plus its generation defaults when it has them."""
  vocab_size: int = 50265
  d_model: int = 1024
  encoder_layers: int = 12
  decoder_layers: int = 12
  encoder_attention_heads: int = 16
  decoder_attention_heads: int = 16
  encoder_ffn_dim: int = 4096
  decoder_ffn_dim: int = 4096
  activation_function: str = "gelu"
  max_position_embeddings: int = 1024
  scale_embedding: bool = False
  dropout: float = 0.1
  attention_dropout: float = 0.0
  activation_dropout: float = 0.0
  init_std: float = 0.02
  # Pre-LN layers plus a final LayerNorm per side (mBART's layout; fairseq's
  # normalize_before + add_final_layer_norm). Not in facebook/bart-*: for generators trained
  # from scratch (why: reinforce.source_reconstruction_nll).
  normalize_before: bool = False
  pad_token_id: int = 1
  bos_token_id: int = 0
  eos_token_id: int | tuple[int, ...] = 2
  decoder_start_token_id: int = 2
  forced_eos_token_id: int | None = 2
  # Generation defaults (None: not set by the checkpoint; decoding.py applies HF's).
  forced_bos_token_id: int | None = None
  num_beams: int | None = None
  no_repeat_ngram_size: int | None = None
  length_penalty: float | None = None
  min_length: int | None = None
  max_length: int | None = None
  early_stopping: bool | str | None = None

  @classmethod
  def from_hf(cls, config: dict[str, Any],
              generation: dict[str, Any] | None = None) -> BartConfig:
    """From config.json (and generation_config.json, whose values take precedence).

    Raises:
      MochegInputError: another model_type, or settings this implementation does not have
        (pre-LN variants, untied LM head, heads that do not divide d_model, ...).
    """
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
      raise MochegInputError(f"config.json: model_type {model_type!r} is not supported by the "
                             f"BART implementation (expected one of {SUPPORTED_MODEL_TYPES})")
    for key, expected in _FIXED_KEYS.items():
      if key in config and bool(config[key]) != expected:
        raise MochegInputError(f"config.json: {key}={config[key]!r} is not supported "
                               f"(only {expected} is, as in facebook/bart-*)")
    if not config.get("tie_word_embeddings", True):
      raise MochegInputError("config.json: tie_word_embeddings=false is not supported (BART "
                             "ties the LM head to the shared embedding)")
    for key in ("encoder_layerdrop", "decoder_layerdrop"):
      if config.get(key):
        raise MochegInputError(f"config.json: {key}={config[key]} is not supported (LayerDrop)")
    names = {f.name for f in dataclasses.fields(cls)}
    values = {k: v for k, v in config.items() if k in names and v is not None}
    for key in GENERATION_KEYS + ("forced_eos_token_id", "decoder_start_token_id",
                                  "eos_token_id", "pad_token_id", "bos_token_id"):
      if generation and generation.get(key) is not None:
        values[key] = generation[key]
    if isinstance(values.get("eos_token_id"), list):
      values["eos_token_id"] = tuple(values["eos_token_id"])
    if isinstance(values.get("forced_eos_token_id"), list):
      forced = values["forced_eos_token_id"]
      if len(forced) != 1:
        raise MochegInputError(f"config.json: forced_eos_token_id={forced} (one id supported)")
      values["forced_eos_token_id"] = forced[0]
    out = cls(**values)
    out.validate()
    return out

  def validate(self) -> None:
    for name, heads in (("encoder", self.encoder_attention_heads),
                        ("decoder", self.decoder_attention_heads)):
      if self.d_model % heads:
        raise MochegInputError(f"config.json: d_model {self.d_model} is not divisible by "
                               f"{name}_attention_heads {heads}")
    if self.activation_function not in layers.ACTIVATIONS:
      raise MochegInputError(f"config.json: activation_function {self.activation_function!r} "
                             f"is not supported (expected one of {sorted(layers.ACTIVATIONS)})")
    if self.pad_token_id is None or self.decoder_start_token_id is None:
      raise MochegInputError("config.json: pad_token_id and decoder_start_token_id are needed")

  def to_hf(self) -> dict[str, Any]:
    """config.json content that transformers' BartConfig accepts (no generation keys)."""
    if self.normalize_before:
      raise MochegInputError("a pre-LN BART (normalize_before=True) has no transformers "
                             "BartConfig equivalent")
    out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
           if f.name not in GENERATION_KEYS}
    if isinstance(out["eos_token_id"], tuple):
      out["eos_token_id"] = list(out["eos_token_id"])
    out.update(model_type="bart", architectures=["BartForConditionalGeneration"],
               is_encoder_decoder=True, tie_word_embeddings=True, encoder_layerdrop=0.0,
               decoder_layerdrop=0.0)
    return out

  def generation_hf(self) -> dict[str, Any]:
    """generation_config.json content: the special tokens and the generation defaults set."""
    out = {"bos_token_id": self.bos_token_id, "pad_token_id": self.pad_token_id,
           "eos_token_id": (list(self.eos_token_id) if isinstance(self.eos_token_id, tuple)
                            else self.eos_token_id),
           "decoder_start_token_id": self.decoder_start_token_id,
           "forced_eos_token_id": self.forced_eos_token_id}
    out.update({k: getattr(self, k) for k in GENERATION_KEYS if getattr(self, k) is not None})
    return {k: v for k, v in out.items() if v is not None}


def shift_tokens_right(input_ids: jax.Array, pad_token_id: int,
                       decoder_start_token_id: int | jax.Array) -> jax.Array:
  """Decoder inputs from labels, as HF: prepend the start token, drop the last, -100 -> pad.

  `decoder_start_token_id` is one id for every row or an int array [B] of per-row ids.
  """
  start = jnp.asarray(decoder_start_token_id, input_ids.dtype).reshape(-1, 1)
  shifted = jnp.concatenate(
      [jnp.broadcast_to(start, input_ids[:, :1].shape), input_ids[:, :-1]], axis=1)
  return jnp.where(shifted == -100, pad_token_id, shifted)


@flax.struct.dataclass
class LayerCache:
  key: jax.Array  # [B, H, D, L] self-attention keys written so far (zeros beyond).
  value: jax.Array  # [B, H, L, D]
  cross_key: jax.Array  # [B, H, D, S] projected once from the encoder memory.
  cross_value: jax.Array  # [B, H, S, D]

  @staticmethod
  def keys_in(k: jax.Array) -> jax.Array:
    """[B, L, H, D] -> the stored key layout [B, H, D, L]."""
    return k.transpose(0, 2, 3, 1)

  @staticmethod
  def values_in(v: jax.Array) -> jax.Array:
    """[B, L, H, D] -> the stored value layout [B, H, L, D]."""
    return v.transpose(0, 2, 1, 3)

  @staticmethod
  def kv_out(k: jax.Array, v: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Stored keys/values as Attention takes them, [B, L, H, D] (XLA folds the transposes
    into the attention dots)."""
    return k.transpose(0, 3, 1, 2), v.transpose(0, 2, 1, 3)


@flax.struct.dataclass
class DecoderCache:
  index: jax.Array  # int32 []: the position the next decoder token is written to.
  layers: tuple[LayerCache, ...]

  @property
  def max_length(self) -> int:
    return self.layers[0].key.shape[-1]

  def grow(self, max_length: int) -> DecoderCache:
    """The same entries in a cache of `max_length` self-attention positions (zeros after)."""
    extra = max_length - self.max_length
    if extra < 0:
      raise ValueError(f"cannot shrink a cache of {self.max_length} positions to {max_length}")
    if extra == 0:
      return self
    return self.replace(layers=tuple(
        c.replace(key=jnp.pad(c.key, ((0, 0), (0, 0), (0, 0), (0, extra))),
                  value=jnp.pad(c.value, ((0, 0), (0, 0), (0, extra), (0, 0))))
        for c in self.layers))

  def reorder(self, rows: jax.Array) -> DecoderCache:
    """Self-attention entries of `rows` (beam search); cross entries are the same per source."""
    return self.replace(layers=tuple(
        c.replace(key=jnp.take(c.key, rows, axis=0), value=jnp.take(c.value, rows, axis=0))
        for c in self.layers))


class _FeedForward(nnx.Module):
  """fc1 -> activation -> activation dropout -> fc2 (HF's parameter names)."""

  def __init__(self, features: int, hidden: int, act: str, dropout: float, *, dtype: Dtype,
               pre_norm: bool, rngs: nnx.Rngs):
    self.act = layers.activation(act)
    reads, writes = layers.weight_grad_transposes(pre_norm)
    self.fc1 = layers.Dense(features, hidden, ("embed", "mlp"), dtype=dtype,
                            weight_grad_transpose=reads, rngs=rngs)
    self.fc2 = layers.Dense(hidden, features, ("mlp", "embed"), dtype=dtype,
                            weight_grad_transpose=writes, rngs=rngs)
    self.dropout = nnx.Dropout(dropout, rngs=rngs)

  def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
    h = layers.constrain(self.act(self.fc1(x)), ("batch", "length", "mlp"))
    return self.fc2(self.dropout(h, deterministic=deterministic))


# How a sublayer f joins the residual stream: LN(x + f(x)) post-LN (BART), x + f(LN(x)) pre-LN
# (config.normalize_before); dropout on f's output either way.
def _sublayer_input(pre: bool, x: jax.Array, norm: layers.LayerNorm) -> jax.Array:
  return norm(x) if pre else x


def _residual(pre: bool, x: jax.Array, h: jax.Array, norm: layers.LayerNorm,
              dropout: nnx.Dropout, deterministic: bool) -> jax.Array:
  x = x + dropout(h, deterministic=deterministic)
  return x if pre else norm(x)


class EncoderLayer(nnx.Module):
  """Self-attention then FFN: post-LN x = LN(x + f(x)), or pre-LN x = x + f(LN(x))."""

  def __init__(self, config: BartConfig, *, dtype: Dtype, rngs: nnx.Rngs):
    d = config.d_model
    self.self_attn = layers.Attention(d, config.encoder_attention_heads,
                                      dropout_rate=config.attention_dropout, dtype=dtype,
                                      pre_norm=config.normalize_before, rngs=rngs)
    self.self_attn_layer_norm = layers.LayerNorm(d, dtype=dtype, rngs=rngs)
    self.mlp = _FeedForward(d, config.encoder_ffn_dim, config.activation_function,
                            config.activation_dropout, dtype=dtype,
                            pre_norm=config.normalize_before, rngs=rngs)
    self.final_layer_norm = layers.LayerNorm(d, dtype=dtype, rngs=rngs)
    self.dropout = nnx.Dropout(config.dropout, rngs=rngs)
    self.pre_norm = config.normalize_before

  def __call__(self, x: jax.Array, mask: jax.Array, deterministic: bool) -> jax.Array:
    pre, drop = self.pre_norm, self.dropout
    h = self.self_attn(_sublayer_input(pre, x, self.self_attn_layer_norm), mask=mask,
                       deterministic=deterministic)
    x = _residual(pre, x, h, self.self_attn_layer_norm, drop, deterministic)
    h = self.mlp(_sublayer_input(pre, x, self.final_layer_norm), deterministic)
    x = _residual(pre, x, h, self.final_layer_norm, drop, deterministic)
    return layers.constrain(x, ("batch", "length", "embed"))


class DecoderLayer(nnx.Module):
  """Causal self-attention, cross-attention to the encoder memory, FFN; post-LN, or pre-LN
  (as EncoderLayer)."""

  def __init__(self, config: BartConfig, *, dtype: Dtype, rngs: nnx.Rngs):
    d, heads = config.d_model, config.decoder_attention_heads
    attn = dict(dropout_rate=config.attention_dropout, dtype=dtype,
                pre_norm=config.normalize_before, rngs=rngs)
    self.self_attn = layers.Attention(d, heads, **attn)
    self.self_attn_layer_norm = layers.LayerNorm(d, dtype=dtype, rngs=rngs)
    self.encoder_attn = layers.Attention(d, heads, **attn)
    self.encoder_attn_layer_norm = layers.LayerNorm(d, dtype=dtype, rngs=rngs)
    self.mlp = _FeedForward(d, config.decoder_ffn_dim, config.activation_function,
                            config.activation_dropout, dtype=dtype,
                            pre_norm=config.normalize_before, rngs=rngs)
    self.final_layer_norm = layers.LayerNorm(d, dtype=dtype, rngs=rngs)
    self.dropout = nnx.Dropout(config.dropout, rngs=rngs)
    self.pre_norm = config.normalize_before

  def __call__(self, x: jax.Array, self_mask: jax.Array, cross_mask: jax.Array, *,
               memory: jax.Array | None, cache: LayerCache | None, index: jax.Array | None,
               deterministic: bool) -> tuple[jax.Array, LayerCache | None]:
    pre, drop = self.pre_norm, self.dropout
    y = _sublayer_input(pre, x, self.self_attn_layer_norm)
    if cache is None:
      h = self.self_attn(y, mask=self_mask, deterministic=deterministic)
      cross_kv = self.encoder_attn.project_kv(memory)
    else:
      k, v = self.self_attn.project_kv(y)  # [B, T, H, D] for the new tokens only.
      dtype = cache.key.dtype
      cache = cache.replace(
          key=jax.lax.dynamic_update_slice(cache.key, LayerCache.keys_in(k).astype(dtype),
                                           (0, 0, 0, index)),
          value=jax.lax.dynamic_update_slice(cache.value,
                                             LayerCache.values_in(v).astype(dtype),
                                             (0, 0, index, 0)))
      h = self.self_attn(y, kv=LayerCache.kv_out(cache.key, cache.value), mask=self_mask,
                         deterministic=deterministic)
      cross_kv = LayerCache.kv_out(cache.cross_key, cache.cross_value)
    x = _residual(pre, x, h, self.self_attn_layer_norm, drop, deterministic)
    h = self.encoder_attn(_sublayer_input(pre, x, self.encoder_attn_layer_norm), kv=cross_kv,
                          mask=cross_mask, deterministic=deterministic)
    x = _residual(pre, x, h, self.encoder_attn_layer_norm, drop, deterministic)
    h = self.mlp(_sublayer_input(pre, x, self.final_layer_norm), deterministic)
    x = _residual(pre, x, h, self.final_layer_norm, drop, deterministic)
    return layers.constrain(x, ("batch", "length", "embed")), cache


class _Stack(nnx.Module):
  """Positions, layernorm_embedding and the layers of one side (the token table is shared)."""

  def __init__(self, config: BartConfig, layer_cls: type, num_layers: int, *, dtype: Dtype,
               rngs: nnx.Rngs):
    self.embed_positions = layers.Embed(config.max_position_embeddings + POSITION_OFFSET,
                                        config.d_model, axes=("positions", "embed"),
                                        dtype=dtype, rngs=rngs)
    self.layernorm_embedding = layers.LayerNorm(config.d_model, dtype=dtype, rngs=rngs)
    self.layers = nnx.List([layer_cls(config, dtype=dtype, rngs=rngs)
                            for _ in range(num_layers)])
    self.dropout = nnx.Dropout(config.dropout, rngs=rngs)
    # Pre-LN's stream is never normalised inside the layers: one LayerNorm at the end.
    self.layer_norm = (layers.LayerNorm(config.d_model, dtype=dtype, rngs=rngs)
                       if config.normalize_before else None)

  def finish(self, x: jax.Array) -> jax.Array:
    return x if self.layer_norm is None else self.layer_norm(x)

  def embed(self, tokens: jax.Array, positions: jax.Array, deterministic: bool) -> jax.Array:
    x = tokens + self.embed_positions(positions + POSITION_OFFSET)
    x = self.dropout(self.layernorm_embedding(x), deterministic=deterministic)
    return layers.constrain(x, ("batch", "length", "embed"))


class Bart(nnx.Module):
  """BartForConditionalGeneration: encoder, decoder, tied LM head plus final_logits_bias.

  Masks are 0/1 [B, L] (1 = real token). `final_logits_bias` is a Param here (a frozen
  buffer in HF): freeze it in the optimizer (regex `final_logits_bias`) to fine-tune as HF.
  """

  def __init__(self, config: BartConfig, *, dtype: Dtype = None, rngs: nnx.Rngs):
    config.validate()
    self.config = config
    self.dtype = dtype
    init = nnx.initializers.normal(stddev=config.init_std)
    self.shared = layers.Embed(config.vocab_size, config.d_model, init=init, dtype=dtype,
                               rngs=rngs)
    self.encoder = _Stack(config, EncoderLayer, config.encoder_layers, dtype=dtype, rngs=rngs)
    self.decoder = _Stack(config, DecoderLayer, config.decoder_layers, dtype=dtype, rngs=rngs)
    self.final_logits_bias = nnx.Param(jnp.zeros((config.vocab_size,), jnp.float32),
                                       out_sharding=("vocab",))
    self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0

  # ---- pieces ------------------------------------------------------------------------------
  def _tokens(self, ids: jax.Array) -> jax.Array:
    x = self.shared(ids)
    return x * jnp.asarray(self.embed_scale, x.dtype) if self.embed_scale != 1.0 else x

  def encode(self, input_ids: jax.Array, attention_mask: jax.Array | None = None, *,
             deterministic: bool = True) -> jax.Array:
    """Encoder memory [B, S, D] of `input_ids` [B, S]."""
    if attention_mask is None:
      attention_mask = jnp.ones_like(input_ids)
    positions = jnp.arange(input_ids.shape[1])[None]
    x = self.encoder.embed(self._tokens(input_ids), positions, deterministic)
    mask = layers.padding_mask(attention_mask)
    for layer in self.encoder.layers:
      x = layer(x, mask, deterministic)
    return self.encoder.finish(x)

  def lm_logits(self, hidden: jax.Array) -> jax.Array:
    """Float32 logits [..., V] of decoder states (tied head plus final_logits_bias)."""
    logits = self.shared.attend(hidden).astype(jnp.float32) + self.final_logits_bias[...]
    return layers.constrain(logits, ("batch", "length", "vocab"))

  def init_cache(self, memory: jax.Array, max_length: int, *, repeat: int = 1) -> DecoderCache:
    """An empty cache for `max_length` decoder positions; cross keys/values from `memory`.

    `repeat` > 1 repeats each source row (for beam search: row b*repeat + k is beam k of b),
    projecting the memory once per source rather than once per beam.
    """
    batch = memory.shape[0] * repeat
    dtype = self.dtype or jnp.float32
    entries = []
    for layer in self.decoder.layers:
      ck, cv = layer.encoder_attn.project_kv(memory)
      if repeat > 1:
        ck, cv = jnp.repeat(ck, repeat, axis=0), jnp.repeat(cv, repeat, axis=0)
      heads, head_dim = layer.self_attn.num_heads, layer.self_attn.head_dim
      entries.append(LayerCache(
          key=jnp.zeros((batch, heads, head_dim, max_length), dtype),
          value=jnp.zeros((batch, heads, max_length, head_dim), dtype),
          cross_key=LayerCache.keys_in(ck).astype(dtype),
          cross_value=LayerCache.values_in(cv).astype(dtype)))
    return DecoderCache(index=jnp.zeros((), jnp.int32), layers=tuple(entries))

  def decode(self, target_ids: jax.Array, memory: jax.Array | None,
             memory_mask: jax.Array | None, *, target_mask: jax.Array | None = None,
             cache: DecoderCache | None = None, positions: jax.Array | None = None,
             deterministic: bool = True
             ) -> jax.Array | tuple[jax.Array, DecoderCache]:
    """Decoder logits [B, T, V] (float32).

    Without a cache: the whole target at once, causal, `target_mask` masking padded keys.
    With a cache: `target_ids` are the next T tokens (T = 1 when generating), written at
    `cache.index`; returns (logits, the advanced cache). `memory` may then be None (the
    cross keys/values are in the cache); `memory_mask` is always needed.
    """
    batch, length = target_ids.shape
    if memory_mask is None:
      if memory is None:
        raise ValueError("decode needs memory_mask when memory is None")
      memory_mask = jnp.ones(memory.shape[:2], jnp.int32)
    cross_mask = layers.padding_mask(memory_mask)
    steps = jnp.arange(length, dtype=jnp.int32)
    if cache is None:
      index = None
      self_mask = layers.causal_mask(length)
      if target_mask is not None:
        self_mask = self_mask & layers.padding_mask(target_mask)
      if positions is None:
        positions = steps
    else:
      index = cache.index
      query_pos = index + steps  # [T]
      key_pos = jnp.arange(cache.max_length, dtype=jnp.int32)
      self_mask = (key_pos[None, :] <= query_pos[:, None])[None, None]  # [1, 1, T, L]
      if positions is None:
        positions = query_pos
    positions = jnp.broadcast_to(positions, (batch, length))
    x = self.decoder.embed(self._tokens(target_ids), positions, deterministic)
    new_layers = []
    for i, layer in enumerate(self.decoder.layers):
      x, entry = layer(x, self_mask, cross_mask, memory=memory,
                       cache=None if cache is None else cache.layers[i], index=index,
                       deterministic=deterministic)
      new_layers.append(entry)
    logits = self.lm_logits(self.decoder.finish(x))
    if cache is None:
      return logits
    return logits, DecoderCache(index=cache.index + length, layers=tuple(new_layers))

  def __call__(self, input_ids: jax.Array, attention_mask: jax.Array | None = None,
               decoder_input_ids: jax.Array | None = None,
               decoder_attention_mask: jax.Array | None = None, *,
               deterministic: bool = True) -> jax.Array:
    """Logits [B, T, V] like BartForConditionalGeneration (decoder inputs default to the
    source shifted right, as HF)."""
    if attention_mask is None:
      attention_mask = jnp.ones_like(input_ids)
    if decoder_input_ids is None:
      decoder_input_ids = shift_tokens_right(input_ids, self.config.pad_token_id,
                                             self.config.decoder_start_token_id)
    memory = self.encode(input_ids, attention_mask, deterministic=deterministic)
    return self.decode(decoder_input_ids, memory, attention_mask,
                       target_mask=decoder_attention_mask, deterministic=deterministic)
