"""The main job's compilation cache (mocheg_jax/utils/compile_cache.py): a folder per host
CPU in the workdir, programs met again read back and counted, a folder set by the caller
left alone. In a subprocess: JAX settles on its cache at the first compilation, and this
test session's is already set (tests/conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from mocheg_jax.utils import compile_cache
from tests.processes import script_environment

_PROGRAM = r"""
import json, sys
import jax, jax.numpy as jnp
from mocheg_jax.utils import compile_cache

folder = compile_cache.use_workdir_cache(sys.argv[1])
tally = compile_cache.CompileTally()

def fresh_step():  # A new function object each time: jit's in-memory cache cannot help.
  def step(w, x):
    for _ in range(8):
      x = jnp.tanh(x @ w)
    return x.sum()
  return jax.jit(jax.grad(step))

x, w = jnp.ones((16, 64)), jnp.full((64, 64), 0.01)
first = fresh_step()(w, x)
read_after_first = tally.read_back
second = fresh_step()(w, x)
print(json.dumps({"folder": folder, "read_after_first": read_after_first,
                  "read_back": tally.read_back, "compiled": tally.compiled,
                  "compile_seconds": tally.compile_seconds, "same": bool((first == second).all()),
                  "summary": tally.summary()}))
"""


def _run(workdir, env_cache: str | None) -> dict:
  env = script_environment()
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  if env_cache:
    env["JAX_COMPILATION_CACHE_DIR"] = env_cache
  done = subprocess.run([sys.executable, "-c", _PROGRAM, str(workdir)], env=env,
                        capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_program_met_again_is_read_back_from_the_workdirs_cache(tmp_path):
  out = _run(tmp_path / "job", None)
  want = tmp_path / "job" / compile_cache.FOLDER / ("host-" + compile_cache.host_signature())
  assert out["folder"] == str(want)
  assert out["read_after_first"] == 0 and out["read_back"] >= 1, out
  assert out["compiled"] >= 1 and out["compile_seconds"] > 0 and out["same"], out
  assert f"{out['read_back']} read back" in out["summary"]
  assert any(name.endswith("-cache") for name in os.listdir(want))

  again = _run(tmp_path / "job", None)  # A rerun reads even the first compile back.
  assert again["read_after_first"] >= 1, again


def test_a_cache_folder_the_caller_set_is_kept(tmp_path):
  out = _run(tmp_path / "job", str(tmp_path / "own"))
  assert out["folder"] is None and out["read_back"] >= 1, out
  assert not (tmp_path / "job").exists() and os.listdir(tmp_path / "own")


def test_the_host_signature_is_stable_and_short():
  signature = compile_cache.host_signature()
  assert signature == compile_cache.host_signature()
  assert len(signature) == 12 and int(signature, 16) >= 0
