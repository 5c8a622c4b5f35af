"""The retrieval stage as a system: index the KB with a trained encoder, search for claims,
write the run files and the result CSV that verification and explanation read.

scripts/index.py and scripts/search.py are thin wrappers around these functions, and the
main job calls them in-process.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable, Sequence

import numpy as np

from mocheg_jax.data.mocheg import MochegRelease
from mocheg_jax.data.report import MochegInputError
from mocheg_jax.metrics import trec
from mocheg_jax.retrieval import fusion
from mocheg_jax.retrieval import grounding as grounding_lib
from mocheg_jax.retrieval import index as index_lib
from mocheg_jax.retrieval import results as results_lib
from mocheg_jax.retrieval import search as search_lib
from mocheg_jax.train.data import prepared_data
from mocheg_jax.train.restore import Trained
from mocheg_jax.utils import paths

Run = fusion.Run  # claim id -> [(doc id, score)] best first.


def release_of(trained: Trained, release: str | None = None) -> str:
  """`release`, or the release the model was trained on."""
  return release or prepared_data(trained.config, trained.workdir, log=lambda _: None).release


def fingerprint(trained: Trained) -> dict:
  """What identifies the encoder of an index: its training run and checkpoint step."""
  return {"workdir": os.path.abspath(trained.workdir), "step": int(trained.step),
          "task": trained.config.task}


def _encoders(trained: Trained):
  encoders = trained.task.inference
  if encoders is None or not hasattr(encoders, "encode_documents"):
    raise MochegInputError(f"{trained.workdir}: its task ({trained.config.task}) is not a "
                           "retriever (it has no document encoder)")
  return encoders


@dataclasses.dataclass(frozen=True)
class Corpus:
  ids: list[str]
  items: list[str]  # Texts (text KB) or image paths (image KB).
  texts: dict[str, str]  # Text KB only: corpus_id -> sentence, for the result CSV.


def corpus(release: MochegRelease, kind: str) -> Corpus:
  """The KB side of a modality: every KB sentence, or every KB image the cleaning kept."""
  if kind == "text":
    sentences = list(release.iter_sentences())
    ids = [s.corpus_id for s in sentences]
    texts = [s.text for s in sentences]
    return Corpus(ids, texts, dict(zip(ids, texts)))
  names = release.kb_images(clean=True)
  return Corpus(names, [release.image_path(n) for n in names], {})


def build_index(trained: Trained, release_dir: str, out_dir: str, *, batch_size: int = 4096,
                shard_size: int = 65536, dtype: str = "float32",
                progress: bool = True) -> index_lib.IndexManifest:
  """Encodes the KB of the trained retriever's modality into `out_dir` (resumable)."""
  encoders = _encoders(trained)
  kb = corpus(MochegRelease(release_dir), encoders.kind)
  if not kb.ids:
    raise MochegInputError(f"{release_dir}: the KB has no {encoders.kind} items to index")

  def encode(rows: Sequence[int]) -> np.ndarray:
    return normalized(encoders.encode_documents(trained.model,
                                                 [kb.items[r] for r in rows]))

  dim = encode([0]).shape[1]
  return index_lib.encode_to_index(out_dir, kb.ids, encode, kind=encoders.kind, dim=dim,
                                   encoder=fingerprint(trained), batch_size=batch_size,
                                   shard_size=shard_size, dtype=dtype, progress=progress)


def normalized(x: np.ndarray) -> np.ndarray:
  """Rows scaled to unit L2 norm (float32), as the indexes store them."""
  x = np.asarray(x, np.float32)
  return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def open_index(trained: Trained, index_dir: str, moved: paths.Moved = None
               ) -> index_lib.EmbeddingIndex:
  """The index, checked to have been built by this very encoder and modality (`moved`: both
  lie in a folder copied from elsewhere, see EmbeddingIndex.open)."""
  encoders = _encoders(trained)
  index = index_lib.EmbeddingIndex.open(index_dir, expect_encoder=fingerprint(trained),
                                        moved=moved)
  if index.manifest.kind != encoders.kind:
    raise MochegInputError(f"{index_dir}: a {index.manifest.kind} index, but "
                           f"{trained.workdir} is a {encoders.kind} retriever")
  return index


def check_index_covers_kb(index: index_lib.EmbeddingIndex, kb: Corpus, release_dir: str
                          ) -> None:
  """An index holds exactly the release's KB items of its modality (else it was built from
  another release, or the KB changed since)."""
  ids, known = set(index.ids), set(kb.ids)
  foreign, missing = ids - known, known - ids
  if foreign or missing:
    example = sorted(foreign or missing)[0]
    raise MochegInputError(
        f"{index.dir}: the index does not match the {index.manifest.kind} KB of "
        f"{release_dir}: {len(foreign)} indexed ids are not in the KB and {len(missing)} KB "
        f"items are not indexed (e.g. {example}); was it built from another release?")


@dataclasses.dataclass(frozen=True)
class Grounding:
  """Image search grounded on text evidence (grounding.py): the images of the articles of
  each claim's top `articles` hits in `text_run` come first."""
  text_run: Run
  articles: int


