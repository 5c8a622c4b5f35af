"""Tests for mocheg_jax/train/optim.py: torch parity, clipping, schedules, masks, validation."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from mocheg_jax.train import optim

# float32 parity with torch: parameters agree to 1e-6 relative (plus 1e-7 absolute for
# entries near zero) after every step. Measured: at most 4e-7 relative, except 1.2e-6 on
# one entry near zero (within ATOL). With optax.scale_by_adam in the chain instead of ours
# the same runs are off by 1.5e-5 to 5e-5 (its float32 bias correction), and fail.
RTOL, ATOL = 1e-6, 1e-7


def _shapes():
  return {
      "embeddings": {"embedding": (6, 3)},
      "encoder": {"layers": [{"kernel": (3, 4), "bias": (4,)},
                             {"kernel": (4, 3), "bias": (3,)}],
                  "norm": {"scale": (3,), "bias": (3,)}},
      "head": {"kernel": (3, 2)},
  }


def _params(seed: int = 0):
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda s: rng.normal(size=s).astype(np.float32), _shapes(),
                      is_leaf=lambda x: isinstance(x, tuple))


def _config(**fields):
  c = optim.default_config()
  for name, value in fields.items():
    c[name] = value
  return c


def _run(opt: optim.Optimizer, params, grads_per_step):
  """Applies the optimizer (jitted) once per gradient tree; returns every step's params."""
  @jax.jit
  def step(p, state, g):
    updates, state = opt.tx.update(g, state, p)
    return optax.apply_updates(p, updates), state

  p = jax.tree.map(jnp.asarray, params)
  state = opt.tx.init(p)
  history = []
  for g in grads_per_step:
    p, state = step(p, state, g)
    history.append(jax.tree.map(np.asarray, p))
  return history


# --------------------------------------------------------------------------- paths, labels


def test_path_strings_and_first_match_wins():
  paths = optim.path_strings(_shapes_as_zeros())
  assert paths["encoder"]["layers"][1]["kernel"] == "encoder.layers.1.kernel"
  assert paths["encoder"]["norm"]["scale"] == "encoder.norm.scale"
  assert paths["embeddings"]["embedding"] == "embeddings.embedding"

  labels = optim.label_by_regex(_shapes_as_zeros(),
                                [(r"layers\.1\.", "second"), (r"kernel$", "kernel"),
                                 (r"layers", "layer")], "other")
  assert labels["encoder"]["layers"][1]["kernel"] == "second"  # Earlier pattern wins.
  assert labels["encoder"]["layers"][0]["kernel"] == "kernel"
  assert labels["encoder"]["layers"][0]["bias"] == "layer"
  assert labels["head"]["kernel"] == "kernel"
  assert labels["encoder"]["norm"]["scale"] == "other"
  assert jax.tree.structure(labels) == jax.tree.structure(_shapes_as_zeros())


def _shapes_as_zeros():
  return jax.tree.map(np.zeros, _shapes(), is_leaf=lambda x: isinstance(x, tuple))


# --------------------------------------------------------------------------- torch parity

STEPS, WARMUP, PEAK, DECAY, CLIP = 6, 2, 0.05, 0.1, 2.0
# Gradient scales per step: with CLIP the global norm (about 6 * scale) is clipped at some
# steps and not at others, so clipping changes Adam's moments, not just their scale.
GRAD_SCALES = (0.1, 5.0, 0.2, 3.0, 1.0, 0.05)


def _torch_reference(name: str, params, grads_per_step, clip: float):
  import torch

  flat_paths = jax.tree.leaves(optim.path_strings(params))
  tensors = [torch.tensor(np.array(x), requires_grad=True) for x in jax.tree.leaves(params)]
  no_decay = lambda path: path.endswith(("bias", "scale"))
  head = lambda path: path.startswith("head.")
  groups = [
      {"params": [t for t, p in zip(tensors, flat_paths) if not no_decay(p) and not head(p)],
       "weight_decay": DECAY},
      {"params": [t for t, p in zip(tensors, flat_paths) if no_decay(p)],
       "weight_decay": 0.0},
      # lr_multipliers (("^head\\.", 0.1),) == a group with a tenth of the lr.
      {"params": [t for t, p in zip(tensors, flat_paths) if head(p)],
       "weight_decay": DECAY, "lr": 0.1 * PEAK},
  ]
  assert sum(len(g["params"]) for g in groups) == len(tensors)
  cls = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam}[name]
  opt = cls(groups, lr=PEAK, betas=(0.9, 0.999), eps=1e-8)
  # HF's get_linear_schedule_with_warmup lambda.
  lam = lambda s: s / WARMUP if s < WARMUP else max(0.0, (STEPS - s) / (STEPS - WARMUP))
  sched = torch.optim.lr_scheduler.LambdaLR(opt, lam)
  history = []
  for grads in grads_per_step:
    for t, g in zip(tensors, jax.tree.leaves(grads)):
      t.grad = torch.tensor(np.array(g))
    if clip:
      torch.nn.utils.clip_grad_norm_(tensors, clip)
    opt.step()
    sched.step()
    history.append([t.detach().numpy().copy() for t in tensors])
  return history


