"""The rows of the paper's Table 3 (evidence retrieval) for one system, and their printing.

One row per (system, modality, K) with, as fractions in [0, 1]:
  recall, precision, ndcg_at_k, map_at_k   Rec@K, Pre@K, NDCG@K and sentence-transformers
                                           MAP@K (`metrics.retrieval.evaluate_run`)
  ndcg, map                                the un-cut trec_eval forms over the whole run,
                                           which the paper's NDCG/MAP columns appear to be
  s_recall, s_precision                    S-Recall@K / S-Precision@K: the top K retrieved
                                           against all gold items, by cosine of the
                                           caller's encoder (None when none was given)
and the counts behind them: `num_scored` (claims with a relevant qrel, the mean's
denominator), `num_missing` (of those, claims the run lacks: scored 0), `num_no_qrels`
(claims without a relevant qrel: skipped from scoring and counted, as the reference does),
`num_semantic_skipped` (scored claims without an S-Recall, i.e. nothing retrieved).
"""

from __future__ import annotations

import json
import os
from typing import Callable, Collection, Iterable, Mapping, Sequence

import numpy as np

from mocheg_jax.metrics import retrieval as metrics

Run = Mapping[str, Sequence[tuple[str, float]]]
Qrels = Mapping[str, Mapping[str, int]]
Encode = Callable[[list[str]], np.ndarray]

DEFAULT_KS = (5, 10)
# Column title and row key, in the order the markdown table prints them.
TABLE_COLUMNS = (
    ("Rec@K", "recall"), ("Pre@K", "precision"), ("NDCG@K", "ndcg_at_k"),
    ("MAP@K", "map_at_k"), ("NDCG", "ndcg"), ("MAP", "map"), ("S-Rec@K", "s_recall"),
    ("S-Pre@K", "s_precision"))


class CachedEncoder:
  """Wraps an encode function so that each distinct item is encoded once across calls
  (the K=5 and K=10 rows share most of their texts)."""

  def __init__(self, encode: Encode):
    self._encode = encode
    self._rows: dict[str, np.ndarray] = {}

  def __call__(self, items: list[str]) -> np.ndarray:
    new = [t for t in dict.fromkeys(items) if t not in self._rows]
    if new:
      emb = np.asarray(self._encode(new))
      if emb.ndim != 2 or emb.shape[0] != len(new):
        raise ValueError(f"encode returned shape {emb.shape} for {len(new)} items; "
                         "expected [N, D]")
      self._rows.update(zip(new, emb))
    return np.stack([self._rows[t] for t in items])


def _relevant_topics(qrels: Qrels) -> dict[str, set[str]]:
  out = {}
  for topic, judged in qrels.items():
    relevant = metrics.relevant_docs(judged)
    if relevant:
      out[str(topic)] = relevant
  return out


def _top_k_ids(ranked: Sequence, k: int) -> list[str]:
  """The first k distinct ids, as the metrics see them (a repeated id counts once)."""
  ids = dict.fromkeys(item if isinstance(item, str) else item[0] for item in ranked)
  return list(ids)[:k]


def _lookup(ids: Iterable[str], texts: Mapping[str, str] | None, what: str,
            topic: str) -> list[str]:
  if texts is None:
    return list(ids)
  out = []
  for doc in ids:
    text = texts.get(doc)
    if text is None:
      raise ValueError(f"claim {topic}: {what} item {doc!r} has no text to encode "
                       "(not in the knowledge base given)")
    out.append(text)
  return out


