"""Retrieval metrics against trec_eval (pytrec_eval), ir_measures and hand computations."""

from __future__ import annotations

import math
import time

import ir_measures
import numpy as np
import pytest
import pytrec_eval
from ir_measures import AP, P, R, RR, nDCG

from mocheg_jax.data.report import MochegInputError
from mocheg_jax.metrics import retrieval as rm
from mocheg_jax.metrics import trec

KS = (1, 5, 10, 20)


def _random_world(seed: int, num_topics: int = 150, pool: int = 60):
  """Seeded qrels and a run with distinct scores, with every awkward case present."""
  rng = np.random.default_rng(seed)
  qrels: dict[str, dict[str, int]] = {}
  run: dict[str, list[tuple[str, float]]] = {}
  for t in range(num_topics):
    topic = str(1000 + t)
    n_rel = int(rng.integers(0, 9))  # Some topics have no relevant document at all.
    n_non = int(rng.integers(0, 5))
    docs = rng.choice(pool, n_rel + n_non, replace=False)
    qrels[topic] = {f"{topic}-{d}": 1 for d in docs[:n_rel]}
    qrels[topic].update({f"{topic}-{d}": 0 for d in docs[n_rel:]})
    if t % 17 == 3:
      continue  # This topic is missing from the run.
    length = int(rng.integers(0, pool))
    candidates = rng.choice(pool, length, replace=False)
    scores = rng.permutation(length) + rng.random(length) * 0.5  # Distinct.
    order = np.argsort(-scores)
    run[topic] = [(f"{topic}-{candidates[i]}", float(scores[i])) for i in order]
  run["999999"] = [("999999-1", 1.0)]  # A run query without qrels is ignored.
  return qrels, run


def _trec_per_query(qrels, run, measures):
  evaluator = pytrec_eval.RelevanceEvaluator(qrels, measures)
  return evaluator.evaluate({q: dict(docs) for q, docs in run.items() if docs})


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_per_query_functions_match_pytrec_eval(seed):
  qrels, run = _random_world(seed)
  measures = {f"P_{k}" for k in KS} | {f"recall_{k}" for k in KS} | {
      f"ndcg_cut_{k}" for k in KS} | {f"map_cut_{k}" for k in KS} | {"map", "ndcg"}
  ref = _trec_per_query(qrels, run, measures)
  cut10 = _trec_per_query(qrels, {q: d[:10] for q, d in run.items()}, {"recip_rank"})
  checked = 0
  for topic, judgements in qrels.items():
    relevant = rm.relevant_docs(judgements)
    if not relevant or not run.get(topic):
      continue
    ranked, t = run[topic], ref[topic]
    for k in KS:
      assert rm.precision_at_k(ranked, relevant, k) == pytest.approx(t[f"P_{k}"], abs=1e-6)
      assert rm.recall_at_k(ranked, relevant, k) == pytest.approx(t[f"recall_{k}"], abs=1e-6)
      assert rm.ndcg_at_k(ranked, relevant, k) == pytest.approx(t[f"ndcg_cut_{k}"], abs=1e-6)
      ours = rm.average_precision_at_k(ranked, relevant, k)
      assert ours * min(k, len(relevant)) / len(relevant) == pytest.approx(
          t[f"map_cut_{k}"], abs=1e-6)
    assert rm.trec_average_precision(ranked, relevant) == pytest.approx(t["map"], abs=1e-6)
    assert rm.trec_ndcg(ranked, relevant) == pytest.approx(t["ndcg"], abs=1e-6)
    assert rm.reciprocal_rank_at_k(ranked, relevant, 10) == pytest.approx(
        cut10[topic]["recip_rank"], abs=1e-6)
    checked += 1
  assert checked > 100


def _mean_over_scored(qrels, per_query_value):
  topics = [t for t, j in qrels.items() if rm.relevant_docs(j)]
  return float(np.mean([per_query_value(t) for t in topics])), len(topics)


