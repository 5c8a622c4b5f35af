"""models/matmul.py: the dense layers' matmul and its hand-written gradient.

The gradient must equal autodiff's of the plain dot, whichever operand it transposes, and on
CPU every dot XLA compiles for it must contract its left operand's last axis (the shape its
fast kernels take: the reason the module exists).
"""

import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mocheg_jax.models import matmul
from tests import processes

RTOL, ATOL = 1e-5, 1e-5  # float32 dots of length <= 48, summed in another order.


def _arrays(*shapes, seed=0):
  rng = np.random.default_rng(seed)
  return [jnp.asarray(rng.standard_normal(s), jnp.float32) for s in shapes]


def _loss(fn, cotangent):
  return lambda x, w: jnp.sum(fn(x, w) * cotangent)


@pytest.mark.parametrize("transpose", matmul.WEIGHT_GRAD_TRANSPOSES)
@pytest.mark.parametrize("k, n", [(12, 40), (40, 12)])  # "smaller": x / g transposed.
def test_matmul_gradients_match_autodiff(k, n, transpose):
  x, w, g = _arrays((48, k), (k, n), (48, n))
  ours = jax.grad(_loss(lambda a, b: matmul.matmul(a, b, transpose), g), argnums=(0, 1))(x, w)
  plain = jax.grad(_loss(jnp.matmul, g), argnums=(0, 1))(x, w)
  np.testing.assert_allclose(matmul.matmul(x, w), x @ w, rtol=RTOL, atol=ATOL)
  for a, b in zip(ours, plain):
    np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)


def test_an_unknown_weight_gradient_transpose_is_named():
  x, w = _arrays((4, 3), (3, 2))
  for call in (lambda: matmul.matmul(x, w, "output"), lambda: matmul.contract(x, w, 1, "x")):
    with pytest.raises(ValueError, match=r"unknown weight-gradient transpose '(output|x)'"):
      call()


def test_matmul_t_gradients_match_autodiff():
  x, table, g = _arrays((48, 16), (96, 16), (48, 96))
  ours = jax.grad(_loss(matmul.matmul_t, g), argnums=(0, 1))(x, table)
  plain = jax.grad(_loss(lambda a, b: a @ b.T, g), argnums=(0, 1))(x, table)
  for a, b in zip(ours, plain):
    np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)


def test_contract_keeps_multi_axis_shapes_and_gradients():
  # [batch, length, heads, kv] x [heads, kv, embed]: an attention output projection.
  x, w, g = _arrays((2, 5, 3, 4), (3, 4, 8), (2, 5, 8))
  y = matmul.contract(x, w, 2)
  assert y.shape == (2, 5, 8)
  expected = jnp.einsum("blhd,hde->ble", x, w)
  np.testing.assert_allclose(y, expected, rtol=RTOL, atol=ATOL)
  ours = jax.grad(_loss(lambda a, b: matmul.contract(a, b, 2), g), argnums=(0, 1))(x, w)
  plain = jax.grad(_loss(lambda a, b: jnp.einsum("blhd,hde->ble", a, b), g),
                   argnums=(0, 1))(x, w)
  for a, b in zip(ours, plain):
    np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)


def test_other_backends_take_the_plain_dots_with_the_same_results(monkeypatch):
  x, w, table, g, gt = _arrays((2, 5, 3, 4), (3, 4, 8), (7, 8), (2, 5, 8), (10, 7))

  def outputs_and_grads():
    dense = jax.grad(_loss(lambda a, b: matmul.contract(a, b, 2), g), argnums=(0, 1))(x, w)
    head = jax.grad(_loss(matmul.matmul_t, gt), argnums=(0, 1))(x.reshape(10, 12)[:, :8],
                                                                 table)
    return matmul.contract(x, w, 2), dense, head

  on_cpu = outputs_and_grads()
  monkeypatch.setattr(matmul, "_on_cpu", lambda: False)
  elsewhere = outputs_and_grads()
  for a, b in zip(jax.tree.leaves(on_cpu), jax.tree.leaves(elsewhere)):
    np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)


