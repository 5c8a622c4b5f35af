"""Optionally keeps freed host memory in the process, so XLA:CPU steps stop page-faulting.

XLA:CPU allocates every step's temporaries (activations, gradients, dropout masks) with
malloc on its worker threads and frees them when the step ends. With glibc's defaults those
blocks are mapped fresh from the kernel each time: anything over the mmap threshold (32 MB
at most) is mmap'ed and unmapped per call, and a worker thread's own arena cannot hold large
blocks at all. Every step then touches gigabytes of new pages, and the kernel zeroes each
4 KB page on its first touch. Measured 2026-12-04 (2-vCPU AMD EPYC VM, MiniLM-shaped BERT,
96 x 64 tokens, forward and backward): 500,000 page faults and 1.2 s of system time per
step without dropout, 570,000 and 3.8 s with dropout 0.1 (its masks are more temporaries),
against 0-9,000 with the settings below; the step's wall time went from 3.6-4.2 s to
2.9-3.2 s without dropout and from 5.4-6.5 s to 3.3-3.5 s with it (BENCHMARKS.md). What the
faults cost depends on the VM: the same benchmark's 3.1 million faults took 47 s of system
time that morning and 9.5 s that afternoon, when the setting gained a MiniLM-shaped step
with dropout 8-15% and that benchmark nothing.

With MOCHEG_JAX_KEEP_FREED_MEMORY=1, `keep_freed_memory_if_asked` tells glibc to keep what
is freed: one arena for all threads (the main one, which grows without a size limit), no
mmap'ed blocks, and no trimming of the heap's top. Memory then stays with the process and
the next step reuses it. It is off by default because of what it costs:
- Every thread's malloc takes the one arena's lock. Where many small programs run (the tiny
  main job, the tests) that contention cost more than the faults did: the tiny main job
  took 9-13% longer in two A/B pairs, its verification stage's system time went from 12-14
  to 17-20 s, on 2 cores; more cores contend more. (tcmalloc, preloaded, removed the faults
  without that cost: BENCHMARKS.md.)
- The process does not give memory back while it runs, and its heap can hold more than one
  step's temporaries (a step's are freed just after its result is ready, at times after the
  next step allocated its own): a bare step with 512 MB of temporaries run back to back
  settled at 3.4-3.9 GB peak resident memory against 0.8 GB; the InfoNCE benchmark's peak
  went from 4.85 to 5.08 GB.
Since 2026-12-06 the scripts run under mimalloc by default (mocheg_jax/utils/allocator.py),
which removes the faults without the lock; this setting is for processes that keep glibc's
malloc (MOCHEG_JAX_MALLOC=glibc, or library code started without the preload), where it
matters for long CPU training runs of MiniLM-sized models and larger. Under mimalloc it
changes nothing (mallopt configures only glibc's malloc).

Called by every script's entry (`cli.friendly_errors`), the benchmarks and the tests; it
must run before JAX starts its CPU backend (threads that already run keep their arenas).
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys

ENV_VAR = "MOCHEG_JAX_KEEP_FREED_MEMORY"

# mallopt's parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
# mallopt takes an int; -1 becomes SIZE_MAX inside glibc: never trim.
_NEVER = -1


def asked() -> bool:
  """Whether this process's environment asks for the setting (MOCHEG_JAX_KEEP_FREED_MEMORY=1)."""
  return os.environ.get(ENV_VAR) == "1"


def keep_freed_memory_if_asked() -> bool:
  """When `asked()`, configures glibc's malloc to keep freed memory (see the module doc); True
  when done.

  Does nothing (False) without MOCHEG_JAX_KEEP_FREED_MEMORY=1, off Linux or without glibc.
  """
  if not asked():
    return False
  if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
    return False
  libc = ctypes.CDLL(None)
  settings = ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, _NEVER))
  return all(libc.mallopt(option, value) == 1 for option, value in settings)
