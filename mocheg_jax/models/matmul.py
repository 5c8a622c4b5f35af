"""x @ W for the dense layers, with a weight gradient XLA:CPU runs on its fast dot kernels.

The gradient of W is x^T g: a dot contracting x's leading (token) axis. XLA:CPU folds the
transpose into the dot's dimension numbers, and its fast kernels (YNNPACK, in jaxlib 0.10)
take only dots whose left operand contracts its last axis; the rest fall back to a generic
dot that is ~3x slower. In a BART training step those weight gradients were ~20% of the
step (a profile of benchmarks/bench_bart_train.py). Here the backward pass materialises the
transpose of the smaller operand behind optimization barriers, so every dot is canonical and
takes the fast path; the copy is small next to the dot. Other backends (GPU, TPU) take
transposed operands natively, so there the plain dot is used.

Precision: XLA:CPU multiplies float32 in float32 whatever JAX's matmul precision says. Under
`jax.default_matmul_precision("bfloat16")` (or JAX_DEFAULT_MATMUL_PRECISION=bfloat16) these
products do on CPU what every backend does under that setting and a TPU does by default:
float32 operands rounded to bfloat16, products accumulated and returned in float32, for
every weight at least MIN_BFLOAT16_WIDTH wide both ways (the setting allows bfloat16, it
does not require it). CPUs with AMX run such dots ~4x faster than float32 ones
(BENCHMARKS.md, "bfloat16 products"), CPUs with AVX-512 BF16 up to ~1.8x.
"""

from __future__ import annotations

import contextlib
import functools
import math

import jax
import jax.numpy as jnp


# Values of jax_default_matmul_precision that mean bfloat16 operands, float32 accumulation.
BFLOAT16_PRECISIONS = ("bfloat16", "BF16_BF16_F32")
# Narrower weights keep float32 products under that setting (it allows bfloat16, as on a
# TPU, without requiring it): rounding the operands costs memory passes that a narrow
# product does not win back (the small CLIP's 64-wide layers trained ~10% slower rounded).
MIN_BFLOAT16_WIDTH = 128


def bfloat16_products() -> bool:
  """Whether float32 products may be computed from bfloat16 operands here: on CPU, under one
  of BFLOAT16_PRECISIONS (read while tracing: the setting is part of jit's cache key, so
  changing it retraces)."""
  return _on_cpu() and jax.config.jax_default_matmul_precision in BFLOAT16_PRECISIONS


def precision_scope(precision: str):
  """jax.default_matmul_precision(precision) for a non-empty name; "" changes nothing (the
  enclosing setting stays, where JAX's own context manager would reset it)."""
  return jax.default_matmul_precision(precision) if precision else contextlib.nullcontext()


# Linux's cpuinfo flags of the CPU units that run bfloat16 products with float32 sums
# faster than float32 ones, as measured (BENCHMARKS.md, "bfloat16 products" and
# benchmarks/bench_precision.py): AMX tiles (~4x a product on an Intel Xeon) and AVX-512
# BF16 dot products (1.7x MiniLM's encoding, 0.76-0.80x the small job's training steps on an
# AMD EPYC).
BFLOAT16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")


def cpu_bfloat16_flags(cpuinfo: str = "/proc/cpuinfo") -> tuple[str, ...]:
  """Which of BFLOAT16_CPU_FLAGS the CPU reports (none where cpuinfo cannot be read)."""
  try:
    with open(cpuinfo) as f:
      line = next((line for line in f if line.startswith("flags")), "")
  except OSError:  # Not Linux: no flags to read, so no claim about the CPU.
    return ()
  found = set(line.split())
  return tuple(flag for flag in BFLOAT16_CPU_FLAGS if flag in found)


def auto_precision() -> str:
  """The matmul precision a job may pick for speed when none is asked for: "bfloat16" on a
  CPU with AMX or AVX-512 BF16 (BFLOAT16_CPU_FLAGS), where those products were measured to
  pay; "" (JAX's default) elsewhere: other CPUs emulate bfloat16, and GPUs and TPUs have
  defaults of their own."""
  return "bfloat16" if _on_cpu() and cpu_bfloat16_flags() else ""


