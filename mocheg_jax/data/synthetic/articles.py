"""Each claim's knowledge-base articles: which exist, what they say, which images they hold.

Two passes per claim, each from its own random stream so they can run apart:

* `plan_claims` (cheap, all claims up front): the claim's articles (ids, subjects, lengths,
  how many evidence sentences each holds) and its images (names and render jobs), so the
  image workers can start before any text is written;
* `compose` (streamed, one claim at a time): the sentences of the claim's articles, with
  the evidence sentences at random places among hard negatives and fillers.

Evidence by verdict (text facts / image-only facts):
* supported, refuted: a sentence stating the entity's true value (refuted claims assert
  another one), plus sentences about the same fact; for image-only facts only sentences
  about the fact, never its value: the proof image shows the value;
* NEI: sentences about the entity's other facts and about this fact without its value.
"""

from __future__ import annotations

import dataclasses
import random

from mocheg_jax.data import labels
from mocheg_jax.data.images import blocked_name_reason, kb_image_name, proof_image_name
from mocheg_jax.data.synthetic import lexicon
from mocheg_jax.data.synthetic import scales
from mocheg_jax.data.synthetic import values as values_lib
from mocheg_jax.data.synthetic.attributes import ATTRIBUTES, TEXT_BY_KIND, VISUAL_BY_KIND
from mocheg_jax.data.synthetic.knowledge import Claim, Entity, Knowledge
from mocheg_jax.data.synthetic.render import ImageJob
from mocheg_jax.data.synthetic.rng import (
    binomial_between, derive_seed, rng_for, weighted_choice)
from mocheg_jax.data.synthetic.sentences import SentenceMaker, check_sentence
from mocheg_jax.utils.progress import track

# How many of a claim's text evidence sentences may live in one article: with the
# evidence counts per claim this puts ~30% of articles in some claim's qrels.
_EVIDENCE_DOCS_WEIGHTS = ((1, 0.1), (2, 0.3), (3, 0.4), (4, 0.2))
_CAPTION_PROBABILITY = 0.6
_REAL_BASENAMES = (
    "IMG_{n4}.jpg", "photo-{n5}.jpg", "GettyImages-{n7}.jpg", "{slug}-{word}-{n1}.jpg",
    "shutterstock_{n7}.jpg", "{date}_{n1}.jpg", "image-{n5}", "DSC{n4}.JPG",
    "{slug}-{word}.jpeg", "file-{date}-{n4}.jpg")
_BASENAME_WORDS = ("photo", "view", "main", "archive", "street", "harbour", "portrait",
                   "file", "scene", "picture", "detail", "old")
# Junk: names the paper's cleaning rules drop (with their format and size) ...
_BLOCKED_JUNK = (
    ("site-logo.png", "PNG", (600, 600)), ("logo-header.jpg", "JPEG", (240, 80)),
    ("header-banner-728x90.jpg", "JPEG", (728, 90)), ("share-icon-32.png", "PNG", (32, 32)),
    ("loading-spinner.gif", "GIF", (64, 64)), ("favicon.ico", "ICO", (32, 32)),
    ("lazyload-placeholder.jpg", "JPEG", (800, 600)), ("counter.cgi", "GIF", (1, 1)),
    ("Logo_small.png", "PNG", (120, 60)), ("tracking-pixel.php", "GIF", (1, 1)),
    ("Bubble-quote.png", "PNG", (48, 48)), ("sprite.svg", "SVG", (24, 24)),
    ("rating-false.png", "PNG", (400, 400)), ("rating-true.png", "PNG", (400, 400)),
    ("sidebar-ad-300x250.jpg", "JPEG", (300, 250)), ("divider-line.png", "PNG", (640, 4)),
)
# ... and images that are too small (either side under 400 pixels).
_SMALL_JUNK = (("thumb-{n5}.jpg", (120, 90)), ("avatar-{n4}.jpg", (150, 150)),
               ("{slug}-thumbnail-{n1}.jpg", (300, 200)), ("preview-{n4}.jpg", (640, 360)),
               ("crop-{n5}.jpg", (399, 500)))


