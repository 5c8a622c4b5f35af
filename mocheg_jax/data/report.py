"""Errors for unusable input and the report of records that were skipped.

Two kinds of bad input are distinguished on purpose:
* unusable input (a missing file or column) raises `MochegInputError`, whose message names
  the file and the column, so scripts can print it and exit non-zero without a traceback;
* a bad record (a malformed row, an unknown label, an unreadable image) is skipped and
  recorded in a `SkipReport`, so nothing is ever dropped silently.
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import os
from typing import Iterable


class MochegInputError(ValueError):
  """The input cannot be used at all; the message names the file (and column or row)."""


@dataclasses.dataclass(frozen=True)
class SkippedRecord:
  file: str
  row: int | None  # 1-based data row (header excluded), None when the record is a file.
  reason: str  # A fixed phrase, so the summary can count records per reason.
  detail: str = ""  # What exactly was wrong with this record.


class SkipReport:
  """Collects skipped records with their file, row and reason."""

  def __init__(self) -> None:
    self.records: list[SkippedRecord] = []

  def add(self, file: str | os.PathLike, row: int | None, reason: str,
          detail: str = "") -> None:
    self.records.append(SkippedRecord(os.fspath(file), row, reason, detail))

  def extend(self, records: Iterable[SkippedRecord]) -> None:
    self.records.extend(records)

  def __len__(self) -> int:
    return len(self.records)

  def by_reason(self) -> dict[str, int]:
    """Counts per reason, most frequent first."""
    return dict(collections.Counter(r.reason for r in self.records).most_common())

  def summary(self) -> str:
    """One line: how many records were skipped and why."""
    if not self.records:
      return "skipped 0 records"
    reasons = "; ".join(f"{n} x {reason}" for reason, n in self.by_reason().items())
    return f"skipped {len(self.records)} records: {reasons}"

  def write_csv(self, path: str | os.PathLike) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
      writer = csv.writer(f)
      writer.writerow(["file", "row", "reason", "detail"])
      for r in self.records:
        writer.writerow([r.file, "" if r.row is None else r.row, r.reason, r.detail])
