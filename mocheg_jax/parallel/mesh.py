"""The device mesh, from the `mesh` block of a config.

The mesh always has the three axes of AXES, each of size 1 when unused, so sharding rules
and specs never depend on which kinds of parallelism a run uses:

* data: pure data parallelism (parameters replicated, batch split);
* fsdp: data parallelism that also shards parameters and optimizer state (ZeRO-3);
* tensor: tensor (model) parallelism over heads / MLP features / vocab.

Each axis has an ICI size (devices within one slice or host, on the fast interconnect) and a
DCN size (slices or processes, on the slow data-centre network); the mesh axis spans
ici x dcn devices. DCN sizes default to 1 (one slice). At most one ICI size may be -1: it
takes whatever devices the others leave.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import jax
import ml_collections
import numpy as np
from absl import logging
from jax.experimental import mesh_utils

from mocheg_jax.utils import host_devices

AXES = ("data", "fsdp", "tensor")
DCN_FIELDS = tuple(f"dcn_{axis}" for axis in AXES)


def default_config() -> ml_collections.ConfigDict:
  """The `mesh` block: all devices on `data`, one slice."""
  c = ml_collections.ConfigDict()
  c.data = -1  # -1: the devices the other axes leave.
  c.fsdp = 1
  c.tensor = 1
  # Across slices / processes (DCN). Their product must equal the number of slices (TPU
  # multi-slice) or of processes (multi-process GPU/CPU) when it is above 1.
  c.dcn_data = 1
  c.dcn_fsdp = 1
  c.dcn_tensor = 1
  return c


def _block(config: Any) -> Any:
  """The mesh block, given either it or a whole config with a `mesh` field."""
  if isinstance(config, Mapping) or isinstance(config, ml_collections.ConfigDict):
    return config["mesh"] if "mesh" in config else config
  return config


def _field(block: Any, name: str) -> int:
  try:
    value = block[name]
  except (KeyError, TypeError, AttributeError):
    value = getattr(block, name, None)
  if value is None:
    raise ValueError(f"mesh.{name} is missing from the mesh config")
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
    raise ValueError(f"mesh.{name} must be an integer, got {value!r}")
  return int(value)


def resolve_dcn(config: Any) -> dict[str, int]:
  """The DCN (across slices / processes) size of each axis; each must be >= 1."""
  block = _block(config)
  dcn = {}
  for axis, name in zip(AXES, DCN_FIELDS):
    value = _field(block, name)
    if value < 1:
      raise ValueError(f"mesh.{name} must be >= 1 (no -1 across slices), got {value}")
    dcn[axis] = value
  return dcn


def resolve_shape(config: Any, num_devices: int) -> dict[str, int]:
  """The per-slice (ICI) size of each axis, with the -1 resolved.

  Args:
    config: the mesh block (see default_config) or a config with a `mesh` field.
    num_devices: all devices of the run (every slice / process); the ICI shape must
      cover num_devices / (product of the dcn_* sizes).

  Returns:
    {"data": ..., "fsdp": ..., "tensor": ...}, whose product is the devices per slice.

  Raises:
    ValueError: naming the mesh fields and the device count, when a size is 0 or below
      -1, more than one size is -1, the DCN product does not divide the devices, or the
      sizes do not multiply (or, with a -1, divide) to the devices per slice.
  """
  block = _block(config)
  dcn = resolve_dcn(block)
  dcn_product = math.prod(dcn.values())
  if num_devices < 1 or num_devices % dcn_product:
    raise ValueError(
        f"{num_devices} devices cannot be split into {dcn_product} slices/processes "
        f"({' x '.join(f'mesh.{n}={dcn[a]}' for a, n in zip(AXES, DCN_FIELDS))})")
  per_slice = num_devices // dcn_product
  where = (f"{per_slice} devices per slice" if dcn_product == 1 else
           f"{per_slice} devices per slice ({num_devices} devices / {dcn_product} slices)")

  sizes = {axis: _field(block, axis) for axis in AXES}
  for axis, value in sizes.items():
    if value == 0 or value < -1:
      raise ValueError(f"mesh.{axis} must be a positive size or -1, got {value}")
  free = [axis for axis, value in sizes.items() if value == -1]
  if len(free) > 1:
    raise ValueError(f"only one mesh size may be -1, but {', '.join(f'mesh.{a}' for a in free)}"
                     " all are")
  fixed = math.prod(value for value in sizes.values() if value != -1)
  described = " x ".join(f"mesh.{axis}={value}" for axis, value in sizes.items())
  if free:
    if per_slice % fixed:
      raise ValueError(f"{described}: the fixed sizes (product {fixed}) do not divide the "
                       f"{where}")
    sizes[free[0]] = per_slice // fixed
  elif fixed != per_slice:
    raise ValueError(f"{described} = {fixed} devices, but there are {where}")
  return sizes


def _granule_key(devices: Sequence[Any]) -> str:
  """How devices group into DCN units: TPU slices when devices know theirs, else processes."""
  return "slice_index" if hasattr(devices[0], "slice_index") else "process_index"


def _plain_grid(shape: Sequence[int], devices: Sequence[Any]) -> np.ndarray:
  try:
    return mesh_utils.create_device_mesh(shape, devices)
  except (ValueError, NotImplementedError, AssertionError):
    # mesh_utils refuses some device sets (a subset of a TPU slice, odd topologies); a
    # plain reshape in the given order is still a correct mesh, only perhaps a slower one.
    return np.asarray(devices, dtype=object).reshape(shape)


def device_grid(config: Any, devices: Sequence[Any] | None = None) -> np.ndarray:
  """The devices arranged as the mesh: an array of shape (ici x dcn per axis, in AXES order).

  With every dcn_* == 1 this is mesh_utils.create_device_mesh (topology-aware on TPU);
  otherwise mesh_utils.create_hybrid_device_mesh, whose DCN units are TPU slices when the
  devices have a slice_index and processes otherwise (multi-process GPU/CPU).
  """
  devices = list(jax.devices() if devices is None else devices)
  if not devices:
    raise ValueError("no devices to build a mesh from")
  ici = resolve_shape(config, len(devices))
  dcn = resolve_dcn(config)
  ici_shape = [ici[axis] for axis in AXES]
  dcn_shape = [dcn[axis] for axis in AXES]
  if math.prod(dcn_shape) == 1:
    return _plain_grid(ici_shape, devices)

  key = _granule_key(devices)
  granules: dict[int, list[Any]] = {}
  for device in devices:
    granules.setdefault(getattr(device, key), []).append(device)
  if len(granules) != math.prod(dcn_shape):
    unit = "slices" if key == "slice_index" else "processes"
    raise ValueError(
        f"{' x '.join(f'mesh.{n}={dcn[a]}' for a, n in zip(AXES, DCN_FIELDS))} needs "
        f"{math.prod(dcn_shape)} {unit}, but the {len(devices)} devices belong to "
        f"{len(granules)} {unit}")
  try:
    return mesh_utils.create_hybrid_device_mesh(
        ici_shape, dcn_shape, devices, process_is_granule=key == "process_index")
  except (ValueError, NotImplementedError, AssertionError):
    # As in _plain_grid: lay each granule out plainly, granules tiled over the DCN shape.
    ordered = [granules[k] for k in sorted(granules)]
    blocks = np.empty(dcn_shape, dtype=object)
    for index, granule in zip(np.ndindex(*dcn_shape), ordered):
      blocks[index] = _plain_grid(ici_shape, granule)
    return np.block(blocks.tolist())


def make_mesh(config: Any, devices: Sequence[jax.Device] | None = None) -> jax.sharding.Mesh:
  """The mesh over `devices` (default: all), axes AXES, every axis of type Auto.

  Auto (not Explicit, jax.make_mesh's default) lets jit propagate shardings from the
  in/out shardings and sharding constraints, which is what the trainer and the models'
  `constrain` calls rely on.
  """
  grid = device_grid(config, devices)
  local = [d for d in grid.flat if d.process_index == jax.process_index()]
  if local and host_devices.unsafe_host_devices(local[0].platform, len(local)):
    logging.warning(
        "%d CPU devices in one process with YNNPACK fusion on: some programs compute wrong "
        "numbers this way (see mocheg_jax/utils/host_devices.py); add %s to XLA_FLAGS",
        len(local), host_devices.YNNPACK_OFF)
  return jax.sharding.Mesh(grid, AXES, axis_types=(jax.sharding.AxisType.Auto,) * len(AXES))


def describe(mesh: jax.sharding.Mesh) -> str:
  """'data=4 fsdp=2 tensor=1' (for logs)."""
  return " ".join(f"{name}={size}" for name, size in zip(mesh.axis_names, mesh.axis_sizes))
