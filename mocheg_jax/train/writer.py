"""Training metrics on disk: `metrics.jsonl` (one JSON object per log step) and TensorBoard.

`MetricWriter.write(step, metrics)` appends `{"step": step, **metrics}` to
`workdir/metrics.jsonl` and, unless disabled, adds one TensorBoard scalar per metric to an
event file in `workdir/tensorboard/` (tensorboardX). Only process 0 writes by default; on
the other processes every call is a cheap no-op (keys and shapes are still checked, so a bad
metric fails on every host alike, but no value is fetched from the device).

The JSON lines file is the exact record, meant for scripts and tests:
* values are Python ints and floats (numpy and jax scalars are converted);
* NaN and infinities are written as the strings "nan", "inf" and "-inf", because standard
  JSON has no such numbers (Python's own `NaN` token is rejected by strict parsers) and
  `null` would make a diverged loss look like a missing one. `read_metrics` turns them back
  into floats;
* the file is flushed after every line, so killing the process (even with SIGKILL) loses
  nothing already written; a torn last line (power loss, full disk) is dropped with a
  warning by `read_metrics` and repaired by the next `MetricWriter` on the same workdir.

Resuming: pass `resume_step`, the step of the checkpoint the run restarts from (0 for a
fresh start in a workdir that may hold a run that died before its first checkpoint).
Records with a larger step came from a run segment whose checkpoint was lost; they are
removed from `metrics.jsonl` (atomic rewrite) and hidden in TensorBoard with tensorboardX's
`purge_step` (a SessionLog.START event at `resume_step + 1`: TensorBoard's Python loaders
drop every earlier-read point at or after that step), so the resumed run reads as one clean
curve in both. TensorBoard's fast Rust loader (`--load_fast`) ignores SessionLog events but
drops a series' points at or after any step that arrives out of order, which gives the
same curve once the resumed run writes its first point.

TensorBoard points are written by tensorboardX's background thread and flushed every few
seconds (`tensorboard_flush_secs`) and on `close()`; a SIGKILL can lose those last seconds
of TensorBoard points, never a line of `metrics.jsonl`.
"""

from __future__ import annotations

import json
import math
import numbers
import operator
import os
import time
from typing import Any, Mapping

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from mocheg_jax.data.report import MochegInputError
from mocheg_jax.utils import files

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"

# Non-finite floats in the JSON lines file (see the module docstring).
_TEXT_TO_FLOAT = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}

MetricValue = float | int | np.number | jax.Array

# Every event file starts with a SessionLog.START (tensorboardX's `purge_step`), also when
# nothing is to be purged: TensorBoard's Python loader (plugin_event_accumulator) treats the
# first START of a run as its beginning and only later ones as restarts, so a resumed
# segment's purge would be ignored if the first segment had written none. A START at the
# largest int64 step purges nothing (it hides points at steps >= its own).
_NO_PURGE_STEP = 2**63 - 1


def _encode_float(value: float) -> float | str:
  if math.isfinite(value):
    return value
  if math.isnan(value):
    return "nan"
  return "inf" if value > 0 else "-inf"


def _check_name(name: Any) -> None:
  if not isinstance(name, str):
    raise TypeError(f"metric names must be strings, got {name!r} ({type(name).__name__})")
  if not name:
    raise ValueError("metric names must not be empty")
  if name == "step":
    raise ValueError('"step" is not allowed as a metric name: the writer stores the step '
                     'under that key itself')


def _check_value(name: str, value: Any) -> None:
  """Checks that `value` is a numeric scalar without fetching it from the device."""
  if isinstance(value, (bool, int, float)):
    return
  if isinstance(value, (np.generic, np.ndarray, jax.Array)):
    dtype = value.dtype
    if not (jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.integer)
            or jnp.issubdtype(dtype, jnp.bool_)):
      raise TypeError(f"metric {name!r}: expected a real number, got dtype {dtype}")
    if np.shape(value) != ():
      raise ValueError(f"metric {name!r}: expected a scalar, got an array of shape "
                       f"{tuple(np.shape(value))}")
    return
  raise TypeError(f"metric {name!r}: expected a number or a scalar array, got "
                  f"{type(value).__name__}")


