"""The release layout on disk: streamed CSV files and the image files.

CSV files are written with the `csv` module (QUOTE_MINIMAL, UTF-8, "\\n" line endings),
header first, rows in claim_id order, one claim at a time, so memory does not grow with
the world. Images are rendered by `render_images`, in worker processes when asked; every
job carries its own seed, so the files do not depend on the number of workers.
"""

from __future__ import annotations

import collections
import csv
import multiprocessing
import os
import random
from typing import Sequence

from mocheg_jax.data import labels
from mocheg_jax.data.synthetic.articles import ClaimPlan, DocText
from mocheg_jax.data.synthetic.render import ImageJob, write_job
from mocheg_jax.data.synthetic.ruling import CORPUS2_COLUMNS, ClaimFields
from mocheg_jax.data.synthetic.scales import SPLITS
from mocheg_jax.utils.progress import Progress

CORPUS3_COLUMNS = ("claim_id", "relevant_document_id", "Snopes URL", "Link URL", "Archive Url",
                   "Origin Document")
SENTENCE_COLUMNS = ("claim_id", "relevant_document_id", "paragraph_id", "corpus_id",
                    "paragraph")
QREL_COLUMNS = ("TOPIC", "ITERATION", "DOCUMENT#", "RELEVANCY")
IMAGE_QREL_COLUMNS = QREL_COLUMNS + ("evidence_id",)
EVIDENCE_TAG_PROBABILITY = 0.2  # Evidence snippets sometimes keep their <p> tags.


def release_paths(split: str | None = None) -> dict[str, str]:
  """Relative paths of the release's CSV files (global ones, or one split's)."""
  if split is None:
    return {"corpus3": "Corpus3.csv",
            "sentences": os.path.join("supplementary", "Corpus3_sentence_level.csv")}
  return {"corpus2": os.path.join(split, "Corpus2.csv"),
          "text_qrels": os.path.join(split, "text_evidence_qrels_sentence_level.csv"),
          "article_qrels": os.path.join(split, "text_evidence_qrels_article_level.csv"),
          "image_qrels": os.path.join(split, "img_evidence_qrels.csv")}


def make_directories(root: str) -> None:
  for sub in ("images", "supplementary", *SPLITS, *(os.path.join(s, "images") for s in SPLITS)):
    os.makedirs(os.path.join(root, sub), exist_ok=True)


class _Csv:
  def __init__(self, path: str, header: Sequence[str]):
    self.file = open(path, "w", newline="", encoding="utf-8")
    self.writer = csv.writer(self.file, quoting=csv.QUOTE_MINIMAL, lineterminator="\n")
    self.writer.writerow(header)

  def close(self) -> None:
    self.file.close()


