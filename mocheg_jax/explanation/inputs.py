"""What the explanation generator reads per claim: a label source and an evidence source.

The generator's source is "{label} </s> {claim} </s> {evidence}" (generator_task). Table 5
varies where the label and the evidence come from:

* labels: "gold" (the release's label) or a verifier's prediction CSV
  (`claim_id,label,p_refuted,p_supported,p_nei`, scripts/verify.py; the system labels).
* evidence: "gold" (the claim's own text evidence snippets) or a retrieval result CSV
  (retrieval/results.py; the top `top_text` retrieved sentences, best first, as
  verification's system evidence reads them).

The rules for awkward input, each counted in `ExplainInputs` and reported:

* a split claim without a row in the prediction CSV: skipped (no explanation is generated
  for it; Table 5 scores it as a missing prediction). A row for a claim that is not in the
  split, an unknown label name or a bad probability is an error naming file, row, column.
* a claim without evidence (no gold snippet, or nothing retrieved): generated from the label
  and the claim alone ("{label} </s> {claim} </s> "), counted in `no_evidence`.
* a claim without a gold ruling outline: generated like any other (generation does not need
  it), counted in `no_reference`; scoring skips it.
* a source longer than `explain.max_source_len` tokens: the evidence is cut (or the start,
  with `explain.left_truncation`), counted by `count_truncated`.
* a claim missing from the retrieval result CSV: an error (the CSV must cover the split, as
  for verification).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Sequence

from mocheg_jax.data import pipelines
from mocheg_jax.data.labels import LABEL_NAMES
from mocheg_jax.data.mocheg import CLAIMS_FILE, Claim, MochegRelease
from mocheg_jax.data.report import MochegInputError
from mocheg_jax.verification import evidence as evidence_lib
from mocheg_jax.verification import predictions as predictions_lib

GOLD = "gold"
SYSTEM = "system"
TOP_TEXT = 5  # Retrieved sentences kept per claim (verification's system evidence too).


@dataclasses.dataclass(frozen=True)
class ExplainInputs:
  """A split's claims as the generator reads them, with what was skipped or is missing.

  Attributes:
    claims: the claims to explain, in the release's order; `label` is the label the
      generator is given (gold or predicted) and `evidence` the evidence it reads.
    gold_labels: the release's label of each of `claims`.
    labels: "gold" or the prediction CSV's path.
    evidence: "gold" or the retrieval result CSV's path.
    split_claims: how many claims the split has.
    missing_label: split claims without a row in the prediction CSV (skipped).
    no_evidence: claims of `claims` without any evidence text.
    no_reference: claims of `claims` without a gold explanation.
  """
  claims: tuple[Claim, ...]
  gold_labels: tuple[int, ...]
  labels: str
  evidence: str
  split_claims: int
  missing_label: int = 0
  no_evidence: int = 0
  no_reference: int = 0

  @property
  def intended_labels(self) -> tuple[int, ...]:
    """The labels the generator is asked to argue for."""
    return tuple(c.label for c in self.claims)

  def counts(self) -> dict[str, int]:
    return {"split_claims": self.split_claims, "claims": len(self.claims),
            "missing_label": self.missing_label, "no_evidence": self.no_evidence,
            "no_reference": self.no_reference}

  def summary(self) -> str:
    """One line for the log."""
    parts = [f"{len(self.claims)} of {self.split_claims} claims"]
    if self.missing_label:
      parts.append(f"{self.missing_label} skipped (no row in {self.labels})")
    parts.append(f"{self.no_evidence} without evidence (label and claim only)")
    parts.append(f"{self.no_reference} without a gold explanation")
    return "; ".join(parts)


def source_name(source: str) -> str:
  """How a table names a label or evidence source: "gold" or "system"."""
  return GOLD if source == GOLD else SYSTEM


def _system_labels(path: str, claims: Sequence[Claim], split: str, release: MochegRelease
                   ) -> dict[int, int]:
  """claim id -> predicted label from a prediction CSV, whose ids must all be in `split`."""
  predictions = predictions_lib.read_predictions(path)
  known = {c.claim_id for c in claims}
  unknown = [i for i in predictions if i not in known]
  if unknown:
    raise MochegInputError(
        f"{path}: {len(unknown)} row(s) name claim ids that are not {split} claims of "
        f"{release.root} (e.g. claim_id {unknown[0]}); was it predicted for another split "
        "or release?")
  return {i: p.label for i, p in predictions.items()}


def _system_evidence(path: str, release: MochegRelease, split: str, top_text: int
                     ) -> dict[int, tuple[str, ...]]:
  """claim id -> its top retrieved sentences (every split claim must have a row)."""
  retrieved = evidence_lib.system_evidence(release, split, path, top_text=top_text,
                                           top_images=0)
  return {c.claim_id: c.texts for c in retrieved}


def build_inputs(release: MochegRelease | str, split: str, *, labels: str = GOLD,
                 evidence: str = GOLD, top_text: int = TOP_TEXT) -> ExplainInputs:
  """The generator's inputs for every claim of `split`.

  Args:
    release: the release (or its folder).
    split: "train", "val" or "test".
    labels: "gold" or a verifier's prediction CSV.
    evidence: "gold" or a retrieval result CSV.
    top_text: retrieved sentences kept per claim with a result CSV.

  Raises:
    MochegInputError: an unreadable or inconsistent CSV (named by file, row and column), a
      prediction for a claim outside the split, a result CSV missing split claims or naming
      sentences the KB lacks, or a split without claims.
  """
  if not isinstance(release, MochegRelease):
    release = MochegRelease(os.fspath(release))
  claims = release.claims(split)
  if not claims:
    raise MochegInputError(f"{release.path(split, CLAIMS_FILE)}: no {split} claims to explain")
  system_labels = None if labels == GOLD else _system_labels(labels, claims, split, release)
  system_texts = (None if evidence == GOLD
                  else _system_evidence(evidence, release, split, top_text))
  kept, gold_labels = [], []
  missing = no_evidence = no_reference = 0
  for claim in claims:
    label = claim.label
    if system_labels is not None:
      if claim.claim_id not in system_labels:
        missing += 1
        continue
      label = system_labels[claim.claim_id]
    texts = claim.evidence if system_texts is None else system_texts[claim.claim_id]
    texts = tuple(t.strip() for t in texts if t.strip())
    no_evidence += not texts
    no_reference += not claim.explanation.strip()
    kept.append(dataclasses.replace(claim, label=label, evidence=texts))
    gold_labels.append(claim.label)
  return ExplainInputs(tuple(kept), tuple(gold_labels), labels, evidence, len(claims),
                       missing, no_evidence, no_reference)


def count_truncated(tokenizer, claims: Sequence[Claim], max_source_len: int) -> int:
  """How many claims' sources exceed `max_source_len` tokens (and so lose some)."""
  longest = 1 << 30  # No cut: the full source's length.
  return sum(1 for c in claims if len(pipelines.explanation_source_ids(
      tokenizer, LABEL_NAMES[c.label], c.claim, " ".join(c.evidence), longest)) >
             max_source_len)
