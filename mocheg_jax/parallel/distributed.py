"""Multi-process JAX: start-up, the primary process, global batches, barriers, and the
blocks that process 0 runs alone while the others wait (primary_only, primary_first).

One process per host (TPU VM worker, GPU node or SLURM task) runs the same program; after
jax.distributed.initialize every process sees all devices of the job in jax.devices() and
feeds its own share of each batch (global_batch). Single-process runs need none of this and
every function here is then a cheap no-op or a plain device_put.
"""

from __future__ import annotations

import contextlib
import math
import os
import pickle
from typing import Callable, Mapping, TypeVar

import jax
import numpy as np
from absl import logging
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding

MODES = ("auto", "on", "off")
# How long the other processes wait for process 0's single-writer work (indexing a
# 2.8M-sentence KB, scoring every test claim); a collective barrier would time out first.
PRIMARY_WORK_TIMEOUT_S = 24 * 3600

_initialized = False  # Set once this module has called jax.distributed.initialize.
_alone = False  # True inside primary_only: process 0 runs that block by itself.
_blocks = 0  # primary_only blocks entered so far: the same sequence on every process.
T = TypeVar("T")


def _int_env(env: Mapping[str, str], name: str) -> int | None:
  value = env.get(name)
  if value is None or value == "":
    return None
  try:
    return int(value)
  except ValueError:
    raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


def detect_multiprocess(env: Mapping[str, str] | None = None) -> str | None:
  """Why the environment looks like a multi-process job, or None when it does not.

  Checks, in order: JAX_COORDINATOR_ADDRESS; SLURM with SLURM_NTASKS > 1; Open MPI with
  OMPI_COMM_WORLD_SIZE > 1; a multi-host Cloud TPU slice (TPU_WORKER_HOSTNAMES naming more
  than one host); multi-slice TPU (MEGASCALE_COORDINATOR_ADDRESS, or MEGASCALE_NUM_SLICES
  > 1).
  """
  env = os.environ if env is None else env
  if env.get("JAX_COORDINATOR_ADDRESS"):
    return f"JAX_COORDINATOR_ADDRESS={env['JAX_COORDINATOR_ADDRESS']}"
  tasks = _int_env(env, "SLURM_NTASKS")
  if tasks is not None and tasks > 1:
    return f"SLURM_NTASKS={tasks}"
  ranks = _int_env(env, "OMPI_COMM_WORLD_SIZE")
  if ranks is not None and ranks > 1:
    return f"OMPI_COMM_WORLD_SIZE={ranks}"
  hosts = [h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h.strip()]
  if len(hosts) > 1:
    return f"TPU_WORKER_HOSTNAMES lists {len(hosts)} hosts"
  if env.get("MEGASCALE_COORDINATOR_ADDRESS"):
    return "MEGASCALE_COORDINATOR_ADDRESS is set"
  slices = _int_env(env, "MEGASCALE_NUM_SLICES")
  if slices is not None and slices > 1:
    return f"MEGASCALE_NUM_SLICES={slices}"
  return None


def _is_initialized() -> bool:
  if _initialized:
    return True
  check = getattr(jax.distributed, "is_initialized", None)
  return bool(check()) if check is not None else False


