"""Shared building blocks with logical axis names: dense, layer norm, embedding, attention.

Every model uses these, so attention has one implementation (`dot_product_attention`: XLA
math; cuDNN's fused kernel on NVIDIA GPUs with $MOCHEG_JAX_ATTENTION=cudnn) and every
parameter has logical axes. Parameters are float32; `dtype` is the compute dtype
(bfloat16 for speed), and layer norms and softmax are computed in float32 whatever it is.

Axis names: batch, length, embed, mlp, heads, kv (per-head features), vocab, and the
model-specific ones their modules document.
"""

from __future__ import annotations

import os
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx
from flax.core import spmd

from mocheg_jax.models import matmul
from mocheg_jax.parallel import rules as rules_lib

Axes = tuple[str | None, ...]
Dtype = jnp.dtype | None

default_init = nnx.initializers.normal(stddev=0.02)  # What BERT, CLIP and BART use.


def _param(rngs: nnx.Rngs, init: Callable, shape: Sequence[int], axes: Axes,
           param_dtype) -> nnx.Param:
  if len(axes) != len(shape):
    raise ValueError(f"axes {axes} do not match shape {tuple(shape)}")
  return nnx.Param(init(rngs.params(), tuple(shape), param_dtype), out_sharding=axes)


def constrain(x: jax.Array, axes: Axes) -> jax.Array:
  """Sharding constraint on an activation, by logical axis names.

  A no-op unless a mesh is set (jax.set_mesh) and logical rules are active
  (nnx.logical_axis_rules), so models run unchanged on one device.
  """
  mesh = jax.sharding.get_abstract_mesh()
  rules = spmd.get_logical_axis_rules()
  if mesh.empty or not rules:
    return x
  # With the shape, a dimension the mesh axes do not divide (a 3-class head, an odd
  # vocabulary) stays replicated rather than failing.
  spec = rules_lib.logical_to_spec(axes, rules, mesh, x.shape)
  if all(t == jax.sharding.AxisType.Explicit for t in mesh.axis_types):
    return jax.sharding.reshard(x, spec)  # Explicit meshes carry shardings in the types.
  return jax.lax.with_sharding_constraint(x, jax.sharding.NamedSharding(mesh, spec))


class Dense(nnx.Module):
  """y = x W + b, contracting the last len(in_shape) axes of x; W is in_shape + out_shape.

  Multi-axis shapes keep heads explicit ([embed] -> [heads, kv]) so tensor parallelism can
  shard heads without reshapes. `weight_grad_transpose` names the operand that the weight
  gradient copies transposed on CPU (matmul.WEIGHT_GRAD_TRANSPOSES; weight_grad_transposes
  says which for a transformer block's projections).
  """

  def __init__(self, in_shape: int | Sequence[int], out_shape: int | Sequence[int],
               axes: Axes, *, use_bias: bool = True, kernel_init: Callable = default_init,
               dtype: Dtype = None, param_dtype=jnp.float32,
               weight_grad_transpose: str = "smaller", rngs: nnx.Rngs):
    self.in_shape = (in_shape,) if isinstance(in_shape, int) else tuple(in_shape)
    self.out_shape = (out_shape,) if isinstance(out_shape, int) else tuple(out_shape)
    self.dtype = dtype
    self.weight_grad_transpose = matmul.checked_transpose(weight_grad_transpose)
    self.kernel = _param(rngs, kernel_init, self.in_shape + self.out_shape, axes, param_dtype)
    self.bias = (_param(rngs, nnx.initializers.zeros, self.out_shape,
                        axes[len(self.in_shape):], param_dtype) if use_bias else None)

  def __call__(self, x: jax.Array) -> jax.Array:
    kernel = self.kernel[...]
    dtype = self.dtype or jnp.result_type(x, kernel)
    y = matmul.contract(x.astype(dtype), kernel.astype(dtype), len(self.in_shape),
                        self.weight_grad_transpose)
    if self.bias is not None:
      y = y + self.bias[...].astype(dtype)
    return y


