"""The shared trainer on CPU with 8 fake devices: host overhead, checkpoint cost, mesh shapes.

  python benchmarks/bench_trainer.py [--windows=6 --minilm_steps=3 --minilm_batch=32]

Three measurements, in one process on the CPU platform with fake devices; every mesh spans 8
of them (or 1):

1. Trainer host overhead. `loop.train` on a small contrastive task (benchmarks/
   contrastive_task.py, variant "small": a 2-layer, 64-wide SBERT encoder with in-batch
   InfoNCE, queries of 16 and documents of 32 tokens, global batch 32, mesh data=8; ~0.1
   CPU-second a step, ~50 ms on two idle cores) against a bare Python loop over the same jitted
   step (`make_train_step`, jitted with the trainer's shardings, donation and replicated
   key, called inside the same mesh and logical-rule contexts, fed by the same input path:
   grain iterator -> `distributed.global_batch`).
   Method: both loops are timed in windows of `log_every` = 50 steps, after compilation,
   and the windows are interleaved. For the trainer a window is the time between two
   consecutive "step N: ..." lines it hands to its `log` callback: one whole period of the
   loop (input, dispatch, progress, the log step's device sync, metric averaging,
   metrics.jsonl + TensorBoard writing, the eval/checkpoint/stop checks). The window that
   ends at the first line (set-up and compilation) is dropped, and so is the final
   checkpoint after the last line. At each line the callback waits for all device work,
   then runs one bare window of 50 steps (ending, like the trainer's log step, with a sync
   on the last step's metrics); that time is left out of the trainer's windows. The bare
   loop was compiled and warmed up by one window beforehand. So the sequence is
   B T B T ... B, and each trainer window is compared with the mean of the two bare windows
   around it: overhead = median over those pairs of (trainer - bare) / bare, which cancels
   slow drift in machine load. Every window is timed twice: wall time, and this process's
   CPU time (user + system, all threads: the host loop and XLA's device threads). Wall time
   is what a run costs; CPU time depends much less on what else the machine is running, so
   on a shared machine its ratio is the steadier estimate of the trainer's extra host work.
   Per-loop median and best windows are reported too. `--windows` trainer windows per
   `--rounds` trainer run. The input path's own cost (both loops pay it) is timed once,
   alone.
2. Checkpoint cost: one save of the MiniLM-sized train state (parameters + AdamW moments,
   mesh data=8) with the trainer's Checkpointer, synchronous and asynchronous (the time
   the caller is blocked, and until the write is on disk). The first save of a
   Checkpointer includes orbax's one-time set-up, so a second save is timed too.
3. Step time of a MiniLM-sized contrastive step (BERT 30522 vocab, 384 hidden, 6 layers,
   12 heads, 1536 MLP; mean pooling; InfoNCE over cosine x 20; queries of 32 tokens,
   documents of 64; global batch `--minilm_batch`) through `loop.train` on the meshes
   data=8, fsdp=8, data=2 x fsdp=2 x tensor=2 and one device, with log_every=1: the
   first step (compilation) is dropped and the median of the next `--minilm_steps` steps
   is reported (wall and CPU time), with the time from `train()` to the first step
   (set-up + compilation) and the first step's loss (expected to be the same on every
   mesh: same data, initialisation and dropout keys).

The 8 devices are fake: they share this machine's cores, so the mesh shapes show the cost
of partitioning (collectives, resharding, more and smaller kernels), not parallel speed-up.
Prints a table and writes --out (JSON). No timing is asserted anywhere.

Why 16 fake devices for 8-device meshes (--host_devices): XLA's CPU client runs every
device's share of a program on one thread pool with as many threads as fake devices. With
exactly 8 devices and many steps in flight (the trainer syncs only every 50 steps), a
loaded 2-core machine repeatedly deadlocked: 7 of 8 devices waited in a step's all-gather
while the 8th found no free thread, and XLA aborted the process after 40 s
("Termination timeout for `all gather RendezvousKey...`", six times in ~3,000 steps, in
the trainer and the bare loop alike). With 16 host devices the pool has 8 spare threads
and no run deadlocked. The meshes, shardings and programs are the same either way;
--host_devices=8 gives the tests' set-up (tests/conftest.py).
"""

