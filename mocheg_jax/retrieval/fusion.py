"""The bi-encoder's and the cross-encoder's scores of the same candidates, fused (beyond the
paper).

The paper orders the text evidence by the cross-encoder's logit alone, which throws away
what the bi-encoder knew. The two scores live on different scales (a cosine in [-1, 1],
an unbounded logit), so each is standardised over a claim's candidates and the order is
that of `w * z(logit) + (1 - w) * z(cosine)`: w = 1 is the paper's reranked order, w = 0
the bi-encoder's own. The retrieval stage picks the best w on the dev claims
(`choose_weight`) for Table 3's fused row; the system evidence stays one of the two pure
orders (retrieval.stage.SYSTEM_WEIGHTS: the verifiers read the mixed lists worse).

On the small world (seed 0, the bi-encoder's top 100 of the whole KB, the 1,000-step
reranker): dev recall@5 0.777 bi-encoder, 0.812 reranked, 0.839 fused at w = 0.6; the test
claims at that w 0.846 against 0.837 reranked and 0.790 (README, Table 3's notes).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from mocheg_jax.metrics import retrieval as retrieval_metrics

Ranked = list[tuple[str, float]]
Run = dict[str, Ranked]
# The weights the stage tries on dev: 0 (the bi-encoder alone) to 1 (the paper's reranking).
WEIGHTS = tuple(round(0.1 * i, 1) for i in range(11))


def check_weight(weight: float) -> float:
  if not 0.0 <= weight <= 1.0:
    raise ValueError(f"fusion weight {weight!r} must be in [0, 1] (0: the bi-encoder's "
                     "order, 1: the cross-encoder's)")
  return float(weight)


def _standardised(scores: Sequence[float]) -> np.ndarray:
  x = np.asarray(scores, np.float64)
  spread = x.std()
  return (x - x.mean()) / spread if spread > 0 else np.zeros_like(x)


def fuse(first: Ranked, reranked: Ranked, weight: float, top_k: int | None = None) -> Ranked:
  """One claim's candidates in fused order, best first, cut to `top_k`.

  Args:
    first: the bi-encoder's [(document id, cosine)], best first.
    reranked: the cross-encoder's [(document id, logit)] of the same documents.
    weight: the cross-encoder's share (`check_weight`). At 1 and 0 the lists come back as
      given (with their own scores); in between, the score is the fused value and equal
      values keep the bi-encoder's order.
  """
  weight = check_weight(weight)
  if weight == 1.0:
    return list(reranked[:top_k])
  if weight == 0.0:
    return list(first[:top_k])
  ids = [doc for doc, _ in first]
  logits = dict(reranked)
  if len(logits) != len(ids) or set(logits) != set(ids):
    raise ValueError(f"the reranked list ({len(logits)} documents) is not a reordering of "
                     f"the bi-encoder's ({len(ids)})")
  fused = (weight * _standardised([logits[doc] for doc in ids])
           + (1.0 - weight) * _standardised([score for _, score in first]))
  order = np.argsort(-fused, kind="stable")[:top_k]
  return [(ids[i], float(fused[i])) for i in order]


def fuse_run(first: Run, reranked: Run, weight: float, top_k: int | None = None) -> Run:
  """`fuse` for every claim of a run (the claims of `first`, in its order)."""
  missing = next((claim for claim in first if claim not in reranked), None)
  if missing is not None:
    raise ValueError(f"claim {missing!r} has bi-encoder candidates but no reranked list")
  return {claim: fuse(ranked, reranked[claim], weight, top_k) for claim, ranked in first.items()}


def choose_weight(first: Run, reranked: Run, qrels: Mapping[str, Mapping[str, int]],
                  weights: Sequence[float] = WEIGHTS, k: int = 5) -> dict:
  """The weight whose fused order has the best recall@k over the judged claims of `first`
  (ties: the larger weight, nearer the paper's reranking).

  Returns {"weight": w, "metric": "dev/recall@k", "by_weight": {w: recall}}; without a
  judged claim (no relevant document in `qrels`) the paper's reranking: {"weight": 1.0,
  "metric": None, "by_weight": {}}.
  """
  if not weights:
    raise ValueError("no fusion weights to choose from")
  judged = {str(c): j for c, j in qrels.items()}
  if not any(rel > 0 for c in first for rel in judged.get(c, {}).values()):
    return {"weight": 1.0, "metric": None, "by_weight": {}}
  by_weight = {float(w): retrieval_metrics.evaluate_run(
      judged, fuse_run(first, reranked, w, k), ks=(k,))[f"R@{k}"] for w in weights}
  return {"weight": best_weight(by_weight), "metric": f"dev/recall@{k}",
          "by_weight": by_weight}


def best_weight(by_weight: Mapping[float, float], among: Sequence[float] | None = None
                ) -> float:
  """The weight of `by_weight` (weight -> recall) with the best recall, of those `among`
  (default: all of them); ties: the larger weight."""
  candidates = by_weight if among is None else [float(w) for w in among]
  return max(candidates, key=lambda w: (by_weight[w], w))
