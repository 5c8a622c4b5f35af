"""Matmul FLOPs of a traced JAX function, for model FLOP utilisation (MFU).

MFU counts the arithmetic the model needs, not what a backend happens to run: the matrix
products and convolutions of the forward and backward passes (2 FLOPs per multiply-add),
the conventional "6 x parameters x tokens plus attention" of a transformer step. Counting
them in the jaxpr gives that number for any model without a hand-written formula per
architecture, as long as the program rematerialises nothing (ours do not; a `remat` region
would be counted as traced, i.e. with its recomputation, so the figure would then be the
hardware FLOPs). Element-wise work (softmax, norms, the optimizer update) is left out, as
MFU conventionally does; XLA's cost analysis counts everything, and is a different figure.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax


def _dot_general(eqn) -> float:
  lhs, rhs = (v.aval.shape for v in eqn.invars[:2])
  (_, rhs_contract), (_, rhs_batch) = eqn.params["dimension_numbers"]
  rhs_free = [d for i, d in enumerate(rhs) if i not in (*rhs_contract, *rhs_batch)]
  # Every lhs element (batch x free x contracted) meets every rhs free column once.
  return 2.0 * math.prod(lhs) * math.prod(rhs_free)


def _conv(eqn) -> float:
  rhs = eqn.invars[1].aval.shape
  out = eqn.outvars[0].aval.shape
  out_features = rhs[eqn.params["dimension_numbers"].rhs_spec[0]]
  # Each output element is a dot over the kernel's (in-features / groups) x spatial taps.
  return 2.0 * math.prod(out) * math.prod(rhs) / out_features


def _sub_jaxprs(value: Any):
  """The jaxprs inside an equation's parameter (closed or open, alone or in a sequence)."""
  if hasattr(value, "eqns"):
    yield value
  elif hasattr(value, "jaxpr") and hasattr(value.jaxpr, "eqns"):
    yield value.jaxpr
  elif isinstance(value, (tuple, list)):
    for item in value:
      yield from _sub_jaxprs(item)


def jaxpr_matmul_flops(jaxpr) -> float:
  """Matmul + convolution FLOPs of a (closed) jaxpr, through every nested jaxpr.

  A scan body counts `length` times; of a cond's branches the costliest counts; a while
  loop has no static trip count, so one is refused rather than guessed.
  """
  jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
  total = 0.0
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if name == "dot_general":
      total += _dot_general(eqn)
    elif name == "conv_general_dilated":
      total += _conv(eqn)
    elif name == "while":
      raise ValueError("a while loop has no static trip count: its FLOPs cannot be counted")
    elif name == "cond":
      total += max(jaxpr_matmul_flops(b) for b in eqn.params["branches"])
    else:
      inner = sum(jaxpr_matmul_flops(j) for v in eqn.params.values() for j in _sub_jaxprs(v))
      total += inner * (eqn.params["length"] if name == "scan" else 1)
  return total


def matmul_flops(fn: Callable[..., Any], *args, **kwargs) -> float:
  """Matmul + convolution FLOPs of one call `fn(*args, **kwargs)` (traced, not run)."""
  return jaxpr_matmul_flops(jax.make_jaxpr(fn)(*args, **kwargs))