def modality_rows(system: str, modality: str, run: Run, qrels: Qrels,
                  ks: Sequence[int] = DEFAULT_KS, *, encode: Encode | None = None,
                  texts: Mapping[str, str] | None = None,
                  claim_ids: Collection[str] | None = None) -> list[dict]:
  """Table 3 rows of one modality, one per K (see the module docstring for the keys).

  Args:
    system: the row's system name, e.g. "BM25" or "SBERT+rerank".
    modality: "text" or "image" (any name; it is only printed).
    run: claim id (str) -> ranked (doc id, score) pairs, best first.
    qrels: claim id (str) -> doc id -> relevancy (1 relevant).
    ks: cut-offs.
    encode: items -> embeddings [N, D] for S-Recall/S-Precision; None: not computed.
    texts: doc id -> what `encode` takes (the sentence text); None: the ids themselves
      (image file names for an image encoder).
    claim_ids: the split's claims. When given, run queries and relevant qrels topics
      outside it are an error, and claims without qrels are counted among them; when None,
      the claims are the run's queries and the qrels topics.

  Raises:
    ValueError: a bad cut-off, no claim with a relevant qrel, run or qrels ids that are
      not claims, or an item without a text for the encoder.
  """
  relevant = _relevant_topics(qrels)
  if claim_ids is not None:
    claims = {str(c) for c in claim_ids}
    for what, ids in (("run", run), ("qrels", relevant)):
      unknown = [str(q) for q in ids if str(q) not in claims]
      if unknown:
        raise ValueError(f"{modality} {what} names {len(unknown)} claim id(s) that are not "
                         f"claims of the split, e.g. {', '.join(unknown[:5])}")
  else:
    claims = {str(q) for q in run} | {str(t) for t in qrels}
  run = {str(q): ranked for q, ranked in run.items()}
  scored = {t: {d: 1 for d in docs} for t, docs in relevant.items()}
  if not scored:
    raise ValueError(f"{modality}: no claim has a relevant qrel (relevancy 1); nothing to "
                     "score")
  m = metrics.evaluate_run(scored, run, ks=ks)
  if encode is not None and not isinstance(encode, CachedEncoder):
    encode = CachedEncoder(encode)
  rows = []
  for k in ks:
    row = {
        "system": system, "modality": modality, "k": int(k),
        "recall": m[f"R@{k}"], "precision": m[f"P@{k}"], "ndcg_at_k": m[f"NDCG@{k}"],
        "map_at_k": m[f"MAP@{k}"], "ndcg": m["ndcg"], "map": m["map"],
        "s_recall": None, "s_precision": None,
        "num_scored": m["num_queries"], "num_missing": m["num_missing"],
        "num_no_qrels": len(claims - set(relevant)), "num_semantic_skipped": None,
    }
    if encode is not None:
      topics = list(relevant)
      retrieved = [_lookup(_top_k_ids(run.get(t, ()), k), texts, "retrieved", t)
                   for t in topics]
      gold = [_lookup(sorted(relevant[t]), texts, "gold", t) for t in topics]
      s = metrics.semantic_recall_precision(retrieved, gold, encode)
      row.update(s_recall=s["s_recall"], s_precision=s["s_precision"],
                 num_semantic_skipped=s["num_skipped"])
    rows.append(row)
  return rows


def table3_rows(system: str, runs: Mapping[str, Run], qrels: Mapping[str, Qrels],
                ks: Sequence[int] = DEFAULT_KS, *,
                semantic: Mapping[str, Encode] | None = None,
                texts: Mapping[str, Mapping[str, str]] | None = None,
                claim_ids: Collection[str] | None = None) -> list[dict]:
  """Table 3 rows of one system: per modality of `runs` (in its order), one row per K.

  Args:
    system: the system's name in the table.
    runs: modality ("text", "image") -> run.
    qrels: modality -> qrels; every modality of `runs` needs one.
    ks: cut-offs.
    semantic: modality -> encode function for S-Recall/S-Precision (modalities absent: none).
    texts: modality -> (doc id -> the encoder's input); a modality absent: the ids.
    claim_ids: the split's claims (see `modality_rows`).

  Raises:
    ValueError: see `modality_rows`; a run without qrels.
  """
  rows = []
  for modality, run in runs.items():
    if modality not in qrels:
      raise ValueError(f"no qrels for the {modality} run")
    rows += modality_rows(
        system, modality, run, qrels[modality], ks,
        encode=(semantic or {}).get(modality), texts=(texts or {}).get(modality),
        claim_ids=claim_ids)
  return rows


def _percent(value: float | None) -> str:
  return "-" if value is None else f"{100.0 * value:.2f}"


def format_table(rows: Sequence[Mapping]) -> str:
  """A markdown table of rows, figures in percent with 2 decimals as the paper prints them.

  NDCG and MAP are the un-cut TREC forms; `-` marks a figure that was not computed.
  """
  head = ["System", "Modality", "K", *(title for title, _ in TABLE_COLUMNS), "Scored"]
  lines = ["| " + " | ".join(head) + " |",
           "|" + "|".join(["---"] * 3 + ["---:"] * (len(head) - 3)) + "|"]
  for row in rows:
    cells = [str(row["system"]), str(row["modality"]), str(row["k"])]
    cells += [_percent(row.get(key)) for _, key in TABLE_COLUMNS]
    cells.append(str(row["num_scored"]))
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def count_lines(rows: Sequence[Mapping]) -> list[str]:
  """One line per modality on what was scored and what was skipped."""
  out, seen = [], set()
  for row in rows:
    key = (row["system"], row["modality"])
    if key in seen:
      continue
    seen.add(key)
    line = (f"{row['system']} {row['modality']}: {row['num_scored']} claims scored "
            f"({row['num_missing']} absent from the run, scored 0); {row['num_no_qrels']} "
            f"claims without relevant qrels skipped")
    if row.get("num_semantic_skipped"):
      line += f"; S-Recall skipped {row['num_semantic_skipped']} claims with nothing retrieved"
    out.append(line)
  return out


def write_rows(path: str | os.PathLike, rows: Sequence[Mapping]) -> None:
  """Writes rows as a JSON list (fractions, not percentages)."""
  os.makedirs(os.path.dirname(os.fspath(path)) or ".", exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    json.dump(list(rows), f, indent=1)
    f.write("\n")
