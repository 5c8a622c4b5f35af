"""The train state and its creation, already sharded, from a task's model factory.

The NNX model is split once into a static graph definition and pure nested dicts of
arrays: trainable parameters, frozen parameters (by the config's regex) and any other
non-RNG variables. With `config.ema_decay` the state also holds an exponential moving
average of the trainable parameters (train/step.py updates it; evaluation and inference
read it). Pure dicts keep optax, orbax and sharding code free of NNX types, and a
checkpoint is a plain tree that anything can read. RNG stream state is not kept: the step
reseeds every stream from `fold_in(rng, step)`, which is what makes a resumed run draw the
same dropout masks as an uninterrupted one.

Creation never materialises the model on one device: `nnx.eval_shape` gives shapes and
logical axes, the mesh rules turn those into shardings, and one jitted init with
`out_shardings` creates every array where it lives.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Mapping

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from flax import traverse_util

from mocheg_jax.parallel import distributed
from mocheg_jax.parallel import rules as rules_lib
from mocheg_jax.utils.run_once import run_once

Tree = Any


@flax.struct.dataclass
class TrainState:
  step: jax.Array  # int32 scalar: steps completed.
  params: Tree  # Trainable parameters (pure nested dict).
  opt_state: optax.OptState
  frozen: Tree  # Parameters matched by config.freeze: used, saved, never updated.
  others: Tree  # Non-parameter, non-RNG variables (none in our models today).
  # The first step whose loss or gradient was NaN/Inf (-1: none). Such a step's update is
  # skipped inside the jitted step, so the state stays the last good one.
  first_nonfinite_step: jax.Array
  # The moving average of `params` (same tree and shardings) when config.ema_decay > 0;
  # empty otherwise, so a run without it saves what it saved before the field existed.
  ema: Tree = flax.struct.field(default_factory=dict)


def path_string(path: tuple) -> str:
  return ".".join(str(k) for k in path)


def split_by_regex(tree: Mapping, pattern: str) -> tuple[dict, dict]:
  """(unmatched, matched) nested dicts; `pattern` is searched in each leaf's path string."""
  flat = traverse_util.flatten_dict(tree)
  regex = re.compile(pattern) if pattern else None
  matched = {p: v for p, v in flat.items() if regex and regex.search(path_string(p))}
  rest = {p: v for p, v in flat.items() if p not in matched}
  return traverse_util.unflatten_dict(rest), traverse_util.unflatten_dict(matched)


def merge_trees(a: Mapping, b: Mapping) -> dict:
  """The union of two nested dicts with disjoint leaves."""
  flat = traverse_util.flatten_dict(a)
  flat.update(traverse_util.flatten_dict(b))
  return traverse_util.unflatten_dict(flat)


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """What the step needs to rebuild the model from the state's dicts."""
  graphdef: Any
  params_template: nnx.State  # Abstract; pure dicts are poured back into copies of these.
  rng_template: nnx.State
  others_template: nnx.State
  param_axes: Tree  # Logical axes (PartitionSpec of names) per parameter, nested dict.
  freeze: str

  @classmethod
  def of(cls, factory: Callable[[], nnx.Module], freeze: str = "") -> "ModelSpec":
    abstract = nnx.eval_shape(factory)
    graphdef, params, rng, others = nnx.split(abstract, nnx.Param, nnx.RngState, ...)
    if jax.tree.leaves(others):
      kinds = sorted({type(v).__name__ for _, v in nnx.iter_graph(others)
                      if isinstance(v, nnx.Variable)})
      raise ValueError(f"the model has variables the trainer does not update ({kinds}); "
                       "only parameters and RNG streams are supported")
    axes = nnx.get_partition_spec(params).to_pure_dict()
    spec = cls(graphdef, params, rng, others, axes, freeze)
    trainable, _ = split_by_regex(params.to_pure_dict(), freeze)
    if freeze and not jax.tree.leaves(trainable):
      raise ValueError(f"config.freeze {freeze!r} matches every parameter: nothing to train")
    return spec

  def split_params(self, params: Mapping) -> tuple[dict, dict]:
    """(trainable, frozen) from a full parameter dict."""
    return split_by_regex(params, self.freeze)

  def merge(self, params: Mapping, frozen: Mapping, others: Mapping,
            rng: jax.Array | None) -> nnx.Module:
    """The model with these values; every RNG stream reseeded from `rng` when given."""
    param_state = _filled(self.params_template, merge_trees(params, frozen))
    others_state = _filled(self.others_template, others)
    rng_state = _reseeded(self.rng_template, rng)
    return nnx.merge(self.graphdef, param_state, rng_state, others_state)

  def param_shardings(self, mesh: jax.sharding.Mesh, rules) -> Tree:
    shapes = jax.tree.map(lambda v: v, self.params_template.to_pure_dict())
    return rules_lib.shardings(self.param_axes, shapes, mesh, rules)