class ReleaseWriter:
  """Streams every CSV file of a release; counts what it writes."""

  def __init__(self, root: str):
    self.root = root
    paths = release_paths()
    self.corpus3 = _Csv(os.path.join(root, paths["corpus3"]), CORPUS3_COLUMNS)
    self.sentences = _Csv(os.path.join(root, paths["sentences"]), SENTENCE_COLUMNS)
    self.split_files: dict[str, dict[str, _Csv]] = {}
    for split in SPLITS:
      p = release_paths(split)
      self.split_files[split] = {
          "corpus2": _Csv(os.path.join(root, p["corpus2"]), CORPUS2_COLUMNS),
          "text_qrels": _Csv(os.path.join(root, p["text_qrels"]), QREL_COLUMNS),
          "article_qrels": _Csv(os.path.join(root, p["article_qrels"]), QREL_COLUMNS),
          "image_qrels": _Csv(os.path.join(root, p["image_qrels"]), IMAGE_QREL_COLUMNS),
      }
    self.counts: collections.Counter[str] = collections.Counter()
    self.labels: dict[str, collections.Counter[str]] = {s: collections.Counter() for s in SPLITS}

  def __enter__(self) -> "ReleaseWriter":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def close(self) -> None:
    self.corpus3.close()
    self.sentences.close()
    for files in self.split_files.values():
      for f in files.values():
        f.close()

  def write_claim(self, plan: ClaimPlan, texts: list[DocText], fields: ClaimFields,
                  rng: random.Random) -> None:
    """All rows of one claim: its articles, sentences, Corpus2 rows and qrels."""
    claim = plan.claim
    cid = claim.claim_id
    files = self.split_files[claim.split]
    evidence: list[tuple[str, str]] = []  # (corpus_id, sentence)
    for text in texts:
      doc = text.doc
      self.corpus3.writer.writerow([cid, doc.doc_id, fields.snopes_url, doc.link_url,
                                    doc.archive_url, text.origin_document()])
      self.sentences.writer.writerows(
          [cid, doc.doc_id, i, f"{cid}-{doc.doc_id}-{i}", s] for i, s in enumerate(text.sentences))
      self.counts["articles"] += 1
      self.counts["sentences"] += len(text.sentences)
      if text.evidence_positions:
        self.counts["evidence_articles"] += 1
        files["article_qrels"].writer.writerow([cid, 0, doc.doc_id, 1])
      for i in text.evidence_positions:
        evidence.append((f"{cid}-{doc.doc_id}-{i}", text.sentences[i]))
    for corpus_id, _ in evidence:
      files["text_qrels"].writer.writerow([cid, 0, corpus_id, 1])
    rows = []
    for corpus_id, sentence in evidence:
      snippet = f"<p>{sentence}</p>" if rng.random() < EVIDENCE_TAG_PROBABILITY else sentence
      rows.append(fields.row(snippet, corpus_id))
    files["corpus2"].writer.writerows(rows or [fields.row("", "")])
    for image in plan.images:
      self.counts["kb_images"] += 1
      self.counts["junk_images"] += image.junk
      if image.proof_name is not None:
        files["image_qrels"].writer.writerow([cid, 0, image.kb_name, 1, image.proof_name])
        self.counts[f"image_evidence/{claim.split}"] += 1
    self.counts[f"text_evidence/{claim.split}"] += len(evidence)
    self.counts[f"claims/{claim.split}"] += 1
    self.counts["empty_rulings"] += not fields.ruling_outline
    if claim.attribute.visual and claim.label != labels.NEI:
      self.counts["image_only_claims"] += 1
    self.labels[claim.split][labels.LABEL_NAMES[claim.label]] += 1


# ---- images -----------------------------------------------------------------------------
_WORKER_ROOT = ""


def _init_worker(root: str) -> None:
  global _WORKER_ROOT
  _WORKER_ROOT = root


def _work(job: ImageJob) -> int:
  return write_job(_WORKER_ROOT, job)


class ImageRenderer:
  """Renders image jobs, in the background with `workers` > 1 processes, else in-process.

  Start it before writing the text so that both run at once; `finish()` waits for the
  rest and returns the number of files written.
  """

  def __init__(self, root: str, jobs: list[ImageJob], workers: int, progress: bool):
    self.root, self.jobs, self.workers, self.progress = root, jobs, workers, progress
    self.pool = None
    self.results = None
    if workers > 1 and jobs:
      # "spawn": safe even when the caller has started threads (JAX, grain) before us.
      context = multiprocessing.get_context("spawn")
      self.pool = context.Pool(workers, initializer=_init_worker, initargs=(root,))
      self.results = self.pool.imap_unordered(_work, jobs, chunksize=64)

  def finish(self) -> int:
    files = 0
    with Progress("images", total=len(self.jobs), unit="img", enabled=self.progress) as bar:
      if self.pool is None:
        for job in self.jobs:
          files += write_job(self.root, job)
          bar.update()
      else:
        try:
          for n in self.results:
            files += n
            bar.update()
        finally:
          self.pool.close()
          self.pool.join()
    return files

  def abort(self) -> None:
    if self.pool is not None:
      self.pool.terminate()
      self.pool.join()
