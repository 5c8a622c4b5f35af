"""Claim verification metrics: accuracy, micro/macro F1, per-class scores, confusion matrix.

The reference code logs micro F1 (which equals accuracy when every claim has a prediction)
while the paper reports an F-score, so both micro and macro F1 are reported.

Conventions:
* Per class, precision = tp / (tp + fp) and recall = tp / (tp + fn); each is 0 when its
  denominator is 0, and F1 is 0 when precision + recall is 0. So a class with no gold
  example and no prediction scores precision = recall = F1 = 0 and still counts in the
  macro average (as scikit-learn does with `labels=range(num_classes)`, zero_division=0).
* A prediction of `NO_PREDICTION` (-1) marks a claim without a prediction: it is wrong (it
  lowers accuracy and its gold class's recall) but is no false positive for any class. It
  does not appear in the confusion matrix; `num_unpredicted` counts it. Micro F1 is
  computed from the summed tp/fp/fn, so it equals accuracy only when nothing is missing.
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from mocheg_jax.data.labels import LABEL_NAMES, UnknownLabelError, label_from_name
from mocheg_jax.metrics import keyed_csv

NO_PREDICTION = -1


def _safe_div(num: np.ndarray | float, den: np.ndarray | float) -> np.ndarray:
  num, den = np.asarray(num, np.float64), np.asarray(den, np.float64)
  return np.divide(num, den, out=np.zeros_like(num), where=den > 0)


def classification_report(gold: Sequence[int] | np.ndarray, pred: Sequence[int] | np.ndarray,
                          num_classes: int = 3,
                          names: Sequence[str] = LABEL_NAMES) -> dict:
  """Scores predicted class ids against gold class ids.

  Args:
    gold: gold class ids in [0, num_classes).
    pred: predicted class ids in [0, num_classes), or `NO_PREDICTION` for a missing one.
    num_classes: number of classes.
    names: class names, used in the per-class keys (`f1/refuted`, `precision/NEI`, ...).

  Returns:
    `accuracy`, `micro_f1`, `macro_f1`, `macro_precision`, `macro_recall`, per class
    `precision/{name}`, `recall/{name}`, `f1/{name}`, `support/{name}`, `confusion_matrix`
    (nested lists, rows gold, columns predicted), `num_examples`, `num_unpredicted`.

  Raises:
    ValueError: lengths differ, no examples, an id out of range, or wrong number of names.
  """
  gold_arr = np.asarray(gold)
  pred_arr = np.asarray(pred)
  if len(names) != num_classes:
    raise ValueError(f"{len(names)} class names given for {num_classes} classes")
  if gold_arr.ndim != 1 or pred_arr.ndim != 1:
    raise ValueError(f"gold and pred must be 1-D class ids, got shapes {gold_arr.shape} "
                     f"and {pred_arr.shape}")
  if len(gold_arr) != len(pred_arr):
    raise ValueError(f"{len(gold_arr)} gold labels but {len(pred_arr)} predictions")
  if len(gold_arr) == 0:
    raise ValueError("no examples to score")
  for what, arr, low in (("gold", gold_arr, 0), ("pred", pred_arr, NO_PREDICTION)):
    if not np.issubdtype(arr.dtype, np.integer):
      raise ValueError(f"{what} must hold integer class ids, got dtype {arr.dtype}")
    bad = (arr < low) | (arr >= num_classes)
    if bad.any():
      raise ValueError(f"{what} has class id {int(arr[bad][0])} outside "
                       f"[{low}, {num_classes})")

  predicted = pred_arr != NO_PREDICTION
  confusion = np.bincount(gold_arr[predicted] * num_classes + pred_arr[predicted],
                          minlength=num_classes * num_classes).reshape(num_classes,
                                                                       num_classes)
  tp = np.diag(confusion).astype(np.float64)
  support = np.bincount(gold_arr, minlength=num_classes).astype(np.float64)
  predicted_count = confusion.sum(axis=0).astype(np.float64)
  precision = _safe_div(tp, predicted_count)
  recall = _safe_div(tp, support)
  f1 = _safe_div(2 * precision * recall, precision + recall)

  micro_p = _safe_div(tp.sum(), predicted_count.sum())
  micro_r = _safe_div(tp.sum(), support.sum())
  report: dict = {
      "accuracy": float(tp.sum() / len(gold_arr)),
      "micro_f1": float(_safe_div(2 * micro_p * micro_r, micro_p + micro_r)),
      "macro_f1": float(f1.mean()),
      "macro_precision": float(precision.mean()),
      "macro_recall": float(recall.mean()),
  }
  for c, name in enumerate(names):
    report[f"precision/{name}"] = float(precision[c])
    report[f"recall/{name}"] = float(recall[c])
    report[f"f1/{name}"] = float(f1[c])
    report[f"support/{name}"] = int(support[c])
  report["confusion_matrix"] = confusion.tolist()
  report["num_examples"] = int(len(gold_arr))
  report["num_unpredicted"] = int((~predicted).sum())
  return report


def parse_label(text: str, names: Sequence[str] = LABEL_NAMES) -> int:
  """A class id from a name (case-insensitive) or from its id written as a number."""
  stripped = text.strip()
  if stripped.isdigit():
    label = int(stripped)
    if label >= len(names):
      raise ValueError(f"class id {label} outside [0, {len(names)})")
    return label
  if tuple(names) == LABEL_NAMES:
    try:
      return label_from_name(stripped)
    except UnknownLabelError as e:
      raise ValueError(str(e)) from None
  for i, name in enumerate(names):
    if stripped.lower() == name.lower():
      return i
  raise ValueError(f"unknown class {text!r}; expected one of {tuple(names)} or 0..{len(names) - 1}")


def read_labels_csv(path: str | os.PathLike, column: str = "label") -> dict[str, int]:
  """claim_id -> class id from a CSV with `claim_id` and `label` columns.

  Labels are class names (case-insensitive) or ids 0/1/2; other columns (such as the
  predicted probabilities `p_refuted,p_supported,p_nei`) are ignored.

  Raises:
    MochegInputError: missing file/column, duplicate claim id, or an unknown label (named
      by file and row).
  """
  return keyed_csv.read_keyed_csv(path, column, parse_label)


def evaluate_label_files(gold_path: str | os.PathLike, pred_path: str | os.PathLike,
                         allow_missing: bool = False) -> dict:
  """`classification_report` of a predictions CSV against a gold CSV, paired by claim id.

  Gold claims without a prediction are an error unless `allow_missing`, in which case they
  are scored as wrong (see `NO_PREDICTION`). Predictions for unknown claims are ignored and
  counted in `num_extra_predictions`.
  """
  paired = keyed_csv.pair_by_id(
      read_labels_csv(gold_path), read_labels_csv(pred_path), NO_PREDICTION,
      allow_missing=allow_missing, gold_name=os.fspath(gold_path),
      pred_name=os.fspath(pred_path))
  report = classification_report(paired.gold, paired.pred)
  report["num_extra_predictions"] = paired.num_extra
  return report
