"""mocheg_jax.utils.flops: matmul FLOPs counted in the jaxpr, against counts done by hand."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from mocheg_jax.models import bert
from mocheg_jax.utils import flops


def test_dense_forward_and_backward():
  x, w = jnp.ones((8, 16, 32)), jnp.ones((32, 64))
  forward = 2 * 8 * 16 * 32 * 64
  assert flops.matmul_flops(lambda x, w: x @ w, x, w) == forward
  # The gradients of both operands are one product each, the size of the forward.
  grads = jax.grad(lambda x, w: jnp.sum(x @ w), argnums=(0, 1))
  assert flops.matmul_flops(grads, x, w) == 3 * forward


def test_batched_dot_general_and_einsum():
  q, k = jnp.ones((2, 4, 10, 8)), jnp.ones((2, 4, 12, 8))  # [B, H, L, D] x [B, H, S, D]
  assert flops.matmul_flops(lambda q, k: jnp.einsum("bhld,bhsd->bhls", q, k), q, k) == \
      2 * 2 * 4 * 10 * 12 * 8


def test_convolution_with_groups():
  x = jnp.ones((2, 16, 16, 6))  # NHWC
  w = jnp.ones((3, 3, 3, 12))  # HWIO, feature groups 2: each output sees 3 of 6 inputs.
  conv = lambda x, w: jax.lax.conv_general_dilated(  # noqa: E731
      x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=2)
  assert flops.matmul_flops(conv, x, w) == 2 * (2 * 16 * 16 * 12) * (3 * 3 * 3)


def test_nested_jit_scan_and_cond():
  w = jnp.ones((4, 4))

  @jax.jit
  def inner(x):
    return x @ w

  def scanned(x):
    return jax.lax.scan(lambda c, _: (inner(c), None), x, None, length=5)[0]

  x = jnp.ones((3, 4))
  assert flops.matmul_flops(scanned, x) == 5 * 2 * 3 * 4 * 4
  # A cond counts its costliest branch.
  branchy = lambda p, x: jax.lax.cond(p, lambda x: (x @ w) @ w, lambda x: x, x)  # noqa: E731
  assert flops.matmul_flops(branchy, True, x) == 2 * (2 * 3 * 4 * 4)


def test_while_loop_is_refused():
  loop = lambda x: jax.lax.while_loop(lambda c: c.sum() < 10, lambda c: c @ c, x)  # noqa: E731
  with pytest.raises(ValueError, match="while loop"):
    flops.matmul_flops(loop, jnp.eye(2))


def test_bert_training_step_is_six_times_parameters_times_tokens_plus_attention():
  """The textbook count of a transformer encoder's step: 6 N T for the dense layers plus
  12 L T S d for attention's two products (forward 4 L T S d, backward twice that)."""
  d, ffn, layers, length, batch = 64, 256, 2, 16, 4
  config = bert.BertConfig(vocab_size=128, hidden_size=d, num_hidden_layers=layers,
                           num_attention_heads=4, intermediate_size=ffn,
                           max_position_embeddings=32)
  model = bert.SentenceEncoder(config, add_pooler=False, rngs=nnx.Rngs(0))
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  ids = jnp.asarray(np.random.default_rng(0).integers(1, 128, (batch, length)), jnp.int32)
  mask = jnp.ones_like(ids)

  def loss(params):
    return jnp.sum(nnx.merge(graphdef, params, rest)(ids, mask) ** 2)

  dense = layers * (4 * d * d + 2 * d * ffn)  # Weights of the matrix products.
  tokens = batch * length
  # The first layer's input gradient flows into the embeddings, a gather: no product to
  # count there is missing, so the backward is exactly twice the forward.
  expected = 6 * dense * tokens + 12 * layers * tokens * length * d
  assert flops.matmul_flops(jax.grad(loss), params) == expected