from __future__ import annotations

if __name__ == "__main__":  # First: a re-exec keeps nothing done before it.
  from mocheg_jax.utils import allocator
  allocator.run_under_preferred_allocator()

import os

import json
import platform
import re
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Sequence

from absl import app, flags, logging

# JAX is imported only inside functions: main() sets XLA_FLAGS (from --host_devices) first.

# `config.task` names this directory's task module as "benchmarks.contrastive_task".
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:
  sys.path.insert(0, _REPO)

from mocheg_jax.utils import host_devices as host_devices_lib  # noqa: E402  (imports no JAX)

_ROUNDS = flags.DEFINE_integer("rounds", 1, "Trainer runs (overhead part), each with its "
                               "own set-up and compilation.")
_WINDOWS = flags.DEFINE_integer("windows", 6, "Timed windows of log_every steps per side per "
                                "round (overhead part).")
_LOG_EVERY = flags.DEFINE_integer("log_every", 50, "Trainer log interval = window length.")
_OVERHEAD_VARIANT = flags.DEFINE_string("overhead_variant", "small",
                                        "contrastive_task variant for the overhead part.")
_MINILM_BATCH = flags.DEFINE_integer("minilm_batch", 32, "Global batch of the MiniLM step.")
_MINILM_STEPS = flags.DEFINE_integer("minilm_steps", 3, "Timed MiniLM steps per mesh shape "
                                     "(after the first, which compiles).")
_HOST_DEVICES = flags.DEFINE_integer(
    "host_devices", 16, "Fake CPU devices to create (XLA_FLAGS, unless it already sets a "
    "count); every mesh uses 8 of them (or 1). See the module docstring for why not 8.")
_MESHES = flags.DEFINE_list("meshes", ["data8", "fsdp8", "mixed", "single"],
                             "Mesh shapes for the MiniLM part (keys of MESHES).")
_PARTS = flags.DEFINE_list("parts", ["overhead", "checkpoint", "meshes"],
                           "Which measurements to run.")
_OUT = flags.DEFINE_string("out", "benchmarks/out/trainer.json", "JSON results file.")

TARGET_OVERHEAD = 0.05
TASK = "benchmarks.contrastive_task:make_task"
# key: (name, (data, fsdp, tensor), how many of the host's devices the mesh spans).
MESH_DEVICES = 8
MESHES = {"data8": ("data=8", (8, 1, 1), 8), "fsdp8": ("fsdp=8", (1, 8, 1), 8),
          "mixed": ("data=2 fsdp=2 tensor=2", (2, 2, 2), 8),
          "single": ("1 device", (1, 1, 1), 1)}


def _now() -> tuple[float, float]:
  """(wall seconds, CPU seconds of this process: user + system, all threads)."""
  import resource
  usage = resource.getrusage(resource.RUSAGE_SELF)
  return time.perf_counter(), usage.ru_utime + usage.ru_stime


def _per_step(start: tuple[float, float], end: tuple[float, float],
              steps: int) -> tuple[float, float]:
  return (end[0] - start[0]) / steps, (end[1] - start[1]) / steps


class LogClock:
  """A trainer `log` callback that timestamps its "step N: ..." lines.

  With `between`, the callback runs it at every step line (the trainer waits, on the host,
  with the device idle) and the time it takes is left out of the trainer's windows: that is
  how the bare loop's windows are interleaved with the trainer's, so both see the same
  machine load.
  """

  _STEP = re.compile(r"step (\d+):")

  def __init__(self, between: Callable[[], None] | None = None):
    self.between = between
    self.start = time.perf_counter()
    # (step, (wall, cpu) on entering the callback, (wall, cpu) on leaving it)
    self.marks: list[tuple[int, tuple[float, float], tuple[float, float]]] = []
    self.lines: list[str] = []

  def __call__(self, line: str) -> None:
    entered = _now()
    self.lines.append(line)
    match = self._STEP.match(line)
    if match:
      if self.between is not None:
        self.between()
      self.marks.append((int(match.group(1)), entered, _now()))

  def first_line_s(self) -> float:
    """Seconds from the clock's creation to the first step line (set-up + compilation)."""
    return self.marks[0][1][0] - self.start

  def windows(self) -> list[tuple[float, float]]:
    """(wall, CPU) seconds per step between consecutive step lines (the first line's
    window, with the set-up and compilation, is not one of them)."""
    return [_per_step(left0, entered1, s1 - s0)
            for (s0, _, left0), (s1, entered1, _) in zip(self.marks, self.marks[1:])]


