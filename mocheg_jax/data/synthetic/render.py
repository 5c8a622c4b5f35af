"""Pillow pictures of the synthetic world, byte-identical for the same job.

Each `ImageJob` is drawn from its own seed, so the bytes do not depend on which worker
draws it or in which order. Content is compositional with claim words: colour words are the
fill colour of the main object (`lexicon.COLOURS`), count words the number of objects
drawn, shape words the emblem's outline, a chart's tallest bar is labelled with the year a
claim names. Real pictures are 400x400 JPEGs (they survive the paper's cleaning rules);
junk is whatever format and size its name implies. No metadata, EXIF or timestamps are
written, and encoder settings are fixed.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import math
import os
import random

from PIL import Image, ImageDraw, ImageFont, ImageOps

from mocheg_jax.data.synthetic.lexicon import COLOURS

SIZE = 400
JPEG_QUALITY = 85


@dataclasses.dataclass(frozen=True)
class ImageJob:
  """One picture: where it goes (paths relative to the release root), what it shows."""
  paths: tuple[str, ...]
  kind: str        # flag|portrait|boat|count:<object>|crest|emblem|chart|placard|scene|junk
  params: tuple
  seed: int


@functools.lru_cache(maxsize=8)
def _font(size: int) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
  return ImageFont.load_default(size=size)


@functools.lru_cache(maxsize=1)
def _gradient() -> Image.Image:
  return Image.linear_gradient("L").resize((SIZE, SIZE))


def _jitter(rng: random.Random, rgb: tuple[int, int, int], amount: int = 14) -> tuple:
  return tuple(min(255, max(0, c + rng.randint(-amount, amount))) for c in rgb)


def _background(rng: random.Random, light: bool = True) -> Image.Image:
  """A soft vertical gradient (sky, wall or paper)."""
  lo = 170 if light else 40
  top = tuple(rng.randint(lo, lo + 80) for _ in range(3))
  bottom = tuple(rng.randint(lo, lo + 80) for _ in range(3))
  return ImageOps.colorize(_gradient(), top, bottom)


def _caption(draw: ImageDraw.ImageDraw, text: str) -> None:
  if text:
    draw.rectangle((0, SIZE - 44, SIZE, SIZE), fill=(250, 250, 250))
    draw.text((12, SIZE - 38), text.upper()[:26], fill=(20, 20, 20), font=_font(24))


def _colour(rng: random.Random, name: str) -> tuple:
  return _jitter(rng, COLOURS[name], 10)


def _polygon(shape: str, cx: float, cy: float, r: float) -> list[tuple[float, float]]:
  if shape == "triangle":
    n, start = 3, -math.pi / 2
  elif shape == "square":
    n, start = 4, math.pi / 4
  elif shape == "diamond":
    n, start = 4, 0.0
  elif shape == "hexagon":
    n, start = 6, 0.0
  elif shape == "star":
    pts = []
    for i in range(10):
      rr = r if i % 2 == 0 else r * 0.45
      a = -math.pi / 2 + i * math.pi / 5
      pts.append((cx + rr * math.cos(a), cy + rr * math.sin(a)))
    return pts
  else:
    raise ValueError(f"unknown shape {shape!r}")
  return [(cx + r * math.cos(start + 2 * math.pi * i / n),
           cy + r * math.sin(start + 2 * math.pi * i / n)) for i in range(n)]


def _shape(draw: ImageDraw.ImageDraw, shape: str, cx: float, cy: float, r: float,
           fill: tuple) -> None:
  if shape == "circle":
    draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=fill)
  else:
    draw.polygon(_polygon(shape, cx, cy, r), fill=fill)


def _decor(rng: random.Random, draw: ImageDraw.ImageDraw, n: int, area: tuple) -> None:
  """Small neutral clutter so that no two pictures are alike."""
  x0, y0, x1, y1 = area
  for _ in range(n):
    x, y = rng.randint(x0, x1), rng.randint(y0, y1)
    g = rng.randint(90, 230)
    s = rng.randint(4, 14)
    draw.ellipse((x, y, x + s, y + s), fill=(g, g, g))


# ---- renderers: params -> Image -------------------------------------------------------
def _flag(rng, params):
  (colour,), caption = params
  img = _background(rng)
  d = ImageDraw.Draw(img)
  _decor(rng, d, rng.randint(3, 8), (0, 0, SIZE - 20, 140))
  px = rng.randint(40, 110)
  d.rectangle((px, 40, px + 10, 355), fill=(90, 90, 90))
  w, h = rng.randint(190, 240), rng.randint(120, 160)
  top = rng.randint(50, 90)
  d.rectangle((px + 10, top, px + 10 + w, top + h), fill=_colour(rng, colour))
  if rng.random() < 0.5:  # A small white badge keeps the colour dominant.
    cx, cy = px + 10 + w // 2, top + h // 2
    d.ellipse((cx - 18, cy - 18, cx + 18, cy + 18), fill=(245, 245, 245))
  _caption(d, caption)
  return img


def _portrait(rng, params):
  (colour,), caption = params
  img = _background(rng)
  d = ImageDraw.Draw(img)
  cx = rng.randint(170, 230)
  skin = _jitter(rng, (225, 190, 160), 20)
  d.ellipse((cx - 45, 70, cx + 45, 170), fill=skin)
  d.polygon([(cx - 60, 180), (cx + 60, 180), (cx + 110, 356), (cx - 110, 356)],
            fill=_colour(rng, colour))
  d.rectangle((cx - 8, 180, cx + 8, 260), fill=(240, 240, 240))
  _caption(d, caption)
  return img


def _boat(rng, params):
  (colour,), caption = params
  img = _background(rng)
  d = ImageDraw.Draw(img)
  d.rectangle((0, 250, SIZE, SIZE), fill=_jitter(rng, (70, 110, 150), 15))
  x = rng.randint(40, 120)
  d.polygon([(x, 200), (x + 240, 200), (x + 205, 262), (x + 35, 262)],
            fill=_colour(rng, colour))
  d.rectangle((x + 70, 150, x + 170, 200), fill=_jitter(rng, (235, 235, 235), 8))
  _decor(rng, d, rng.randint(2, 6), (0, 270, SIZE - 20, 340))
  _caption(d, caption)
  return img


def _count(rng, obj, params):
  """`n` copies of an object (tower, medal, bridge arch) side by side."""
  (n,), caption = params
  img = _background(rng)
  d = ImageDraw.Draw(img)
  stone = _jitter(rng, (150, 140, 125), 15)
  slot = (SIZE - 20) / n
  base = 330 if caption else 370
  if obj == "bridge":
    d.rectangle((0, base - 40, SIZE, SIZE), fill=_jitter(rng, (70, 110, 150), 15))
  for i in range(n):
    x0 = 10 + i * slot + slot * 0.12
    x1 = 10 + (i + 1) * slot - slot * 0.12
    if obj == "tower":
      top = base - rng.randint(120, 220)
      d.rectangle((x0, top, x1, base), fill=stone)
      step = (x1 - x0) / 5
      for k in range(0, 5, 2):  # battlements
        d.rectangle((x0 + k * step, top - 12, x0 + (k + 1) * step, top), fill=stone)
    elif obj == "medal":
      cy = rng.randint(170, 230)
      r = min(slot * 0.36, 40)
      cx = (x0 + x1) / 2
      d.polygon([(cx - r * 0.5, 60), (cx + r * 0.5, 60), (cx, cy - r)], fill=(30, 60, 160))
      d.ellipse((cx - r, cy - r, cx + r, cy + r), fill=(212, 175, 55))
    elif obj == "bridge":
      top = base - 110
      d.rectangle((x0, top, x1, top + 18), fill=stone)
      d.rectangle((x0, top, x0 + 10, base - 40), fill=stone)
      d.rectangle((x1 - 10, top, x1, base - 40), fill=stone)
    else:
      raise ValueError(f"unknown object {obj!r}")
  _caption(d, caption)
  return img


def _emblem(rng, params, shield: bool):
  (colour, shape), caption = params
  img = _background(rng)
  d = ImageDraw.Draw(img)
  cx, cy = rng.randint(180, 220), rng.randint(160, 200)
  if shield:  # A crest: the shape on a pale shield.
    d.polygon([(cx - 130, cy - 130), (cx + 130, cy - 130), (cx + 130, cy + 40),
               (cx, cy + 150), (cx - 130, cy + 40)], fill=_jitter(rng, (238, 232, 215), 8))
  _shape(d, shape, cx, cy, rng.randint(80, 105), _colour(rng, colour))
  _caption(d, caption)
  return img


def _chart(rng, params):
  """A bar chart whose bars are labelled with years; the tallest is the claimed year."""
  (years, heights), caption = params
  img = Image.new("RGB", (SIZE, SIZE), _jitter(rng, (246, 246, 242), 6))
  d = ImageDraw.Draw(img)
  bar = _colour(rng, rng.choice(("blue", "green", "orange", "purple", "grey")))
  base = 320 if caption else 350
  d.line((30, base, SIZE - 20, base), fill=(40, 40, 40), width=2)
  slot = (SIZE - 60) / len(years)
  for i, (year, h) in enumerate(zip(years, heights)):
    x0 = 40 + i * slot + 6
    top = base - h * 2.8
    d.rectangle((x0, top, x0 + slot - 12, base), fill=bar)
    d.text((x0, base + 4), year, fill=(30, 30, 30), font=_font(16))
  _caption(d, caption)
  return img


def _placard(rng, params):
  """A sign stating a fact in words (proof of text facts)."""
  lines, _ = params
  img = _background(rng, light=False)
  d = ImageDraw.Draw(img)
  board = _jitter(rng, (235, 230, 210), 10)
  d.rectangle((30, 110, 370, 290), fill=board, outline=(60, 50, 40), width=6)
  for i, line in enumerate(lines):
    d.text((48, 135 + i * 60), line.upper()[:24], fill=(30, 30, 30), font=_font(26))
  return img


def _scene(rng, params):
  """A street or landscape that states nothing in particular."""
  _, caption = params
  img = _background(rng)
  d = ImageDraw.Draw(img)
  ground = rng.randint(230, 300)
  d.rectangle((0, ground, SIZE, SIZE), fill=_jitter(rng, (110, 140, 90), 30))
  for _ in range(rng.randint(2, 6)):
    x, w, h = rng.randint(0, 340), rng.randint(40, 90), rng.randint(50, 150)
    d.rectangle((x, ground - h, x + w, ground), fill=_jitter(rng, (170, 160, 150), 40))
    d.polygon([(x - 6, ground - h), (x + w + 6, ground - h), (x + w // 2, ground - h - 35)],
              fill=_jitter(rng, (120, 70, 60), 25))
  _decor(rng, d, rng.randint(4, 12), (0, ground, SIZE - 20, SIZE - 20))
  _caption(d, caption)
  return img


_RENDERERS = {
    "flag": _flag, "portrait": _portrait, "boat": _boat, "chart": _chart,
    "placard": _placard, "scene": _scene,
    "crest": lambda rng, p: _emblem(rng, p, shield=True),
    "emblem": lambda rng, p: _emblem(rng, p, shield=False),
    "count:tower": lambda rng, p: _count(rng, "tower", p),
    "count:medal": lambda rng, p: _count(rng, "medal", p),
    "count:bridge": lambda rng, p: _count(rng, "bridge", p),
}


def _junk_bytes(rng: random.Random, fmt: str, size: tuple[int, int]) -> bytes:
  if fmt == "SVG":
    w, h = size
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}">'
            f'<rect width="{w}" height="{h}" fill="#{rng.randrange(1 << 24):06x}"/></svg>\n'
            ).encode("ascii")
  img = Image.new("RGB", size, _jitter(rng, (200, 200, 200), 50))
  if min(size) > 8:
    d = ImageDraw.Draw(img)
    d.rectangle((size[0] // 4, size[1] // 4, 3 * size[0] // 4, 3 * size[1] // 4),
                fill=_jitter(rng, (60, 60, 60), 40))
  return _encode(img, fmt)


def _encode(img: Image.Image, fmt: str) -> bytes:
  buf = io.BytesIO()
  if fmt == "JPEG":
    img.save(buf, format="JPEG", quality=JPEG_QUALITY, optimize=False, progressive=False)
  elif fmt == "PNG":
    img.save(buf, format="PNG", optimize=False, compress_level=6)
  elif fmt == "GIF":
    img.convert("P", palette=Image.Palette.WEB).save(buf, format="GIF")
  elif fmt == "ICO":
    img.save(buf, format="ICO", sizes=[img.size])
  else:
    raise ValueError(f"unknown image format {fmt!r}")
  return buf.getvalue()


def render_bytes(job: ImageJob) -> bytes:
  """The encoded file of one job (same job -> same bytes)."""
  rng = random.Random(job.seed)
  if job.kind == "junk":
    fmt, size = job.params
    return _junk_bytes(rng, fmt, size)
  try:
    renderer = _RENDERERS[job.kind]
  except KeyError:
    raise ValueError(f"unknown image kind {job.kind!r}") from None
  return _encode(renderer(rng, job.params), "JPEG")


def write_job(root: str, job: ImageJob) -> int:
  """Renders a job and writes its bytes to every path; returns the number of files."""
  data = render_bytes(job)
  for path in job.paths:
    with open(os.path.join(root, path), "wb") as f:
      f.write(data)
  return len(job.paths)
