"""The retrieval stage's choice of the text ranking the later stages read as evidence."""

import pytest

from mocheg_jax.retrieval import fusion
from mocheg_jax.retrieval import stage as retrieval_stage

BI, CROSS = retrieval_stage.BI_ENCODER, retrieval_stage.RERANKED


# Two dev claims' bi-encoder candidates (7 each) and the cross-encoder's order of them:
# the reverse, with uneven logits.
IDS = {"1": list("abcdefg"), "2": list("hijklmn")}
FIRST = {c: [(d, 1.0 - 0.1 * i) for i, d in enumerate(ids)] for c, ids in IDS.items()}
RERANKED = {c: [(d, float(i * i)) for i, d in enumerate(ids)][::-1] for c, ids in IDS.items()}


@pytest.mark.parametrize("qrels, winner", [
    ({1: {"a": 1}, 2: {"h": 1}}, BI),  # Top 1 of the bi-encoder, last of the reranker.
    ({1: {"g": 1}, 2: {"n": 1}}, CROSS),  # The other way round.
    ({3: {"a": 1}}, None),  # No judged dev claim: the paper's reranking stands, unmeasured.
])
def test_the_text_ranking_is_the_pure_order_with_the_best_dev_recall(qrels, winner):
  choice = retrieval_stage.choose_text_system(FIRST, RERANKED, qrels)
  assert choice["reranked"] is (choice["weight"] > 0)
  assert choice["system"] == retrieval_stage.text_system_name(choice["weight"])
  described = retrieval_stage.describe_choice(choice)
  assert described.startswith(choice["system"])
  if winner is None:
    assert choice["weight"] == choice["fused_weight"] == 1.0 and choice["system"] == CROSS
    assert choice["dev"] == {BI: None, CROSS: None} and "no shared dev metric" in described
    return
  assert choice["system"] == winner and choice["weight"] == (0.0 if winner == BI else 1.0)
  loser = CROSS if winner == BI else BI
  assert choice["dev"][winner] == 1.0 and choice["dev"][loser] == 0.0
  assert f"{BI} {choice['dev'][BI]:.4f}" in described
  # Every fusion weight scored; the best (ties: the larger) is Table 3's mix.
  mixes = fusion.choose_weight(FIRST, RERANKED, {str(k): v for k, v in qrels.items()})
  assert choice["dev_by_weight"] == {f"{w:.1f}": v for w, v in mixes["by_weight"].items()}
  assert choice["fused_weight"] == mixes["weight"]
  if 0.0 < mixes["weight"] < 1.0:
    assert choice["dev"][retrieval_stage.fused_name(mixes["weight"])] == 1.0


def test_the_system_may_be_a_mix_when_the_weights_allow_it():
  qrels = {1: {"a": 1}, 2: {"n": 1}}  # Each model right once: only a mix gets both.
  pure = retrieval_stage.choose_text_system(FIRST, RERANKED, qrels)
  assert pure["weight"] == 1.0 and pure["dev"][CROSS] == pure["dev"][BI] == 0.5  # A tie.
  mixed = retrieval_stage.choose_text_system(FIRST, RERANKED, qrels, weights=fusion.WEIGHTS)
  assert 0.0 < mixed["weight"] == mixed["fused_weight"] < 1.0
  assert mixed["system"] == retrieval_stage.fused_name(mixed["weight"])
  assert mixed["dev"][mixed["system"]] == 1.0 and mixed["reranked"]


def test_recall_at_5_decides_and_a_mix_is_named_with_its_weight():
  # Two claims with one relevant sentence each, at rank 6 of one model and 1-2 of the other.
  ids = [f"s{i}" for i in range(8)]
  first = {"1": [(d, 1.0 - 0.1 * i) for i, d in enumerate(ids)],
           "2": [(d, 1.0 - 0.1 * i) for i, d in enumerate(ids)]}
  logits = {"1": [7, 6, 5, 4, 3, 2, 1, 0], "2": [0, 1, 2, 3, 4, 8, 6, 5]}
  reranked = {c: sorted(zip(ids, map(float, v)), key=lambda t: -t[1]) for c, v in logits.items()}
  qrels = {1: {"s5": 1}, 2: {"s5": 1}}  # Claim 1: s5 is 6th for both; claim 2: 1st reranked.
  choice = retrieval_stage.choose_text_system(first, reranked, qrels)
  assert choice["dev"][BI] == 0.0 and choice["dev"][CROSS] == 0.5
  assert choice["weight"] == 1.0  # No mix gets claim 1's s5 into the top 5 either.
  names = {retrieval_stage.text_system_name(w) for w in fusion.WEIGHTS}
  assert len(names) == len(fusion.WEIGHTS)
  assert retrieval_stage.fused_name(0.6) == f"{CROSS} (fused, w 0.6)"


def test_the_image_ranking_is_the_one_with_the_best_dev_recall_ties_to_fewer_articles():
  qrels = {1: {"a": 1, "b": 0}, 2: {"c": 1}}
  runs = {0: {"1": [("x", 1), ("y", 1)], "2": [("c", 1)]},       # R@5 0.5
          1: {"1": [("a", 3), ("x", 1)], "2": [("c", 3)]},       # 1.0
          2: {"1": [("x", 3), ("a", 2)], "2": [("y", 3), ("c", 2)]}}  # 1.0: a tie
  choice = retrieval_stage.choose_image_system(runs, qrels)
  assert (choice["articles"], choice["best_grounded"]) == (1, 1)
  assert choice["system"] == retrieval_stage.image_system_name(1) != retrieval_stage.CLIP
  assert choice["dev"] == {retrieval_stage.CLIP: 0.5, retrieval_stage.image_system_name(1): 1.0,
                           retrieval_stage.image_system_name(2): 1.0}
  worse = {0: runs[0], 3: {"1": [("x", 1)], "2": [("y", 1)]}}
  choice = retrieval_stage.choose_image_system(worse, qrels)
  assert (choice["articles"], choice["best_grounded"]) == (0, 3)
  assert retrieval_stage.describe_choice(choice).startswith(retrieval_stage.CLIP)
