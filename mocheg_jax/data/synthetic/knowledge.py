"""The world's facts: entities in families of look-alike names, their attributes, claims.

The world is planned in one pass from `rng_for(seed, "knowledge")`, split by split:

* a *family* is 3-5 entities whose names share a stem ("Brivelle", "Port Brivelle",
  "the Brivell River", "Anna Brivella"), at least two of one kind so that the same
  attribute of a look-alike entity exists as a hard negative;
* every entity has a true value for every attribute of its kind; an attribute is
  *documented* when the knowledge base states it (text facts in sentences, image-only
  facts in pictures) and undocumented otherwise;
* a claim asserts one (entity, attribute, value): supported claims assert the documented
  value, refuted ones another value of a documented attribute, NEI ones any value of an
  undocumented attribute (so nothing in the knowledge base can settle them);
* (entity, attribute) pairs that are claimed, and the facts NEI claims cite as their
  evidence, are *reserved*: only the owning claim's evidence articles mention them, so a
  sentence that talks about a claim's fact is always in that claim's qrels.

All claims of a family fall into one split, so test claims are about entities no training
claim is about (the knowledge base itself is shared by all splits, as in the release).
"""

from __future__ import annotations

import dataclasses
import random

from mocheg_jax.data import labels
from mocheg_jax.data.synthetic import lexicon
from mocheg_jax.data.synthetic import scales
from mocheg_jax.data.synthetic import values as values_lib
from mocheg_jax.data.synthetic.attributes import KINDS, TEXT_BY_KIND, VISUAL_BY_KIND, Attribute
from mocheg_jax.data.synthetic.rng import rng_for, weighted_choice
from mocheg_jax.data.synthetic.values import Value

# Raw site ratings written in `Truthfulness`, per class, with how often each is used. Every
# key is in `labels.RATING_TABLE` (checked below), so `label_from_rating` maps them back.
RATING_CHOICES: dict[int, tuple[tuple[str, float], ...]] = {
    labels.SUPPORTED: (("true", 0.62), ("mostly true", 0.25), ("correct attribution", 0.08),
                       ("legit", 0.05)),
    labels.REFUTED: (("false", 0.55), ("mostly false", 0.2), ("miscaptioned", 0.07),
                     ("misattributed", 0.05), ("labeled satire", 0.05), ("fake", 0.05),
                     ("scam", 0.03)),
    labels.NEI: (("mixture", 0.35), ("unproven", 0.3), ("unfounded", 0.15),
                 ("outdated", 0.1), ("research in progress", 0.1)),
}
for _label, _choices in RATING_CHOICES.items():
  for _key, _ in _choices:
    assert labels.RATING_TABLE[_key] == _label, _key
DOCUMENTED_PROBABILITY = 0.7  # for attributes no claim is about


@dataclasses.dataclass(eq=False)
class Entity:
  eid: int
  kind: str
  name: str                          # as written mid-sentence ("the Brivell River")
  family: int
  region: str
  values: dict[str, Value]           # attribute key -> true value
  documented: set[str] = dataclasses.field(default_factory=set)


@dataclasses.dataclass(eq=False)
class Claim:
  claim_id: int
  split: str
  label: int
  entity: Entity
  attribute: Attribute
  value: Value                       # what the claim asserts
  n_text_evidence: int
  n_proof_images: int
  siblings: tuple[str, ...]          # NEI: documented text attributes cited as evidence
  rating: str                        # raw `Truthfulness`, e.g. "Status: Mostly False."
  rating_name: str                   # the rating in headline case ("Mostly False")
  empty_ruling: bool                 # `ruling_outline` left empty (explanation in Origin)

  @property
  def true_value(self) -> Value:
    return self.entity.values[self.attribute.key]


@dataclasses.dataclass
class Knowledge:
  entities: list[Entity]
  families: list[list[Entity]]
  claims: list[Claim]                # sorted by claim_id
  reserved: set[tuple[int, str]]     # (eid, attribute key) only evidence may mention
  # Look-ups derived from the fields above, filled on first use once planning is done.
  cache: dict = dataclasses.field(default_factory=dict, repr=False)

  def is_free(self, entity: Entity, key: str) -> bool:
    return (entity.eid, key) not in self.reserved