def _rounds(x: jax.Array, w: jax.Array) -> bool:
  """Whether the product of x and the weight w rounds its operands to bfloat16: float32
  operands under bfloat16 products and a weight at least MIN_BFLOAT16_WIDTH both ways."""
  return (x.dtype == w.dtype == jnp.float32 and min(w.shape) >= MIN_BFLOAT16_WIDTH
          and bfloat16_products())


def _product(x: jax.Array, w: jax.Array, dimensions, low: bool = False, out=None
             ) -> jax.Array:
  """dot_general with result dtype `out` (None: the operands'); `low`: from bfloat16
  operands, summed and returned in float32."""
  if low:
    x, w, out = x.astype(jnp.bfloat16), w.astype(jnp.bfloat16), jnp.float32
  return jax.lax.dot_general(x, w, dimensions, preferred_element_type=out)


def _dot(x: jax.Array, w: jax.Array, low: bool = False, out=None) -> jax.Array:
  return _product(x, w, (((1,), (0,)), ((), ())), low, out)


def _dot_t(x: jax.Array, w: jax.Array, low: bool = False, out=None) -> jax.Array:
  """x [M, K] @ w^T for w [N, K]."""
  return _product(x, w, (((1,), (1,)), ((), ())), low, out)


def _residuals(x: jax.Array, w: jax.Array, low: bool) -> tuple[jax.Array, jax.Array]:
  """The operands as a forward product takes them, rounded once and kept for the backward
  pass (a rounded pair takes half the memory, and its transposes move half the bytes)."""
  return (x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)) if low else (x, w)


def _materialised(x: jax.Array) -> jax.Array:
  """x in a buffer of its own, out of reach of fusion.

  XLA:CPU fuses elementwise producers (a bias add, an activation, a residual sum) into a
  transpose that reads them, optimization barriers notwithstanding, and such a fused
  transpose runs 4-10x slower than the plain transpose of a materialised array ([4096, 512]
  float32: 14 ms against 2.7 ms; BENCHMARKS.md). A conditional is a boundary it keeps: its
  predicate (x's first element is NaN) must be opaque, and its branches different, or XLA
  removes it. The NaN branch gives an all-NaN array: a NaN in x already makes the weight
  gradient non-finite, which the trainer treats as such (the update is skipped) either way.
  """
  return jax.lax.cond(jnp.isnan(x.reshape(-1)[0]), lambda v: jnp.full_like(v, jnp.nan),
                      lambda v: v, x)


def materialised_swap(x: jax.Array) -> jax.Array:
  """x with its last two axes swapped (x^T for a matrix), as an array of its own: x is
  materialised first (`_materialised`), and the barrier keeps XLA from folding the
  transpose into the product that reads it, which would make that product non-canonical
  again."""
  return jax.lax.optimization_barrier(_materialised(x).swapaxes(-1, -2))


# Which operand of the weight gradient x^T g is materialised transposed. XLA:CPU fuses the
# copy with whatever computes that operand, so the cheap side is the one whose producer is
# cheap to recompute: "smaller" decides by shape; a layer may name the side instead
# (layers.weight_grad_transposes: pre-LN blocks, whose inputs are long unmaterialised chains).
WEIGHT_GRAD_TRANSPOSES = ("smaller", "input", "cotangent")