def _config(variant: str, *, mesh: Sequence[int] = (8, 1, 1), **fields: Any):
  from benchmarks import contrastive_task
  c = contrastive_task.get_config(variant)
  c.task = TASK
  c.mesh.data, c.mesh.fsdp, c.mesh.tensor = mesh
  for name, value in fields.items():
    c[name] = value
  return c


def _devices(count: int = MESH_DEVICES):
  import jax
  return jax.devices()[:count]


class BareLoop:
  """The trainer's jitted step without the trainer: the same set-up lines as loop.train."""

  def __init__(self, config, workdir: str, devices=None):
    import jax

    from mocheg_jax.parallel import mesh as mesh_lib
    from mocheg_jax.parallel import rules as rules_lib
    from mocheg_jax.train import optim
    from mocheg_jax.train import state as state_lib
    from mocheg_jax.train import task as task_lib
    from mocheg_jax.train.step import make_train_step

    self.config = config
    self.mesh = mesh_lib.make_mesh(config.mesh, devices)
    self.rules = tuple((name, tuple(t) if isinstance(t, (list, tuple)) else t)
                       for name, t in config.sharding.rules)
    self.task = task_lib.resolve(config.task)(config, workdir)
    optimizer = optim.make_optimizer(config.optimizer, config.total_steps)
    with self.context():
      spec = state_lib.ModelSpec.of(self.task.model, config.freeze)
      self.shardings = state_lib.state_shardings(spec, optimizer.tx, self.mesh, self.rules)
      self.batch_shardings = rules_lib.batch_shardings(dict(self.task.batch_axes), self.mesh,
                                                       self.rules)
      replicated = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())
      self.state = state_lib.init_state(spec, self.task.model, optimizer.tx, self.shardings)
      constrain = lambda b: jax.lax.with_sharding_constraint(
          b, {k: self.batch_shardings[k] for k in b})
      self.step_fn = jax.jit(
          make_train_step(spec, self.task.loss, optimizer.tx, optimizer.schedule,
                          config.accum_steps, constrain),
          in_shardings=(self.shardings, self.batch_shardings, replicated),
          out_shardings=(self.shardings, replicated), donate_argnums=(0,))
      # Under the mesh, as in loop.train: the key is then replicated. A key on one device
      # is resharded by an extra transfer at every call, which is slower and, with many
      # steps in flight, has deadlocked XLA's CPU collectives here.
      self.rng = jax.random.key(config.seed)
    self.data = iter(self.task.train_data(config.batch_size))

  def context(self):
    import contextlib

    import jax
    from flax import nnx
    stack = contextlib.ExitStack()
    stack.enter_context(jax.set_mesh(self.mesh))
    stack.enter_context(nnx.logical_axis_rules(self.rules))
    return stack

  def next_batch(self):
    from mocheg_jax.parallel import distributed
    local = next(self.data)
    return distributed.global_batch({k: local[k] for k in self.task.batch_axes},
                                    self.batch_shardings)

  def window(self, steps: int) -> tuple[float, float]:
    """(wall, CPU) seconds per step over `steps` steps, ending with a sync on the last
    step's metrics (as the trainer's log step does)."""
    import jax
    with self.context():
      start = _now()
      metrics = None
      for _ in range(steps):
        self.state, metrics = self.step_fn(self.state, self.next_batch(), self.rng)
      jax.block_until_ready(metrics)
      per_step = _per_step(start, _now(), steps)
    jax.block_until_ready(self.state)  # Untimed: every device done (see settle()).
    return per_step

  def input_path(self, steps: int) -> float:
    """Seconds per batch of the input path alone (next(data) + global_batch, on device)."""
    import jax
    start = time.perf_counter()
    batches = [self.next_batch() for _ in range(steps)]
    jax.block_until_ready(batches)
    return (time.perf_counter() - start) / steps


