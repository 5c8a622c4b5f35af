"""The stance model with the top blocks of CLIP's vision tower trained too (beyond the paper).

The reference keeps CLIP frozen, and so does the default here. With
`verify.tune_vision_layers = k` the feature store caches the vision tokens (class token
included) that enter the tower's last k blocks, and `TunedVisionStance` runs those k blocks
(initialised from the CLIP, then trained with the stance model's loss) before the stance
detector reads the patch states, exactly where the frozen path reads them: without the class
token and before the post-layernorm. The claim's colour or count words are then compared
with image states the task itself shapes, instead of with states trained only to retrieve
images.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from mocheg_jax.models import clip
from mocheg_jax.verification import stance

Dtype = Any


class VisionTop(nnx.Module):
  """`num_layers` CLIP vision blocks: tokens [..., 1 + P, Dv] -> patch states [..., P, Dv]."""

  def __init__(self, vision: clip.CLIPVisionConfig, num_layers: int, *, dtype: Dtype = None,
               param_dtype=jnp.float32, rngs: nnx.Rngs):
    if not 0 < num_layers <= vision.num_hidden_layers:
      raise ValueError(f"tune_vision_layers must be in [1, {vision.num_hidden_layers}] (the "
                       f"CLIP's vision blocks), got {num_layers}")
    self.layers = nnx.List([
        clip.EncoderLayer(vision.hidden_size, vision.intermediate_size,
                          vision.num_attention_heads, vision.hidden_act,
                          vision.layer_norm_eps, dtype=dtype, param_dtype=param_dtype,
                          rngs=rngs)
        for _ in range(num_layers)])

  def __call__(self, tokens: jax.Array) -> jax.Array:
    lead, (length, width) = tokens.shape[:-2], tokens.shape[-2:]
    x = tokens.reshape(-1, length, width).astype(jnp.float32)
    for layer in self.layers:
      x = layer(x, None, clip.VISION_AXES)
    return x[:, 1:].reshape(*lead, length - 1, width)  # The class token is not a patch.


class TunedVisionStance(nnx.Module):
  """`VisionTop` in front of a `stance.StanceDetector`; called like the detector, with image
  tokens [B, Ni, 1 + P, Dv] from a store built with `image_blocks`."""

  def __init__(self, config: stance.StanceConfig, vision: clip.CLIPVisionConfig,
               num_layers: int, *, dtype: Dtype = None, param_dtype=jnp.float32,
               rngs: nnx.Rngs):
    if not config.use_image:
      raise ValueError("tune_vision_layers needs use_image=True")
    self.vision_top = VisionTop(vision, num_layers, dtype=dtype, param_dtype=param_dtype,
                                rngs=rngs)
    self.stance = stance.StanceDetector(config, dtype=dtype, param_dtype=param_dtype,
                                        rngs=rngs)

  def __call__(self, claim: jax.Array, claim_mask: jax.Array,
               text: jax.Array | None = None, text_mask: jax.Array | None = None,
               image: jax.Array | None = None, image_mask: jax.Array | None = None,
               **inputs) -> jax.Array:
    """`inputs`: the detector's other inputs and options, passed on as they are."""
    if image is None or image.ndim != 4:
      raise ValueError("image must be class token + patch tokens [B, Ni, 1 + P, Dv], got "
                       f"{None if image is None else tuple(image.shape)}")
    if image_mask is not None and image_mask.ndim != 2:
      raise ValueError("tuned vision blocks take item presence image_mask [B, Ni], got "
                       f"shape {tuple(image_mask.shape)}")
    return self.stance(claim, claim_mask, text, text_mask, self.vision_top(image), image_mask,
                       **inputs)


def initial_params(frozen: clip.CLIPModel, num_layers: int) -> dict:
  """The CLIP's last `num_layers` vision blocks as `TunedVisionStance` parameters."""
  blocks = frozen.vision_model.layers
  first = len(blocks) - num_layers
  return {"vision_top": {"layers": {
      i: nnx.to_pure_dict(nnx.state(blocks[first + i], nnx.Param))
      for i in range(num_layers)}}}
