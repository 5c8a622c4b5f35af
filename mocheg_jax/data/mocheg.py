"""Typed records and loaders for a Mocheg release folder (see MOCHEG_FORMAT.md).

`MochegRelease(root)` reads exactly the published layout: claims merged per claim from the
per-snippet rows of `{split}/Corpus2.csv`, proof images, KB articles, the sentence-level KB
(streamed from the supplementary file, or rebuilt with the exact `corpus_id` scheme when it
is missing), text and image qrels, and the cleaned KB image collection. Large files are
streamed; bad records are skipped into `release.report`, never dropped silently.
"""

from __future__ import annotations

import csv
import dataclasses
import os
from typing import Iterator

from mocheg_jax.data import csv_io
from mocheg_jax.data import images as image_names
from mocheg_jax.data import labels
from mocheg_jax.data import text as text_lib
from mocheg_jax.data.report import MochegInputError, SkipReport

SPLITS: tuple[str, ...] = ("train", "val", "test")
CORPUS3 = "Corpus3.csv"
SENTENCE_KB = os.path.join("supplementary", "Corpus3_sentence_level.csv")
CLAIMS_FILE = "Corpus2.csv"
TEXT_QRELS = "text_evidence_qrels_sentence_level.csv"
IMAGE_QRELS = "img_evidence_qrels.csv"
IMAGES_DIR = "images"
QREL_COLUMNS = ("TOPIC", "ITERATION", "DOCUMENT#", "RELEVANCY")
SENTENCE_COLUMNS = ("claim_id", "relevant_document_id", "paragraph_id", "corpus_id", "paragraph")


@dataclasses.dataclass(frozen=True)
class Claim:
  claim_id: int
  claim: str
  label: int                      # labels.REFUTED / SUPPORTED / NEI
  evidence: tuple[str, ...]       # text evidence snippets in row order, tags removed
  explanation: str                # gold ruling outline ('' when the release has none)
  proof_images: tuple[str, ...]   # file names of the claim's proof images (sorted)
  rating: str                     # raw site rating (`Truthfulness`), '' when absent
  snopes_url: str = ""
  ruling_article: str = ""        # `Origin`: the full ruling article


@dataclasses.dataclass(frozen=True, slots=True)
class KBArticle:
  claim_id: int
  relevant_document_id: int
  text: str                       # `Origin Document`, tags kept as in the release
  snopes_url: str = ""
  link_url: str = ""
  archive_url: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class KBSentence:
  corpus_id: str
  claim_id: int
  relevant_document_id: int
  paragraph_id: int
  text: str


def corpus_id(claim_id: int, relevant_document_id: int, paragraph_id: int) -> str:
  """The sentence id the text qrels name: plain, unpadded integers."""
  return f"{claim_id}-{relevant_document_id}-{paragraph_id}"


def article_sentences(article: KBArticle) -> Iterator[KBSentence]:
  """An article's sentences, numbered as the supplementary sentence-level file numbers them."""
  for i, sentence in enumerate(text_lib.document_sentences(article.text)):
    yield KBSentence(corpus_id(article.claim_id, article.relevant_document_id, i),
                     article.claim_id, article.relevant_document_id, i, sentence)


