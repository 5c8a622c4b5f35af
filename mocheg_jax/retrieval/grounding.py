"""Image evidence from the articles the text evidence came from (beyond the paper).

The paper ranks every KB image by CLIP's claim-image cosine alone. But a KB image belongs to
an article (its file name is `claim-document-image-...`), the same articles the text
evidence is cut from, and an article's pictures are the ones it argues with: of the small
world's gold test images 96% lie in an article holding one of the claim's gold sentences,
among 3.7 kept images per claim in those articles, whereas the global CLIP ranking must
find them among 10,000. So, grounded on `articles` = N, the images of the articles of the
claim's top N text hits come first, ordered among themselves by the same cosine, and the
global CLIP ranking fills the remaining slots. The query never reads a claim id: the
articles are the ones the text retriever found.
"""

from __future__ import annotations

import collections
from typing import Sequence

import numpy as np

from mocheg_jax.data.images import parse_image_name
from mocheg_jax.data.report import MochegInputError
from mocheg_jax.retrieval.index import EmbeddingIndex

Article = tuple[int, int]  # (claim_id, relevant_document_id): Corpus3.csv's key.

# Added to a grounded image's cosine (in [-1, 1]) so that a run's scores alone put it
# before every other image: run files are re-sorted by score when read.
GROUNDED_BONUS = 2.0


def sentence_article(corpus_id: str) -> Article:
  """The article of a KB sentence id `claim-document-paragraph`."""
  parts = corpus_id.split("-")
  if len(parts) != 3 or not all(p.isdigit() for p in parts):
    raise MochegInputError(f"text evidence id {corpus_id!r} is not "
                           "'<claim_id>-<relevant_document_id>-<paragraph_id>'")
  return int(parts[0]), int(parts[1])


def image_article(name: str) -> Article:
  """The article of a KB image file name."""
  parsed = parse_image_name(name)
  if parsed.is_proof:
    raise MochegInputError(f"{name}: a proof image belongs to no KB article")
  return parsed.claim_id, parsed.relevant_document_id


def hit_articles(text_hits: Sequence[tuple[str, float]], articles: int) -> list[Article]:
  """The distinct articles of the best text hits, best first, at most `articles` of them."""
  found: list[Article] = []
  for corpus_id, _ in text_hits:
    if len(found) >= articles:
      break
    article = sentence_article(corpus_id)
    if article not in found:
      found.append(article)
  return found


class Grounder:
  """Grounds image searches on text evidence over one image index."""

  def __init__(self, index: EmbeddingIndex):
    if index.manifest.kind != "image":
      raise MochegInputError(f"{index.dir}: grounding on text evidence ranks images, but the "
                             f"index holds {index.manifest.kind}s")
    self.index = index
    self.rows: dict[Article, list[int]] = collections.defaultdict(list)
    for row, name in enumerate(index.ids):
      self.rows[image_article(name)].append(row)

  def rows_of(self, articles: Sequence[Article]) -> list[int]:
    return [row for a in articles for row in self.rows.get(a, ())]

  def __call__(self, query: np.ndarray, text_hits: Sequence[tuple[str, float]],
               image_hits: Sequence[tuple[str, float]], articles: int, k: int
               ) -> list[tuple[str, float]]:
    """`k` images for one claim (`query`: its unit embedding): those of the articles of its
    best `articles` text hits by cosine, with GROUNDED_BONUS added, then its global
    `image_hits` not among them, in their order."""
    rows = self.rows_of(hit_articles(text_hits, articles))
    cosines = self.index.gather(rows) @ query
    order = np.argsort(-cosines, kind="stable")[:k]
    hits = [(self.index.ids[rows[i]], float(cosines[i]) + GROUNDED_BONUS) for i in order]
    taken = {name for name, _ in hits}
    return hits + [(name, s) for name, s in image_hits if name not in taken][:k - len(hits)]
