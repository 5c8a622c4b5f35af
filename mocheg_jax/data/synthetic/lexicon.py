"""Words of the synthetic world: syllables for names, colours, counts, shapes, goods.

Names are composed from syllables so that a world of any size has enough of them, and so
that families of look-alike names exist ("Brivelle", "Brivell", "Port Brivelle"): entities
with similar names are the hard negatives of retrieval. No name may contain a colour or
count word, a substring the image cleaning rules block, or anything the sentence splitter
treats specially (checked by `acceptable_name`).
"""

from __future__ import annotations

import random
import re

from mocheg_jax.data.images import BLOCKED_NAME_PARTS

# ---- name syllables -------------------------------------------------------------------
ONSETS: tuple[str, ...] = (
    "Bri", "Val", "Kor", "Mel", "Tor", "Sel", "Ard", "Ost", "Fen", "Gal", "Har", "Lis",
    "Mor", "Nor", "Pel", "Quen", "Ros", "Sar", "Tam", "Ul", "Ven", "Wel", "Yar", "Zel",
    "Dun", "Cal", "Bel", "Eld", "Fal", "Gor", "Hol", "Jor", "Kel", "Lor", "Mar", "Ner",
    "Orn", "Pra", "Ren", "Sol", "Thal", "Var", "Ast", "Brun", "Cor", "Dal", "Ers", "Fros",
    "Gil", "Hav", "Isk", "Kam", "Lun", "Mir", "Nol", "Pav", "Rask", "Stav", "Tul", "Vig",
)
MIDDLES: tuple[str, ...] = (
    "e", "a", "o", "i", "ve", "la", "ro", "mi", "ta", "ne", "do", "ri", "sa", "bo", "ka",
    "le", "ma", "ni", "ra", "so", "ti", "lu", "ste", "ga",
)
# Each group gives one family its three look-alike base names.
ENDING_GROUPS: tuple[tuple[str, str, str], ...] = (
    ("lle", "ll", "lla"), ("n", "ne", "na"), ("rd", "rde", "rda"), ("th", "the", "tha"),
    ("sk", "ska", "ske"), ("mar", "mara", "mare"), ("wick", "wicke", "wyck"),
    ("dale", "dal", "dala"), ("holm", "holme", "holma"), ("vik", "vika", "vike"),
    ("stad", "stadt", "stade"), ("ton", "tona", "tone"), ("burg", "berg", "borg"),
    ("mont", "monte", "monti"), ("ssa", "sse", "ssi"), ("nor", "nora", "nore"),
)
TOWN_PATTERNS: tuple[str, ...] = (
    "{b}", "Port {b}", "Upper {b}", "New {b}", "St. {b}", "{b} Falls", "Lower {b}", "{b} Bay")
RIVER_PATTERNS: tuple[str, ...] = ("the {b} River", "the River {b}", "the {b} Stream")
COMPANY_PATTERNS: tuple[str, ...] = (
    "{b} Works", "{b} Holdings", "{b} Textiles", "{b} Group", "{b} Instruments",
    "{b} Foundry", "{b} Mills", "{b} Shipping")
FIRST_NAMES: tuple[str, ...] = (
    "Anna", "Tomas", "Elena", "Marek", "Ines", "Oskar", "Lena", "Viktor", "Mira", "Jonas",
    "Clara", "Emil", "Rosa", "Felix", "Nadia", "Pavel", "Ada", "Hugo", "Sofia", "Anton",
    "Greta", "Lukas", "Vera", "Milan", "Ida", "Bruno", "Alma", "Karl", "Nora", "Erik",
    "Hanna", "Leon", "Maja", "Otto", "Petra", "Ruben", "Sara", "Theo", "Wanda", "Jakob",
)
# Titles are abbreviations the sentence splitter must not split after ("Dr. Anna Vask").
TITLES: tuple[str, ...] = ("Dr.", "Mr.", "Mrs.", "Ms.")
# Single-letter initials; "A" and "I" are left out because they are also words.
INITIALS: tuple[str, ...] = tuple("BCDEFGHJKLMNPRSTVW")
SURNAME_ONSETS: tuple[str, ...] = (
    "Ha", "Le", "Vo", "Ki", "Da", "Mo", "Pe", "Ri", "Sa", "To", "Wu", "Be", "Fa", "No",
    "Gu", "Lo", "Me", "Ta", "Ve", "Bo")
SURNAME_ENDINGS: tuple[str, ...] = (
    "rsen", "lund", "vik", "strom", "nko", "ssel", "dorf", "mann", "vay", "rell", "tos",
    "zek", "mir", "lani", "berg", "quist", "nard", "sky", "vin", "chek")
PLACE_ONSETS: tuple[str, ...] = (
    "Kess", "Ambel", "Drom", "Hest", "Ilsen", "Lant", "Merr", "Oddle", "Pask", "Rill",
    "Sunder", "Trell", "Wend", "Yeld", "Bexen", "Carrow", "Eskel", "Gransel")
PLACE_ENDINGS: tuple[str, ...] = ("by", "ford", "ham", "stow", "field", "mouth", "ley", "hurst")
REGION_PATTERNS: tuple[str, ...] = (
    "the {p} hills", "the {p} valley", "the {p} district", "the {p} plain", "the {p} lowlands")