def maybe_initialize(mode: str = "auto", coordinator: str | None = None,
                     num_processes: int | None = None, process_id: int | None = None,
                     heartbeat_timeout_s: int | None = None) -> bool:
  """Starts jax.distributed when asked to, or (mode "auto") when this is a multi-process job.

  Must run before anything touches the devices (jax.devices(), a jit, an array).

  Args:
    mode: "off": never; "on": always (None arguments let JAX detect them on Cloud TPU,
      SLURM and Open MPI); "auto": when an argument is given or the environment says the
      job has several processes (see detect_multiprocess).
    coordinator: "host:port" of process 0's coordinator service. "" counts as unset.
    num_processes: processes in the job; 0 or less counts as unset.
    process_id: this process's index; negative counts as unset.
    heartbeat_timeout_s: seconds without a heartbeat after which the coordinator declares
      a process dead and aborts the whole job; None or 0 or less: JAX's default (100 s).
      Raise it where the processes may be starved for CPU (many on a small machine).

  Returns:
    True when the distributed runtime is up after the call (started now or by an earlier
    call; a second call does not start it again), False when it was not started.

  Raises:
    ValueError: an unknown mode, or a malformed environment variable.
  """
  global _initialized
  if mode not in MODES:
    raise ValueError(f"distributed mode must be one of {MODES}, got {mode!r}")
  if mode == "off":
    return False
  if _is_initialized():
    return True
  coordinator = coordinator or None
  num_processes = num_processes if num_processes is not None and num_processes > 0 else None
  process_id = process_id if process_id is not None and process_id >= 0 else None
  if mode == "auto":
    given = [name for name, value in (("coordinator", coordinator),
                                      ("num_processes", num_processes),
                                      ("process_id", process_id)) if value is not None]
    reason = f"{', '.join(given)} given" if given else detect_multiprocess()
    if reason is None:
      return False
    logging.info("Starting jax.distributed: %s", reason)
  timeouts = ({} if heartbeat_timeout_s is None or heartbeat_timeout_s <= 0 else
              {"heartbeat_timeout_seconds": int(heartbeat_timeout_s)})
  jax.distributed.initialize(coordinator, num_processes, process_id, **timeouts)
  _initialized = True
  logging.info("jax.distributed is up: process %d of %d, %d local / %d global devices",
               jax.process_index(), jax.process_count(), jax.local_device_count(),
               jax.device_count())
  return True


def is_primary() -> bool:
  """True on process 0, which writes logs, summaries and other single-writer files."""
  return jax.process_index() == 0


def _local_shards_along_dim0(sharding: NamedSharding, ndim: int) -> tuple[int, int]:
  """(distinct dim-0 slices on this process's devices, dim-0 slices in all)."""
  spec = tuple(sharding.spec) + (None,) * (ndim - len(sharding.spec))

  def parts(entry) -> int:
    axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
    return math.prod(sharding.mesh.shape[axis] for axis in axes)

  # Probe with each dimension as long as its shard count: every device then holds exactly
  # one index per dimension, and the distinct dim-0 starts count this process's rows.
  probe = tuple(parts(entry) for entry in spec)
  total = probe[0]
  starts = {index[0].start or 0
            for index in sharding.addressable_devices_indices_map(probe).values()}
  return len(starts), total


def global_batch(local: Mapping[str, np.ndarray],
                 shardings: Mapping[str, NamedSharding]) -> dict[str, jax.Array]:
  """Global arrays from this process's rows of a batch.

  Each process passes its own rows (the global batch is the processes' rows in process
  order along the batch axis); fields are placed with jax.make_array_from_process_local_data.

  Args:
    local: {field: array [local_batch, ...]}; every field has the same leading size.
    shardings: {field: NamedSharding} for at least every field of `local`.

  Raises:
    ValueError: naming the field, when it has no sharding, no leading dimension, a leading
      size different from the other fields, or one that does not split over this process's
      devices along the batch dimension.
  """
  if not local:
    raise ValueError("global_batch got an empty batch")
  out = {}
  first_field, first_size = None, None
  for field, value in local.items():
    if field not in shardings:
      raise ValueError(f"batch field {field!r} has no sharding (known: {sorted(shardings)})")
    value = np.asarray(value) if not isinstance(value, (np.ndarray, jax.Array)) else value
    if value.ndim == 0:
      raise ValueError(f"batch field {field!r} is a scalar; it needs a leading batch dimension")
    size = value.shape[0]
    if first_size is None:
      first_field, first_size = field, size
    elif size != first_size:
      raise ValueError(f"batch field {field!r} has {size} rows but {first_field!r} has "
                       f"{first_size}")
    sharding = shardings[field]
    local_shards, total = _local_shards_along_dim0(sharding, value.ndim)
    if size % local_shards:
      raise ValueError(
          f"batch field {field!r}: {size} local rows do not split into the {local_shards} "
          f"batch shards on this process's devices (spec {sharding.spec}, {total} in all)")
    out[field] = jax.make_array_from_process_local_data(sharding, value)
  return out


