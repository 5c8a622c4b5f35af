"""An on-disk embedding index: rows and their ids in shards, written resumably, read streaming.

Layout of an index folder:
```
header.json               what the index is (kind, dim, dtype, encoder, shard_size,
                          normalized); written first, so an interrupted run can resume
shard-00000.npy           float rows [shard_size, dim] (the last shard may be shorter)
shard-00000.ids.json      the ids of those rows, a JSON list of strings, in row order
...
manifest.json             written last: the header plus num_items and the shard names
```
Every file is written to a temporary name and renamed into place, so a crash never leaves a
half-written file under a final name. A shard's .npy is written after its ids, so a shard
counts as done when its .npy exists. Only full shards are written before `close()`: the
shard is the unit of resumption (items buffered in memory since the last full shard are
encoded again after a crash).

`encode_to_index` drives an encoder into an IndexWriter, skipping what an interrupted run
already wrote. It runs in one process (a multi-host run should index on process 0, or
each process into its own folder); the encoder itself may use every local device.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from mocheg_jax.data.report import MochegInputError
from mocheg_jax.utils import files, paths
from mocheg_jax.utils.progress import Progress

HEADER_FILE = "header.json"
MANIFEST_FILE = "manifest.json"
KINDS = ("text", "image")
DTYPES = ("float32", "float16")
FORMAT_VERSION = 1
# Rows of a normalized index must have |norm - 1| below this (float16 storage rounds ~1e-3).
NORM_TOLERANCE = 1e-2
# The fields that must agree for a run to resume (or a search to use) an index.
HEADER_FIELDS = ("kind", "dim", "dtype", "encoder", "shard_size", "normalized")


def shard_name(i: int) -> str:
  return f"shard-{i:05d}.npy"


def ids_name(i: int) -> str:
  return f"shard-{i:05d}.ids.json"


@dataclasses.dataclass(frozen=True)
class IndexManifest:
  """What an index holds. `encoder` is the caller's fingerprint (model, checkpoint, step...),
  only ever compared for equality."""
  kind: str
  dim: int
  dtype: str
  encoder: dict[str, Any]
  num_items: int
  shard_size: int
  shards: list[str]
  normalized: bool
  version: int = FORMAT_VERSION

  def header(self) -> dict[str, Any]:
    return {f: getattr(self, f) for f in HEADER_FIELDS}

  def to_json(self) -> dict[str, Any]:
    return dataclasses.asdict(self)

  @classmethod
  def from_json(cls, data: Any, path: os.PathLike | str) -> "IndexManifest":
    names = [f.name for f in dataclasses.fields(cls)]
    if not isinstance(data, dict):
      raise MochegInputError(f"{path}: expected a JSON object")
    missing = [n for n in names if n not in data and n != "version"]
    if missing:
      raise MochegInputError(f"{path}: missing field(s) {', '.join(missing)}")
    if data.get("version", FORMAT_VERSION) != FORMAT_VERSION:
      raise MochegInputError(f"{path}: index format version {data['version']!r}, this code "
                             f"reads version {FORMAT_VERSION}")
    return cls(**{n: data[n] for n in names if n in data})


# ---- small file helpers ------------------------------------------------------------------
def _write_atomic(path: pathlib.Path, write: Callable[[Any], None], mode: str = "w") -> None:
  """Writes through `write(file)` to a temporary name, then renames it into place."""
  with files.atomic_open(path, mode) as f:
    write(f)


def _write_json(path: pathlib.Path, data: Any) -> None:
  _write_atomic(path, lambda f: json.dump(data, f, indent=1, sort_keys=True))


def _read_json(path: pathlib.Path) -> Any:
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except json.JSONDecodeError as e:
    raise MochegInputError(f"{path}: not valid JSON ({e})") from e


def _npy_layout(path: pathlib.Path) -> tuple[tuple[int, ...], np.dtype, int]:
  """(shape, dtype, byte offset of the data) of a .npy file, reading only its header."""
  try:
    with open(path, "rb") as f:
      version = np.lib.format.read_magic(f)
      if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
      elif version == (2, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
      else:
        raise ValueError(f"unsupported .npy version {version}")
      offset = f.tell()
  except (ValueError, OSError) as e:
    raise MochegInputError(f"{path}: not a readable .npy file ({e})") from e
  if fortran:
    raise MochegInputError(f"{path}: Fortran-ordered arrays are not supported")
  return tuple(shape), np.dtype(dtype), offset


def _read_ids(path: pathlib.Path) -> list[str]:
  if not path.is_file():
    raise MochegInputError(f"{path}: missing ids file")
  ids = _read_json(path)
  if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
    raise MochegInputError(f"{path}: expected a JSON list of strings")
  return ids


def _differences(found: Mapping[str, Any], wanted: Mapping[str, Any]) -> list[str]:
  return [f"{f}={found.get(f)!r} (this run: {wanted[f]!r})" for f in HEADER_FIELDS
          if found.get(f) != wanted[f]]


# ---- writing ----------------------------------------------------------------------------
class IndexWriter:
  """Writes (id, embedding) rows to an index folder in shards; resumes an interrupted run.

  Args:
    out_dir: the index folder (created if missing).
    kind: "text" or "image".
    dim: the embedding width.
    encoder: a JSON-serialisable fingerprint of the encoder; an existing folder written with
      a different one is an error, never silently mixed.
    shard_size: rows per shard file (the unit of resumption).
    dtype: the storage type, "float32" or "float16".
    normalized: the rows are L2-normalised (checked on `add`).

  Raises:
    MochegInputError: the folder holds an index with a different header (naming the
      fields that differ), or its shards are inconsistent.
  """

  def __init__(self, out_dir: str | os.PathLike, kind: str, dim: int, encoder: dict,
               shard_size: int = 65536, dtype: str = "float32", normalized: bool = True):
    if kind not in KINDS:
      raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
    if dtype not in DTYPES:
      raise ValueError(f"dtype must be one of {DTYPES}, not {dtype!r}")
    if dim < 1 or shard_size < 1:
      raise ValueError(f"dim ({dim}) and shard_size ({shard_size}) must be positive")
    self.dir = pathlib.Path(out_dir)
    # Round-trip through JSON so the fingerprint compares equal to what open() reads back.
    self.header = json.loads(json.dumps({
        "kind": kind, "dim": int(dim), "dtype": dtype, "encoder": encoder,
        "shard_size": int(shard_size), "normalized": bool(normalized)}))
    self.dim, self.shard_size, self.normalized = int(dim), int(shard_size), bool(normalized)
    self._dtype = np.dtype(dtype)
    self._shards: list[str] = []
    self._ids: list[str] = []  # Every id written or buffered, in row order.
    self._seen: dict[str, int] = {}  # id -> row, for the uniqueness check.
    self._buffer: list[np.ndarray] = []
    self._buffered = 0
    self._closed = False
    self.dir.mkdir(parents=True, exist_ok=True)
    self._resume()

  # -- resuming
  def _resume(self) -> None:
    for stale in self.dir.glob("*.tmp"):
      stale.unlink()
    header_path = self.dir / HEADER_FILE
    if not header_path.exists():
      if any(self.dir.glob("shard-*.npy")) or (self.dir / MANIFEST_FILE).exists():
        raise MochegInputError(f"{self.dir}: holds shards but no {HEADER_FILE}; not an index "
                               "this code wrote (use an empty folder)")
      _write_json(header_path, self.header)
      return
    found = _read_json(header_path)
    if not isinstance(found, dict):
      raise MochegInputError(f"{header_path}: expected a JSON object")
    # In a folder moved since (paths.moved_folder), the encoder's paths name the old root.
    diffs = _differences(paths.relocate(found, None), paths.relocate(self.header, None))
    if diffs:
      raise MochegInputError(f"{header_path}: the index there was started with "
                             f"{'; '.join(diffs)}; use another folder or delete it")
    i = 0
    while (self.dir / shard_name(i)).exists():
      path = self.dir / shard_name(i)
      shape, _, _ = _npy_layout(path)
      ids = _read_ids(self.dir / ids_name(i))
      if len(shape) != 2 or shape[1] != self.dim or shape[0] != len(ids):
        raise MochegInputError(f"{path}: shape {shape} does not match {len(ids)} ids in "
                               f"{ids_name(i)} and dim {self.dim}")
      if shape[0] != self.shard_size:
        if not (self.dir / shard_name(i + 1)).exists():
          # The final, partial shard of a finished index (or of one whose appending was
          # interrupted): read it back into the buffer, so that adding rows rewrites it.
          self._buffer.append(np.load(path).astype(self._dtype))
          self._buffered = shape[0]
          self._remember(ids)
          break
        raise MochegInputError(f"{path}: {shape[0]} rows, but every shard before the last "
                               f"holds shard_size={self.shard_size}")
      self._remember(ids)
      self._shards.append(shard_name(i))
      i += 1

  def _remember(self, ids: Sequence[str]) -> None:
    for i in ids:
      self._check_new(i)
      self._seen[i] = len(self._ids)
      self._ids.append(i)

  def _check_new(self, item_id: str) -> None:
    if not isinstance(item_id, str) or not item_id:
      raise MochegInputError(f"index {self.dir}: row {len(self._ids)}: id {item_id!r} is not "
                             "a non-empty string")
    if item_id in self._seen:
      raise MochegInputError(f"index {self.dir}: duplicate id {item_id!r} (rows "
                             f"{self._seen[item_id]} and {len(self._ids)})")

  def done_items(self) -> int:
    """Rows already on disk or buffered (an interrupted run's full shards, a finished
    index's rows); a resuming caller skips this many items."""
    return len(self._ids)

  @property
  def ids(self) -> list[str]:
    """The ids written so far, in row order (to check a resumed run's ids agree)."""
    return self._ids

  # -- adding
  def add(self, ids: Sequence[str], embeddings: np.ndarray) -> None:
    """Buffers rows; every full shard is written to disk at once.

    Raises:
      MochegInputError: a row count or width mismatch, a duplicate or empty id, a
        non-finite row, or (normalized index) a row whose norm is not 1, naming the id.
    """
    if self._closed:
      raise ValueError(f"index {self.dir} is closed")
    embeddings = np.asarray(embeddings)
    ids = list(ids)
    if embeddings.ndim != 2 or embeddings.shape != (len(ids), self.dim):
      raise MochegInputError(f"index {self.dir}: {len(ids)} ids with embeddings of shape "
                             f"{embeddings.shape}; expected ({len(ids)}, {self.dim})")
    rows = embeddings.astype(np.float32, copy=False)
    finite = np.isfinite(rows).all(axis=1)
    if not finite.all():
      bad = int(np.argmin(finite))
      raise MochegInputError(f"index {self.dir}: the embedding of id {ids[bad]!r} is not "
                             "finite")
    if self.normalized and len(rows):
      norms = np.linalg.norm(rows, axis=1)
      off = np.abs(norms - 1) > NORM_TOLERANCE
      if off.any():
        bad = int(np.argmax(off))
        raise MochegInputError(f"index {self.dir}: normalized index, but the embedding of id "
                               f"{ids[bad]!r} has norm {norms[bad]:.4f}")
    manifest_path = self.dir / MANIFEST_FILE
    if ids and manifest_path.exists():
      manifest_path.unlink()  # Appending to a finished index: unfinished until close().
    start = len(self._ids)
    try:
      self._remember(ids)
    except MochegInputError:
      for i in self._ids[start:]:
        del self._seen[i]
      del self._ids[start:]
      raise
    self._buffer.append(embeddings.astype(self._dtype))
    self._buffered += len(ids)
    while self._buffered >= self.shard_size:
      self._flush(self.shard_size)

  def _flush(self, count: int) -> None:
    """Writes the first `count` buffered rows as the next shard."""
    data = np.concatenate(self._buffer) if len(self._buffer) != 1 else self._buffer[0]
    first = len(self._shards) * self.shard_size
    i = len(self._shards)
    _write_json(self.dir / ids_name(i), self._ids[first:first + count])
    _write_atomic(self.dir / shard_name(i), lambda f: np.save(f, data[:count]), "wb")
    self._shards.append(shard_name(i))
    rest = data[count:]
    self._buffer = [rest] if len(rest) else []
    self._buffered = len(rest)

  def close(self) -> IndexManifest:
    """Writes the last partial shard and manifest.json; returns the manifest."""
    if self._buffered:
      self._flush(self._buffered)
    manifest = IndexManifest(num_items=len(self._ids), shards=list(self._shards),
                             **self.header)
    _write_json(self.dir / MANIFEST_FILE, manifest.to_json())
    self._closed = True
    return manifest

  def __enter__(self) -> "IndexWriter":
    return self

  def __exit__(self, exc_type, *exc) -> None:
    if exc_type is None and not self._closed:
      self.close()


# ---- reading ----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Shard:
  path: pathlib.Path
  start: int  # Global row of the shard's first row.
  rows: int
  offset: int  # Byte offset of the data in the .npy file.


class EmbeddingIndex:
  """A finished index, opened read-only. Rows stream from disk; only the ids are in memory.

  Use `EmbeddingIndex.open(dir, expect_encoder=..., expect_dim=...)`.
  """

  def __init__(self, index_dir: pathlib.Path, manifest: IndexManifest, ids: list[str],
               shards: list[_Shard]):
    self.dir, self.manifest, self.ids = index_dir, manifest, ids
    self.dim = manifest.dim
    self.dtype = np.dtype(manifest.dtype)
    self._shards = shards
    self._starts = np.array([s.start for s in shards], np.int64)
    self._maps: dict[int, np.ndarray] = {}

  @classmethod
  def open(cls, index_dir: str | os.PathLike, expect_encoder: dict | None = None,
           expect_dim: int | None = None, moved: paths.Moved = None) -> "EmbeddingIndex":
    """Opens and checks an index folder.

    `moved` (old root, new root): the index lies in a folder that was copied from the old
    root, so an encoder fingerprint naming a path under the old root matches the same path
    under the new one (either side may name the old one).

    Raises:
      MochegInputError: naming the file: a missing manifest (an unfinished index) or shard,
        a shard whose rows disagree with its ids or the manifest, a dimension or encoder
        different from the expected one, or a duplicate id.
    """
    index_dir = pathlib.Path(index_dir)
    manifest_path = index_dir / MANIFEST_FILE
    if not manifest_path.is_file():
      why = ("the index was not finished (rerun the indexer to resume it)"
             if (index_dir / HEADER_FILE).exists() else "not an index folder")
      raise MochegInputError(f"{manifest_path}: missing; {why}")
    manifest = IndexManifest.from_json(_read_json(manifest_path), manifest_path)
    if expect_dim is not None and manifest.dim != expect_dim:
      raise MochegInputError(f"{manifest_path}: the index holds {manifest.dim}-d embeddings, "
                             f"but the encoder gives {expect_dim}-d ones")
    if expect_encoder is not None:
      expected = json.loads(json.dumps(expect_encoder))
      if not paths.same_record(manifest.encoder, expected, moved):
        raise MochegInputError(f"{manifest_path}: the index was built by another encoder "
                               f"({manifest.encoder}); this search encodes with {expected} "
                               "(index the KB with it first: scripts/index.py)")
    ids: list[str] = []
    shards: list[_Shard] = []
    seen: dict[str, int] = {}
    for name in manifest.shards:
      path = index_dir / name
      if not path.is_file():
        raise MochegInputError(f"{path}: missing shard (listed in {MANIFEST_FILE})")
      shape, dtype, offset = _npy_layout(path)
      if len(shape) != 2 or shape[1] != manifest.dim or dtype != np.dtype(manifest.dtype):
        raise MochegInputError(f"{path}: {dtype} array of shape {shape}; the manifest says "
                               f"{manifest.dtype} rows of width {manifest.dim}")
      ids_path = path.with_name(name[:-len(".npy")] + ".ids.json")
      shard_ids = _read_ids(ids_path)
      if len(shard_ids) != shape[0]:
        raise MochegInputError(f"{path}: {shape[0]} rows, but {ids_path.name} lists "
                               f"{len(shard_ids)} ids")
      for i in shard_ids:
        if i in seen:
          raise MochegInputError(f"{ids_path}: duplicate id {i!r} (rows {seen[i]} and "
                                 f"{len(ids)})")
        seen[i] = len(ids)
        ids.append(i)
      shards.append(_Shard(path, len(ids) - shape[0], shape[0], offset))
    if len(ids) != manifest.num_items:
      raise MochegInputError(f"{manifest_path}: num_items is {manifest.num_items}, but the "
                             f"shards hold {len(ids)} rows")
    return cls(index_dir, manifest, ids, shards)

  def __len__(self) -> int:
    return len(self.ids)

  @property
  def num_items(self) -> int:
    return len(self.ids)

  def _map(self, s: int) -> np.ndarray:
    if s not in self._maps:
      self._maps[s] = np.load(self._shards[s].path, mmap_mode="r")
    return self._maps[s]

  def _check_range(self, start: int, stop: int) -> None:
    if not 0 <= start <= stop <= len(self):
      raise IndexError(f"rows [{start}, {stop}) out of range for {len(self)} rows")

  def _pieces(self, start: int, stop: int) -> Iterator[tuple[int, int, int]]:
    """(shard, first row in shard, row count) covering [start, stop)."""
    s = max(0, int(np.searchsorted(self._starts, start, side="right")) - 1)
    while start < stop:
      shard = self._shards[s]
      first = start - shard.start
      count = min(stop, shard.start + shard.rows) - start
      if count > 0:
        yield s, first, count
        start += count
      s += 1

  def embeddings(self, start: int = 0, stop: int | None = None) -> np.ndarray:
    """Rows [start, stop) in the stored dtype: a read-only memory map when they lie in one
    shard, else a copy (the rows of several shards concatenated)."""
    stop = len(self) if stop is None else stop
    self._check_range(start, stop)
    parts = [self._map(s)[first:first + count] for s, first, count in
             self._pieces(start, stop)]
    if len(parts) == 1:
      return parts[0]
    return np.concatenate(parts) if parts else np.zeros((0, self.dim), self.dtype)

  def gather(self, rows: Sequence[int]) -> np.ndarray:
    """The rows at the given positions (any order), as float32."""
    out = np.zeros((len(rows), self.dim), np.float32)
    for i, row in enumerate(rows):
      out[i] = self.embeddings(row, row + 1)[0]  # Checks the range.
    return out

  def read(self, start: int, stop: int, out: np.ndarray | None = None) -> np.ndarray:
    """Rows [start, stop) copied into `out` (or a new array) with plain file reads.

    Unlike the memory map, file reads leave no file pages mapped into the process, so
    streaming the whole corpus keeps the process's memory to the buffers in use.
    """
    self._check_range(start, stop)
    if out is None:
      out = np.empty((stop - start, self.dim), self.dtype)
    if out.shape != (stop - start, self.dim) or out.dtype != self.dtype or \
        not out.flags.c_contiguous:
      raise ValueError(f"out must be a C-contiguous {self.dtype} array of shape "
                       f"({stop - start}, {self.dim})")
    row_bytes = self.dim * self.dtype.itemsize
    at = 0
    for s, first, count in self._pieces(start, stop):
      shard = self._shards[s]
      view = memoryview(out[at:at + count]).cast("B")
      with open(shard.path, "rb", buffering=0) as f:
        f.seek(shard.offset + first * row_bytes)
        done = 0
        while done < len(view):  # readinto may return less than asked.
          n = f.readinto(view[done:])
          if not n:
            raise MochegInputError(f"{shard.path}: truncated (expected {shard.rows} rows)")
          done += n
      at += count
    return out

  def chunks(self, chunk_size: int) -> Iterator[tuple[int, np.ndarray]]:
    """(first row, rows) for consecutive chunks of at most `chunk_size` rows, read from
    disk one at a time (see `read`)."""
    if chunk_size < 1:
      raise ValueError(f"chunk_size must be positive, not {chunk_size}")
    for start in range(0, len(self), chunk_size):
      yield start, self.read(start, min(start + chunk_size, len(self)))


# ---- the resumable driver ---------------------------------------------------------------
def encode_to_index(out_dir: str | os.PathLike, ids: Sequence[str],
                    encode: Callable[[Sequence[int]], np.ndarray], *, kind: str, dim: int,
                    encoder: dict, batch_size: int = 8192, shard_size: int = 65536,
                    dtype: str = "float32", normalized: bool = True,
                    progress: bool = True) -> IndexManifest:
  """Encodes items `ids[i]` with `encode(rows) -> [len(rows), dim]` into an index folder.

  Resumes an interrupted run: the rows already in full shards are skipped (their ids must
  equal the first ids of this run), and the rest are encoded `batch_size` rows per call
  (pass a large batch: the encoder batches for its device itself). Single-process.

  Returns:
    The finished index's manifest.

  Raises:
    MochegInputError: the folder holds another encoder's index, or different ids.
  """
  if batch_size < 1:
    raise ValueError(f"batch_size must be positive, not {batch_size}")
  ids = list(ids)
  writer = IndexWriter(out_dir, kind, dim, encoder, shard_size=shard_size, dtype=dtype,
                       normalized=normalized)
  done = writer.done_items()
  if done > len(ids) or writer.ids != ids[:done]:
    row = next((i for i, (a, b) in enumerate(zip(writer.ids, ids)) if a != b),
               min(done, len(ids)))
    found = writer.ids[row] if row < done else None
    wanted = ids[row] if row < len(ids) else None
    raise MochegInputError(f"{out_dir}: the index there holds {done} rows with other ids "
                           f"(row {row}: {found!r} there, {wanted!r} in this run); use "
                           "another folder or delete it")
  desc = f"indexing {kind}s" + (f" (resumed after {done:,})" if done else "")
  with Progress(desc, total=len(ids) - done, unit="items", enabled=progress) as bar:
    for start in range(done, len(ids), batch_size):
      rows = range(start, min(start + batch_size, len(ids)))
      writer.add(ids[rows.start:rows.stop], np.asarray(encode(rows)))
      bar.update(len(rows))
  return writer.close()
