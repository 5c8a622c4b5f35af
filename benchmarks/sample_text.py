"""Benchmark inputs shared by the encoding benchmarks (a module without absl flags, so any
benchmark imports it)."""

from __future__ import annotations

import random

_WORDS = ("the council report said river bridge budget vote claim senator photo shows "
          "million percent tax school water election video 2019 governor police city "
          "health vaccine study found false true misleading according statement posted "
          "facebook twitter viral image january state federal law court judge workers "
          "prices oil climate record jobs border wall hospital doctors").split()


def sentences(n: int, seed: int = 0) -> list[str]:
  """Fact-checking-like sentences (as in the Mocheg sentence KB): 30% of 4-12 words, 62% of
  12-40, 8% of 40-120 (the longest near the 256-token truncation length)."""
  rng = random.Random(seed)
  out = []
  for _ in range(n):
    r = rng.random()
    words = rng.randint(4, 12) if r < 0.3 else rng.randint(12, 40) if r < 0.92 else \
        rng.randint(40, 120)
    text = " ".join(rng.choice(_WORDS) for _ in range(words))
    out.append(text[0].upper() + text[1:] + rng.choice(".?!"))
  return out
