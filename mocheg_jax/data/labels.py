"""The three Mocheg classes and the table from raw site ratings to them.

The release stores both the raw Snopes rating (`Truthfulness`, over 75 spellings such as
"True", "TRUE", "Status: True.") and the cleaned class (`cleaned_truthfulness`). The
mapping table itself was not released, so this module keeps our own, documented one.
Ratings are normalised (case, a leading "Status:" or "Rating:", punctuation, spacing)
before the look-up; anything not in the table is rejected with `UnknownLabelError`.
"""

from __future__ import annotations

import re

REFUTED, SUPPORTED, NEI = 0, 1, 2
LABEL_NAMES: tuple[str, ...] = ("refuted", "supported", "NEI")
NUM_CLASSES = len(LABEL_NAMES)


class UnknownLabelError(ValueError):
  """A rating or class string that our table does not know."""


# Normalised raw rating -> class id. Why each group is where it is:
# * supported: the claim is shown to be true or correctly attributed.
# * refuted: shown false, fake, misattributed, miscaptioned or satire taken literally.
# * NEI: the evidence cannot settle it (mixed, unproven, outdated, still being researched).
RATING_TABLE: dict[str, int] = {
    **dict.fromkeys((
        "true", "mostly true", "correct attribution", "correctly attributed", "legit",
        "real", "confirmed", "accurate", "supported", "verified", "correct",
    ), SUPPORTED),
    **dict.fromkeys((
        "false", "mostly false", "fake", "scam", "miscaptioned", "misattributed",
        "incorrect attribution", "incorrectly attributed", "labeled satire",
        "originated as satire", "satire", "hoax", "legend", "lost legend", "fiction",
        "inaccurate", "refuted", "not true", "wrong", "debunked", "recall", "false recall",
    ), REFUTED),
    **dict.fromkeys((
        "mixture", "mixed", "unproven", "unfounded", "outdated", "undetermined",
        "research in progress", "partly true", "partly false", "half true", "unverified",
        "unclear", "multiple", "nei", "not enough info", "not enough information",
        "no rating",
    ), NEI),
}

_PREFIX = re.compile(r"^\s*(status|rating|claim|verdict)\s*:\s*", re.IGNORECASE)
_NON_WORD = re.compile(r"[^a-z0-9]+")


def normalize_rating(raw: str) -> str:
  """Lower-cased rating with prefixes, punctuation and extra spaces removed."""
  text = _PREFIX.sub("", raw.strip())
  return _NON_WORD.sub(" ", text.lower()).strip()


def label_from_rating(raw: str) -> int:
  """Class id of a raw site rating or of a cleaned class name."""
  key = normalize_rating(raw)
  if key not in RATING_TABLE:
    raise UnknownLabelError(f"unknown rating {raw!r} (normalised {key!r})")
  return RATING_TABLE[key]


def label_from_name(name: str) -> int:
  """Class id of one of `LABEL_NAMES` (as `cleaned_truthfulness` holds them)."""
  stripped = name.strip()
  for i, known in enumerate(LABEL_NAMES):
    if stripped.lower() == known.lower():
      return i
  raise UnknownLabelError(f"unknown class {name!r}; expected one of {LABEL_NAMES}")
