"""Streaming CSV reading with the checks every Mocheg file needs.

The release's CSVs are large (the sentence-level KB has ~2.8M rows, article texts are long)
so rows are streamed with the csv module, never loaded as a whole. A missing file or column
is a `MochegInputError` naming both; a malformed row is skipped and recorded in the report.
"""

from __future__ import annotations

import csv
import os
import sys
from typing import Iterator, Sequence

from mocheg_jax.data.report import MochegInputError, SkipReport

# Article texts can exceed csv's default 128 KB field limit.
csv.field_size_limit(min(sys.maxsize, 2**31 - 1))


def require_file(path: str | os.PathLike, what: str) -> None:
  if not os.path.isfile(path):
    raise MochegInputError(f"{path}: missing file ({what})")


def read_rows(path: str | os.PathLike, columns: Sequence[str], report: SkipReport,
              optional: Sequence[str] = ()) -> Iterator[tuple[int, list[str | None]]]:
  """Yields (row number, values) with one value per name in `columns` + `optional`.

  Row numbers are 1-based data rows (the header is row 0), as a spreadsheet user counts.
  Optional columns that the file lacks yield None. A row with the wrong number of fields
  is skipped and recorded in `report`.
  """
  require_file(path, "Mocheg CSV")
  with open(path, newline="", encoding="utf-8") as f:
    reader = csv.reader(f)
    try:
      header = next(reader)
    except StopIteration:
      raise MochegInputError(f"{path}: empty file, expected a header row") from None
    header = [h.strip().lstrip("\ufeff") for h in header]
    position = {name: i for i, name in enumerate(header)}
    missing = [c for c in columns if c not in position]
    if missing:
      raise MochegInputError(
          f"{path}: missing column(s) {', '.join(map(repr, missing))}; found {header}")
    indices = [position[c] for c in columns] + [position.get(c) for c in optional]
    width = len(header)
    for row_number, row in enumerate(reader, start=1):
      if len(row) != width:
        if not row:  # A blank line carries no record; nothing is lost.
          continue
        report.add(path, row_number, "wrong number of fields",
                   f"expected {width}, found {len(row)}")
        continue
      yield row_number, [row[i] if i is not None else None for i in indices]


def parse_int(value: str | None) -> int:
  """int() that also accepts '12.0' (pandas writes ids as floats after a NaN)."""
  if value is None:
    raise ValueError("missing value")
  text = value.strip()
  try:
    return int(text)
  except ValueError:
    as_float = float(text)
    if not as_float.is_integer():
      raise
    return int(as_float)