@pytest.mark.parametrize("seed", [3, 4])
def test_evaluate_run_matches_pytrec_eval_means(seed):
  qrels, run = _random_world(seed)
  measures = {f"P_{k}" for k in KS} | {f"recall_{k}" for k in KS} | {
      f"ndcg_cut_{k}" for k in KS} | {f"map_cut_{k}" for k in KS} | {"map", "ndcg"}
  ref = _trec_per_query(qrels, run, measures)
  cut10 = _trec_per_query(qrels, {q: d[:10] for q, d in run.items()}, {"recip_rank"})
  got = rm.evaluate_run(qrels, run, ks=KS)

  def trec(topic, name, table=ref):
    return table.get(topic, {}).get(name, 0.0)  # A query the run lacks scores 0.

  for k in KS:
    for ours, theirs in ((f"P@{k}", f"P_{k}"), (f"R@{k}", f"recall_{k}"),
                         (f"NDCG@{k}", f"ndcg_cut_{k}")):
      expected, n = _mean_over_scored(qrels, lambda t: trec(t, theirs))
      assert got[ours] == pytest.approx(expected, abs=1e-6), ours
    expected, _ = _mean_over_scored(qrels, lambda t: trec(t, f"map_cut_{k}") * len(
        rm.relevant_docs(qrels[t])) / min(k, len(rm.relevant_docs(qrels[t]))))
    assert got[f"MAP@{k}"] == pytest.approx(expected, abs=1e-6)
  for name in ("map", "ndcg"):
    expected, n = _mean_over_scored(qrels, lambda t: trec(t, name))
    assert got[name] == pytest.approx(expected, abs=1e-6)
  expected, n = _mean_over_scored(qrels, lambda t: trec(t, "recip_rank", cut10))
  assert got["MRR@10"] == pytest.approx(expected, abs=1e-6)
  assert got["num_queries"] == n
  assert got["num_missing"] == sum(
      1 for t, j in qrels.items() if rm.relevant_docs(j) and t not in run)
  assert got["num_missing"] > 0 and got["MRR@10"] > 0.05  # The world exercises both.


def test_evaluate_run_matches_ir_measures():
  qrels, run = _random_world(5)
  run_dict = {q: dict(d) for q, d in run.items()}
  ks = (5, 10)
  measures = [P@5, P@10, R@5, R@10, nDCG@5, nDCG@10, AP, nDCG]
  per_query: dict[tuple[str, str], float] = {}
  for m in ir_measures.iter_calc(measures, qrels, run_dict):
    per_query[(str(m.measure), m.query_id)] = m.value
  # msmarco's own MRR@10 implementation, independent of trec_eval.
  for m in ir_measures.msmarco.iter_calc([RR@10], qrels, run_dict):
    per_query[(str(m.measure), m.query_id)] = m.value
  got = rm.evaluate_run(qrels, run, ks=ks)
  names = {"P@5": "P@5", "P@10": "P@10", "R@5": "R@5", "R@10": "R@10", "NDCG@5": "nDCG@5",
           "NDCG@10": "nDCG@10", "map": "AP", "ndcg": "nDCG", "MRR@10": "RR@10"}
  for ours, theirs in names.items():
    expected, _ = _mean_over_scored(qrels, lambda t: per_query.get((theirs, t), 0.0))
    assert got[ours] == pytest.approx(expected, abs=1e-6), ours


