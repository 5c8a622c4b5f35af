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
from tests import faulting_step
from tests.processes import REPO

_STEP = faulting_step.program(
    "from mocheg_jax.utils import host_memory\nkept = host_memory.keep_freed_memory_if_asked()",
    "{'kept': kept}")
_TEMPORARY_PAGES = faulting_step.TEMPORARY_PAGES


def _step_faults(keep: str) -> dict:
  env = dict(os.environ, XLA_FLAGS="", **{host_memory.ENV_VAR: keep})
  env.pop("LD_PRELOAD", None)  # glibc's malloc, whatever this process runs under.
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
