"""A caption corpus of the synthetic world's pictures: its stand-in for CLIP's web pre-training.

The paper's CLIP ViT-B/32 arrives knowing what "a pink flag" or "five towers" looks like, from
400M web image-text pairs; a CLIP trained from scratch on a few thousand synthetic claims
does not (on the small world the verifier could not read the facts that only pictures show).
This corpus gives the synthetic world what the web gives the real one: alt-text-like pairs of
a picture of a flag, coat, ferry, castle, trophy cabinet, bridge, crest or emblem and a
sentence naming what it shows ("the flag of Ambelby is mostly pink").

The pairs are drawn fresh from the renderer, never from a world's claims or splits: entity
names are made up the way the world makes them, values are drawn from the attribute's value
kind. Charts are left out: their year labels are unreadable at the small CLIP's 64 pixels.
A caption is worded as the world words the fact (the attribute's "seen" phrase, or the
entity followed by one of its claim phrases), sometimes placed ("in the Kess valley") and
framed as a photo caption: web alt-text is just as varied, and a text tower that saw one
wording only did not carry what it learned over to claims (held-out value accuracy 0.98 on
its own wording; claim-image AUC supported vs refuted 0.64 on the small world's test claims).

Pair `i` of corpus `seed` is a pure function of (seed, i), so any range of it can be drawn
by any process, in any order, and a held-out range is disjoint by construction.
"""

from __future__ import annotations

import dataclasses
import random

from mocheg_jax.data.synthetic import lexicon, render
from mocheg_jax.data.synthetic import values as values_lib
from mocheg_jax.data.synthetic.attributes import ATTRIBUTES, Attribute
from mocheg_jax.data.synthetic.rng import derive_seed

VERSION = 2  # Of the pairs drawn for a (seed, index): 2 varies the wording. Corpus folders name it.
# Pictures whose facts a 64-pixel CLIP can see (a chart's answer is a printed year).
CAPTIONED: tuple[Attribute, ...] = tuple(
    a for a in ATTRIBUTES.values() if a.visual and a.render != "chart")
# Share of pictures with the entity's name printed under them, as in the world.
_NAME_PRINTED = 0.3
_PLACED = 0.3  # Share of captions that say where the entity is.
_FRAMES = ("{c}", "{c}", "{c}", "Photo: {c}.", "{c}, as seen in this picture.",
           "This picture shows that {c}.", "{c} (file photo).")


@dataclasses.dataclass(frozen=True)
class CaptionPair:
  caption: str
  job: render.ImageJob  # What the picture shows (render.render_bytes draws it).
  attribute: str  # The attribute key ("town.flag").
  value: str  # The value the picture shows, as text ("pink").


def _entity_name(rng: random.Random, kind: str) -> str:
  base = (rng.choice(lexicon.ONSETS) + rng.choice(lexicon.MIDDLES)
          + rng.choice(rng.choice(lexicon.ENDING_GROUPS)))
  if kind == "town":
    return rng.choice(lexicon.TOWN_PATTERNS).format(b=base)
  if kind == "river":
    return rng.choice(lexicon.RIVER_PATTERNS).format(b=base)
  if kind == "company":
    return rng.choice(lexicon.COMPANY_PATTERNS).format(b=base)
  return lexicon.person_name(rng, surname=base)


@dataclasses.dataclass(frozen=True)
class _Wording:
  """How one caption words its fact; the value is filled in by `describe`."""
  attribute: Attribute
  name: str
  phrase: str  # "seen" or one of the attribute's claim phrases, with {E}, {v} / {av}.
  place: str  # "" or ", a town in the Kess valley,".
  frame: str  # "{c}" or a photo-caption frame around the sentence.


def describe(wording: _Wording, value: values_lib.Value) -> str:
  """The sentence naming what a picture of the wording's attribute with `value` shows."""
  entity = wording.name + wording.place
  sentence = wording.phrase.format(E=entity, v=value.text,
                                   av=values_lib.with_article(value.text))
  if not wording.frame.startswith("This"):  # The sentence starts the caption or follows "Photo:".
    sentence = sentence[:1].upper() + sentence[1:]
  return wording.frame.format(c=sentence)


def _draw(seed: int, index: int) -> tuple[random.Random, _Wording, values_lib.Value]:
  rng = random.Random(derive_seed("captions", seed, index))
  attribute = rng.choice(CAPTIONED)
  name = _entity_name(rng, attribute.kind)
  phrase = rng.choice((attribute.seen, *("{E} " + c for c in attribute.claim)))
  placed = attribute.kind != "person" and phrase != attribute.seen and rng.random() < _PLACED
  place = f", a {attribute.kind} in {lexicon.region_name(rng)}," if placed else ""
  wording = _Wording(attribute, name, phrase, place, rng.choice(_FRAMES))
  return rng, wording, values_lib.sample(rng, attribute.values)


def caption_pair(seed: int, index: int) -> CaptionPair:
  """Pair `index` of the corpus drawn with `seed`."""
  rng, wording, value = _draw(seed, index)
  printed = wording.name if rng.random() < _NAME_PRINTED else ""
  attribute = wording.attribute
  job = render.ImageJob((), attribute.render, (value.data, printed), rng.getrandbits(63))
  return CaptionPair(describe(wording, value), job, attribute.key, value.text)


def alternatives(seed: int, index: int, count: int) -> list[str]:
  """Pair `index`'s caption with `count` other values of its attribute in its place: the
  held-out check of whether a model reads the value off the picture (first is the true one).
  """
  _, wording, value = _draw(seed, index)
  attribute = wording.attribute
  rng = random.Random(derive_seed("captions/alternatives", seed, index))
  others: list[values_lib.Value] = []
  for _ in range(100 * count):
    if len(others) == count:
      break
    other = values_lib.alternative(rng, attribute.values, value)
    if other.text != value.text and all(other.text != o.text for o in others):
      others.append(other)
  if len(others) < count:
    raise ValueError(f"{attribute.key} has fewer than {count} values besides {value.text!r}")
  return [describe(wording, v) for v in (value, *others)]
