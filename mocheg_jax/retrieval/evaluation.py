"""Dev-set retrieval evaluators for the trainer: encode, search, score with the qrels."""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np

from mocheg_jax.metrics import retrieval as retrieval_metrics

EVAL_KS = (5, 10)


def dense_run(query_keys: Sequence[str], queries: np.ndarray, doc_ids: Sequence[str],
              docs: np.ndarray, k: int) -> dict[str, list[tuple[str, float]]]:
  """Exact top-k by cosine similarity (small corpora: the dev evaluator's candidates)."""
  from mocheg_jax.retrieval import search  # The sharded, streaming search.
  scores, rows = search.top_k(_normalized(queries), _normalized(docs), min(k, len(doc_ids)))
  return {key: [(doc_ids[int(r)], float(s)) for r, s in zip(row_ids, row_scores)]
          for key, row_ids, row_scores in zip(query_keys, rows, scores)}


def _normalized(x: np.ndarray) -> np.ndarray:
  x = np.asarray(x, np.float32)
  return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def candidate_corpus(ids: Sequence[str], qrels: Mapping[str, Mapping[str, int]],
                     max_size: int, seed: int = 0) -> list[int]:
  """Row numbers of `ids` to search on dev: every relevant item plus random distractors up
  to `max_size` (0: the whole corpus). Bounds evaluation cost on large KBs."""
  if not max_size or max_size >= len(ids):
    return list(range(len(ids)))
  relevant = {doc for judged in qrels.values() for doc, rel in judged.items() if rel > 0}
  gold = [i for i, doc in enumerate(ids) if doc in relevant]
  rest = np.setdiff1d(np.arange(len(ids)), gold)
  rng = np.random.default_rng(seed)
  extra = rng.choice(rest, size=max(0, min(len(rest), max_size - len(gold))), replace=False)
  return sorted(gold + extra.tolist())


def score(qrels: Mapping[str, Mapping[str, int]], run: Mapping[str, list]) -> dict[str, float]:
  """The figures the trainer logs: recall, NDCG and MRR at the Table 3 cut-offs."""
  m = retrieval_metrics.evaluate_run(qrels, run, ks=EVAL_KS)
  out = {f"recall@{k}": m[f"R@{k}"] for k in EVAL_KS}
  out.update({f"ndcg@{k}": m[f"NDCG@{k}"] for k in EVAL_KS})
  out["mrr@10"] = m["MRR@10"]
  return out


def retrieval_evaluator(query_keys: Sequence[str], encode_queries: Callable[[object], np.ndarray],
                        doc_ids: Sequence[str], encode_docs: Callable[[object], np.ndarray],
                        qrels: Mapping[str, Mapping[str, int]]):
  """`run(model, step)` for a Task Evaluator: encodes both sides with the current model."""

  def run(model, step: int):
    del step
    queries, docs = encode_queries(model), encode_docs(model)
    yield from score(qrels, dense_run(query_keys, queries, doc_ids, docs,
                                      max(EVAL_KS))).items()

  return run
