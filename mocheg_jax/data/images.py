"""Mocheg image file names and the paper's image cleaning rules.

KB image:    {claim_id:05d}-{relevant_document_id:05d}-{img_id:02d}-{description}
Proof image: {claim_id:05d}-proof-{img_id:02d}-{description}
`description` is at most 80 characters of the source URL's base name, and `.jpg` is added
when it has no extension. Names are parsed by their leading fields (ids may be wider than
their padding), never by fixed offsets.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Iterable

from PIL import Image

from mocheg_jax.data.report import SkipReport

MAX_DESCRIPTION_CHARS = 80
MIN_IMAGE_SIDE = 400
# Substrings that mark ads, logos, icons, rating badges and other non-evidence images.
BLOCKED_NAME_PARTS: tuple[str, ...] = (
    "-ad-", "logo", ".gif", ".ico", "lazyload", ".cgi", "Logo", ".php", "icon", "Bubble",
    "svg", "rating-false", "rating-true", "banner", "-line",
)

_NAME = re.compile(r"^(?P<claim>\d+)-(?P<doc>\d+|proof)-(?P<img>\d+)-(?P<desc>.*)$", re.DOTALL)


@dataclasses.dataclass(frozen=True)
class ImageName:
  claim_id: int
  relevant_document_id: int | None  # None for a proof image.
  img_id: int
  description: str

  @property
  def is_proof(self) -> bool:
    return self.relevant_document_id is None


def parse_image_name(name: str) -> ImageName:
  """Parses a KB or proof image file name; raises ValueError naming the bad name."""
  match = _NAME.match(os.path.basename(name))
  if match is None:
    raise ValueError(f"image name {name!r} is not '<claim>-<doc|proof>-<img>-<description>'")
  doc = match["doc"]
  return ImageName(
      claim_id=int(match["claim"]),
      relevant_document_id=None if doc == "proof" else int(doc),
      img_id=int(match["img"]),
      description=match["desc"],
  )


def _description(source_basename: str) -> str:
  desc = source_basename[:MAX_DESCRIPTION_CHARS]
  return desc if os.path.splitext(desc)[1] else desc + ".jpg"


def kb_image_name(claim_id: int, relevant_document_id: int, img_id: int,
                  source_basename: str = "") -> str:
  return f"{claim_id:05d}-{relevant_document_id:05d}-{img_id:02d}-{_description(source_basename)}"


def proof_image_name(claim_id: int, img_id: int, source_basename: str = "") -> str:
  return f"{claim_id:05d}-proof-{img_id:02d}-{_description(source_basename)}"


def blocked_name_reason(name: str) -> str | None:
  """The cleaning rule a file name breaks, or None."""
  for part in BLOCKED_NAME_PARTS:
    if part in name:
      return f"name contains {part!r}"
  return None


SMALL_IMAGE = f"smaller than {MIN_IMAGE_SIDE}x{MIN_IMAGE_SIDE}"
UNREADABLE_IMAGE = "unreadable image"


def is_too_small(width: int, height: int) -> bool:
  """The paper drops images smaller than 400x400: either side under 400 pixels."""
  return width < MIN_IMAGE_SIDE or height < MIN_IMAGE_SIDE


def clean_images(directory: str | os.PathLike, names: Iterable[str],
                 removed: SkipReport) -> list[str]:
  """Applies the paper's cleaning rules; returns the kept names in the given order.

  Every removed image is added to `removed` with its rule (or 'unreadable image'), so the
  caller can report what was removed and why. Only the image header is read for its size.
  """
  kept = []
  for name in names:
    path = os.path.join(directory, name)
    reason, detail = blocked_name_reason(name), ""
    if reason is None:
      try:
        with Image.open(path) as img:
          if is_too_small(*img.size):
            reason, detail = SMALL_IMAGE, "{}x{}".format(*img.size)
      except (OSError, ValueError, Image.DecompressionBombError) as e:
        reason, detail = UNREADABLE_IMAGE, f"{type(e).__name__}: {e}"
    if reason is None:
      kept.append(name)
    else:
      removed.add(path, None, reason, detail)
  return kept
