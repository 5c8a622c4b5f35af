"""XLA flags for one process that plays several CPU devices (tests, benchmarks, a laptop).

`--xla_force_host_platform_device_count=N` gives a CPU process N devices, which is how the
tests and benchmarks run meshes without accelerators. With jaxlib 0.10 such a process must
also turn YNNPACK's fused kernels off, or some programs compute wrong numbers.

Found 2026-11-30: one REINFORCE step of the tiny generator (configs/explain.py as the main
job's tiny run configures it, sampling with the KV cache) on 2 CPU devices of one process
gave a gradient of the tied embedding whose first 216 rows (the first 13,824 elements of
the buffer, scatter-added rows and LM-head-only rows alike) were up to 1.5e-2 off; the loss,
the samples and every other gradient were equal. The same step on 1 device, and as 2
processes of 1 device each, agreed with each other to 6e-8. Without the fast-compile flags
the first 216 rows were wrong too (in another pattern, the same on every run). Turning off
YNNPACK fusion (this flag) or Eigen's multi-threading (--xla_cpu_multi_thread_eigen=false)
made it right; turning off XNNPACK fusion did not; a small standalone program of the same
shape did not reproduce it. So: YNNPACK kernels running for two devices of one process at
once. One device per process is unaffected.

Imports nothing from JAX: the flags must be in the environment before JAX is imported.
"""

from __future__ import annotations

import os
import sys

DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"
YNNPACK_OFF = "--xla_cpu_experimental_ynn_fusion_type="


def host_device_flags(devices: int) -> str:
  """XLA_FLAGS giving this process `devices` CPU devices that compute right ("" for one)."""
  if devices < 1:
    raise ValueError(f"a process needs at least one CPU device, got {devices}")
  if devices == 1:
    return ""
  return f"{DEVICE_COUNT_FLAG}={devices} {YNNPACK_OFF}"


def use_host_devices(devices: int) -> None:
  """Puts `host_device_flags` into XLA_FLAGS; a device count already there wins.

  Raises:
    RuntimeError: JAX is already imported (it has read XLA_FLAGS by then).
  """
  if "jax" in sys.modules:
    raise RuntimeError("JAX was imported before the CPU device count was set")
  kept = []
  for flag in os.environ.get("XLA_FLAGS", "").split():
    if flag.startswith(f"{DEVICE_COUNT_FLAG}="):
      devices = int(flag.split("=", 1)[1])
    elif flag != YNNPACK_OFF:
      kept.append(flag)
  os.environ["XLA_FLAGS"] = " ".join(kept + host_device_flags(devices).split())


def unsafe_host_devices(platform: str, local_devices: int,
                        xla_flags: str | None = None) -> bool:
  """True when this process has several CPU devices with YNNPACK fusion still on."""
  flags = os.environ.get("XLA_FLAGS", "") if xla_flags is None else xla_flags
  return platform == "cpu" and local_devices > 1 and YNNPACK_OFF not in flags.split()
