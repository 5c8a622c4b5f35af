"""Knowledge-base sentences: facts, topics, rumours, fillers, and the splitter's hard cases.

Every sentence the generator writes is one line of the sentence-level KB, so each must
come back unchanged from a rule-based sentence splitter run on the article. The rules kept
here (and checked by `check_sentence`):

* a sentence starts with an upper-case letter or a double quote and ends with `.`, `!` or
  `?`, optionally followed by a closing double quote;
* no tags, `&`, newlines or double spaces; no `!`/`?` inside a sentence;
* a sentence never ends with an abbreviation, an initial or a dotted acronym ("U.S."), so
  a period after those always continues the sentence;
* abbreviations are only used before a capitalised name or a number ("Dr. Anna Vask",
  "St. Brivelle", "the U.S. Navy", "No. 5"), never before a sentence-opening word.

The hard cases used on purpose are listed in `SPLITTER_HARD_CASES`: short example texts with
the sentences they must split into, for testing a splitter on exactly what this world writes.
"""

from __future__ import annotations

import random
import re

from mocheg_jax.data.synthetic import lexicon
from mocheg_jax.data.synthetic.attributes import Attribute
from mocheg_jax.data.synthetic.values import Value, with_article

# (case, sentences): " ".join(sentences) must split back into `sentences`.
SPLITTER_HARD_CASES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("title before a name", ("Dr. Anna Vask led the survey team.",
                             "Mr. Otto Lund later disputed those numbers.",
                             "Mrs. Ida Berg kept the minutes.", "Ms. Vera Holm agreed.")),
    ("saint in a place name", ("St. Brivelle lies north of the river.",
                               "The chapel of St. Brivelle is older than the town.")),
    ("dotted acronym before a name", ("The U.S. Geological Survey mapped the valley in 1954.",
                                      "The records were sent to the U.S. Navy archive.")),
    ("number abbreviation", ("The files are kept in Room No. 5 of the county archive.",
                             "Nobody has opened them since.")),
    ("decimal number", ("The Brivell River is 3.5 metres deep.",
                        "Dr. Anna Vask stands 1.82 metres tall.")),
    ("money", ("Repairs to the harbour cost $4.2 million.", "The town paid half.")),
    ("initials", ("J. R. Venn wrote the first guidebook to the Kess hills.",
                  "The book is out of print.")),
    ("quoted speech ending a sentence", ('Dr. Otto Lund told reporters: "We checked every '
                                         'figure twice."', "The report was published.")),
    ("quotation opening a sentence", ('"The archive is open to everyone," Mrs. Ida Berg said.',
                                      "Few people visit it.")),
    ("question and exclamation", ("Was the old survey accurate?", "Nobody could say for sure!",
                                  "The question remains open.")),
)