def search_claims(trained: Trained, index: index_lib.EmbeddingIndex, release_dir: str,
                  split: str, k: int,
                  rerank: Callable[[list[str], Run], Run] | None = None,
                  candidates: int = 1000, ground: Grounding | None = None,
                  rerank_weight: float = 1.0) -> Run:
  """claim_id -> [(doc id, score)] best first, for every claim of `split`.

  With `rerank(claims, run)`, the dense search returns `candidates` per claim, ordered by
  its and the reranker's scores fused with `rerank_weight` (fusion.py; 1: the reranker's
  order) and cut to `k`. With `ground` (an image index only), the images of the articles
  the claim's text evidence came from are ranked first (grounding.py).
  """
  depth = max(k, candidates) if rerank is not None else k
  claims, queries, run = _dense_search(trained, index, release_dir, split, depth)
  if rerank is not None:
    run = fusion.fuse_run(run, rerank(claims, run), rerank_weight, k)
  if ground is not None and ground.articles > 0:
    run = _grounded(run, queries, index, ground, k)
  return run


def rerank_candidates(trained: Trained, index: index_lib.EmbeddingIndex, release_dir: str,
                      split: str, rerank: Callable[[list[str], Run], Run],
                      candidates: int) -> tuple[Run, Run]:
  """The bi-encoder's top `candidates` for every claim of `split` and the reranker's order
  of the same lists (uncut): the two inputs of `fusion.fuse_run`."""
  claims, _, run = _dense_search(trained, index, release_dir, split, candidates)
  return run, rerank(claims, run)


def search_grounded(trained: Trained, index: index_lib.EmbeddingIndex, release_dir: str,
                    split: str, k: int, text_run: Run, articles: Sequence[int]
                    ) -> dict[int, Run]:
  """{N: search_claims(..., ground=Grounding(text_run, N))} for every N in `articles` (0:
  not grounded), from one encoding and search of the claims."""
  _, queries, run = _dense_search(trained, index, release_dir, split, k)
  return {n: _grounded(run, queries, index, Grounding(text_run, n), k) if n > 0 else run
          for n in articles}


def _dense_search(trained: Trained, index: index_lib.EmbeddingIndex, release_dir: str,
                  split: str, depth: int) -> tuple[list[str], dict[str, np.ndarray], Run]:
  """The split's claim texts, their unit query embeddings and their top `depth` (both
  keyed by claim id, in the split's order)."""
  encoders = _encoders(trained)
  release = MochegRelease(release_dir)
  check_index_covers_kb(index, corpus(release, index.manifest.kind), release_dir)
  claims = release.claims(split)
  if not claims:
    raise MochegInputError(f"{release_dir}: split {split!r} has no claims")
  texts = [c.claim for c in claims]
  ids = [str(c.claim_id) for c in claims]
  queries = normalized(encoders.encode_queries(trained.model, texts))
  hits = search_lib.search(queries, index, depth)
  return texts, dict(zip(ids, queries)), dict(zip(ids, hits))


def _grounded(run: Run, queries: dict[str, np.ndarray], index: index_lib.EmbeddingIndex,
              ground: Grounding, k: int) -> Run:
  grounder = grounding_lib.Grounder(index)
  missing = sorted(set(queries) - set(ground.text_run), key=int)
  if missing:
    raise MochegInputError(f"claim {missing[0]}: no text evidence to ground its image search "
                           f"on (the text run lacks {len(missing)} of the claims)")
  return {claim: grounder(query, ground.text_run[claim], run[claim], ground.articles, k)
          for claim, query in queries.items()}


def load_reranker(workdir: str, kind: str, release_dir: str, moved: paths.Moved = None,
                  progress: bool = False) -> Callable[[list[str], Run], Run]:
  """`rerank(claims, run) -> run` with the cross-encoder trained in `workdir` (`moved`: see
  restore.load_trained; `progress`: print the pairs scored, with rate and ETA)."""
  if kind != "text":
    raise MochegInputError(f"a reranker reorders text evidence, but the index holds {kind}s")
  from mocheg_jax.retrieval import rerank as rerank_lib  # Only when reranking.
  reranker = rerank_lib.load_reranker(workdir, moved=moved)
  texts = corpus(MochegRelease(release_dir), "text").texts

  def rerank(claims: list[str], run: Run) -> Run:
    keys = list(run)
    candidates = [[(doc, texts[doc]) for doc, _ in run[key]] for key in keys]
    return dict(zip(keys, reranker(claims, candidates, progress=progress)))

  return rerank


def write_outputs(run: Run, kind: str, *, run_path: str | None, results_path: str | None,
                  release_dir: str, tag: str) -> None:
  """The TREC run file, and the modality's columns of the result CSV (the other modality's
  columns, if the file exists, are kept)."""
  if run_path:
    os.makedirs(os.path.dirname(os.path.abspath(run_path)), exist_ok=True)
    trec.write_run(run_path, run, tag)
  if not results_path:
    return
  existing = results_lib.read_results(results_path) if os.path.exists(results_path) else {}
  texts = corpus(MochegRelease(release_dir), "text").texts if kind == "text" else {}
  rows = []
  for claim, ranked in run.items():
    old = existing.get(int(claim)) or results_lib.RetrievedEvidence(int(claim))
    ids = tuple(d for d, _ in ranked)
    scores = tuple(float(s) for _, s in ranked)
    if kind == "text":
      rows.append(dataclasses.replace(old, text_ids=ids, texts=tuple(texts[d] for d in ids),
                                      text_scores=scores))
    else:
      rows.append(dataclasses.replace(old, images=ids, image_scores=scores))
  os.makedirs(os.path.dirname(os.path.abspath(results_path)), exist_ok=True)
  results_lib.write_results(results_path, rows)
