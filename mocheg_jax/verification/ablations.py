"""What a verifier reads: its scores with parts of each claim's evidence taken away.

Each ablation maps a claim's evidence to less of it: without its images, without its text
items and, for system evidence (a retrieval result CSV), with only the retrieved items the
qrels judge relevant: an oracle of perfect filtering, not a method. The same model scores
every variant, so the differences say which part of the evidence helps it and which misleads
it. On the small world the system-trained verifier gets 56 of 77 NEI test claims right as
retrieved and 71 without their images (README, Table 4 notes).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple, Sequence

import numpy as np

from mocheg_jax.data.labels import LABEL_NAMES
from mocheg_jax.metrics.classification import classification_report
from mocheg_jax.verification.evidence import ClaimEvidence

AS_GIVEN = "as given"


def _relevant(items: tuple[str, ...], relevant: tuple[str, ...]) -> tuple[str, ...]:
  keep = set(relevant)
  return tuple(item for item in items if item in keep)


def _relevant_texts(c: ClaimEvidence) -> ClaimEvidence:
  return dataclasses.replace(c, texts=_relevant(c.texts, c.relevant_texts))


def _relevant_images(c: ClaimEvidence) -> ClaimEvidence:
  return dataclasses.replace(c, images=_relevant(c.images, c.relevant_images))


class Ablation(NamedTuple):
  changes: tuple[str, ...]  # The modalities it takes something from ("text", "image").
  needs_system: bool  # Only for system evidence (gold evidence is all relevant).
  apply: Callable[[ClaimEvidence], ClaimEvidence]


ABLATIONS: dict[str, Ablation] = {
    AS_GIVEN: Ablation((), False, lambda c: c),
    "no images": Ablation(("image",), False, lambda c: dataclasses.replace(c, images=())),
    "no text": Ablation(("text",), False, lambda c: dataclasses.replace(c, texts=())),
    "relevant images only": Ablation(("image",), True, _relevant_images),
    "relevant text only": Ablation(("text",), True, _relevant_texts),
    "relevant text and images only": Ablation(("text", "image"), True,
                                              lambda c: _relevant_images(_relevant_texts(c))),
}


def applicable(use_text: bool, use_image: bool, system: bool) -> list[str]:
  """The ablations that change what a model reading those modalities sees: none of a
  modality it does not read, and the relevance oracles only for system evidence (gold
  evidence is all relevant)."""
  reads = {"text": use_text, "image": use_image}
  return [name for name, a in ABLATIONS.items()
          if all(reads[m] for m in a.changes) and (system or not a.needs_system)]


def score_ablations(predict: Callable[[Sequence[ClaimEvidence]], np.ndarray],
                    claims: Sequence[ClaimEvidence], names: Sequence[str],
                    given: np.ndarray | None = None) -> list[dict]:
  """One row per ablation: macro and micro F1, per gold label how many claims are right,
  and the confusion matrix (rows gold, columns predicted). `predict` maps claims to class
  probabilities [N, 3]; `given`: those of the claims as given, when already predicted."""
  gold = np.asarray([c.label for c in claims])
  rows = []
  for name in names:
    if name == AS_GIVEN and given is not None:
      probabilities = given
    else:
      probabilities = predict([ABLATIONS[name].apply(c) for c in claims])
    report = classification_report(gold, np.asarray(probabilities).argmax(-1))
    confusion = report["confusion_matrix"]
    rows.append({"ablation": name, "macro_f1": report["macro_f1"],
                 "micro_f1": report["micro_f1"],
                 **{f"right/{label}": int(confusion[k][k])
                    for k, label in enumerate(LABEL_NAMES)},
                 **{f"claims/{label}": int(sum(confusion[k]))
                    for k, label in enumerate(LABEL_NAMES)},
                 "confusion_matrix": confusion})
  return rows


def markdown(rows: Sequence[dict]) -> str:
  """The rows as a Markdown table (F1 in percent, right / claims per gold label)."""
  lines = ["| Evidence | Macro F1 | Micro F1 | " +
           " | ".join(f"{label} right" for label in LABEL_NAMES) + " |",
           "|---|---:|---:|" + "---:|" * len(LABEL_NAMES)]
  for r in rows:
    lines.append(f"| {r['ablation']} | {100 * r['macro_f1']:.2f} | {100 * r['micro_f1']:.2f} | "
                 + " | ".join(f"{r[f'right/{label}']} / {r[f'claims/{label}']}"
                              for label in LABEL_NAMES) + " |")
  return "\n".join(lines)
