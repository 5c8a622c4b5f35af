"""Batches of frozen-CLIP token states for the stance model, from evidence and a store.

`VerificationBatches(evidence, store)` turns `evidence.ClaimEvidence` lists into fixed-shape
examples (numpy, one per claim, in the evidence order):
```
claim       [Lc, Dt]      claim token states (store dtype unless `dtype` is given)
claim_mask  [Lc]          bool
text        [Nt, Lt, Dt]  one row per text item, first Nt items
text_mask   [Nt, Lt]      bool; an absent item is all False
image       [Ni, P, Dv]   patch states, first Ni images
image_mask  [Ni]          bool item presence (every patch of a present image is attended)
text_match  [Nt, Lc]      float32, only with `token_match`: 1 where the claim token's id
                          occurs among the item's tokens (special tokens included)
text_phrase_match [Nt, Lc] float32, only with `phrase_match`: 1 where the claim token and
                          a neighbour of it in the claim occur side by side, in that order,
                          in the item ("the Pellarda River" against "the River Pellarda":
                          every word matches, no name pair does)
claim_ids   [Lc]          int32, only with `claim_ids`: the claim's token ids, -1 on padding
image_score [Ni]          float32, only with `image_score`: cosine of CLIP's embeddings of
                          the claim and each image (0 for absent images; the store must
                          hold embeddings)
image_embed [Ni, E]       float32, only with `image_embeds`: CLIP's unit embedding of each
                          image (0 for absent images; the store must hold embeddings)
claim_embed [E]           float32, only with `image_embeds`: CLIP's unit claim embedding
text_relevant [Nt]        float32, only with `item_relevance`: 1 where the item is one of
                          the claim's evidence (ClaimEvidence.relevant_texts)
image_relevant [Ni]       float32, only with `item_relevance`: the same for the images
                          (ClaimEvidence.relevant_images)
label       int32         0 refuted, 1 supported, 2 NEI
claim_id    int32         -1 on padding rows
valid       bool          False on padding rows (evaluation's last batch)
```
Caps. The reference uses all gold evidence of a claim (a batch of one claim, any shape). A
jitted step needs fixed shapes, so items beyond `max_text_items` / `max_images` are cut
(the first ones are kept: the evidence order, best first for system evidence) and counted in
`cut`. Defaults: Lc = Lt = 77 (CLIP's context, the reference's max length), Nt = 16 text
items and Ni = 4 images. The synthetic tiny world has at most 6 evidence sentences and 2
proof images per claim, so nothing is cut there; the release has about 2 text evidence
paragraphs and 0.8 proof images per claim on average.

Token choice: the claim and items are the store's states of the whole tokenised text (BOS
and EOS included; the reference drops BOS only for claims without images, a quirk not
reproduced).

`train_dataset` is a grain pipeline (repeat forever, reshuffled per epoch, drop remainder,
process sharding by claim index as mocheg_jax/data/pipelines.py; its iterator's state is
saved with the checkpoint). `eval_batches` yields every claim once, in order, the last batch
padded with `valid` False rows.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator, Sequence

import grain
import numpy as np

from mocheg_jax.data import pipelines
from mocheg_jax.data.report import MochegInputError
from mocheg_jax.verification.evidence import NUM_CLASSES, ClaimEvidence
from mocheg_jax.verification.features import FeatureStore

Example = dict[str, np.ndarray]

DEFAULT_MAX_CLAIM_LEN = 77
DEFAULT_MAX_TEXT_LEN = 77
DEFAULT_MAX_TEXT_ITEMS = 16
DEFAULT_MAX_IMAGES = 4


@dataclasses.dataclass
class CutCounts:
  """What the caps removed (counted once, over all claims)."""
  text_items: int = 0          # text items beyond max_text_items
  claims_text_cut: int = 0     # claims that lost some
  images: int = 0              # images beyond max_images
  claims_images_cut: int = 0
  claims_truncated: int = 0    # claims with more tokens than max_claim_len
  texts_truncated: int = 0     # kept text items with more tokens than max_text_len

  def __str__(self) -> str:
    return (f"cut {self.text_items} text items ({self.claims_text_cut} claims), "
            f"{self.images} images ({self.claims_images_cut} claims); truncated "
            f"{self.claims_truncated} claims and {self.texts_truncated} text items")


def match_bits(claim_ids: np.ndarray, item_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Exact-match bits of claim tokens [Lc] in items [n, Lt] (-1: padding on either side):
  ([n, Lc] whether the token's id occurs in the item, [n, Lc] whether the token and a
  neighbour of it in the claim stand side by side, in the claim's order, in the item),
  float32, 0 on claim padding."""
  real = claim_ids >= 0
  same = (claim_ids[None, :, None] == item_ids[:, None, :]) & real[None, :, None]
  unigram = same.any(-1)
  # pair[n, q]: claim tokens q and q + 1 at item positions j and j + 1 for some j.
  pair = (same[:, :-1, :-1] & same[:, 1:, 1:]).any(-1)  # [n, Lc - 1]
  phrase = np.zeros_like(unigram)
  phrase[:, :-1] |= pair
  phrase[:, 1:] |= pair
  return unigram.astype(np.float32), phrase.astype(np.float32)