@pytest.mark.parametrize("name,clip", [("adamw", 0.0), ("adam", 0.0), ("adamw", CLIP),
                                       ("adam", CLIP)])
def test_matches_torch(name, clip, one_torch_thread):
  params = _params()
  rng = np.random.default_rng(1)
  grads_per_step = [jax.tree.map(lambda p: (s * rng.normal(size=p.shape)).astype(np.float32),
                                 params) for s in GRAD_SCALES]
  opt = optim.make_optimizer(
      _config(name=name, learning_rate=PEAK, weight_decay=DECAY, schedule="linear",
              warmup_steps=WARMUP, clip_norm=clip, lr_multipliers=((r"^head\.", 0.1),)),
      STEPS)
  ours = _run(opt, params, grads_per_step)
  theirs = _torch_reference(name, params, grads_per_step, clip)

  flat_paths = jax.tree.leaves(optim.path_strings(params))
  start = jax.tree.leaves(params)
  for step, (ours_step, theirs_step) in enumerate(zip(ours, theirs)):
    for path, a, b in zip(flat_paths, jax.tree.leaves(ours_step), theirs_step):
      np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL, err_msg=f"{path} step {step}")
  # The comparison means something: every parameter moved far beyond the tolerance.
  for path, a, p0 in zip(flat_paths, jax.tree.leaves(ours[-1]), start):
    assert np.max(np.abs(a - p0)) > 1e-2, path


# --------------------------------------------------------------------------- clipping


def _first_step_gradient(opt, params, grads):
  """The gradient the Adam stage saw on step 1, recovered from the update.

  With a constant lr of 1 the first update is u = -g / (|g| + eps) elementwise (the bias
  corrections cancel), so g = -eps * u / (1 - |u|): whatever clipping did shows in u.
  """
  state = opt.tx.init(params)
  updates, _ = jax.jit(opt.tx.update)(grads, state, params)
  eps = 1.0
  return jax.tree.map(lambda u: -eps * np.asarray(u) / (1.0 - np.abs(np.asarray(u))), updates)


def test_clip_by_global_norm_matches_torch(one_torch_thread):
  import torch

  params = _params()
  rng = np.random.default_rng(2)
  grads = jax.tree.map(lambda p: rng.normal(size=p.shape).astype(np.float32), params)
  norm = math.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2))
                       for g in jax.tree.leaves(grads)))
  clip = norm / 4  # Exceeded: the clipped gradient has global norm `clip`.
  tensors = [torch.zeros(g.shape, requires_grad=True) for g in jax.tree.leaves(grads)]
  for t, g in zip(tensors, jax.tree.leaves(grads)):
    t.grad = torch.tensor(np.array(g))
  reported = torch.nn.utils.clip_grad_norm_(tensors, clip)
  assert float(reported) == pytest.approx(norm, rel=1e-6)

  fields = dict(name="adam", learning_rate=1.0, schedule="constant", eps=1.0)
  seen = _first_step_gradient(optim.make_optimizer(_config(clip_norm=clip, **fields), 1),
                              params, grads)
  seen_norm = math.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2))
                            for g in jax.tree.leaves(seen)))
  assert seen_norm == pytest.approx(clip, rel=1e-5)
  for a, t in zip(jax.tree.leaves(seen), tensors):
    np.testing.assert_allclose(a, t.grad.numpy(), rtol=1e-5, atol=1e-6)

  # Below the threshold, and with clipping off, the gradient passes unchanged.
  for clip_norm in (2 * norm, 0.0):
    seen = _first_step_gradient(
        optim.make_optimizer(_config(clip_norm=clip_norm, **fields), 1), params, grads)
    for a, g in zip(jax.tree.leaves(seen), jax.tree.leaves(grads)):
      np.testing.assert_allclose(a, g, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- schedules


@pytest.mark.parametrize("kind,quarter,middle", [
    ("linear", 0.1 + 0.9 * 0.75, 0.55),
    ("cosine", 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4)), 0.55),
    ("constant", 1.0, 1.0),
])
def test_schedule_values(kind, quarter, middle):
  opt = optim.make_optimizer(_config(learning_rate=2.0, schedule=kind, warmup_steps=10,
                                     end_factor=0.1), 110)
  final = 0.1 if kind != "constant" else 1.0
  expected = {0: 0.0, 5: 0.5, 10: 1.0, 35: quarter, 60: middle, 110: final, 500: final}
  for step, value in expected.items():
    assert float(opt.schedule(step)) == pytest.approx(2.0 * value, rel=1e-6, abs=1e-7), step
  # Traced steps (as in the jitted train step) give the same values.
  steps = jnp.array(list(expected), jnp.int32)
  np.testing.assert_allclose(jax.jit(jax.vmap(opt.schedule))(steps),
                             [2.0 * v for v in expected.values()], rtol=1e-6, atol=1e-7)


