"""Paths recorded inside a folder that was moved (or copied) after they were written.

A pipeline folder stores absolute paths of itself: the saved training configs (data.dir,
the frozen CLIP's workdir, ...), the encoder fingerprints of its indexes and of its feature
stores. Once the folder is copied elsewhere and the original removed, those paths name
nothing. `moved = (old root, new root)` says where the folder was written and where it is
read now; `relocate` rewrites what was under the old root to the same place under the new
one, and `same_record` compares a record read from the folder with one computed now.

Paths outside the old root (a release in /data, a model folder in /models) and relative
paths are left as they are: they never moved with the folder.

Code that reads a moved folder passes `moved` where it loads (the fact checker), or runs
inside `with moved_folder(moved):` (the main job rerun on a moved folder: the move then
reaches every `relocate` and `same_record` deep in the stages, the trainer's tasks
included, without a parameter through each).
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from typing import Any, Iterator

Moved = tuple[str, str] | None  # (the root as written, the root as read now), or None.

_AMBIENT: contextvars.ContextVar[Moved] = contextvars.ContextVar("moved_folder", default=None)


@contextlib.contextmanager
def moved_folder(moved: Moved) -> Iterator[None]:
  """Within it, `relocate` and `same_record` given no move (None) use `moved`.

  A context variable: threads started inside do not see it (the main job's comparisons all
  run on its main thread); pass `moved` explicitly to code that runs elsewhere.
  """
  token = _AMBIENT.set(moved)
  try:
    yield
  finally:
    _AMBIENT.reset(token)


def moved_root(written_at: str | None, root: str) -> Moved:
  """(written_at, root) when a folder written at `written_at` is now read at `root`; None
  when it was not recorded or both name the same folder."""
  if not written_at:
    return None
  old, new = os.path.normpath(written_at), os.path.normpath(os.path.abspath(root))
  if old == new or os.path.realpath(old) == os.path.realpath(new):
    return None
  return old, new


def relocate(value: Any, moved: Moved) -> Any:
  """`value` with every absolute path under the old root moved to the new root.

  Strings, and the strings inside dicts, lists and tuples (nested), are rewritten; a path
  that is not under the old root, a relative path and anything else come back unchanged.
  `moved` None: the ambient `moved_folder`, if any.
  """
  moved = moved if moved is not None else _AMBIENT.get()
  if moved is None:
    return value
  old, new = moved
  if isinstance(value, str):
    if not os.path.isabs(value):
      return value
    path = os.path.normpath(value)
    if path == old:
      return new
    if path.startswith(old.rstrip(os.sep) + os.sep):
      return os.path.join(new, os.path.relpath(path, old))
    return value
  if isinstance(value, dict):
    return {key: relocate(item, moved) for key, item in value.items()}
  if isinstance(value, (list, tuple)):
    return type(value)(relocate(item, moved) for item in value)
  return value


def same_record(found: Any, wanted: Any, moved: Moved) -> bool:
  """`found` (read from the folder) equals `wanted` (computed now) as written, or once the
  paths of both under the old root are moved to the new one (so either side may name the
  old folder). `moved` None: the ambient `moved_folder`, if any."""
  if found == wanted:
    return True
  moved = moved if moved is not None else _AMBIENT.get()
  return moved is not None and relocate(found, moved) == relocate(wanted, moved)