def _filled(template: nnx.State, values: Mapping) -> nnx.State:
  state = jax.tree.map(lambda x: x, template)  # A copy: templates are shared across traces.
  nnx.replace_by_pure_dict(state, values)
  return state


def _reseeded(template: nnx.State, rng: jax.Array | None) -> nnx.State:
  """RNG state with the k-th stream key = fold_in(rng, k) and counts zero (graph order)."""
  flat = traverse_util.flatten_dict(template.to_pure_dict())
  keys = sorted(p for p in flat if p[-1] == "key")  # Sorted paths: a stable stream order.
  base = rng if rng is not None else jax.random.key(0)
  values = {}
  for path, leaf in flat.items():
    if path[-1] == "key":
      values[path] = jax.random.fold_in(base, keys.index(path))
    else:
      values[path] = jnp.zeros(leaf.shape, leaf.dtype)
  return _filled(template, traverse_util.unflatten_dict(values))


def state_shardings(spec: ModelSpec, tx: optax.GradientTransformation,
                    mesh: jax.sharding.Mesh, rules, ema: bool = False) -> TrainState:
  """The sharding of every leaf of the train state (optimizer state and the parameters'
  moving average, with `ema`, follow the parameters)."""
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  shardings = spec.param_shardings(mesh, rules)
  trainable, frozen = spec.split_params(shardings)
  abstract_trainable, _ = spec.split_params(spec.params_template.to_pure_dict())
  abstract_opt = jax.eval_shape(tx.init, abstract_trainable)
  opt_shardings = optax.tree_map_params(
      tx, lambda _, sharding: sharding, abstract_opt, trainable,
      transform_non_params=lambda _: replicated,
      is_leaf=lambda x: isinstance(x, jax.sharding.NamedSharding))
  others = jax.tree.map(lambda _: replicated, spec.others_template.to_pure_dict())
  return TrainState(step=replicated, params=trainable, opt_state=opt_shardings, frozen=frozen,
                    others=others, first_nonfinite_step=replicated,
                    ema=trainable if ema else {})


def _init_fn(spec: ModelSpec, factory: Callable[[], nnx.Module],
             tx: optax.GradientTransformation, ema: bool = False) -> Callable[[], TrainState]:
  def init() -> TrainState:
    model = factory()
    _, params, _, others = nnx.split(model, nnx.Param, nnx.RngState, ...)
    trainable, frozen = spec.split_params(params.to_pure_dict())
    return TrainState(step=jnp.zeros((), jnp.int32), params=trainable,
                      opt_state=tx.init(trainable), frozen=frozen,
                      others=others.to_pure_dict(),
                      first_nonfinite_step=jnp.full((), -1, jnp.int32),
                      # Zeros: the first update replaces them with the parameters
                      # (step.py's decay is 0 at step 0), also initial ones loaded later.
                      ema=jax.tree.map(jnp.zeros_like, trainable) if ema else {})
  return init


def init_state(spec: ModelSpec, factory: Callable[[], nnx.Module],
               tx: optax.GradientTransformation, shardings: TrainState) -> TrainState:
  """A fresh train state, every array created in place by one jitted init (with a moving
  average of the parameters when `shardings` has one)."""
  return run_once(jax.jit(_init_fn(spec, factory, tx, bool(shardings.ema)),
                          out_shardings=shardings))


def abstract_state(spec: ModelSpec, factory: Callable[[], nnx.Module],
                   tx: optax.GradientTransformation, shardings: TrainState) -> TrainState:
  """ShapeDtypeStructs with shardings: the restore target of a checkpoint."""
  shapes = jax.eval_shape(_init_fn(spec, factory, tx, bool(shardings.ema)))
  return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                      shapes, shardings)


def load_initial_params(state: TrainState, spec: ModelSpec, values: Mapping,
                        shardings: TrainState, source: str = "initial_params") -> TrainState:
  """Overwrites parameters with `values` (a nested dict, any subset), placed by sharding."""
  flat_values = traverse_util.flatten_dict(dict(values))
  trainable = traverse_util.flatten_dict(state.params)
  frozen = traverse_util.flatten_dict(state.frozen)
  sharding = {**traverse_util.flatten_dict(shardings.params),
              **traverse_util.flatten_dict(shardings.frozen)}
  for path, value in flat_values.items():
    target = trainable if path in trainable else frozen if path in frozen else None
    if target is None:
      raise ValueError(f"{source}: the model has no parameter {path_string(path)!r}")
    value = np.asarray(value)
    if value.shape != target[path].shape:
      raise ValueError(f"{source}: parameter {path_string(path)!r} has shape {value.shape}, "
                       f"the model expects {target[path].shape}")
    target[path] = distributed.place(value.astype(target[path].dtype), sharding[path])
  return state.replace(params=traverse_util.unflatten_dict(trainable),
                       frozen=traverse_util.unflatten_dict(frozen))