def test_evaluate_run_equals_mean_of_per_query_functions_with_duplicates():
  # pytrec_eval cannot hold duplicates, so the dedupe rule is checked against the
  # per-query functions, which are checked against pytrec_eval above.
  qrels = {"1": {"a": 1, "b": 1, "c": 1}, "2": {"x": 1}}
  run = {"1": ["z", "a", "z", "a", "b", "y", "c"], "2": ["x", "x", "x"]}
  got = rm.evaluate_run(qrels, run, ks=(2, 3))
  for k in (2, 3):
    expected = np.mean([rm.precision_at_k(run[t], rm.relevant_docs(qrels[t]), k)
                        for t in qrels])
    assert got[f"P@{k}"] == pytest.approx(expected)
  # Deduped list 1 is z a b y c: hits at ranks 1, 2, 4 (0-based).
  assert rm.hit_ranks(run["1"], {"a", "b", "c"}) == [1, 2, 4]
  assert got["P@3"] == pytest.approx((2 / 3 + 1 / 3) / 2)


def test_hand_computed_tiny_case():
  relevant = {"a", "b", "c"}
  ranked = [("x", 0.9), ("a", 0.8), ("y", 0.7), ("b", 0.6), ("z", 0.5)]  # Hits at 1, 3.
  assert rm.precision_at_k(ranked, relevant, 5) == pytest.approx(2 / 5)
  assert rm.recall_at_k(ranked, relevant, 5) == pytest.approx(2 / 3)
  dcg = 1 / math.log2(3) + 1 / math.log2(5)
  idcg = 1 + 1 / math.log2(3) + 1 / math.log2(4)
  assert rm.ndcg_at_k(ranked, relevant, 5) == pytest.approx(dcg / idcg)
  assert rm.ndcg_at_k(ranked, relevant, 2) == pytest.approx(
      (1 / math.log2(3)) / (1 + 1 / math.log2(3)))
  ap_sum = 1 / 2 + 2 / 4
  assert rm.average_precision_at_k(ranked, relevant, 5) == pytest.approx(ap_sum / 3)
  assert rm.average_precision_at_k(ranked, relevant, 2) == pytest.approx((1 / 2) / 2)
  assert rm.trec_average_precision(ranked, relevant) == pytest.approx(ap_sum / 3)
  assert rm.trec_ndcg(ranked, relevant) == pytest.approx(dcg / idcg)
  assert rm.reciprocal_rank_at_k(ranked, relevant) == pytest.approx(1 / 2)
  assert rm.reciprocal_rank_at_k(ranked, relevant, 1) == 0.0
  # A list shorter than k still divides P@k by k.
  assert rm.precision_at_k(["a"], relevant, 10) == pytest.approx(0.1)


def test_only_relevancy_one_is_relevant_and_missing_queries_score_zero():
  qrels = {"1": {"a": 1, "b": 2, "c": 0}, "2": {"x": 1}, "3": {"q": 0, "r": -1}}
  run = {"1": ["b", "a"], "3": ["q"]}
  got = rm.evaluate_run(qrels, run, ks=(1, 2))
  assert got["num_queries"] == 2  # Topic 3 has no relevant document.
  assert got["num_missing"] == 1  # Topic 2 is not in the run.
  assert got["P@1"] == 0.0  # "b" has relevancy 2, which is not relevant.
  assert got["P@2"] == pytest.approx((1 / 2 + 0) / 2)
  assert got["R@2"] == pytest.approx((1 + 0) / 2)
  assert got["MRR@10"] == pytest.approx((1 / 2) / 2)


def test_bad_arguments():
  with pytest.raises(ValueError, match="positive integer"):
    rm.evaluate_run({"1": {"a": 1}}, {}, ks=(0,))
  with pytest.raises(ValueError, match="no qrels topic"):
    rm.evaluate_run({"1": {"a": 0}}, {"1": ["a"]})


def test_evaluate_run_speed():
  rng = np.random.default_rng(0)
  qrels, run = {}, {}
  for q in range(3000):
    qrels[str(q)] = {f"d{x}": 1 for x in rng.choice(5000, int(rng.integers(1, 6)),
                                                   replace=False)}
    docs = rng.choice(5000, 1000, replace=False)
    run[str(q)] = [(f"d{d}", float(1000 - i)) for i, d in enumerate(docs)]
  start = time.perf_counter()
  got = rm.evaluate_run(qrels, run)
  elapsed = time.perf_counter() - start
  assert got["num_queries"] == 3000
  assert elapsed < 3.0  # About 0.4 s on a 2-core CI machine; generous for noise.