@dataclasses.dataclass
class DocPlan:
  doc_id: int
  subject: Entity
  n_sentences: int
  n_evidence: int          # how many of the claim's evidence sentences it holds
  rumour: bool             # restates the claim (an article quoting the rumour)
  link_url: str
  archive_url: str


@dataclasses.dataclass
class ImagePlan:
  kb_name: str
  doc_id: int
  proof_name: str | None   # the proof image whose KB twin this is
  junk: bool
  job: ImageJob


@dataclasses.dataclass
class ClaimPlan:
  claim: Claim
  docs: list[DocPlan]
  images: list[ImagePlan]


@dataclasses.dataclass
class DocText:
  doc: DocPlan
  sentences: list[str]
  paragraph_sizes: list[int]
  evidence_positions: list[int]   # indices of evidence sentences, in order

  def origin_document(self) -> str:
    """`<p>`-wrapped paragraphs, one per line."""
    parts, i = [], 0
    for size in self.paragraph_sizes:
      parts.append("<p>" + " ".join(self.sentences[i:i + size]) + "</p>")
      i += size
    return "\n".join(parts)


# ---- planning ---------------------------------------------------------------------------
def plan_claims(knowledge: Knowledge, scale: scales.Scale, seed: int,
                progress: bool = False) -> list[ClaimPlan]:
  """Articles and images of every claim, in claim_id order; article ids are consecutive."""
  plans, next_doc = [], 1
  for claim in track(knowledge.claims, "claims (plan)", unit="claim", enabled=progress):
    plan = _plan_claim(knowledge, scale, seed, claim, next_doc)
    next_doc += len(plan.docs)
    plans.append(plan)
  return plans


def _plan_claim(knowledge: Knowledge, scale: scales.Scale, seed: int, claim: Claim,
                first_doc: int) -> ClaimPlan:
  rng = rng_for(seed, "plan", claim.claim_id)
  entity = claim.entity
  family = [e for e in knowledge.families[entity.family] if e is not entity]
  n_ev_docs = 0
  if claim.n_text_evidence:
    n_ev_docs = min(claim.n_text_evidence, weighted_choice(rng, _EVIDENCE_DOCS_WEIGHTS))
  lo, hi, mean = scale.docs_per_claim
  n_docs = max(binomial_between(rng, lo, hi, mean), n_ev_docs + 1)
  per_doc = [1] * n_ev_docs
  for _ in range(claim.n_text_evidence - n_ev_docs):
    per_doc[rng.randrange(n_ev_docs)] += 1
  rumour_doc = n_ev_docs + rng.randrange(n_docs - n_ev_docs) if rng.random() < 0.5 else -1
  docs = []
  s_lo, s_hi, s_mean = scale.sentences_per_doc
  for i in range(n_docs):
    n_evidence = per_doc[i] if i < n_ev_docs else 0
    if i < n_ev_docs or i == rumour_doc:
      subject = entity
    else:
      r = rng.random()
      if r < 0.4 or not family:
        subject = entity
      elif r < 0.8:
        subject = rng.choice(family)
      else:
        subject = rng.choice(knowledge.entities)
    n_sentences = max(binomial_between(rng, s_lo, s_hi, s_mean), n_evidence + 3)
    docs.append(DocPlan(0, subject, n_sentences, n_evidence, i == rumour_doc, "", ""))
  rng.shuffle(docs)  # Evidence articles anywhere in the claim's list ...
  for i, doc in enumerate(docs):
    doc.doc_id = first_doc + i  # ... with ids still consecutive in list order.
    doc.link_url = _link_url(rng, doc.subject, doc.doc_id)
    doc.archive_url = _archive_url(rng)
  return ClaimPlan(claim, docs, _plan_images(knowledge, scale, seed, rng, claim, docs, family))


def _link_url(rng: random.Random, subject: Entity, doc_id: int) -> str:
  return (f"https://www.{rng.choice(lexicon.WEB_DOMAINS)}/{rng.randint(2009, 2022)}/"
          f"{rng.randint(1, 12):02d}/{lexicon.slug(subject.name)}-{doc_id}/")


