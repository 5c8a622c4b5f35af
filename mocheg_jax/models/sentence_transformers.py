"""Sentence-transformers folders (SBERT, all-MiniLM-L6-v2) and fast batched text encoding.

`load(folder)` reads a sentence-transformers folder:
* modules.json: a Transformer module (its path, "" or a subfolder, holds the HF BERT folder
  and sentence_bert_config.json), then a Pooling module (its config.json gives the mode:
  mean or CLS), then optionally Normalize (L2 normalisation). Any other module (Dense,
  LayerNorm, ...) is an error naming modules.json and the module.
* sentence_bert_config.json: max_seq_length and do_lower_case.
A plain HF folder (no modules.json) works too: mean pooling, no normalisation, and
max_seq_length = min(tokenizer.model_max_length, max_position_embeddings).

`encode_texts` batches texts with mocheg_jax.models.encoding's core: pads them to a few
bucketed shapes (so jit compiles a handful of programs), dispatches every batch of a chunk
before reading any result back (so tokenising the next chunk overlaps the computation) and
returns float32 rows in input order. Truncation is explicit: `max_length` tokens (special
tokens included), cut on the right or on the left.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mocheg_jax.data.report import MochegInputError
from mocheg_jax.data.tokenizers import load_tokenizer
from mocheg_jax.models import bert, encoding
from mocheg_jax.models.hf import bert as hf_bert

MODULES_FILE = "modules.json"
ST_CONFIG_FILE = "sentence_bert_config.json"
# Legacy boolean pooling keys of Pooling/config.json and the mode each turns on.
_LEGACY_POOLING = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}


@dataclasses.dataclass
class SentenceModel:
  """A loaded sentence encoder: the model, its tokenizer and its truncation length."""
  encoder: bert.SentenceEncoder
  tokenizer: object  # transformers.PreTrainedTokenizerFast
  max_seq_length: int
  do_lower_case: bool = False  # Already applied to the tokenizer's normalizer.

  def encode(self, texts: Sequence[str], batch_size: int = 64,
             truncation_side: str = "right") -> np.ndarray:
    return encode_texts(self.encoder, self.tokenizer, texts, batch_size=batch_size,
                        max_length=self.max_seq_length, truncation_side=truncation_side)


# ---- reading the folder -------------------------------------------------------------------
def _read_json(path: pathlib.Path) -> object:
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except json.JSONDecodeError as e:
    raise MochegInputError(f"{path}: not valid JSON ({e})") from e


def _pooling_mode(path: pathlib.Path) -> str:
  """"mean" or "cls" from a Pooling module's config.json (legacy or current keys)."""
  config_path = path / "config.json"
  if not config_path.is_file():
    raise MochegInputError(f"{config_path}: missing file (Pooling module config)")
  config = _read_json(config_path)
  if not isinstance(config, dict):
    raise MochegInputError(f"{config_path}: expected a JSON object")
  if "pooling_mode" in config:
    modes = config["pooling_mode"]
    modes = [modes] if isinstance(modes, str) else list(modes)
    field = "pooling_mode"
  else:
    modes = [mode for key, mode in _LEGACY_POOLING.items() if config.get(key)]
    modes = modes or ["mean"]  # sentence-transformers' default.
    field = "pooling_mode_* fields"
  if len(modes) != 1 or modes[0] not in bert.POOLING_MODES:
    raise MochegInputError(f"{config_path}: {field} selects {modes}; only one of "
                           f"{list(bert.POOLING_MODES)} is supported")
  return modes[0]


def _module_kind(entry: object, modules_path: pathlib.Path, index: int) -> tuple[str, str]:
  if not isinstance(entry, dict) or "type" not in entry:
    raise MochegInputError(f"{modules_path}: entry {index} has no 'type'")
  kind = str(entry["type"]).rsplit(".", 1)[-1]
  if kind not in ("Transformer", "Pooling", "Normalize"):
    raise MochegInputError(f"{modules_path}: module {index} of type {entry['type']!r} is not "
                           "supported (only Transformer, Pooling and Normalize)")
  return kind, str(entry.get("path", ""))


def read_structure(folder: str | os.PathLike) -> dict:
  """What modules.json describes: transformer path, pooling mode, normalisation.

  Returns:
    {"transformer": Path, "pooling": "mean" | "cls", "normalize": bool}; for a plain HF
    folder (no modules.json) the folder itself, "mean" and False.
  """
  folder = pathlib.Path(folder)
  if not folder.is_dir():
    raise MochegInputError(f"{folder}: not a folder")
  modules_path = folder / MODULES_FILE
  if not modules_path.is_file():
    return {"transformer": folder, "pooling": "mean", "normalize": False}
  modules = _read_json(modules_path)
  if not isinstance(modules, list) or not modules:
    raise MochegInputError(f"{modules_path}: expected a non-empty list of modules")
  kinds = [_module_kind(m, modules_path, i) for i, m in enumerate(modules)]
  names = [k for k, _ in kinds]
  if names[0] != "Transformer" or names.count("Transformer") != 1:
    raise MochegInputError(f"{modules_path}: expected one Transformer module first, "
                           f"found {names}")
  if names.count("Pooling") != 1 or names[1] != "Pooling":
    raise MochegInputError(f"{modules_path}: expected one Pooling module after the "
                           f"Transformer, found {names}")
  if names.count("Normalize") > 1 or ("Normalize" in names and names[-1] != "Normalize"):
    raise MochegInputError(f"{modules_path}: Normalize must come last, found {names}")
  return {"transformer": folder / kinds[0][1],
          "pooling": _pooling_mode(folder / kinds[1][1]),
          "normalize": "Normalize" in names}


