"""BERT/MiniLM weights: our NNX parameter paths <-> HF BertModel / BertForSequenceClassification.

Checkpoints of `BertModel` (keys "embeddings.*", "encoder.*", "pooler.*") and of `BertFor*`
classes (the same keys under "bert.", plus heads) both load: a "bert." prefix is stripped,
the `embeddings.position_ids` / `embeddings.token_type_ids` buffers are ignored, and so are
the pre-training heads "cls.*" of BertForPreTraining / BertForMaskedLM checkpoints (such as
bert-base-uncased), as transformers does when it loads those into a BertModel.

What `save` writes, per model:
* BertModel, SentenceEncoder: a BertModel folder (transformers' BertModel loads it with
  identical hidden states; pooling/normalisation are not part of an HF BertModel, see
  mocheg_jax.models.sentence_transformers.save for a sentence-transformers folder).
* CrossEncoder, SequenceClassifier(head="linear"): a BertForSequenceClassification folder
  (num_labels 1 / N, id2label from `label_names`), identical logits in transformers.
* SequenceClassifier(head="mlp"): the Mocheg MLP head has no HF class, so the encoder is
  saved as a BertModel folder and the head goes into an extra file, `mocheg_head.safetensors`
  (torch Linear layout, keys "classifier.fcs.{j}.weight|bias"), described by a "mocheg_head"
  entry in config.json. transformers loads the encoder and ignores both; our `load` restores
  the whole classifier.
"""

from __future__ import annotations

import os
import re
from typing import Callable

import jax.numpy as jnp
import numpy as np
from flax import nnx

from mocheg_jax.data.report import MochegInputError
from mocheg_jax.models import bert
from mocheg_jax.models.hf import convert
from mocheg_jax.models.hf.convert import HEADS_BIAS, IDENTITY, LINEAR, LINEAR_HEADS_IN, Rule

HEAD_FILE = "mocheg_head.safetensors"
HEAD_CONFIG_KEY = "mocheg_head"
# Kinds of model `load` builds.
HEADS = ("model", "sentence", "cross_encoder", "classifier", "mlp_classifier")
# Checkpoint keys that are not parameters of ours (buffers, pre-training heads).
IGNORED_KEYS = (r"^embeddings\.position_ids$", r"^embeddings\.token_type_ids$", r"^cls\.")
HF_PREFIX = "bert."
_CLASSIFIERS = ("cross_encoder", "classifier", "mlp_classifier")

BertLike = (bert.BertModel | bert.SentenceEncoder | bert.CrossEncoder
            | bert.SequenceClassifier)


def _layer_norm(ours: str, hf: str) -> list[Rule]:
  # Checkpoints converted from TensorFlow may still call them gamma/beta.
  return [Rule(f"{ours}.scale", f"{hf}.weight", aliases=(f"{hf}.gamma",)),
          Rule(f"{ours}.bias", f"{hf}.bias", aliases=(f"{hf}.beta",))]


