"""Seeds derived from names, so every part of the world has its own random stream.

Each claim, article and image draws from `random.Random(derive_seed(seed, ...))` keyed by
what it is ("text", claim_id) rather than from one shared stream, so the output does not
depend on the order work is done in, on the number of worker processes, or on
`PYTHONHASHSEED` (keys are hashed with blake2b, never with `hash()`).
"""

from __future__ import annotations

import hashlib
import math
import random


def derive_seed(*parts: object) -> int:
  """A 64-bit seed from the `str()` of each part (ints, strings, split names)."""
  key = "\x1f".join(str(p) for p in parts).encode("utf-8")
  return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")


def rng_for(*parts: object) -> random.Random:
  """A fresh `random.Random` for the named part of the world."""
  return random.Random(derive_seed(*parts))


def binomial_between(rng: random.Random, low: int, high: int, mean: float) -> int:
  """An int in [low, high] with about the given mean: low + Binomial(high - low, p).

  Drawn from the binomial's normal approximation (one draw instead of high - low), then
  rounded and clipped; the clipping is symmetric around the mean for means mid-range.
  """
  if high <= low:
    return low
  n = high - low
  p = min(1.0, max(0.0, (mean - low) / n))
  x = rng.gauss(n * p, math.sqrt(n * p * (1 - p)))
  return low + min(n, max(0, int(round(x))))


def weighted_choice(rng: random.Random, weighted: tuple[tuple[object, float], ...]) -> object:
  """One item of `((item, weight), ...)`; the order of the tuple fixes the result."""
  total = sum(w for _, w in weighted)
  x = rng.random() * total
  for item, w in weighted:
    x -= w
    if x < 0:
      return item
  return weighted[-1][0]