def test_schedule_without_warmup_starts_at_peak_and_decays_to_zero():
  opt = optim.make_optimizer(_config(learning_rate=3e-4, schedule="linear"), 100)
  assert float(opt.schedule(0)) == pytest.approx(3e-4)
  assert float(opt.schedule(50)) == pytest.approx(1.5e-4)
  assert float(opt.schedule(100)) == 0.0


# --------------------------------------------------------------------------- masks, factors


def test_lr_multipliers_scale_the_first_step():
  params = {"a": {"kernel": np.ones((4, 3), np.float32)},
            "b": {"kernel": np.ones((4, 3), np.float32)},
            "c": {"kernel": np.ones((4, 3), np.float32)}}
  rng = np.random.default_rng(3)
  grads = jax.tree.map(lambda p: rng.normal(size=p.shape).astype(np.float32), params)
  opt = optim.make_optimizer(
      _config(name="adamw", learning_rate=0.01, schedule="constant", clip_norm=0.0,
              lr_multipliers=((r"^b\.", 0.1), (r"b", 5.0), (r"^c\.", 0.0))), 1)
  updates, _ = jax.jit(opt.tx.update)(grads, opt.tx.init(params), params)
  a, b, c = (np.abs(np.asarray(updates[k]["kernel"])) for k in "abc")
  # First Adam step: |update| = lr * |g| / (|g| + eps) ~ lr for the unmatched parameter.
  np.testing.assert_allclose(a, 0.01, rtol=1e-5)
  np.testing.assert_allclose(b / a, 0.1, rtol=1e-6)  # "^b\." wins over the later "b".
  assert np.all(c == 0)


def test_weight_decay_mask_default_exempts_bias_and_scale_only():
  params = _params()
  zero_grads = jax.tree.map(np.zeros_like, params)
  lr, wd = 0.1, 0.5
  for name in optim.NAMES:
    opt = optim.make_optimizer(_config(name=name, learning_rate=lr, weight_decay=wd,
                                       schedule="constant"), 1)
    (after,) = _run(opt, params, [zero_grads])
    paths = optim.path_strings(params)
    for path, p0, p1 in zip(jax.tree.leaves(paths), jax.tree.leaves(params),
                            jax.tree.leaves(after)):
      exempt = path.endswith(("bias", "scale"))
      if name == "adamw":  # p <- p - lr * wd * p (decoupled).
        expected = p0 if exempt else p0 * (1 - lr * wd)
        np.testing.assert_allclose(p1, expected, rtol=1e-6, err_msg=f"{name} {path}")
      else:  # L2 gradient wd * p, then Adam's first step: lr * sign(p).
        expected = p0 if exempt else p0 - lr * np.sign(p0)
        np.testing.assert_allclose(p1, expected, rtol=1e-5, atol=1e-6,
                                   err_msg=f"{name} {path}")

  # no_decay = "" decays everything, including biases.
  opt = optim.make_optimizer(_config(learning_rate=lr, weight_decay=wd, schedule="constant",
                                     no_decay=""), 1)
  (after,) = _run(opt, params, [zero_grads])
  np.testing.assert_allclose(after["encoder"]["norm"]["bias"],
                             params["encoder"]["norm"]["bias"] * (1 - lr * wd), rtol=1e-6)


# --------------------------------------------------------------------------- sharding


