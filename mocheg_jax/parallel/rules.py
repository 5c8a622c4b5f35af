"""Logical axis names -> mesh axes: PartitionSpecs and NamedShardings from config rules.

Models name only logical axes ("batch", "embed", "heads", ...); a rule set, which is config
data, maps each to a mesh axis, a tuple of mesh axes, or None (replicated). Rules are read
in order and the first usable rule for a name wins, so one rule set serves every mesh shape:
a rule is usable for a dimension when its mesh axes exist in the mesh, are not already used
by an earlier dimension of the same array, and (when the shape is known) divide the
dimension. A name with no usable rule is replicated.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import jax
from jax.sharding import NamedSharding, PartitionSpec

Target = str | tuple[str, ...] | None
Rule = tuple[str, Target]
Axes = Sequence[str | None]
MeshLike = jax.sharding.Mesh | jax.sharding.AbstractMesh

# maxtext-like defaults. Activations split their batch over every data-parallel axis
# (data and fsdp); parameters split their "embed" dimension over fsdp, so fsdp shards the
# weights and optimizer state (ZeRO-3) while data keeps them replicated; tensor parallelism
# splits the dimensions whose matmuls need no communication until the block's output
# projection: MLP features, attention heads, and the vocabulary (embedding table and logits).
# Everything else (lengths, per-head features, positions, small heads such as "classes")
# is replicated: these dimensions are either small or contracted in ways that would need a
# collective per use. They are listed with None, rather than left out, because flax's own
# resolver (nnx.get_named_sharding) fails on a logical name without a rule; ours replicates
# unknown names anyway.
DEFAULT_RULES: tuple[Rule, ...] = (
    ("batch", ("data", "fsdp")),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("vocab", "tensor"),
    ("length", None),
    ("kv", None),
    ("position", None),
    ("positions", None),
    ("token_type", None),
    ("pooler", None),
    ("head", None),
    ("classes", None),
    ("patches", None),
    ("patch_height", None),
    ("patch_width", None),
    ("channels", None),
    ("projection", None),
)


def mesh_sizes(mesh: MeshLike) -> dict[str, int]:
  """{axis name: size} of a Mesh or an AbstractMesh."""
  return dict(zip(mesh.axis_names, mesh.axis_sizes))


def _targets(target: Target) -> tuple[str, ...]:
  if target is None:
    return ()
  if isinstance(target, str):
    return (target,)
  return tuple(target)


def _as_entry(axes: tuple[str, ...]) -> str | tuple[str, ...] | None:
  if not axes:
    return None
  return axes[0] if len(axes) == 1 else axes


def _resolve(name: str | None, dim: int | None, rules: Sequence[Rule],
             sizes: Mapping[str, int], used: set[str]) -> tuple[str, ...]:
  """The mesh axes for one dimension (empty: replicated)."""
  if name is None:
    return ()
  for rule in rules:
    logical, target = rule
    if logical != name:
      continue
    axes = _targets(target)
    if not axes:
      return ()  # An explicit None rule: replicated.
    if any(axis not in sizes or axis in used for axis in axes):
      continue
    if dim is not None:
      # The longest prefix whose devices divide the dimension (batch 4 on data=2, fsdp=4
      # -> ("data",)); none divides: try the next rule.
      while axes and dim % math.prod(sizes[axis] for axis in axes):
        axes = axes[:-1]
      if not axes:
        continue
    return axes
  return ()


def logical_to_spec(axes: Axes | PartitionSpec, rules: Sequence[Rule], mesh: MeshLike,
                    shape: Sequence[int] | None = None) -> PartitionSpec:
  """The PartitionSpec for an array whose dimensions have logical names `axes`.

  Args:
    axes: one logical name (or None) per dimension; a PartitionSpec of logical names
      (as nnx.get_partition_spec gives) is accepted too.
    rules: (logical name, mesh axis | tuple of mesh axes | None) pairs, first match wins.
    mesh: a Mesh or AbstractMesh (only its axis names and sizes are read).
    shape: the array's shape; when given, a rule whose mesh size does not divide the
      dimension is skipped (a tuple target falls back to its longest dividing prefix), so a
      3-class head or a vocabulary of 30522 on tensor=4 is replicated instead of failing.

  Returns:
    A PartitionSpec of mesh axes with one entry per dimension.
  """
  axes = tuple(axes)
  if shape is not None and len(shape) != len(axes):
    raise ValueError(f"logical axes {axes} do not match shape {tuple(shape)}")
  sizes = mesh_sizes(mesh)
  used: set[str] = set()
  spec = []
  for i, name in enumerate(axes):
    if name is not None and not isinstance(name, str):
      raise ValueError(f"logical axis names must be strings or None, got {name!r} in {axes}")
    chosen = _resolve(name, None if shape is None else int(shape[i]), rules, sizes, used)
    used.update(chosen)
    spec.append(_as_entry(chosen))
  return PartitionSpec(*spec)


def _is_axes(x: Any) -> bool:
  if x is None or isinstance(x, PartitionSpec):
    return True
  return isinstance(x, tuple) and all(e is None or isinstance(e, str) for e in x)


def _shape_of(x: Any) -> tuple[int, ...]:
  if hasattr(x, "shape"):
    return tuple(x.shape)
  return tuple(x)


def _path(path: tuple[Any, ...]) -> str:
  text = jax.tree_util.keystr(path, simple=True, separator=".")
  return text[:-len(".value")] if text.endswith(".value") else text


def shardings(axes_tree: Any, shape_tree: Any, mesh: jax.sharding.Mesh,
              rules: Sequence[Rule]) -> Any:
  """A NamedSharding for every leaf: `axes_tree` placed on `mesh` by `rules`.

  Args:
    axes_tree: leaves are tuples of logical names, or PartitionSpecs of logical names
      (nnx.get_partition_spec of a state), or None (replicated). Pure dicts and nnx.State
      trees both work; the result has the same structure (Variables keep their wrappers).
    shape_tree: the same structure with shapes (tuples) or anything with `.shape`
      (ShapeDtypeStruct, arrays) at the leaves, e.g. nnx.eval_shape's state.
    mesh: a concrete Mesh.
    rules: see logical_to_spec.

  Raises:
    ValueError: naming the parameter path when its axes and shape disagree in rank.
  """
  def one(path, axes, shape_leaf):
    shape = _shape_of(shape_leaf)
    if axes is None:
      axes = (None,) * len(shape)
    try:
      spec = logical_to_spec(axes, rules, mesh, shape)
    except ValueError as e:
      raise ValueError(f"{_path(path)}: {e}") from None
    return NamedSharding(mesh, spec)

  return jax.tree_util.tree_map_with_path(one, axes_tree, shape_tree, is_leaf=_is_axes)


def batch_spec(batch_axes: Mapping[str, Axes], mesh: MeshLike, rules: Sequence[Rule],
               shapes: Mapping[str, Sequence[int]] | None = None) -> dict[str, PartitionSpec]:
  """PartitionSpecs for an input batch: {field: logical axes} -> {field: spec}.

  With `shapes` (global shapes per field) the divisibility fallback applies, as in
  logical_to_spec.
  """
  specs = {}
  for field, axes in batch_axes.items():
    shape = None if shapes is None else shapes[field]
    try:
      specs[field] = logical_to_spec(axes, rules, mesh, shape)
    except ValueError as e:
      raise ValueError(f"batch field {field!r}: {e}") from None
  return specs


def batch_shardings(batch_axes: Mapping[str, Axes], mesh: jax.sharding.Mesh,
                    rules: Sequence[Rule],
                    shapes: Mapping[str, Sequence[int]] | None = None
                    ) -> dict[str, NamedSharding]:
  """NamedShardings for an input batch (see batch_spec)."""
  return {field: NamedSharding(mesh, spec)
          for field, spec in batch_spec(batch_axes, mesh, rules, shapes).items()}
