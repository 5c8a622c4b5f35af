"""The verifier's prediction CSV: `claim_id,label,p_refuted,p_supported,p_nei`.

scripts/verify.py and the main job's verification stage write it (one row per claim, the
argmax label by name and the three class probabilities); the explanation stage and
scripts/explain.py read it back as "system labels". Reading validates every row and names
the file, the row and the column of the first problem (`MochegInputError`): the header,
integer claim ids that occur once, a known label name, and probabilities that are finite
numbers in [0, 1].
"""

from __future__ import annotations

import csv
import dataclasses
import math
import os
from typing import Iterable

import numpy as np

from mocheg_jax.data import csv_io
from mocheg_jax.data.labels import LABEL_NAMES, UnknownLabelError, label_from_name
from mocheg_jax.data.report import MochegInputError
from mocheg_jax.utils import files

COLUMNS = ("claim_id", "label", "p_refuted", "p_supported", "p_nei")
PROBABILITY_COLUMNS = COLUMNS[2:]


@dataclasses.dataclass(frozen=True)
class Prediction:
  """One claim's predicted class and its probabilities (refuted, supported, NEI)."""
  claim_id: int
  label: int
  probabilities: tuple[float, float, float]


def write_predictions(path: str, claim_ids: Iterable[int], probabilities) -> None:
  """Writes one row per claim: its argmax label's name and the three probabilities.

  The file appears whole or not at all (written beside it, then renamed).
  """
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with files.atomic_open(path, newline="") as f:
    writer = csv.writer(f)
    writer.writerow(COLUMNS)
    for claim_id, p in zip(claim_ids, probabilities):
      p = np.asarray(p)
      writer.writerow([claim_id, LABEL_NAMES[int(p.argmax())], *(f"{x:.6f}" for x in p)])


def _probability(cell: str, where: str, column: str) -> float:
  try:
    value = float(cell)
  except ValueError:
    raise MochegInputError(f"{where}, column {column}: {cell!r} is not a number") from None
  if not math.isfinite(value) or not 0.0 <= value <= 1.0:
    raise MochegInputError(f"{where}, column {column}: {cell!r} is not a probability in "
                           "[0, 1]")
  return value


def read_predictions(path: str | os.PathLike) -> dict[int, Prediction]:
  """Reads a prediction CSV; claim id -> Prediction, in file order.

  Extra columns are ignored; missing ones are an error. Blank lines are skipped.

  Raises:
    MochegInputError: a missing or empty file, a missing column, or a bad row (named by
      file, 1-based data row and column).
  """
  path_str = os.fspath(path)
  try:
    f = open(path, newline="", encoding="utf-8-sig")
  except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
    raise MochegInputError(f"{path_str}: missing verification prediction file (expected "
                           f"a CSV with columns {','.join(COLUMNS)})") from None
  out: dict[int, Prediction] = {}
  with f:
    for where, claim_id, raw in csv_io.claim_rows(f, path_str, COLUMNS):
      cells = {c: v.strip() for c, v in raw.items()}
      try:
        label = label_from_name(cells["label"])
      except UnknownLabelError:
        raise MochegInputError(f"{where}, column label: unknown label {cells['label']!r}; "
                               f"expected one of {', '.join(LABEL_NAMES)}") from None
      probabilities = tuple(_probability(cells[c], where, c) for c in PROBABILITY_COLUMNS)
      out[claim_id] = Prediction(claim_id, label, probabilities)
  return out
