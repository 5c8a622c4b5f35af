"""The evidence each claim is verified with: gold (from the release) or system (retrieved).

Reference (VT-NLP/Mocheg verification/data_util.py): with gold evidence a claim's text items
are the sentences of its evidence paragraphs (nltk there; `data.text.split_sentences` here,
the project's deterministic splitter) and its image items are its proof images; all of them
are used. With system evidence the items are the retrieval stage's ranked sentences and KB
images (the result CSV of mocheg_jax/retrieval/results.py), cut to the top K of each.

Every claim of the split is kept, also one without any evidence item: it is still a claim to
classify (the model has a rule for missing modalities). Modes that drop a modality (text
only, image only, none) are `restrict(evidence, text=..., images=...)` on either list.

Bad input is an error naming what is wrong (`MochegInputError`): a label outside 0..2, claims
missing from the result CSV, a retrieved sentence id the KB does not hold, a retrieved image
that is not a KB image name or is not on disk, a missing proof image file.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Iterable, Sequence

from mocheg_jax.data import images as image_names
from mocheg_jax.data import labels as labels_lib
from mocheg_jax.data import text as text_lib
from mocheg_jax.data.mocheg import IMAGE_QRELS, TEXT_QRELS, Claim, MochegRelease
from mocheg_jax.data.report import MochegInputError
from mocheg_jax.retrieval import results as results_lib

NUM_CLASSES = labels_lib.NUM_CLASSES


@dataclasses.dataclass(frozen=True)
class ClaimEvidence:
  """One claim with the evidence it is verified with."""
  claim_id: int
  claim: str
  label: int                   # 0 refuted, 1 supported, 2 NEI
  texts: tuple[str, ...]       # text items (sentences), in order (best first for system)
  images: tuple[str, ...]      # absolute image paths, in order
  # The texts that count as the claim's evidence: its gold evidence sentences and, for
  # system evidence, the retrieved sentences its text qrels judge relevant (a release may
  # cut its KB sentences differently from its evidence paragraphs). Which text items are
  # relevant: the item-relevance gate's training signal (stance.StanceConfig.item_gate).
  relevant_texts: tuple[str, ...] = ()
  # The images that count as the claim's evidence (paths): its proof images for gold
  # evidence; for system evidence, the retrieved KB images its image qrels match to a proof
  # image. The image gate's training signal (stance.StanceConfig.image_gate).
  relevant_images: tuple[str, ...] = ()


def _check_label(claim_id: int, label: int, source: str) -> int:
  if isinstance(label, bool) or not isinstance(label, int) or not 0 <= label < NUM_CLASSES:
    raise MochegInputError(f"{source}: claim {claim_id} has label {label!r}; expected an "
                           f"integer in 0..{NUM_CLASSES - 1} ({', '.join(labels_lib.LABEL_NAMES)})")
  return label


def evidence_sentences(snippets: Iterable[str]) -> tuple[str, ...]:
  """The sentences of a claim's evidence snippets, in order; empty ones dropped."""
  out = []
  for snippet in snippets:
    out.extend(s.strip() for s in text_lib.split_sentences(snippet))
  return tuple(s for s in out if s)


def _existing_file(path: str, what: str) -> str:
  if not os.path.isfile(path):
    state = "is not a file" if os.path.exists(path) else "does not exist"
    raise MochegInputError(f"{what}: image file {path!r} {state}")
  return path


def gold_evidence(release: MochegRelease, split: str) -> list[ClaimEvidence]:
  """Every claim of `split` with its own evidence sentences and proof images.

  Raises:
    MochegInputError: a proof image file is missing, or a label is outside 0..2.
  """
  source = release.path(split, "Corpus2.csv")
  out = []
  for claim in release.claims(split):
    images = tuple(_existing_file(os.path.abspath(release.image_path(name)),
                                  f"{split} claim {claim.claim_id} proof image {name!r}")
                   for name in claim.proof_images)
    texts = evidence_sentences(claim.evidence)
    out.append(ClaimEvidence(claim.claim_id, claim.claim,
                             _check_label(claim.claim_id, claim.label, source),
                             texts, images, relevant_texts=texts, relevant_images=images))
  return out


def _kb_sentence_ids(release: MochegRelease, wanted: set[str]) -> set[str]:
  """The ids of `wanted` that the release's sentence-level KB holds (one streaming pass)."""
  found: set[str] = set()
  if not wanted:
    return found
  for sentence in release.iter_sentences():
    if sentence.corpus_id in wanted:
      found.add(sentence.corpus_id)
      if len(found) == len(wanted):
        break
  return found