# Run where XLA compiles as a training run does: the suite's XLA_FLAGS lower the backend
# optimisation level (tests/processes.py), which changes which transposes reach the dots.
_DOT_DIMS = """
import json, re, sys
import jax, jax.numpy as jnp
from mocheg_jax.models import matmul
from tests import processes
k, n, transpose = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
x, w, g = jnp.ones((128, k)), jnp.ones((k, n)), jnp.ones((128, n))
out = {}
ours = lambda x, w: matmul.matmul(x, w, transpose)
for name, fn in (("ours", ours), ("plain", jnp.matmul)):
  # The cotangent is an argument, as in a train step (a constant could be folded).
  grad = jax.jit(lambda x, w, g: jax.grad(lambda x, w: jnp.sum(fn(x, w) * g),
                                          argnums=(0, 1))(x, w))
  hlo = grad.lower(x, w, g).compile().as_text()
  out[name] = re.findall(r"lhs_contracting_dims=\\{(\\d+)\\}", hlo)
print(json.dumps(out))
"""


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU dot path")
@pytest.mark.parametrize("k, n, transpose", [
    (64, 256, "smaller"), (256, 64, "smaller"), (256, 64, "input"), (64, 256, "cotangent")])
def test_compiled_gradient_dots_contract_the_last_axis_of_their_left_operand(k, n, transpose):
  env = {**processes.script_environment(), "XLA_FLAGS": ""}
  done = subprocess.run([sys.executable, "-c", _DOT_DIMS, str(k), str(n), transpose], env=env,
                        capture_output=True, text=True, timeout=300, check=True)
  dims = json.loads(done.stdout.strip().splitlines()[-1])
  assert len(dims["ours"]) >= 2, dims  # The input gradient and the weight gradient at least.
  assert set(dims["ours"]) == {"1"}, dims
  assert "0" in dims["plain"], dims  # The plain dot's weight gradient: what this avoids.


def test_a_materialised_operand_is_the_operand_and_kept_out_of_the_transpose():
  x = jnp.asarray(np.random.default_rng(0).normal(size=(6, 5)).astype(np.float32))
  materialise = jax.jit(matmul._materialised)
  np.testing.assert_array_equal(materialise(x), x)
  assert np.isnan(materialise(x.at[0, 0].set(jnp.nan))).all()  # Non-finite either way.
  # The transpose of a computed operand reads a buffer: nothing is fused into it.
  hlo = jax.jit(lambda v, b: matmul.materialised_swap(jnp.tanh(v + b))).lower(
      x, jnp.ones(5)).compile().as_text()
  computations = hlo.split("\n\n")  # Each fused computation is a block of its own.
  transposing = [c for c in computations if " transpose(" in c]
  assert transposing and not any("tanh(" in c for c in transposing), transposing


def _bf16(a):
  return np.asarray(jnp.asarray(a).astype(jnp.bfloat16).astype(jnp.float32), np.float64)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU dot path")
