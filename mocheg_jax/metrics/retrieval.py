"""Evidence retrieval metrics, exactly as MOCHEG_FORMAT.md defines them.

Conventions shared by every function here:
* A document is relevant when its qrels relevancy is exactly 1 (the Mocheg qrels use 1 for
  evidence; "anything else is not"). Graded judgements such as 2 therefore do NOT count;
  this differs from trec_eval, which counts every relevancy >= 1.
* A ranked list is used in the order given (best first). A document listed twice counts
  once, at its first position; later copies are removed and the list closes up.
* Metrics are computed per query and averaged over the queries, which are the qrels topics
  with at least one relevant document. A query the run lacks scores 0 on every metric; run
  queries that are not such topics are ignored.

Per query, with R the relevant set, hits the ranks (0-based) of relevant documents:
  P@k = |hits < k| / k                    R@k = |hits < k| / |R|
  NDCG@k = sum_{r in hits, r<k} 1/log2(r+2) / sum_{i < min(k,|R|)} 1/log2(i+2)
  MAP@k (AP@k) = sum_{j-th hit at r < k} (j+1)/(r+1) / min(k, |R|)   (sentence-transformers)
  map (TREC AP) = sum_{j-th hit at r} (j+1)/(r+1) / |R|              (no cut-off)
  ndcg (TREC) = NDCG over the whole list, ideal over all |R| relevant documents
  MRR@10 = 1/(r+1) for the first hit if r < 10, else 0.
With binary relevance these equal trec_eval's P_k, recall_k, ndcg_cut_k, map, ndcg and
recip_rank (on a run cut at 10); MAP@k * min(k,|R|)/|R| equals trec_eval's map_cut_k.
"""

from __future__ import annotations

from typing import Callable, Collection, Mapping, Sequence

import numpy as np

RELEVANT = 1
MRR_CUTOFF = 10

RankedList = Sequence[str] | Sequence[tuple[str, float]]


def relevant_docs(judgements: Mapping[str, int]) -> set[str]:
  """The documents of one topic whose relevancy is exactly 1."""
  return {doc for doc, rel in judgements.items() if rel == RELEVANT}


def _doc_ids(ranked: RankedList) -> list[str]:
  """Document ids of a ranked list of ids or of (id, score) pairs."""
  return [item if isinstance(item, str) else item[0] for item in ranked]


def hit_ranks(ranked: RankedList, relevant: Collection[str]) -> list[int]:
  """0-based ranks of the relevant documents in `ranked`, duplicates removed first."""
  if not relevant:
    return []
  if not isinstance(relevant, (set, frozenset, dict)):
    relevant = set(relevant)
  # dict.fromkeys keeps the first occurrence of each document, in order.
  return [i for i, doc in enumerate(dict.fromkeys(_doc_ids(ranked))) if doc in relevant]


def _check_k(k: int) -> None:
  if not isinstance(k, (int, np.integer)) or k < 1:
    raise ValueError(f"cut-off k must be a positive integer, got {k!r}")


def _idcg(n: int) -> float:
  return float(np.sum(1.0 / np.log2(np.arange(n) + 2.0)))


def precision_at_k(ranked: RankedList, relevant: Collection[str], k: int) -> float:
  """Hits in the top k divided by k (also when fewer than k documents were retrieved)."""
  _check_k(k)
  return sum(r < k for r in hit_ranks(ranked, relevant)) / k


def recall_at_k(ranked: RankedList, relevant: Collection[str], k: int) -> float:
  """Hits in the top k divided by the number of relevant documents (0 if there are none)."""
  _check_k(k)
  if not relevant:
    return 0.0
  return sum(r < k for r in hit_ranks(ranked, relevant)) / len(set(relevant))


def ndcg_at_k(ranked: RankedList, relevant: Collection[str], k: int) -> float:
  """Binary-gain NDCG over the top k; the ideal ranks min(k, |R|) relevant documents first."""
  _check_k(k)
  if not relevant:
    return 0.0
  dcg = sum(1.0 / np.log2(r + 2.0) for r in hit_ranks(ranked, relevant) if r < k)
  return float(dcg / _idcg(min(k, len(set(relevant)))))


