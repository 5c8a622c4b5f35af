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

# Pictures whose facts a 64-pixel CLIP can see (a chart's answer is a printed year).
CAPTIONED: tuple[Attribute, ...] = tuple(
    a for a in ATTRIBUTES.values() if a.visual and a.render != "chart")
# Share of pictures with the entity's name printed under them, as in the world.
_NAME_PRINTED = 0.3


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


def describe(attribute: Attribute, name: str, value: values_lib.Value) -> str:
  """The sentence naming what a picture of `attribute` with `value` shows."""
  return attribute.seen.format(E=name, v=value.text, av=values_lib.with_article(value.text))


def _draw(seed: int, index: int) -> tuple[random.Random, Attribute, str, values_lib.Value]:
  rng = random.Random(derive_seed("captions", seed, index))
  attribute = rng.choice(CAPTIONED)
  name = _entity_name(rng, attribute.kind)
  return rng, attribute, name, values_lib.sample(rng, attribute.values)


def caption_pair(seed: int, index: int) -> CaptionPair:
  """Pair `index` of the corpus drawn with `seed`."""
  rng, attribute, name, value = _draw(seed, index)
  printed = name if rng.random() < _NAME_PRINTED else ""
  job = render.ImageJob((), attribute.render, (value.data, printed), rng.getrandbits(63))
  return CaptionPair(describe(attribute, name, value), job, attribute.key, value.text)


def alternatives(seed: int, index: int, count: int) -> list[str]:
  """Pair `index`'s caption with `count` other values of its attribute in its place: the
  held-out check of whether a model reads the value off the picture (first is the true one).
  """
  pair = caption_pair(seed, index)
  rng, attribute, name, value = _draw(seed, index)
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
  return [pair.caption] + [describe(attribute, name, o) for o in others]
