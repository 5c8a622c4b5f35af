"""CLIP (ViT image tower + causal text tower) in Flax NNX, numerically matching HF's CLIPModel.

Besides the contrastive embeddings and logits, the towers return the token-level states the
verification model reads (MOCHEG_FORMAT.md): the text tower's last hidden states after the
final layer norm, and the vision tower's patch states without the class token and *before*
the post-layernorm (HF applies `post_layernorm` to the pooled class token only, so these are
`vision_model(...).last_hidden_state[:, 1:]`).

Pixels are channels-last [B, H, W, C] and already normalised (mocheg_jax.data.vision).

Logical axes, beyond the shared ones (batch, length, embed, mlp, heads, kv, vocab):
  positions      rows of a learned position table (text or vision);
  patches        the vision token axis (class token + patches) of tower-level activations;
                 inside the shared attention/MLP layers the same axis is called "length";
  patch_height, patch_width, channels
                 the input axes of the patch-embedding kernel [p, p, C, D];
  projection     the joint embedding space of the two projections.
None of these is sharded by the default rules; they exist so rules can name them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from mocheg_jax.data.report import MochegInputError
from mocheg_jax.models import layers
from mocheg_jax.models.layers import Dtype, constrain

# Activations CLIP checkpoints use, by their HF names (ACT2FN), all in layers.ACTIVATIONS.
SUPPORTED_ACTIVATIONS = ("quick_gelu", "gelu", "gelu_new")
# Before transformers PR #24773 CLIP configs said eos_token_id=2, and HF still pools at the
# argmax of the input ids (the EOT token has the highest id in the original vocabulary).
LEGACY_EOS_TOKEN_ID = 2


# ---- configuration --------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class CLIPTextConfig:
  vocab_size: int = 49408
  hidden_size: int = 512
  intermediate_size: int = 2048
  num_attention_heads: int = 8
  num_hidden_layers: int = 12
  max_position_embeddings: int = 77
  hidden_act: str = "quick_gelu"
  layer_norm_eps: float = 1e-5
  attention_dropout: float = 0.0  # Kept for the round trip; inference is deterministic.
  pad_token_id: int | None = 1
  bos_token_id: int | None = 49406
  eos_token_id: int = 49407


@dataclasses.dataclass(frozen=True)
class CLIPVisionConfig:
  hidden_size: int = 768
  intermediate_size: int = 3072
  num_attention_heads: int = 12
  num_hidden_layers: int = 12
  image_size: int = 224
  patch_size: int = 32
  num_channels: int = 3
  hidden_act: str = "quick_gelu"
  layer_norm_eps: float = 1e-5
  attention_dropout: float = 0.0

  @property
  def num_patches(self) -> int:
    return (self.image_size // self.patch_size) ** 2


def _sub_config(cls, raw: Any, where: str, model_type: str):
  """One tower's config from its HF dict; HF's defaults fill what is absent."""
  if raw is None:
    raw = {}
  if not isinstance(raw, dict):
    raise MochegInputError(f"{where}: expected an object, got {type(raw).__name__}")
  if raw.get("model_type", model_type) != model_type:
    raise MochegInputError(f"{where}.model_type: expected {model_type!r}, got "
                           f"{raw['model_type']!r}")
  values = {}
  for field in dataclasses.fields(cls):
    if field.name in raw:
      values[field.name] = raw[field.name]
  config = cls(**values)
  if config.hidden_act not in SUPPORTED_ACTIVATIONS:
    raise MochegInputError(f"{where}.hidden_act: unsupported activation {config.hidden_act!r}; "
                           f"expected one of {list(SUPPORTED_ACTIVATIONS)}")
  if config.hidden_size % config.num_attention_heads:
    raise MochegInputError(f"{where}: hidden_size {config.hidden_size} is not divisible by "
                           f"num_attention_heads {config.num_attention_heads}")
  return config


@dataclasses.dataclass(frozen=True)
class CLIPConfig:
  """A CLIPModel: text and vision towers, joint projection size and initial logit scale."""
  text: CLIPTextConfig = CLIPTextConfig()
  vision: CLIPVisionConfig = CLIPVisionConfig()
  projection_dim: int = 512
  logit_scale_init_value: float = 2.6592

  @classmethod
  def from_hf(cls, raw: dict, source: str = "config.json") -> CLIPConfig:
    """From an HF CLIPConfig dict (config.json); `source` names the file in errors."""
    model_type = raw.get("model_type")
    if model_type != "clip":
      raise MochegInputError(f"{source}: model_type {model_type!r} is not supported here; "
                             "expected 'clip' (a full CLIPModel checkpoint)")
    # Old exports carry `*_config_dict` beside (or instead of) `*_config`.
    text_raw = raw.get("text_config") or raw.get("text_config_dict")
    vision_raw = raw.get("vision_config") or raw.get("vision_config_dict")
    text = _sub_config(CLIPTextConfig, text_raw, f"{source}: text_config", "clip_text_model")
    vision = _sub_config(CLIPVisionConfig, vision_raw, f"{source}: vision_config",
                         "clip_vision_model")
    if not isinstance(text.eos_token_id, int) or isinstance(text.eos_token_id, bool):
      raise MochegInputError(f"{source}: text_config.eos_token_id must be one integer (the "
                             f"token whose state is pooled), got {text.eos_token_id!r}")
    if vision.image_size % vision.patch_size:
      raise MochegInputError(f"{source}: vision_config.image_size {vision.image_size} is not a "
                             f"multiple of patch_size {vision.patch_size}")
    return cls(text=text, vision=vision,
               projection_dim=int(raw.get("projection_dim", cls.projection_dim)),
               logit_scale_init_value=float(raw.get("logit_scale_init_value",
                                                    cls.logit_scale_init_value)))

  def to_hf(self) -> dict:
    """An HF CLIPConfig dict that transformers' CLIPModel accepts."""
    return {
        "model_type": "clip",
        "architectures": ["CLIPModel"],
        "projection_dim": self.projection_dim,
        "logit_scale_init_value": self.logit_scale_init_value,
        "text_config": {"model_type": "clip_text_model", "projection_dim": self.projection_dim,
                        **dataclasses.asdict(self.text)},
        "vision_config": {"model_type": "clip_vision_model",
                          "projection_dim": self.projection_dim,
                          **dataclasses.asdict(self.vision)},
    }


