import jax
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


# ---- load_into_abstract: abstract build, import, materialise the rest ------------------------
class ToyWithDropout(Toy):
  def __init__(self, rngs):
    super().__init__(rngs)
    self.dropout = nnx.Dropout(0.5, rngs=rngs)  # Forks its own RNG stream (key + count).

  def __call__(self, x, deterministic=True):
    return self.head(self.dropout(x, deterministic=deterministic))


def _counting_factory(calls):
  def factory():
    calls.append(1)
    return ToyWithDropout(nnx.Rngs(params=3, dropout=4))
  return factory


def _abstract_leaves(model):
  return [path for path, v in nnx.iter_graph(model) if isinstance(v, nnx.Variable)
          and isinstance(v.get_value(), jax.ShapeDtypeStruct)]


def test_load_into_abstract_gives_a_new_head_its_concrete_initial_values():
  calls = []
  state = {k: v for k, v in _hf_state().items() if not k.startswith("classifier")}
  model = convert.load_into_abstract(_counting_factory(calls), state, RULES,
                                     dont_load=r"^head\.", seed=7)
  assert not _abstract_leaves(model)
  assert len(calls) == 2  # Once abstractly, once (jitted) for the head.
  # An eager build draws the same numbers; XLA's fused init may round the last bit.
  concrete = ToyWithDropout(nnx.Rngs(params=3, dropout=4))
  np.testing.assert_allclose(model.head.kernel[...], concrete.head.kernel[...], rtol=1e-6)
  np.testing.assert_allclose(model.head.bias[...], concrete.head.bias[...], rtol=1e-6)
  assert np.abs(np.asarray(model.head.kernel[...])).sum() > 0
  # Loaded weights are the checkpoint's, not the initialiser's.
  x = np.random.default_rng(1).normal(size=(1, 3, 4)).astype(np.float32)
  q = np.asarray(model.blocks[1].query(x)).reshape(1, 3, 4)
  np.testing.assert_allclose(q, x @ state["layer.1.q.weight"].T + state["layer.1.q.bias"],
                             atol=1e-5)
  # The dropout stream is concrete and usable; dropout acts only when asked.
  run = nnx.jit(lambda m, x, d: m(x, deterministic=d), static_argnums=2)
  assert not np.allclose(run(model, x, False), run(model, x, True))


def test_load_into_abstract_compiles_nothing_when_the_checkpoint_has_every_parameter():
  calls = []
  model = convert.load_into_abstract(_counting_factory(calls), _hf_state(),
                                     lambda m: RULES if isinstance(m, Toy) else [],
                                     source="ckpt/", seed=7)
  assert len(calls) == 1  # Only the abstract build: RNG state needs no jitted init.
  assert not _abstract_leaves(model)
  np.testing.assert_array_equal(model.head.bias[...], _hf_state()["classifier.bias"])
  keys = [v.get_value() for _, v in nnx.iter_graph(model) if isinstance(v, nnx.RngKey)]
  assert keys and all(jax.dtypes.issubdtype(k.dtype, jax.dtypes.prng_key) for k in keys)
  again = convert.load_into_abstract(_counting_factory([]), _hf_state(), RULES, seed=7)
  other = convert.load_into_abstract(_counting_factory([]), _hf_state(), RULES, seed=8)
  key_data = lambda m: [np.asarray(jax.random.key_data(v.get_value()))  # noqa: E731
                        for _, v in nnx.iter_graph(m) if isinstance(v, nnx.RngKey)]
  for a, b in zip(key_data(model), key_data(again)):
    np.testing.assert_array_equal(a, b)  # Reproducible from the seed,
  assert not all(np.array_equal(a, b) for a, b in zip(key_data(model), key_data(other)))
  state = _hf_state()
  del state["layer.0.k.bias"]
  with pytest.raises(MochegInputError, match=r"^ckpt/: missing weights \['layer.0.k.bias'\]"):
    convert.load_into_abstract(_counting_factory([]), state, RULES, source="ckpt/")
