"""BERT-family encoders (BERT-base, MiniLM) in Flax NNX, with the heads Mocheg uses.

* `BertModel`: embeddings (word + position + token type, LayerNorm, dropout), post-LN
  transformer blocks, and the pooler (dense + tanh on [CLS]); HF's `BertModel`.
* `SentenceEncoder`: the SBERT bi-encoder (mean or CLS pooling, optional L2 normalisation).
* `CrossEncoder`: one relevance logit per pair; HF's `BertForSequenceClassification` with
  num_labels=1 (the ms-marco MiniLM cross-encoders).
* `SequenceClassifier`: `head="linear"` is `BertForSequenceClassification`; `head="mlp"` is
  the Mocheg paper's classifier, D -> 128 -> 16 -> num_labels with LeakyReLU and dropout 0.3,
  which has no HF counterpart (see mocheg_jax/models/hf/bert.py for how it is saved).

Logical axes, besides the shared ones (batch, length, embed, mlp, heads, kv, vocab):
"position" (the position table), "token_type", "pooler" (the pooler's output features),
"head" (the MLP head's hidden features) and "classes".
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from mocheg_jax.data.report import MochegInputError
from mocheg_jax.models import layers

Dtype = Any

POOLING_MODES = ("mean", "cls")
CLASSIFIER_HEADS = ("linear", "mlp")
# The Mocheg paper's classifier head: D -> 128 -> 16 -> num_labels.
MLP_HEAD_SIZES = (128, 16)
MLP_HEAD_DROPOUT = 0.3
LEAKY_RELU_SLOPE = 0.01  # torch.nn.LeakyReLU's default.


@dataclasses.dataclass(frozen=True)
class BertConfig:
  """The fields of HF's BertConfig that the architecture depends on (HF defaults)."""
  vocab_size: int = 30522
  hidden_size: int = 768
  num_hidden_layers: int = 12
  num_attention_heads: int = 12
  intermediate_size: int = 3072
  hidden_act: str = "gelu"
  hidden_dropout_prob: float = 0.1
  attention_probs_dropout_prob: float = 0.1
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  layer_norm_eps: float = 1e-12
  pad_token_id: int = 0
  classifier_dropout: float | None = None  # None: hidden_dropout_prob, as in HF.

  def __post_init__(self):
    if self.hidden_size % self.num_attention_heads:
      raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of "
                       f"num_attention_heads {self.num_attention_heads}")
    layers.activation(self.hidden_act)  # Fails early on an unknown activation.

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_attention_heads

  @classmethod
  def from_hf(cls, config: dict, source: str = "config.json") -> "BertConfig":
    """Reads an HF config dict (config.json); `source` names the file in errors.

    Raises:
      MochegInputError: another model_type, a position embedding other than absolute,
        a decoder / cross-attention config, an unknown activation or a malformed field.
    """
    model_type = config.get("model_type", "bert")
    if model_type != "bert":
      raise MochegInputError(f"{source}: model_type {model_type!r} is not supported by the "
                             "BERT loader (expected 'bert')")
    position = config.get("position_embedding_type", "absolute")
    if position not in (None, "absolute"):
      raise MochegInputError(f"{source}: position_embedding_type {position!r} is not "
                             "supported (only 'absolute' position embeddings)")
    for field in ("is_decoder", "add_cross_attention"):
      if config.get(field):
        raise MochegInputError(f"{source}: {field}=true is not supported (encoder-only BERT)")
    act = config.get("hidden_act", cls.hidden_act)
    if not isinstance(act, str) or act not in layers.ACTIVATIONS:
      raise MochegInputError(f"{source}: hidden_act {act!r} is not supported; expected one "
                             f"of {sorted(layers.ACTIVATIONS)}")
    values = {}
    for f in dataclasses.fields(cls):
      if f.name in config and config[f.name] is not None:
        values[f.name] = config[f.name]
    if values.get("pad_token_id") is None:
      values.pop("pad_token_id", None)
    try:
      return cls(**values)
    except (TypeError, ValueError) as e:
      raise MochegInputError(f"{source}: {e}") from e

  def to_hf(self) -> dict:
    """A config dict that transformers' BertConfig accepts (architectures: BertModel)."""
    out = dataclasses.asdict(self)
    out.update(model_type="bert", architectures=["BertModel"],
               position_embedding_type="absolute")
    return out