def _archive_url(rng: random.Random) -> str:
  if rng.random() < 0.4:
    return ""
  return "https://archive.ph/" + "".join(rng.choice("abcdefghjkmnpqrstuvwxyz23456789")
                                         for _ in range(5))


_BASENAME_FIELDS = {
    "n1": lambda rng, subject: rng.randint(1, 9),
    "n4": lambda rng, subject: rng.randint(1000, 9999),
    "n5": lambda rng, subject: rng.randint(10000, 99999),
    "n7": lambda rng, subject: rng.randint(1_000_000, 9_999_999),
    "slug": lambda rng, subject: lexicon.slug(subject.name),
    "word": lambda rng, subject: rng.choice(_BASENAME_WORDS),
    "date": lambda rng, subject: (f"{rng.randint(2012, 2022)}{rng.randint(1, 12):02d}"
                                  f"{rng.randint(1, 28):02d}"),
}


def _basename(rng: random.Random, pattern: str, subject: Entity) -> str:
  """Fills only the fields the pattern uses, in a fixed order."""
  return pattern.format(**{k: f(rng, subject) for k, f in _BASENAME_FIELDS.items()
                           if "{" + k + "}" in pattern})


def _entity_image(rng: random.Random, entity: Entity, key: str) -> tuple[str, tuple]:
  """What a picture of one of the entity's facts shows: the fact's true value."""
  attribute = ATTRIBUTES[key]
  value = entity.values[key]
  if attribute.visual:
    caption = entity.name if rng.random() < _CAPTION_PROBABILITY else ""
    return attribute.render, (value.data, caption)
  return "placard", ((entity.name, f"{attribute.label}: {value.text}"), "")


def _scene(rng: random.Random, entity: Entity) -> tuple[str, tuple]:
  return "scene", ((), entity.name if rng.random() < 0.4 else "")


def _hard_negative(rng: random.Random, knowledge: Knowledge, claim: Claim,
                   family: list[Entity]) -> tuple[str, tuple] | None:
  """A picture of a free documented fact of the claim's entity or a look-alike entity,
  preferring the claim's own attribute of look-alikes (same kind of picture, other value)."""
  key = claim.attribute.key
  same = [e for e in family if e.kind == claim.entity.kind and key in e.documented
          and knowledge.is_free(e, key)]
  if same and rng.random() < 0.5:
    return _entity_image(rng, rng.choice(same), key)
  owner = claim.entity if rng.random() < 0.5 or not family else rng.choice(family)
  keys = _free_keys(knowledge, owner, documented=True, text_only=False)
  if not keys:
    return None
  return _entity_image(rng, owner, rng.choice(keys))


