"""Claim-verification baselines: the majority label and the average-similarity rule.

What the reference has: the VT-NLP/Mocheg code (45064e3) contains no code for either
baseline (its verification/ folder has only the neural models; no threshold search
anywhere in the repository), so the rule below is our reading of the task, not a port:

* `majority`: the most frequent training label, predicted for every claim (the paper's
  "majority" row, 33.78 F-score on test). Ties go to the smallest label id.
* `average_similarity_scores`: per claim, the mean cosine similarity between the claim's
  CLIP embedding and the CLIP embeddings of its evidence items (text and image evidence in
  CLIP's shared projection space, concatenated along the item axis by the caller). A claim
  with no evidence gets `empty_score` (0 by default).
* Two thresholds lo <= hi cut the score axis into three bands, low -> high, labelled by
  `order` (default (refuted, NEI, supported): low similarity refutes, high supports):
  score < lo -> order[0]; lo <= score < hi -> order[1]; score >= hi -> order[2].
* `fit_thresholds` grid-searches (lo, hi) on the dev split over every pair of candidate
  cuts: the midpoints between consecutive distinct dev scores plus one cut below and one
  above all of them (so a band may be empty), thinned to `max_candidates` evenly spaced
  cuts when there are more. It maximises micro F1 (= accuracy; what the reference's
  calc_metric logs, train_verify.py) or, with metric="macro_f1", macro F1. Ties go to the
  smallest lo, then the smallest hi. The search is exact over the candidates and
  vectorised with per-class prefix counts, O(K^2) for K candidates.

Labels: refuted = 0, supported = 1, NEI = 2 (mocheg_jax.data.labels).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from mocheg_jax.data.labels import NEI, NUM_CLASSES, REFUTED, SUPPORTED

DEFAULT_ORDER: tuple[int, int, int] = (REFUTED, NEI, SUPPORTED)
METRICS = ("micro_f1", "macro_f1")


def majority(train_labels: Sequence[int] | np.ndarray) -> int:
  """The most frequent label (ties: the smallest id)."""
  labels = np.asarray(train_labels).reshape(-1)
  if labels.size == 0:
    raise ValueError("majority needs at least one training label")
  if not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0:
    raise ValueError(f"labels must be non-negative integers, got dtype {labels.dtype} "
                     f"and minimum {labels.min()}")
  return int(np.bincount(labels).argmax())


def average_similarity_scores(claim_emb: np.ndarray, evidence_emb: np.ndarray,
                              evidence_mask: np.ndarray, *,
                              empty_score: float = 0.0) -> np.ndarray:
  """Mean cosine similarity between each claim and its present evidence items.

  Args:
    claim_emb: [B, D]; evidence_emb: [B, N, D]; evidence_mask: [B, N] (bool or 0/1).
    empty_score: the score of a claim with no evidence item.

  Returns:
    [B] float64 scores.
  """
  c = np.asarray(claim_emb, np.float64)
  e = np.asarray(evidence_emb, np.float64)
  m = np.asarray(evidence_mask).astype(bool)
  if c.ndim != 2 or e.ndim != 3 or m.shape != e.shape[:2] or c.shape[0] != e.shape[0] \
      or c.shape[1] != e.shape[2]:
    raise ValueError(f"expected claim [B, D], evidence [B, N, D], mask [B, N]; got "
                     f"{c.shape}, {e.shape}, {m.shape}")
  # torch.nn.functional.cosine_similarity's eps, on each norm.
  c = c / np.maximum(np.linalg.norm(c, axis=-1, keepdims=True), 1e-8)
  e = e / np.maximum(np.linalg.norm(e, axis=-1, keepdims=True), 1e-8)
  cos = np.einsum("bd,bnd->bn", c, e)
  count = m.sum(-1)
  total = np.where(m, cos, 0.0).sum(-1)
  return np.where(count > 0, total / np.maximum(count, 1), float(empty_score))


def _check_order(order: Sequence[int]) -> tuple[int, int, int]:
  order = tuple(int(o) for o in order)
  if sorted(order) != list(range(NUM_CLASSES)):
    raise ValueError(f"order must be a permutation of {tuple(range(NUM_CLASSES))}, got {order}")
  return order  # type: ignore[return-value]


def predict_thresholds(scores: np.ndarray, lo: float, hi: float,
                       order: Sequence[int] = DEFAULT_ORDER) -> np.ndarray:
  """score < lo -> order[0]; lo <= score < hi -> order[1]; score >= hi -> order[2]."""
  if lo > hi:
    raise ValueError(f"thresholds must satisfy lo <= hi, got lo={lo}, hi={hi}")
  o = _check_order(order)
  s = np.asarray(scores, np.float64)
  return np.where(s < lo, o[0], np.where(s < hi, o[1], o[2])).astype(np.int64)


def _candidate_cuts(sorted_scores: np.ndarray, max_candidates: int) -> np.ndarray:
  """Rank positions where a threshold may fall (ties never split): 0, n and every i with
  s[i-1] < s[i]; thinned evenly to at most max_candidates (keeping both ends)."""
  n = sorted_scores.size
  inner = np.nonzero(sorted_scores[1:] > sorted_scores[:-1])[0] + 1
  cuts = np.concatenate([[0], inner, [n]])
  if cuts.size > max_candidates:
    pick = np.unique(np.round(np.linspace(0, cuts.size - 1, max_candidates)).astype(int))
    cuts = cuts[pick]
  return cuts


def _cut_value(sorted_scores: np.ndarray, cut: int) -> float:
  """A threshold that puts ranks < cut below it and ranks >= cut at or above it."""
  n = sorted_scores.size
  if cut == 0:
    return float(sorted_scores[0] - 1.0)
  if cut == n:
    return float(sorted_scores[-1] + 1.0)
  return float((sorted_scores[cut - 1] + sorted_scores[cut]) / 2.0)


def fit_thresholds(scores: np.ndarray, labels: np.ndarray, *,
                   order: Sequence[int] = DEFAULT_ORDER, metric: str = "micro_f1",
                   max_candidates: int = 1000) -> tuple[float, float]:
  """Grid-search (lo, hi) on dev scores and labels; see the module docstring.

  Returns:
    (lo, hi) with lo <= hi, for `predict_thresholds` with the same `order`.
  """
  if metric not in METRICS:
    raise ValueError(f"unknown metric {metric!r}; expected one of {METRICS}")
  if max_candidates < 2:
    raise ValueError(f"max_candidates must be at least 2, got {max_candidates}")
  o = _check_order(order)
  s = np.asarray(scores, np.float64).reshape(-1)
  y = np.asarray(labels).reshape(-1)
  if s.size == 0 or s.size != y.size:
    raise ValueError(f"need as many scores as labels (and at least one): {s.size} scores, "
                     f"{y.size} labels")
  if not np.all(np.isfinite(s)):
    raise ValueError("scores contain NaN or infinity")
  if not np.isin(y, np.arange(NUM_CLASSES)).all():
    raise ValueError(f"labels must be in {tuple(range(NUM_CLASSES))}")
  rank = np.argsort(s, kind="stable")
  s, y = s[rank], y[rank].astype(np.int64)
  n = s.size
  # prefix[k, c]: how many of the k lowest scores have label c.
  prefix = np.zeros((n + 1, NUM_CLASSES), np.int64)
  prefix[1:] = np.cumsum(np.eye(NUM_CLASSES, dtype=np.int64)[y], axis=0)
  cuts = _candidate_cuts(s, max_candidates)
  at = prefix[cuts]  # [K, C]
  lo_at, hi_at = at[:, None, :], at[None, :, :]  # i (lo) on axis 0, j (hi) on axis 1
  bands = (lo_at, hi_at - lo_at, prefix[n][None, None, :] - hi_at)  # each [K, K, C]
  if metric == "micro_f1":
    value = sum(bands[b][..., o[b]] for b in range(3)) / n
  else:
    f1 = []
    for b in range(3):
      tp = bands[b][..., o[b]]
      predicted = bands[b].sum(-1)
      true = prefix[n][o[b]]
      denom = predicted + true
      f1.append(np.where(denom > 0, 2.0 * tp / np.maximum(denom, 1), 0.0))
    value = sum(f1) / 3.0
  valid = cuts[:, None] <= cuts[None, :]  # lo <= hi
  value = np.where(valid, value, -np.inf)
  i, j = np.unravel_index(int(np.argmax(value)), value.shape)  # first max: smallest lo, hi
  return _cut_value(s, int(cuts[i])), _cut_value(s, int(cuts[j]))
