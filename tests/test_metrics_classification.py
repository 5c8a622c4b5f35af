"""Verification metrics against scikit-learn and hand computations; label CSV reading."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn import metrics as skm

from mocheg_jax.data.report import MochegInputError
from mocheg_jax.metrics import classification as cm

LABELS = [0, 1, 2]


def _check_against_sklearn(gold, pred):
  got = cm.classification_report(gold, pred)
  assert got["accuracy"] == pytest.approx(skm.accuracy_score(gold, pred))
  for average in ("micro", "macro"):
    assert got[f"{average}_f1"] == pytest.approx(
        skm.f1_score(gold, pred, labels=LABELS, average=average, zero_division=0))
  assert got["macro_precision"] == pytest.approx(
      skm.precision_score(gold, pred, labels=LABELS, average="macro", zero_division=0))
  assert got["macro_recall"] == pytest.approx(
      skm.recall_score(gold, pred, labels=LABELS, average="macro", zero_division=0))
  p, r, f, s = skm.precision_recall_fscore_support(gold, pred, labels=LABELS,
                                                   zero_division=0)
  for c, name in enumerate(cm.LABEL_NAMES):
    assert got[f"precision/{name}"] == pytest.approx(p[c])
    assert got[f"recall/{name}"] == pytest.approx(r[c])
    assert got[f"f1/{name}"] == pytest.approx(f[c])
    assert got[f"support/{name}"] == s[c]
  assert got["confusion_matrix"] == skm.confusion_matrix(gold, pred, labels=LABELS).tolist()
  return got


@pytest.mark.parametrize("seed", range(5))
def test_matches_sklearn_on_random_labels(seed):
  rng = np.random.default_rng(seed)
  n = int(rng.integers(5, 400))
  gold = rng.integers(0, 3, n)
  pred = np.where(rng.random(n) < 0.5, gold, rng.integers(0, 3, n))
  got = _check_against_sklearn(gold, pred)
  assert got["micro_f1"] == pytest.approx(got["accuracy"])
  assert got["num_examples"] == n and got["num_unpredicted"] == 0


def test_absent_class_scores_zero_and_counts_in_macro():
  gold = [0, 0, 1, 1]
  pred = [0, 1, 1, 1]  # NEI has no gold example and no prediction.
  got = _check_against_sklearn(gold, pred)
  assert got["f1/NEI"] == 0.0 and got["precision/NEI"] == 0.0 and got["recall/NEI"] == 0.0
  f1_refuted = 2 * 1.0 * 0.5 / 1.5
  f1_supported = 2 * (2 / 3) * 1.0 / (2 / 3 + 1.0)
  assert got["macro_f1"] == pytest.approx((f1_refuted + f1_supported + 0.0) / 3)
  assert got["confusion_matrix"] == [[1, 1, 0], [0, 2, 0], [0, 0, 0]]


def test_missing_predictions_are_wrong_but_no_false_positive():
  gold = [0, 1, 2, 2]
  pred = [0, 1, 2, cm.NO_PREDICTION]
  got = _check_against_sklearn(gold, pred)  # sklearn ignores the -1 label likewise.
  assert got["accuracy"] == pytest.approx(3 / 4)
  assert got["recall/NEI"] == pytest.approx(1 / 2)
  assert got["precision/NEI"] == pytest.approx(1.0)
  assert got["num_unpredicted"] == 1
  # Micro P = 3/3, R = 3/4.
  assert got["micro_f1"] == pytest.approx(2 * 1 * 0.75 / 1.75)


def test_bad_inputs():
  with pytest.raises(ValueError, match="2 gold labels but 1"):
    cm.classification_report([0, 1], [0])
  with pytest.raises(ValueError, match="outside"):
    cm.classification_report([0, 3], [0, 1])
  with pytest.raises(ValueError, match="no examples"):
    cm.classification_report([], [])
  with pytest.raises(ValueError, match="1-D"):
    cm.classification_report([0, 1], [[0.2, 0.8, 0.0], [0.1, 0.1, 0.8]])
  with pytest.raises(ValueError, match="integer"):
    cm.classification_report([0, 1], [0.0, 1.0])


def test_custom_names_and_classes():
  got = cm.classification_report([0, 1, 1], [0, 1, 0], num_classes=2, names=("neg", "pos"))
  assert got["f1/pos"] == pytest.approx(2 / 3)
  assert got["confusion_matrix"] == [[1, 0], [1, 1]]


def test_parse_label():
  assert cm.parse_label(" Refuted ") == 0
  assert cm.parse_label("SUPPORTED") == 1
  assert cm.parse_label("nei") == 2
  assert cm.parse_label("2") == 2
  with pytest.raises(ValueError, match="outside"):
    cm.parse_label("3")
  with pytest.raises(ValueError, match="unknown class"):
    cm.parse_label("mostly true")


def _write(path, text):
  path.write_text(text, encoding="utf-8")
  return path


def test_label_files_paired_by_claim_id(tmp_path):
  gold = _write(tmp_path / "gold.csv", "claim_id,label\n1,refuted\n2,supported\n3,NEI\n")
  pred = _write(tmp_path / "pred.csv",
                "claim_id,label,p_refuted,p_supported,p_nei\n"
                "3,2,0.1,0.1,0.8\n2.0,Refuted,0.5,0.4,0.1\n1,refuted,0.9,0.05,0.05\n"
                "99,NEI,0,0,1\n")
  got = cm.evaluate_label_files(gold, pred)
  assert got["accuracy"] == pytest.approx(2 / 3)
  assert got["confusion_matrix"] == [[1, 0, 0], [1, 0, 0], [0, 0, 1]]
  assert got["num_extra_predictions"] == 1


def test_label_files_errors(tmp_path):
  gold = _write(tmp_path / "gold.csv", "claim_id,label\n1,refuted\n2,supported\n3,NEI\n")
  partial = _write(tmp_path / "partial.csv", "claim_id,label\n1,refuted\n")
  with pytest.raises(MochegInputError, match=r"partial.csv: 2 of 3 claims .* 2, 3"):
    cm.evaluate_label_files(gold, partial)
  got = cm.evaluate_label_files(gold, partial, allow_missing=True)
  assert got["accuracy"] == pytest.approx(1 / 3) and got["num_unpredicted"] == 2
  dup = _write(tmp_path / "dup.csv", "claim_id,label\n1,refuted\n1,NEI\n")
  with pytest.raises(MochegInputError, match=r"dup.csv: row 2: duplicate claim_id '1'"):
    cm.read_labels_csv(dup)
  bad = _write(tmp_path / "bad.csv", "claim_id,label\n1,maybe\n")
  with pytest.raises(MochegInputError, match=r"bad.csv: row 1: bad label 'maybe'"):
    cm.read_labels_csv(bad)
  nocol = _write(tmp_path / "nocol.csv", "claim_id,verdict\n1,NEI\n")
  with pytest.raises(MochegInputError, match=r"nocol.csv: missing column\(s\) 'label'"):
    cm.read_labels_csv(nocol)
  with pytest.raises(MochegInputError, match="missing file"):
    cm.read_labels_csv(tmp_path / "nope.csv")