def _dropout(rate: float, rngs: nnx.Rngs) -> nnx.Dropout:
  return nnx.Dropout(rate, rngs=rngs)


class BertEmbeddings(nnx.Module):
  """Word + position + token-type embeddings, LayerNorm, dropout."""

  def __init__(self, config: BertConfig, *, dtype: Dtype = None, param_dtype=jnp.float32,
               rngs: nnx.Rngs):
    d = config.hidden_size
    kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.max_positions = config.max_position_embeddings
    self.word = layers.Embed(config.vocab_size, d, axes=("vocab", "embed"), **kw)
    self.position = layers.Embed(config.max_position_embeddings, d,
                                 axes=("position", "embed"), **kw)
    self.token_type = layers.Embed(config.type_vocab_size, d, axes=("token_type", "embed"),
                                   **kw)
    self.norm = layers.LayerNorm(d, eps=config.layer_norm_eps, **kw)
    self.dropout = _dropout(config.hidden_dropout_prob, rngs)

  def __call__(self, input_ids: jax.Array, token_type_ids: jax.Array, *,
               deterministic: bool) -> jax.Array:
    length = input_ids.shape[1]
    if length > self.max_positions:  # jnp.take would silently clamp the positions.
      raise ValueError(f"sequence length {length} exceeds max_position_embeddings "
                       f"{self.max_positions}; truncate the input")
    x = (self.word(input_ids) + self.position(jnp.arange(length))[None]
         + self.token_type(token_type_ids))
    x = self.norm(x)
    return self.dropout(x, deterministic=deterministic)


class BertLayer(nnx.Module):
  """Post-LN block: x = LN(x + Attn(x)); x = LN(x + MLP(x))."""

  def __init__(self, config: BertConfig, *, dtype: Dtype = None, param_dtype=jnp.float32,
               rngs: nnx.Rngs):
    d = config.hidden_size
    kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.attention = layers.Attention(d, config.num_attention_heads,
                                      dropout_rate=config.attention_probs_dropout_prob, **kw)
    self.attention_norm = layers.LayerNorm(d, eps=config.layer_norm_eps, **kw)
    self.mlp = layers.MLP(d, config.intermediate_size, config.hidden_act, **kw)
    self.mlp_norm = layers.LayerNorm(d, eps=config.layer_norm_eps, **kw)
    self.dropout = _dropout(config.hidden_dropout_prob, rngs)

  def __call__(self, x: jax.Array, mask: jax.Array, *, deterministic: bool) -> jax.Array:
    h = self.attention(x, mask=mask, deterministic=deterministic)
    x = self.attention_norm(x + self.dropout(h, deterministic=deterministic))
    x = layers.constrain(x, ("batch", "length", "embed"))
    h = self.mlp(x)
    x = self.mlp_norm(x + self.dropout(h, deterministic=deterministic))
    return layers.constrain(x, ("batch", "length", "embed"))


