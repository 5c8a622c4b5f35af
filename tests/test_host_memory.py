"""Keeping freed host memory (mocheg_jax/utils/host_memory.py): a jitted step whose
temporaries are far over glibc's mmap threshold runs again without faulting its pages in."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from mocheg_jax.utils import host_memory
from tests.processes import REPO

# A step with eight 64 MB temporaries: [4096, 4096] float32 arrays.
_STEP = """
import json, resource, sys
from mocheg_jax.utils import host_memory
kept = host_memory.keep_freed_memory()
import jax, jax.numpy as jnp
@jax.jit
def step(x):
  ys = [jnp.sin(x * i) for i in range(8)]
  return sum(jnp.sort(y, axis=0)[0] for y in ys)
x = jnp.ones((4096, 4096), jnp.float32)
for _ in range(2):
  step(x).block_until_ready()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
  step(x).block_until_ready()
faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 3
print(json.dumps({"kept": kept, "faults_per_step": faults}))
"""

_TEMPORARY_PAGES = 8 * 4096 * 4096 * 4 // 4096


def _faults_per_step(keep: str) -> dict:
  env = dict(os.environ, XLA_FLAGS="", **{host_memory.ENV_VAR: keep})
  out = subprocess.run([sys.executable, "-c", _STEP], cwd=REPO, env=env, check=True,
                       text=True, capture_output=True).stdout
  return json.loads(out.splitlines()[-1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="configures glibc's malloc")
def test_a_step_reuses_its_freed_temporaries():
  kept, default = _faults_per_step("1"), _faults_per_step("0")
  assert kept["kept"] and not default["kept"]
  # With glibc's defaults each step faults in most of its temporaries' pages afresh.
  assert kept["faults_per_step"] < _TEMPORARY_PAGES / 20, (kept, default, _TEMPORARY_PAGES)


def test_the_variable_turns_it_off(monkeypatch):
  monkeypatch.setenv(host_memory.ENV_VAR, "0")
  assert not host_memory.keep_freed_memory()