class VerificationBatches:
  """Fixed-shape examples of claims with their evidence (see the module docstring).

  Random access (`len`, `[i]`) makes it a grain data source.
  """

  def __init__(self, evidence: Sequence[ClaimEvidence], store: FeatureStore, *,
               max_claim_len: int = DEFAULT_MAX_CLAIM_LEN,
               max_text_len: int = DEFAULT_MAX_TEXT_LEN,
               max_text_items: int = DEFAULT_MAX_TEXT_ITEMS,
               max_images: int = DEFAULT_MAX_IMAGES, dtype: str | None = None,
               token_match: bool = False, phrase_match: bool = False,
               claim_ids: bool = False, image_score: bool = False,
               image_embeds: bool = False, item_relevance: bool = False):
    for name, value in (("max_claim_len", max_claim_len), ("max_text_len", max_text_len),
                        ("max_text_items", max_text_items), ("max_images", max_images)):
      if value < 1:
        raise ValueError(f"{name} must be positive, got {value}")
    self.store = store
    self.max_claim_len, self.max_text_len = max_claim_len, max_text_len
    self.max_text_items, self.max_images = max_text_items, max_images
    self.dtype = np.dtype(dtype or store.manifest.dtype)
    self.token_match, self.phrase_match = token_match, phrase_match
    self.claim_ids, self.image_score, self.image_embeds = claim_ids, image_score, image_embeds
    self.item_relevance = item_relevance
    for name, wanted in (("image_score", image_score), ("image_embeds", image_embeds)):
      if wanted and not store.manifest.embed_dim:
        raise MochegInputError(f"{store.dir}: {name} needs a feature store with CLIP "
                               "embeddings (build_store(embeddings=True))")
    self.claims = list(evidence)
    if not self.claims:
      raise MochegInputError("no claims to verify")
    self._check(self.claims)
    self.cut = self._count_cuts()

  def _check(self, claims: list[ClaimEvidence]) -> None:
    # A claim may come twice with different evidence (trained on both its system and its
    # gold evidence: verify.train_also_gold), not twice with the same.
    seen: set[tuple] = set()
    missing_texts, missing_images = [], []
    for e in claims:
      if not -2**31 <= e.claim_id < 2**31 - 1:
        raise MochegInputError(f"claim id {e.claim_id} does not fit in int32")
      key = (e.claim_id, e.texts, e.images)
      if key in seen:
        raise MochegInputError(f"claim {e.claim_id} occurs twice with the same evidence in "
                               "the evidence list")
      seen.add(key)
      if isinstance(e.label, bool) or not isinstance(e.label, (int, np.integer)) or not (
          0 <= e.label < NUM_CLASSES):
        raise MochegInputError(f"claim {e.claim_id}: label {e.label!r} is not in "
                               f"0..{NUM_CLASSES - 1}")
      missing_texts += [(e.claim_id, t) for t in (e.claim, *e.texts[:self.max_text_items])
                        if not self.store.has_text(t)]
      missing_images += [(e.claim_id, p) for p in e.images[:self.max_images]
                         if not self.store.has_image(p)]
    for what, missing in (("texts", missing_texts), ("images", missing_images)):
      if missing:
        claim_id, key = missing[0]
        raise MochegInputError(
            f"{self.store.dir}: {len(missing)} {what} of the evidence are not in the feature "
            f"store (e.g. {key[:80]!r} of claim {claim_id}); build the store with "
            "evidence.store_inputs(...) of this evidence")

  def _count_cuts(self) -> CutCounts:
    cut = CutCounts()
    for e in self.claims:
      extra_text = max(0, len(e.texts) - self.max_text_items)
      extra_images = max(0, len(e.images) - self.max_images)
      cut.text_items += extra_text
      cut.claims_text_cut += extra_text > 0
      cut.images += extra_images
      cut.claims_images_cut += extra_images > 0
      cut.claims_truncated += int(self.store.text_lengths([e.claim])[0] > self.max_claim_len)
      if e.texts:
        lengths = self.store.text_lengths(e.texts[:self.max_text_items])
        cut.texts_truncated += int((lengths > self.max_text_len).sum())
    return cut

  # ---- examples ----------------------------------------------------------------------
  def __len__(self) -> int:
    return len(self.claims)

  def __getitem__(self, index: int) -> Example:
    e = self.claims[index]
    m = self.store.manifest
    claim, claim_mask = self.store.text([e.claim], self.max_claim_len)
    texts = e.texts[:self.max_text_items]
    text = np.zeros((self.max_text_items, self.max_text_len, m.text_dim), self.dtype)
    text_mask = np.zeros((self.max_text_items, self.max_text_len), bool)
    if texts:
      text[:len(texts)], text_mask[:len(texts)] = self.store.text(texts, self.max_text_len)
    ids = {}  # Optional inputs, when asked for: the claim's ids are read once for both.
    if self.token_match or self.phrase_match or self.claim_ids:
      claim_ids = self.store.token_ids([e.claim], self.max_claim_len)[0]  # [Lc], -1 padding
      if self.token_match or self.phrase_match:
        unigram, phrase = self._token_matches(claim_ids, texts)
        if self.token_match:
          ids["text_match"] = unigram
        if self.phrase_match:
          ids["text_phrase_match"] = phrase
      if self.claim_ids:
        ids["claim_ids"] = claim_ids
    images = e.images[:self.max_images]
    image = np.zeros((self.max_images, m.patches, m.image_dim), self.dtype)
    if images:
      image[:len(images)] = self.store.image(images)
    if self.image_score or self.image_embeds:
      claim_embed, image_embed = self._embeddings(e.claim, images)
      if self.image_score:
        ids["image_score"] = image_embed @ claim_embed
      if self.image_embeds:
        ids["image_embed"], ids["claim_embed"] = image_embed, claim_embed
    if self.item_relevance:
      ids["text_relevant"] = _among(texts, e.relevant_texts, self.max_text_items)
      ids["image_relevant"] = _among(images, e.relevant_images, self.max_images)
    return {
        "claim": claim[0].astype(self.dtype), "claim_mask": claim_mask[0],
        "text": text, "text_mask": text_mask,
        "image": image, "image_mask": np.arange(self.max_images) < len(images), **ids,
        "label": np.int32(e.label), "claim_id": np.int32(e.claim_id), "valid": np.bool_(True),
    }

  def _token_matches(self, claim_ids: np.ndarray, texts: Sequence[str]
                     ) -> tuple[np.ndarray, np.ndarray]:
    """`match_bits` of the claim against each item (as cut to the lengths the model sees),
    [Nt, Lc] each, 0 on absent items."""
    unigram = np.zeros((self.max_text_items, self.max_claim_len), np.float32)
    phrase = np.zeros_like(unigram)
    if texts:
      item_ids = self.store.token_ids(texts, self.max_text_len)  # [n, Lt]
      unigram[:len(texts)], phrase[:len(texts)] = match_bits(claim_ids, item_ids)
    return unigram, phrase

  def _embeddings(self, claim: str, images: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """CLIP's unit embeddings of the claim [E] and of each image [Ni, E] (0 on padding),
    float32."""
    image_embed = np.zeros((self.max_images, self.store.manifest.embed_dim), np.float32)
    if images:
      image_embed[:len(images)] = self.store.image_embedding(images)
    return self.store.text_embedding([claim])[0].astype(np.float32), image_embed

  def padding_example(self) -> Example:
    """A row that fills the last evaluation batch: all masks False, valid False."""
    example = {k: np.zeros_like(v) for k, v in self[0].items()}
    example["claim_id"] = np.int32(-1)
    return example

  # ---- datasets ----------------------------------------------------------------------
  def train_dataset(self, batch_size: int, seed: int, *, shard_index: int | None = None,
                    shard_count: int | None = None,
                    read_ahead: pipelines.ReadAhead = pipelines.ReadAhead()
                    ) -> grain.IterDataset:
    """Batched examples forever, reshuffled every epoch; `iter()` of it has get_state /
    set_state for checkpoints.

    Args:
      batch_size: claims per batch (this process's share of a global batch); the last
        incomplete batch of the stream is never reached (it repeats forever).
      seed: the shuffle seed.
      shard_index, shard_count: this process's share of every global batch
        (pipelines.process_batches); default jax.process_index() / process_count().
      read_ahead: how far grain reads ahead (pipelines.ReadAhead).
    """
    if batch_size < 1:
      raise ValueError(f"batch_size must be positive, got {batch_size}")
    if not len(self):
      raise ValueError("no claims to train on")
    ds = grain.MapDataset.source(self).seed(seed).shuffle().repeat(None)
    return pipelines.iterate(pipelines.process_batches(ds, batch_size, True, shard_index,
                                                       shard_count), read_ahead)

  def eval_batches(self, batch_size: int) -> Iterator[Example]:
    """Every claim once, in order; the last batch padded to `batch_size` (valid False)."""
    if batch_size < 1:
      raise ValueError(f"batch_size must be positive, got {batch_size}")
    padding = None
    for start in range(0, len(self), batch_size):
      rows = [self[i] for i in range(start, min(start + batch_size, len(self)))]
      if len(rows) < batch_size:
        padding = padding or self.padding_example()
        rows += [padding] * (batch_size - len(rows))
      yield {k: np.stack([r[k] for r in rows]) for k in rows[0]}


def _among(items: Sequence[str], relevant: Sequence[str], length: int) -> np.ndarray:
  """[length] float32: 1 where the item is one of `relevant`; 0 on padding."""
  wanted = set(relevant)
  out = np.zeros(length, np.float32)
  out[:len(items)] = [item in wanted for item in items]
  return out