def _weight_grad(x: jax.Array, g: jax.Array, transpose: str = "smaller", low: bool = False,
                 out=None) -> jax.Array:
  """x^T g [K, N] from canonical dots: (x^T) g ("input"), or (g^T x)^T ("cotangent"; for a
  vocabulary projection the result is far smaller than g). "smaller" transposes x when
  K <= N, else g: a wide x is usually an activation that XLA would recompute inside the
  transpose (GELU's erf: ~3x the plain copy)."""
  if transpose == "smaller":
    transpose = "input" if x.shape[1] <= g.shape[1] else "cotangent"
  if transpose == "input":
    return _dot(materialised_swap(x), g, low, out)
  return materialised_swap(_dot(materialised_swap(g), x, low, out))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _matmul(x: jax.Array, w: jax.Array, transpose: str, low: bool) -> jax.Array:
  del transpose  # Only the gradient reads it.
  return _dot(x, w, low)


def _matmul_forward(x, w, transpose, low):
  del transpose
  x, w = _residuals(x, w, low)
  return _dot(x, w, low), (x, w)


def _matmul_backward(transpose, low, residuals, g):
  x, w = residuals
  out = g.dtype  # The primal's: the gradients take it.
  g = g.astype(jnp.bfloat16) if low else g  # Once, before any transpose copies it.
  # g W^T as autodiff writes it; x^T g from canonical dots.
  return _dot_t(g, w, low, out), _weight_grad(x, g, transpose, low, out)


_matmul.defvjp(_matmul_forward, _matmul_backward)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _matmul_t(x: jax.Array, w: jax.Array, low: bool) -> jax.Array:
  return _dot_t(x, w, low)


def _matmul_t_forward(x, w, low):
  x, w = _residuals(x, w, low)
  return _dot_t(x, w, low), (x, w)


def _matmul_t_backward(low, residuals, g):
  x, w = residuals
  out = g.dtype
  g = g.astype(jnp.bfloat16) if low else g
  return _dot(g, w, low, out), _weight_grad(g, x, low=low, out=out)  # d w = g^T x [N, K].


_matmul_t.defvjp(_matmul_t_forward, _matmul_t_backward)


def _on_cpu() -> bool:
  return jax.default_backend() == "cpu"


def checked_transpose(transpose: str) -> str:
  """`transpose` if it names a WEIGHT_GRAD_TRANSPOSES entry, else a ValueError naming it."""
  if transpose not in WEIGHT_GRAD_TRANSPOSES:
    raise ValueError(f"unknown weight-gradient transpose {transpose!r}; expected one of "
                     f"{WEIGHT_GRAD_TRANSPOSES}")
  return transpose


def matmul(x: jax.Array, w: jax.Array, transpose: str = "smaller") -> jax.Array:
  """x [M, K] @ w [K, N] -> [M, N], differentiable in both; `transpose`: which operand the
  weight gradient copies transposed on CPU (WEIGHT_GRAD_TRANSPOSES)."""
  checked_transpose(transpose)
  return _matmul(x, w, transpose, _rounds(x, w)) if _on_cpu() else _dot(x, w)


def matmul_t(x: jax.Array, w: jax.Array) -> jax.Array:
  """x [M, K] @ w^T for w [N, K] (a tied output embedding) -> [M, N]."""
  return _matmul_t(x, w, _rounds(x, w)) if _on_cpu() else _dot_t(x, w)


def contract(x: jax.Array, w: jax.Array, n: int, transpose: str = "smaller") -> jax.Array:
  """Contracts the last `n` axes of x with the first `n` of w: [..., *in] x [*in, *out].

  On CPU flattened to one 2-D `matmul` (the leading axes and the in / out axes merge without
  a copy), so every dense layer's weight gradient takes the fast path above; elsewhere one
  dot_general over the axes as they are (no reshape for the sharding to see).
  """
  checked_transpose(transpose)
  if not _on_cpu():
    return jax.lax.dot_general(x, w, ((tuple(range(x.ndim - n, x.ndim)), tuple(range(n))),
                                      ((), ())))
  lead, inner, out = x.shape[:x.ndim - n], w.shape[:n], w.shape[n:]
  k = math.prod(inner)
  x, w = jnp.reshape(x, (-1, k)), jnp.reshape(w, (k, -1))
  y = _matmul(x, w, transpose, _rounds(x, w))
  return jnp.reshape(y, lead + out)
