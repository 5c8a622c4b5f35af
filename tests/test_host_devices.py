"""The XLA flags for several CPU devices in one process (mocheg_jax/utils/host_devices.py).

Whether the flags make the numbers right is tested where the wrong numbers showed:
tests/test_pipeline_multiprocess.py compares the REINFORCE generator trained on 2 devices of
one process with 2 processes of one device.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from mocheg_jax.utils.host_devices import (DEVICE_COUNT_FLAG, YNNPACK_OFF, host_device_flags,
                                           unsafe_host_devices)
from tests.processes import REPO


def test_several_devices_come_with_ynnpack_off():
  assert host_device_flags(1) == ""
  assert host_device_flags(8).split() == [f"{DEVICE_COUNT_FLAG}=8", YNNPACK_OFF]
  with pytest.raises(ValueError, match="at least one"):
    host_device_flags(0)


def test_unsafe_only_for_several_cpu_devices_with_ynnpack_on():
  assert unsafe_host_devices("cpu", 2, f"{DEVICE_COUNT_FLAG}=2")
  assert unsafe_host_devices("cpu", 2, f"{DEVICE_COUNT_FLAG}=2 {YNNPACK_OFF}dot")
  assert not unsafe_host_devices("cpu", 2, host_device_flags(2))
  assert not unsafe_host_devices("cpu", 1, "")
  assert not unsafe_host_devices("gpu", 8, "")


def _flags_after_use(xla_flags: str, devices: int) -> str:
  """XLA_FLAGS after use_host_devices(devices) in a fresh interpreter (no JAX imported)."""
  code = ("import json, os; from mocheg_jax.utils.host_devices import use_host_devices; "
          f"use_host_devices({devices}); print(json.dumps(os.environ['XLA_FLAGS']))")
  out = subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, text=True,
                       capture_output=True, env={"XLA_FLAGS": xla_flags, "PATH": ""})
  return json.loads(out.stdout)


def test_use_host_devices_keeps_a_given_count_and_other_flags():
  assert _flags_after_use("", 4).split() == [f"{DEVICE_COUNT_FLAG}=4", YNNPACK_OFF]
  assert _flags_after_use(f"--xla_dump_to=/x {DEVICE_COUNT_FLAG}=2 {YNNPACK_OFF}", 16).split() \
      == ["--xla_dump_to=/x", f"{DEVICE_COUNT_FLAG}=2", YNNPACK_OFF]
  assert _flags_after_use(f"{DEVICE_COUNT_FLAG}=1", 16) == ""


def test_use_host_devices_refuses_after_jax():
  from mocheg_jax.utils.host_devices import use_host_devices
  import jax  # noqa: F401  (the suite imported it already; this says so)
  with pytest.raises(RuntimeError, match="before the CPU device count"):
    use_host_devices(2)
