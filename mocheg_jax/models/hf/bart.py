"""BART weights: our `Bart` <-> transformers' BartForConditionalGeneration, as a table."""

from __future__ import annotations

import json
import os
import re

import jax.numpy as jnp
import numpy as np
from flax import nnx

from mocheg_jax.data.report import MochegInputError
from mocheg_jax.models import bart
from mocheg_jax.models.hf import convert
from mocheg_jax.models.hf.convert import HEADS_BIAS, IDENTITY, LINEAR, LINEAR_HEADS_IN, Rule

# HF keeps final_logits_bias as [1, vocab]; ours is [vocab].
ROW = convert.Hook("row", lambda x, shape: x.reshape(shape), lambda x: x.reshape(1, -1))

# Keys of old checkpoints that are not parameters (fairseq version buffers).
IGNORE = (r"^model\.(encoder|decoder)\.version$",)
GENERATION_CONFIG = "generation_config.json"


def _attention(ours: str, hf: str) -> list[Rule]:
  rules = []
  for mine, theirs in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj")):
    rules.append(Rule(f"{ours}.{mine}.kernel", f"{hf}.{theirs}.weight", LINEAR))
    rules.append(Rule(f"{ours}.{mine}.bias", f"{hf}.{theirs}.bias", HEADS_BIAS))
  rules.append(Rule(f"{ours}.out.kernel", f"{hf}.out_proj.weight", LINEAR_HEADS_IN))
  rules.append(Rule(f"{ours}.out.bias", f"{hf}.out_proj.bias"))
  return rules


def _layer_norm(ours: str, hf: str) -> list[Rule]:
  return [Rule(f"{ours}.scale", f"{hf}.weight"), Rule(f"{ours}.bias", f"{hf}.bias")]


def _feed_forward(ours: str, hf: str) -> list[Rule]:
  return [Rule(f"{ours}.mlp.fc1.kernel", f"{hf}.fc1.weight", LINEAR),
          Rule(f"{ours}.mlp.fc1.bias", f"{hf}.fc1.bias"),
          Rule(f"{ours}.mlp.fc2.kernel", f"{hf}.fc2.weight", LINEAR),
          Rule(f"{ours}.mlp.fc2.bias", f"{hf}.fc2.bias")]


def rules(config: bart.BartConfig) -> list[Rule]:
  """The expanded table for `config` (layer counts)."""
  table = [
      # One shared table: HF 5 saves model.shared.weight only, older checkpoints also the
      # tied copies, which must then be the same tensor (import reads the first present).
      Rule("shared.embedding", "model.shared.weight", IDENTITY,
           aliases=("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight",
                    "lm_head.weight")),
      Rule("final_logits_bias", "final_logits_bias", ROW),
  ]
  for side in ("encoder", "decoder"):
    table.append(Rule(f"{side}.embed_positions.embedding", f"model.{side}.embed_positions.weight"))
    table += _layer_norm(f"{side}.layernorm_embedding", f"model.{side}.layernorm_embedding")
  enc, dec = "encoder.layers.{e}", "model.encoder.layers.{e}"
  table += _attention(f"{enc}.self_attn", f"{dec}.self_attn")
  table += _layer_norm(f"{enc}.self_attn_layer_norm", f"{dec}.self_attn_layer_norm")
  table += _feed_forward(enc, dec)
  table += _layer_norm(f"{enc}.final_layer_norm", f"{dec}.final_layer_norm")
  ours, hf = "decoder.layers.{d}", "model.decoder.layers.{d}"
  for name in ("self_attn", "encoder_attn"):
    table += _attention(f"{ours}.{name}", f"{hf}.{name}")
    table += _layer_norm(f"{ours}.{name}_layer_norm", f"{hf}.{name}_layer_norm")
  table += _feed_forward(ours, hf)
  table += _layer_norm(f"{ours}.final_layer_norm", f"{hf}.final_layer_norm")
  if config.normalize_before:  # The pre-LN stacks' last LayerNorm, as mBART names it.
    for side in ("encoder", "decoder"):
      table += _layer_norm(f"{side}.layer_norm", f"model.{side}.layer_norm")
  return convert.expand(table, {"e": config.encoder_layers, "d": config.decoder_layers})


def read_configs(folder: str | os.PathLike) -> bart.BartConfig:
  """BartConfig from config.json plus generation_config.json when the folder has one."""
  config = convert.read_config(folder)
  generation = None
  path = os.path.join(os.fspath(folder), GENERATION_CONFIG)
  if os.path.isfile(path):
    try:
      with open(path) as f:
        generation = json.load(f)
    except (OSError, ValueError) as e:
      raise MochegInputError(f"{path}: unreadable ({e})") from None
  try:
    return bart.BartConfig.from_hf(config, generation)
  except MochegInputError as e:
    raise MochegInputError(f"{os.fspath(folder)}/{e}") from None
  except TypeError as e:  # A field of the wrong type (e.g. a string layer count).
    raise MochegInputError(f"{os.fspath(folder)}/config.json: {e}") from None


def _check_tied(state: dict[str, np.ndarray], source: str) -> None:
  """Tied copies in old checkpoints must hold the same table, or the model is not BART's."""
  keys = [k for k in ("model.shared.weight", "model.encoder.embed_tokens.weight",
                      "model.decoder.embed_tokens.weight", "lm_head.weight") if k in state]
  for key in keys[1:]:
    if state[key].shape != state[keys[0]].shape or not np.array_equal(state[key],
                                                                        state[keys[0]]):
      raise MochegInputError(f"{source}: {key} differs from {keys[0]}; untied embeddings "
                             "are not supported")


def load(folder: str | os.PathLike, *, dtype=jnp.float32, dont_load: str | None = None,
         seed: int = 0) -> bart.Bart:
  """A `Bart` with the weights of an HF folder (config.json + safetensors / .bin).

  Built abstractly (`convert.load_into_abstract`): no random initialisation of weights the
  checkpoint then overwrites (seconds for bart-large).

  Args:
    folder: an HF BartForConditionalGeneration folder.
    dtype: the compute dtype (parameters stay float32).
    dont_load: regex of our parameter paths to keep freshly initialised.
    seed: initialisation seed (for `dont_load` parameters and dropout).
  """
  source = os.fspath(folder)
  config = read_configs(folder)
  state = dict(convert.read_state_dict(folder))
  _check_tied(state, source)
  # HF lists final_logits_bias as optional (zeros) when a checkpoint lacks it.
  if "final_logits_bias" not in state and not (dont_load and re.search(dont_load,
                                                                       "final_logits_bias")):
    state["final_logits_bias"] = np.zeros((1, config.vocab_size), np.float32)
  compute_dtype = None if dtype == jnp.float32 else dtype
  factory = lambda: bart.Bart(config, dtype=compute_dtype,  # noqa: E731
                              rngs=nnx.Rngs(params=seed, dropout=seed + 1))
  return convert.load_into_abstract(factory, state, rules(config), source=source,
                                    dont_load=dont_load, ignore=IGNORE, seed=seed)


def save(model: bart.Bart, folder: str | os.PathLike) -> None:
  """Writes model.safetensors, config.json and generation_config.json for transformers."""
  state = convert.export_weights(model, rules(model.config))
  convert.write_hf_folder(folder, state, model.config.to_hf())
  with open(os.path.join(os.fspath(folder), GENERATION_CONFIG), "w") as f:
    json.dump(model.config.generation_hf(), f, indent=2, sort_keys=True)
