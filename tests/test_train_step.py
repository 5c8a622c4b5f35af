"""train/step.py's guard: a step whose loss or gradient is not finite changes nothing but the
step counter and the record of the first such step, with the state donated as the trainer
donates it (the update runs under lax.cond so XLA need not copy the donated state to keep
its old value; this checks the values)."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mocheg_jax.models import layers
from mocheg_jax.train import optim
from mocheg_jax.train import state as state_lib
from mocheg_jax.train import step as step_lib


def _factory():
  return layers.Dense(4, 3, ("embed", "mlp"), rngs=nnx.Rngs(params=0))


def _loss(model, batch):
  error = model(batch["x"]) - batch["y"]
  return jnp.mean(error ** 2) * batch["scale"][0], {}


def _copy(tree):
  return jax.tree.map(lambda a: np.array(a), tree)


def test_a_non_finite_step_leaves_the_donated_state_as_it_was():
  spec = state_lib.ModelSpec.of(_factory)
  config = optim.default_config()
  config.name, config.schedule, config.learning_rate = "adamw", "constant", 0.1
  opt = optim.make_optimizer(config, total_steps=10)
  state = jax.jit(state_lib._init_fn(spec, _factory, opt.tx))()
  step = jax.jit(step_lib.make_train_step(spec, _loss, opt.tx, opt.schedule),
                 donate_argnums=(0,))
  rng = np.random.default_rng(0)
  batch = {"x": jnp.asarray(rng.standard_normal((8, 4)), jnp.float32),
           "y": jnp.asarray(rng.standard_normal((8, 3)), jnp.float32),
           "scale": jnp.ones((8,), jnp.float32)}
  before = _copy((state.params, state.opt_state))
  state, metrics = step(state, batch, jax.random.key(0))
  after_good = _copy((state.params, state.opt_state))
  assert np.isfinite(float(metrics["loss"]))
  moved = [not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before),
                                                    jax.tree.leaves(after_good))]
  assert any(moved)  # A finite step does update (so the check below can fail).

  for bad in (np.nan, np.inf):
    state, metrics = step(state, {**batch, "scale": jnp.full((8,), bad, jnp.float32)},
                          jax.random.key(0))
    assert not np.isfinite(float(metrics["loss"]))
    for a, b in zip(jax.tree.leaves(after_good), jax.tree.leaves((state.params,
                                                                  state.opt_state))):
      np.testing.assert_array_equal(a, b)
  assert int(state.step) == 3
  assert int(state.first_nonfinite_step) == 1  # The first bad step, not the last.

  state, _ = step(state, batch, jax.random.key(0))  # Training goes on from the kept state.
  assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(state.params))


def test_the_moving_average_follows_each_good_update_only():
  """ema_decay: after step s's update, ema = d * ema + (1 - d) * params with d =
  min(ema_decay, s / (s + 10)): the first update sets it to the parameters; a non-finite
  step leaves it alone."""
  spec = state_lib.ModelSpec.of(_factory)
  config = optim.default_config()
  config.name, config.schedule, config.learning_rate = "adamw", "constant", 0.1
  opt = optim.make_optimizer(config, total_steps=100)
  state = jax.jit(state_lib._init_fn(spec, _factory, opt.tx, ema=True))()
  assert jax.tree.structure(state.ema) == jax.tree.structure(state.params)
  step = jax.jit(step_lib.make_train_step(spec, _loss, opt.tx, opt.schedule, ema_decay=0.5),
                 donate_argnums=(0,))
  rng = np.random.default_rng(0)
  batch = {"x": jnp.asarray(rng.standard_normal((8, 4)), jnp.float32),
           "y": jnp.asarray(rng.standard_normal((8, 3)), jnp.float32),
           "scale": jnp.ones((8,), jnp.float32)}
  expected = None
  for s in range(14):
    state, _ = step(state, batch, jax.random.key(0))
    params = _copy(state.params)
    decay = min(0.5, s / (s + 10))
    expected = params if expected is None else jax.tree.map(
        lambda e, p: decay * e + (1 - decay) * p, expected, params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
                 _copy(state.ema), expected)
  # By now the average lags the parameters (so the check above could fail).
  assert not all(np.allclose(e, p) for e, p in zip(jax.tree.leaves(_copy(state.ema)),
                                                   jax.tree.leaves(_copy(state.params))))
  kept = _copy(state.ema)
  state, _ = step(state, {**batch, "scale": jnp.full((8,), np.nan, jnp.float32)},
                  jax.random.key(0))
  jax.tree.map(np.testing.assert_array_equal, _copy(state.ema), kept)
  assert float(step_lib.moving_average_decay(0.999, 0)) == 0.0
  assert abs(float(step_lib.moving_average_decay(0.999, 90)) - 0.9) < 1e-6