class LayerNorm(nnx.Module):
  """Layer norm over the last axis, computed in float32, returned in the compute dtype."""

  def __init__(self, features: int, *, eps: float = 1e-5, axes: Axes = ("embed",),
               dtype: Dtype = None, param_dtype=jnp.float32, rngs: nnx.Rngs):
    self.eps, self.dtype = eps, dtype
    self.scale = _param(rngs, nnx.initializers.ones, (features,), axes, param_dtype)
    self.bias = _param(rngs, nnx.initializers.zeros, (features,), axes, param_dtype)

  def __call__(self, x: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    mean = x32.mean(-1, keepdims=True)
    var = jnp.square(x32 - mean).mean(-1, keepdims=True)
    y = (x32 - mean) * jax.lax.rsqrt(var + self.eps) * self.scale[...] + self.bias[...]
    return y.astype(self.dtype or x.dtype)


class Embed(nnx.Module):
  """Token (or position) embedding table [num, features]; `attend` is the tied output layer."""

  def __init__(self, num: int, features: int, *, axes: Axes = ("vocab", "embed"),
               init: Callable = default_init, dtype: Dtype = None, param_dtype=jnp.float32,
               rngs: nnx.Rngs):
    self.dtype = dtype
    self.embedding = _param(rngs, init, (num, features), axes, param_dtype)

  def __call__(self, ids: jax.Array) -> jax.Array:
    table = self.embedding[...]
    return jnp.take(table, ids, axis=0).astype(self.dtype or table.dtype)

  def attend(self, x: jax.Array) -> jax.Array:
    table = self.embedding[...]
    dtype = self.dtype or jnp.result_type(x, table)
    # One 2-D matmul over the flattened leading axes: XLA:CPU runs the weight gradient of a
    # dot with two free axes far slower (bench_bart_train: BART-base head 2.5-3.0 -> 1.6 CPU-s).
    flat = x.reshape(-1, x.shape[-1]).astype(dtype)
    return matmul.matmul_t(flat, table.astype(dtype)).reshape(*x.shape[:-1], table.shape[0])


def erf_gelu(x: jax.Array) -> jax.Array:
  """The exact GELU as torch writes it, 0.5 x (1 + erf(x / sqrt 2)) (BERT, BART).

  jax.nn.gelu(approximate=False) goes through erfc, which XLA expands into two branches
  (a polynomial and an exp-based tail with a division) evaluated for every element, forward
  and backward: 1.3x slower whole InfoNCE MiniLM steps on CPU than this (BENCHMARKS.md).
  """
  return 0.5 * x * (1.0 + jax.lax.erf(x * 0.7071067811865476))  # Weak floats keep x.dtype.


ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "gelu": erf_gelu,
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
    "quick_gelu": lambda x: x * jax.nn.sigmoid(1.702 * x),  # CLIP
    "relu": jax.nn.relu,
    "tanh": jnp.tanh,
}


def activation(name: str) -> Callable[[jax.Array], jax.Array]:
  if name not in ACTIVATIONS:
    raise ValueError(f"unsupported activation {name!r}; expected one of {sorted(ACTIVATIONS)}")
  return ACTIVATIONS[name]


def weight_grad_transposes(pre_norm: bool) -> tuple[str, str]:
  """The weight-gradient transposes (matmul.WEIGHT_GRAD_TRANSPOSES) of a transformer block's
  projections: (those reading the sublayer's input: q/k/v, fc1; those writing its output:
  the attention's out, fc2).

  Pre-LN, the input is LN(x_0 + f_1 + ... + f_l), a chain XLA:CPU recomputes inside every
  copy that reads it, and the cotangent of the residual stream is the same kind of chain: so
  the readers copy their cotangent and the writers their input (CLIP ViT-B/32 step: 19
  transpose fusions of > 20 operands -> none, ~3% faster). Post-LN, the input is the
  residual stream itself, which XLA keeps, and the shape rule was faster (BART small NLL
  step: 0.71-0.73 s against 0.82-0.89 s with the pre-LN choice). Measured before
  matmul._materialised, which now keeps any producer out of the copy; the choice stands
  until measured again.
  """
  return ("cotangent", "input") if pre_norm else ("smaller", "smaller")