_FACT_FRAMES: tuple[str, ...] = (
    "{E} {p}.", "{E} {p}.", "According to {src}, {E} {p}.", "{E} {p}, {src} reported.",
    "Records kept by {src} show that {E} {p}.", "Figures published by {src} confirm that {E} {p}.",
    "As {src} noted, {E} {p}.", "It is well documented that {E} {p}.",
)
_TOPIC_SUFFIXES: tuple[str, ...] = ("", "", ", {src} reported", ", according to {src}")
_RUMOUR_FRAMES: tuple[str, ...] = (
    "A post shared on {social} claimed that {E} {p}.",
    "Rumours that {E} {p} have circulated for years.",
    "Some users on {social} insist that {E} {p}.",
    "A widely shared image said that {E} {p}.",
)
_INTROS: dict[str, tuple[str, ...]] = {
    "town": ("{E} is a small town in {region}.", "{E} is a market town in {region}.",
             "{E} lies in {region}."),
    "person": ("{E} is a well-known figure in {region}.", "{E} lives in {region}.",
               "{E} is often in the news in {region}."),
    "company": ("{E} is a company based in {region}.", "{E} is a family firm from {region}.",
                "{E} does business across {region}."),
    "river": ("{E} flows through {region}.", "{E} is the main river of {region}.",
              "{E} drains much of {region}."),
}
_FILLERS: dict[str, tuple[str, ...]] = {
    "town": ("Visitors often stop in {E} on their way to {region}.",
             "The old market square of {E} fills up every Saturday.",
             "A new footbridge opened in {E} in {year}.",
             "Local historians in {E} keep a small archive near the station.",
             "The road to {E} was paved in {year}.", "{E} hosts a music festival each summer.",
             "Trains to {E} run twice an hour.",
             "Dr. {first} {sur} ran the only clinic in {E} for decades.",
             "The bakery in {E} has been in the same family for generations.",
             "A storm damaged several roofs in {E} in {year}.",
             "The school in {E} was extended in {year}.",
             "Tourists in {E} like to walk along the old walls."),
    "person": ("{E} rarely gives interviews.", "Friends describe {E} as private and precise.",
               "{E} spoke at a conference in {year}.", "A biography of {E} appeared in {year}.",
               "{E} moved to the capital in {year}.", "Neighbours say {E} walks to work.",
               "{E} once met officials from the U.S. Department of Commerce.",
               "A street mural of {E} was painted in {year}.",
               "Journalists followed {E} for a week in {year}.",
               "{E} supports a local football club."),
    "company": ("{E} opened a second office in {year}.",
                "Shares of {E} fell slightly last quarter.",
                "{E} sponsors the local football club.",
                "{E} won a contract with the U.S. Navy in {year}.",
                "The delivery vans of {E} are a familiar sight.",
                "{E} was fined for a late tax return in {year}.",
                "A strike briefly closed {E} in {year}.",
                "{E} moved part of its production abroad in {year}.",
                "The website of {E} was redesigned in {year}.",
                "Former workers of {E} meet every winter."),
    "river": ("{E} floods most springs.", "Anglers and walkers share the banks of {E}.",
              "A walking path follows {E} for several kilometres.",
              "Barges carried timber down {E} until {year}.",
              "{E} froze over completely in {year}.",
              "Kingfishers nest along the banks of {E}.",
              "The mill on {E} closed in {year}.",
              "The U.S. Geological Survey once studied {E}.",
              "Rowing clubs train on {E} every morning.",
              "A flood in {year} changed the course of {E}."),
}
_GENERIC: tuple[str, ...] = (
    "Dr. {first} {sur} led the survey team.", "Mr. {first} {sur} later disputed those numbers.",
    "Mrs. {first} {sur} kept the minutes of every meeting.",
    "Ms. {first} {sur} wrote a letter to the editor.",
    "The records are stored in Room No. {n} of {src}.",
    "The survey covered {dec} square kilometres.", "Repairs to the harbour cost {money}.",
    "{I1}. {I2}. {sur} wrote the first guidebook to {region}.",
    '{first} {sur} told reporters: "We checked every figure twice."',
    '"The archive is open to everyone," {first} {sur} said.',
    '{first} {sur} said: "Nothing has changed here in years."',
    "Was the old survey accurate?", "Nobody could say for sure!",
    "The U.S. Geological Survey mapped {region} in {year}.",
    "St. {place} Church stands at the end of the road.",
    "Weather in {region} is mild for most of the year.",
    "Many of the old photographs were lost in a fire.",
    "The local newspaper has covered the region since {year}.",
    "Officials declined to comment on the matter.",
    "The report was published in {year}.", "Further details are expected next year.",
    "The regional government funds a small museum.",
    "Critics say the figures are rarely checked.",
    "A new road through {region} is planned.",
    "The question remains open.", "Readers sent in dozens of old photographs.",
)
_SENTENCE_RE = re.compile(r'^"?[A-Z][^<>&\n!?]*[.!?]"?$')
_ABBREVIATION_END = re.compile(r"(?:\b(?:Dr|Mr|Mrs|Ms|St|No)|\b[A-Z]|[A-Z]\.[A-Z])\.\"?$")