def _plan_images(knowledge: Knowledge, scale: scales.Scale, seed: int, rng: random.Random,
                 claim: Claim, docs: list[DocPlan], family: list[Entity]) -> list[ImagePlan]:
  entity = claim.entity
  mean = scale.kb_images_per_claim
  n_kb = max(binomial_between(rng, 2, 14, mean), claim.n_proof_images)
  contents: list[tuple[str, tuple, bool, bool]] = []  # kind, params, is_proof, is_junk
  for _ in range(claim.n_proof_images):
    if claim.label == labels.NEI:
      own = [a.key for a in VISUAL_BY_KIND[entity.kind]
             if a.key in entity.documented and knowledge.is_free(entity, a.key)]
      kind, params = (_entity_image(rng, entity, rng.choice(own))
                      if own and rng.random() < 0.5 else _scene(rng, entity))
      if kind == "scene":
        params = ((), entity.name)
    else:
      kind, params = _entity_image(rng, entity, claim.attribute.key)
    contents.append((kind, params, True, False))
  junk_fraction = scales.SHAPE.junk_image_fraction
  for _ in range(n_kb - claim.n_proof_images):
    if rng.random() < junk_fraction:
      contents.append(("junk", (), False, True))
    elif rng.random() < 0.4 and (neg := _hard_negative(rng, knowledge, claim, family)):
      contents.append((neg[0], neg[1], False, False))
    else:
      contents.append((*_scene(rng, rng.choice(docs).subject), False, False))
  rng.shuffle(contents)
  evidence_docs = [d for d in docs if d.n_evidence] or docs
  per_doc: dict[int, int] = {}
  proof_id = 0
  images = []
  for kind, params, is_proof, is_junk in contents:
    doc = rng.choice(evidence_docs if is_proof else docs)
    img_id = per_doc.get(doc.doc_id, 0)
    per_doc[doc.doc_id] = img_id + 1
    if is_junk:
      kind, params, basename = _junk(rng, doc.subject)
    else:
      basename = _basename(rng, rng.choice(_REAL_BASENAMES), doc.subject)
    kb_name = kb_image_name(claim.claim_id, doc.doc_id, img_id, basename)
    proof_name = proof_image_name(claim.claim_id, proof_id, basename) if is_proof else None
    if not is_junk and (blocked_name_reason(kb_name) or
                        (proof_name and blocked_name_reason(proof_name))):
      # A slug that happens to contain a blocked part ("icon", "-line"): a neutral name.
      basename = f"IMG_{rng.randint(1000, 9999)}.jpg"
      kb_name = kb_image_name(claim.claim_id, doc.doc_id, img_id, basename)
      proof_name = proof_image_name(claim.claim_id, proof_id, basename) if is_proof else None
    paths = ["images/" + kb_name]
    if proof_name is not None:
      proof_id += 1
      paths += ["images/" + proof_name, f"{claim.split}/images/{proof_name}"]
    job = ImageJob(tuple(paths), kind, params, derive_seed(seed, "image", kb_name))
    images.append(ImagePlan(kb_name, doc.doc_id, proof_name, is_junk, job))
  return images


def _junk(rng: random.Random, subject: Entity) -> tuple[str, tuple, str]:
  """An image the cleaning rules drop: a blocked name (half) or a small size (half)."""
  if rng.random() < 0.5:
    name, fmt, size = rng.choice(_BLOCKED_JUNK)
    return "junk", (fmt, size), name
  pattern, size = rng.choice(_SMALL_JUNK)
  return "junk", ("JPEG", size), _basename(rng, pattern, subject)


# ---- text -------------------------------------------------------------------------------
def compose(plan: ClaimPlan, knowledge: Knowledge, seed: int) -> list[DocText]:
  """The sentences of the claim's articles, in article order."""
  rng = rng_for(seed, "text", plan.claim.claim_id)
  maker = SentenceMaker(rng)
  claim = plan.claim
  evidence = _evidence_sentences(maker, claim)
  texts, used = [], 0
  for doc in plan.docs:
    items = evidence[used:used + doc.n_evidence]
    used += doc.n_evidence
    texts.append(_compose_doc(rng, maker, knowledge, claim, doc, items))
  return texts


def _evidence_sentences(maker: SentenceMaker, claim: Claim) -> list[str]:
  """The claim's text evidence, most telling first (distinct sentences)."""
  rng, entity, attribute = maker.rng, claim.entity, claim.attribute
  name, n = entity.name, claim.n_text_evidence
  out: list[str] = []

  def add(make) -> None:
    for _ in range(12):
      s = make()
      if s not in out:
        break
    out.append(s)

  if n == 0:
    return out
  if claim.label == labels.NEI:
    if rng.random() < 0.6:
      add(lambda: maker.unknown(name, attribute))
    while len(out) < n:
      if claim.siblings and rng.random() < 0.55:
        key = rng.choice(claim.siblings)
        add(lambda: maker.fact(name, ATTRIBUTES[key], entity.values[key]))
      else:
        add(lambda: maker.topic(name, attribute))
  elif attribute.visual:
    while len(out) < n:
      add(lambda: maker.topic(name, attribute))
  else:
    add(lambda: maker.fact(name, attribute, claim.true_value))
    while len(out) < n:
      if rng.random() < 0.3:
        add(lambda: maker.fact(name, attribute, claim.true_value))
      else:
        add(lambda: maker.topic(name, attribute))
  return out[:n]