class _Names:
  """Hands out globally unique names."""

  def __init__(self) -> None:
    self.used: set[str] = set()

  def take(self, name: str) -> bool:
    if name in self.used or not lexicon.acceptable_name(name):
      return False
    self.used.add(name)
    return True


def _make_family(rng: random.Random, names: _Names, family_id: int,
                 first_eid: int) -> list[Entity]:
  """3-5 entities sharing a name stem; at least two share a kind."""
  while True:
    stem = rng.choice(lexicon.ONSETS) + rng.choice(lexicon.MIDDLES)
    bases = [stem + ending for ending in rng.choice(lexicon.ENDING_GROUPS)]
    if all(b not in names.used and lexicon.acceptable_name(b) for b in bases):
      break
  region = lexicon.region_name(rng)
  main = rng.choice(KINDS)
  kinds = [main, main] + [rng.choice(KINDS) for _ in range(rng.randint(1, 3))]
  entities = []
  for kind in kinds:
    for _ in range(20):
      base = rng.choice(bases)
      if kind == "town":
        name = rng.choice(lexicon.TOWN_PATTERNS).format(b=base)
      elif kind == "river":
        name = rng.choice(lexicon.RIVER_PATTERNS).format(b=base)
      elif kind == "company":
        name = rng.choice(lexicon.COMPANY_PATTERNS).format(b=base)
      else:
        name = lexicon.person_name(rng, surname=base)
      if names.take(name):
        break
    else:
      continue  # This stem has no free name of this kind left; the family is smaller.
    vals = {a.key: values_lib.sample(rng, a.values)
            for a in TEXT_BY_KIND[kind] + VISUAL_BY_KIND[kind]}
    entities.append(Entity(first_eid + len(entities), kind, name, family_id, region, vals))
  for b in bases:
    names.used.add(b)  # Reserve the stems themselves so no other family reuses them.
  return entities


def _rating(rng: random.Random, label: int) -> tuple[str, str]:
  """A raw rating in one of the site's spellings, and its headline-case name."""
  key = weighted_choice(rng, RATING_CHOICES[label])
  name = values_lib.title(key)
  style = rng.random()
  if style < 0.55:
    raw = name
  elif style < 0.7:
    raw = key.upper()
  elif style < 0.85:
    raw = f"Status: {name}."
  else:
    raw = f"Rating: {name}"
  return raw, name


def _label_quota(rng: random.Random, split: str, n: int) -> list[int]:
  """Exactly round(n * fraction) claims of each class (rest to the largest), shuffled."""
  fractions = scales.label_fractions(split)
  counts = [int(round(n * f)) for f in fractions]
  counts[counts.index(max(counts))] += n - sum(counts)
  quota = [label for label, c in enumerate(counts) for _ in range(c)]
  rng.shuffle(quota)
  return quota


def _text_evidence_count(rng: random.Random, split: str) -> int:
  """0 with probability `no_text_evidence_fraction`, else 1 + Binomial(6, p): the mean
  matches the release's text evidence per claim for the split."""
  p0 = scales.SHAPE.no_text_evidence_fraction
  if rng.random() < p0:
    return 0
  p = (scales.text_evidence_per_claim(split) / (1 - p0) - 1) / 6
  return 1 + sum(rng.random() < p for _ in range(6))


def _proof_probability(split: str, nei_fraction: float) -> float:
  """P(proof image) of a refuted/supported text-fact claim, so that the split's mean proof
  images per claim matches the release (image-only-fact claims always have 1-2)."""
  shape = scales.SHAPE
  sr = 1 - nei_fraction
  visual = shape.visual_claim_fraction * sr * (1 + shape.second_visual_proof_probability)
  rest = (scales.image_evidence_per_claim(split) - visual
          - nei_fraction * shape.nei_proof_probability)
  return min(1.0, max(0.0, rest / ((1 - shape.visual_claim_fraction) * sr)))


