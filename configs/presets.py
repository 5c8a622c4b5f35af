"""Sharding presets: the `mesh` block (and a micro-batch count) for each stage on known hardware.

  python launch/memory.py                       # every preset x stage, with the memory model
  python launch/memory.py --flags --preset=tpu-v4-32 --stage=explain
  python scripts/train.py --config=configs/explain.py:paper --workdir=DIR \
      $(python launch/memory.py --flags --preset=tpu-v4-32 --stage=explain)

or in Python: `apply_preset(config, "tpu-v4-32")` (the stage comes from `config.task`). The
launchers (launch/tpu_pod.py, launch/slurm_gpu.py) take `--preset` and append the flags to a
scripts/train.py command.

How the sizes were chosen (see mocheg_jax/parallel/mesh.py for the axes):
* the mesh must cover every device: data x fsdp x tensor (x the dcn_* sizes) = the devices
  of the preset, which check_preset verifies with mesh.resolve_shape;
* the batch is split over data x fsdp (rules.DEFAULT_RULES), so each micro-batch
  (batch_size / accum_steps) of the stage's `paper` config must divide by data x fsdp;
  whatever the batch cannot use goes to tensor, where dimensions that do not divide are
  replicated (rules.py), i.e. that work is repeated;
* small models (MiniLM, CLIP, the stance head, BERT-base) stay data-parallel: their
  parameters and Adam state fit every device many times over; BART-large uses fsdp, which
  shards its parameters and optimizer state (ZeRO-3) over the chips of one host or slice;
* `accum_steps` (gradient accumulation: the same update, in smaller micro-batches) is set
  where the paper's value would either not fit the memory or leave chips without rows.
  Every choice is checked against the memory model of launch/memory.py (its peak at most
  90% of a device's memory; tests/test_launchers.py).
Multi-node GPU (gpu-4x8xh100) puts the 4 processes on dcn_data: only gradients (one
all-reduce per step) cross the slower network, while fsdp and tensor stay inside a node.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Mapping

# The stages of the main job, named as their config files (configs/NAME.py).
STAGES = ("retrieval_text", "rerank", "retrieval_image", "verify", "classifier", "explain")
# config.task's module -> stage.
TASK_MODULES = {
    "mocheg_jax.retrieval.text_task": "retrieval_text",
    "mocheg_jax.retrieval.rerank": "rerank",
    "mocheg_jax.retrieval.image_task": "retrieval_image",
    "mocheg_jax.verification.task": "verify",
    "mocheg_jax.explanation.classifier_task": "classifier",
    "mocheg_jax.explanation.generator_task": "explain",
}
MESH_FIELDS = ("data", "fsdp", "tensor", "dcn_data", "dcn_fsdp", "dcn_tensor")


@dataclasses.dataclass(frozen=True)
class Hardware:
  """What a preset runs on.

  Attributes:
    platform: "tpu" or "gpu".
    devices: JAX devices of the whole job (TPU v4 / v5p: chips, as megacore makes one
      device of a chip's two TensorCores; v5e: chips; GPU: GPUs).
    processes: JAX processes (TPU VM hosts, or SLURM nodes with one task each).
    hbm_gib: memory of one device, GiB (2**30 bytes).
    accelerator_type: the gcloud --accelerator-type of a TPU slice ("" for GPUs).
  """
  platform: str
  devices: int
  processes: int
  hbm_gib: float
  accelerator_type: str = ""
  description: str = ""

  @property
  def devices_per_process(self) -> int:
    return self.devices // self.processes


HARDWARE: dict[str, Hardware] = {
    # v4-32: 32 TensorCores = 16 chips (4 per host, 4 hosts), 32 GiB HBM each.
    "tpu-v4-32": Hardware("tpu", 16, 4, 32.0, "v4-32", "Cloud TPU v4-32 (16 chips, 4 hosts)"),
    # v5litepod-256: 256 chips (8 per host, 32 hosts), 16 GB HBM each.
    "tpu-v5e-256": Hardware("tpu", 256, 32, 16e9 / 2**30, "v5litepod-256",
                            "Cloud TPU v5e-256 (256 chips, 32 hosts)"),
    # One node of 8 GPUs; nvidia-smi reports 81,559 MiB (H100 SXM) and 143,771 MiB (H200).
    "gpu-8xh100": Hardware("gpu", 8, 1, 81559 / 1024, "", "1 node x 8 H100 80 GB"),
    "gpu-8xh200": Hardware("gpu", 8, 1, 143771 / 1024, "", "1 node x 8 H200 141 GB"),
    "gpu-4x8xh100": Hardware("gpu", 32, 4, 81559 / 1024, "", "4 nodes x 8 H100 80 GB (SLURM)"),
}


def _unsupported(reason: str) -> dict[str, Any]:
  """A stage the preset cannot run at its paper batch; `reason` says why and what to do."""
  return {"mesh": None, "accum_steps": None, "reason": reason}


def _plan(data: int = 1, fsdp: int = 1, tensor: int = 1, dcn_data: int = 1,
          accum_steps: int | None = None) -> dict[str, Any]:
  mesh = dict(data=data, fsdp=fsdp, tensor=tensor, dcn_data=dcn_data, dcn_fsdp=1,
              dcn_tensor=1)
  return {"mesh": mesh, "accum_steps": accum_steps}


def _gpu_node(explain_accum: int) -> dict[str, dict[str, Any]]:
  """One node of 8 GPUs: data parallel; BART-large over fsdp 8."""
  return {
      "retrieval_text": _plan(data=8),  # 256 / 8 = 32 claims a GPU.
      "rerank": _plan(data=8),
      "retrieval_image": _plan(data=8),  # 480 / 8 = 60 pairs a GPU.
      "verify": _plan(data=8),
      "classifier": _plan(data=8),  # 40 / 8 = 5 a GPU.
      "explain": _plan(fsdp=8, accum_steps=explain_accum),
  }


PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "tpu-v4-32": {
        "retrieval_text": _plan(data=16),
        "rerank": _plan(data=16),
        "retrieval_image": _plan(data=16),  # 480 / 16 = 30 pairs a chip.
        "verify": _plan(data=16),
        # 40 claims split 8 ways at most (5 a chip); the other factor 2 splits BERT's heads,
        # MLP and vocabulary.
        "classifier": _plan(data=8, tensor=2),
        # 192 / 4 = 48 rows per micro-batch, 3 a chip (the paper's 12 micro-batches would
        # leave one row a chip).
        "explain": _plan(fsdp=16, accum_steps=4),
    },
    "tpu-v5e-256": {
        "retrieval_text": _plan(data=256),
        "rerank": _plan(data=256),
        # 480 = 2^5 x 15: at most 32 ways over the batch; tensor 8 splits CLIP's MLPs, the
        # text tower's 8 heads and vocabulary (the vision tower's 12 heads are repeated).
        "retrieval_image": _plan(data=32, tensor=8),
        # 32 claims: 32 ways over the batch, the rest repeated (the stance head is 2.9M
        # parameters; this stage needs one host, not a pod).
        "verify": _plan(data=32, tensor=8),
        # The trainer gives each of the 32 hosts batch_size / 32 claims: 40 does not split.
        "classifier": _unsupported(
            "the paper's batch of 40 does not split over the 32 hosts of a v5e-256 (the "
            "trainer needs batch_size divisible by the processes); train the classifier on "
            "a single host (e.g. v5litepod-8 with --config.mesh.data=8) or set a batch that "
            "is a multiple of 32"),
        # No accumulation: 192 rows over fsdp 64 (3 a chip), tensor 4 over BART's 16 heads
        # and 4,096 MLP features (its 50,265-word vocabulary is replicated).
        "explain": _plan(fsdp=64, tensor=4, accum_steps=1),
    },
    # 192 / 4 = 48 rows per micro-batch, 6 a GPU (12 would reach ~75% of an H100's memory
    # in launch/memory.py's peak, too close for an estimate).
    "gpu-8xh100": _gpu_node(explain_accum=4),
    # 12 rows a GPU (the whole batch at once, 24 a GPU, would reach ~83%).
    "gpu-8xh200": _gpu_node(explain_accum=2),
    "gpu-4x8xh100": {
        "retrieval_text": _plan(data=8, dcn_data=4),
        "rerank": _plan(data=8, dcn_data=4),
        "retrieval_image": _plan(data=8, dcn_data=4),  # 480 / 32 = 15 a GPU.
        "verify": _plan(data=8, dcn_data=4),  # 32 / 32 = 1 a GPU.
        # 40 = 8 x 5: 4 nodes x 2 over the batch, tensor 4 inside a node.
        "classifier": _plan(data=2, tensor=4, dcn_data=4),
        # 192 rows, 6 a GPU; fsdp inside a node, data across nodes.
        "explain": _plan(fsdp=8, dcn_data=4, accum_steps=1),
    },
}


class PresetError(ValueError):
  """An unknown preset or stage, or a preset that does not fit a config."""


def preset_names() -> tuple[str, ...]:
  return tuple(PRESETS)


def hardware(preset: str) -> Hardware:
  if preset not in HARDWARE:
    raise PresetError(f"unknown sharding preset {preset!r}; expected one of "
                      f"{', '.join(PRESETS)}")
  return HARDWARE[preset]


def supported(preset: str, stage: str) -> bool:
  """False for a stage the preset cannot run at the paper's batch (see `plan`'s error)."""
  hardware(preset)
  if stage not in STAGES:
    raise PresetError(f"unknown stage {stage!r}; expected one of {', '.join(STAGES)}")
  return PRESETS[preset][stage]["mesh"] is not None


def plan(preset: str, stage: str) -> dict[str, Any]:
  """{"mesh": {data, fsdp, tensor, dcn_data, dcn_fsdp, dcn_tensor}, "accum_steps": int|None}.

  Raises:
    PresetError: an unknown preset or stage, or one the preset does not support (the
      message says why and what to do instead).
  """
  if not supported(preset, stage):
    raise PresetError(f"preset {preset} has no plan for stage {stage}: "
                      f"{PRESETS[preset][stage]['reason']}")
  entry = PRESETS[preset][stage]
  return {"mesh": dict(entry["mesh"]), "accum_steps": entry["accum_steps"]}


def stage_of_task(task: str) -> str:
  """The stage of a config.task string ("module:function")."""
  module = task.split(":", 1)[0]
  if module not in TASK_MODULES:
    raise PresetError(f"config.task {task!r} is not a stage with presets (known modules: "
                      f"{', '.join(TASK_MODULES)})")
  return TASK_MODULES[module]


_CONFIG_FLAG = re.compile(r"--config[= ](?:\S*/)?configs/(\w+)\.py\b")


def stage_of_command(command: str) -> str | None:
  """The stage of a `scripts/train.py --config=configs/NAME.py:...` command, or None."""
  match = _CONFIG_FLAG.search(command)
  if match is None or match.group(1) not in STAGES:
    return None
  return match.group(1)


def dp_ways(mesh: Mapping[str, int]) -> int:
  """How many ways the batch is split: data x fsdp, within and across slices/processes."""
  return mesh["data"] * mesh["dcn_data"] * mesh["fsdp"] * mesh["dcn_fsdp"]


def param_shards(mesh: Mapping[str, int]) -> int:
  """How many ways a large weight matrix is split: fsdp x tensor (all of them)."""
  return mesh["fsdp"] * mesh["dcn_fsdp"] * mesh["tensor"] * mesh["dcn_tensor"]


def check_plan(preset: str, stage: str, batch_size: int, accum_steps: int) -> None:
  """Raises PresetError unless the stage's mesh covers the preset's devices and its
  micro-batches split evenly over the batch axes and the processes."""
  hw = hardware(preset)
  mesh = plan(preset, stage)["mesh"]
  from mocheg_jax.parallel import mesh as mesh_lib  # jax: only when checking.
  try:
    mesh_lib.resolve_shape(mesh, hw.devices)
  except ValueError as e:
    raise PresetError(f"preset {preset} stage {stage}: {e}") from None
  dcn = math.prod(mesh[f] for f in MESH_FIELDS if f.startswith("dcn_"))
  if dcn > 1 and (hw.platform != "gpu" or dcn != hw.processes):
    # GPU: the DCN units are processes (mesh.device_grid); a one-slice TPU has none.
    raise PresetError(f"preset {preset} stage {stage}: the dcn_* sizes multiply to {dcn}, "
                      f"but the job has {hw.processes} processes"
                      + ("" if hw.platform == "gpu" else " in one TPU slice (dcn_* must be 1)"))
  if batch_size % accum_steps:
    raise PresetError(f"preset {preset} stage {stage}: batch_size {batch_size} is not "
                      f"divisible by accum_steps {accum_steps}")
  micro, ways = batch_size // accum_steps, dp_ways(mesh)
  if micro % ways:
    raise PresetError(f"preset {preset} stage {stage}: a micro-batch of {micro} rows "
                      f"(batch_size {batch_size} / accum_steps {accum_steps}) does not split "
                      f"{ways} ways over data x fsdp")
  # The trainer feeds each process batch_size / processes rows of its own (loop.py,
  # distributed.global_batch): each process must hold whole, distinct batch shards.
  if batch_size % hw.processes or ways % hw.processes:
    raise PresetError(f"preset {preset} stage {stage}: batch_size {batch_size} and the "
                      f"{ways} batch shards must both split over the {hw.processes} processes")


def apply_preset(config: Any, preset: str, stage: str | None = None) -> Any:
  """Writes the preset's mesh (and accum_steps, when it sets one) into `config`.

  Args:
    config: a stage config (ml_collections.ConfigDict, locked or not).
    preset: a name of PRESETS.
    stage: a name of STAGES; None: the stage of config.task.

  Returns:
    `config`, changed in place.

  Raises:
    PresetError: an unknown preset or stage, or a config whose batch does not fit the
      preset's mesh (check_plan).
  """
  stage = stage or stage_of_task(config.task)
  chosen = plan(preset, stage)
  accum = chosen["accum_steps"] or config.accum_steps
  check_plan(preset, stage, config.batch_size, accum)
  for field, value in chosen["mesh"].items():
    config.mesh[field] = value
  config.accum_steps = accum
  return config


def preset_flags(preset: str, stage: str) -> list[str]:
  """The scripts/train.py flags that apply a preset: --config.mesh.*=..., accum_steps."""
  chosen = plan(preset, stage)
  flags = [f"--config.mesh.{field}={value}" for field, value in chosen["mesh"].items()]
  if chosen["accum_steps"] is not None:
    flags.append(f"--config.accum_steps={chosen['accum_steps']}")
  return flags
