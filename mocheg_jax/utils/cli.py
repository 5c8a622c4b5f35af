"""What every absl entry point shares: unusable input ends in one clear line and exit 1,
library INFO logs (TFDS prints several per dataset) stay quiet unless --verbosity asks, and
freed host memory stays with the process when MOCHEG_JAX_KEEP_FREED_MEMORY=1 asks
(mocheg_jax/utils/host_memory.py).
"""

from __future__ import annotations

import functools
import sys
from typing import Callable

from absl import flags, logging

from mocheg_jax.data.report import MochegInputError
from mocheg_jax.utils import host_memory

# Errors that mean "the input cannot be used", as opposed to bugs (which keep tracebacks).
USER_ERRORS = (MochegInputError, FileNotFoundError, NotADirectoryError, FileExistsError)


class Stopped(Exception):
  """A stop signal (SIGTERM, SIGINT, a preemption notice) ended a job before its end; what
  it finished is saved. Entry points exit with 128 + the signal's number."""

  def __init__(self, message: str, signal_number: int):
    super().__init__(message)
    self.exit_code = 128 + signal_number


def friendly_errors(main: Callable[[list[str]], None]) -> Callable[[list[str]], None]:
  """Wraps an absl `main`: user errors print `error: ...` to stderr and exit with 1; a
  `Stopped` job prints `stopped: ...` and exits with 128 + the signal's number; glibc keeps
  freed memory when asked (`host_memory.keep_freed_memory_if_asked`)."""

  @functools.wraps(main)
  def wrapped(argv: list[str]) -> None:
    host_memory.keep_freed_memory_if_asked()  # Before JAX's CPU backend starts (host_memory.py).
    if not flags.FLAGS["verbosity"].present:
      logging.set_verbosity(logging.WARNING)
    try:
      main(argv)
    except USER_ERRORS as e:
      print(f"error: {e}", file=sys.stderr)
      sys.exit(1)
    except Stopped as e:
      print(f"stopped: {e}", file=sys.stderr)
      sys.exit(e.exit_code)

  return wrapped