def build_knowledge(scale: scales.Scale, seed: int) -> Knowledge:
  """Plans every entity and claim of the world (small: no text or images yet)."""
  rng = rng_for(seed, "knowledge")
  shape = scales.SHAPE
  names = _Names()
  entities: list[Entity] = []
  families: list[list[Entity]] = []
  claims: list[Claim] = []
  claimed: set[tuple[int, str]] = set()
  for split in scales.SPLITS:
    n = scale.claims_in(split)
    quota = _label_quota(rng, split, n)
    p_text_proof = _proof_probability(split, scales.label_fractions(split)[labels.NEI])
    while quota:
      family = _make_family(rng, names, len(families), len(entities))
      families.append(family)
      entities.extend(family)
      family_claims = []
      for _ in range(min(len(quota), rng.choice((1, 2, 2, 3, 3, 4)))):
        entity = rng.choice(family)
        visual = rng.random() < shape.visual_claim_fraction
        pool = VISUAL_BY_KIND[entity.kind] if visual else TEXT_BY_KIND[entity.kind]
        free = [a for a in pool if (entity.eid, a.key) not in claimed]
        if not free:
          continue
        attribute = rng.choice(free)
        claimed.add((entity.eid, attribute.key))
        label = quota.pop()
        family_claims.append((entity, attribute, label))
        if label != labels.NEI:
          entity.documented.add(attribute.key)
      # Attributes no claim is about are documented at random; claimed NEI ones never.
      nei_pairs = {(e.eid, a.key) for e, a, l in family_claims if l == labels.NEI}
      for e in family:
        for key in e.values:
          if ((e.eid, key) not in nei_pairs and (e.eid, key) not in claimed
              and rng.random() < DOCUMENTED_PROBABILITY):
            e.documented.add(key)
      for entity, attribute, label in family_claims:
        claims.append(_make_claim(rng, split, entity, attribute, label, claimed,
                                  p_text_proof))
  reserved = set(claimed)
  for claim in claims:
    reserved.update((claim.entity.eid, key) for key in claim.siblings)
  ids = list(range(1, len(claims) + 1))
  rng.shuffle(ids)  # Claim ids interleave the splits, as in the release.
  for claim, cid in zip(claims, ids):
    claim.claim_id = cid
  claims.sort(key=lambda c: c.claim_id)
  return Knowledge(entities, families, claims, reserved)


def _make_claim(rng: random.Random, split: str, entity: Entity, attribute: Attribute,
                label: int, claimed: set[tuple[int, str]], p_text_proof: float) -> Claim:
  shape = scales.SHAPE
  true = entity.values[attribute.key]
  if label == labels.SUPPORTED:
    value = true
  elif label == labels.REFUTED:
    value = values_lib.alternative(rng, attribute.values, true)
  else:
    value = values_lib.sample(rng, attribute.values)
  n_text = _text_evidence_count(rng, split)
  siblings: tuple[str, ...] = ()
  if label == labels.NEI:
    # Evidence of an NEI claim: sentences on the entity's other, documented text facts.
    free = [a.key for a in TEXT_BY_KIND[entity.kind]
            if (entity.eid, a.key) not in claimed and a.key != attribute.key]
    documented = [k for k in free if k in entity.documented]
    if not documented and free:
      documented = [rng.choice(free)]
      entity.documented.add(documented[0])
    rng.shuffle(documented)
    siblings = tuple(documented[:rng.choice((1, 1, 2))])
    claimed.update((entity.eid, k) for k in siblings)
    n_proof = int(rng.random() < shape.nei_proof_probability)
  elif attribute.visual:
    n_proof = 1 + int(rng.random() < shape.second_visual_proof_probability)
  else:
    n_text = max(1, n_text)  # A text fact needs its value sentence to be verifiable.
    n_proof = int(rng.random() < p_text_proof)
  rating, rating_name = _rating(rng, label)
  return Claim(
      claim_id=0, split=split, label=label, entity=entity, attribute=attribute, value=value,
      n_text_evidence=n_text, n_proof_images=n_proof, siblings=siblings, rating=rating,
      rating_name=rating_name, empty_ruling=rng.random() < shape.empty_ruling_fraction)

