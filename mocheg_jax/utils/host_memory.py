"""Keeps freed host memory in the process, so XLA:CPU steps stop page-faulting.

XLA:CPU allocates every step's temporaries (activations, gradients, dropout masks) with
malloc on its worker threads and frees them when the step ends. With glibc's defaults those
blocks are mapped fresh from the kernel each time: anything over the mmap threshold (32 MB
at most) is mmap'ed and unmapped per call, and a worker thread's own arena cannot hold large
blocks at all. Every step then touches gigabytes of new pages, and the kernel zeroes each
4 KB page on its first touch. Measured 2026-12-04 (2-vCPU AMD EPYC VM, MiniLM-shaped BERT,
96 x 64 tokens, forward and backward): 500,000 page faults and 1.2 s of system time per
step without dropout, 570,000 and 3.8 s with dropout 0.1 (its masks are more temporaries),
against 0 faults with the settings below; the step's wall time went from 3.6-4.2 s to
3.0-3.1 s without dropout and from 5.4-6.4 s to 3.3-3.5 s with it (BENCHMARKS.md).

`keep_freed_memory` tells glibc to keep what is freed: one arena for all threads (the main
one, which grows without a size limit), no mmap'ed blocks, and no trimming of the heap's
top. Memory then stays with the process at its peak and is reused by the next step, which
is what jemalloc and tcmalloc do too. The cost: the process does not give memory back to
the system while it runs. Set MOCHEG_JAX_KEEP_FREED_MEMORY=0 to leave glibc's defaults.

Called by every script's entry (`cli.friendly_errors`), the benchmarks and the tests. Best
called before JAX starts its CPU backend (threads that already run keep their arenas; in a
process where one extra arena existed it still removed ~90% of the faults).
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


def keep_freed_memory() -> bool:
  """Configures glibc's malloc to keep freed memory (see the module doc); True when done.

  Does nothing (False) off Linux, without glibc, or when MOCHEG_JAX_KEEP_FREED_MEMORY=0.
  """
  if os.environ.get(ENV_VAR, "1") == "0":
    return False
  if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
    return False
  libc = ctypes.CDLL(None)
  settings = ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, _NEVER))
  return all(libc.mallopt(option, value) == 1 for option, value in settings)