def _free_keys(knowledge: Knowledge, entity: Entity, documented: bool,
               text_only: bool) -> list[str]:
  """Attributes of the entity no claim owns (cached: the knowledge is fixed by now)."""
  key = (entity.eid, documented, text_only)
  keys = knowledge.cache.get(key)
  if keys is None:
    attrs = TEXT_BY_KIND[entity.kind] if text_only else (
        TEXT_BY_KIND[entity.kind] + VISUAL_BY_KIND[entity.kind])
    keys = knowledge.cache[key] = [
        a.key for a in attrs
        if (a.key in entity.documented) == documented and knowledge.is_free(entity, a.key)]
  return keys


def _body_sentence(rng: random.Random, maker: SentenceMaker, knowledge: Knowledge,
                   claim: Claim, subject: Entity, family: list[Entity]) -> str:
  """One non-evidence sentence: a hard negative or a filler."""
  r = rng.random()
  name = subject.name
  if r < 0.22:
    keys = _free_keys(knowledge, subject, documented=True, text_only=True)
    if keys:
      key = rng.choice(keys)
      return maker.fact(name, ATTRIBUTES[key], subject.values[key])
  elif r < 0.36:
    keys = (_free_keys(knowledge, subject, True, False)
            + _free_keys(knowledge, subject, False, False))
    if keys:
      return maker.topic(name, ATTRIBUTES[rng.choice(keys)])
  elif r < 0.40:
    keys = _free_keys(knowledge, subject, documented=False, text_only=False)
    if keys:
      return maker.unknown(name, ATTRIBUTES[rng.choice(keys)])
  elif r < 0.58:
    # A look-alike entity, preferably with the claim's attribute.
    others = [e for e in family if e is not subject]
    if others:
      other = rng.choice(others)
      key = claim.attribute.key
      if other.kind != claim.entity.kind or not knowledge.is_free(other, key):
        keys = _free_keys(knowledge, other, True, False)
        key = rng.choice(keys) if keys else ""
      if key:
        attribute = ATTRIBUTES[key]
        if key in other.documented and not attribute.visual and rng.random() < 0.7:
          return maker.fact(other.name, attribute, other.values[key])
        return maker.topic(other.name, attribute)
  elif r < 0.97:
    if r < 0.82:
      return maker.filler(name, subject.kind, subject.region)
    return maker.generic(subject.region)
  else:
    keys = _free_keys(knowledge, subject, True, False)
    if keys:
      attribute = ATTRIBUTES[rng.choice(keys)]
      return maker.rumour(name, attribute, values_lib.sample(rng, attribute.values))
  return maker.filler(name, subject.kind, subject.region)


def _compose_doc(rng: random.Random, maker: SentenceMaker, knowledge: Knowledge,
                 claim: Claim, doc: DocPlan, evidence: list[str]) -> DocText:
  subject = doc.subject
  family = knowledge.families[subject.family]
  n_body = doc.n_sentences - len(evidence)
  body = [maker.intro(subject.name, subject.kind, subject.region)]
  seen = set(body) | set(evidence)
  if doc.rumour:
    rumour = maker.rumour(claim.entity.name, claim.attribute, claim.value)
    body.append(rumour)
    seen.add(rumour)
  while len(body) < n_body:
    for _ in range(8):
      s = _body_sentence(rng, maker, knowledge, claim, subject, family)
      if s not in seen:
        break
    seen.add(s)
    body.append(s)
  # Keep the intro first; shuffle the rest, then put the evidence at random places.
  rest = body[1:]
  rng.shuffle(rest)
  sentences = [body[0]] + rest
  positions = sorted(rng.sample(range(1, len(sentences) + len(evidence)), len(evidence)))
  for pos, s in zip(positions, evidence):
    sentences.insert(pos, s)
  for s in sentences:
    check_sentence(s)
  sizes, left = [], len(sentences)
  while left:
    size = min(left, rng.randint(1, 5))
    sizes.append(size)
    left -= size
  return DocText(doc, sentences, sizes, positions)