# ---- values -------------------------------------------------------------------------
# Colour words and the RGB they are drawn with: a claim's colour word is the colour of the
# pixels, which is what lets an image retriever learn colour words.
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (200, 30, 35), "orange": (240, 130, 20), "yellow": (238, 206, 28),
    "green": (40, 150, 60), "blue": (30, 80, 200), "purple": (118, 48, 160),
    "pink": (240, 120, 180), "brown": (120, 75, 35), "black": (22, 22, 22),
    "grey": (128, 128, 128),
}
COLOUR_NAMES: tuple[str, ...] = tuple(COLOURS)
COUNT_WORDS: dict[int, str] = {
    1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight"}
SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "star", "diamond", "hexagon")
EXPORTS: tuple[str, ...] = (
    "wool", "timber", "glass", "salt", "copper", "cheese", "linen", "pottery", "honey",
    "rope", "paper", "leather", "tin", "grain", "soap", "lace", "cider", "ink", "tea", "silk")
PRODUCTS: tuple[str, ...] = (
    "bicycles", "lanterns", "umbrellas", "clocks", "kettles", "radios", "skates", "pianos",
    "boots", "telescopes", "sewing machines", "typewriters", "candles", "tiles", "compasses")
PROFESSIONS: tuple[str, ...] = (
    "architect", "surgeon", "painter", "botanist", "sculptor", "engineer", "violinist",
    "chemist", "novelist", "cartographer", "astronomer", "pilot", "lawyer", "pharmacist",
    "geologist")
FISH: tuple[str, ...] = (
    "trout", "salmon", "pike", "perch", "eel", "carp", "bream", "sturgeon", "grayling",
    "barbel")
RIVER_SOURCES: tuple[str, ...] = (
    "the {p} hills", "{p} Lake", "the {p} glacier", "the {p} marshes", "a spring near {p}")

# ---- context words --------------------------------------------------------------------
OUTLETS: tuple[str, ...] = (
    "the Valley Herald", "the Northern Courier", "the Harbour Gazette", "the Evening Ledger",
    "the county archive", "the regional census office", "the Daily Lantern",
    "the Coastal Times", "the Weekly Almanac", "the Chamber of Commerce",
    "the Museum of Local History", "the Federal Statistics Bureau", "the Provincial Record",
    "the Morning Dispatch", "a local historical society", "the Trade Register",
)
SOCIAL: tuple[str, ...] = (
    "Facebook", "Twitter", "TikTok", "Instagram", "WhatsApp", "Reddit", "YouTube",
    "Telegram")
SOURCES: tuple[str, ...] = (  # Corpus2 `Source`: where the rumour circulated.
    "Facebook post", "Twitter", "TikTok video", "Instagram", "Email chain", "Viral image",
    "Blog post", "YouTube video", "WhatsApp message", "Reddit")
MONTHS: tuple[str, ...] = (
    "January", "February", "March", "April", "May", "June", "July", "August", "September",
    "October", "November", "December")
WEB_DOMAINS: tuple[str, ...] = (
    "valleyherald.example", "northerncourier.example", "harbourgazette.example",
    "eveningledger.example", "coastaltimes.example", "weeklyalmanac.example",
    "provincialrecord.example", "morningdispatch.example", "tradereg.example",
    "localhistory.example")

_WORD = re.compile(r"[a-z]+")
_FORBIDDEN_WORDS = frozenset(COLOUR_NAMES) | frozenset(COUNT_WORDS.values()) | frozenset(SHAPES)


def acceptable_name(name: str) -> bool:
  """Whether a composed name is safe: no colour/count/shape word, no blocked image part."""
  lower = name.lower()
  if any(part.lower() in lower for part in BLOCKED_NAME_PARTS):
    return False
  return not any(w in _FORBIDDEN_WORDS for w in _WORD.findall(lower))


def slug(text: str) -> str:
  """A file-name-safe lower-case slug: "Port Brivelle" -> "port-brivelle"."""
  return "-".join(_WORD.findall(text.lower()))


def person_name(rng: random.Random, surname: str | None = None) -> str:
  """A person's name, sometimes with a title ("Dr. Anna Vask") or initials ("J. R. Vask")."""
  if surname is None:
    surname = rng.choice(SURNAME_ONSETS) + rng.choice(SURNAME_ENDINGS)
  style = rng.random()
  if style < 0.15:
    return f"{rng.choice(INITIALS)}. {rng.choice(INITIALS)}. {surname}"
  if style < 0.35:
    return f"{rng.choice(TITLES)} {rng.choice(FIRST_NAMES)} {surname}"
  return f"{rng.choice(FIRST_NAMES)} {surname}"


def place_name(rng: random.Random) -> str:
  return rng.choice(PLACE_ONSETS) + rng.choice(PLACE_ENDINGS)


def region_name(rng: random.Random) -> str:
  return rng.choice(REGION_PATTERNS).format(p=rng.choice(PLACE_ONSETS))


def format_int(n: int) -> str:
  """12500 -> "12,500"."""
  return f"{n:,}"