# ---- outputs --------------------------------------------------------------------------------
class TextFeatures(NamedTuple):
  hidden: jax.Array  # [B, L, Dt] last hidden states after the final layer norm.
  pooled: jax.Array  # [B, Dt] the EOS token's state.
  embeds: jax.Array  # [B, P] text_projection(pooled), unnormalised.


class ImageFeatures(NamedTuple):
  hidden: jax.Array  # [B, 1 + N, Dv] encoder output (class token first), before post-LN.
  pooled: jax.Array  # [B, Dv] post_layernorm(class token).
  embeds: jax.Array  # [B, P] visual_projection(pooled), unnormalised.

  @property
  def patches(self) -> jax.Array:
    """[B, N, Dv] patch states without the class token, before the post-layernorm."""
    return self.hidden[:, 1:]


class CLIPOutput(NamedTuple):
  logits_per_text: jax.Array  # [T, I] scaled cosine similarities.
  logits_per_image: jax.Array  # [I, T]
  text_embeds: jax.Array  # [T, P] L2-normalised.
  image_embeds: jax.Array  # [I, P] L2-normalised.


# ---- modules --------------------------------------------------------------------------------
class EncoderLayer(nnx.Module):
  """Pre-LN transformer block: x + attn(ln1(x)), then x + mlp(ln2(x))."""

  def __init__(self, hidden: int, intermediate: int, heads: int, act: str, eps: float, *,
               dtype: Dtype, param_dtype, rngs: nnx.Rngs):
    common = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.layer_norm1 = layers.LayerNorm(hidden, eps=eps, **common)
    self.attention = layers.Attention(hidden, heads, pre_norm=True, **common)
    self.layer_norm2 = layers.LayerNorm(hidden, eps=eps, **common)
    self.mlp = layers.MLP(hidden, intermediate, act, pre_norm=True, **common)

  def __call__(self, x: jax.Array, mask: jax.Array | None, axes: layers.Axes) -> jax.Array:
    x = constrain(x + self.attention(self.layer_norm1(x), mask=mask), axes)
    return constrain(x + self.mlp(self.layer_norm2(x)), axes)