def encoder_rules(config: bert.BertConfig, *, pooler: bool = True,
                  prefix: str = "") -> list[Rule]:
  """The BertModel table; `prefix` is our path to the BertModel ("bert." inside a head)."""
  layer = "encoder.layer.{i}"
  ours = "encoder.layers.{i}"
  table = [
      Rule("embeddings.word.embedding", "embeddings.word_embeddings.weight"),
      Rule("embeddings.position.embedding", "embeddings.position_embeddings.weight"),
      Rule("embeddings.token_type.embedding", "embeddings.token_type_embeddings.weight"),
      *_layer_norm("embeddings.norm", "embeddings.LayerNorm"),
  ]
  for name in ("query", "key", "value"):
    table += [Rule(f"{ours}.attention.{name}.kernel", f"{layer}.attention.self.{name}.weight",
                   LINEAR),
              Rule(f"{ours}.attention.{name}.bias", f"{layer}.attention.self.{name}.bias",
                   HEADS_BIAS)]
  table += [
      Rule(f"{ours}.attention.out.kernel", f"{layer}.attention.output.dense.weight",
           LINEAR_HEADS_IN),
      Rule(f"{ours}.attention.out.bias", f"{layer}.attention.output.dense.bias", IDENTITY),
      *_layer_norm(f"{ours}.attention_norm", f"{layer}.attention.output.LayerNorm"),
      Rule(f"{ours}.mlp.fc1.kernel", f"{layer}.intermediate.dense.weight", LINEAR),
      Rule(f"{ours}.mlp.fc1.bias", f"{layer}.intermediate.dense.bias"),
      Rule(f"{ours}.mlp.fc2.kernel", f"{layer}.output.dense.weight", LINEAR),
      Rule(f"{ours}.mlp.fc2.bias", f"{layer}.output.dense.bias"),
      *_layer_norm(f"{ours}.mlp_norm", f"{layer}.output.LayerNorm"),
  ]
  if pooler:
    table += [Rule("pooler.kernel", "pooler.dense.weight", LINEAR),
              Rule("pooler.bias", "pooler.dense.bias")]
  table = convert.expand(table, config.num_hidden_layers)
  return [Rule(prefix + r.ours, r.hf, r.hook, r.aliases) for r in table]


def head_rules(model: nnx.Module) -> list[Rule]:
  """The classifier's rules (HF keys as in BertForSequenceClassification / our head file)."""
  if isinstance(model, bert.CrossEncoder) or (
      isinstance(model, bert.SequenceClassifier) and model.head == "linear"):
    return [Rule("classifier.kernel", "classifier.weight", LINEAR),
            Rule("classifier.bias", "classifier.bias")]
  if isinstance(model, bert.SequenceClassifier):
    out = []
    for j in range(len(model.classifier.fcs)):
      out += [Rule(f"classifier.fcs.{j}.kernel", f"classifier.fcs.{j}.weight", LINEAR),
              Rule(f"classifier.fcs.{j}.bias", f"classifier.fcs.{j}.bias")]
    return out
  return []


def _bert_of(model: BertLike) -> bert.BertModel:
  return model if isinstance(model, bert.BertModel) else model.bert


def rules(model: BertLike) -> list[Rule]:
  """The whole table of `model` (encoder, pooler if it has one, and head)."""
  inner = _bert_of(model)
  prefix = "" if isinstance(model, bert.BertModel) else "bert."
  return (encoder_rules(inner.config, pooler=inner.pooler is not None, prefix=prefix)
          + head_rules(model))


def _label_names(config: dict, num_labels: int) -> tuple[str, ...] | None:
  id2label = config.get("id2label")
  if not isinstance(id2label, dict) or len(id2label) != num_labels:
    return None
  try:
    return tuple(str(id2label[k]) for k in sorted(id2label, key=int))
  except (TypeError, ValueError):
    return None


def _num_labels(config: dict) -> int:
  if isinstance(config.get("id2label"), dict) and config["id2label"]:
    return len(config["id2label"])
  return int(config.get("num_labels", 2))


def _infer_head(folder: str, config: dict) -> str:
  if os.path.isfile(os.path.join(folder, HEAD_FILE)) or HEAD_CONFIG_KEY in config:
    return "mlp_classifier"
  if "BertForSequenceClassification" in (config.get("architectures") or ()):
    return "cross_encoder" if _num_labels(config) == 1 else "classifier"
  return "model"


def _weights_file(folder: str) -> str:
  """The weights file that read_state_dict reads, to name in errors."""
  for name in (convert.ORBAX_DIR, *convert.WEIGHT_FILES):
    if os.path.exists(os.path.join(folder, name)):
      return os.path.join(folder, name)
  return folder


