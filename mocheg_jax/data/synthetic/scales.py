"""Size presets of the synthetic world and the release statistics it imitates.

A `Scale` fixes how many claims each split has and how large the knowledge base (KB) around
them is. Everything else (label balance, evidence per claim, the fraction of articles and
images that hold evidence) follows the published Mocheg release at every scale, so a tiny
world has the same shape as a full-size one, only smaller.
"""

from __future__ import annotations

import dataclasses

SPLITS: tuple[str, ...] = ("train", "val", "test")

# Published release: claims per split and refuted / supported / NEI counts.
RELEASE_CLAIMS: dict[str, int] = {"train": 11_669, "val": 1_490, "test": 2_442}
RELEASE_LABEL_COUNTS: dict[str, tuple[int, int, int]] = {
    "train": (4_542, 3_826, 3_301), "val": (488, 501, 501), "test": (825, 817, 800)}
# Text evidence paragraphs and proof images per claim in each split of the release.
RELEASE_TEXT_EVIDENCE: dict[str, int] = {"train": 23_545, "val": 4_067, "test": 6_268}
RELEASE_IMAGE_EVIDENCE: dict[str, int] = {"train": 8_927, "val": 1_178, "test": 2_007}
RELEASE_ARTICLES = 91_822
RELEASE_SENTENCES = 2_792_639
RELEASE_KB_IMAGES = 122_246


@dataclasses.dataclass(frozen=True)
class Shape:
  """Release-like proportions shared by all scales."""
  # Fraction of KB articles that hold evidence for some claim (the paper: 30%).
  evidence_article_fraction: float = 0.30
  # Fraction of KB images that are junk the paper's cleaning rules drop (ads, logos,
  # thumbnails); about half are caught by name and half by size.
  junk_image_fraction: float = 0.12
  # Fraction of claims about a fact that only images show (flag colour, tower count...).
  visual_claim_fraction: float = 0.35
  # Fraction of claims whose `ruling_outline` is empty (explanation only in `Origin`).
  empty_ruling_fraction: float = 0.05
  # Fraction of claims without any text evidence (a single row with empty `Evidence`).
  no_text_evidence_fraction: float = 0.07
  # Probability that an NEI claim has a proof image (a picture of the entity). Refuted and
  # supported claims about text facts get one (a sign stating the value) with the
  # probability that makes the split's proof images per claim match the release.
  nei_proof_probability: float = 0.35
  # Probability that a claim about an image-only fact has a second proof image.
  second_visual_proof_probability: float = 0.5


SHAPE = Shape()


@dataclasses.dataclass(frozen=True)
class Scale:
  """One size preset.

  Attributes:
    name: preset name.
    claims: claims per split, in `SPLITS` order.
    docs_per_claim: (min, max, mean) KB articles attached to each claim.
    sentences_per_doc: (min, max, mean) sentences per KB article.
    kb_images_per_claim: mean KB images (including junk and evidence) per claim.
  """
  name: str
  claims: tuple[int, int, int]
  docs_per_claim: tuple[int, int, float]
  sentences_per_doc: tuple[int, int, float]
  kb_images_per_claim: float

  def claims_in(self, split: str) -> int:
    return self.claims[SPLITS.index(split)]

  @property
  def total_claims(self) -> int:
    return sum(self.claims)


_DOCS_MEAN = RELEASE_ARTICLES / sum(RELEASE_CLAIMS.values())        # ~5.89
_SENTENCES_MEAN = RELEASE_SENTENCES / RELEASE_ARTICLES               # ~30.4
_IMAGES_MEAN = RELEASE_KB_IMAGES / sum(RELEASE_CLAIMS.values())      # ~7.84

SCALES: dict[str, Scale] = {
    # Every test uses this one: the whole world in a few seconds.
    "tiny": Scale("tiny", (75, 10, 15), (3, 9, _DOCS_MEAN), (6, 10, 8.0), _IMAGES_MEAN),
    # The demo: about 1,500 claims. Articles are shorter than the release's (6 sentences,
    # not 30) so that a 2-core CPU encodes the whole KB with MiniLM in about 2 minutes.
    "small": Scale("small", (1_122, 143, 235), (2, 10, _DOCS_MEAN), (4, 10, 6.0),
                   _IMAGES_MEAN),
    # The release's sizes.
    "paper": Scale("paper", tuple(RELEASE_CLAIMS[s] for s in SPLITS), (2, 10, _DOCS_MEAN),
                   (12, 49, _SENTENCES_MEAN), _IMAGES_MEAN),
}


def get_scale(name: str) -> Scale:
  """The preset called `name`; raises ValueError listing the known presets."""
  if name not in SCALES:
    raise ValueError(f"unknown scale {name!r}; expected one of {sorted(SCALES)}")
  return SCALES[name]


def label_fractions(split: str) -> tuple[float, float, float]:
  """refuted / supported / NEI fractions of the release's split."""
  counts = RELEASE_LABEL_COUNTS[split]
  return tuple(c / sum(counts) for c in counts)  # type: ignore[return-value]


def text_evidence_per_claim(split: str) -> float:
  return RELEASE_TEXT_EVIDENCE[split] / RELEASE_CLAIMS[split]


def image_evidence_per_claim(split: str) -> float:
  return RELEASE_IMAGE_EVIDENCE[split] / RELEASE_CLAIMS[split]