def _encoder_layers(config: CLIPTextConfig | CLIPVisionConfig, *, dtype: Dtype, param_dtype,
                    rngs: nnx.Rngs) -> nnx.List:
  return nnx.List([
      EncoderLayer(config.hidden_size, config.intermediate_size, config.num_attention_heads,
                   config.hidden_act, config.layer_norm_eps, dtype=dtype,
                   param_dtype=param_dtype, rngs=rngs)
      for _ in range(config.num_hidden_layers)])


class TextTransformer(nnx.Module):
  """Token + position embeddings, causal pre-LN blocks, final layer norm, EOS pooling."""

  def __init__(self, config: CLIPTextConfig, *, dtype: Dtype = None, param_dtype=jnp.float32,
               rngs: nnx.Rngs):
    self.config = config
    common = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.token_embedding = layers.Embed(config.vocab_size, config.hidden_size, **common)
    self.position_embedding = layers.Embed(config.max_position_embeddings, config.hidden_size,
                                           axes=("positions", "embed"), **common)
    self.layers = _encoder_layers(config, **common)
    self.final_layer_norm = layers.LayerNorm(config.hidden_size, eps=config.layer_norm_eps,
                                             **common)

  def __call__(self, ids: jax.Array, mask: jax.Array | None = None
               ) -> tuple[jax.Array, jax.Array]:
    """ids, mask: [B, L] (mask 0/1, None = no padding) -> (hidden [B, L, D], pooled [B, D])."""
    length = ids.shape[-1]
    if length > self.config.max_position_embeddings:
      raise ValueError(f"text length {length} exceeds max_position_embeddings "
                       f"{self.config.max_position_embeddings}; truncate the input first")
    axes = ("batch", "length", "embed")
    x = self.token_embedding(ids) + self.position_embedding(jnp.arange(length))[None]
    x = constrain(x, axes)
    attend = layers.causal_mask(length)  # [1, 1, L, L]
    if mask is not None:
      attend = attend & layers.padding_mask(mask)  # [B, 1, L, L]
    for layer in self.layers:
      x = layer(x, attend, axes)
    hidden = self.final_layer_norm(x)  # [B, L, D]
    eos = self.config.eos_token_id
    if eos == LEGACY_EOS_TOKEN_ID:
      index = jnp.argmax(ids, axis=-1)  # HF's legacy rule: the highest id is EOT.
    else:
      # The first EOS (padding may reuse the EOS id); 0 if a row has none, as in HF.
      index = jnp.argmax(ids == eos, axis=-1)
    pooled = jnp.take_along_axis(hidden, index[:, None, None], axis=1)[:, 0]
    return hidden, pooled


VISION_AXES = ("batch", "patches", "embed")


class VisionTransformer(nnx.Module):
  """Patch embedding, class token, positions, pre-LN, pre-LN blocks, post-LN on the CLS."""

  def __init__(self, config: CLIPVisionConfig, *, dtype: Dtype = None,
               param_dtype=jnp.float32, rngs: nnx.Rngs):
    self.config = config
    common = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    d, p = config.hidden_size, config.patch_size
    # A stride-p convolution with a p x p kernel is one matmul per non-overlapping patch:
    # the kernel [p, p, C, D] is HF's Conv2d weight [D, C, p, p] transposed (hook CONV).
    self.patch_embedding = layers.Dense(
        (p, p, config.num_channels), d, ("patch_height", "patch_width", "channels", "embed"),
        use_bias=False, **common)
    self.class_embedding = nnx.Param(
        nnx.initializers.normal(stddev=d ** -0.5)(rngs.params(), (d,), param_dtype),
        out_sharding=("embed",))
    self.position_embedding = layers.Embed(config.num_patches + 1, d,
                                           axes=("positions", "embed"), **common)
    self.pre_layrnorm = layers.LayerNorm(d, eps=config.layer_norm_eps, **common)
    self.layers = _encoder_layers(config, **common)
    self.post_layernorm = layers.LayerNorm(d, eps=config.layer_norm_eps, **common)
    self.dtype = dtype

  def __call__(self, pixels: jax.Array) -> tuple[jax.Array, jax.Array]:
    """pixels [B, H, W, C] -> (hidden [B, 1 + N, D] before post-LN, pooled [B, D])."""
    x = self.blocks(self.embed(pixels))
    return x, self.post_layernorm(x[:, 0])

  def blocks(self, x: jax.Array, start: int = 0, stop: int | None = None) -> jax.Array:
    """Runs blocks [start, stop) on tokens [B, 1 + N, D] (a feature cache may stop early and
    a model that trains the top blocks run the rest)."""
    for layer in self.layers[start:stop]:
      x = layer(x, None, VISION_AXES)
    return x

  def embed(self, pixels: jax.Array) -> jax.Array:
    """pixels [B, H, W, C] -> the tokens entering the first block [B, 1 + N, D]."""
    config = self.config
    batch, height, width, channels = pixels.shape
    if (height, width, channels) != (config.image_size, config.image_size,
                                     config.num_channels):
      raise ValueError(f"pixels of shape {(height, width, channels)}; the model expects "
                       f"{(config.image_size, config.image_size, config.num_channels)} "
                       "(channels-last)")
    p, grid = config.patch_size, config.image_size // config.patch_size
    patches = pixels.reshape(batch, grid, p, grid, p, channels).transpose(0, 1, 3, 2, 4, 5)
    x = self.patch_embedding(patches.reshape(batch, grid * grid, p, p, channels))  # [B, N, D]
    cls = jnp.broadcast_to(self.class_embedding[...].astype(x.dtype), (batch, 1, x.shape[-1]))
    x = jnp.concatenate([cls, x], axis=1)
    x = x + self.position_embedding(jnp.arange(x.shape[1]))[None].astype(x.dtype)
    return constrain(self.pre_layrnorm(x), VISION_AXES)


