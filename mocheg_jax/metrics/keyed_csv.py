"""Per-claim CSV files (gold and predicted labels or explanations) and pairing them by id.

Evaluation files hold one row per claim, keyed by `claim_id`. Two rules keep scores honest:
a claim id that appears twice in a file is an error (which row would count?), and gold
claims without a prediction are an error unless the caller allows them explicitly, in which
case they are counted and scored as wrong (or empty).
"""

from __future__ import annotations

import csv
import dataclasses
import os
import re
import sys
from typing import Callable, Generic, Mapping, Sequence, TypeVar

from mocheg_jax.data.report import MochegInputError

T = TypeVar("T")

# Explanations can be long; csv's default 128 KB field limit is too small for some articles.
csv.field_size_limit(min(sys.maxsize, 2**31 - 1))

_INTEGER_FLOAT = re.compile(r"^(-?\d+)\.0*$")
MAX_IDS_IN_MESSAGE = 5


def normalize_claim_id(raw: str) -> str:
  """Strips spaces and turns pandas' float ids ('12.0') back into '12'."""
  text = raw.strip()
  match = _INTEGER_FLOAT.match(text)
  return match.group(1) if match else text


def read_keyed_csv(path: str | os.PathLike, value_column: str,
                   parse: Callable[[str], T], key_column: str = "claim_id") -> dict[str, T]:
  """Reads `key_column` -> parse(`value_column`) from a CSV with a header row.

  Other columns (e.g. class probabilities) are ignored. Row numbers in messages are 1-based
  data rows (the header is row 0).

  Raises:
    MochegInputError: missing file or column, a row with the wrong number of fields, an
      empty id, a duplicate id, or a value that `parse` rejects (its ValueError message is
      kept).
  """
  path_str = os.fspath(path)
  try:
    f = open(path, newline="", encoding="utf-8-sig")
  except (FileNotFoundError, IsADirectoryError):
    raise MochegInputError(f"{path_str}: missing file") from None
  with f:
    reader = csv.reader(f)
    header = next(reader, None)
    if header is None:
      raise MochegInputError(f"{path_str}: empty file, expected a header row")
    header = [h.strip() for h in header]
    missing = [c for c in (key_column, value_column) if c not in header]
    if missing:
      raise MochegInputError(
          f"{path_str}: missing column(s) {', '.join(map(repr, missing))}; found {header}")
    i_key, i_value = header.index(key_column), header.index(value_column)
    values: dict[str, T] = {}
    for row_number, row in enumerate(reader, start=1):
      if not row:
        continue  # A blank line.
      where = f"{path_str}: row {row_number}"
      if len(row) != len(header):
        raise MochegInputError(f"{where}: expected {len(header)} fields, found {len(row)}")
      key = normalize_claim_id(row[i_key])
      if not key:
        raise MochegInputError(f"{where}: empty {key_column}")
      if key in values:
        raise MochegInputError(f"{where}: duplicate {key_column} {key!r}")
      try:
        values[key] = parse(row[i_value])
      except ValueError as e:
        raise MochegInputError(f"{where}: bad {value_column} {row[i_value]!r}: {e}") from None
  return values


def _some(ids: Sequence[str]) -> str:
  shown = ", ".join(ids[:MAX_IDS_IN_MESSAGE])
  return shown + (", ..." if len(ids) > MAX_IDS_IN_MESSAGE else "")


@dataclasses.dataclass
class Paired(Generic[T]):
  """Gold and predicted values in gold order, with what did not pair up."""
  ids: list[str]
  gold: list[T]
  pred: list[T]
  num_missing: int  # Gold claims without a prediction (filled with the `fill` value).
  num_extra: int  # Predictions for claims the gold file does not have (ignored).


def pair_by_id(gold: Mapping[str, T], pred: Mapping[str, T], fill: T, *,
               allow_missing: bool = False, gold_name: str = "gold",
               pred_name: str = "predictions") -> Paired[T]:
  """Pairs gold and predicted values by claim id, in gold order.

  Args:
    gold: claim id -> gold value.
    pred: claim id -> predicted value.
    fill: the prediction used for a gold claim without one, when allowed.
    allow_missing: if False, a gold claim without a prediction is an error.
    gold_name, pred_name: how to name the two sources (usually file paths) in messages.

  Raises:
    MochegInputError: gold is empty, or predictions are missing and not allowed.
  """
  if not gold:
    raise MochegInputError(f"{gold_name}: no claims to score")
  missing = [i for i in gold if i not in pred]
  if missing and not allow_missing:
    raise MochegInputError(
        f"{pred_name}: {len(missing)} of {len(gold)} claims in {gold_name} have no "
        f"prediction (e.g. claim_id {_some(missing)}); allow missing predictions to score "
        f"them as wrong")
  ids = list(gold)
  return Paired(ids=ids, gold=[gold[i] for i in ids], pred=[pred.get(i, fill) for i in ids],
                num_missing=len(missing), num_extra=sum(1 for i in pred if i not in gold))
