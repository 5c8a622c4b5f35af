"""$MOCHEG_JAX_ATTENTION: the opt-in cuDNN path of layers.dot_product_attention.

There is no GPU here, so these check the dispatch: when cuDNN is asked for, with what mask,
and that every case it cannot take falls back to the XLA path with identical results.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mocheg_jax.models import layers


def _qkv(dtype=jnp.bfloat16, batch=2, length=8, heads=2, dim=16):
  keys = jax.random.split(jax.random.key(0), 3)
  return [jax.random.normal(k, (batch, length, heads, dim), dtype) for k in keys]


def _padding_mask(batch=2, length=8):
  lengths = jnp.asarray([length, length // 2])[:batch]
  return layers.padding_mask((jnp.arange(length)[None] < lengths[:, None]).astype(jnp.int32))


@pytest.mark.parametrize("value, expected", [(None, "xla"), ("", "xla"), ("xla", "xla"),
                                             ("cudnn", "cudnn"), (" CUDNN ", "cudnn")])
def test_setting(monkeypatch, value, expected):
  if value is None:
    monkeypatch.delenv(layers.ATTENTION_VARIABLE, raising=False)
  else:
    monkeypatch.setenv(layers.ATTENTION_VARIABLE, value)
  assert layers.attention_implementation() == expected


def test_unknown_setting_names_the_variable(monkeypatch):
  monkeypatch.setenv(layers.ATTENTION_VARIABLE, "flash")
  with pytest.raises(ValueError, match=r"\$MOCHEG_JAX_ATTENTION='flash'.*xla, cudnn"):
    layers.dot_product_attention(*_qkv())


@pytest.fixture
def cudnn_calls(monkeypatch):
  """Pretend to be on a GPU; record each cuDNN request, then refuse it as cuDNN would
  where it is absent, so the XLA path must answer."""
  calls = []
  original = jax.nn.dot_product_attention

  def spy(q, k, v, *args, implementation=None, mask=None, **kwargs):
    if implementation == "cudnn":
      calls.append(dict(dtype=q.dtype, mask_shape=None if mask is None else mask.shape))
      raise RuntimeError("cuDNN is not detected.")
    return original(q, k, v, *args, implementation=implementation, mask=mask, **kwargs)

  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  monkeypatch.setattr(jax.nn, "dot_product_attention", spy)
  monkeypatch.setenv(layers.ATTENTION_VARIABLE, "cudnn")
  return calls


def test_cudnn_is_asked_with_a_full_size_mask_and_falls_back_unchanged(cudnn_calls,
                                                                       monkeypatch):
  q, k, v = _qkv()
  mask = _padding_mask()  # [B, 1, 1, K]
  out = layers.dot_product_attention(q, k, v, mask=mask)
  assert cudnn_calls == [dict(dtype=jnp.bfloat16, mask_shape=(2, 1, 8, 8))]
  monkeypatch.setenv(layers.ATTENTION_VARIABLE, "xla")
  np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(
      layers.dot_product_attention(q, k, v, mask=mask), np.float32))


def test_cudnn_is_not_asked_where_it_cannot_run(cudnn_calls):
  q, k, v = _qkv()
  layers.dot_product_attention(q, k, v, mask=_padding_mask(), dropout_rate=0.1,
                               dropout_rng=jax.random.key(1), deterministic=False)
  layers.dot_product_attention(*_qkv(jnp.float32))  # 32-bit inputs
  layers.dot_product_attention(q[:, :1], k, v)  # one query: the decoding path
  assert cudnn_calls == []
  layers.dot_product_attention(q, k, v, dropout_rate=0.1, deterministic=True)  # no dropout
  assert len(cudnn_calls) == 1 and cudnn_calls[0]["mask_shape"] is None


def test_off_a_gpu_the_setting_changes_nothing(monkeypatch):
  q, k, v = _qkv()
  mask = _padding_mask()
  monkeypatch.setenv(layers.ATTENTION_VARIABLE, "cudnn")
  fused = jax.jit(lambda q, k, v: layers.dot_product_attention(q, k, v, mask=mask))(q, k, v)
  monkeypatch.setenv(layers.ATTENTION_VARIABLE, "xla")
  plain = jax.jit(lambda q, k, v: layers.dot_product_attention(q, k, v, mask=mask))(q, k, v)
  np.testing.assert_array_equal(np.asarray(fused, np.float32), np.asarray(plain, np.float32))
