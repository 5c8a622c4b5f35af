"""Keeping freed host memory (mocheg_jax/utils/host_memory.py), when asked: a jitted step
whose temporaries are far over glibc's mmap threshold runs again without faulting its pages
in."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys

import pytest

from mocheg_jax.utils import host_memory
from tests.processes import REPO

# A step with eight 64 MB temporaries: [4096, 4096] float32 arrays, each the operand of a
# matrix-vector product (XLA:CPU runs dots as library calls, so it materialises them).
_STEP = """
import json, resource, sys
from mocheg_jax.utils import host_memory
kept = host_memory.keep_freed_memory_if_asked()
import jax, jax.numpy as jnp
@jax.jit
def step(x, v):
  return sum(jnp.sin(x * i) @ v for i in range(8))
x, v = jnp.ones((4096, 4096), jnp.float32), jnp.ones((4096,), jnp.float32)
for _ in range(6):
  step(x, v).block_until_ready()
faults = []
for _ in range(9):
  before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  step(x, v).block_until_ready()
  faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"kept": kept, "faults": faults}))
"""

_TEMPORARY_PAGES = 8 * 4096 * 4096 * 4 // 4096


def _step_faults(keep: str) -> dict:
  env = dict(os.environ, XLA_FLAGS="", **{host_memory.ENV_VAR: keep})
  out = subprocess.run([sys.executable, "-c", _STEP], cwd=REPO, env=env, check=True,
                       text=True, capture_output=True).stdout
  return json.loads(out.splitlines()[-1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="configures glibc's malloc")
def test_a_step_reuses_its_freed_temporaries():
  kept, default = _step_faults("1"), _step_faults("0")
  assert kept["kept"] and not default["kept"]
  # With glibc's defaults every step faults in all its temporaries' pages afresh.
  assert statistics.median(default["faults"]) > _TEMPORARY_PAGES / 2, (default, _TEMPORARY_PAGES)
  # With the setting a step now and then still does while the heap grows to its steady size:
  # a step's temporaries are freed just after its result is ready, sometimes after the next
  # step has allocated its own (2-5 of 40 steps after 3 warm-ups, 2026-12-04); the median
  # step reuses them.
  assert statistics.median(kept["faults"]) < _TEMPORARY_PAGES / 20, (kept, default,
                                                                      _TEMPORARY_PAGES)


@pytest.mark.parametrize("value", [None, "0", "yes"])
def test_off_unless_the_variable_is_1(monkeypatch, value):
  if value is None:
    monkeypatch.delenv(host_memory.ENV_VAR, raising=False)
  else:
    monkeypatch.setenv(host_memory.ENV_VAR, value)
  assert not host_memory.keep_freed_memory_if_asked()
