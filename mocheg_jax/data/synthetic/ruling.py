"""The claim-side fields of `Corpus2.csv`: claim text, headline, ruling article, explanation.

The explanation (`ruling_outline`) restates the claim, says what the evidence shows (the
value found, or that nothing was found), adds context and ends with the verdict, in varied
templates and connectives (typically 40-150 words). The ruling article (`Origin`) quotes
the evidence and always contains the explanation in its ruling paragraph, in one of two
forms a reader must handle:
* `<p>Our ruling</p>` heading, then `<p>{explanation}</p>` (then a "Sources" heading);
* `<p>In sum, {explanation}</p>` with the explanation's first letter lower-cased (its
  templates open with a common word, so that stays correct English).
For `empty_ruling` claims `ruling_outline` is empty and only `Origin` has the explanation.
"""

from __future__ import annotations

import dataclasses
import random

from mocheg_jax.data import labels
from mocheg_jax.data.synthetic import lexicon
from mocheg_jax.data.synthetic.attributes import ATTRIBUTES, TEXT_BY_KIND
from mocheg_jax.data.synthetic.knowledge import Claim, Knowledge
from mocheg_jax.data.synthetic.rng import rng_for
from mocheg_jax.data.synthetic.sentences import SentenceMaker, cap, fill
from mocheg_jax.data.synthetic.values import Value, title, with_article

CORPUS2_COLUMNS: tuple[str, ...] = (
    "claim_id", "Snopes URL", "Category", "Headline", "Description", "Source", "Claim",
    "Truthfulness", "Evidence", "evidence_id", "Origin", "cleaned_truthfulness",
    "ruling_outline")

_CLAIM_FRAMES = (
    "{E} {p}.", "{E}, {d}, {p}.", "{E} {p}, according to a viral post.",
    "A viral image claims that {E} {p}.", "{E} {p}, a widely shared post said.",
    "Social media users shared the claim that {E} {p}.", "Posts online say that {E} {p}.",
    "A post shared on {social} claimed that {E}, {d}, {p}.",
    "{E} {p}, and people in {region} have known it for years.",
    "In a viral {social} post, users claimed that {E} {p}, citing an old newspaper clipping.",
    "{E}, {d}, {p}, according to a message forwarded thousands of times.")
_DESCRIPTIONS = {
    "town": "a town in {region}", "person": "a public figure from {region}",
    "company": "a firm from {region}", "river": "a river in {region}"}
_CATEGORIES = {
    "town": ("Travel", "Local News", "History"), "person": ("People", "Politics"),
    "company": ("Business", "Economy"), "river": ("Environment", "Nature")}
_DESCRIPTION_FRAMES = (
    "Social media posts claimed that {E} {p}.", "A viral rumour holds that {E} {p}.",
    "An old rumour resurfaced claiming that {E} {p}.")
# Explanation parts. Every opening starts with a common word (see the module docstring).
_OPENINGS = (
    "A post on {social} claimed that {E} {p}.", "The claim that {E} {p} spread widely on {social}.",
    "According to posts shared on {social}, {E} {p}.",
    "Posts circulating on {social} said that {E} {p}.")
_SUPPORTED_TEXT = (
    "{Src} reports that {E} {fact}, which matches the claim.",
    "Records from {src} confirm that {E} {fact}.",
    "That is accurate: according to {src}, {E} {fact}.",
    "Indeed, {src} states that {E} {fact}, exactly as the post said.")
_REFUTED_TEXT = (
    "However, {src} reports that {E} {fact}, not {v} as the post said.",
    "In fact, according to {src}, {E} {fact}; what the post said, {v}, does not hold up.",
    "Records from {src} show that {E} {fact} rather than {v}.",
    "That is wrong: {src} states that {E} {fact}, so {v} is incorrect.")
_SUPPORTED_VISUAL = (
    "A photograph published by {src} shows that {seen}, just as the post said.",
    "Pictures published by {src} confirm that {seen}.",
    "Images shared by {src} make clear that {seen}, which matches the claim.")
