"""TFDS builder `mocheg`: a release folder (the manual dir) -> array_record splits.

No TensorFlow is needed: every feature is Text, ClassLabel, Scalar or an object Tensor, and
images are stored as their encoded bytes (decoded with Pillow inside the grain pipelines).
Three configs:
* `claims` (train / val / test): one example per claim with its text evidence, the texts of
  its relevant KB sentences, a few hard-negative sentences from its own articles, the bytes
  of its proof images and relevant KB images, the label and the gold explanation.
* `kb_sentences` (split `kb`): every KB sentence with its corpus_id.
* `kb_images` (split `kb`): every KB image kept by the paper's cleaning rules, as bytes.
Records that cannot be used are skipped and listed in `skipped.csv` beside each config's data.
"""

from __future__ import annotations

import dataclasses
import io
import os
import resource
import zlib

import numpy as np
import tensorflow_datasets as tfds
from PIL import Image

from mocheg_jax.data import images as image_names
from mocheg_jax.data import labels
from mocheg_jax.data.mocheg import SPLITS, MochegRelease
from mocheg_jax.data.report import MochegInputError, SkipReport
from mocheg_jax.utils.progress import track

NAME = "mocheg"
KB_SPLIT = "kb"
NEGATIVES_PER_CLAIM = 8
SKIPPED_FILE = "skipped.csv"

_bytes = lambda: tfds.features.Tensor(shape=(), dtype=np.object_)  # noqa: E731
_texts = lambda: tfds.features.Sequence(tfds.features.Text())  # noqa: E731
_int = lambda: tfds.features.Scalar(dtype=np.int64)  # noqa: E731

FEATURES = {
    "claims": {
        "claim_id": _int(),
        "claim": tfds.features.Text(),
        "label": tfds.features.ClassLabel(names=list(labels.LABEL_NAMES)),
        "evidence": _texts(),                      # Corpus2 snippets, row order
        "relevant_sentence_ids": _texts(),         # corpus_ids from the text qrels
        "relevant_sentences": _texts(),            # their KB texts (same order)
        "negative_sentences": _texts(),            # own-article sentences not in the qrels
        "proof_images": _texts(),
        "proof_image_bytes": tfds.features.Sequence(_bytes()),
        "relevant_images": _texts(),               # KB image names from the image qrels
        "relevant_image_bytes": tfds.features.Sequence(_bytes()),
        "explanation": tfds.features.Text(),
    },
    "kb_sentences": {
        "corpus_id": tfds.features.Text(),
        "claim_id": _int(),
        "relevant_document_id": _int(),
        "paragraph_id": _int(),
        "text": tfds.features.Text(),
    },
    "kb_images": {
        "name": tfds.features.Text(),
        "claim_id": _int(),
        "relevant_document_id": _int(),
        "image": _bytes(),
    },
}


class _LocalGfile:
  """The slice of tf.io.gfile that TFDS's shuffle buckets use, on local files."""
  GFile = staticmethod(open)
  exists = staticmethod(os.path.exists)
  remove = staticmethod(os.remove)


class _TensorFlowShim:
  """Stands in for TensorFlow in tensorflow_datasets.core.shuffle.

  A split larger than 1 GB (the paper-scale KB sentences and images) is spilled to
  temporary bucket files through tf.io.gfile; with this shim those are plain local files,
  so no TensorFlow is needed at any size.
  """

  class io:  # noqa: N801 (mirrors tf.io)
    gfile = _LocalGfile

  class errors:  # noqa: N801 (mirrors tf.errors)
    class ResourceExhaustedError(OSError):
      message = ""


def _use_local_spill_files() -> None:
  try:
    import tensorflow  # noqa: F401  (with TensorFlow present TFDS needs no help)
    return
  except ImportError:
    pass
  from tensorflow_datasets.core import shuffle
  shuffle.tf = _TensorFlowShim
  # The shuffler keeps one open file per bucket (1,000): lift the soft limit to the hard one.
  soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
  if hard == resource.RLIM_INFINITY or soft < hard:
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _stable_rank(key: str) -> int:
  """A hash that is the same in every process and run (Python's hash() is salted)."""
  return zlib.crc32(key.encode("utf-8"))


def _read_image(path: str, report: SkipReport) -> bytes | None:
  """Encoded bytes of a readable image, else None with the reason in `report`."""
  try:
    with open(path, "rb") as f:
      data = f.read()
    with Image.open(io.BytesIO(data)) as img:
      img.size  # Parses the header: catches truncated or non-image files early.
    return data
  except (OSError, ValueError, Image.DecompressionBombError) as e:
    report.add(path, None, image_names.UNREADABLE_IMAGE, f"{type(e).__name__}: {e}")
    return None


