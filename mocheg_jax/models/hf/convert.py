"""Conversion as data: a table of rules {our parameter path <-> HF key} plus reversible hooks.

A model's table lists one `Rule` per parameter, with `{i}` standing for a layer index that
`expand` fills in. Import checks both directions: a parameter of ours with no weight, or a
weight in the checkpoint that nothing consumes, is an error that names them (an explicit
`dont_load` regex keeps freshly initialised heads, `ignore` regexes skip known buffers).
Shapes are checked before anything is assigned.

`load_into_abstract` is how every family's `load` builds a model: abstractly (no random
initialisation of weights the checkpoint then overwrites), filled from the checkpoint, and
only the variables the checkpoint does not hold (RNG state, `dont_load` heads) made concrete.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Callable, Iterable, Mapping, Sequence, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mocheg_jax.data.report import MochegInputError
from mocheg_jax.utils.run_once import run_once

M = TypeVar("M", bound=nnx.Module)


# ---- hooks: HF tensor <-> our tensor, each with its exact inverse --------------------------
@dataclasses.dataclass(frozen=True)
class Hook:
  name: str
  to_ours: Callable[[np.ndarray, tuple[int, ...]], np.ndarray]
  to_hf: Callable[[np.ndarray], np.ndarray]


IDENTITY = Hook("identity", lambda x, shape: x.reshape(shape), lambda x: x)
# A per-head bias [heads * head_dim] <-> ours [heads, head_dim].
HEADS_BIAS = Hook("heads_bias", lambda x, shape: x.reshape(shape), lambda x: x.reshape(-1))
# torch Linear stores [out, in]; we store [in, out] (and [in, heads, head_dim] for q/k/v).
LINEAR = Hook("linear", lambda x, shape: x.T.reshape(shape),
              lambda x: x.reshape(x.shape[0], -1).T)
# Output projection [out, heads * head_dim] <-> ours [heads, head_dim, out].
LINEAR_HEADS_IN = Hook("linear_heads_in", lambda x, shape: x.T.reshape(shape),
                       lambda x: x.reshape(-1, x.shape[-1]).T)
# Conv2d [out, in, kh, kw] <-> ours [kh, kw, in, out].
CONV = Hook("conv", lambda x, shape: x.transpose(2, 3, 1, 0).reshape(shape),
            lambda x: x.transpose(3, 2, 0, 1))


@dataclasses.dataclass(frozen=True)
class Rule:
  ours: str  # e.g. "encoder.layers.{i}.attention.query.kernel"
  hf: str  # e.g. "encoder.layer.{i}.attention.self.query.weight"
  hook: Hook = IDENTITY
  aliases: tuple[str, ...] = ()  # Other HF keys that may hold the same (tied) tensor.


def expand(rules: Iterable[Rule], num_layers: int | dict[str, int]) -> list[Rule]:
  """Replaces `{i}` (or each named placeholder) by every layer index."""
  counts = {"i": num_layers} if isinstance(num_layers, int) else dict(num_layers)
  out: list[Rule] = []
  for rule in rules:
    names = [n for n in counts if "{" + n + "}" in rule.ours]
    if not names:
      out.append(rule)
      continue
    (name,) = names  # One placeholder per rule is all our tables need.
    for index in range(counts[name]):
      fill = lambda s: s.replace("{" + name + "}", str(index))  # noqa: E731
      out.append(Rule(fill(rule.ours), fill(rule.hf), rule.hook,
                      tuple(fill(a) for a in rule.aliases)))
  return out


# ---- our parameters -------------------------------------------------------------------------
def params_by_path(model: nnx.Module) -> dict[str, nnx.Variable]:
  """Every nnx.Param of `model` by dotted path ("encoder.layers.0.attention.query.kernel")."""
  out = {}
  for path, variable in nnx.iter_graph(model):
    if isinstance(variable, nnx.Param):
      out[".".join(str(p) for p in path)] = variable
  return out


# ---- checkpoint files ---------------------------------------------------------------------
ORBAX_DIR = "orbax_params"  # An orbax checkpoint of the HF-named tensors (scripts/convert.py).
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


def read_state_dict_file(path: str | os.PathLike) -> dict[str, np.ndarray]:
  """Tensors of one safetensors file."""
  from safetensors.numpy import load_file
  return load_file(os.fspath(path))


def read_state_dict(folder: str | os.PathLike) -> dict[str, np.ndarray]:
  """Tensors of a model folder: an orbax checkpoint written by scripts/convert.py, or HF's
  model.safetensors (also sharded) or pytorch_model.bin."""
  folder = os.fspath(folder)
  if os.path.isdir(os.path.join(folder, ORBAX_DIR)):
    import orbax.checkpoint as ocp
    restored = ocp.StandardCheckpointer().restore(os.path.abspath(
        os.path.join(folder, ORBAX_DIR)))
    return {k: np.asarray(v) for k, v in restored.items()}
  single = os.path.join(folder, "model.safetensors")
  index = os.path.join(folder, "model.safetensors.index.json")
  torch_bin = os.path.join(folder, "pytorch_model.bin")
  from safetensors.numpy import load_file
  if os.path.isfile(single):
    return read_state_dict_file(single)
  if os.path.isfile(index):
    with open(index) as f:
      shards = sorted(set(json.load(f)["weight_map"].values()))
    state = {}
    for shard in shards:
      state.update(load_file(os.path.join(folder, shard)))
    return state
  if os.path.isfile(torch_bin):
    try:
      import torch  # Only needed for the legacy pickle format.
    except ImportError:
      raise MochegInputError(f"{torch_bin}: reading pytorch_model.bin needs torch; install it "
                             "or convert the folder to safetensors") from None
    state = torch.load(torch_bin, map_location="cpu", weights_only=True)
    return {k: v.float().numpy() if v.is_floating_point() else v.numpy()
            for k, v in state.items()}
  raise MochegInputError(f"{folder}: no weights found (expected {ORBAX_DIR}/, "
                         "model.safetensors, model.safetensors.index.json or pytorch_model.bin)")


def read_config(folder: str | os.PathLike) -> dict:
  path = os.path.join(os.fspath(folder), "config.json")
  if not os.path.isfile(path):
    raise MochegInputError(f"{path}: missing file (HF config)")
  with open(path) as f:
    return json.load(f)


def write_hf_folder(out_dir: str | os.PathLike, state: dict[str, np.ndarray],
                    config: dict) -> None:
  """Writes model.safetensors and config.json that transformers loads."""
  from safetensors.numpy import save_file
  os.makedirs(out_dir, exist_ok=True)
  # ascontiguousarray turns 0-d arrays (CLIP's logit_scale) into 1-d ones; keep the shape.
  save_file({k: np.ascontiguousarray(v).reshape(np.shape(v)) for k, v in state.items()},
            os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
  with open(os.path.join(out_dir, "config.json"), "w") as f:
    json.dump(config, f, indent=2, sort_keys=True)


def write_orbax_weights(folder: str | os.PathLike, state: dict[str, np.ndarray]) -> None:
  """Saves HF-named tensors as an orbax checkpoint in `folder`/ORBAX_DIR."""
  import orbax.checkpoint as ocp
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(os.path.abspath(os.path.join(os.fspath(folder), ORBAX_DIR)), state,
                    force=True)
  checkpointer.wait_until_finished()


# ---- import / export --------------------------------------------------------------------
def _strip_prefix(state: dict[str, np.ndarray], keys: set[str],
                  prefixes: Sequence[str]) -> dict[str, np.ndarray]:
  """Drops the first prefix (e.g. "bert.") that makes the checkpoint match the table."""
  for prefix in prefixes:
    if prefix and any(k.startswith(prefix) for k in state) and not keys & set(state):
      return {k[len(prefix):] if k.startswith(prefix) else k: v for k, v in state.items()}
  return state


def import_weights(model: nnx.Module, state: dict[str, np.ndarray], rules: Sequence[Rule], *,
                   source: str = "checkpoint", dont_load: str | None = None,
                   ignore: Sequence[str] = (), prefixes: Sequence[str] = ()) -> None:
  """Assigns checkpoint tensors to `model`'s parameters in place, checking everything.

  Args:
    model: the NNX model (its parameter shapes are the truth).
    state: HF key -> tensor.
    rules: the expanded table.
    source: what to name in errors (the checkpoint folder).
    dont_load: regex of our parameter paths to leave as initialised (new heads).
    ignore: regexes of checkpoint keys that are known not to be parameters (buffers).
    prefixes: optional key prefixes to strip (e.g. "bert." of a BertForX checkpoint).
  """
  params = params_by_path(model)
  by_ours = {r.ours: r for r in rules}
  state = _strip_prefix(state, {r.hf for r in rules}, prefixes)
  skip = re.compile(dont_load) if dont_load else None
  no_rule = sorted(p for p in params if p not in by_ours and not (skip and skip.search(p)))
  if no_rule:
    raise MochegInputError(f"{source}: no conversion rule for our parameter(s) {no_rule}")
  missing, wrong_shape, used = [], [], set()
  updates = {}
  for path, variable in params.items():
    if skip and skip.search(path):
      continue
    rule = by_ours[path]
    key = next((k for k in (rule.hf, *rule.aliases) if k in state), None)
    if key is None:
      missing.append(rule.hf)
      continue
    used.update(k for k in (rule.hf, *rule.aliases) if k in state)
    shape = tuple(variable.get_value().shape)
    tensor = np.asarray(state[key])
    try:
      value = rule.hook.to_ours(tensor, shape)
    except ValueError:
      value = None
    if value is None or value.shape != shape:
      wrong_shape.append(f"{key} {tuple(tensor.shape)} -> {path} {shape}")
      continue
    updates[path] = value
  ignored = [re.compile(p) for p in ignore]
  unused = sorted(k for k in state if k not in used and not any(p.search(k) for p in ignored))
  problems = []
  if missing:
    problems.append(f"missing weights {missing}")
  if wrong_shape:
    problems.append(f"mismatched shapes {wrong_shape}")
  if unused:
    problems.append(f"unexpected weights {unused}")
  if problems:
    raise MochegInputError(f"{source}: " + "; ".join(problems))
  for path, value in updates.items():
    variable = params[path]
    variable.set_value(jnp.asarray(value, dtype=variable.get_value().dtype))


def export_weights(model: nnx.Module, rules: Sequence[Rule],
                   skip: str | None = None) -> dict[str, np.ndarray]:
  """Our parameters as an HF state dict (one tensor per rule; tied aliases left out)."""
  params = params_by_path(model)
  pattern = re.compile(skip) if skip else None
  out = {}
  for rule in rules:
    if pattern and pattern.search(rule.ours):
      continue
    if rule.ours not in params:
      raise ValueError(f"rule names {rule.ours!r}, which the model does not have")
    out[rule.hf] = rule.hook.to_hf(np.asarray(params[rule.ours].get_value(), np.float32))
  return out


# ---- building a model from a checkpoint -------------------------------------------------------
def load_into_abstract(factory: Callable[[], M], state: Mapping[str, np.ndarray],
                       rules: Sequence[Rule] | Callable[[M], Sequence[Rule]], *,
                       source: str = "checkpoint", dont_load: str | None = None,
                       ignore: Sequence[str] = (), prefixes: Sequence[str] = (),
                       seed: int = 0) -> M:
  """Builds `factory()` abstractly, imports `state` into it and materialises the rest.

  An eager build would initialise every parameter at random only to overwrite it (on CPU
  that also costs one XLA compilation per parameter shape: tens of seconds for a base-size
  model). Here the model is built with `nnx.eval_shape`, the checkpoint's tensors are
  imported (with every check of `import_weights`), and only what is still abstract then gets
  concrete values:
  * RNG stream keys (`nnx.RngKey`): `fold_in(key(seed), k)` for the k-th key in graph order,
    so every stream (dropout layers fork their own) is distinct and reproducible; counts
    (`nnx.RngCount`) start at 0. No compilation is needed for these.
  * Everything else (`dont_load` parameters, other non-parameter variables): exactly the
    values a concrete `factory()` gives them, from one jitted init that XLA prunes to those
    variables.

  Args:
    factory: builds the model; called once under `nnx.eval_shape`, and once more under jit
      when something besides RNG state is left to initialise. It must create its own
      `nnx.Rngs` (from a seed or a key), not close over a caller's `nnx.Rngs` object, whose
      state tracing would overwrite with tracers.
    state: HF key -> tensor (see `read_state_dict`).
    rules: the expanded table, or a function of the abstract model that returns it (for
      tables that depend on the model's structure, e.g. which head it has).
    source: what to name in errors (the checkpoint folder or file).
    dont_load: regex of our parameter paths to leave freshly initialised (new heads).
    ignore: regexes of checkpoint keys that are not parameters (buffers).
    prefixes: key prefixes to strip when the checkpoint needs it (e.g. "bert.").
    seed: seeds the RNG stream keys (see above).

  Returns:
    The model, every variable concrete.

  Raises:
    MochegInputError: missing, unexpected or mismatched weights (see `import_weights`).
  """
  model = nnx.eval_shape(factory)
  table = rules(model) if callable(rules) else rules
  import_weights(model, dict(state), table, source=source, dont_load=dont_load,
                 ignore=ignore, prefixes=prefixes)
  materialize(model, factory, seed)
  return model


def materialize(model: nnx.Module, factory: Callable[[], nnx.Module], seed: int = 0) -> None:
  """Gives concrete values to the variables of `model` that are still abstract, in place.

  See `load_into_abstract` for which values. `model` must have `factory()`'s structure.
  """
  empty = [(path, v) for path, v in nnx.iter_graph(model)
           if isinstance(v, nnx.Variable) and isinstance(v.get_value(), jax.ShapeDtypeStruct)]
  base = jax.random.key(seed)
  others, keys = [], 0
  for path, variable in empty:
    if isinstance(variable, nnx.RngKey):
      variable.set_value(jax.random.fold_in(base, keys))
      keys += 1
    elif isinstance(variable, nnx.RngCount):
      struct = variable.get_value()
      variable.set_value(jnp.zeros(struct.shape, struct.dtype))
    else:
      others.append((path, variable))
  if not others:
    return

  @jax.jit
  def init():  # Inside jit, XLA drops the initialisers of everything not returned.
    fresh = dict(nnx.iter_graph(factory()))
    return [fresh[path].get_value() for path, _ in others]

  for (_, variable), value in zip(others, run_once(init)):
    variable.set_value(value)