def settle() -> None:
  """Waits until every live array is ready on every device.

  The trainer's log line comes after it has read the step metrics, which are replicated and
  read from one device, so other devices may still be finishing that step. Waiting here
  keeps the two loops' programs (both with collectives, on XLA's shared CPU thread pool)
  from ever being in flight together, and keeps the trainer's tail out of the bare window.
  """
  import jax
  jax.block_until_ready(jax.live_arrays())


def _summary(windows: list[tuple[float, float]]) -> dict[str, Any]:
  wall, cpu = [w for w, _ in windows], [c for _, c in windows]
  return {"median_ms": 1e3 * statistics.median(wall), "best_ms": 1e3 * min(wall),
          "cpu_median_ms": 1e3 * statistics.median(cpu), "cpu_best_ms": 1e3 * min(cpu),
          "windows_ms": [round(1e3 * w, 3) for w in wall],
          "cpu_windows_ms": [round(1e3 * c, 3) for c in cpu]}


def _paired(trainer: list[float], bare: list[float]) -> list[float]:
  """(trainer - bare) / bare per trainer window, bare = mean of the two windows around it."""
  return [t / (0.5 * (b0 + b1)) - 1 for t, b0, b1 in zip(trainer, bare, bare[1:])]


def measure_overhead(root: str) -> dict[str, Any]:
  from mocheg_jax.train import loop
  log_every, windows = _LOG_EVERY.value, _WINDOWS.value
  config = _config(_OVERHEAD_VARIANT.value, log_every=log_every,
                   total_steps=log_every * (windows + 1), checkpoint_every=1_000_000)
  bare = BareLoop(config, root, devices=_devices())
  start = time.perf_counter()
  bare.window(log_every)  # Compilation and warm-up.
  bare_compile_s = time.perf_counter() - start
  trainer_w, bare_w, first_line_s = [], [], []
  wall_pairs, cpu_pairs = [], []
  for r in range(_ROUNDS.value):
    bare_here = []

    def between():
      settle()
      bare_here.append(bare.window(log_every))

    clock = LogClock(between)
    loop.train(config, os.path.join(root, f"overhead_{r}"), devices=_devices(), log=clock)
    here = clock.windows()
    # Trainer window k lies between bare windows k and k + 1.
    wall_pairs += _paired([w for w, _ in here], [w for w, _ in bare_here])
    cpu_pairs += _paired([c for _, c in here], [c for _, c in bare_here])
    trainer_w += here
    bare_w += bare_here
    first_line_s.append(clock.first_line_s())
    print(f"  round {r + 1}: trainer {1e3 * statistics.median(w for w, _ in here):.1f} "
          f"ms/step, bare {1e3 * statistics.median(w for w, _ in bare_here):.1f} ms/step",
          flush=True)
  settle()
  input_s = bare.input_path(log_every)
  trainer, plain = _summary(trainer_w), _summary(bare_w)
  return {
      "variant": _OVERHEAD_VARIANT.value, "batch_size": config.batch_size, "mesh": "data=8",
      "log_every": log_every, "rounds": _ROUNDS.value,
      "timed_trainer_steps": len(trainer_w) * log_every,
      "timed_bare_steps": len(bare_w) * log_every,
      "trainer": trainer, "bare": plain, "input_path_ms": 1e3 * input_s,
      "overhead_paired_median": statistics.median(wall_pairs),
      "overhead_paired": [round(x, 4) for x in wall_pairs],
      "overhead_cpu_paired_median": statistics.median(cpu_pairs),
      "overhead_cpu_paired": [round(x, 4) for x in cpu_pairs],
      "overhead_best": trainer["best_ms"] / plain["best_ms"] - 1,
      "overhead_median": trainer["median_ms"] / plain["median_ms"] - 1,
      "trainer_to_first_log_s": first_line_s,
      "bare_first_window_with_compile_s": bare_compile_s,
      "target_overhead": TARGET_OVERHEAD}


