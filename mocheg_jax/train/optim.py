"""The optimizer from config: AdamW / Adam, warmup + decay, clipping, decay mask, lr multipliers.

Every training config has an `optimizer` block that starts from `default_config()`;
`make_optimizer(config.optimizer, config.total_steps)` turns it into one optax chain:

  clip by global norm -> [adam: L2 on the gradient] -> Adam scaling
    -> [adamw: decoupled weight decay] -> per-regex lr multipliers -> -schedule(step)

which reproduces torch.optim.AdamW / torch.optim.Adam with per-group learning rates and a
LambdaLR schedule to float32 precision (tests/test_optim.py checks it against torch step by
step). The Adam scaling is our own small transform, not optax.scale_by_adam, only because
optax's float32 bias correction is 6e-6 off torch's in the first steps.

The weight-decay mask and the multipliers are computed from the parameter tree handed to
`tx.init` / `tx.update` (its path strings, e.g. "bert.encoder.layers.0.attention.query.kernel"),
not fixed when the optimizer is built, so one Optimizer serves any model. That is pure
Python on the tree structure (static under jit), and every array op is elementwise or the
global-norm reduction, so updates keep the parameters' sharding. A jitted `tx.init` needs
`out_shardings` for the state (as every jitted init does): `optax.tree_map_params(tx,
lambda _, s: s, jax.eval_shape(tx.init, params), param_shardings, transform_non_params=
lambda _: replicated, is_leaf=...)` gives the moments the parameters' shardings.

Freezing parameters is not done here: the trainer hands the optimizer only the trainable
parameters (config.freeze), which also saves their optimizer state.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import re
from typing import Any, Callable, Mapping, Sequence, TypeVar

import jax
import jax.numpy as jnp
import ml_collections
import optax

T = TypeVar("T")

NAMES = ("adamw", "adam")
SCHEDULES = ("constant", "linear", "cosine")

# Biases and LayerNorm scales are not decayed, as HF Trainer and sentence-transformers do;
# embeddings are (HF does too). CLIP's `logit_scale` matches as well, as in open_clip.
DEFAULT_NO_DECAY = r"(bias|scale)$"


def default_config() -> ml_collections.ConfigDict:
  """The `optimizer` block every config starts from (HF Trainer's defaults, torch's Adam)."""
  c = ml_collections.ConfigDict()
  c.name = "adamw"  # adamw (decoupled weight decay) | adam (L2 added to the gradient).
  c.learning_rate = 5e-5  # Peak learning rate, reached at the end of warmup.
  c.b1 = 0.9
  c.b2 = 0.999
  c.eps = 1e-8  # Added to sqrt(v_hat), outside the root, as torch does.
  c.weight_decay = 0.0
  c.schedule = "linear"  # constant | linear | cosine, from the end of warmup to total_steps.
  c.warmup_steps = 0  # Linear warmup from 0 (at step 0) to the peak (at warmup_steps).
  c.end_factor = 0.0  # Final learning rate = end_factor * peak (linear and cosine only).
  c.clip_norm = 1.0  # Clip gradients by global norm first; 0 turns clipping off.
  # Regex (re.search) of parameter path strings exempt from weight decay; "" decays all.
  c.no_decay = DEFAULT_NO_DECAY
  # ((regex, factor), ...): the first matching pattern scales that parameter's learning
  # rate (and so its decoupled weight decay), like a torch param group with its own lr.
  c.lr_multipliers = ()
  return c


# ----------------------------------------------------------------------------- paths


def _key_text(key: Any) -> str:
  if isinstance(key, jax.tree_util.DictKey):
    return str(key.key)
  if isinstance(key, jax.tree_util.SequenceKey):
    return str(key.idx)
  if isinstance(key, jax.tree_util.GetAttrKey):  # NamedTuples, e.g. optimizer states.
    return key.name
  if isinstance(key, jax.tree_util.FlattenedIndexKey):
    return str(key.key)
  raise TypeError(f"cannot name a parameter path entry {key!r} ({type(key).__name__}); "
                  "parameters must be pure nested dicts / lists")


def _path_text(path: Sequence[Any]) -> str:
  return ".".join(_key_text(k) for k in path)


def path_strings(tree: Any) -> Any:
  """The tree with each leaf replaced by its path, keys joined with "." ("a.b.0.c")."""
  return jax.tree_util.tree_map_with_path(lambda path, _: _path_text(path), tree)


def label_by_regex(tree: Any, patterns: Sequence[tuple[str, T]], default: T) -> Any:
  """Labels each leaf by the first pattern that `re.search`-matches its path string.

  Args:
    tree: a pytree (pure nested dicts / lists of arrays, or abstract shapes).
    patterns: (regex, label) pairs, tried in order; the first match wins.
    default: the label of leaves that no pattern matches.

  Returns:
    A tree of the same structure with labels as leaves.
  """
  compiled = []
  for pattern, label in patterns:
    try:
      compiled.append((re.compile(pattern), label))
    except re.error as e:
      raise ValueError(f"bad regular expression {pattern!r}: {e}") from None

  def pick(path, _):
    text = _path_text(path)
    for regex, label in compiled:
      if regex.search(text):
        return label
    return default

  return jax.tree_util.tree_map_with_path(pick, tree)


# ----------------------------------------------------------------------------- pieces


def make_schedule(peak: float, kind: str, warmup_steps: int, total_steps: int,
                  end_factor: float = 0.0) -> optax.Schedule:
  """Linear warmup from 0 to `peak`, then constant / linear / cosine decay to the end.

  The value at step `s` is the learning rate of the update made at step `s` (optax counts
  from 0, like torch's LambdaLR): 0 at step 0 when there is warmup, `peak` at
  `warmup_steps`, and `end_factor * peak` at `total_steps` and after. Arguments are
  assumed valid (`make_optimizer` checks them).
  """
  end = peak * end_factor
  decay_steps = max(total_steps - warmup_steps, 1)  # 1: no decay phase; jump to `end`.

  def schedule(step: jax.typing.ArrayLike) -> jax.Array:
    step = jnp.asarray(step, jnp.float32)
    if kind == "constant":
      after = jnp.full_like(step, peak)
    else:
      t = jnp.clip((step - warmup_steps) / decay_steps, 0.0, 1.0)
      frac = 1.0 - t if kind == "linear" else 0.5 * (1.0 + jnp.cos(jnp.pi * t))
      after = end + (peak - end) * frac
    if warmup_steps == 0:
      return after
    return jnp.where(step < warmup_steps, peak * step / warmup_steps, after)

  return schedule


def _bias_correction(b: float, t: jax.Array) -> jax.Array:
  """1 - b**t to float32 precision, for b in [0, 1) and a float32 step t >= 1."""
  if b == 0.0:
    return jnp.ones_like(t)
  # optax evaluates 1 - b**t with b rounded to float32 first: for b = 0.999 that is off by
  # 1.3e-5 relative at t = 1 (6e-6 in the first updates). log(b) taken in float64 and
  # expm1 keep the relative error near 1e-7, as torch's float64 bias correction does.
  return -jnp.expm1(t * math.log(b))


def scale_by_adam(b1: float, b2: float, eps: float) -> optax.GradientTransformation:
  """Adam's scaling m_hat / (sqrt(v_hat) + eps), as torch.optim.Adam / AdamW compute it.

  The same algorithm and state (optax.ScaleByAdamState) as `optax.scale_by_adam`, with
  the bias corrections computed precisely (see `_bias_correction`), so the first steps
  agree with torch to float32 precision. The moments have the parameters' dtype.
  """

  def init_fn(params):
    return optax.ScaleByAdamState(count=jnp.zeros([], jnp.int32),
                                  mu=jax.tree.map(jnp.zeros_like, params),
                                  nu=jax.tree.map(jnp.zeros_like, params))

  def update_fn(updates, state, params=None):
    del params
    mu = jax.tree.map(lambda g, m: m + (1.0 - b1) * (g - m), updates, state.mu)
    nu = jax.tree.map(lambda g, v: b2 * v + (1.0 - b2) * (g * g), updates, state.nu)
    count = optax.safe_increment(state.count)
    t = count.astype(jnp.float32)
    correction1 = _bias_correction(b1, t)
    root_correction2 = jnp.sqrt(_bias_correction(b2, t))
    updates = jax.tree.map(
        lambda m, v: (m / correction1.astype(m.dtype))
        / (jnp.sqrt(v) / root_correction2.astype(v.dtype) + eps),
        mu, nu)
    return updates, optax.ScaleByAdamState(count=count, mu=mu, nu=nu)

  return optax.GradientTransformation(init_fn, update_fn)


def scale_by_regex(patterns: Sequence[tuple[str, float]]) -> optax.GradientTransformation:
  """Multiplies each update by the factor of the first pattern matching its path (else 1).

  Stateless; the factors are looked up from the updates' tree at every (traced) update.
  """
  patterns = tuple((p, float(f)) for p, f in patterns)

  def init_fn(params):
    del params
    return optax.EmptyState()

  def update_fn(updates, state, params=None):
    del params
    factors = label_by_regex(updates, patterns, 1.0)
    # A factor of exactly 1 leaves the update untouched (bit for bit, and no extra op).
    updates = jax.tree.map(lambda u, f: u if f == 1.0 else u * f, updates, factors)
    return updates, state

  return optax.GradientTransformation(init_fn, update_fn)


@dataclasses.dataclass(frozen=True)
class Optimizer:
  """An optax transformation and its base learning-rate schedule (for logging).

  Attributes:
    tx: the whole chain; `tx.update(grads, state, params)` needs `params` (weight decay).
    schedule: step -> peak-scaled base learning rate, before any lr multiplier.
  """
  tx: optax.GradientTransformation
  schedule: optax.Schedule


# ----------------------------------------------------------------------------- config


def _fields(config: Any) -> dict[str, Any]:
  if isinstance(config, (ml_collections.ConfigDict, ml_collections.FrozenConfigDict)):
    return dict(config.items())
  if isinstance(config, Mapping):
    return dict(config)
  raise TypeError(f"the optimizer config must be a ConfigDict, got {type(config).__name__}")


def _bad(field: str, value: Any, what: str) -> ValueError:
  return ValueError(f"config.optimizer.{field} must be {what}, got {value!r}")


def _real(fields: Mapping[str, Any], field: str, low: float, high: float = math.inf,
          low_open: bool = False, high_open: bool = False) -> float:
  """The field as a float within [low, high] (open ends where asked), else a ValueError."""
  value = fields[field]
  lo, hi = ("(" if low_open else "["), (")" if high_open else "]")
  what = f"a number in {lo}{low:g}, {high:g}{hi}"
  if isinstance(value, bool) or not isinstance(value, numbers.Real):
    raise _bad(field, value, what)
  value = float(value)
  if (math.isnan(value) or value < low or (low_open and value == low)
      or value > high or (high_open and value == high)):
    raise _bad(field, value, what)
  return value


def _choice(fields: Mapping[str, Any], field: str, choices: Sequence[str]) -> str:
  value = fields[field]
  if value not in choices:
    raise _bad(field, value, f"one of {', '.join(choices)}")
  return value


def _regex(field: str, pattern: Any) -> str:
  if not isinstance(pattern, str):
    raise _bad(field, pattern, "a regular expression string")
  try:
    re.compile(pattern)
  except re.error as e:
    raise _bad(field, pattern, f"a valid regular expression ({e})") from None
  return pattern


def _multipliers(value: Any) -> tuple[tuple[str, float], ...]:
  field = "lr_multipliers"
  if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
    raise _bad(field, value, "a sequence of (regex, factor) pairs")
  pairs = []
  for item in value:
    if isinstance(item, (str, bytes)) or not isinstance(item, Sequence) or len(item) != 2:
      raise _bad(field, item, "a (regex, factor) pair")
    pattern, factor = item
    _regex(field, pattern)
    if (isinstance(factor, bool) or not isinstance(factor, numbers.Real)
        or not math.isfinite(factor) or factor < 0):
      raise _bad(field, item, "a (regex, factor) pair with a finite factor >= 0")
    pairs.append((pattern, float(factor)))
  return tuple(pairs)


def make_optimizer(config: ml_collections.ConfigDict, total_steps: int) -> Optimizer:
  """Builds the optimizer that `config` (the `optimizer` block) describes.

  Args:
    config: the `optimizer` block (fields as in `default_config()`; missing fields take
      their defaults, unknown fields are an error).
      * name: "adamw" applies weight decay decoupled from the gradient, scaled by the
        learning rate (torch.optim.AdamW); "adam" adds `weight_decay * param` to the
        gradient before the Adam scaling (torch.optim.Adam's L2).
      * lr_multipliers: ((regex, factor), ...); the first matching pattern scales that
        parameter's update, so also its decoupled weight decay, like a torch param group
        with `lr = factor * lr`. A factor of 0 stops the parameter from moving but still
        computes its gradient and keeps Adam state for it: to freeze parameters use the
        trainer's `config.freeze` regex, which skips both.
      * no_decay: parameters whose path matches are not decayed ("" = decay all).
    total_steps: the length of training; the schedule decays until this step.

  Returns:
    An Optimizer (`tx` and its base-lr `schedule`).

  Raises:
    ValueError: a field is unknown or has a bad value; the message names
      `config.optimizer.<field>` and the value.
  """
  defaults = _fields(default_config())
  given = _fields(config)
  unknown = sorted(set(given) - set(defaults))
  if unknown:
    raise ValueError(f"config.optimizer.{unknown[0]} is not an optimizer field "
                     f"(fields: {', '.join(defaults)})")
  fields = {**defaults, **given}

  name = _choice(fields, "name", NAMES)
  peak = _real(fields, "learning_rate", 0.0, low_open=True)
  b1 = _real(fields, "b1", 0.0, 1.0, high_open=True)
  b2 = _real(fields, "b2", 0.0, 1.0, high_open=True)
  eps = _real(fields, "eps", 0.0)
  weight_decay = _real(fields, "weight_decay", 0.0)
  kind = _choice(fields, "schedule", SCHEDULES)
  end_factor = _real(fields, "end_factor", 0.0, 1.0)
  clip_norm = _real(fields, "clip_norm", 0.0)
  no_decay = _regex("no_decay", fields["no_decay"])
  multipliers = _multipliers(fields["lr_multipliers"])
  if isinstance(total_steps, bool) or not isinstance(total_steps, numbers.Integral) \
      or total_steps <= 0:
    raise ValueError(f"total_steps must be a positive integer, got {total_steps!r}")
  warmup = fields["warmup_steps"]
  if isinstance(warmup, bool) or not isinstance(warmup, numbers.Integral) or warmup < 0:
    raise _bad("warmup_steps", warmup, "an integer >= 0")
  if warmup > total_steps:
    raise _bad("warmup_steps", warmup, f"at most total_steps ({total_steps})")

  schedule = make_schedule(peak, kind, int(warmup), int(total_steps), end_factor)

  decay: optax.GradientTransformation = optax.identity()
  if weight_decay > 0:
    mask: Callable[[Any], Any] | None = None
    if no_decay:
      mask = lambda tree: label_by_regex(tree, [(no_decay, False)], True)
    decay = optax.add_decayed_weights(weight_decay, mask=mask)

  # Always the same six slots (identity where a piece is off): the state's arrays (Adam's
  # moments and count, the schedule's count) keep their positions whatever is switched on,
  # so turning clipping or weight decay on or off does not move them in a checkpoint.
  tx = optax.chain(
      optax.clip_by_global_norm(clip_norm) if clip_norm > 0 else optax.identity(),
      decay if name == "adam" else optax.identity(),
      scale_by_adam(b1, b2, eps),
      decay if name == "adamw" else optax.identity(),
      scale_by_regex(multipliers) if multipliers else optax.identity(),
      optax.scale_by_learning_rate(schedule),
  )
  return Optimizer(tx=tx, schedule=schedule)