def average_precision_at_k(ranked: RankedList, relevant: Collection[str], k: int) -> float:
  """Sentence-transformers AP@k: precision at each hit rank < k, summed, / min(k, |R|)."""
  _check_k(k)
  if not relevant:
    return 0.0
  hits = [r for r in hit_ranks(ranked, relevant) if r < k]
  total = sum((j + 1) / (r + 1) for j, r in enumerate(hits))
  return total / min(k, len(set(relevant)))


def trec_average_precision(ranked: RankedList, relevant: Collection[str]) -> float:
  """trec_eval `map` for one query: precision at every hit rank, summed, / |R| (no cut-off)."""
  if not relevant:
    return 0.0
  hits = hit_ranks(ranked, relevant)
  return sum((j + 1) / (r + 1) for j, r in enumerate(hits)) / len(set(relevant))


def trec_ndcg(ranked: RankedList, relevant: Collection[str]) -> float:
  """trec_eval `ndcg` (binary gains): DCG of the whole list over the ideal DCG of all |R|."""
  if not relevant:
    return 0.0
  dcg = sum(1.0 / np.log2(r + 2.0) for r in hit_ranks(ranked, relevant))
  return float(dcg / _idcg(len(set(relevant))))


def reciprocal_rank_at_k(ranked: RankedList, relevant: Collection[str],
                         k: int = MRR_CUTOFF) -> float:
  """1 / (rank of the first relevant document, from 1) if it is in the top k, else 0."""
  _check_k(k)
  hits = hit_ranks(ranked, relevant)
  return 1.0 / (hits[0] + 1) if hits and hits[0] < k else 0.0