_REFUTED_VISUAL = (
    "However, photographs published by {src} show that {seen}, while the post said {claimed}.",
    "Images published by {src} make clear that {seen}; the post was wrong to say {claimed}.",
    "In fact, a photograph from {src} shows that {seen}, so it is not true that {claimed}.")
_NEI_FINDINGS = (
    "We could not find any reliable record of {noun}.",
    "None of the sources we consulted says anything about {noun}.",
    "There is no public information about {noun}.")
_NEI_SIBLING = (
    "The available reports only describe other facts: {E} {fact}.",
    "What is on record is something else entirely, namely that {E} {fact}.",
    "Sources do confirm that {E} {fact}, but that says nothing about the claim.")
_NEI_CLOSING = (
    "Without such a record, the claim that {E} {p} can be neither confirmed nor ruled out.",
    "Until someone publishes that information, the claim remains open.")
_CONTEXT = (
    "The post was shared thousands of times before it was flagged.",
    "We contacted officials in {region} but did not receive a reply.",
    "For context, {E} is {d}.", "Similar posts have appeared on {social} before.",
    "Readers asked us to look into the claim after it went viral.")
_VERDICTS = (
    "We therefore rate this claim {rating}.", "For these reasons, we rate the claim {rating}.",
    "The claim is rated {rating}.", "Based on this evidence, the rating is {rating}.",
    "Accordingly, we rate it {rating}.")


@dataclasses.dataclass
class ClaimFields:
  """Everything in a claim's Corpus2 rows except the per-snippet Evidence/evidence_id."""
  claim_id: int
  snopes_url: str
  category: str
  headline: str
  description: str
  source: str
  claim: str
  truthfulness: str
  origin: str
  cleaned_truthfulness: str
  ruling_outline: str
  explanation: str          # the explanation even when `ruling_outline` is left empty

  def row(self, evidence: str, evidence_id: str) -> list[str | int]:
    return [self.claim_id, self.snopes_url, self.category, self.headline, self.description,
            self.source, self.claim, self.truthfulness, evidence, evidence_id, self.origin,
            self.cleaned_truthfulness, self.ruling_outline]


def _predicate(rng: random.Random, claim: Claim, value: Value | None = None) -> str:
  return fill(rng.choice(claim.attribute.claim), claim.entity.name,
              claim.value if value is None else value)


def _fact(rng: random.Random, name: str, key: str, value: Value) -> str:
  return fill(rng.choice(ATTRIBUTES[key].fact), name, value)


def claim_fields(claim: Claim, knowledge: Knowledge, evidence: list[str],
                 seed: int) -> ClaimFields:
  """The claim's fields; `evidence` are its text evidence sentences (for the article)."""
  rng = rng_for(seed, "ruling", claim.claim_id)
  entity, attribute = claim.entity, claim.attribute
  name = entity.name
  descr = _DESCRIPTIONS[entity.kind].format(region=entity.region)
  claim_text = cap(rng.choice(_CLAIM_FRAMES).format(
      E=name, p=_predicate(rng, claim), d=descr, region=entity.region,
      social=rng.choice(lexicon.SOCIAL)))
  value = claim.value
  headline = cap(rng.choice(attribute.headline).format(
      E=name, V=title(value.text), AV=title(with_article(value.text))))
  explanation = _explanation(rng, claim, knowledge, descr)
  social = rng.choice(lexicon.SOCIAL)
  origin = _origin(rng, claim, knowledge, evidence, explanation, social)
  return ClaimFields(
      claim_id=claim.claim_id,
      snopes_url=f"https://www.snopes.com/fact-check/{lexicon.slug(headline)}-{claim.claim_id}/",
      category=rng.choice(_CATEGORIES[entity.kind]), headline=headline,
      description=rng.choice(_DESCRIPTION_FRAMES).format(E=name, p=_predicate(rng, claim)),
      source=rng.choice(lexicon.SOURCES), claim=claim_text, truthfulness=claim.rating,
      origin=origin, cleaned_truthfulness=labels.LABEL_NAMES[claim.label],
      ruling_outline="" if claim.empty_ruling else explanation, explanation=explanation)


