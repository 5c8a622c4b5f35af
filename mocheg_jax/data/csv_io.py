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


def claim_rows(f, path: str, columns: Sequence[str]
               ) -> Iterator[tuple[str, int, dict[str, str]]]:
  """Yields (where, claim id, {column: raw cell}) per data row of a claim-keyed CSV that a
  tool wrote (prediction and result files: every problem is an error, nothing is skipped).

  `f` is the open file (callers word their own missing-file errors); `where` names the file
  and 1-based data row for the caller's own cell errors. Blank rows are passed over; a
  missing column, a row of the wrong width, a claim_id that is not an integer or that
  appears twice is a `MochegInputError` naming file, row and column.
  """
  reader = csv.reader(f)
  try:
    header = [h.strip() for h in next(reader)]
  except StopIteration:
    raise MochegInputError(f"{path}: empty file, expected the header "
                           f"{','.join(columns)}") from None
  except (csv.Error, UnicodeDecodeError) as e:
    raise MochegInputError(f"{path}: unreadable header: {e}") from None
  missing = [c for c in columns if c not in header]
  if missing:
    raise MochegInputError(f"{path}: header lacks column(s) {', '.join(missing)}; "
                           f"found {header}")
  index = {c: header.index(c) for c in columns}
  first_row: dict[int, int] = {}
  row_number = 0
  while True:
    row_number += 1
    where = f"{path}: row {row_number}"
    try:
      row = next(reader)
    except StopIteration:
      return
    except (csv.Error, UnicodeDecodeError) as e:
      raise MochegInputError(f"{where}: unreadable CSV: {e}") from None
    if not row or all(not v.strip() for v in row):
      continue
    if len(row) != len(header):
      raise MochegInputError(f"{where}: expected {len(header)} fields, found {len(row)}")
    cells = {c: row[i] for c, i in index.items()}
    try:
      claim_id = int(cells["claim_id"].strip())
    except ValueError:
      raise MochegInputError(f"{where}, column claim_id: {cells['claim_id']!r} is not an "
                             "integer") from None
    if claim_id in first_row:
      raise MochegInputError(f"{where}, column claim_id: claim {claim_id} already appeared "
                             f"in row {first_row[claim_id]}")
    first_row[claim_id] = row_number
    yield where, claim_id, cells