def _lowercase_tokenizer(tokenizer) -> None:
  """Lower-cases in the tokenizer's normalizer, as sentence-transformers' do_lower_case."""
  from tokenizers import normalizers
  backend = tokenizer.backend_tokenizer
  current = backend.normalizer
  backend.normalizer = normalizers.Sequence(
      [normalizers.Lowercase()] + ([current] if current is not None else []))


def load(folder: str | os.PathLike, *, dtype=jnp.float32, seed: int = 0) -> SentenceModel:
  """Loads a sentence-transformers folder (or a plain HF BERT folder) as a SentenceModel.

  Raises:
    MochegInputError: unsupported modules or pooling, missing files, bad weights.
  """
  structure = read_structure(folder)
  path = structure["transformer"]
  st_config: dict = {}
  st_config_path = path / ST_CONFIG_FILE
  if st_config_path.is_file():
    st_config = _read_json(st_config_path)
    if not isinstance(st_config, dict):
      raise MochegInputError(f"{st_config_path}: expected a JSON object")
  encoder = hf_bert.load(path, head="sentence", pooling=structure["pooling"],
                         normalize=structure["normalize"], dtype=dtype, seed=seed)
  tokenizer = load_tokenizer(path)
  positions = encoder.config.max_position_embeddings
  max_seq_length = st_config.get("max_seq_length")
  if max_seq_length is None:
    max_seq_length = min(int(tokenizer.model_max_length), positions)
  if not isinstance(max_seq_length, int) or not 2 <= max_seq_length <= positions:
    raise MochegInputError(f"{st_config_path}: max_seq_length {max_seq_length!r} must be an "
                           f"integer in [2, {positions}] (max_position_embeddings)")
  tokenizer.model_max_length = max_seq_length
  do_lower_case = bool(st_config.get("do_lower_case", False))
  if do_lower_case:
    _lowercase_tokenizer(tokenizer)
  return SentenceModel(encoder, tokenizer, max_seq_length, do_lower_case)


def save(model: SentenceModel, folder: str | os.PathLike) -> None:
  """Writes a sentence-transformers folder (HF BERT folder at the root, 1_Pooling,
  2_Normalize when normalising) that both `load` and sentence-transformers read."""
  folder = pathlib.Path(folder)
  hf_bert.save(model.encoder, folder, tokenizer=model.tokenizer)
  modules = [{"idx": 0, "name": "0", "path": "",
              "type": "sentence_transformers.models.Transformer"},
             {"idx": 1, "name": "1", "path": "1_Pooling",
              "type": "sentence_transformers.models.Pooling"}]
  pooling = {"word_embedding_dimension": model.encoder.config.hidden_size}
  pooling.update({key: model.encoder.pooling == mode for key, mode in _LEGACY_POOLING.items()})
  (folder / "1_Pooling").mkdir(parents=True, exist_ok=True)
  (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling, indent=2))
  if model.encoder.normalize:
    (folder / "2_Normalize").mkdir(exist_ok=True)
    modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                    "type": "sentence_transformers.models.Normalize"})
  (folder / MODULES_FILE).write_text(json.dumps(modules, indent=2))
  (folder / ST_CONFIG_FILE).write_text(json.dumps(
      {"max_seq_length": model.max_seq_length, "do_lower_case": model.do_lower_case},
      indent=2))


# ---- encoding -----------------------------------------------------------------------------
length_buckets = encoding.length_buckets  # Kept here for callers of this module.


@functools.lru_cache(maxsize=16)
def _forward(graphdef: nnx.GraphDef):
  """One jitted program per model structure (jit itself caches one per input shape)."""

  @jax.jit
  def forward(state, input_ids, attention_mask):
    encoder = nnx.merge(graphdef, state)
    return encoder(input_ids, attention_mask)

  return forward


def encode_texts(encoder: bert.SentenceEncoder, tokenizer, texts: Sequence[str],
                 batch_size: int = 64, max_length: int | None = None, *,
                 truncation_side: str = "right", chunk_batches: int = 32) -> np.ndarray:
  """Embeds texts with a SentenceEncoder: float32 [N, D], rows in input order.

  Batching as in `encoding.run_text_encoder` (bucketed shapes, dispatch-ahead).

  Args:
    encoder: the SentenceEncoder (its pooling and normalisation apply).
    tokenizer: its fast tokenizer.
    texts: strings; empty strings are fine (they embed "[CLS] [SEP]").
    batch_size: the most rows per forward pass.
    max_length: tokens per text after truncation, special tokens included; None:
      min(tokenizer.model_max_length, max_position_embeddings).
    truncation_side: "right" keeps the beginning of long texts, "left" keeps the end.
    chunk_batches: texts are tokenised and length-sorted `batch_size * chunk_batches` at a
      time, which bounds host memory and overlaps tokenising with computing.

  Returns:
    A float32 array [len(texts), hidden_size].
  """
  positions = encoder.config.max_position_embeddings
  if max_length is None:
    max_length = min(int(tokenizer.model_max_length), positions)
  if not 2 <= max_length <= positions:
    raise ValueError(f"max_length {max_length} must be in [2, {positions}]")
  graphdef, state = nnx.split(encoder)
  forward = _forward(graphdef)
  return encoding.run_text_encoder(
      lambda ids, mask: forward(state, ids, mask), tokenizer, texts,
      width=encoder.config.hidden_size, max_length=max_length, batch_size=batch_size,
      truncation_side=truncation_side, chunk_batches=chunk_batches)