def _explanation(rng: random.Random, claim: Claim, knowledge: Knowledge, descr: str) -> str:
  entity, attribute = claim.entity, claim.attribute
  name = entity.name
  ctx = {"E": name, "social": rng.choice(lexicon.SOCIAL), "region": entity.region, "d": descr}
  src = rng.choice(lexicon.OUTLETS)
  parts = [rng.choice(_OPENINGS).format(p=_predicate(rng, claim), **ctx)]
  if claim.label == labels.NEI:
    parts.append(rng.choice(_NEI_FINDINGS).format(noun=attribute.noun.format(E=name)))
    if claim.siblings:
      key = rng.choice(claim.siblings)
      parts.append(rng.choice(_NEI_SIBLING).format(
          fact=_fact(rng, name, key, entity.values[key]), **ctx))
    parts.append(rng.choice(_NEI_CLOSING).format(p=_predicate(rng, claim), **ctx))
  elif attribute.visual:
    seen = fill(attribute.seen, name, claim.true_value)
    claimed = fill(attribute.seen, name, claim.value)
    options = _SUPPORTED_VISUAL if claim.label == labels.SUPPORTED else _REFUTED_VISUAL
    parts.append(cap(rng.choice(options).format(src=src, seen=seen, claimed=claimed)))
  else:
    fact = _fact(rng, name, attribute.key, claim.true_value)
    options = _SUPPORTED_TEXT if claim.label == labels.SUPPORTED else _REFUTED_TEXT
    # "not 45,000" but "not a pharmacist": as the claim templates write the value.
    said = claim.value.text
    if any("{av}" in t for t in attribute.claim):
      said = with_article(said)
    parts.append(cap(rng.choice(options).format(
        src=src, Src=cap(src), fact=fact, v=said, **ctx)))
  for template in rng.sample(_CONTEXT, rng.randint(1, 3)):
    parts.append(cap(template.format(**ctx)))
  if claim.label != labels.NEI and rng.random() < 0.5:
    keys = [a.key for a in TEXT_BY_KIND[entity.kind]
            if a.key in entity.documented and knowledge.is_free(entity, a.key)]
    if keys:
      key = rng.choice(keys)
      fact = _fact(rng, name, key, entity.values[key])
      parts.append(f"Other records note that {name} {fact}.")
  parts.append(rng.choice(_VERDICTS).format(rating=claim.rating_name))
  return " ".join(parts)


def _origin(rng: random.Random, claim: Claim, knowledge: Knowledge, evidence: list[str],
            explanation: str, social: str) -> str:
  """The full ruling article, `<p>` paragraphs, the explanation in its ruling paragraph."""
  entity = claim.entity
  maker = SentenceMaker(rng)
  month, year = rng.choice(lexicon.MONTHS), rng.randint(2016, 2023)
  paragraphs = [
      f"In {month} {year}, a post on {social} claimed that {entity.name} "
      f"{_predicate(rng, claim)}. The post was shared widely.",
      " ".join(maker.filler(entity.name, entity.kind, entity.region)
               for _ in range(rng.randint(1, 3))),
  ]
  quotes = [f'{cap(rng.choice(lexicon.OUTLETS))} reported: "{s}"' for s in evidence[:3]]
  paragraphs.append(" ".join(quotes) if quotes else
                    "We found no article that addresses the claim directly.")
  if claim.n_proof_images:
    paragraphs.append(f"We also looked at photographs of {entity.name} published online.")
  text = "\n".join(f"<p>{p}</p>" for p in paragraphs)
  if rng.random() < 0.7:
    ruling = f"<p>Our ruling</p>\n<p>{explanation}</p>"
  else:
    ruling = f"<p>In sum, {explanation[:1].lower()}{explanation[1:]}</p>"
  sources = (f"<p>Sources</p>\n<p>{cap(rng.choice(lexicon.OUTLETS))}, {month} {year}.</p>")
  return f"{text}\n{ruling}\n{sources}"
