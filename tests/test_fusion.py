"""The bi-encoder's and the cross-encoder's scores fused, and the weight chosen on dev."""

import numpy as np
import pytest

from mocheg_jax.retrieval import fusion

# One claim's bi-encoder candidates (cosines) and the cross-encoder's logits of them.
FIRST = [("a", 0.9), ("b", 0.8), ("c", 0.5), ("d", 0.1)]
RERANKED = [("c", 4.0), ("b", 1.0), ("d", 0.0), ("a", -1.0)]


def test_the_end_weights_give_the_lists_as_they_came():
  assert fusion.fuse(FIRST, RERANKED, 1.0) == RERANKED
  assert fusion.fuse(FIRST, RERANKED, 0.0, top_k=2) == FIRST[:2]


def test_a_mix_orders_by_the_weighted_standardised_scores():
  cos = np.array([0.9, 0.8, 0.5, 0.1])
  logit = np.array([-1.0, 1.0, 4.0, 0.0])  # Of a, b, c, d.
  z = lambda x: (x - x.mean()) / x.std()  # noqa: E731
  expected = 0.5 * z(logit) + 0.5 * z(cos)
  fused = fusion.fuse(FIRST, RERANKED, 0.5)
  assert [d for d, _ in fused] == [d for _, d in sorted(zip(-expected, "abcd"))]
  assert dict(fused) == pytest.approx(dict(zip("abcd", expected)))
  # The standardised logits outweigh the cosines from some weight on: c rises to the top.
  assert fusion.fuse(FIRST, RERANKED, 0.2)[0][0] == "a"
  assert fusion.fuse(FIRST, RERANKED, 0.8)[0][0] == "c"
  assert len(fusion.fuse(FIRST, RERANKED, 0.5, top_k=3)) == 3


def test_constant_scores_leave_the_other_models_order():
  flat = [(d, 2.0) for d, _ in FIRST]
  assert [d for d, _ in fusion.fuse(FIRST, flat, 0.7)] == ["a", "b", "c", "d"]
  assert [d for d, _ in fusion.fuse([(d, 0.3) for d, _ in FIRST], RERANKED, 0.3)] == [
      "c", "b", "d", "a"]


def test_mismatched_lists_and_weights_are_refused():
  with pytest.raises(ValueError, match="not a reordering"):
    fusion.fuse(FIRST, RERANKED[:3], 0.5)
  with pytest.raises(ValueError, match=r"must be in \[0, 1\]"):
    fusion.fuse(FIRST, RERANKED, 1.2)
  with pytest.raises(ValueError, match="claim 'q2' has bi-encoder candidates but no"):
    fusion.fuse_run({"q1": FIRST, "q2": FIRST}, {"q1": RERANKED}, 0.5)


def test_the_weight_with_the_best_dev_recall_is_chosen_ties_to_the_larger():
  first = {"q1": FIRST, "q2": FIRST}
  reranked = {"q1": RERANKED, "q2": RERANKED}
  # "a" relevant: only the bi-encoder's order has it in the top 1.
  chosen = fusion.choose_weight(first, reranked, {"q1": {"a": 1}, "q2": {"a": 1}}, k=1)
  assert chosen["by_weight"][0.0] == 1.0 and chosen["by_weight"][1.0] == 0.0
  assert chosen["weight"] == max(w for w, v in chosen["by_weight"].items() if v == 1.0) < 1
  assert chosen["metric"] == "dev/recall@1"
  # "c" relevant: the reranker's; every weight from where c tops the list ties, and the
  # largest (the paper's reranking) wins.
  chosen = fusion.choose_weight(first, reranked, {"q1": {"c": 1}}, k=1)
  assert chosen["weight"] == 1.0 and set(chosen["by_weight"]) == set(fusion.WEIGHTS)
  # No judged claim: the paper's reranking, unmeasured.
  assert fusion.choose_weight(first, reranked, {"q3": {"a": 1}, "q1": {"a": 0}}) == {
      "weight": 1.0, "metric": None, "by_weight": {}}
