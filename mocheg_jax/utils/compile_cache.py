"""The main job's persistent compilation cache, kept in its workdir.

A job meets some programs more than once (the gold-trained verifier's seeds train the same
step; in a fresh small job 11 of 210 programs, README), a rerun of an interrupted job
compiles again everything the first run did, and a fact-check compiles what the job's own
sample checks did. JAX's persistent cache keys a compiled program by its HLO, the compile
options, the backend and the jax version, so a program met again is read back instead of
compiled.

The folder is named per host CPU as well: XLA:CPU compiles for the instruction set of the
machine it runs on, which JAX's key does not name, so a workdir copied to a CPU without,
say, AVX-512 must not read the programs compiled on one with it.
"""

from __future__ import annotations

import hashlib
import os
import platform
import threading

import jax

FOLDER = "compilation_cache"
# JAX evicts the least recently used entries beyond this size (and locks its files because a
# limit is set, so processes sharing the folder never read a half-written entry).
MAX_BYTES = 4 << 30
_HIT = "/jax/compilation_cache/cache_hits"
# A compile step's duration: XLA's compilation, or reading the program back on a hit.
_BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"


def host_signature() -> str:
  """12 hex digits naming the CPU model and its instruction-set flags (Linux), else the
  platform's processor and machine names."""
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      text = "".join(sorted({line for line in f if line.startswith(("model name", "flags"))}))
  except OSError:
    text = ""
  text = text or platform.processor() + platform.machine()
  return hashlib.sha1(text.encode()).hexdigest()[:12]


class CompileTally:
  """Counts the programs XLA compiled and those read back from the persistent cache, with
  the seconds each took (JAX's own monitoring events, which fire on the compiling thread)."""

  def __init__(self):
    self.compiled = self.read_back = 0
    self.compile_seconds = self.read_seconds = 0.0
    self._lock = threading.Lock()
    self._thread = threading.local()
    jax.monitoring.register_event_listener(self._event)
    jax.monitoring.register_event_duration_secs_listener(self._duration)

  def _event(self, event: str, **kwargs) -> None:
    if event == _HIT:  # Fires inside the compile step whose duration comes next.
      self._thread.hit = True

  def _duration(self, event: str, seconds: float, **kwargs) -> None:
    if event != _BACKEND_COMPILE:
      return
    hit, self._thread.hit = getattr(self._thread, "hit", False), False
    with self._lock:
      if hit:
        self.read_back += 1
        self.read_seconds += seconds
      else:
        self.compiled += 1
        self.compile_seconds += seconds

  def summary(self) -> str:
    return (f"compilation: {self.compiled} programs compiled in {self.compile_seconds:.0f} s, "
            f"{self.read_back} read back from the cache in {self.read_seconds:.0f} s")


def use_workdir_cache(workdir: str) -> str | None:
  """Points JAX's persistent compilation cache at WORKDIR/compilation_cache/host-SIGNATURE
  and returns that folder; None (nothing changed) when a cache folder is already set, e.g.
  by $JAX_COMPILATION_CACHE_DIR. Call it before anything compiles: JAX settles on its cache
  at the first compilation."""
  if jax.config.jax_compilation_cache_dir:
    return None
  root = workdir if "://" in workdir else os.path.abspath(workdir)  # gs://... stays a URL.
  folder = os.path.join(root, FOLDER, "host-" + host_signature())
  jax.config.update("jax_compilation_cache_dir", folder)
  jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  return folder