def place(tree, sharding: NamedSharding):
  """Every leaf (the same host value on every process) laid out with `sharding`, which may
  span other processes' devices (jax.device_put only places on this process's).

  Each process builds the shards of its own devices from its copy of the value."""
  def one(leaf):
    if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype,
                                                               jax.dtypes.prng_key):
      # A typed PRNG key (a module's RNG stream) has no numpy form: place its raw data.
      return jax.random.wrap_key_data(one(jax.random.key_data(leaf)),
                                      impl=jax.random.key_impl(leaf))
    value = np.asarray(leaf)
    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])
  return jax.tree.map(one, tree)


def sync(name: str) -> None:
  """Waits until every process reaches the barrier `name` (nothing to wait for alone, or
  inside a primary_only block, which the other processes do not enter)."""
  if jax.process_count() > 1 and not _alone:
    multihost_utils.sync_global_devices(name)


def _coordination_client():
  from jax._src import distributed as jax_distributed  # The key-value store has no public API.
  client = jax_distributed.global_state.client
  if client is None:
    raise RuntimeError("a multi-process JAX job without a distributed client")
  return client


@contextlib.contextmanager
def _running_alone():
  """Barriers off, and an ambient global mesh (a training's jax.set_mesh) swapped for a
  one-device mesh of this process with the same axis names: computations stay local."""
  global _alone
  ambient = jax.sharding.get_abstract_mesh()
  mesh = contextlib.nullcontext()
  if not ambient.empty:
    device = np.asarray(jax.local_devices()[:1]).reshape((1,) * len(ambient.axis_names))
    mesh = jax.set_mesh(Mesh(device, ambient.axis_names, axis_types=ambient.axis_types))
  _alone = True
  try:
    with mesh:
      yield
  finally:
    _alone = False


def primary_only(name: str, fn: Callable[[], T]) -> T:
  """`fn()` run by process 0 alone; every process gets its (picklable) result.

  For single-writer work that needs no other process: a stage's indexing, searching,
  scoring and file writing after its trainings (which every process takes part in). The
  others wait on the coordination service's key-value store, not on a device collective,
  so process 0 may take hours. Inside the block, barriers are skipped and is_primary() is
  True, so code shared with the trainings (a feature store that process 0 writes) works
  alone. Must not run device collectives: models must be process-local (load_trained).

  Raises:
    RuntimeError: on the other processes, when process 0 failed in the block (process 0
      raises its own error).
  """
  global _blocks
  if jax.process_count() == 1 or _alone:
    return fn()
  _blocks += 1
  key = f"mocheg_jax/primary_only/{_blocks}/{name}"
  client = _coordination_client()
  if is_primary():
    try:
      with _running_alone():
        result = fn()
    except BaseException as e:
      client.key_value_set_bytes(key, pickle.dumps(("error", f"{type(e).__name__}: {e}")))
      raise
    client.key_value_set_bytes(key, pickle.dumps(("ok", result)))
    return result
  status, value = pickle.loads(client.blocking_key_value_get_bytes(
      key, PRIMARY_WORK_TIMEOUT_S * 1000))
  if status != "ok":
    raise RuntimeError(f"process 0 failed in {name!r}: {value}")
  return value


def primary_first(name: str, fn: Callable[[], T]) -> T:
  """`fn()` on process 0, then on the others: for work that writes shared files once
  (preparing the data) and that `fn` reuses when it finds them finished."""
  done = []  # Process 0's result; its block shares nothing (the result may not pickle).
  primary_only(name, lambda: done.append(fn()))
  return done[0] if done else fn()


def on_every_process(flag: bool) -> bool:
  """Whether `flag` holds on every process of the job (a collective: every process must
  call it). For choices each process makes from its own machine that must come out the
  same everywhere, such as the precision of the products all of them compute together."""
  if jax.process_count() == 1:
    return bool(flag)
  flags_ = multihost_utils.process_allgather(np.asarray([int(bool(flag))], np.int32))
  return bool(np.min(np.asarray(flags_)) > 0)


def to_host(x: jax.Array | np.ndarray) -> np.ndarray:
  """The whole array as numpy on every process.

  An evaluator's outputs are sharded like its batch, which in a multi-process run spans
  devices this process cannot read; gathering is a collective, so every process must call
  it (evaluators run on every process for that reason).
  """
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return np.asarray(x)