def _to_python(value: Any) -> int | float:
  """A checked scalar (already on the host) as a Python int or float."""
  if isinstance(value, (bool, np.bool_)):
    return int(value)
  if isinstance(value, numbers.Integral):
    return int(value)
  if isinstance(value, (np.ndarray, np.generic)):
    if jnp.issubdtype(value.dtype, jnp.floating):
      return float(value)  # Also bfloat16 / float8, which numpy does not call floating.
    return int(value)
  return float(value)


def _check_step(step: Any) -> int:
  if isinstance(step, (bool, np.bool_)):
    raise TypeError(f"step must be an integer, got {step!r}")
  try:
    step = operator.index(step)
  except TypeError:
    raise TypeError(f"step must be an integer, got {step!r} "
                    f"({type(step).__name__})") from None
  if step < 0:
    raise ValueError(f"step must be >= 0, got {step}")
  return step


def _parse_line(text: str) -> dict | None:
  """One record, or None when the line is not a JSON object with an integer "step"."""
  try:
    record = json.loads(text)
  except ValueError:
    return None
  if not isinstance(record, dict) or not isinstance(record.get("step"), int):
    return None
  return record


def _scan(path: str) -> tuple[list[tuple[str, dict]], bool]:
  """The records of a metrics file as (original line, decoded record) pairs.

  Returns:
    (records, torn): `torn` is True when an unreadable last line was dropped.

  Raises:
    MochegInputError: an unreadable line that is not the last one (real corruption, not a
      crash mid-write), naming the file and line.
  """
  with open(path, "r", encoding="utf-8", errors="replace", newline="\n") as f:
    lines = f.read().split("\n")
  # The text after the last newline is "" in a clean file, else an unterminated last line.
  while len(lines) > 1 and not lines[-1].strip("\x00 \t\r"):
    lines.pop()
  records, torn = [], False
  for number, line in enumerate(lines, start=1):
    if not line.strip():
      continue  # Blank lines carry nothing; tolerate them anywhere.
    record = _parse_line(line)
    if record is None:
      if number == len(lines):
        torn = True
        continue
      raise MochegInputError(f"{path}:{number}: not a metrics record (a JSON object with "
                             f"an integer \"step\"): {line[:200]!r}")
    records.append((line, record))
  return records, torn


def _decode(record: dict) -> dict:
  return {k: _TEXT_TO_FLOAT.get(v, v) if isinstance(v, str) else v
          for k, v in record.items()}


def read_metrics(workdir: str | os.PathLike) -> list[dict]:
  """The records of `workdir/metrics.jsonl`, in file order.

  "nan", "inf" and "-inf" are decoded back to floats. A torn last line (from a crash in
  the middle of a write) is dropped with a warning.

  Raises:
    FileNotFoundError: the workdir has no metrics file.
    MochegInputError: a line other than the last is not a metrics record.
  """
  path = os.path.join(os.fspath(workdir), METRICS_FILE)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"no metrics file: {path}")
  records, torn = _scan(path)
  if torn:
    logging.warning("%s: dropped an incomplete last line (a write was interrupted)", path)
  return [_decode(record) for _, record in records]


def _ends_with_newline(path: str) -> bool:
  """True for an empty file or one whose last byte is a newline."""
  with open(path, "rb") as f:
    f.seek(0, os.SEEK_END)
    if f.tell() == 0:
      return True
    f.seek(-1, os.SEEK_END)
    return f.read(1) == b"\n"


def _rewrite(path: str, lines: list[str]) -> None:
  """Replaces the file with `lines` atomically: a reader sees the old or the new file."""
  with files.atomic_open(path, newline="\n") as f:
    f.writelines(line + "\n" for line in lines)