def evaluate_run(qrels: Mapping[str, Mapping[str, int]],
                 run: Mapping[str, RankedList],
                 ks: Sequence[int] = (5, 10)) -> dict[str, float]:
  """Mean retrieval metrics of a run over the qrels topics that have a relevant document.

  Args:
    qrels: topic -> document -> relevancy (as `trec.read_qrels` returns).
    run: query -> ranked documents, best first: ids or (id, score) pairs. The order given is
      the ranking; scores are not re-sorted.
    ks: cut-offs for P@k, R@k, NDCG@k and MAP@k.

  Returns:
    `P@k R@k NDCG@k MAP@k` for each k, `map`, `ndcg`, `MRR@10` (fractions in [0, 1]), and
    `num_queries` (topics scored) and `num_missing` (of those, how many the run lacks).

  Raises:
    ValueError: a cut-off is not a positive integer, or no topic has a relevant document.
  """
  for k in ks:
    _check_k(k)
  # The per-query work is only finding hit ranks (one pass over each list); all metrics are
  # then computed at once from the flat hit ranks with numpy.
  ranks: list[int] = []
  query_of_hit: list[int] = []
  num_relevant: list[int] = []
  missing = 0
  for topic, judgements in qrels.items():
    relevant = relevant_docs(judgements)
    if not relevant:
      continue
    q = len(num_relevant)
    num_relevant.append(len(relevant))
    ranked = run.get(topic)
    if ranked is None:
      missing += 1
      continue
    hits = hit_ranks(ranked, relevant)
    ranks.extend(hits)
    query_of_hit.extend([q] * len(hits))
  num_queries = len(num_relevant)
  if num_queries == 0:
    raise ValueError("no qrels topic has a relevant document (relevancy 1); nothing to score")

  r = np.asarray(ranks, dtype=np.int64)  # [H] 0-based rank of each hit, by query then rank.
  q = np.asarray(query_of_hit, dtype=np.int64)  # [H]
  n_rel = np.asarray(num_relevant, dtype=np.float64)  # [Q]
  hits_per_query = np.bincount(q, minlength=num_queries)
  starts = np.concatenate([[0], np.cumsum(hits_per_query)[:-1]])
  j = np.arange(len(r)) - starts[q]  # Index of each hit among its query's hits.
  precision_at_hit = (j + 1) / (r + 1.0)
  gain = 1.0 / np.log2(r + 2.0)
  # ideal_dcg[n] = DCG of n relevant documents ranked first.
  ideal_dcg = np.concatenate([[0.0], np.cumsum(1.0 / np.log2(np.arange(n_rel.max()) + 2.0))])

  def per_query_sum(weights: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    if mask is not None:
      return np.bincount(q[mask], weights=weights[mask], minlength=num_queries)
    return np.bincount(q, weights=weights, minlength=num_queries)

  ones = np.ones(len(r))
  result: dict[str, float] = {}
  for k in ks:
    within = r < k
    cut = np.minimum(n_rel, k)
    hits_k = per_query_sum(ones, within)
    result[f"P@{k}"] = float(np.mean(hits_k / k))
    result[f"R@{k}"] = float(np.mean(hits_k / n_rel))
    result[f"NDCG@{k}"] = float(np.mean(
        per_query_sum(gain, within) / ideal_dcg[cut.astype(np.int64)]))
    result[f"MAP@{k}"] = float(np.mean(per_query_sum(precision_at_hit, within) / cut))
  result["map"] = float(np.mean(per_query_sum(precision_at_hit) / n_rel))
  result["ndcg"] = float(np.mean(per_query_sum(gain) / ideal_dcg[n_rel.astype(np.int64)]))
  first = (j == 0) & (r < MRR_CUTOFF)
  result[f"MRR@{MRR_CUTOFF}"] = float(np.mean(per_query_sum(1.0 / (r + 1.0), first)))
  result["num_queries"] = num_queries
  result["num_missing"] = missing
  return result


def semantic_recall_precision(
    retrieved: Sequence[Sequence[str]],
    gold: Sequence[Sequence[str]],
    encode: Callable[[list[str]], np.ndarray],
) -> dict[str, float]:
  """S-Recall and S-Precision: how close retrieved evidence is in meaning to gold evidence.

  Per claim, with C the cosine matrix [retrieved, gold] of the encoded texts:
  S-Recall = mean over gold items of the max over retrieved; S-Precision = mean over
  retrieved items of the max over gold. Both are averaged over the claims.

  A claim with no retrieved item or no gold item has no cosine matrix: it is SKIPPED (not
  scored 0) and counted in `num_skipped`; `num_claims` is how many claims were averaged.
  When every claim is skipped the scores are 0.0.

  Args:
    retrieved: per claim, the retrieved evidence texts (or image ids the encoder knows).
    gold: per claim, the gold evidence texts; same number of claims as `retrieved`.
    encode: texts -> embeddings [N, D]. It is called once, on the distinct texts of the
      claims that are scored, so it should batch internally. Embeddings are L2-normalised
      here, so they need not be.

  Returns:
    `s_recall`, `s_precision` (fractions), `num_claims`, `num_skipped`.
  """
  if len(retrieved) != len(gold):
    raise ValueError(
        f"retrieved has {len(retrieved)} claims but gold has {len(gold)}; they must match")
  used = [i for i in range(len(gold)) if len(retrieved[i]) and len(gold[i])]
  result = {"s_recall": 0.0, "s_precision": 0.0, "num_claims": len(used),
            "num_skipped": len(gold) - len(used)}
  if not used:
    return result
  index: dict[str, int] = {}
  for i in used:
    for text in (*retrieved[i], *gold[i]):
      index.setdefault(text, len(index))
  texts = list(index)
  emb = np.asarray(encode(texts), dtype=np.float64)
  if emb.ndim != 2 or emb.shape[0] != len(texts):
    raise ValueError(
        f"encode returned shape {emb.shape} for {len(texts)} texts; expected [N, D]")
  emb = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
  recalls, precisions = [], []
  for i in used:
    ret = emb[[index[t] for t in retrieved[i]]]  # [n_ret, D]
    gld = emb[[index[t] for t in gold[i]]]  # [n_gold, D]
    cos = ret @ gld.T  # [n_ret, n_gold]
    recalls.append(cos.max(axis=0).mean())
    precisions.append(cos.max(axis=1).mean())
  result["s_recall"] = float(np.mean(recalls))
  result["s_precision"] = float(np.mean(precisions))
  return result
