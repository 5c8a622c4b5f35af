"""Dataset statistics in the rows of the release table of MOCHEG_FORMAT.md."""

from __future__ import annotations

import dataclasses

from mocheg_jax.data import labels
from mocheg_jax.data import text as text_lib
from mocheg_jax.data.mocheg import SPLITS, Claim, MochegRelease


@dataclasses.dataclass
class SplitStats:
  claims: int
  text_evidence: int
  image_evidence: int
  label_counts: tuple[int, int, int]
  claim_tokens: tuple[float, int]  # (mean, max)
  explanation_tokens: tuple[float, int]
  missing_explanation: int


@dataclasses.dataclass
class KBStats:
  articles: int
  sentences: int
  images: int  # Non-proof images in the KB folder.
  images_kept: int  # After the paper's cleaning rules.
  articles_with_evidence: int
  images_with_evidence: int


def _mean_max(values: list[int]) -> tuple[float, int]:
  return (sum(values) / len(values), max(values)) if values else (0.0, 0)


def split_stats(claims: list[Claim]) -> SplitStats:
  counts = [0] * labels.NUM_CLASSES
  for c in claims:
    counts[c.label] += 1
  explained = [c for c in claims if c.explanation]
  return SplitStats(
      claims=len(claims),
      text_evidence=sum(len(c.evidence) for c in claims),
      image_evidence=sum(len(c.proof_images) for c in claims),
      label_counts=tuple(counts),
      claim_tokens=_mean_max([text_lib.word_count(c.claim) for c in claims]),
      explanation_tokens=_mean_max([text_lib.word_count(c.explanation) for c in explained]),
      missing_explanation=len(claims) - len(explained))


def kb_stats(release: MochegRelease) -> KBStats:
  """One streaming pass over the articles and sentences, plus the image folder."""
  qrel_docs: set[tuple[int, int]] = set()
  relevant_images: set[str] = set()
  for split in SPLITS:
    for claim_id, docs in release.text_qrels(split).items():
      for doc, rel in docs.items():
        if rel == 1:
          parts = doc.split("-")
          if len(parts) == 3 and all(p.isdigit() for p in parts):
            qrel_docs.add((int(parts[0]), int(parts[1])))
    for docs in release.image_qrels(split).values():
      relevant_images.update(d for d, rel in docs.items() if rel == 1)
  articles = sum(1 for _ in release.iter_articles())
  sentences = sum(1 for _ in release.iter_sentences())
  all_images = release.kb_images(clean=False)
  kept = release.kb_images(clean=True)
  return KBStats(articles=articles, sentences=sentences, images=len(all_images),
                 images_kept=len(kept), articles_with_evidence=len(qrel_docs),
                 images_with_evidence=len(relevant_images & set(all_images)))


def release_table(per_split: dict[str, SplitStats]) -> str:
  """A markdown table with the release table's rows, one column per split."""
  splits = list(per_split)
  rows = [
      ("claims", lambda s: f"{s.claims:,}"),
      ("text evidence paragraphs", lambda s: f"{s.text_evidence:,}"),
      ("image evidence", lambda s: f"{s.image_evidence:,}"),
      ("refuted / supported / NEI", lambda s: " / ".join(f"{n:,}" for n in s.label_counts)),
      ("mean / max claim tokens",
       lambda s: f"{s.claim_tokens[0]:.0f} / {s.claim_tokens[1]}"),
      ("mean / max explanation tokens",
       lambda s: f"{s.explanation_tokens[0]:.0f} / {s.explanation_tokens[1]}"),
  ]
  lines = ["| | " + " | ".join(splits) + " |", "|---" * (len(splits) + 1) + "|"]
  for name, cell in rows:
    lines.append(f"| {name} | " + " | ".join(cell(per_split[s]) for s in splits) + " |")
  return "\n".join(lines)


def kb_line(kb: KBStats) -> str:
  pct = lambda a, b: 100.0 * a / b if b else 0.0  # noqa: E731
  return (f"KB: {kb.articles:,} articles ({kb.sentences:,} sentences) and {kb.images:,} "
          f"images ({kb.images_kept:,} kept by the cleaning rules); "
          f"{pct(kb.articles_with_evidence, kb.articles):.0f}% of articles and "
          f"{pct(kb.images_with_evidence, kb.images):.0f}% of images hold evidence.")
