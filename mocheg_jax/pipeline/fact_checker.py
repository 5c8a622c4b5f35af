"""Fact-checking claims end to end with a trained pipeline folder.

  checker = FactChecker.load("runs/small")
  result = checker.check("The Flag of Varn is red.")   # a `FactCheck`
  print(result.to_json())

For each claim, in one batch per step:
1. text evidence: the text retriever's bi-encoder searches the KB index for
   `text_candidates` sentences, the cross-encoder scores them, and the best `text_top_k`
   by the two scores fused with `settings.rerank_weight` are kept (retrieval/fusion.py;
   the weight the main job chose on dev: at 1 the paper's reranked order, Table 3's
   "SBERT + rerank" row; at 0 the bi-encoder's alone, and the cross-encoder is not run);
2. image evidence: the image retriever (CLIP) searches the KB images, those of the
   articles of the best `image_articles` text hits first when the main job found that
   better on dev (retrieval/grounding.py); an image given with the claim is scored by the
   same CLIP and put first (it is the claim's own picture);
3. verification: the stance model reads the best `verifier_texts` sentences and
   `verifier_images` images (the claim's image first), as the main job's system setting;
4. explanation: the generator writes a ruling for the predicted label from the best
   `generator_texts` sentences (beam search, its config's decoding settings).

Every model runs through its stage's own inference code (the same functions the main job
scores), so what `check` returns for a test claim is what the tables measured. Batches are
padded to fixed shapes (the encoders' length and batch buckets, the verifier's and the
generator's evaluation batch), so `check_many` compiles once per shape bucket and a
second call of any size reuses the programs.

The folder may have been moved or copied since the main job wrote it: what it saved about
itself is read relative to where it is now (`Manifest.moved`).

Bad input is refused before any model runs: an empty or over-long claim, an image that is
missing or does not decode (each named by its position). Single-process: the checker runs on
the local devices of one host.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import weakref
from typing import Callable, Sequence

import jax
import numpy as np

from mocheg_jax.data.labels import LABEL_NAMES
from mocheg_jax.data.mocheg import Claim, MochegRelease
from mocheg_jax.data.report import MochegInputError
from mocheg_jax.explanation import stage as explanation_stage
from mocheg_jax.models import encoding
from mocheg_jax.pipeline import manifest as manifest_lib
from mocheg_jax.retrieval import fusion
from mocheg_jax.retrieval import grounding
from mocheg_jax.retrieval import rerank as rerank_lib
from mocheg_jax.retrieval import search as search_lib
from mocheg_jax.retrieval import system
from mocheg_jax.train.restore import load_trained
from mocheg_jax.verification import evidence as evidence_lib

# Longer than any claim of the release (its longest is a few hundred characters); a
# pasted article is refused rather than silently cut by every encoder.
MAX_CLAIM_CHARS = 2000
_PLACEHOLDER_LABEL = 0  # ClaimEvidence needs a label; prediction never reads it.


@dataclasses.dataclass(frozen=True)
class TextEvidence:
  id: str  # The KB sentence's corpus id.
  text: str
  score: float  # The cross-encoder's score.


@dataclasses.dataclass(frozen=True)
class ImageEvidence:
  file: str  # A KB image's file name, or the path of the image given with the claim.
  # CLIP cosine between the claim and the image (+ grounding.GROUNDED_BONUS for an image
  # of a text evidence's article).
  score: float


@dataclasses.dataclass(frozen=True)
class FactCheck:
  """One claim's result; `to_json()` is the fact_check script's output object."""
  claim: str
  text_evidence: tuple[TextEvidence, ...]
  image_evidence: tuple[ImageEvidence, ...]
  label: str  # "refuted", "supported" or "NEI".
  probabilities: dict[str, float]  # Per label name, summing to 1.
  explanation: str

  def to_json(self) -> dict:
    return {"claim": self.claim,
            "text_evidence": [dataclasses.asdict(e) for e in self.text_evidence],
            "image_evidence": [dataclasses.asdict(e) for e in self.image_evidence],
            "label": self.label, "probabilities": dict(self.probabilities),
            "explanation": self.explanation}


def check_claims(claims: Sequence[str], images: Sequence[str | None] | None = None,
                 image_size: int = 32) -> tuple[list[str], list[str | None]]:
  """The claims stripped and the images as absolute paths, or an error naming the first
  bad one: an empty or over-long claim, a missing or undecodable image."""
  if isinstance(claims, str):
    raise TypeError("check_many takes a list of claims; use check for one")
  claims = list(claims)
  images = [None] * len(claims) if images is None else list(images)
  if len(images) != len(claims):
    raise ValueError(f"{len(claims)} claims but {len(images)} images")
  out = []
  for i, claim in enumerate(claims):
    if not isinstance(claim, str):
      raise MochegInputError(f"claim {i}: a {type(claim).__name__}, not a string")
    text = " ".join(claim.split())
    if not text:
      raise MochegInputError(f"claim {i}: empty")
    if len(text) > MAX_CLAIM_CHARS:
      raise MochegInputError(f"claim {i}: {len(text):,} characters; a claim is a statement "
                             f"of at most {MAX_CLAIM_CHARS:,}")
    out.append(text)
  paths = []
  for i, image in enumerate(images):
    if image is None or image == "":
      paths.append(None)
      continue
    encoding.read_image(image, image_size, where=f"claim {i}")  # Decodes, or names it.
    paths.append(os.path.abspath(os.fspath(image)))
  return out, paths


class FactChecker:
  """A loaded pipeline: `check(claim, image=None)` and `check_many(claims, images=None)`.

  Build it with `FactChecker.load(PIPELINE_DIR)`. The verifier encodes each new claim's
  token states into a private feature store (a temporary folder unless `cache_dir` is
  given), removed when the checker is closed or collected.
  """

  def __init__(self, manifest: manifest_lib.Manifest, *, cache_dir: str | None = None,
               log: Callable[[str], None] = lambda _: None):
    self.manifest = manifest
    self.settings = manifest.settings
    stages, moved = manifest.stages, manifest.moved
    log(f"loading the pipeline in {manifest.root}" +
        (f" (written in {moved[0]})" if moved else ""))
    # A folder copied from elsewhere: every saved path under its old place is read as the
    # same path under the new one (configs, index and feature-store fingerprints).
    self._text = load_trained(stages["text_retriever"], moved=moved)
    self._image = load_trained(stages["image_retriever"], moved=moved)
    self._text_index = system.open_index(self._text, manifest.indexes["text"], moved)
    self._image_index = system.open_index(self._image, manifest.indexes["image"], moved)
    release = MochegRelease(manifest.release)
    kb = system.corpus(release, "text")
    system.check_index_covers_kb(self._text_index, kb, manifest.release)
    system.check_index_covers_kb(self._image_index, system.corpus(release, "image"),
                                 manifest.release)
    self._kb_texts = kb.texts
    self._grounder = (grounding.Grounder(self._image_index) if self.settings.image_articles
                      else None)
    self._release = release
    self._reranker = (rerank_lib.load_reranker(stages["reranker"], moved=moved)
                      if self.settings.rerank_weight > 0 else None)
    self._verifier_run = load_trained(stages["verifier"], moved=moved)
    self._generator = load_trained(stages["generator"], moved=moved)
    if cache_dir is None:
      cache_dir = tempfile.mkdtemp(prefix="mocheg-fact-check-")
      self._cleanup = weakref.finalize(self, shutil.rmtree, cache_dir, True)
    else:
      self._cleanup = None
    # The verifier as trained, but encoding new claims into the checker's own store.
    self._verifier = dataclasses.replace(self._verifier_run.task.inference,
                                         features_dir=cache_dir, _opened=None)
    self._image_size = self._image.model.config.vision.image_size

  @classmethod
  def load(cls, pipeline_dir: str, *, cache_dir: str | None = None,
           log: Callable[[str], None] = lambda _: None) -> "FactChecker":
    """The pipeline the main job wrote in `pipeline_dir` (see pipeline/manifest.py).

    Raises:
      MochegInputError: no manifest, or a stage or index it names is missing (named).
    """
    return cls(manifest_lib.read_manifest(pipeline_dir), cache_dir=cache_dir, log=log)

  def close(self) -> None:
    """Removes the temporary feature store now."""
    if self._cleanup is not None:
      self._cleanup()

  def check(self, claim: str, image: str | None = None) -> FactCheck:
    return self.check_many([claim], None if image is None else [image])[0]

  def check_many(self, claims: Sequence[str], images: Sequence[str | None] | None = None
                 ) -> list[FactCheck]:
    """Fact-checks `claims` (each with an optional image path), results in order."""
    claims, images = check_claims(claims, images, self._image_size)
    if not claims:
      return []
    # The products as the main job computed them, whatever this process's setting.
    with jax.default_matmul_precision(self.settings.matmul_precision or None):
      texts = self._text_evidence(claims)
      pictures = self._image_evidence(claims, images, texts)
      probabilities = self._verify(claims, texts, pictures)
      labels = probabilities.argmax(-1)
      explanations = self._explain(claims, texts, labels)
    return [FactCheck(claim=c, text_evidence=tuple(t), image_evidence=tuple(p),
                      label=LABEL_NAMES[int(y)],
                      probabilities={n: float(v) for n, v in zip(LABEL_NAMES, probs)},
                      explanation=e)
            for c, t, p, y, probs, e in zip(claims, texts, pictures, labels, probabilities,
                                            explanations)]

  # ---- the steps ------------------------------------------------------------------------
  def _text_evidence(self, claims: list[str]) -> list[list[TextEvidence]]:
    s = self.settings
    queries = system.normalized(self._text.task.inference.encode_queries(self._text.model, claims))
    if self._reranker is None:
      ranked_hits = search_lib.search(queries, self._text_index, s.text_top_k)
    else:
      hits = search_lib.search(queries, self._text_index,
                               max(s.text_candidates, s.text_top_k))
      candidates = [[(doc, self._kb_texts[doc]) for doc, _ in ranked] for ranked in hits]
      reranked = self._reranker(claims, candidates)
      ranked_hits = [fusion.fuse(first, cross, s.rerank_weight, s.text_top_k)
                     for first, cross in zip(hits, reranked)]
    return [[TextEvidence(doc, self._kb_texts[doc], float(score)) for doc, score in ranked]
            for ranked in ranked_hits]

  def _image_evidence(self, claims: list[str], images: list[str | None],
                      texts: list[list[TextEvidence]]) -> list[list[ImageEvidence]]:
    encoders, model = self._image.task.inference, self._image.model
    queries = system.normalized(encoders.encode_queries(model, claims))
    k, articles = self.settings.image_top_k, self.settings.image_articles
    hits = search_lib.search(queries, self._image_index, k)
    if articles:
      hits = [self._grounder(q, [(e.id, e.score) for e in t], h, articles, k)
              for q, t, h in zip(queries, texts, hits)]
    given = [(i, p) for i, p in enumerate(images) if p is not None]
    own = {}
    if given:
      embedded = system.normalized(encoders.encode_documents(model, [p for _, p in given]))
      own = {i: ImageEvidence(p, float(queries[i] @ e)) for (i, p), e in zip(given, embedded)}
    return [([own[i]] if i in own else []) + [ImageEvidence(name, float(score))
                                              for name, score in ranked]
            for i, ranked in enumerate(hits)]

  def _image_path(self, evidence: ImageEvidence) -> str:
    if os.path.isabs(evidence.file):  # The claim's own image.
      return evidence.file
    return os.path.abspath(self._release.image_path(evidence.file))

  def _verify(self, claims: list[str], texts: list[list[TextEvidence]],
              pictures: list[list[ImageEvidence]]) -> np.ndarray:
    s, v = self.settings, self._verifier.config.verify
    evidence = [evidence_lib.ClaimEvidence(
        i, claim, _PLACEHOLDER_LABEL, tuple(e.text for e in t[:s.verifier_texts]),
        tuple(self._image_path(p) for p in p_list[:s.verifier_images]))
        for i, (claim, t, p_list) in enumerate(zip(claims, texts, pictures))]
    evidence = evidence_lib.restrict(evidence, text=v.use_text, images=v.use_image)
    return self._verifier.predict(self._verifier_run.model, evidence)

  def _explain(self, claims: list[str], texts: list[list[TextEvidence]], labels: np.ndarray
               ) -> list[str]:
    n = self.settings.generator_texts
    sources = [Claim(claim_id=i, claim=c, label=int(y),
                     evidence=tuple(e.text for e in t[:n]), explanation="",
                     proof_images=(), rating="")
               for i, (c, t, y) in enumerate(zip(claims, texts, labels))]
    return explanation_stage.generate(self._generator, sources)