class FakeEncoder:
  """Texts -> fixed vectors, counting calls and texts."""

  def __init__(self, table):
    self.table = table
    self.calls: list[list[str]] = []

  def __call__(self, texts):
    self.calls.append(list(texts))
    return np.array([self.table[t] for t in texts], dtype=np.float32)


def test_semantic_recall_precision_hand_computed():
  table = {"a": [1, 0], "b": [0, 2], "c": [1, 1], "g1": [3, 0], "g2": [0, 1]}
  enc = FakeEncoder(table)
  retrieved = [["a", "c"], ["b"], [], ["a"]]
  gold = [["g1", "g2"], ["g1"], ["g1"], []]
  got = rm.semantic_recall_precision(retrieved, gold, enc)
  s = 1 / math.sqrt(2)
  # Claim 0: C = [[1, 0], [s, s]]; recall = mean(1, s); precision = mean(1, s).
  # Claim 1: C = [[0]]; recall = 0; precision = 0.
  assert got["s_recall"] == pytest.approx(((1 + s) / 2 + 0) / 2)
  assert got["s_precision"] == pytest.approx(((1 + s) / 2 + 0) / 2)
  assert got["num_claims"] == 2 and got["num_skipped"] == 2
  assert len(enc.calls) == 1  # One batched call, each distinct text once.
  assert sorted(enc.calls[0]) == ["a", "b", "c", "g1", "g2"]


def test_semantic_recall_precision_asymmetric_and_errors():
  table = {"r1": [1, 0], "r2": [-1, 0], "g": [1, 0]}
  got = rm.semantic_recall_precision([["r1", "r2"]], [["g"]], FakeEncoder(table))
  assert got["s_recall"] == pytest.approx(1.0)  # The gold item is found.
  assert got["s_precision"] == pytest.approx(0.0)  # Half the retrieved items are opposite.
  with pytest.raises(ValueError, match="must match"):
    rm.semantic_recall_precision([["r1"]], [], FakeEncoder(table))
  with pytest.raises(ValueError, match="expected"):
    rm.semantic_recall_precision([["r1"]], [["g"]], lambda texts: np.zeros((1, 2)))
  empty = rm.semantic_recall_precision([[]], [["g"]], FakeEncoder(table))
  assert empty == {"s_recall": 0.0, "s_precision": 0.0, "num_claims": 0, "num_skipped": 1}


# ----- File formats -----

def test_csv_qrels_with_extra_column_and_commas(tmp_path):
  path = tmp_path / "img_evidence_qrels.csv"
  path.write_text(
      "\ufeffTOPIC,ITERATION,DOCUMENT#,RELEVANCY,evidence_id\n"
      "281,0,\"00281-01920-01-a,b.jpg\",1,00281-proof-11-x.jpg\n"
      "281,0,00281-01920-02-.jpg,1,00281-proof-12-y.jpg\n"
      "281,0,00281-01920-02-.jpg,0,00281-proof-13-z.jpg\n"
      "\n"
      "17,0,17-4-0,0.0,\n", encoding="utf-8")
  qrels = trec.read_qrels(path)
  assert qrels == {"281": {"00281-01920-01-a,b.jpg": 1, "00281-01920-02-.jpg": 1},
                   "17": {"17-4-0": 0}}
  blank_first = tmp_path / "blank_first.csv"
  blank_first.write_text("\n\nTOPIC,ITERATION,DOCUMENT#,RELEVANCY\n5,0,5-1-0,1\n")
  assert trec.read_qrels(blank_first) == {"5": {"5-1-0": 1}}