class BertEncoder(nnx.Module):

  def __init__(self, config: BertConfig, *, dtype: Dtype = None, param_dtype=jnp.float32,
               rngs: nnx.Rngs):
    self.layers = nnx.List([BertLayer(config, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
                            for _ in range(config.num_hidden_layers)])

  def __call__(self, x: jax.Array, mask: jax.Array, *, deterministic: bool) -> jax.Array:
    for layer in self.layers:
      x = layer(x, mask, deterministic=deterministic)
    return x


class BertModel(nnx.Module):
  """HF's BertModel: returns (last hidden states [B, L, D], pooled [CLS] [B, D]).

  `add_pooler=False` builds no pooler (for checkpoints saved without one); `pooled` is
  then None.
  """

  def __init__(self, config: BertConfig, *, add_pooler: bool = True, dtype: Dtype = None,
               param_dtype=jnp.float32, rngs: nnx.Rngs):
    self.config = config
    self.dtype = dtype
    kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.embeddings = BertEmbeddings(config, **kw)
    self.encoder = BertEncoder(config, **kw)
    self.pooler = (layers.Dense(config.hidden_size, config.hidden_size, ("embed", "pooler"),
                                **kw) if add_pooler else None)

  def __call__(self, input_ids: jax.Array, attention_mask: jax.Array,
               token_type_ids: jax.Array | None = None, *,
               deterministic: bool = True) -> tuple[jax.Array, jax.Array | None]:
    """input_ids, attention_mask (0/1), token_type_ids: [B, L] integer arrays."""
    if token_type_ids is None:
      token_type_ids = jnp.zeros_like(input_ids)
    x = self.embeddings(input_ids, token_type_ids, deterministic=deterministic)
    x = layers.constrain(x, ("batch", "length", "embed"))  # [B, L, D]
    x = self.encoder(x, layers.padding_mask(attention_mask), deterministic=deterministic)
    pooled = None
    if self.pooler is not None:
      pooled = jnp.tanh(self.pooler(x[:, 0]))  # [B, D]
      pooled = layers.constrain(pooled, ("batch", "embed"))
    return x, pooled


def pool(hidden: jax.Array, attention_mask: jax.Array, mode: str = "mean",
         normalize: bool = False) -> jax.Array:
  """Sentence embedding [B, D] (float32) from hidden states [B, L, D] and a 0/1 mask.

  Mean pooling averages the real tokens as sentence-transformers does (denominator clamped
  at 1e-9); "cls" takes the first token. Normalisation divides by max(norm, 1e-12), as
  torch.nn.functional.normalize.
  """
  hidden = hidden.astype(jnp.float32)
  if mode == "mean":
    m = attention_mask.astype(jnp.float32)[..., None]  # [B, L, 1]
    out = (hidden * m).sum(1) / jnp.maximum(m.sum(1), 1e-9)
  elif mode == "cls":
    out = hidden[:, 0]
  else:
    raise ValueError(f"unknown pooling mode {mode!r}; expected one of {POOLING_MODES}")
  if normalize:
    out = out / jnp.maximum(jnp.linalg.norm(out, axis=-1, keepdims=True), 1e-12)
  return layers.constrain(out, ("batch", "embed"))


class SentenceEncoder(nnx.Module):
  """SBERT bi-encoder: BertModel -> mean/CLS pooling -> optional L2 normalisation -> [B, D]."""

  def __init__(self, config: BertConfig, *, pooling: str = "mean", normalize: bool = False,
               add_pooler: bool = True, dtype: Dtype = None, param_dtype=jnp.float32,
               rngs: nnx.Rngs):
    if pooling not in POOLING_MODES:
      raise ValueError(f"unknown pooling mode {pooling!r}; expected one of {POOLING_MODES}")
    self.config = config
    self.pooling, self.normalize = pooling, normalize
    self.bert = BertModel(config, add_pooler=add_pooler, dtype=dtype, param_dtype=param_dtype,
                          rngs=rngs)

  def __call__(self, input_ids: jax.Array, attention_mask: jax.Array,
               token_type_ids: jax.Array | None = None, *,
               deterministic: bool = True) -> jax.Array:
    hidden, _ = self.bert(input_ids, attention_mask, token_type_ids,
                          deterministic=deterministic)
    return pool(hidden, attention_mask, self.pooling, self.normalize)


class CrossEncoder(nnx.Module):
  """One relevance logit per (query, passage) pair: pooled -> dropout -> linear -> [B].

  The same parameters as HF's BertForSequenceClassification with num_labels=1 (HF returns
  [B, 1]; we drop the last axis). Scores are raw logits: sentence-transformers' CrossEncoder
  applies a sigmoid on top for the ms-marco models; ranking needs neither.
  """

  def __init__(self, config: BertConfig, *, dtype: Dtype = None, param_dtype=jnp.float32,
               rngs: nnx.Rngs):
    self.config = config
    self.bert = BertModel(config, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    rate = config.classifier_dropout
    self.dropout = _dropout(config.hidden_dropout_prob if rate is None else rate, rngs)
    self.classifier = layers.Dense(config.hidden_size, 1, ("embed", "classes"), dtype=dtype,
                                   param_dtype=param_dtype, rngs=rngs)

  def __call__(self, input_ids: jax.Array, attention_mask: jax.Array,
               token_type_ids: jax.Array | None = None, *,
               deterministic: bool = True) -> jax.Array:
    _, pooled = self.bert(input_ids, attention_mask, token_type_ids,
                          deterministic=deterministic)
    logits = self.classifier(self.dropout(pooled, deterministic=deterministic))
    return logits[:, 0].astype(jnp.float32)  # [B]


class MLPHead(nnx.Module):
  """The Mocheg classifier head: dropout -> D->128 -> LeakyReLU -> dropout -> 128->16 ->
  LeakyReLU -> dropout -> 16->num_labels."""

  def __init__(self, features: int, num_labels: int, *,
               sizes: tuple[int, ...] = MLP_HEAD_SIZES, dropout_rate: float = MLP_HEAD_DROPOUT,
               dtype: Dtype = None, param_dtype=jnp.float32, rngs: nnx.Rngs):
    kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    dims = (features, *sizes, num_labels)
    axes = ["embed"] + ["head"] * len(sizes) + ["classes"]
    self.fcs = nnx.List([layers.Dense(dims[i], dims[i + 1], (axes[i], axes[i + 1]), **kw)
                         for i in range(len(dims) - 1)])
    self.dropout = _dropout(dropout_rate, rngs)

  def __call__(self, x: jax.Array, *, deterministic: bool) -> jax.Array:
    for i, fc in enumerate(self.fcs):
      if i:
        x = jax.nn.leaky_relu(x, LEAKY_RELU_SLOPE)
      x = fc(self.dropout(x, deterministic=deterministic))
    return x


class SequenceClassifier(nnx.Module):
  """Sequence classification on the pooled [CLS] output -> logits [B, num_labels].

  head="linear": HF's BertForSequenceClassification (pooled -> dropout -> linear).
  head="mlp": the Mocheg paper's MLPHead (no HF counterpart); `mlp_sizes` and
  `mlp_dropout` are its hidden sizes and dropout rate.
  `label_names` (optional) are kept for export (config.json id2label).
  """

  def __init__(self, config: BertConfig, num_labels: int = 3, *, head: str = "linear",
               label_names: tuple[str, ...] | None = None,
               mlp_sizes: tuple[int, ...] = MLP_HEAD_SIZES,
               mlp_dropout: float = MLP_HEAD_DROPOUT, dtype: Dtype = None,
               param_dtype=jnp.float32, rngs: nnx.Rngs):
    if head not in CLASSIFIER_HEADS:
      raise ValueError(f"unknown classifier head {head!r}; expected one of {CLASSIFIER_HEADS}")
    if label_names is not None and len(label_names) != num_labels:
      raise ValueError(f"{len(label_names)} label names for {num_labels} labels")
    self.config = config
    self.head, self.num_labels = head, num_labels
    self.label_names = tuple(label_names) if label_names is not None else None
    kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.bert = BertModel(config, **kw)
    if head == "linear":
      rate = config.classifier_dropout
      self.dropout = _dropout(config.hidden_dropout_prob if rate is None else rate, rngs)
      self.classifier = layers.Dense(config.hidden_size, num_labels, ("embed", "classes"), **kw)
    else:
      self.dropout = None
      self.classifier = MLPHead(config.hidden_size, num_labels, sizes=tuple(mlp_sizes),
                                dropout_rate=mlp_dropout, **kw)

  def __call__(self, input_ids: jax.Array, attention_mask: jax.Array,
               token_type_ids: jax.Array | None = None, *,
               deterministic: bool = True) -> jax.Array:
    _, pooled = self.bert(input_ids, attention_mask, token_type_ids,
                          deterministic=deterministic)
    if self.head == "linear":
      logits = self.classifier(self.dropout(pooled, deterministic=deterministic))
    else:
      logits = self.classifier(pooled, deterministic=deterministic)
    return layers.constrain(logits.astype(jnp.float32), ("batch", "classes"))  # [B, C]
