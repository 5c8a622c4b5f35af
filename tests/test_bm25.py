"""BM25 against a brute-force reference written here, and on the tiny synthetic world."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from mocheg_jax.data.mocheg import MochegRelease
from mocheg_jax.data.synthetic import write_world
from mocheg_jax.metrics import retrieval as metrics
from mocheg_jax.retrieval import bm25 as bm25_lib
from mocheg_jax.retrieval.bm25 import BM25

WORDS = ("river bridge town crest exports salt copper paper silk bay harbour mill king queen "
         "blue red green triangle photo claim shared twitter 1901 99,000 café naïve").split()
STOPS = ["the", "of", "and", "a", "is", "was", "to", "in"]


def _reference(texts, queries, k1, b, stop, k):
  """Textbook Okapi BM25, one document at a time: [[(row, score)]] best first, ties by row."""
  def tokens(text):
    return [t for t in re.findall(r"\w+", text.lower()) if t not in stop]
  docs = [tokens(t) for t in texts]
  n = len(docs)
  avgdl = sum(map(len, docs)) / n
  df = {}
  for d in docs:
    for t in set(d):
      df[t] = df.get(t, 0) + 1
  out = []
  for query in queries:
    terms = list(dict.fromkeys(t for t in tokens(query) if t in df))  # distinct, in order
    scored = []
    for row, d in enumerate(docs):
      score, matched = 0.0, False
      for t in terms:
        tf = d.count(t)
        if tf:
          matched = True
          idf = math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5))
          score += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len(d) / avgdl))
      if matched:
        scored.append((row, score))
    scored.sort(key=lambda rs: (-rs[1], rs[0]))
    out.append(scored[:k])
  return out


def _corpus(seed=0, n=300):
  rng = np.random.default_rng(seed)
  texts = []
  for i in range(n):
    length = int(rng.integers(0, 25))
    words = [str(rng.choice(WORDS + STOPS)) for _ in range(length)]
    # Case and punctuation vary; the tokenizer must see through both.
    words = [w.upper() if rng.random() < 0.1 else w for w in words]
    texts.append(", ".join(words) + ("." if i % 3 else "!\n"))
  texts[5] = ""                       # an empty document
  texts[6] = "The of and a."          # only stop words
  texts[7] = texts[8]                 # an exact duplicate: a tie, broken by row
  queries = [
      "The River bridge, of the town?", "salt salt salt copper", "BLUE triangle on the crest",
      "unknownword", "the of and", "", "café naïve 99,000", "photo shared twitter 1901 king",
      " ".join(WORDS),
  ]
  return texts, queries


def _assert_same_ranking(got, want, reference_score, query):
  """The same ids in the same order, except where two documents' reference scores are equal
  to 1e-9: such ties (e.g. 3.061967794770047 vs ...468, the same sum evaluated in another
  order) may come in either order."""
  assert len(got) == len(want), query
  assert len({doc for doc, _ in got}) == len(got), query  # no document twice
  swaps = 0
  for (g, _), (w, w_score) in zip(got, want):
    if g != w:
      swaps += 1
      assert abs(reference_score[g] - w_score) < 1e-9, (query, g, w)
  assert swaps <= len(got) // 10, (query, swaps)  # ties are rare, not the rule


@pytest.mark.parametrize("candidates", ["per_posting", "corpus_scan"])
@pytest.mark.parametrize("k1,b,stop_words", [
    (1.2, 0.75, True), (1.5, 0.75, True), (1.2, 0.0, True), (0.9, 1.0, False), (0.0, 0.5, True)])
def test_matches_brute_force(k1, b, stop_words, candidates, monkeypatch):
  # Both ways of collecting a query's candidates, forced by the size threshold.
  monkeypatch.setattr(bm25_lib, "_DENSE_FRACTION",
                      math.inf if candidates == "per_posting" else 0.0)
  texts, queries = _corpus()
  ids = [f"d{i}" for i in range(len(texts))]
  index = BM25.build(ids, texts, k1=k1, b=b, stop_words=stop_words)
  stop = bm25_lib.STOP_WORDS if stop_words else frozenset()
  for k in (1, 7, 1000):
    got = index.search(queries, k)
    want = _reference(texts, queries, k1, b, stop, k)
    assert len(got) == len(queries)
    full = _reference(texts, queries, k1, b, stop, len(texts))
    for q, (g, w) in enumerate(zip(got, want)):
      np.testing.assert_allclose([s for _, s in g], [s for _, s in w], rtol=0, atol=1e-9)
      _assert_same_ranking(g, [(ids[r], s) for r, s in w],
                           {ids[r]: s for r, s in full[q]}, queries[q])
  # Sanity of the reference itself: something matched, and k=1000 returned fewer than k.
  assert 0 < len(want[0]) < 1000 and want[3] == [] and want[5] == []
  assert (want[4] == []) == stop_words  # "the of and": only stop words


def test_duplicate_documents_tie_by_kb_order():
  texts, _ = _corpus()
  ids = [f"d{i}" for i in range(len(texts))]
  index = BM25.build(ids, texts)
  query = texts[8]
  ranked = [doc for doc, _ in index.search([query], 400)[0]]
  scores = dict(index.search([query], 400)[0])
  assert scores["d7"] == scores["d8"]
  assert ranked.index("d7") < ranked.index("d8")


def test_chunked_build_equals_one_chunk(monkeypatch):
  texts, queries = _corpus(seed=1, n=200)
  texts[3] = "river\x00bridge"  # a NUL inside a text must not split the document
  ids = [str(i) for i in range(len(texts))]
  whole = BM25.build(ids, texts)
  monkeypatch.setattr(bm25_lib, "_CHUNK_DOCS", 7)
  chunked = BM25.build(ids, iter(texts))  # a generator is consumed chunk by chunk
  assert chunked.num_postings == whole.num_postings
  np.testing.assert_array_equal(chunked.doc_lengths, whole.doc_lengths)
  assert whole.doc_lengths[3] == 2
  assert chunked.search(queries, 20) == whole.search(queries, 20)


def test_run_and_bad_input():
  index = BM25.build(["a", "b", "c"], ["red bridge", "blue bridge", "red red mill"])
  run = index.run({"q1": "red", "q2": "nothing here"}, k=5)
  assert [d for d, _ in run["q1"]] == ["c", "a"] and run["q2"] == []
  assert index.num_docs == 3 and index.num_terms == 4
  with pytest.raises(ValueError, match="duplicate document id 'a'"):
    BM25.build(["a", "a"], ["x", "y"])
  with pytest.raises(ValueError, match="2 ids but 1 texts"):
    BM25.build(["a", "b"], ["x"])
  with pytest.raises(ValueError, match="more texts than ids"):
    BM25.build(["a"], ["x", "y"])
  with pytest.raises(ValueError, match="k1"):
    BM25.build(["a"], ["x"], k1=-1.0)
  with pytest.raises(ValueError, match="b must be"):
    BM25.build(["a"], ["x"], b=1.5)
  with pytest.raises(ValueError, match="k must be"):
    index.search(["red"], 0)


def test_tokenize():
  assert bm25_lib.tokenize("The Bridge's 3 ARCHES, not two!") == ["bridge", "s", "3", "arches",
                                                                  "not", "two"]
  assert bm25_lib.tokenize("The bridge", stop_words=None) == ["the", "bridge"]


def test_tiny_world_recall(tmp_path):
  write_world(tmp_path, "tiny", seed=0, workers=0, progress=False)
  release = MochegRelease(tmp_path)
  sentences = list(release.iter_sentences())
  index = BM25.build([s.corpus_id for s in sentences], [s.text for s in sentences])
  qrels, run = {}, {}
  for split in ("train", "val", "test"):
    qrels.update({str(c): d for c, d in release.text_qrels(split).items()})
    run.update(index.run({str(c.claim_id): c.claim for c in release.claims(split)}, k=10))
  m = metrics.evaluate_run(qrels, run, ks=(5, 10))
  assert m["num_queries"] > 50 and m["num_missing"] == 0
  # Word overlap finds a good share of the evidence, but far from all of it (the world is
  # built so that it does not solve retrieval).
  assert 0.1 < m["R@5"] < 0.6, m
  assert m["R@10"] > m["R@5"]