def test_trec_qrels_round_trip(tmp_path):
  qrels = {"1": {"1-2-0": 1, "1-2-5": 0}, "22": {"img-01.jpg": 1}}
  path = tmp_path / "q.txt"
  trec.write_qrels(path, qrels)
  assert path.read_text().splitlines()[0] == "1 0 1-2-0 1"
  assert trec.read_qrels(path) == qrels
  with pytest.raises(ValueError, match="whitespace"):
    trec.write_qrels(tmp_path / "bad.txt", {"1": {"a b.jpg": 1}})


@pytest.mark.parametrize("text,message", [
    ("TOPIC,ITERATION,DOCUMENT#,RELEVANCY\n1,0,a,1\n2,0,b\n", r"row 2 .*expected 4 fields"),
    ("TOPIC,ITERATION,DOCUMENT#,RELEVANCY\n1,0,a,yes\n", r"row 1 .*RELEVANCY 'yes'"),
    ("TOPIC,ITERATION,DOC,RELEVANCY\n1,0,a,1\n", r"lacks column\(s\) DOCUMENT#"),
    ("TOPIC,ITERATION,DOCUMENT#,RELEVANCY\n,0,a,1\n", r"row 1 .*empty TOPIC"),
    ("1 0 a 1\n1 0 b\n", r"line 2: expected 4 fields"),
    ("1 0 a 1\n1 0 b x\n", r"line 2: relevancy 'x'"),
    ("1,0,a,1\n", r"unrecognised qrels format"),
    ("\n\n", r"empty qrels file"),
])
def test_malformed_qrels_name_file_and_row(tmp_path, text, message):
  path = tmp_path / "qrels.csv"
  path.write_text(text)
  with pytest.raises(MochegInputError, match=message) as info:
    trec.read_qrels(path)
  assert str(path) in str(info.value)


def test_missing_qrels_file(tmp_path):
  with pytest.raises(MochegInputError, match="missing file"):
    trec.read_qrels(tmp_path / "nope.csv")


def test_run_round_trip_and_ordering(tmp_path):
  run = {"7": [("7-1-0", 3.25), ("7-1-1", 3.25), ("x", 1e-9)], "8": [("a", -0.1)]}
  path = tmp_path / "run.txt"
  trec.write_run(path, run, tag="bienc")
  lines = path.read_text().splitlines()
  assert lines[0] == "7 Q0 7-1-0 1 3.25 bienc"
  assert trec.read_run(path) == run
  # Reading sorts by score and breaks ties by the rank column, not by file order.
  path.write_text("q Q0 low 3 0.1 t\nq Q0 tie2 2 0.5 t\nq Q0 tie1 1 0.5 t\nq Q0 top 9 0.9 t\n")
  assert [d for d, _ in trec.read_run(path)["q"]] == ["top", "tie1", "tie2", "low"]


def test_write_run_rejects_unranked_lists(tmp_path):
  with pytest.raises(ValueError, match="best first"):
    trec.write_run(tmp_path / "r.txt", {"1": [("a", 0.1), ("b", 0.2)]}, tag="t")
  with pytest.raises(ValueError, match="whitespace"):
    trec.write_run(tmp_path / "r.txt", {"1": [("a", 0.1)]}, tag="my tag")


@pytest.mark.parametrize("text,message", [
    ("1 Q0 a 1 0.5 t\n1 Q0 b 2 0.4\n", r"line 2: expected 6 fields"),
    ("1 Q0 a one 0.5 t\n", r"line 1: rank 'one'"),
    ("1 Q0 a 1 high t\n", r"line 1: score 'high'"),
    ("1 Q0 a 1 nan t\n", r"line 1: score is NaN"),
])
def test_malformed_run_names_file_and_line(tmp_path, text, message):
  path = tmp_path / "run.txt"
  path.write_text(text)
  with pytest.raises(MochegInputError, match=message) as info:
    trec.read_run(path)
  assert str(path) in str(info.value)
