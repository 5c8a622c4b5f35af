"""What every absl entry point shares: unusable input ends in one clear line and exit 1,
and library INFO logs (TFDS prints several per dataset) stay quiet unless --verbosity asks.
"""

from __future__ import annotations

import functools
import sys
from typing import Callable

from absl import flags, logging

from mocheg_jax.data.report import MochegInputError

# Errors that mean "the input cannot be used", as opposed to bugs (which keep tracebacks).
USER_ERRORS = (MochegInputError, FileNotFoundError, NotADirectoryError, FileExistsError)


def friendly_errors(main: Callable[[list[str]], None]) -> Callable[[list[str]], None]:
  """Wraps an absl `main`: user errors print `error: ...` to stderr and exit with 1."""

  @functools.wraps(main)
  def wrapped(argv: list[str]) -> None:
    if not flags.FLAGS["verbosity"].present:
      logging.set_verbosity(logging.WARNING)
    try:
      main(argv)
    except USER_ERRORS as e:
      print(f"error: {e}", file=sys.stderr)
      sys.exit(1)

  return wrapped