def _strip_prefix(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  return {k[len(HF_PREFIX):] if k.startswith(HF_PREFIX) else k: v for k, v in state.items()}


def load(folder: str | os.PathLike, *, head: str | None = None, num_labels: int | None = None,
         pooling: str = "mean", normalize: bool = False, dtype=jnp.float32,
         dont_load: str | None = None, seed: int = 0) -> BertLike:
  """Builds a BERT model from an HF folder (config.json + weights) and loads its weights.

  Args:
    folder: an HF folder: config.json and model.safetensors (sharded too) or
      pytorch_model.bin; for an MLP classifier also mocheg_head.safetensors.
    head: what to build: "model" (BertModel), "sentence" (SentenceEncoder), "cross_encoder",
      "classifier" (linear head) or "mlp_classifier" (the Mocheg head). None infers it: a
      saved MLP head -> "mlp_classifier", BertForSequenceClassification -> "cross_encoder"
      with one label, else "classifier"; anything else -> "model".
    num_labels: classifier labels; None takes them from config.json (id2label / num_labels,
      or the mocheg_head entry), falling back to 3 for a new head.
    pooling, normalize: the SentenceEncoder's pooling ("mean" / "cls") and L2 normalisation.
    dtype: compute dtype (parameters stay float32).
    dont_load: regex of our parameter paths to leave freshly initialised, e.g.
      r"^classifier\\." to put a new head on a BertModel checkpoint.
    seed: initialisation seed (for `dont_load` parameters and dropout).

  Raises:
    MochegInputError: missing config.json or weights, an unsupported config, or weights that
      are missing, unexpected or of the wrong shape (named with the file and key).
  """
  folder = os.fspath(folder)
  config_path = os.path.join(folder, "config.json")
  raw = convert.read_config(folder)
  config = bert.BertConfig.from_hf(raw, source=config_path)
  head = head or _infer_head(folder, raw)
  if head not in HEADS:
    raise ValueError(f"unknown head {head!r}; expected one of {HEADS}")
  state = _strip_prefix(convert.read_state_dict(folder))
  source = _weights_file(folder)
  head_file = os.path.join(folder, HEAD_FILE)
  if head == "mlp_classifier" and os.path.isfile(head_file):
    from safetensors.numpy import load_file
    state.update(load_file(head_file))
    source = f"{source} + {HEAD_FILE}"

  has_classifier = any(k.startswith("classifier.") for k in state)
  new_head = bool(dont_load) and any(
      re.search(dont_load, p) for p in ("classifier.kernel", "classifier.fcs.0.kernel"))
  if head in _CLASSIFIERS and not has_classifier and not new_head:
    where = head_file if head == "mlp_classifier" else folder
    raise MochegInputError(f"{where}: no classifier weights for head {head!r}; pass "
                           r"dont_load=r'^classifier\.' to start a new head")
  factory = _factory(head, config, raw, state, num_labels=num_labels, pooling=pooling,
                     normalize=normalize, dtype=dtype, seed=seed)
  ignore = list(IGNORED_KEYS)
  if head in ("model", "sentence"):
    # A BertModel may be loaded from a classifier checkpoint, as in transformers.
    ignore.append(r"^classifier\.")
  return convert.load_into_abstract(factory, state, rules, source=source, dont_load=dont_load,
                                    ignore=ignore, seed=seed)


def _factory(head: str, config: bert.BertConfig, raw: dict, state: dict[str, np.ndarray], *,
             num_labels: int | None, pooling: str, normalize: bool, dtype,
             seed: int) -> Callable[[], BertLike]:
  """A function that builds the model `load` asked for (called abstractly, and concretely
  for parameters that are not loaded)."""
  kw = dict(dtype=dtype)
  rngs = lambda: nnx.Rngs(params=seed, dropout=seed + 1)  # noqa: E731
  if head in ("model", "sentence"):
    pooler = "pooler.dense.weight" in state
    if head == "model":
      return lambda: bert.BertModel(config, add_pooler=pooler, rngs=rngs(), **kw)
    return lambda: bert.SentenceEncoder(config, pooling=pooling, normalize=normalize,
                                        add_pooler=pooler, rngs=rngs(), **kw)
  if head == "cross_encoder":
    return lambda: bert.CrossEncoder(config, rngs=rngs(), **kw)
  if head == "classifier":
    if num_labels is None:
      weight = state.get("classifier.weight")
      num_labels = int(weight.shape[0]) if weight is not None and weight.ndim == 2 else (
          _num_labels(raw) if "id2label" in raw or "num_labels" in raw else 3)
    names = _label_names(raw, num_labels)
    return lambda: bert.SequenceClassifier(config, num_labels, head="linear",
                                           label_names=names, rngs=rngs(), **kw)
  head_config = raw.get(HEAD_CONFIG_KEY) or {}
  if num_labels is None:
    num_labels = int(head_config.get("num_labels", 3))
  names = head_config.get("label_names")
  names = tuple(names) if names and len(names) == num_labels else None
  sizes = tuple(int(n) for n in head_config.get("sizes", bert.MLP_HEAD_SIZES))
  rate = float(head_config.get("dropout", bert.MLP_HEAD_DROPOUT))
  return lambda: bert.SequenceClassifier(config, num_labels, head="mlp", label_names=names,
                                         mlp_sizes=sizes, mlp_dropout=rate, rngs=rngs(), **kw)


def hf_config(model: BertLike) -> dict:
  """config.json for `model`'s export (BertModel or BertForSequenceClassification)."""
  out = _bert_of(model).config.to_hf()
  num_labels = None
  if isinstance(model, bert.CrossEncoder):
    num_labels, names = 1, None
  elif isinstance(model, bert.SequenceClassifier):
    num_labels, names = model.num_labels, model.label_names
  if num_labels is None:
    return out
  names = names or tuple(f"LABEL_{i}" for i in range(num_labels))
  labels = dict(id2label={str(i): n for i, n in enumerate(names)},
                label2id={n: i for i, n in enumerate(names)})
  if isinstance(model, bert.SequenceClassifier) and model.head == "mlp":
    fcs = model.classifier.fcs
    out[HEAD_CONFIG_KEY] = dict(
        type="mlp", num_labels=num_labels, label_names=list(names),
        sizes=[int(fc.out_shape[0]) for fc in list(fcs)[:-1]],
        dropout=float(model.classifier.dropout.rate))
    return out
  out.update(architectures=["BertForSequenceClassification"], **labels)
  return out


def export_state(model: BertLike) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
  """(model.safetensors tensors, head-file tensors) in HF naming."""
  inner = _bert_of(model)
  prefix = "" if isinstance(model, bert.BertModel) else "bert."
  encoder = convert.export_weights(
      model, encoder_rules(inner.config, pooler=inner.pooler is not None, prefix=prefix))
  head = convert.export_weights(model, head_rules(model))
  if isinstance(model, bert.SequenceClassifier) and model.head == "mlp":
    return encoder, head
  if head:  # BertForSequenceClassification keeps the encoder under "bert.".
    return {HF_PREFIX + k: v for k, v in encoder.items()} | head, {}
  return encoder, {}


def save(model: BertLike, folder: str | os.PathLike, tokenizer=None) -> None:
  """Writes an HF folder that transformers loads (see the module docstring for each model).

  Args:
    model: a BertModel, SentenceEncoder, CrossEncoder or SequenceClassifier.
    folder: created if needed; existing files of the same names are overwritten.
    tokenizer: optionally a transformers tokenizer to save beside the weights.
  """
  folder = os.fspath(folder)
  state, head_state = export_state(model)
  convert.write_hf_folder(folder, state, hf_config(model))
  head_file = os.path.join(folder, HEAD_FILE)
  if head_state:
    from safetensors.numpy import save_file
    save_file({k: np.ascontiguousarray(v) for k, v in head_state.items()}, head_file,
              metadata={"format": "pt"})
  elif os.path.isfile(head_file):
    os.remove(head_file)  # A stale head would turn the folder into an MLP classifier.
  if tokenizer is not None:
    tokenizer.save_pretrained(folder)