def measure_checkpoint(root: str) -> dict[str, Any]:
  import jax
  import numpy as np

  from mocheg_jax.train.checkpoint import Checkpointer
  config = _config("minilm", batch_size=_MINILM_BATCH.value)
  bare = BareLoop(config, root, devices=_devices())
  state = bare.state
  megabytes = sum(np.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(state)) / 2**20
  out: dict[str, Any] = {"state_mb": float(megabytes), "mesh": "data=8"}
  for mode in ("sync", "async"):
    manager = Checkpointer(os.path.join(root, f"ckpt_{mode}"), async_save=mode == "async")
    for save in (1, 2):
      start = time.perf_counter()
      manager.save(save, state, data_iterator=bare.data, config=config.to_dict())
      blocked = time.perf_counter() - start
      manager.wait()
      done = time.perf_counter() - start
      key = f"{mode}_{'first' if save == 1 else 'second'}"
      out[key] = {"blocked_s": blocked, "on_disk_s": done}
    manager.close()
  return out


def measure_meshes(root: str) -> list[dict[str, Any]]:
  from mocheg_jax.train import loop
  steps = _MINILM_STEPS.value
  rows = []
  for key in _MESHES.value:
    name, shape, count = MESHES[key]
    config = _config("minilm", mesh=shape, batch_size=_MINILM_BATCH.value, log_every=1,
                     total_steps=steps + 1, checkpoint_every=1_000_000,
                     async_checkpoints=True)
    clock = LogClock()
    loop.train(config, os.path.join(root, "mesh_" + re.sub(r"\W+", "_", name)),
               devices=_devices(count), log=clock)
    step_s = statistics.median(w for w, _ in clock.windows())
    cpu_s = statistics.median(c for _, c in clock.windows())
    first_loss = float(re.search(r"loss=(\S+)", clock.lines[0]).group(1))
    rows.append({"mesh": name, "devices": count, "ms_per_step": 1e3 * step_s,
                 "cpu_ms_per_step": 1e3 * cpu_s,
                 "examples_per_s": config.batch_size / step_s,
                 "windows_ms": [round(1e3 * w, 1) for w, _ in clock.windows()],
                 "to_first_step_s": clock.first_line_s(), "first_step_loss": first_loss})
    print(f"  {name}: {1e3 * step_s:.0f} ms/step, first step after "
          f"{clock.first_line_s():.1f} s", flush=True)
  return rows


def _print_tables(result: dict[str, Any]) -> None:
  if "overhead" in result:
    o = result["overhead"]
    print(f"\nTrainer host overhead ({o['variant']} contrastive task, batch {o['batch_size']}, "
          f"{o['mesh']}, log_every {o['log_every']}; {o['timed_trainer_steps']} trainer and "
          f"{o['timed_bare_steps']} bare steps timed, interleaved)")
    print(f"{'loop':24s} {'best ms/step':>13s} {'median ms/step':>15s} "
          f"{'median CPU-ms/step':>19s}")
    for label, key in (("trainer (loop.train)", "trainer"), ("bare jitted step loop", "bare")):
      print(f"{label:24s} {o[key]['best_ms']:13.2f} {o[key]['median_ms']:15.2f} "
            f"{o[key]['cpu_median_ms']:19.2f}")
    print(f"overhead (trainer - bare) / bare, median of adjacent pairs: wall "
          f"{100 * o['overhead_paired_median']:+.1f}%, CPU time "
          f"{100 * o['overhead_cpu_paired_median']:+.1f}%; best/best wall "
          f"{100 * o['overhead_best']:+.1f}% (target < {100 * TARGET_OVERHEAD:.0f}%)")
    print(f"input path alone (next(data) + global_batch): {o['input_path_ms']:.2f} ms/batch "
          "(in both loops)")
  if "checkpoint" in result:
    c = result["checkpoint"]
    print(f"\nCheckpoint of the MiniLM train state ({c['state_mb']:.0f} MB, {c['mesh']})")
    print(f"{'save':22s} {'caller blocked s':>17s} {'on disk s':>10s}")
    for key in ("sync_first", "sync_second", "async_first", "async_second"):
      print(f"{key.replace('_', ', '):22s} {c[key]['blocked_s']:17.2f} "
            f"{c[key]['on_disk_s']:10.2f}")
  if "meshes" in result:
    print(f"\nMiniLM contrastive step via loop.train (batch {result['minilm_batch']}, "
          f"queries 32 / documents 64 tokens, median of {result['minilm_steps']} steps)")
    print(f"{'mesh':24s} {'ms/step':>9s} {'examples/s':>11s} {'CPU-ms/step':>12s} "
          f"{'to 1st step s':>14s} {'step-1 loss':>12s}")
    for row in result["meshes"]:
      print(f"{row['mesh']:24s} {row['ms_per_step']:9.0f} {row['examples_per_s']:11.1f} "
            f"{row['cpu_ms_per_step']:12.0f} {row['to_first_step_s']:14.1f} "
            f"{row['first_step_loss']:12.4f}")


