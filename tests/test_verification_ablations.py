"""Evidence ablations: which variants apply, what each takes away, and how they are scored."""

import numpy as np
import pytest

from mocheg_jax.verification import ablations
from mocheg_jax.verification.evidence import ClaimEvidence

CLAIMS = [
    ClaimEvidence(1, "c1", 0, ("t1", "t2"), ("/i/a.jpg", "/i/b.jpg"),
                  relevant_texts=("t2",), relevant_images=("/i/b.jpg",)),
    ClaimEvidence(2, "c2", 1, ("t3",), ("/i/c.jpg",), relevant_texts=("t3",)),
    ClaimEvidence(3, "c3", 2, (), ("/i/d.jpg",)),
]


def _predict_from_counts(claims):
  """A stand-in model: refuted with more text than images, supported with more images,
  NEI when even (so every ablation moves some prediction)."""
  out = np.zeros((len(claims), 3))
  for i, c in enumerate(claims):
    out[i, 0 if len(c.texts) > len(c.images) else 1 if len(c.images) > len(c.texts) else 2] = 1
  return out


def test_applicable_ablations_follow_the_models_modalities_and_the_evidence():
  assert ablations.applicable(True, True, system=True) == list(ablations.ABLATIONS)
  assert ablations.applicable(True, True, system=False) == ["as given", "no images", "no text"]
  assert ablations.applicable(True, False, system=True) == [
      "as given", "no text", "relevant text only"]
  assert ablations.applicable(False, True, system=True) == [
      "as given", "no images", "relevant images only"]
  assert ablations.applicable(False, False, system=True) == ["as given"]


def test_each_ablation_takes_away_only_its_part():
  def apply(name):
    return [ablations.ABLATIONS[name].apply(c) for c in CLAIMS]
  assert apply("as given") == CLAIMS
  assert [(c.texts, c.images) for c in apply("no images")] == [
      (("t1", "t2"), ()), (("t3",), ()), ((), ())]
  assert [(c.texts, c.images) for c in apply("no text")] == [
      ((), ("/i/a.jpg", "/i/b.jpg")), ((), ("/i/c.jpg",)), ((), ("/i/d.jpg",))]
  assert [(c.texts, c.images) for c in apply("relevant text and images only")] == [
      (("t2",), ("/i/b.jpg",)), (("t3",), ()), ((), ())]
  assert apply("relevant images only")[0].texts == ("t1", "t2")
  assert all(a.relevant_texts == c.relevant_texts for a, c in zip(apply("no text"), CLAIMS))


def test_rows_score_each_variant_with_the_same_model():
  names = ablations.applicable(True, True, system=True)
  rows = ablations.score_ablations(_predict_from_counts, CLAIMS, names)
  assert [r["ablation"] for r in rows] == names
  by_name = {r["ablation"]: r for r in rows}
  # As given: claim 1 even (NEI, wrong), claim 2 even (NEI, wrong), claim 3 image (supported,
  # wrong). Without images: 1 and 2 refuted (1 right), 3 NEI (right).
  assert by_name["as given"]["macro_f1"] == 0.0
  assert [by_name["no images"][f"right/{n}"] for n in ("refuted", "supported", "NEI")] == [
      1, 0, 1]
  assert by_name["no images"]["claims/NEI"] == 1
  assert by_name["no images"]["confusion_matrix"] == [[1, 0, 0], [1, 0, 0], [0, 0, 1]]
  assert by_name["no images"]["macro_f1"] == pytest.approx((2 / 3 + 0 + 1) / 3)
  table = ablations.markdown(rows)
  assert table.splitlines()[0].startswith("| Evidence | Macro F1 |")
  assert "| no images | 55.56 | 66.67 | 1 / 1 | 0 / 1 | 1 / 1 |" in table
