"""Attribute values: how they are drawn, written, rendered and altered for false claims.

A `Value` has the text a sentence or claim writes ("45,000", "green", "five",
"red triangle") and, for facts only images show, the data a renderer needs (the colour
name, the number of objects, the bars of a chart). `alternative` gives a different value
of the same kind, which is what a refuted claim asserts.
"""

from __future__ import annotations

import dataclasses
import math
import random

from mocheg_jax.data.synthetic import lexicon


@dataclasses.dataclass(frozen=True)
class Value:
  text: str           # as written in sentences and claims
  data: tuple = ()    # renderer parameters of image-only values


@dataclasses.dataclass(frozen=True)
class ValueKind:
  """How one attribute's values are drawn: `kind` picks the sampler, the rest bound it."""
  kind: str                   # big_count|year|measure|decimal|money|person|place|choice|
                              # small_count|colour|count|emblem|chart|source
  low: float = 0
  high: float = 0
  unit: str = ""
  choices: tuple[str, ...] = ()


def _round_sig(x: float, digits: int) -> int:
  if x <= 0:
    return 0
  scale = 10 ** max(0, int(math.floor(math.log10(x))) - digits + 1)
  return int(round(x / scale) * scale)


def sample(rng: random.Random, vk: ValueKind) -> Value:
  """A fresh value of the kind."""
  k = vk.kind
  if k == "big_count":
    x = math.exp(rng.uniform(math.log(vk.low), math.log(vk.high)))
    return Value(lexicon.format_int(_round_sig(x, rng.choice((2, 2, 3)))), ())
  if k == "year":
    return Value(str(rng.randint(int(vk.low), int(vk.high))))
  if k == "measure":
    return Value(f"{lexicon.format_int(rng.randint(int(vk.low), int(vk.high)))} {vk.unit}")
  if k == "decimal":  # "1.82 metres": a decimal point the sentence splitter must not split at.
    digits = 2 if vk.high < 3 else 1
    return Value(f"{rng.uniform(vk.low, vk.high):.{digits}f} {vk.unit}")
  if k == "money":  # "$4.2 million"
    return Value(f"${rng.uniform(vk.low, vk.high):.1f} million")
  if k == "person":
    return Value(lexicon.person_name(rng))
  if k == "place":
    return Value(lexicon.place_name(rng))
  if k == "source":
    return Value(rng.choice(lexicon.RIVER_SOURCES).format(p=rng.choice(lexicon.PLACE_ONSETS)))
  if k == "choice":
    return Value(rng.choice(vk.choices))
  if k == "small_count":
    n = rng.randint(int(vk.low), int(vk.high))
    return Value(lexicon.COUNT_WORDS[n], (n,))
  if k == "colour":
    c = rng.choice(lexicon.COLOUR_NAMES)
    return Value(c, (c,))
  if k == "count":
    n = rng.randint(int(vk.low), int(vk.high))
    return Value(lexicon.COUNT_WORDS[n], (n,))
  if k == "emblem":
    c, s = rng.choice(lexicon.COLOUR_NAMES), rng.choice(lexicon.SHAPES)
    return Value(f"{c} {s}", (c, s))
  if k == "chart":
    start = rng.randint(2004, 2016)
    years = tuple(str(start + i) for i in range(rng.randint(4, 6)))
    heights = [rng.randint(20, 80) for _ in years]
    top = rng.randrange(len(years))
    heights[top] = max(heights) + rng.randint(8, 18)  # One clearly tallest bar.
    return Value(years[top], (years, tuple(heights)))
  raise ValueError(f"unknown value kind {k!r}")


def alternative(rng: random.Random, vk: ValueKind, true: Value) -> Value:
  """A value of the same kind whose text differs from `true` (a refuted claim's value)."""
  k = vk.kind
  for _ in range(50):
    if k in ("big_count", "measure", "decimal", "money"):
      value = _scaled(rng, vk, true)
    elif k == "year":
      delta = rng.randint(3, 60) * rng.choice((-1, 1))
      value = Value(str(min(int(vk.high), max(int(vk.low), int(true.text) + delta))))
    elif k == "emblem":
      c, s = true.data
      r = rng.random()
      if r < 0.4:
        c = rng.choice([x for x in lexicon.COLOUR_NAMES if x != c])
      elif r < 0.8:
        s = rng.choice([x for x in lexicon.SHAPES if x != s])
      else:
        c = rng.choice([x for x in lexicon.COLOUR_NAMES if x != c])
        s = rng.choice([x for x in lexicon.SHAPES if x != s])
      value = Value(f"{c} {s}", (c, s))
    elif k == "chart":  # Another year of the same chart.
      years = true.data[0]
      value = Value(rng.choice([y for y in years if y != true.text]), true.data)
    else:
      value = sample(rng, vk)
    if value.text != true.text:
      return value
  raise RuntimeError(f"could not find an alternative to {true.text!r} ({k})")


def _scaled(rng: random.Random, vk: ValueKind, true: Value) -> Value:
  """Scales a number by 0.45-0.8 or 1.25-2.2 and writes it the way `sample` does."""
  factor = rng.uniform(0.45, 0.8) if rng.random() < 0.5 else rng.uniform(1.25, 2.2)
  k = vk.kind
  if k == "big_count":
    n = int(true.text.replace(",", ""))
    return Value(lexicon.format_int(max(10, _round_sig(n * factor, 2))))
  number = float(true.text.lstrip("$").split()[0].replace(",", ""))
  if k == "measure":
    return Value(f"{lexicon.format_int(max(1, int(round(number * factor))))} {vk.unit}")
  if k == "decimal":
    digits = 2 if vk.high < 3 else 1
    x = min(vk.high * 1.3, max(vk.low * 0.8, number * (1 + (factor - 1) * 0.3)))
    return Value(f"{x:.{digits}f} {vk.unit}")
  return Value(f"${max(0.1, number * factor):.1f} million")


def with_article(text: str) -> str:
  """"orange flag" -> "an orange flag"."""
  return ("an " if text[:1].lower() in "aeiou" else "a ") + text


_SMALL_WORDS = frozenset(("a", "an", "the", "of", "in", "on", "by", "for", "to", "and"))


def title(text: str) -> str:
  """Headline case: "red triangle" -> "Red Triangle", "a pharmacist" -> "a Pharmacist"."""
  return " ".join(w if w in _SMALL_WORDS else w[:1].upper() + w[1:] for w in text.split(" "))
