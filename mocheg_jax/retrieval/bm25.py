"""Okapi BM25 over the knowledge-base sentences: the lexical baseline row of Table 3.

The index is a term -> postings CSR matrix held in numpy arrays (no scipy: it is not a
runtime dependency, and a per-query scatter-add over the query terms' postings is as fast
as a sparse matrix product here because a claim has only ~10 distinct content words).
Each posting stores its final BM25 weight, so a query is scored by adding a few slices of
one float array into a dense accumulator and taking the top k; no per-document Python work
happens at search time.

Scoring (Robertson's Okapi BM25 with the query-term-frequency constant k3 = 0, i.e. each
distinct query term counts once, as Lucene and Pyserini do for short queries):
  score(q, d) = sum over distinct terms t of q that occur in d of
                idf(t) * tf(t,d) * (k1 + 1) / (tf(t,d) + k1 * (1 - b + b * |d| / avgdl))
  idf(t)      = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))      (Lucene's, never negative)
with N the number of documents, |d| the number of indexed tokens of d (stop words
excluded) and avgdl their mean. Only documents sharing at least one term with the query
are returned, so a list may be shorter than k. Ties are broken by KB order (lower first),
which makes rankings deterministic.

Defaults: k1 = 1.2, b = 0.75 (Lucene's and Elasticsearch's defaults). Mocheg documents are
single sentences, in which a content word rarely occurs twice, so k1 (the tf saturation)
barely matters; 1.2 is the low end of Robertson's recommended 1.2-2.0, which suits short
documents, and matches what a reader comparing against Lucene/Pyserini BM25 expects.

Tokens: lower-cased `\\w+` runs; English stop words (the list below) are dropped by default,
which mostly saves time (their postings are the longest) and changes rankings little since
their idf is near zero.
"""

from __future__ import annotations

import collections
import itertools
import math
import re
from typing import Iterable, Sequence

import numpy as np

from mocheg_jax.utils.progress import Progress

DEFAULT_K1 = 1.2
DEFAULT_B = 0.75
TOKEN_PATTERN = re.compile(r"\w+")
# Building tokenises a whole chunk of documents joined by NUL in one regex call (several
# times faster than one call per sentence); NUL is not a word character, so it only marks
# the document boundaries.
_SEPARATOR = "\x00"
_CHUNK_PATTERN = re.compile(r"\w+|\x00")

# English function words (articles, pronouns, auxiliaries, prepositions, conjunctions).
# Kept short on purpose: negations such as "not"/"no" are NOT here, since they carry the
# meaning of a claim, and content-bearing words never are.
STOP_WORDS: frozenset[str] = frozenset("""
a about above after again against all am an and any are as at be because been before being
below between both but by can could did do does doing down during each few for from further
had has have having he her here hers herself him himself his how i if in into is it its
itself just me more most my myself of off on once only or other our ours ourselves out over
own same she should so some such than that the their theirs them themselves then there these
they this those through to too under until up very was we were what when where which while
who whom why will with would you your yours yourself yourselves
""".split())

_CHUNK_DOCS = 1 << 16  # Documents tokenised and counted at a time while building.
# A query whose postings outnumber this fraction of the corpus collects its candidates with
# one scan of the accumulator instead of per-posting reads (see `search_rows`).
_DENSE_FRACTION = 0.25


def tokenize(text: str, stop_words: frozenset[str] | None = STOP_WORDS) -> list[str]:
  """Lower-cased word tokens of `text`, stop words removed (None: keep every token)."""
  tokens = TOKEN_PATTERN.findall(text.lower())
  if stop_words:
    return [t for t in tokens if t not in stop_words]
  return tokens


