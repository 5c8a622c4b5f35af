import numpy as np
import pytest
from flax import nnx

from mocheg_jax.data.report import MochegInputError
from mocheg_jax.models import layers
from mocheg_jax.models.hf import convert


class Toy(nnx.Module):
  def __init__(self, rngs):
    self.blocks = nnx.List([layers.Attention(4, 2, rngs=rngs) for _ in range(2)])
    self.head = layers.Dense(4, 3, ("embed", "classes"), rngs=rngs)


RULES = convert.expand([
    convert.Rule("blocks.{i}.query.kernel", "layer.{i}.q.weight", convert.LINEAR),
    convert.Rule("blocks.{i}.query.bias", "layer.{i}.q.bias", convert.HEADS_BIAS),
    convert.Rule("blocks.{i}.key.kernel", "layer.{i}.k.weight", convert.LINEAR),
    convert.Rule("blocks.{i}.key.bias", "layer.{i}.k.bias", convert.HEADS_BIAS),
    convert.Rule("blocks.{i}.value.kernel", "layer.{i}.v.weight", convert.LINEAR),
    convert.Rule("blocks.{i}.value.bias", "layer.{i}.v.bias", convert.HEADS_BIAS),
    convert.Rule("blocks.{i}.out.kernel", "layer.{i}.o.weight", convert.LINEAR_HEADS_IN),
    convert.Rule("blocks.{i}.out.bias", "layer.{i}.o.bias"),
    convert.Rule("head.kernel", "classifier.weight", convert.LINEAR),
    convert.Rule("head.bias", "classifier.bias"),
], 2)


def _hf_state(seed=0):
  rng = np.random.default_rng(seed)
  state = {}
  for i in range(2):
    for name in "qkvo":
      state[f"layer.{i}.{name}.weight"] = rng.normal(size=(4, 4)).astype(np.float32)
      state[f"layer.{i}.{name}.bias"] = rng.normal(size=(4,)).astype(np.float32)
  state["classifier.weight"] = rng.normal(size=(3, 4)).astype(np.float32)
  state["classifier.bias"] = rng.normal(size=(3,)).astype(np.float32)
  return state


def test_hooks_are_exact_inverses():
  x = np.arange(2 * 3 * 4 * 5, dtype=np.float32)
  for hook, hf_shape, ours in [(convert.LINEAR, (6, 5), (5, 2, 3)),
                               (convert.LINEAR_HEADS_IN, (5, 6), (2, 3, 5)),
                               (convert.CONV, (4, 3, 2, 5), (2, 5, 3, 4)),
                               (convert.HEADS_BIAS, (6,), (2, 3))]:
    tensor = x[:np.prod(hf_shape)].reshape(hf_shape)
    np.testing.assert_array_equal(hook.to_hf(hook.to_ours(tensor, ours)), tensor)


def test_import_matches_torch_semantics_and_round_trips():
  model = Toy(nnx.Rngs(0))
  state = _hf_state()
  convert.import_weights(model, state, RULES)
  x = np.random.default_rng(1).normal(size=(1, 3, 4)).astype(np.float32)
  # The q projection must equal torch's x @ W.T + b.
  q = model.blocks[0].query(x).reshape(1, 3, 4)
  np.testing.assert_allclose(q, x @ state["layer.0.q.weight"].T + state["layer.0.q.bias"],
                             atol=1e-5)
  exported = convert.export_weights(model, RULES)
  assert exported.keys() == state.keys()
  for k in state:
    np.testing.assert_array_equal(exported[k], state[k])


def test_errors_name_missing_unexpected_and_mismatched():
  model = Toy(nnx.Rngs(0))
  state = _hf_state()
  del state["layer.1.v.bias"]
  state["pooler.dense.weight"] = np.zeros((4, 4), np.float32)
  state["classifier.weight"] = np.zeros((5, 4), np.float32)
  with pytest.raises(MochegInputError) as e:
    convert.import_weights(model, state, RULES, source="ckpt/")
  message = str(e.value)
  assert message.startswith("ckpt/: ")
  assert "missing weights ['layer.1.v.bias']" in message
  assert "unexpected weights ['pooler.dense.weight']" in message
  assert "classifier.weight (5, 4) -> head.kernel (4, 3)" in message


def test_dont_load_keeps_new_heads_and_prefixes_are_stripped():
  model = Toy(nnx.Rngs(0))
  before = np.asarray(model.head.kernel[...]).copy()
  state = {f"bert.{k}": v for k, v in _hf_state().items() if not k.startswith("classifier")}
  convert.import_weights(model, state, RULES, dont_load=r"^head\.", prefixes=("bert.",))
  np.testing.assert_array_equal(model.head.kernel[...], before)
  with pytest.raises(MochegInputError, match="no conversion rule"):
    convert.import_weights(model, state, RULES[:-2], prefixes=("bert.",))


def test_checkpoint_folder_errors(tmp_path):
  with pytest.raises(MochegInputError, match="no weights found"):
    convert.read_state_dict(tmp_path)
  with pytest.raises(MochegInputError, match="config.json: missing file"):
    convert.read_config(tmp_path)
  convert.write_hf_folder(tmp_path, _hf_state(), {"model_type": "toy"})
  assert convert.read_state_dict(tmp_path).keys() == _hf_state().keys()
  assert convert.read_config(tmp_path) == {"model_type": "toy"}
