import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mocheg_jax.models import layers
from tests import processes


def _rngs():
  return nnx.Rngs(params=0, dropout=1)


def test_dense_keeps_heads_explicit():
  dense = layers.Dense(6, (2, 3), ("embed", "heads", "kv"), rngs=_rngs())
  x = jax.random.normal(jax.random.key(0), (4, 5, 6))
  y = dense(x)
  assert y.shape == (4, 5, 2, 3)
  flat = x @ dense.kernel[...].reshape(6, 6) + dense.bias[...].reshape(6)
  np.testing.assert_allclose(y.reshape(4, 5, 6), flat, atol=1e-5)
  back = layers.Dense((2, 3), 6, ("heads", "kv", "embed"), rngs=_rngs())
  np.testing.assert_allclose(back(y), y.reshape(4, 5, 6) @ back.kernel[...].reshape(6, 6)
                             + back.bias[...], atol=1e-5)


def test_layer_norm_matches_numpy_and_computes_in_float32():
  ln = layers.LayerNorm(8, eps=1e-12, dtype=jnp.bfloat16, rngs=_rngs())
  x = np.random.default_rng(0).normal(size=(3, 8)).astype(np.float32) * 100 + 5
  expected = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-12)
  y = ln(jnp.asarray(x))
  assert y.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(y, np.float32), expected, atol=2e-2)


def _naive_attention(q, k, v, mask, keep=None, rate=0.0):
  logits = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
  logits = np.where(mask, logits, -1e30)
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  if keep is not None:
    probs = np.where(keep, probs / (1 - rate), 0.0)
  return np.einsum("bhqk,bkhd->bqhd", probs, v)


def test_attention_masks_padding_and_future():
  rng = np.random.default_rng(0)
  q, k, v = (rng.normal(size=(2, 5, 3, 4)).astype(np.float32) for _ in range(3))
  key_mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
  mask = np.asarray(layers.padding_mask(jnp.asarray(key_mask)) & layers.causal_mask(5))
  out = layers.dot_product_attention(q, k, v, mask=mask)
  np.testing.assert_allclose(out, _naive_attention(q, k, v, mask), atol=1e-5)
  # Changing a masked key must not change anything.
  k2 = k.copy()
  k2[0, 4] += 100
  np.testing.assert_allclose(layers.dot_product_attention(q, k2, v, mask=mask), out, atol=1e-6)
  # One query (the decoding path, written differently) gives the same row.
  last = layers.dot_product_attention(q[:, 4:], k, v, mask=mask[..., 4:, :])
  np.testing.assert_allclose(last, out[:, 4:], atol=1e-5)


def test_attention_dropout_drops_probabilities_and_rescales():
  rng = np.random.default_rng(1)
  q, k, v = (rng.normal(size=(2, 6, 3, 4)).astype(np.float32) for _ in range(3))
  mask = np.asarray(layers.causal_mask(6))
  key, rate = jax.random.key(3), 0.5
  out = layers.dot_product_attention(q, k, v, mask=mask, dropout_rate=rate, dropout_rng=key,
                                     deterministic=False)
  keep = np.asarray(jax.random.bernoulli(key, 1 - rate, (2, 3, 6, 6)))
  assert 0.3 < keep.mean() < 0.7
  np.testing.assert_allclose(out, _naive_attention(q, k, v, mask, keep, rate), atol=1e-5)
  # Deterministic calls ignore the rate.
  np.testing.assert_allclose(
      layers.dot_product_attention(q, k, v, mask=mask, dropout_rate=rate, dropout_rng=key),
      _naive_attention(q, k, v, mask), atol=1e-5)


def test_attention_in_bfloat16_keeps_float32_logits():
  rng = np.random.default_rng(2)
  q, k, v = (rng.normal(size=(2, 8, 2, 16)).astype(np.float32) for _ in range(3))
  mask = np.ones((1, 1, 8, 8), bool)
  out = layers.dot_product_attention(*(jnp.asarray(x, jnp.bfloat16) for x in (q, k, v)),
                                     mask=mask)
  assert out.dtype == jnp.bfloat16
  bf = lambda x: np.asarray(jnp.asarray(x, jnp.bfloat16), np.float32)
  np.testing.assert_allclose(np.asarray(out, np.float32),
                             _naive_attention(bf(q), bf(k), bf(v), mask), atol=3e-2)


def test_attention_module_cross_and_precomputed_kv():
  attn = layers.Attention(8, 2, kv_features=6, rngs=_rngs())
  x = jax.random.normal(jax.random.key(1), (2, 3, 8))
  memory = jax.random.normal(jax.random.key(2), (2, 7, 6))
  full = attn(x, memory)
  assert full.shape == (2, 3, 8)
  np.testing.assert_allclose(attn(x, kv=attn.project_kv(memory)), full, atol=1e-6)