class MLP(nnx.Module):
  """Dense -> activation -> Dense (the transformer feed-forward block); `pre_norm`: the
  block is pre-LN (weight_grad_transposes)."""

  def __init__(self, features: int, hidden: int, act: str, *, dtype: Dtype = None,
               param_dtype=jnp.float32, pre_norm: bool = False, rngs: nnx.Rngs):
    self.act = activation(act)
    reads, writes = weight_grad_transposes(pre_norm)
    self.fc1 = Dense(features, hidden, ("embed", "mlp"), dtype=dtype, param_dtype=param_dtype,
                     weight_grad_transpose=reads, rngs=rngs)
    self.fc2 = Dense(hidden, features, ("mlp", "embed"), dtype=dtype, param_dtype=param_dtype,
                     weight_grad_transpose=writes, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    h = constrain(self.act(self.fc1(x)), ("batch", "length", "mlp"))
    return self.fc2(h)


def dot_product_attention(q: jax.Array, k: jax.Array, v: jax.Array, *,
                          mask: jax.Array | None = None, dropout_rate: float = 0.0,
                          dropout_rng: jax.Array | None = None,
                          deterministic: bool = True) -> jax.Array:
  """Scaled dot-product attention. q: [B, Q, H, D], k/v: [B, K, H, D] -> [B, Q, H, D].

  `mask` is boolean, broadcastable to [B, H, Q, K], True where attention is allowed.
  Logits and softmax are float32 whatever the compute dtype; attention-probability dropout
  applies when `dropout_rate` > 0 and not `deterministic`.

  Written head-major: q, k and v are transposed to [B, H, L, D] so both products are
  plain batched matmuls. XLA:CPU runs the [B, L, H, D] einsums that
  jax.nn.dot_product_attention (whose default is this same XLA math, no fused kernel)
  writes as strided loops: one BERT-sized layer forward and backward took ~20% longer
  that way, the product with the probabilities up to 3x (BENCHMARKS.md). A single query
  (incremental decoding) keeps the einsum form: there the transposes would copy the
  whole KV cache every step. Without dropout, $MOCHEG_JAX_ATTENTION=cudnn hands the call
  to `cudnn_attention` on GPUs first.
  """
  dropout = not deterministic and dropout_rate > 0.0
  if q.shape[1] == 1 and not dropout:
    return jax.nn.dot_product_attention(q, k, v, mask=mask)
  if not dropout and attention_implementation() == "cudnn":
    fused = cudnn_attention(q, k, v, mask)
    if fused is not None:
      return fused
  q, k, v = (x.swapaxes(1, 2) for x in (q, k, v))
  logits = jnp.matmul(q, k.swapaxes(-1, -2), preferred_element_type=jnp.float32)
  logits = logits * q.shape[-1] ** -0.5
  if mask is not None:
    logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(logits, axis=-1)
  if dropout:
    keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, probs.shape)
    probs = jnp.where(keep, probs / (1.0 - dropout_rate), 0.0)
  return jnp.matmul(probs.astype(v.dtype), v).swapaxes(1, 2)


ATTENTION_VARIABLE = "MOCHEG_JAX_ATTENTION"
ATTENTION_IMPLEMENTATIONS = ("xla", "cudnn")


def attention_implementation() -> str:
  """$MOCHEG_JAX_ATTENTION, read when a model is traced: "xla" (the default) or "cudnn".

  "cudnn" sends attention without dropout to cuDNN's fused (flash) kernel on NVIDIA GPUs,
  in bfloat16/float16, wherever cuDNN accepts the shapes; everything else keeps the XLA
  path. Opt-in until a whole training step has been measured with it: one call of
  attention forward + backward ran 1.6-2.8x faster on an H200 at BART-large's and
  MiniLM's shapes, with the same results within bf16 rounding (BENCHMARKS.md, "On a GPU").
  """
  value = os.environ.get(ATTENTION_VARIABLE, "xla").strip().lower() or "xla"
  if value not in ATTENTION_IMPLEMENTATIONS:
    raise ValueError(f"${ATTENTION_VARIABLE}={value!r}: expected one of "
                     f"{', '.join(ATTENTION_IMPLEMENTATIONS)}")
  return value