def system_evidence(release: MochegRelease, split: str, result_csv: str | os.PathLike, *,
                    top_text: int = 5, top_images: int = 5,
                    check_text_ids: bool = True) -> list[ClaimEvidence]:
  """Every claim of `split` with the retrieval stage's top sentences and KB images.

  Args:
    release: the release the results were retrieved from.
    split: the claims to keep (in the release's order); the CSV may hold other claims too.
    result_csv: the retrieval result CSV (`retrieval.results.write_results`).
    top_text: sentences kept per claim, best first (0: none).
    top_images: KB images kept per claim, best first (0: none).
    check_text_ids: check the kept sentence ids against the release's sentence KB (one
      streaming pass over it; about 3 million rows at the release's size).

  Raises:
    MochegInputError: the CSV is unreadable or lacks a column; claims of the split are
      missing from it (how many, and one); a kept sentence id is not in the KB; a kept
      image is not a KB image name or its file does not exist; a label outside 0..2.
  """
  if top_text < 0 or top_images < 0:
    raise ValueError(f"top_text and top_images must be >= 0, got {top_text}, {top_images}")
  path = os.fspath(result_csv)
  results = results_lib.read_results(path)
  claims = release.claims(split)
  missing = [c.claim_id for c in claims if c.claim_id not in results]
  if missing:
    raise MochegInputError(
        f"{path}: {len(missing)} of the {len(claims)} {split} claims have no row (e.g. claim "
        f"{missing[0]}); the result CSV must cover the whole split")
  kept = {c.claim_id: results[c.claim_id] for c in claims}
  judged = _qrels_if_any(release, split, TEXT_QRELS, release.text_qrels)
  judged_images = _qrels_if_any(release, split, IMAGE_QRELS, release.image_qrels)
  if check_text_ids:
    wanted = {i for r in kept.values() for i in r.text_ids[:top_text]}
    unknown = wanted - _kb_sentence_ids(release, wanted)
    if unknown:
      example = min(unknown)
      claim_id = next(c for c, r in kept.items() if example in r.text_ids[:top_text])
      raise MochegInputError(
          f"{path}: {len(unknown)} retrieved sentence id(s) are not in the knowledge base of "
          f"{release.root} (e.g. {example!r} for claim {claim_id}); were the results "
          "retrieved from another release?")
  out = []
  for claim in claims:
    result = kept[claim.claim_id]
    paths, relevant_images = [], []
    for name in result.images[:top_images]:
      where = f"{path}: claim {claim.claim_id}, column image_evidence, image {name!r}"
      try:
        parsed = image_names.parse_image_name(name)
      except ValueError as e:
        raise MochegInputError(f"{where}: not a KB image name ({e})") from None
      if parsed.is_proof:
        raise MochegInputError(f"{where}: a proof image, not a KB image")
      paths.append(_existing_file(os.path.abspath(release.image_path(name)), where))
      if judged_images.get(claim.claim_id, {}).get(name, 0) > 0:
        relevant_images.append(paths[-1])
    out.append(ClaimEvidence(
        claim.claim_id, claim.claim,
        _check_label(claim.claim_id, claim.label, release.path(split, "Corpus2.csv")),
        tuple(t for t in (x.strip() for x in result.texts[:top_text]) if t),
        tuple(paths), _relevant_texts(claim, result, judged.get(claim.claim_id, {})),
        tuple(relevant_images)))
  return out


def _qrels_if_any(release: MochegRelease, split: str, name: str, read
                  ) -> dict[int, dict[str, int]]:
  """The split's qrels file `name` read by `read(split)`; {} when the release has none
  (they only train the item gates)."""
  return read(split) if os.path.isfile(release.path(split, name)) else {}


def _relevant_texts(claim: Claim, result: results_lib.RetrievedEvidence,
                    judged: dict[str, int]) -> tuple[str, ...]:
  """The claim's gold sentences, then the retrieved ones its qrels judge relevant."""
  gold = evidence_sentences(claim.evidence)
  retrieved = (t.strip() for i, t in zip(result.text_ids, result.texts)
               if judged.get(i, 0) > 0)
  return tuple(dict.fromkeys((*gold, *(t for t in retrieved if t))))


def restrict(evidence: Sequence[ClaimEvidence], *, text: bool = True,
             images: bool = True) -> list[ClaimEvidence]:
  """The evidence with a modality removed: text only, image only or none (claim only)."""
  return [dataclasses.replace(e, texts=e.texts if text else (),
                              images=e.images if images else ()) for e in evidence]


def store_inputs(*evidence: Sequence[ClaimEvidence]) -> tuple[list[str], list[str]]:
  """The texts (claims and text items) and image paths the feature store must hold for
  these evidence lists, each once, in first-seen order."""
  texts = dict.fromkeys(t for ev in evidence for e in ev for t in (e.claim, *e.texts))
  paths = dict.fromkeys(p for ev in evidence for e in ev for p in e.images)
  return list(texts), list(paths)
