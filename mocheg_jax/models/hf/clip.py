"""CLIP weights: the table between our CLIPModel and HF's CLIPModel, load and save.

The HF keys are those of transformers' CLIPModel (`text_model.*`, `vision_model.*`,
`text_projection`, `visual_projection`, `logit_scale`); the non-persistent `position_ids`
buffers that old checkpoints still contain are ignored.
"""

from __future__ import annotations

import os

import jax.numpy as jnp
from flax import nnx

from mocheg_jax.models import clip
from mocheg_jax.models.hf import convert
from mocheg_jax.models.hf.convert import CONV, HEADS_BIAS, IDENTITY, LINEAR, LINEAR_HEADS_IN, Rule

# Buffers, not parameters (HF recomputes them).
IGNORE = (r"(^|\.)position_ids$",)


def _block_rules(ours: str, hf: str) -> list[Rule]:
  """One pre-LN encoder block; `{i}` is the layer index."""
  rules = []
  for name, hf_name in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj")):
    rules += [Rule(f"{ours}.attention.{name}.kernel", f"{hf}.self_attn.{hf_name}.weight", LINEAR),
              Rule(f"{ours}.attention.{name}.bias", f"{hf}.self_attn.{hf_name}.bias",
                   HEADS_BIAS)]
  rules += [
      Rule(f"{ours}.attention.out.kernel", f"{hf}.self_attn.out_proj.weight", LINEAR_HEADS_IN),
      Rule(f"{ours}.attention.out.bias", f"{hf}.self_attn.out_proj.bias"),
      Rule(f"{ours}.mlp.fc1.kernel", f"{hf}.mlp.fc1.weight", LINEAR),
      Rule(f"{ours}.mlp.fc1.bias", f"{hf}.mlp.fc1.bias"),
      Rule(f"{ours}.mlp.fc2.kernel", f"{hf}.mlp.fc2.weight", LINEAR),
      Rule(f"{ours}.mlp.fc2.bias", f"{hf}.mlp.fc2.bias"),
  ]
  for norm in ("layer_norm1", "layer_norm2"):
    rules += [Rule(f"{ours}.{norm}.scale", f"{hf}.{norm}.weight"),
              Rule(f"{ours}.{norm}.bias", f"{hf}.{norm}.bias")]
  return rules


def _norm(ours: str, hf: str) -> list[Rule]:
  return [Rule(f"{ours}.scale", f"{hf}.weight"), Rule(f"{ours}.bias", f"{hf}.bias")]


def rules(config: clip.CLIPConfig) -> list[Rule]:
  """The full table for `config` (layer indices expanded)."""
  text = [
      Rule("text_model.token_embedding.embedding",
           "text_model.embeddings.token_embedding.weight"),
      Rule("text_model.position_embedding.embedding",
           "text_model.embeddings.position_embedding.weight"),
      *_norm("text_model.final_layer_norm", "text_model.final_layer_norm"),
      *_block_rules("text_model.layers.{t}", "text_model.encoder.layers.{t}"),
  ]
  vision = [
      Rule("vision_model.patch_embedding.kernel",
           "vision_model.embeddings.patch_embedding.weight", CONV),
      Rule("vision_model.class_embedding", "vision_model.embeddings.class_embedding"),
      Rule("vision_model.position_embedding.embedding",
           "vision_model.embeddings.position_embedding.weight"),
      *_norm("vision_model.pre_layrnorm", "vision_model.pre_layrnorm"),
      *_norm("vision_model.post_layernorm", "vision_model.post_layernorm"),
      *_block_rules("vision_model.layers.{v}", "vision_model.encoder.layers.{v}"),
  ]
  heads = [
      Rule("text_projection.kernel", "text_projection.weight", LINEAR),
      Rule("visual_projection.kernel", "visual_projection.weight", LINEAR),
      Rule("logit_scale", "logit_scale", IDENTITY),
  ]
  return convert.expand(text + vision + heads, {"t": config.text.num_hidden_layers,
                                                "v": config.vision.num_hidden_layers})


def load(folder: str | os.PathLike, *, dtype=jnp.float32, param_dtype=jnp.float32,
         dont_load: str | None = None, seed: int = 0) -> clip.CLIPModel:
  """Reads an HF CLIPModel folder (config.json + model.safetensors or pytorch_model.bin).

  Args:
    folder: the checkpoint folder.
    dtype: compute dtype (jnp.bfloat16 for speed); parameters stay `param_dtype`.
    param_dtype: parameter dtype.
    dont_load: regex of our parameter paths to keep freshly initialised (with `seed`).
    seed: initialisation seed for the parameters `dont_load` keeps.

  Raises:
    MochegInputError: naming the file and the field or parameter that is unusable.
  """
  folder = os.fspath(folder)
  config = clip.CLIPConfig.from_hf(convert.read_config(folder),
                                   source=os.path.join(folder, "config.json"))
  state = convert.read_state_dict(folder)
  build = lambda: clip.CLIPModel(config, dtype=dtype, param_dtype=param_dtype,  # noqa: E731
                                 rngs=nnx.Rngs(seed))
  return convert.load_into_abstract(build, state, rules(config), source=folder,
                                    dont_load=dont_load, ignore=IGNORE, seed=seed)


def save(model: clip.CLIPModel, folder: str | os.PathLike) -> None:
  """Writes an HF folder (config.json + model.safetensors) that CLIPModel.from_pretrained loads."""
  state = convert.export_weights(model, rules(model.config))
  convert.write_hf_folder(folder, state, model.config.to_hf())