class MetricWriter:
  """Writes metrics of log steps to `metrics.jsonl` and TensorBoard (process 0 only).

  Use as a context manager, or call `close()`:

    with MetricWriter(workdir, resume_step=start_step) as writer:
      writer.write(step, {"train/loss": loss, "train/lr": lr})
  """

  def __init__(self, workdir: str | os.PathLike, *, resume_step: int | None = None,
               enabled: bool | None = None, tensorboard: bool = True,
               tensorboard_flush_secs: int = 5):
    """Opens (and, on resume, truncates) the metrics of `workdir`.

    Args:
      workdir: the run's directory; created if missing.
      resume_step: the step the run restarts from. Records with a larger step are removed
        from metrics.jsonl and purged from TensorBoard. None keeps every record.
      enabled: whether this process writes; default `jax.process_index() == 0`.
      tensorboard: also write TensorBoard event files to `workdir/tensorboard/`.
      tensorboard_flush_secs: how often tensorboardX's thread flushes its event file.
    """
    self.workdir = os.fspath(workdir)
    self.path = os.path.join(self.workdir, METRICS_FILE)
    if resume_step is not None:
      resume_step = _check_step(resume_step)
    self.resume_step = resume_step
    self.enabled = (jax.process_index() == 0) if enabled is None else bool(enabled)
    self._file = None
    self._tb = None
    self._closed = False
    if not self.enabled:
      return
    os.makedirs(self.workdir, exist_ok=True)
    self._clean_existing()
    self._file = open(self.path, "a", encoding="utf-8", newline="\n")
    if tensorboard:
      # Imported here: only process 0 pays for tensorboardX (and protobuf).
      from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
      # tensorboardX names its file events.out.tfevents.<unix seconds>.<host><suffix> and
      # opens it with "wb": without a suffix, a writer reopened within the same second (a
      # quick restart, a test) would truncate the previous file. TensorBoard reads the
      # files in name order, and the purge of a resumed run only hides points read
      # before it, so the suffix is a zero-padded clock that sorts in time order.
      try:
        self._tb = SummaryWriter(
            logdir=os.path.join(self.workdir, TENSORBOARD_DIR),
            purge_step=_NO_PURGE_STEP if resume_step is None else resume_step + 1,
            flush_secs=tensorboard_flush_secs,
            filename_suffix=f".{time.time_ns():020d}")
      except BaseException:
        self._file.close()
        raise

  def _clean_existing(self) -> None:
    """Drops a torn last line and, on resume, the records after `resume_step`."""
    if not os.path.exists(self.path):
      return
    records, torn = _scan(self.path)
    if torn:
      logging.warning("%s: dropping an incomplete last line (a write was interrupted)",
                      self.path)
    kept = [line for line, record in records
            if self.resume_step is None or record["step"] <= self.resume_step]
    if len(kept) < len(records):
      logging.info("%s: resuming at step %d, removing %d records of later steps",
                   self.path, self.resume_step, len(records) - len(kept))
    # A last line without its newline would glue the next record onto itself.
    if torn or len(kept) < len(records) or not _ends_with_newline(self.path):
      _rewrite(self.path, kept)

  def write(self, step: int, metrics: Mapping[str, MetricValue]) -> None:
    """Records `metrics` at `step`: one JSON line, one TensorBoard scalar per metric.

    Raises:
      TypeError: a metric name that is not a string, or a value that is not a number.
      ValueError: the name "step", an empty name, or an array value that is not 0-d.
      RuntimeError: the writer is closed.
    """
    if self._closed:
      raise RuntimeError(f"MetricWriter for {self.workdir} is closed")
    step = _check_step(step)
    for name, value in metrics.items():
      _check_name(name)
      _check_value(name, value)
    if not self.enabled:
      return
    # Start every device-to-host copy before waiting for the first one, so the values
    # arrive in one round trip (jax.device_get would do this too, but it sorts the keys).
    for value in metrics.values():
      if isinstance(value, jax.Array):
        value.copy_to_host_async()
    values = {name: _to_python(np.asarray(value) if isinstance(value, jax.Array) else value)
              for name, value in metrics.items()}
    record = {"step": step}
    record.update({name: _encode_float(v) if isinstance(v, float) else v
                   for name, v in values.items()})
    # allow_nan=False: a non-finite float that slipped through would be invalid JSON.
    self._file.write(json.dumps(record, allow_nan=False) + "\n")
    self._file.flush()
    if self._tb is not None:
      for name, value in values.items():
        self._tb.add_scalar(name, value, global_step=step)

  def flush(self) -> None:
    """Forces metrics.jsonl to stable storage and flushes what TensorBoard has written."""
    if self._file is not None:
      self._file.flush()
      os.fsync(self._file.fileno())
    if self._tb is not None:
      self._tb.flush()

  def close(self) -> None:
    """Flushes and closes both outputs; idempotent."""
    if self._closed:
      return
    self._closed = True
    if self._file is not None:
      self.flush()
      self._file.close()
      self._file = None
    if self._tb is not None:
      self._tb.close()  # Drains tensorboardX's queue before closing the event file.
      self._tb = None

  def __enter__(self) -> "MetricWriter":
    return self

  def __exit__(self, *exc) -> None:
    self.close()