class MochegRelease:
  """A release root folder. Every loader records skipped records in `self.report`."""

  def __init__(self, root: str | os.PathLike, report: SkipReport | None = None):
    self.root = os.fspath(root)
    if not os.path.isdir(self.root):
      raise MochegInputError(f"{self.root}: release folder does not exist")
    self.report = report if report is not None else SkipReport()

  # ---- paths -------------------------------------------------------------------------
  def path(self, *parts: str) -> str:
    return os.path.join(self.root, *parts)

  def image_path(self, name: str) -> str:
    return self.path(IMAGES_DIR, name)

  def has_sentence_file(self) -> bool:
    return os.path.isfile(self.path(SENTENCE_KB))

  def _check_split(self, split: str) -> None:
    if split not in SPLITS:
      raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")

  # ---- claims ------------------------------------------------------------------------
  def claims(self, split: str) -> list[Claim]:
    """The split's claims, one per claim_id in order of first appearance."""
    self._check_split(split)
    path = self.path(split, CLAIMS_FILE)
    proofs = self.proof_images(split)
    rows = csv_io.read_rows(
        path, ("claim_id", "Claim", "Evidence", "cleaned_truthfulness"), self.report,
        optional=("ruling_outline", "Origin", "Truthfulness", "Snopes URL"))
    merged: dict[int, dict] = {}
    for row_number, (cid, claim, evidence, cleaned, outline, origin, rating, url) in rows:
      try:
        claim_id = csv_io.parse_int(cid)
      except ValueError:
        self.report.add(path, row_number, "non-integer claim_id", repr(cid))
        continue
      snippet = text_lib.strip_tags(evidence or "")
      if claim_id in merged:  # Later rows add their snippet; other fields come from the first.
        if snippet:
          merged[claim_id]["evidence"].append(snippet)
        continue
      try:
        label = _label(cleaned, rating)
      except labels.UnknownLabelError as e:
        self.report.add(path, row_number, "unknown label", f"claim {claim_id}: {e}")
        merged[claim_id] = {"skip": True}
        continue
      merged[claim_id] = dict(
          claim_id=claim_id, claim=text_lib.strip_tags(claim or ""), label=label,
          evidence=[snippet] if snippet else [], origin=origin or "", outline=outline or "",
          rating=(rating or "").strip(), url=(url or "").strip())
    claims = []
    for fields in merged.values():
      if fields.get("skip"):
        continue
      explanation = text_lib.strip_tags(fields["outline"])
      if not explanation:
        explanation = text_lib.extract_gold_explanation(fields["origin"])
      claims.append(Claim(
          claim_id=fields["claim_id"], claim=fields["claim"], label=fields["label"],
          evidence=tuple(fields["evidence"]), explanation=explanation,
          proof_images=tuple(proofs.get(fields["claim_id"], ())), rating=fields["rating"],
          snopes_url=fields["url"], ruling_article=fields["origin"]))
    return claims

  def proof_images(self, split: str) -> dict[int, list[str]]:
    """claim_id -> sorted proof image names listed in `{split}/images/`."""
    self._check_split(split)
    directory = self.path(split, IMAGES_DIR)
    by_claim: dict[int, list[str]] = {}
    if not os.path.isdir(directory):
      return by_claim  # A split without proof images is legal (text-only claims).
    for name in sorted(os.listdir(directory)):
      try:
        parsed = image_names.parse_image_name(name)
      except ValueError as e:
        self.report.add(os.path.join(directory, name), None, "bad image name", str(e))
        continue
      if not parsed.is_proof:
        self.report.add(os.path.join(directory, name), None, "not a proof image name")
        continue
      by_claim.setdefault(parsed.claim_id, []).append(name)
    return by_claim

  # ---- knowledge base ----------------------------------------------------------------
  def iter_articles(self) -> Iterator[KBArticle]:
    """Streams `Corpus3.csv`."""
    path = self.path(CORPUS3)
    rows = csv_io.read_rows(path, ("claim_id", "relevant_document_id", "Origin Document"),
                            self.report, optional=("Snopes URL", "Link URL", "Archive Url"))
    for row_number, (cid, did, document, snopes, link, archive) in rows:
      try:
        ids = csv_io.parse_int(cid), csv_io.parse_int(did)
      except ValueError:
        self.report.add(path, row_number, "non-integer ids",
                        f"claim_id={cid!r} relevant_document_id={did!r}")
        continue
      yield KBArticle(ids[0], ids[1], document or "", snopes or "", link or "", archive or "")

  def iter_sentences(self) -> Iterator[KBSentence]:
    """Streams the sentence-level KB: the supplementary file, else rebuilt from articles."""
    if not self.has_sentence_file():
      for article in self.iter_articles():
        yield from article_sentences(article)
      return
    path = self.path(SENTENCE_KB)
    for row_number, (cid, did, pid, sid, sentence) in csv_io.read_rows(
        path, SENTENCE_COLUMNS, self.report):
      try:
        ids = csv_io.parse_int(cid), csv_io.parse_int(did), csv_io.parse_int(pid)
      except ValueError:
        self.report.add(path, row_number, "non-integer ids",
                        f"claim_id={cid!r} relevant_document_id={did!r} paragraph_id={pid!r}")
        continue
      if not sid:
        self.report.add(path, row_number, "empty corpus_id")
        continue
      yield KBSentence(sid, ids[0], ids[1], ids[2], sentence)

  def approx_sentence_count(self) -> int | None:
    """Line count of the sentence file (a fast estimate for progress ETAs), else None."""
    if not self.has_sentence_file():
      return None
    lines = 0
    with open(self.path(SENTENCE_KB), "rb") as f:
      while chunk := f.read(1 << 24):
        lines += chunk.count(b"\n")
    return max(0, lines - 1)

  def kb_images(self, clean: bool = True) -> list[str]:
    """Sorted KB image names (proof images excluded), cleaned by the paper's rules.

    Removed images go to `self.report` with the rule that removed them.
    """
    directory = self.path(IMAGES_DIR)
    if not os.path.isdir(directory):
      raise MochegInputError(f"{directory}: missing KB image folder")
    names = []
    for name in sorted(os.listdir(directory)):
      try:
        if image_names.parse_image_name(name).is_proof:
          continue
      except ValueError as e:
        self.report.add(os.path.join(directory, name), None, "bad image name", str(e))
        continue
      names.append(name)
    return image_names.clean_images(directory, names, self.report) if clean else names

  # ---- qrels -------------------------------------------------------------------------
  def text_qrels(self, split: str) -> dict[int, dict[str, int]]:
    """claim_id -> {corpus_id: relevancy} from the sentence-level text qrels."""
    return self._qrels(split, TEXT_QRELS)

  def image_qrels(self, split: str) -> dict[int, dict[str, int]]:
    """claim_id -> {KB image name: relevancy}."""
    return self._qrels(split, IMAGE_QRELS)

  def _qrels(self, split: str, name: str) -> dict[int, dict[str, int]]:
    self._check_split(split)
    path = self.path(split, name)
    qrels: dict[int, dict[str, int]] = {}
    for row_number, (topic, _, doc, relevancy) in csv_io.read_rows(path, QREL_COLUMNS,
                                                                   self.report):
      try:
        qrels.setdefault(csv_io.parse_int(topic), {})[doc.strip()] = csv_io.parse_int(relevancy)
      except ValueError:
        self.report.add(path, row_number, "non-integer qrel",
                        f"TOPIC={topic!r} RELEVANCY={relevancy!r}")
    return qrels


def _label(cleaned: str | None, rating: str | None) -> int:
  """The class from `cleaned_truthfulness`, falling back to our raw-rating table."""
  for value in (cleaned, rating):
    if value and value.strip():
      try:
        return labels.label_from_name(value)
      except labels.UnknownLabelError:
        return labels.label_from_rating(value)
  raise labels.UnknownLabelError("empty cleaned_truthfulness and Truthfulness")


def write_sentence_kb(release: MochegRelease, out_path: str | os.PathLike,
                      progress=None) -> int:
  """Rebuilds the sentence-level KB from `Corpus3.csv` into `out_path`; returns the row count."""
  count = 0
  os.makedirs(os.path.dirname(os.fspath(out_path)) or ".", exist_ok=True)
  with open(out_path, "w", newline="", encoding="utf-8") as f:
    writer = csv.writer(f, lineterminator="\n")
    writer.writerow(SENTENCE_COLUMNS)
    for article in release.iter_articles():
      for s in article_sentences(article):
        writer.writerow((s.claim_id, s.relevant_document_id, s.paragraph_id, s.corpus_id,
                         s.text))
        count += 1
      if progress is not None:
        progress.update()
  return count
