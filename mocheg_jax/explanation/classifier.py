"""The truthfulness classifier: the reward model of explanation generation (REINFORCE).

It reads an explanation and says how well it argues for each label (refuted, supported,
NEI). The generator is rewarded with r = p(gold label) - sum of the other classes'
probabilities (the reference's get_sc_loss, controllable/generation/loss/style_loss.py).

Two bodies, one head:
* "bert": our BertModel over WordPiece ids, the reference (bert-base-uncased). Pooled = the
  BERT pooler's output (dense + tanh on [CLS], the reference's `pooler_output`) when the
  body has a pooler, else the masked mean of the last hidden states.
* "bart_encoder": BART's encoder over the generator's own BPE ids, masked-mean pooled. It
  shares the generator's tokenizer, so the generator's sampled ids are scored inside the
  jitted train step, with no decode / re-tokenise round trip through the host. Its
  parameters have Bart's names (`shared`, `encoder.*`), so an HF BART folder's (or a
  generator's) encoder loads into it by path.

The head is the reference's (controllable/classification/model.py, TextModel):
  pooled -> Linear(D, 128) -> LeakyReLU(0.1) -> Dropout(0.3) -> Linear(128, 16)
         -> LeakyReLU(0.1) -> Dropout(0.3) -> Linear(16, 3)
with no dropout on the pooled vector itself and F.leaky_relu's slope 0.1 as the reference
passes it. (mocheg_jax.models.bert.MLPHead differs: dropout before every layer, slope 0.01.)

Everything here is pure JAX on fixed shapes: `label_probabilities` and `reward` can be
called inside any jitted function on traced token ids.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from mocheg_jax.data.labels import NUM_CLASSES
from mocheg_jax.models import bart
from mocheg_jax.models import bert
from mocheg_jax.models import layers

Dtype = Any

BODIES = ("bert", "bart_encoder")
POOLINGS = ("pooler", "mean")
HEAD_SIZES = (128, 16)  # The reference's 768 -> 128 -> 16 -> 3.
HEAD_DROPOUT = 0.3
LEAKY_RELU_SLOPE = 0.1  # The reference calls F.leaky_relu(x, .1).
# torch.nn.Linear's default kernel init (the reference's head): U(-1/sqrt(fan_in), +...).
HEAD_INIT = nnx.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")


@dataclasses.dataclass(frozen=True)
class ClassifierConfig:
  """The architecture of a truthfulness classifier.

  Attributes:
    body: "bert" or "bart_encoder".
    encoder: the body's config (a BertConfig for "bert", a BartConfig for "bart_encoder";
      only the encoder fields of a BartConfig matter).
    pooling: "pooler" (BERT's pooler output; the body must have one) or "mean".
    head_sizes: hidden sizes of the head between the pooled vector and the classes.
    head_dropout: dropout after each hidden layer of the head.
    leaky_relu_slope: negative slope of the head's LeakyReLUs.
    num_labels: classes (3: refuted, supported, NEI).
  """
  body: str
  encoder: bert.BertConfig | bart.BartConfig
  pooling: str = "mean"
  head_sizes: tuple[int, ...] = HEAD_SIZES
  head_dropout: float = HEAD_DROPOUT
  leaky_relu_slope: float = LEAKY_RELU_SLOPE
  num_labels: int = NUM_CLASSES

  def __post_init__(self):
    if self.body not in BODIES:
      raise ValueError(f"unknown classifier body {self.body!r}; expected one of {BODIES}")
    if self.pooling not in POOLINGS:
      raise ValueError(f"unknown pooling {self.pooling!r}; expected one of {POOLINGS}")
    want = bert.BertConfig if self.body == "bert" else bart.BartConfig
    if not isinstance(self.encoder, want):
      raise ValueError(f"body {self.body!r} needs a {want.__name__}, got "
                       f"{type(self.encoder).__name__}")
    if self.body == "bart_encoder" and self.pooling != "mean":
      raise ValueError("the bart_encoder body has no pooler; use pooling='mean'")
    if any(int(n) < 1 for n in self.head_sizes) or self.num_labels < 2:
      raise ValueError(f"head sizes {self.head_sizes} must be positive and num_labels "
                       f"{self.num_labels} at least 2")
    if not 0.0 <= self.head_dropout < 1.0:
      raise ValueError(f"head_dropout {self.head_dropout} is not in [0, 1)")

  @property
  def features(self) -> int:
    """Width of the pooled vector."""
    if self.body == "bert":
      return self.encoder.hidden_size
    return self.encoder.d_model

  @property
  def max_positions(self) -> int:
    """The longest token sequence the body takes."""
    return self.encoder.max_position_embeddings


class BartEncoder(nnx.Module):
  """BART's encoder alone: the token table, learned positions (offset 2),
  layernorm_embedding and the post-LN encoder layers; hidden states [B, L, D].

  The parameter names are those of `bart.Bart` (`shared.embedding`,
  `encoder.embed_positions.embedding`, `encoder.layers.{i}.*`), so a Bart's `shared` and
  `encoder` states pour into it unchanged.
  """

  def __init__(self, config: bart.BartConfig, *, dtype: Dtype = None, rngs: nnx.Rngs):
    config.validate()
    self.config = config
    init = nnx.initializers.normal(stddev=config.init_std)
    self.shared = layers.Embed(config.vocab_size, config.d_model, init=init, dtype=dtype,
                               rngs=rngs)
    self.encoder = _EncoderStack(config, dtype=dtype, rngs=rngs)
    self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0

  def __call__(self, input_ids: jax.Array, attention_mask: jax.Array, *,
               deterministic: bool = True) -> jax.Array:
    length = input_ids.shape[1]
    if length > self.config.max_position_embeddings:  # jnp.take would clamp silently.
      raise ValueError(f"sequence length {length} exceeds the classifier's "
                       f"max_position_embeddings {self.config.max_position_embeddings}")
    x = self.shared(input_ids)
    if self.embed_scale != 1.0:
      x = x * jnp.asarray(self.embed_scale, x.dtype)
    stack = self.encoder
    x = x + stack.embed_positions(jnp.arange(length)[None] + bart.POSITION_OFFSET)
    x = stack.dropout(stack.layernorm_embedding(x), deterministic=deterministic)
    x = layers.constrain(x, ("batch", "length", "embed"))  # [B, L, D]
    mask = layers.padding_mask(attention_mask)
    for layer in stack.layers:
      x = layer(x, mask, deterministic)
    return x


class _EncoderStack(nnx.Module):
  """The parameters under Bart's `encoder` (positions, embedding norm, layers)."""

  def __init__(self, config: bart.BartConfig, *, dtype: Dtype, rngs: nnx.Rngs):
    self.embed_positions = layers.Embed(config.max_position_embeddings + bart.POSITION_OFFSET,
                                        config.d_model, axes=("positions", "embed"),
                                        dtype=dtype, rngs=rngs)
    self.layernorm_embedding = layers.LayerNorm(config.d_model, dtype=dtype, rngs=rngs)
    self.layers = nnx.List([bart.EncoderLayer(config, dtype=dtype, rngs=rngs)
                            for _ in range(config.encoder_layers)])
    self.dropout = nnx.Dropout(config.dropout, rngs=rngs)


class TruthfulnessHead(nnx.Module):
  """pooled -> [Dense -> LeakyReLU -> Dropout] per hidden size -> Dense -> logits."""

  def __init__(self, features: int, num_labels: int = NUM_CLASSES, *,
               sizes: tuple[int, ...] = HEAD_SIZES, dropout_rate: float = HEAD_DROPOUT,
               slope: float = LEAKY_RELU_SLOPE, dtype: Dtype = None, rngs: nnx.Rngs):
    dims = (features, *sizes, num_labels)
    axes = ("embed",) + ("head",) * len(sizes) + ("classes",)
    self.fcs = nnx.List([layers.Dense(dims[i], dims[i + 1], (axes[i], axes[i + 1]),
                                      kernel_init=HEAD_INIT, dtype=dtype, rngs=rngs)
                         for i in range(len(dims) - 1)])
    self.dropout = nnx.Dropout(dropout_rate, rngs=rngs)
    self.slope = slope

  def __call__(self, x: jax.Array, *, deterministic: bool) -> jax.Array:
    last = len(self.fcs) - 1
    for i, fc in enumerate(self.fcs):
      x = fc(x)
      if i < last:
        x = self.dropout(jax.nn.leaky_relu(x, self.slope), deterministic=deterministic)
    return x


class TruthfulnessClassifier(nnx.Module):
  """Token ids [B, L] and a 0/1 mask [B, L] -> float32 logits [B, num_labels].

  `body` is a `bert.BertModel` or a `BartEncoder`; `head` a `TruthfulnessHead`.
  """

  def __init__(self, config: ClassifierConfig, *, dtype: Dtype = None, rngs: nnx.Rngs):
    self.config = config
    if config.body == "bert":
      self.body = bert.BertModel(config.encoder, add_pooler=config.pooling == "pooler",
                                 dtype=dtype, rngs=rngs)
    else:
      self.body = BartEncoder(config.encoder, dtype=dtype, rngs=rngs)
    self.head = TruthfulnessHead(config.features, config.num_labels,
                                 sizes=tuple(config.head_sizes),
                                 dropout_rate=config.head_dropout,
                                 slope=config.leaky_relu_slope, dtype=dtype, rngs=rngs)

  def pooled(self, input_ids: jax.Array, attention_mask: jax.Array, *,
             deterministic: bool = True) -> jax.Array:
    """The vector the head reads, [B, D] float32."""
    if self.config.body == "bert":
      hidden, pooled = self.body(input_ids, attention_mask, deterministic=deterministic)
      if self.config.pooling == "pooler":
        return pooled.astype(jnp.float32)
    else:
      hidden = self.body(input_ids, attention_mask, deterministic=deterministic)
    return bert.pool(hidden, attention_mask, "mean")

  def __call__(self, input_ids: jax.Array, attention_mask: jax.Array, *,
               deterministic: bool = True) -> jax.Array:
    pooled = self.pooled(input_ids, attention_mask, deterministic=deterministic)
    logits = self.head(pooled, deterministic=deterministic)
    return layers.constrain(logits.astype(jnp.float32), ("batch", "classes"))  # [B, C]


def label_probabilities(model: TruthfulnessClassifier, ids: jax.Array,
                        mask: jax.Array) -> jax.Array:
  """Class probabilities [B, 3] (refuted, supported, NEI) of token ids [B, L].

  Inference mode (no dropout) and no host access: callable inside a jitted step on the
  generator's sampled ids, with `mask` 1 up to and including each row's end token.
  """
  return jax.nn.softmax(model(ids, mask, deterministic=True), axis=-1)


def reward(probabilities: jax.Array, labels: jax.Array) -> jax.Array:
  """r = p(label) - sum of the other classes' probabilities, [B] float32.

  Args:
    probabilities: [B, C] class probabilities (from `label_probabilities`).
    labels: [B] integer class ids (the gold label the explanation should argue for).
  """
  p = probabilities.astype(jnp.float32)
  gold = jnp.take_along_axis(p, labels.astype(jnp.int32)[:, None], axis=-1)[:, 0]  # [B]
  return gold - (p.sum(-1) - gold)
