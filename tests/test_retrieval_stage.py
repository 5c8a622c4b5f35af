"""The retrieval stage's choice of the text ranking the later stages read as evidence."""

import pytest

from mocheg_jax.retrieval import stage as retrieval_stage

BI, CROSS = retrieval_stage.BI_ENCODER, retrieval_stage.RERANKED


@pytest.mark.parametrize("bi, cross, reranked", [
    (("dev/recall@5", 0.85), ("dev/recall@5", 0.68), False),  # The small world's case.
    (("dev/recall@5", 0.70), ("dev/recall@5", 0.90), True),   # A pretrained cross-encoder.
    (("dev/recall@5", 0.80), ("dev/recall@5", 0.80), True),   # A tie keeps the paper's.
    (("dev/recall@5", 0.85), ("dev/ndcg@10", 0.50), True),    # Not comparable.
    (("dev/recall@5", 0.85), None, True),                     # The reranker never evaluated.
])
def test_the_reranker_is_used_unless_the_bi_encoder_did_better_on_dev(
    monkeypatch, bi, cross, reranked):
  scores = {"text_dir": bi, "rerank_dir": cross}
  monkeypatch.setattr(retrieval_stage, "best_score", scores.__getitem__)
  choice = retrieval_stage.choose_text_system("text_dir", "rerank_dir")
  assert choice["reranked"] is reranked
  assert choice["system"] == (CROSS if reranked else BI)
  assert choice["dev"] == {BI: bi and bi[1], CROSS: cross and cross[1]}
  assert choice["metric"] == (bi[0] if cross and cross[0] == bi[0] else None)
  described = retrieval_stage.describe_choice(choice)
  assert described.startswith(choice["system"]) and f"{BI} {bi[1]:.4f}" in described


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
