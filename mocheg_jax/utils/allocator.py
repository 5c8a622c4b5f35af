"""Runs an entry point under mimalloc instead of glibc's malloc (Linux), by re-executing it
once with LD_PRELOAD before anything heavy is imported.

Why: XLA:CPU mallocs every step's temporaries on its worker threads and frees them when the
step ends; glibc hands blocks that large back to the kernel (munmap, or a thread arena's
heap shrinking), so each step maps them afresh and the kernel zeroes every 4 KB page on its
first touch: millions of page faults and seconds of system time a minute
(mocheg_jax/utils/host_memory.py has the measurements). glibc's own cure, one arena that
keeps everything (`MOCHEG_JAX_KEEP_FREED_MEMORY=1`), makes every thread's malloc take one
lock, which cost more than the faults where many small programs run. mimalloc keeps freed
memory in per-thread heaps without that lock: with it never returning freed pages to the
kernel (MIMALLOC_PURGE_DELAY=-1), the MiniLM encoding benchmark faulted 125,000 pages
instead of 3.5 million and ran 250 instead of 215-226 sentences/s (BENCHMARKS.md, "Malloc").
With its default purging (freed pages handed back with madvise shortly after a free) the
same benchmark spent 13 s in the kernel instead of 6 and ran slower than under glibc, and
a 1 s delay kept a fifth of the verifier step's gain (1.115x PyTorch against 1.22x, glibc
1.085x), so we set -1 unless the environment already sets a delay (the main job, one
process of many stages, asks for 10 s: `run_under_preferred_allocator(purge_delay_ms)`).

The allocator must be in place when the process starts (a library loaded later cannot
take malloc over from libc), hence the re-exec: `run_under_preferred_allocator()` is the
first statement of every script and CPU benchmark (under `__name__ == "__main__"`: tests
import them). It returns at once when the process already runs the allocator asked for,
off Linux, or when mimalloc's library is missing (cmeel-mimalloc is a dependency on Linux;
without it the process stays on glibc). MOCHEG_JAX_MALLOC=glibc keeps glibc's malloc (and
takes an inherited mimalloc preload off). The environment is inherited, so the
subprocesses of a job start under the same allocator without a re-exec of their own. The
test session re-executes itself the same way (tests/conftest.py, `reexecution_needed`).
Library users who want it start Python with LD_PRELOAD set to `mimalloc_library()` and
MIMALLOC_PURGE_DELAY=-1.
"""

from __future__ import annotations

import os
import sys

ENV_VAR = "MOCHEG_JAX_MALLOC"
CHOICES = ("mimalloc", "glibc")
_PURGE_DELAY_VAR = "MIMALLOC_PURGE_DELAY"
# Set on the re-executed process to the allocator it was started for: one try per choice,
# even if the preload did not take.
_TRIED_VAR = "MOCHEG_JAX_MALLOC_REEXECUTED"
_LIBRARY = "libmimalloc.so.3"


class AllocatorError(RuntimeError):
  """MOCHEG_JAX_MALLOC names no allocator we know."""


def requested() -> str:
  """The allocator MOCHEG_JAX_MALLOC asks for (`mimalloc` when unset)."""
  choice = os.environ.get(ENV_VAR, "mimalloc").strip().lower()
  if choice not in CHOICES:
    raise AllocatorError(f"{ENV_VAR}={os.environ[ENV_VAR]!r}: expected one of "
                         f"{', '.join(CHOICES)}")
  return choice


def mimalloc_library() -> str | None:
  """Path of the mimalloc shared library that cmeel-mimalloc installed, or None."""
  for directory in sys.path:
    candidate = os.path.join(directory or ".", "cmeel.prefix", "lib", _LIBRARY)
    if os.path.isfile(candidate):
      return os.path.abspath(candidate)
  return None


def planned() -> str:
  """The allocator `run_under_preferred_allocator` gives a process started with this
  environment: the one requested where it can be had, else glibc."""
  if requested() == "mimalloc" and sys.platform.startswith("linux") and mimalloc_library():
    return "mimalloc"
  return "glibc"


def loaded() -> str:
  """Which allocator this process runs: `mimalloc` when its library is mapped, else `glibc`."""
  try:
    with open("/proc/self/maps") as maps:
      return "mimalloc" if any(_LIBRARY in line for line in maps) else "glibc"
  except OSError:  # No /proc (not Linux): the platform's own malloc.
    return "glibc"


def _switch_environment(purge_delay_ms: int = -1) -> dict[str, str] | None:
  """The environment a re-exec under the requested allocator needs, or None when this
  process should go on as it is (it runs that allocator, it tried once already, not Linux,
  or no mimalloc library). Raises AllocatorError for an unknown MOCHEG_JAX_MALLOC."""
  if not sys.platform.startswith("linux"):
    return None
  choice = requested()
  if loaded() == choice or os.environ.get(_TRIED_VAR) == choice:
    return None
  env = dict(os.environ)
  preloads = [p for p in env.get("LD_PRELOAD", "").split() if _LIBRARY not in p]
  if choice == "mimalloc":
    library = mimalloc_library()
    if library is None:
      return None
    preloads.insert(0, library)
    env.setdefault(_PURGE_DELAY_VAR, str(purge_delay_ms))
  env["LD_PRELOAD"] = " ".join(preloads)
  env[_TRIED_VAR] = choice
  return env


def reexecution_needed() -> bool:
  """Whether `run_under_preferred_allocator` would re-execute this process (for a caller
  that must prepare for it, as the test session hands back its captured output first).
  Raises AllocatorError for an unknown MOCHEG_JAX_MALLOC."""
  return _switch_environment() is not None


def run_under_preferred_allocator(purge_delay_ms: int = -1) -> None:
  """Re-executes this process under the allocator MOCHEG_JAX_MALLOC asks for when it runs
  another and the switch is possible (module doc); returns when nothing needs to change.
  Call it before importing JAX or PyTorch: nothing done before it is kept.

  purge_delay_ms: mimalloc's MIMALLOC_PURGE_DELAY unless the environment sets one: -1
  keeps every freed page (the fastest for a process of one job); a long process of many
  jobs, where what one stage freed is not what the next allocates, may hand pages unused
  that long back to the kernel instead (run_pipeline.py).
  """
  try:
    env = _switch_environment(purge_delay_ms)
  except AllocatorError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)
  if env is None:
    return
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, sys.orig_argv, env)