def check_sentence(sentence: str) -> None:
  """Raises ValueError when a sentence breaks the rules in the module docstring."""
  # The abbreviation check only needs the sentence's last few characters.
  if (not _SENTENCE_RE.match(sentence) or "  " in sentence
      or _ABBREVIATION_END.search(sentence, max(0, len(sentence) - 8))):
    raise ValueError(f"generated sentence breaks the splitter rules: {sentence!r}")


def cap(text: str) -> str:
  """Upper-cases the first letter (after an opening quote): "the Brivell River ..."."""
  if text.startswith('"'):
    return '"' + cap(text[1:])
  return text[:1].upper() + text[1:]


def fill(template: str, entity_name: str, value: Value | None = None, **extra: str) -> str:
  """Formats a template with `{E}`, `{v}`, `{av}` and any extra placeholders."""
  fields = {"E": entity_name}
  if value is not None:
    fields["v"] = value.text
    fields["av"] = with_article(value.text)
  fields.update(extra)
  return template.format(**fields)


class SentenceMaker:
  """Draws sentences of each type from one claim's random stream."""

  def __init__(self, rng: random.Random):
    self.rng = rng

  def _context(self) -> dict[str, str]:
    r = self.rng
    return {"src": r.choice(lexicon.OUTLETS), "social": r.choice(lexicon.SOCIAL),
            "year": str(r.randint(1890, 2021))}

  def fact(self, name: str, attribute: Attribute, value: Value) -> str:
    """A sentence stating a text fact, in evidence wording."""
    r = self.rng
    p = fill(r.choice(attribute.fact), name, value)
    return cap(r.choice(_FACT_FRAMES).format(E=name, p=p, **self._context()))

  def topic(self, name: str, attribute: Attribute) -> str:
    """A sentence about the attribute that does not state its value."""
    r = self.rng
    text = fill(r.choice(attribute.topic), name, **self._context())
    suffix = r.choice(_TOPIC_SUFFIXES)
    if suffix:
      text = text[:-1] + suffix.format(**self._context()) + "."
    return cap(text)

  def unknown(self, name: str, attribute: Attribute) -> str:
    return cap(fill(self.rng.choice(attribute.unknown), name))

  def rumour(self, name: str, attribute: Attribute, value: Value) -> str:
    """A restatement of a claim (never evidence): what a fact-check article quotes."""
    r = self.rng
    p = fill(r.choice(attribute.claim), name, value)
    return cap(r.choice(_RUMOUR_FRAMES).format(E=name, p=p, **self._context()))

  def intro(self, name: str, kind: str, region: str) -> str:
    return cap(self.rng.choice(_INTROS[kind]).format(E=name, region=region))

  def filler(self, name: str, kind: str, region: str) -> str:
    """A sentence that mentions the entity but none of its attributes."""
    r = self.rng
    return cap(r.choice(_FILLERS[kind]).format(
        E=name, region=region, first=r.choice(lexicon.FIRST_NAMES),
        sur=r.choice(lexicon.SURNAME_ONSETS) + r.choice(lexicon.SURNAME_ENDINGS),
        **self._context()))

  def generic(self, region: str) -> str:
    """A sentence about no entity; the splitter's hard cases live here."""
    r = self.rng
    return cap(r.choice(_GENERIC).format(
        region=region, first=r.choice(lexicon.FIRST_NAMES),
        sur=r.choice(lexicon.SURNAME_ONSETS) + r.choice(lexicon.SURNAME_ENDINGS),
        n=str(r.randint(2, 40)), dec=f"{r.uniform(1.0, 9.9):.1f}",
        money=f"${r.uniform(0.5, 9.9):.1f} million", I1=r.choice(lexicon.INITIALS),
        I2=r.choice(lexicon.INITIALS), place=lexicon.place_name(r), **self._context()))