def test_sharded_parameters_give_the_same_result_and_keep_their_sharding():
  from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

  assert jax.device_count() == 8
  mesh = jax.make_mesh((2, 4, 1), ("data", "fsdp", "tensor"), axis_types=(AxisType.Auto,) * 3)
  params = {"dense": {"kernel": np.random.default_rng(4).normal(size=(8, 16)).astype(np.float32),
                      "bias": np.arange(16, dtype=np.float32)}}
  grads = jax.tree.map(lambda p: np.cos(p), params)
  specs = {"dense": {"kernel": P("fsdp", "data"), "bias": P("fsdp")}}
  shardings = jax.tree.map(lambda s: NamedSharding(mesh, s), specs)
  opt = optim.make_optimizer(_config(learning_rate=0.1, weight_decay=0.1, clip_norm=1.0,
                                     warmup_steps=1), 4)

  plain = _run(opt, params, [grads] * 3)[-1]

  sharded_params = jax.device_put(params, shardings)
  sharded_grads = jax.device_put(grads, shardings)
  # The trainer's recipe: the state's param-shaped parts take the params' shardings
  # (optax.tree_map_params sees through our custom transforms), the rest is replicated.
  state_shardings = optax.tree_map_params(
      opt.tx, lambda _, sharding: sharding, jax.eval_shape(opt.tx.init, params), shardings,
      transform_non_params=lambda _: NamedSharding(mesh, P()),
      is_leaf=lambda x: isinstance(x, NamedSharding))
  state = jax.jit(opt.tx.init, out_shardings=state_shardings)(sharded_params)
  assert state[2].nu["dense"]["kernel"].sharding == shardings["dense"]["kernel"]

  @jax.jit
  def step(p, s, g):
    u, s = opt.tx.update(g, s, p)
    return optax.apply_updates(p, u), s

  p = sharded_params
  for _ in range(3):
    p, state = step(p, state, sharded_grads)
  assert state[2].mu["dense"]["bias"].sharding.is_equivalent_to(shardings["dense"]["bias"], 1)
  for path in ("kernel", "bias"):
    assert p["dense"][path].sharding.is_equivalent_to(shardings["dense"][path], 2)
    np.testing.assert_allclose(np.asarray(p["dense"][path]), plain["dense"][path],
                               rtol=1e-6, atol=1e-7)


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize("field,value,match", [
    ("name", "sgd", r"config\.optimizer\.name .*adamw, adam.*'sgd'"),
    ("learning_rate", 0.0, r"config\.optimizer\.learning_rate .*0\.0"),
    ("learning_rate", -1e-4, r"config\.optimizer\.learning_rate .*-0\.0001"),
    ("learning_rate", float("nan"), r"config\.optimizer\.learning_rate .*nan"),
    ("b1", 1.0, r"config\.optimizer\.b1 .*1\.0"),
    ("b2", -0.1, r"config\.optimizer\.b2 .*-0\.1"),
    ("eps", -1e-8, r"config\.optimizer\.eps .*-1e-08"),
    ("weight_decay", -0.01, r"config\.optimizer\.weight_decay .*-0\.01"),
    ("schedule", "step", r"config\.optimizer\.schedule .*constant, linear, cosine.*'step'"),
    ("warmup_steps", -1, r"config\.optimizer\.warmup_steps .*-1"),
    ("warmup_steps", 101, r"config\.optimizer\.warmup_steps .*total_steps \(100\).*101"),
    ("end_factor", 1.5, r"config\.optimizer\.end_factor .*1\.5"),
    ("clip_norm", -1.0, r"config\.optimizer\.clip_norm .*-1\.0"),
    ("no_decay", "(bias", r"config\.optimizer\.no_decay .*'\(bias'"),
    ("lr_multipliers", (("head", -0.5),), r"config\.optimizer\.lr_multipliers .*-0\.5"),
    ("lr_multipliers", (("[head", 0.5),), r"config\.optimizer\.lr_multipliers .*'\[head'"),
    ("lr_multipliers", (("head",),), r"config\.optimizer\.lr_multipliers .*\('head',\)"),
])
def test_bad_fields_are_named(field, value, match):
  c = optim.default_config()
  with c.ignore_type():  # Bypass ConfigDict's own type check to reach ours.
    c[field] = value
  with pytest.raises(ValueError, match=match):
    optim.make_optimizer(c, 100)


def test_unknown_field_and_bad_total_steps():
  c = optim.default_config()
  c.lr = 1e-3  # A typo of learning_rate.
  with pytest.raises(ValueError, match=r"config\.optimizer\.lr is not an optimizer field"):
    optim.make_optimizer(c, 100)
  with pytest.raises(ValueError, match=r"total_steps .*0"):
    optim.make_optimizer(optim.default_config(), 0)


def test_default_config_builds_a_working_optimizer():
  c = optim.default_config()
  assert (c.name, c.b1, c.b2, c.eps, c.no_decay) == ("adamw", 0.9, 0.999, 1e-8,
                                                       r"(bias|scale)$")
  opt = optim.make_optimizer(c, 10)
  params = _params()
  (after,) = _run(opt, params, [jax.tree.map(np.ones_like, params)])
  np.testing.assert_allclose(after["head"]["kernel"], params["head"]["kernel"] - c.learning_rate,
                             rtol=1e-6)