def _cpu_seconds() -> float:
  return _now()[1]


def _set_up_jax(host_devices: int) -> None:
  """CPU platform with `host_devices` fake devices, before JAX is first imported."""
  host_devices_lib.use_host_devices(host_devices)
  os.environ.setdefault("JAX_PLATFORMS", "cpu")


def main(argv: list[str]) -> None:
  del argv
  for flag in (_ROUNDS, _WINDOWS, _LOG_EVERY, _MINILM_BATCH, _MINILM_STEPS, _HOST_DEVICES):
    if flag.value < 1:
      raise app.UsageError(f"--{flag.name} must be at least 1, got {flag.value}")
  _set_up_jax(_HOST_DEVICES.value)
  import jax

  from benchmarks import contrastive_task
  if _OVERHEAD_VARIANT.value not in contrastive_task.VARIANTS:
    raise app.UsageError(f"--overhead_variant: unknown variant {_OVERHEAD_VARIANT.value!r}; "
                         f"use one of {', '.join(contrastive_task.VARIANTS)}")
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # orbax logs every save step at INFO.
  unknown = sorted(set(_PARTS.value) - {"overhead", "checkpoint", "meshes"})
  if unknown:
    raise app.UsageError(f"--parts: unknown part(s) {unknown}; use overhead, checkpoint, "
                         "meshes")
  unknown = sorted(set(_MESHES.value) - set(MESHES))
  if unknown:
    raise app.UsageError(f"--meshes: unknown mesh(es) {unknown}; use {', '.join(MESHES)}")
  if jax.device_count() < MESH_DEVICES:
    raise app.UsageError(f"needs {MESH_DEVICES} devices, JAX sees {jax.device_count()} "
                         f"(XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r})")
  result: dict[str, Any] = {
      "benchmark": "trainer", "cpus": os.cpu_count(), "host_devices": jax.device_count(),
      "mesh_devices": MESH_DEVICES, "xla_flags": os.environ.get("XLA_FLAGS", ""),
      "platform": jax.devices()[0].platform, "jax": jax.__version__,
      "python": platform.python_version(), "load_average_before": os.getloadavg()}
  start = time.perf_counter()
  with tempfile.TemporaryDirectory(prefix="bench_trainer_") as root:
    steps: list[tuple[str, Callable[[str], Any]]] = [
        ("overhead", measure_overhead), ("checkpoint", measure_checkpoint),
        ("meshes", measure_meshes)]
    for part, fn in steps:
      if part in _PARTS.value:
        print(f"[{time.perf_counter() - start:.0f} s] {part} ...", flush=True)
        part_start, part_cpu = time.perf_counter(), _cpu_seconds()
        result[part] = fn(os.path.join(root, part))
        result.setdefault("part_seconds", {})[part] = {
            "wall": time.perf_counter() - part_start, "cpu": _cpu_seconds() - part_cpu}
  result.update(minilm_batch=_MINILM_BATCH.value, minilm_steps=_MINILM_STEPS.value,
                load_average_after=os.getloadavg(),
                total_s=time.perf_counter() - start, total_cpu_s=_cpu_seconds())
  _print_tables(result)
  before, after = result["load_average_before"][0], result["load_average_after"][0]
  print(f"\ntotal {result['total_s']:.0f} s wall, {result['total_cpu_s']:.0f} CPU-s of this "
        f"process; load average before {before:.1f}, after {after:.1f}")
  os.makedirs(os.path.dirname(_OUT.value) or ".", exist_ok=True)
  with open(_OUT.value, "w") as f:
    json.dump(result, f, indent=2)


if __name__ == "__main__":
  from mocheg_jax.utils import host_memory
  host_memory.keep_freed_memory_if_asked()  # Both sides alike (mocheg_jax/utils/host_memory.py).
  app.run(main)
