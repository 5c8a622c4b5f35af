"""Files that appear whole or not at all.

A crash (or a reader running at the same time) must never see half a table, manifest or
prediction file: everything the pipeline writes goes to a temporary file beside its target,
is flushed to disk, and is then renamed over it (`os.replace` is atomic within a folder).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from typing import IO, Any, Iterator

READABLE = 0o644  # mkstemp makes files private; outputs are for everyone to read.


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", **open_kwargs) -> Iterator[IO]:
  """Opens a temporary file beside `path`; on a clean exit it is synced and renamed to
  `path`, on an exception removed (`path` keeps its old content, if any).

  Text modes default to UTF-8. The temporary name is unique, so processes writing the same
  target never share one.
  """
  path = os.fspath(path)
  folder = os.path.dirname(os.path.abspath(path))
  fd, tmp = tempfile.mkstemp(dir=folder, prefix=os.path.basename(path) + ".", suffix=".tmp")
  if "b" not in mode:
    open_kwargs.setdefault("encoding", "utf-8")
  try:
    with os.fdopen(fd, mode, **open_kwargs) as f:
      yield f
      f.flush()
      os.fsync(f.fileno())
    os.chmod(tmp, READABLE)
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(FileNotFoundError):
      os.remove(tmp)
    raise


def write_text(path: str | os.PathLike, text: str) -> None:
  """`text` into `path`, atomically."""
  with atomic_open(path) as f:
    f.write(text)


def write_json(path: str | os.PathLike, data: Any, **dump_kwargs) -> None:
  """`data` as JSON into `path`, atomically (`dump_kwargs` go to json.dump)."""
  with atomic_open(path) as f:
    json.dump(data, f, **dump_kwargs)


def sha256(path: str | os.PathLike) -> str:
  """A file's sha256 (hex), read in blocks."""
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()