def test_params_carry_logical_axes_and_map_to_a_mesh():
  mlp = layers.MLP(8, 16, "gelu", rngs=_rngs())
  state = nnx.state(mlp, nnx.Param)
  mesh = jax.make_mesh((2, 4), ("data", "tensor"))
  with nnx.logical_axis_rules([("embed", None), ("mlp", "tensor")]):
    shardings = nnx.get_named_sharding(state, mesh)
  assert shardings["fc1"]["kernel"].get_value().spec == jax.sharding.PartitionSpec(None, "tensor")
  assert shardings["fc2"]["kernel"].get_value().spec == jax.sharding.PartitionSpec("tensor", None)


def test_constrain_is_a_no_op_without_mesh_and_shards_with_one():
  x = jnp.ones((8, 4, 16))
  assert layers.constrain(x, ("batch", "length", "embed")) is x
  f = jax.jit(lambda a: layers.constrain(a * 2, ("batch", "length", "embed")))
  for axis_type in (jax.sharding.AxisType.Auto, jax.sharding.AxisType.Explicit):
    mesh = jax.make_mesh((8,), ("data",), axis_types=(axis_type,))
    with jax.set_mesh(mesh), nnx.logical_axis_rules([("batch", "data")]):
      y = f(x)
    expected = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data", None, None))
    assert y.sharding.is_equivalent_to(expected, x.ndim)
    np.testing.assert_array_equal(y, 2 * x)


def test_unknown_activation_is_named():
  with pytest.raises(ValueError, match="'swishy'"):
    layers.activation("swishy")


def test_gelu_is_torchs_erf_formula_with_its_gradient():
  import torch  # The test extra's; the parity reference.
  x = np.linspace(-12.0, 12.0, 20001, dtype=np.float32)
  gelu = layers.activation("gelu")
  ours, grad = jax.value_and_grad(lambda v: gelu(v).sum())(jnp.asarray(x))
  t = torch.tensor(x, requires_grad=True)
  reference = torch.nn.functional.gelu(t)  # approximate="none": the erf form.
  reference.sum().backward()
  # Float32 rounding: |gelu| <= 12 and erf's last bits; jax.nn.gelu's erfc form agrees as well.
  np.testing.assert_allclose(gelu(jnp.asarray(x)), reference.detach().numpy(), atol=2e-6)
  np.testing.assert_allclose(ours, reference.sum().item(), rtol=1e-5)
  np.testing.assert_allclose(grad, t.grad.numpy(), atol=1e-6)
  np.testing.assert_allclose(gelu(jnp.asarray(x)), jax.nn.gelu(jnp.asarray(x), approximate=False),
                             atol=2e-6)
  assert gelu(jnp.ones(3, jnp.bfloat16)).dtype == jnp.bfloat16


# The largest transpose fusion (operand count) in the compiled gradient of six tiny pre-LN CLIP
# blocks, with the blocks' own weight-gradient transposes and with the shape rule everywhere.
# Run where XLA compiles as a training run does (the suite's XLA_FLAGS change the fusions).
_PRE_LN_TRANSPOSES = """
import json, re
import jax, jax.numpy as jnp
from flax import nnx
from mocheg_jax.models import clip, layers

def largest_transpose_fusion():
  blocks = nnx.List([clip.EncoderLayer(32, 64, 2, "quick_gelu", 1e-5, dtype=None,
                                       param_dtype=jnp.float32, rngs=nnx.Rngs(i))
                     for i in range(6)])
  graph, params = nnx.split(blocks)
  def loss(params, x):
    for block in nnx.merge(graph, params):
      x = block(x, None, ("batch", "length", "embed"))
    return jnp.sum(x * x)
  hlo = jax.jit(jax.grad(loss)).lower(params, jnp.ones((4, 16, 32))).compile().as_text()
  fusions = [re.match(r"\\s*%?[\\w.\\-]*transpose[\\w.\\-]* = .*? fusion\\((.*?)\\), kind=", line)
             for line in hlo.splitlines()]
  return max(m.group(1).count("%") for m in fusions if m)

ours = largest_transpose_fusion()
layers.weight_grad_transposes = lambda pre_norm: ("smaller", "smaller")
print(json.dumps(dict(ours=ours, shape_rule=largest_transpose_fusion())))
"""


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU dot path")
def test_pre_ln_weight_gradients_do_not_recompute_the_residual_chain():
  env = {**processes.script_environment(), "XLA_FLAGS": ""}
  done = subprocess.run([sys.executable, "-c", _PRE_LN_TRANSPOSES], env=env,
                        capture_output=True, text=True, timeout=300, check=True)
  largest = json.loads(done.stdout.strip().splitlines()[-1])
  # Before matmul._materialised, the shape rule copied LN(x_0 + f_1 + ... + f_l) with the
  # whole chain fused into the transpose (93 operands); the block's choice copied nothing
  # wider than a few. Now every transposed operand is materialised first, so neither rule
  # fuses more than the transpose's own input into it.
  assert largest["ours"] <= 8, largest
  assert largest["shape_rule"] <= 8, largest