def cudnn_attention(q: jax.Array, k: jax.Array, v: jax.Array,
                     mask: jax.Array | None) -> jax.Array | None:
  """cuDNN's fused attention, or None where it cannot run (no GPU, 32-bit inputs, a shape
  or mask cuDNN refuses: those raise while tracing, so the XLA path takes over)."""
  if jax.default_backend() != "gpu" or q.dtype not in (jnp.bfloat16, jnp.float16):
    return None
  if mask is not None:
    if mask.ndim != 4:
      return None
    # cuDNN takes a mask (as a bias) only at full query x key size: [B, 1, 1, K] padding
    # masks are broadcast (B x Q x K booleans: a few MB at BART-large's shapes).
    mask = jnp.broadcast_to(mask, (q.shape[0], mask.shape[1], q.shape[1], k.shape[1]))
  try:
    return jax.nn.dot_product_attention(q, k, v, mask=mask, implementation="cudnn")
  except (ValueError, NotImplementedError, RuntimeError):  # E.g. CLIP's 77 text tokens.
    return None


class Attention(nnx.Module):
  """Multi-head attention with separate q/k/v/out projections (HF's layout, kept per head).

  Self-attention: `attn(x, mask=...)`. Cross-attention: `attn(x, kv_input=memory, ...)`.
  Incremental decoding precomputes keys/values with `project_kv` and passes them as `kv`.
  `pre_norm`: the block is pre-LN (weight_grad_transposes).
  """

  def __init__(self, features: int, num_heads: int, *, kv_features: int | None = None,
               head_dim: int | None = None, use_bias: bool = True, dropout_rate: float = 0.0,
               dtype: Dtype = None, param_dtype=jnp.float32, pre_norm: bool = False,
               rngs: nnx.Rngs):
    head_dim = head_dim or features // num_heads
    kv_features = kv_features or features
    self.num_heads, self.head_dim, self.dropout_rate = num_heads, head_dim, dropout_rate
    proj = dict(use_bias=use_bias, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    reads, writes = weight_grad_transposes(pre_norm)
    heads = dict(proj, weight_grad_transpose=reads)
    self.query = Dense(features, (num_heads, head_dim), ("embed", "heads", "kv"), **heads)
    self.key = Dense(kv_features, (num_heads, head_dim), ("embed", "heads", "kv"), **heads)
    self.value = Dense(kv_features, (num_heads, head_dim), ("embed", "heads", "kv"), **heads)
    self.out = Dense((num_heads, head_dim), features, ("heads", "kv", "embed"), **proj,
                     weight_grad_transpose=writes)
    self.rngs = rngs if dropout_rate > 0 else None

  def project_kv(self, kv_input: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Keys and values [B, K, H, D] of `kv_input` [B, K, E]."""
    k = constrain(self.key(kv_input), ("batch", "length", "heads", "kv"))
    v = constrain(self.value(kv_input), ("batch", "length", "heads", "kv"))
    return k, v

  def __call__(self, x: jax.Array, kv_input: jax.Array | None = None, *,
               kv: tuple[jax.Array, jax.Array] | None = None, mask: jax.Array | None = None,
               deterministic: bool = True) -> jax.Array:
    q = constrain(self.query(x), ("batch", "length", "heads", "kv"))
    k, v = kv if kv is not None else self.project_kv(x if kv_input is None else kv_input)
    dropout_rng = None
    if not deterministic and self.dropout_rate > 0:
      dropout_rng = self.rngs.dropout()
    y = dot_product_attention(q, k.astype(q.dtype), v.astype(q.dtype), mask=mask,
                              dropout_rate=self.dropout_rate, dropout_rng=dropout_rng,
                              deterministic=deterministic)
    return self.out(y)


def padding_mask(key_mask: jax.Array) -> jax.Array:
  """Boolean [B, 1, 1, K] mask from a 0/1 token mask: attend to real tokens only.

  Queries at padded positions still attend (to real keys), so no row is all-masked and no
  NaN appears; their outputs are ignored downstream.
  """
  return key_mask.astype(bool)[:, None, None, :]


def causal_mask(length: int) -> jax.Array:
  """Boolean [1, 1, L, L] lower-triangular mask."""
  return jnp.tril(jnp.ones((length, length), bool))[None, None]
