"""BERT parity with transformers (PyTorch): tiny random checkpoints, import, export, errors."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from safetensors.numpy import load_file, save_file

from mocheg_jax.data.report import MochegInputError
from mocheg_jax.models import bert
from mocheg_jax.models.hf import bert as hf_bert

ATOL = 1e-4
TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=48, max_position_embeddings=64, type_vocab_size=2,
            hidden_act="gelu", layer_norm_eps=1e-12)


def _call(model, ids, mask, types=None, deterministic=True):
  # Eager on purpose: op-by-op executables are cached across models of the same shapes, so
  # the whole file compiles less than one jitted program per model would.
  return model(ids, mask, types, deterministic=deterministic)


def _hf_model(cls=transformers.BertModel, seed=0, **overrides):
  torch.manual_seed(seed)
  model = cls(transformers.BertConfig(**{**TINY, **overrides}))
  return model.eval()


def _save_hf(model, folder):
  model.save_pretrained(folder, safe_serialization=True)
  return folder


def _inputs(seed=0, batch=4, length=11):
  rng = np.random.default_rng(seed)
  ids = rng.integers(1, TINY["vocab_size"], (batch, length)).astype(np.int32)
  mask = np.ones((batch, length), np.int32)
  for row, real in enumerate([length, 7, 3, 1][:batch]):  # Ragged right padding.
    mask[row, real:] = 0
  ids = np.where(mask == 1, ids, 0)
  types = np.zeros_like(ids)
  types[:, 5:] = 1  # A second segment, as in a cross-encoder pair.
  return ids, mask, types * mask


def _torch_out(model, ids, mask, types=None):
  with torch.no_grad():
    return model(input_ids=torch.tensor(ids, dtype=torch.long),
                 attention_mask=torch.tensor(mask, dtype=torch.long),
                 token_type_ids=None if types is None else torch.tensor(types, dtype=torch.long))


@pytest.mark.parametrize("padded", [True, False])
def test_bert_model_hidden_states_and_pooler_match(tmp_path, padded):
  reference = _hf_model()
  ours = hf_bert.load(_save_hf(reference, tmp_path))
  assert isinstance(ours, bert.BertModel)
  ids, mask, types = _inputs()
  if not padded:
    mask, types = np.ones_like(mask), None
  hidden, pooled = _call(ours, ids, mask, types)
  expected = _torch_out(reference, ids, mask, types)
  assert hidden.shape == (4, 11, 32) and hidden.dtype == jnp.float32
  real = mask.astype(bool)  # Padded positions are compared too, through np.where below.
  np.testing.assert_allclose(np.where(real[..., None], hidden, 0),
                             np.where(real[..., None], expected.last_hidden_state, 0), atol=ATOL)
  np.testing.assert_allclose(hidden, expected.last_hidden_state.numpy(), atol=ATOL)
  np.testing.assert_allclose(pooled, expected.pooler_output.numpy(), atol=ATOL)


@pytest.mark.parametrize("num_labels", [1, 3])
def test_sequence_classification_logits_match(tmp_path, num_labels):
  reference = _hf_model(transformers.BertForSequenceClassification, seed=num_labels,
                        num_labels=num_labels)
  ours = hf_bert.load(_save_hf(reference, tmp_path))
  assert isinstance(ours, bert.CrossEncoder if num_labels == 1 else bert.SequenceClassifier)
  ids, mask, types = _inputs(seed=num_labels)
  logits = np.asarray(_call(ours, ids, mask, types))
  expected = _torch_out(reference, ids, mask, types).logits.numpy()
  np.testing.assert_allclose(logits.reshape(expected.shape), expected, atol=ATOL)
  if num_labels == 1:
    assert logits.shape == (4,)  # One score per pair.


def test_sentence_encoder_pooling_matches_hf_hidden_states(tmp_path):
  reference = _hf_model()
  folder = _save_hf(reference, tmp_path)
  ids, mask, _ = _inputs()
  hidden = _torch_out(reference, ids, mask).last_hidden_state.numpy()
  m = mask[..., None].astype(np.float32)
  mean = (hidden * m).sum(1) / m.sum(1)
  for pooling, normalize, expected in [("mean", False, mean), ("cls", False, hidden[:, 0]),
                                       ("mean", True,
                                        mean / np.linalg.norm(mean, axis=1, keepdims=True))]:
    encoder = hf_bert.load(folder, head="sentence", pooling=pooling, normalize=normalize)
    np.testing.assert_allclose(_call(encoder, ids, mask), expected, atol=ATOL)


def _round_trip(ours, reference, out_dir, hf_cls, inputs):
  hf_bert.save(ours, out_dir)
  reloaded = hf_cls.from_pretrained(out_dir).eval()
  first, second = _torch_out(reference, *inputs), _torch_out(reloaded, *inputs)
  for key in first.keys():
    np.testing.assert_allclose(second[key].numpy(), first[key].numpy(), atol=1e-6)
  return reloaded


def test_export_round_trips_through_transformers(tmp_path):
  inputs = _inputs(seed=3)
  base = _hf_model(seed=3)
  folder = _save_hf(base, tmp_path / "base")
  for head in ("model", "sentence"):  # Both export as a BertModel folder.
    ours = hf_bert.load(folder, head=head)
    _round_trip(ours, base, tmp_path / f"export_{head}", transformers.BertModel, inputs)
  for num_labels in (1, 3):
    reference = _hf_model(transformers.BertForSequenceClassification, seed=4,
                          num_labels=num_labels)
    ours = hf_bert.load(_save_hf(reference, tmp_path / f"cls{num_labels}"))
    out = tmp_path / f"export_cls{num_labels}"
    _round_trip(ours, reference, out, transformers.BertForSequenceClassification, inputs)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"]
    assert len(config["id2label"]) == num_labels
    again = hf_bert.load(out)  # And back into ours.
    np.testing.assert_allclose(_call(again, *inputs), _call(ours, *inputs), atol=1e-6)


def test_mlp_head_is_new_by_request_and_saved_beside_the_encoder(tmp_path):
  reference = _hf_model(seed=5)
  folder = _save_hf(reference, tmp_path / "base")
  with pytest.raises(MochegInputError, match="no classifier weights.*dont_load"):
    hf_bert.load(folder, head="mlp_classifier")
  ours = hf_bert.load(folder, head="mlp_classifier", dont_load=r"^classifier\.", seed=1)
  assert isinstance(ours, bert.SequenceClassifier) and ours.head == "mlp"
  sizes = [fc.kernel.get_value().shape for fc in ours.classifier.fcs]
  assert sizes == [(32, 128), (128, 16), (16, 3)]
  assert float(jnp.abs(ours.classifier.fcs[0].kernel[...]).sum()) > 0  # Initialised.
  ids, mask, types = _inputs(seed=5)
  logits = _call(ours, ids, mask, types)
  assert logits.shape == (4, 3)
  # Dropout (0.3 in the head, 0.1 in the encoder) acts only when asked.
  train = nnx.jit(lambda m: m(ids, mask, types, deterministic=False))(ours)
  assert not np.allclose(train, logits)
  np.testing.assert_array_equal(_call(ours, ids, mask, types), logits)

  out = tmp_path / "export_mlp"
  hf_bert.save(ours, out)
  assert (out / hf_bert.HEAD_FILE).is_file()
  assert set(load_file(out / hf_bert.HEAD_FILE)) == {
      f"classifier.fcs.{j}.{p}" for j in range(3) for p in ("weight", "bias")}
  # transformers loads the encoder part with identical hidden states...
  _round_trip(ours, reference, out, transformers.BertModel, (ids, mask, types))
  # ...and our loader restores the whole classifier.
  again = hf_bert.load(out)
  assert isinstance(again, bert.SequenceClassifier) and again.head == "mlp"
  np.testing.assert_allclose(_call(again, ids, mask, types), logits, atol=1e-6)


def test_masked_lm_checkpoint_loads_without_pooler_and_heads(tmp_path):
  # bert-base-uncased style: pre-training heads ("cls.*") and no pooler in BertForMaskedLM.
  reference = _hf_model(transformers.BertForMaskedLM, seed=6)
  ours = hf_bert.load(_save_hf(reference, tmp_path))
  ids, mask, types = _inputs(seed=6)
  hidden, pooled = _call(ours, ids, mask, types)
  assert pooled is None
  with torch.no_grad():
    expected = reference.bert(input_ids=torch.tensor(ids, dtype=torch.long),
                              attention_mask=torch.tensor(mask, dtype=torch.long),
                              token_type_ids=torch.tensor(types, dtype=torch.long))
  np.testing.assert_allclose(hidden, expected.last_hidden_state.numpy(), atol=ATOL)


def test_bad_folders_name_the_file_and_parameter(tmp_path):
  folder = _save_hf(_hf_model(seed=7), tmp_path / "good")
  config = json.loads((folder / "config.json").read_text())
  state = load_file(folder / "model.safetensors")

  no_weights = tmp_path / "no_weights"
  no_weights.mkdir()
  (no_weights / "config.json").write_text(json.dumps(config))
  with pytest.raises(MochegInputError, match=f"{no_weights}: no weights found"):
    hf_bert.load(no_weights)

  for field, value, expect in [("model_type", "roberta", "model_type 'roberta'"),
                               ("position_embedding_type", "relative_key",
                                "position_embedding_type 'relative_key'"),
                               ("hidden_act", "swish", "hidden_act 'swish'")]:
    bad = tmp_path / f"bad_{field}"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({**config, field: value}))
    save_file(state, bad / "model.safetensors")
    with pytest.raises(MochegInputError, match=f"{bad / 'config.json'}: {expect}"):
      hf_bert.load(bad)

  key = "encoder.layer.1.intermediate.dense.weight"
  shaped = tmp_path / "bad_shape"
  shaped.mkdir()
  (shaped / "config.json").write_text(json.dumps(config))
  save_file({**state, key: np.zeros((40, 32), np.float32)}, shaped / "model.safetensors")
  with pytest.raises(MochegInputError) as e:
    hf_bert.load(shaped)
  message = str(e.value)
  assert str(shaped / "model.safetensors") in message
  assert f"{key} (40, 32) -> encoder.layers.1.mlp.fc1.kernel (32, 48)" in message

  partial = tmp_path / "partial"
  partial.mkdir()
  (partial / "config.json").write_text(json.dumps(config))
  del state["encoder.layer.0.attention.self.key.bias"]
  save_file({**state, "encoder.layer.9.extra": np.zeros(3, np.float32)},
            partial / "model.safetensors")
  with pytest.raises(MochegInputError) as e:
    hf_bert.load(partial)
  assert "missing weights ['encoder.layer.0.attention.self.key.bias']" in str(e.value)
  assert "unexpected weights ['encoder.layer.9.extra']" in str(e.value)


def test_config_round_trips_through_hf():
  config = bert.BertConfig(**TINY)
  assert bert.BertConfig.from_hf(transformers.BertConfig(**config.to_hf()).to_dict()) == config


def test_bf16_compute_runs_close_to_float32(tmp_path):
  folder = _save_hf(_hf_model(seed=8), tmp_path)
  f32 = hf_bert.load(folder, head="sentence")
  bf16 = hf_bert.load(folder, head="sentence", dtype=jnp.bfloat16)
  assert bf16.bert.encoder.layers[0].mlp.fc1.kernel.get_value().dtype == jnp.float32
  ids, mask, _ = _inputs(seed=8)
  hidden, _ = _call(bf16.bert, ids, mask)
  assert hidden.dtype == jnp.bfloat16
  a, b = np.asarray(_call(f32, ids, mask)), np.asarray(_call(bf16, ids, mask))
  assert b.dtype == np.float32 and np.isfinite(b).all()
  np.testing.assert_allclose(b, a, atol=0.1)
  cosine = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
  assert cosine.min() > 0.99


def test_sharded_forward_matches_one_device(tmp_path):
  model = hf_bert.load(_save_hf(_hf_model(seed=9, num_hidden_layers=1), tmp_path),
                       head="sentence")
  ids, mask, types = _inputs(seed=9, batch=4)
  ids, mask, types = (np.concatenate([x, x]) for x in (ids, mask, types))  # Batch of 8.
  expected = _call(model, ids, mask, types)
  mesh = jax.make_mesh((2, 4), ("data", "tensor"),
                       axis_types=(jax.sharding.AxisType.Auto,) * 2)
  # Every logical name needs a rule (None: replicated), including BERT's own ones.
  rules = [("batch", "data"), ("heads", "tensor"), ("mlp", "tensor"), ("vocab", None),
           ("embed", None), ("kv", None), ("length", None), ("position", None),
           ("token_type", None), ("pooler", None)]
  graphdef, state = nnx.split(model)
  with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
    shardings = nnx.get_named_sharding(state, mesh)
    state = jax.device_put(state, shardings)
    forward = jax.jit(lambda s, *a: nnx.merge(graphdef, s)(*a))
    out = forward(state, ids, mask, types)
  fc1 = state["bert"]["encoder"]["layers"][0]["mlp"]["fc1"]["kernel"].get_value()
  assert fc1.sharding.spec == jax.sharding.PartitionSpec(None, "tensor")
  np.testing.assert_allclose(out, expected, atol=1e-5)