def test_bfloat16_precision_multiplies_bfloat16_operands_in_float32():
  wide = matmul.MIN_BFLOAT16_WIDTH
  x, w, table, g = _arrays((48, wide), (wide, wide), (wide, wide), (48, wide))
  loss = _loss(lambda a, b: matmul.matmul(a, b), g)
  with jax.default_matmul_precision("bfloat16"):
    y = matmul.matmul(x, w)
    head = matmul.matmul_t(x, table)
    dx, dw = jax.grad(loss, argnums=(0, 1))(x, w)
    dhead = jax.grad(_loss(matmul.matmul_t, g), argnums=(0, 1))(x, table)
  assert y.dtype == head.dtype == dx.dtype == dw.dtype == jnp.float32
  # Exactly the products of the rounded operands, summed in float32 (float64 here).
  tol = dict(rtol=1e-5, atol=1e-4)
  np.testing.assert_allclose(y, _bf16(x) @ _bf16(w), **tol)
  np.testing.assert_allclose(head, _bf16(x) @ _bf16(table).T, **tol)
  np.testing.assert_allclose(dx, _bf16(g) @ _bf16(w).T, **tol)
  np.testing.assert_allclose(dw, _bf16(x).T @ _bf16(g), **tol)
  np.testing.assert_allclose(dhead[0], _bf16(g) @ _bf16(table), **tol)
  np.testing.assert_allclose(dhead[1], _bf16(g).T @ _bf16(x), **tol)
  # Not float32's products: bfloat16 keeps 8 significant bits (relative error ~2^-9 each).
  exact = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
  assert np.abs(np.asarray(y) - exact).max() > 1e-3
  np.testing.assert_allclose(matmul.matmul(x, w), exact, **tol)  # The default again.
  # A bfloat16 compute dtype stays bfloat16, values and gradients.
  with jax.default_matmul_precision("bfloat16"):
    low = jax.grad(lambda a, b: jnp.sum(matmul.matmul(a, b).astype(jnp.float32)),
                   argnums=(0, 1))(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16))
    assert matmul.matmul(x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)).dtype == jnp.bfloat16
  assert low[0].dtype == low[1].dtype == jnp.bfloat16


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU dot path")
def test_a_narrow_weight_keeps_float32_products_under_bfloat16_precision():
  wide = matmul.MIN_BFLOAT16_WIDTH
  for shape in ((wide, wide - 1), (wide - 1, wide)):
    x, w = _arrays((16, shape[0]), shape)
    with jax.default_matmul_precision("bfloat16"):
      y = matmul.contract(x, w, 1)
    np.testing.assert_allclose(y, np.asarray(x, np.float64) @ np.asarray(w, np.float64),
                               rtol=1e-5, atol=1e-4)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU dot path")
def test_the_precision_is_read_when_tracing_so_a_jitted_function_follows_it():
  wide = matmul.MIN_BFLOAT16_WIDTH
  x, w = _arrays((16, wide), (wide, wide))
  product = jax.jit(lambda a, b: matmul.contract(a, b, 1))
  exact = np.asarray(x, np.float64) @ np.asarray(w, np.float64)
  with jax.default_matmul_precision("bfloat16"):
    rounded = product(x, w)
  np.testing.assert_allclose(rounded, _bf16(x) @ _bf16(w), rtol=1e-5, atol=1e-4)
  assert np.abs(np.asarray(rounded) - exact).max() > 1e-3
  np.testing.assert_allclose(product(x, w), exact, rtol=1e-5, atol=1e-4)
  with jax.default_matmul_precision("float32"):
    np.testing.assert_allclose(product(x, w), exact, rtol=1e-5, atol=1e-4)


def test_bfloat16_units_are_read_from_the_cpu_flags(tmp_path):
  cpuinfo = tmp_path / "cpuinfo"
  cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_vnni amx_tile\n")
  assert matmul.cpu_bfloat16_flags(str(cpuinfo)) == ()  # No bfloat16 unit among them.
  cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx512f avx512_bf16\n")
  assert matmul.cpu_bfloat16_flags(str(cpuinfo)) == ("avx512_bf16",)
  cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx512_bf16 amx_bf16 amx_tile\n")
  assert matmul.cpu_bfloat16_flags(str(cpuinfo)) == ("amx_bf16", "avx512_bf16")
  assert matmul.cpu_bfloat16_flags(str(tmp_path / "missing")) == ()


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the CPU choice")
@pytest.mark.parametrize("units, expected", [(("amx_bf16",), "bfloat16"),
                                             (("avx512_bf16",), "bfloat16"), ((), "")])
def test_auto_precision_is_bfloat16_only_on_a_cpu_with_bfloat16_units(units, expected,
                                                                       monkeypatch):
  monkeypatch.setattr(matmul, "cpu_bfloat16_flags", lambda: units)
  assert matmul.auto_precision() == expected


def test_an_empty_precision_scope_keeps_the_enclosing_setting():
  with jax.default_matmul_precision("bfloat16"):
    with matmul.precision_scope(""):
      assert jax.config.jax_default_matmul_precision == "bfloat16"
    with matmul.precision_scope("float32"):
      assert jax.config.jax_default_matmul_precision == "float32"
    assert jax.config.jax_default_matmul_precision == "bfloat16"