class BM25:
  """An in-memory BM25 index; make one with `BM25.build`.

  Attributes:
    ids: document ids in KB order (a document's row number is its position here).
    k1, b: the BM25 parameters the weights were built with.
    stop_words: the stop words dropped from documents and queries (empty: none).
    avgdl: mean indexed document length, in tokens.
  """

  def __init__(self, ids: list[str], vocab: dict[str, int], num_stop: int,
               indptr: np.ndarray, postings: np.ndarray, weights: np.ndarray,
               doc_lengths: np.ndarray, k1: float, b: float,
               stop_words: frozenset[str]):
    self.ids = ids
    self.k1, self.b, self.stop_words = k1, b, stop_words
    self._vocab = vocab          # token -> term id; ids < num_stop are stop words.
    self._num_stop = num_stop
    self._indptr = indptr        # [V + 1] int64: term t's postings are [indptr[t], indptr[t+1]).
    self._postings = postings    # [P] int32 document rows, ascending within a term.
    self._weights = weights      # [P] float64 BM25 weight of each posting.
    self.doc_lengths = doc_lengths  # [N] int32 indexed tokens per document.
    self.avgdl = float(doc_lengths.mean()) if len(doc_lengths) else 0.0
    self._scores = np.zeros(len(ids), np.float64)  # [N] reusable accumulator, kept zeroed.

  # ---- building -----------------------------------------------------------------------
  @classmethod
  def build(cls, ids: Sequence[str], texts: Iterable[str], *, k1: float = DEFAULT_K1,
            b: float = DEFAULT_B, stop_words: bool | Iterable[str] = True,
            progress: bool = False) -> BM25:
    """Indexes `texts` (one document each) under `ids`.

    Args:
      ids: document ids (e.g. `corpus_id`s), unique.
      texts: the documents, as many as `ids`; consumed once, so a generator streaming the
        KB works.
      k1: term-frequency saturation, >= 0 (0: a document's score ignores tf).
      b: length normalisation in [0, 1].
      stop_words: True for `STOP_WORDS`, False for none, or an explicit word collection.
      progress: print progress with an ETA to stderr.

    Raises:
      ValueError: bad k1/b, duplicate ids, or a different number of ids and texts.
    """
    if not (k1 >= 0 and math.isfinite(k1)):
      raise ValueError(f"k1 must be a finite number >= 0, got {k1!r}")
    if not 0 <= b <= 1:
      raise ValueError(f"b must be in [0, 1], got {b!r}")
    ids = [str(i) for i in ids]
    if len(set(ids)) != len(ids):
      dup = next(i for i, c in collections.Counter(ids).items() if c > 1)
      raise ValueError(f"duplicate document id {dup!r}; BM25 document ids must be unique")
    n = len(ids)
    if n >= 2**31:
      raise ValueError(f"{n} documents do not fit the int32 postings")
    if stop_words is True:
      stop = STOP_WORDS
    elif stop_words is False:
      stop = frozenset()
    else:
      stop = frozenset(w.lower() for w in stop_words) - {_SEPARATOR}

    # The separator and the stop words take the first term ids, so dropping them is one
    # comparison per token.
    vocab: collections.defaultdict[str, int] = collections.defaultdict()
    vocab.default_factory = vocab.__len__  # Unseen token -> the next id, at C speed.
    vocab[_SEPARATOR] = 0
    for word in sorted(stop):
      vocab[word] = len(vocab)
    num_stop = len(vocab)

    doc_lengths = np.zeros(n, np.int32)
    terms, rows, tfs = [], [], []
    texts_iter = iter(texts)
    seen_docs = 0
    with Progress("BM25 index", total=n, unit="doc", enabled=progress) as bar:
      while True:
        batch = list(itertools.islice(texts_iter, _CHUNK_DOCS))
        if not batch:
          break
        if seen_docs + len(batch) > n:
          raise ValueError(f"more texts than ids ({n}); they must pair up one to one")
        joined = _SEPARATOR.join(batch)
        if joined.count(_SEPARATOR) != len(batch) - 1:  # A NUL inside a text: blank it.
          joined = _SEPARATOR.join(t.replace(_SEPARATOR, " ") for t in batch)
        tokens = _CHUNK_PATTERN.findall(joined.lower())
        term = np.fromiter(map(vocab.__getitem__, tokens), np.int64, len(tokens))  # [T]
        row = np.cumsum(term == 0)  # [T] the document of every token (separators: id 0)
        keep = term >= num_stop
        term, row = term[keep], row[keep]
        doc_lengths[seen_docs:seen_docs + len(batch)] = np.bincount(row, minlength=len(batch))
        # One sort of (term, row) keys gives every posting and its tf, term-major.
        keys, tf = np.unique(term * len(batch) + row, return_counts=True)
        terms.append((keys // len(batch)).astype(np.int32))
        rows.append((keys % len(batch) + seen_docs).astype(np.int32))
        tfs.append(tf.astype(np.int32))
        seen_docs += len(batch)
        bar.update(len(batch))
    if seen_docs != n:
      raise ValueError(f"{n} ids but {seen_docs} texts; they must pair up one to one")

    vocab = dict(vocab)  # Freeze: lookups at search time must not add terms.
    term = np.concatenate(terms) if terms else np.zeros(0, np.int32)
    # Stable: within a term, chunks (and rows within a chunk) are already ascending.
    order = np.argsort(term, kind="stable")
    postings = np.concatenate(rows)[order] if rows else np.zeros(0, np.int32)
    tf = (np.concatenate(tfs)[order] if tfs else np.zeros(0, np.int32)).astype(np.float64)
    df = np.bincount(term, minlength=len(vocab))  # [V]
    indptr = np.concatenate([[0], np.cumsum(df)]).astype(np.int64)
    del term, order, terms, rows, tfs

    avgdl = float(doc_lengths.mean()) if n else 0.0
    idf = np.log1p((n - df + 0.5) / (df + 0.5))  # [V]
    # Length normalisation; an all-empty corpus has no postings, so avgdl 0 never divides.
    norm = k1 * (1.0 - b + b * doc_lengths[postings] / (avgdl or 1.0))  # [P]
    weights = np.repeat(idf, df) * (tf * (k1 + 1.0)) / (tf + norm)  # [P]
    return cls(ids, vocab, num_stop, indptr, postings, weights, doc_lengths, k1, b, stop)

  # ---- properties ---------------------------------------------------------------------
  @property
  def num_docs(self) -> int:
    return len(self.ids)

  @property
  def num_terms(self) -> int:
    """Distinct indexed terms (stop words excluded)."""
    return len(self._vocab) - self._num_stop

  @property
  def num_postings(self) -> int:
    return len(self._postings)

  def query_terms(self, query: str) -> list[int]:
    """Distinct indexed term ids of `query`, in order of first appearance."""
    out: dict[int, None] = {}
    for token in TOKEN_PATTERN.findall(query.lower()):
      t = self._vocab.get(token)
      if t is not None and t >= self._num_stop and self._indptr[t + 1] > self._indptr[t]:
        out[t] = None
    return list(out)

  # ---- searching ----------------------------------------------------------------------
  def search_rows(self, query: str, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k document rows and scores for one query, best first (ties: lower row first).

    Returns:
      rows [<=k] int64 and scores [<=k] float64; only documents sharing a term with the query.
    """
    if k < 1:
      raise ValueError(f"k must be a positive integer, got {k!r}")
    acc = self._scores
    slices = []
    for t in self.query_terms(query):
      lo, hi = self._indptr[t], self._indptr[t + 1]
      docs = self._postings[lo:hi]
      acc[docs] += self._weights[lo:hi]  # A term lists each document once: no collisions.
      slices.append(docs)
    if not slices:
      return np.zeros(0, np.int64), np.zeros(0, np.float64)
    if sum(len(s) for s in slices) > _DENSE_FRACTION * len(acc):
      # Postings cover much of the corpus: one scan finds the touched documents (every
      # weight is > 0, so they are the non-zero scores) and one memset clears them.
      cand = np.flatnonzero(acc)
      scores = acc[cand]
      acc.fill(0.0)
    else:
      # Read the touched scores back term by term, zeroing as we go: a document's first
      # posting reads its total and later ones read 0. This removes duplicates without a
      # sort or a corpus scan and leaves the accumulator zeroed for the next query.
      gathered = []
      for docs in slices:
        gathered.append(acc[docs])
        acc[docs] = 0.0
      cand = np.concatenate(slices) if len(slices) > 1 else slices[0]
      scores = np.concatenate(gathered) if len(gathered) > 1 else gathered[0]
    if len(cand) > k:
      # Keep everything tied with the k-th score, so the tie-break below is by row.
      kth = np.partition(scores, len(scores) - k)[len(scores) - k]
      keep = scores >= max(kth, np.finfo(np.float64).tiny)  # Never the zeroed duplicates.
    else:
      keep = scores > 0.0
    cand, scores = cand[keep], scores[keep]
    order = np.lexsort((cand, -scores))[:k]
    return cand[order].astype(np.int64), scores[order]

  def search(self, queries: Sequence[str], k: int,
             progress: bool = False) -> list[list[tuple[str, float]]]:
    """Top-k (document id, score) lists, best first, one per query."""
    out = []
    with Progress("BM25 search", total=len(queries), unit="query",
                  enabled=progress) as bar:
      for query in queries:
        rows, scores = self.search_rows(query, k)
        out.append([(self.ids[r], float(s)) for r, s in zip(rows.tolist(), scores.tolist())])
        bar.update()
    return out

  def run(self, queries: dict[str, str], k: int,
          progress: bool = False) -> dict[str, list[tuple[str, float]]]:
    """A TREC-style run: query id -> top-k (document id, score), for `trec.write_run`."""
    keys = list(queries)
    return dict(zip(keys, self.search([queries[q] for q in keys], k, progress=progress)))