class CLIPModel(nnx.Module):
  """HF CLIPModel's computation; parameter names follow HF's where the layout allows.

  Args:
    config: the model configuration.
    dtype: compute dtype (e.g. jnp.bfloat16); layer norms, softmax and the final
      normalisation/logits run in float32 regardless.
    param_dtype: parameter dtype (float32).
  """

  def __init__(self, config: CLIPConfig, *, dtype: Dtype = None, param_dtype=jnp.float32,
               rngs: nnx.Rngs):
    self.config = config
    common = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.text_model = TextTransformer(config.text, **common)
    self.vision_model = VisionTransformer(config.vision, **common)
    self.text_projection = layers.Dense(config.text.hidden_size, config.projection_dim,
                                        ("embed", "projection"), use_bias=False, **common)
    self.visual_projection = layers.Dense(config.vision.hidden_size, config.projection_dim,
                                          ("embed", "projection"), use_bias=False, **common)
    self.logit_scale = nnx.Param(jnp.asarray(config.logit_scale_init_value, param_dtype),
                                 out_sharding=())

  def text_features(self, ids: jax.Array, mask: jax.Array | None = None) -> TextFeatures:
    """ids, mask [B, L] -> hidden states, EOS-pooled state and projection."""
    hidden, pooled = self.text_model(ids, mask)
    return TextFeatures(hidden, pooled, self.text_projection(pooled))

  def image_features(self, pixels: jax.Array) -> ImageFeatures:
    """pixels [B, H, W, C] (normalised, channels-last) -> states, pooled CLS, projection."""
    hidden, pooled = self.vision_model(pixels)
    return ImageFeatures(hidden, pooled, self.visual_projection(pooled))

  def encode_text(self, ids: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """[B, P] unnormalised text embeddings (HF get_text_features)."""
    return self.text_features(ids, mask).embeds

  def encode_image(self, pixels: jax.Array) -> jax.Array:
    """[B, P] unnormalised image embeddings (HF get_image_features)."""
    return self.image_features(pixels).embeds

  def logits(self, text_embeds: jax.Array, image_embeds: jax.Array) -> CLIPOutput:
    """Scaled cosine similarities of unnormalised embeddings [T, P] and [I, P]."""
    text = _l2_normalise(text_embeds)
    image = _l2_normalise(image_embeds)
    per_text = text @ image.T * jnp.exp(self.logit_scale[...].astype(jnp.float32))
    return CLIPOutput(per_text, per_text.T, text, image)

  def __call__(self, ids: jax.Array, mask: jax.Array | None, pixels: jax.Array
               ) -> CLIPOutput:
    """Texts [T, L] against images [I, H, W, C], as HF CLIPModel.forward."""
    return self.logits(self.encode_text(ids, mask), self.encode_image(pixels))


def _l2_normalise(x: jax.Array) -> jax.Array:
  x = x.astype(jnp.float32)
  return x / jnp.linalg.norm(x, axis=-1, keepdims=True)