class Mocheg(tfds.core.GeneratorBasedBuilder):
  """The Mocheg release (real or synthetic) read from a manual dir."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Claims, KB sentences and cleaned KB images."}
  BUILDER_CONFIGS = [tfds.core.BuilderConfig(name=name) for name in FEATURES]
  MANUAL_DOWNLOAD_INSTRUCTIONS = "Pass the Mocheg release root folder as the manual dir."
  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self, description=__doc__,
        # Examples keep the release's order: ids stay easy to audit, builds reproducible.
        disable_shuffling=True,
        features=tfds.features.FeaturesDict(FEATURES[self.builder_config.name]))

  def _split_generators(self, dl_manager):
    self._release = MochegRelease(dl_manager.manual_dir)
    name = self.builder_config.name
    if name == "claims":
      return self._claim_splits()
    if name == "kb_sentences":
      return {KB_SPLIT: self._kb_sentences()}
    return {KB_SPLIT: self._kb_images()}

  def _generate_examples(self):  # Unused: each split has its own generator above.
    raise NotImplementedError

  # ---- configs ---------------------------------------------------------------------
  def _claim_splits(self):
    release = self._release
    claims = {split: release.claims(split) for split in SPLITS}
    relevant = {}
    for split in SPLITS:
      qrels = release.text_qrels(split)
      for c in claims[split]:
        relevant[c.claim_id] = [d for d, r in sorted(qrels.get(c.claim_id, {}).items())
                                if r == 1]
    # One pass over the KB serves all three splits.
    texts, negatives = self._sentence_texts({d for ds in relevant.values() for d in ds},
                                            set(relevant))
    return {split: self._claims(split, claims[split], relevant, texts, negatives)
            for split in SPLITS}

  def _claims(self, split, claims, relevant, texts, negatives):
    release = self._release
    image_qrels = release.image_qrels(split)
    for c in track(claims, f"TFDS claims/{split}", unit="claims"):
      found = [d for d in relevant[c.claim_id] if d in texts]
      for d in relevant[c.claim_id]:
        if d not in texts:
          release.report.add(release.path(split, "text_evidence_qrels_sentence_level.csv"),
                             None, "qrel names an unknown sentence", f"claim {c.claim_id}: {d}")
      proof = [(n, _read_image(os.path.join(release.path(split, "images"), n), release.report))
               for n in c.proof_images]
      kb_relevant = sorted(d for d, r in image_qrels.get(c.claim_id, {}).items() if r == 1)
      kb = [(n, _read_image(release.image_path(n), release.report)) for n in kb_relevant]
      yield c.claim_id, {
          "claim_id": c.claim_id, "claim": c.claim, "label": c.label,
          "evidence": list(c.evidence),
          "relevant_sentence_ids": found,
          "relevant_sentences": [texts[d] for d in found],
          "negative_sentences": [s for _, s in sorted(negatives.get(c.claim_id, []))],
          "proof_images": [n for n, b in proof if b is not None],
          "proof_image_bytes": [b for _, b in proof if b is not None],
          "relevant_images": [n for n, b in kb if b is not None],
          "relevant_image_bytes": [b for _, b in kb if b is not None],
          "explanation": c.explanation,
      }

  def _sentence_texts(self, wanted: set[str], claim_ids: set[int]):
    """One pass over the KB: texts of `wanted` ids and hard negatives per claim.

    Negatives are the claim's own-article sentences outside the qrels (same topic, other
    facts), the NEGATIVES_PER_CLAIM with the smallest stable hash: a deterministic sample
    that needs only bounded memory however large the KB is.
    """
    texts: dict[str, str] = {}
    negatives: dict[int, list[tuple[int, str]]] = {}
    for s in track(self._release.iter_sentences(), "KB pass for the claims", unit="sentences",
                   total=self._release.approx_sentence_count()):
      if s.corpus_id in wanted:
        texts[s.corpus_id] = s.text
      elif s.claim_id in claim_ids and s.text:
        pool = negatives.setdefault(s.claim_id, [])
        pool.append((_stable_rank(s.corpus_id), s.text))
        if len(pool) > 4 * NEGATIVES_PER_CLAIM:  # Trim now and then: memory stays bounded.
          pool.sort()
          del pool[NEGATIVES_PER_CLAIM:]
    for pool in negatives.values():
      pool.sort()
      del pool[NEGATIVES_PER_CLAIM:]
    return texts, negatives

  def _kb_sentences(self):
    for s in track(self._release.iter_sentences(), "TFDS kb_sentences", unit="sentences",
                   total=self._release.approx_sentence_count()):
      yield s.corpus_id, {"corpus_id": s.corpus_id, "claim_id": s.claim_id,
                          "relevant_document_id": s.relevant_document_id,
                          "paragraph_id": s.paragraph_id, "text": s.text}

  def _kb_images(self):
    release = self._release
    for name in track(release.kb_images(clean=True), "TFDS kb_images", unit="images"):
      data = _read_image(release.image_path(name), release.report)
      if data is None:
        continue
      parsed = image_names.parse_image_name(name)
      yield name, {"name": name, "claim_id": parsed.claim_id,
                   "relevant_document_id": parsed.relevant_document_id, "image": data}


@dataclasses.dataclass
class Prepared:
  builder: Mocheg
  skipped: str  # One-line summary of the skipped records ('' when the data was reused).


def build(release_dir: str | os.PathLike, data_dir: str | os.PathLike,
          configs: tuple[str, ...] = tuple(FEATURES)) -> dict[str, Prepared]:
  """Prepares every config of `release_dir` into `data_dir` (reusing finished ones)."""
  MochegRelease(release_dir)  # A missing folder is our clear error, not TFDS's assertion.
  _use_local_spill_files()
  # Our own progress lines (with ETA) cover every split; TFDS's bars would interleave.
  tfds.disable_progress_bar()
  if not os.listdir(release_dir):
    raise MochegInputError(f"{release_dir}: release folder is empty")
  prepared = {}
  for name in configs:
    builder = Mocheg(data_dir=os.fspath(data_dir), config=name, file_format="array_record")
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
        manual_dir=os.fspath(release_dir)))
    release = getattr(builder, "_release", None)
    summary = ""
    if release is not None:  # None when the data was already prepared and is reused.
      release.report.write_csv(skipped_report_path(builder))
      summary = release.report.summary()
    prepared[name] = Prepared(builder, summary)
  return prepared


def load(data_dir: str | os.PathLike, config: str) -> Mocheg:
  """The prepared builder of `config` (raises if `build` has not run)."""
  return Mocheg(data_dir=os.fspath(data_dir), config=config, file_format="array_record")


def skipped_report_path(builder: Mocheg) -> str:
  return os.path.join(builder.data_dir, SKIPPED_FILE)
