"""The Mocheg claim-verification ("stance detection") model, batched, and its loss.

What the reference does (VT-NLP/Mocheg at 45064e3, read for this module):
* The paper's model is `BertMultiwayMatch2` in verification/util/stance_detect.py (l. 186-222;
  its parent `BertMultiwayMatch`, l. 100-165), chosen by model_type
  `CLAIM_TEXT_IMAGE_attention_5_4` (verification/util/enums.py: stance_layer "5"; the
  default of verify.py l. 89 and the README's commands).
* Cross-attention (l. 110-111, 125-133): two `nn.MultiheadAttention(512, 1, kdim, vdim,
  batch_first=True)`, one for text evidence (kdim = vdim = 512) and one for images
  (kdim = vdim = 768). There is no separate Linear on image tokens: the attention's own k/v
  in-projections map 768 -> 512. q/k/v/out projections all have biases, one head, no
  attention dropout (MHA default 0). Query = the claim tokens repeated once per evidence
  item (`repeat_claim_in_evidence_shape`, l. 177); key/value = the item's tokens;
  key_padding_mask = ~evidence_mask (text: the CLIP attention mask; images: all ones).
* Fusion (l. 195-202): [m - c ; m * c] -> `linear_fuse_p` Linear(1024 -> 512) ->
  F.leaky_relu (slope 0.01) -> `gen_max` (l. 145-152): padded claim tokens filled with
  -10000, max over claim tokens -> [items, 512] -> mean over the items -> [1, 512].
  `linear_fuse_p` is ONE layer shared by the text and the image branch.
* Classifier (l. 207-222): the text stance and the image stance are concatenated (text
  first) -> `classifier` Linear(1024 -> 3). When only one 512-d stance exists it goes
  through a second layer, `classifier_text` Linear(512 -> 3), whichever modality it is.
  No dropout anywhere in this model.
* Missing modalities (verification/model.py l. 132-175, 178-182, 211-216): a claim without
  images (`has_image` False) skips the image branch and is classified by
  `classifier_text(text stance)`. A claim with zero text items is not guarded: the mean over
  an empty item axis is NaN and so are its logits. With neither evidence type the Verifier
  uses a claim-only layer (not part of this model).
* Inputs (model.py l. 156-173): CLIP ViT-B/32 frozen; text tokens = the text tower's
  last_hidden_state (after its final layer norm); image tokens = the vision
  last_hidden_state without CLS (49 x 768, before post_layernorm). The claim and its text
  items (nltk sentences of the evidence, data_util.py l. 178) are tokenized together, padded
  to the longest, max 77 tokens. Quirk: only when the claim has no image does the reference
  drop the first (BOS) token of the claim and of every text item (model.py l. 166-167); with
  images it keeps it. Which tokens to feed is the data pipeline's choice, not this module's.
* One claim per step (constants.py BATCH_SIZE = 1) with gradient accumulation over
  `batch_size` claims; loss `nn.CrossEntropyLoss(weight=w)` (train_verify.py l. 189) with
  w_c = C n_c^-p / sum_j n_j^-p (data_util.py l. 103-107), p = --loss_weight_power (2).
  NOTE: with one claim per batch torch's weighted mean is w_y nll / w_y = nll, so in the
  reference the class weights cancel and training is effectively unweighted. Our batched
  `weighted_cross_entropy` is torch's weighted mean over a real batch, so the weights act.

Our module (batched over claims, padded item lists, masks; no Python loop over claims or
items; one set of shapes per jit):
* Same parameters and arithmetic as the reference; `heads` generalises the single head.
* Item presence: a text item is present iff any of its tokens is; `image_mask` may be
  [B, Ni] (item presence; all 49 patches attended, as the reference) or [B, Ni, P].
* A modality with zero items for a claim has stance vector 0 and is flagged absent.
  missing_modality="reference" (default, reproduces the reference): claims with both
  modalities use `classifier`; claims with exactly one use `classifier_single` (the
  reference's `classifier_text`) on that modality's stance (for "no image" this is exactly
  the reference; for "no text" the reference gives NaN and we extend its one-modality rule);
  claims with none get classifier_single(0) = its bias. missing_modality="zeros": always
  `classifier([s_text ; s_image])` with zeros for an absent modality (one classifier).
  Never NaN: absent items attend to all their (padding) keys and are then excluded with
  `where`, so no softmax row is empty and no gradient is 0 * inf.
* A claim with no real claim tokens gets 0 per item instead of the reference's -10000.
* use_text / use_image switch a modality off entirely; then `classifier` is hidden -> C
  (the reference's `classifier_text`) and there is no `classifier_single`.
* `dropout` (on the stance vector before the classifier) and `attention_dropout` default
  to 0, as the reference.
* Beyond the paper, off by default: `text_attention="cosine"` (no learned projections),
  `token_match` (exact token-id matches of the claim's tokens in the evidence, an input of
  their own layer), `item_pool="max"` (items max-pooled instead of averaged),
  `image_query="words"` (images queried by learned embeddings of the claim's token ids),
  `image_score` (CLIP's claim-image cosine read per image item) and `item_context` (what a
  text item says beyond the claim's words).

Logical axes: only the shared names ("embed", "mlp", "heads", "kv", "classes", "batch",
"length"); the item axis is folded into "batch" inside the module.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mocheg_jax.models import layers
from mocheg_jax.models import matmul
from mocheg_jax.retrieval.contrastive import l2_normalize
from mocheg_jax.verification import image_reads

Dtype = Any

LEAKY_RELU_SLOPE = 0.01  # F.leaky_relu's default, as the reference.
MISSING_MODALITY_MODES = ("reference", "zeros")
TEXT_ATTENTION_MODES = ("learned", "cosine")
IMAGE_READ_MODES = ("attention", "pairs", "match")
ITEM_POOLS = ("mean", "max")
IMAGE_QUERIES = ("states", "words")
COSINE_INITIAL_SCALE = 10.0
SCORE_SCALE = 10.0  # image_score's cosines (or soft steps of them) times this reach score_fuse.
SCORE_SHARPNESS = 20.0  # Soft steps of the cosine: 10% -> 90% over +-0.11 around a threshold.


@dataclasses.dataclass(frozen=True)
class StanceConfig:
  """Sizes and switches of `StanceDetector` (defaults: the paper, CLIP ViT-B/32)."""
  text_dim: int = 512  # CLIP text hidden size; the claim is text, so also the query size.
  image_dim: int = 768  # CLIP vision hidden size.
  hidden: int = 512  # Output of the fusion layer (the stance vector size).
  heads: int = 1
  num_classes: int = 3
  dropout: float = 0.0  # On the stance vector, before the classifier.
  attention_dropout: float = 0.0
  use_text: bool = True
  use_image: bool = True
  missing_modality: str = "reference"
  # "learned" (the reference): q/k/v/out projections. "cosine" (beyond the paper): each claim
  # token attends with softmax(scale * cosine) to the evidence tokens' own frozen states, so
  # a claim token that the evidence repeats gets m = c exactly; see `_align`.
  text_attention: str = "learned"
  # Beyond the paper: the text branch also reads, per claim token, whether its id occurs in
  # the item (`text_match`) and in any of the claim's items, through its own layer
  # `match_fuse` on [match * c ; any * c ; (1 - any) * c] added before the activation.
  # Frozen contextual states of "102" and "117" are close; the exact-match bits say which
  # claim words the evidence repeats. "Any" matters because the items are pooled after the
  # claim tokens: a value one sentence states is unmatched in all the others.
  token_match: bool = False
  # Beyond the paper: the same form again (`phrase_fuse`) on `text_phrase_match`, per claim
  # token whether it and a neighbour of it in the claim stand side by side in the item.
  # Look-alike entities share their names' words in another order ("the Pellarda River",
  # "the River Pellarda"): a sentence about the look-alike repeats every word of the
  # claim's name, and only the pairs tell it is about someone else.
  phrase_match: bool = False
  # How a modality's items are pooled into its stance vector: "mean" (the reference) or
  # "max" (beyond the paper). With a mean, the one sentence that states a claim's value is
  # outvoted by the claim's other evidence items, which look like evidence for nothing.
  item_pool: str = "mean"
  # What queries the images: "states" (the reference: the claim's contextual token states)
  # or "words" (beyond the paper): a learned embedding of each claim token's id (hashed into
  # `word_buckets` rows), needs `claim_ids`. Contextual states carry the claim's entity, so
  # the image branch can memorise training entities; a word's own row can only carry the
  # word ("red", "three"), and unseen names stay at their random start.
  image_query: str = "states"
  word_buckets: int = 32768
  # "attention" (the reference): claim-token queries cross-attend to the patches, then the
  # shared [m - c; m * c] fusion. Beyond the paper (image_reads.py, measured there):
  # "pairs" (image_reads.PairRead) or "match" (image_reads.MatchRead) instead.
  image_read: str = "attention"
  pair_dim: int = 64  # Width of the "pairs" comparison space; "match": per head.
  match_heads: int = 8
  match_pool: str = "patches"  # "match" only: "patches", "image" or "flat" (MatchRead).
  patches: int = 0  # Patches per image; needed by match_pool="flat".
  # Beyond the paper: each image item also reads `image_score`, the cosine of CLIP's
  # embeddings of the claim and the image, through its own layer (`score_fuse`) added to
  # the item's vector. A CLIP that knows what pictures show (the paper's; on the synthetic
  # worlds, caption pre-training) scores a picture of the claimed value above one of another
  # value; the cross-attention from the claim's tokens has to learn that pairing from the
  # few hundred training claims that need it, and does not.
  image_score: bool = False
  # How the cosine reaches `score_fuse`: () as one number (times SCORE_SCALE); thresholds
  # t_1..t_K as K soft steps SCORE_SCALE * sigmoid(SCORE_SHARPNESS * (cos - t_k)) (beyond
  # the paper; `score_features`). The rule to learn is a threshold near 0.9 (the caption
  # CLIP of the small world: a picture of the claimed value ~0.95, of another value
  # 0.2-0.65), and from one number that takes a bias of about -9 x the layer's weight,
  # which Adam at lr 1e-3 (~1e-3 per step) does not reach in a few hundred steps: the model
  # memorised training pictures instead (image-fact test claims 30-33 of 49 right over
  # three seeds; with soft steps 40-42: configs/verify.py).
  score_thresholds: tuple[float, ...] = ()
  # Beyond the paper: each image item also reads CLIP's unit embeddings of the image and of
  # the claim and their elementwise product (`image_embed`, `claim_embed`), through its own
  # layer (`embed_fuse`) added to the item's vector. The cosine is the product's sum, every
  # dimension weighted alike; a picture of the claimed attribute with another value (what
  # refutes an image-only fact) shares some of those dimensions with the claim and not
  # others, and which ones is what the layer can learn. Probe on the small world (the caption
  # CLIP, visual-attribute claims' retrieved images; logistic regression vs a 64-unit MLP
  # fit on the train claims'): "a picture of the claimed attribute from the claim's own
  # articles" at test AUC 0.74 from the cosine, 0.85 from the three vectors.
  image_embeds: bool = False
  embed_dim: int = 0  # CLIP's embedding size; needed by image_embeds.
  # Beyond the paper: each text item also reads its "context", the mean of its token states
  # scaled by how little any claim token matches them (1 - max cosine), through its own
  # layer (`context_fuse`) added before the activation. Retrieved sentences include the
  # articles' restatements of the claim ("a widely shared post said that ..."): they repeat
  # every claim token, so by the claim-token view they are the strongest support there is;
  # only the words around the repetition ("said", "shared") tell them apart.
  item_context: bool = False
  # Beyond the paper: each text item's vector is scaled by a learned relevance gate,
  # sigmoid(`item_gate` layer of the vector), before the items are pooled; the gate's logits
  # are returned (`return_item_gates`) for an auxiliary loss against which items are the
  # claim's gold sentences (verification/task.py). Trained on system evidence, it is told
  # directly that a restatement of the claim or a sentence about another value of another
  # entity is not evidence, where the verdict's loss only says so through three labels.
  # With item_pool="max" a closed gate takes an item out; with a mean it still counts in
  # the denominator.
  item_gate: bool = False
  # The same gate on the image items (`image_gate` layer), trained against which retrieved
  # images the image qrels match to a proof image of the claim: an NEI claim's articles
  # come with pictures too, and without the gate the model reads them as proof.
  image_gate: bool = False
  leaky_relu_slope: float = LEAKY_RELU_SLOPE

  def __post_init__(self):
    if not (self.use_text or self.use_image):
      raise ValueError("StanceConfig needs use_text or use_image (the claim-only model is "
                       "a different module)")
    for name in ("text_dim", "image_dim", "hidden", "heads", "num_classes"):
      if getattr(self, name) <= 0:
        raise ValueError(f"StanceConfig.{name} must be positive, got {getattr(self, name)}")
    if self.text_dim % self.heads:
      raise ValueError(f"text_dim {self.text_dim} is not a multiple of heads {self.heads}")
    for name in ("dropout", "attention_dropout"):
      if not 0.0 <= getattr(self, name) < 1.0:
        raise ValueError(f"StanceConfig.{name} must be in [0, 1), got {getattr(self, name)}")
    if self.missing_modality not in MISSING_MODALITY_MODES:
      raise ValueError(f"unknown missing_modality {self.missing_modality!r}; expected one "
                       f"of {MISSING_MODALITY_MODES}")
    for name in ("token_match", "phrase_match", "item_context", "item_gate"):
      if getattr(self, name) and not self.use_text:
        raise ValueError(f"StanceConfig.{name} needs use_text")
    if self.image_gate and not self.use_image:
      raise ValueError("StanceConfig.image_gate needs use_image")
    if self.text_attention not in TEXT_ATTENTION_MODES:
      raise ValueError(f"unknown text_attention {self.text_attention!r}; expected one of "
                       f"{TEXT_ATTENTION_MODES}")
    if self.image_query not in IMAGE_QUERIES:
      raise ValueError(f"unknown image_query {self.image_query!r}; expected one of "
                       f"{IMAGE_QUERIES}")
    if self.image_score and not self.use_image:
      raise ValueError("StanceConfig.image_score needs use_image")
    if not isinstance(self.score_thresholds, tuple) or not all(
        isinstance(t, (int, float)) and np.isfinite(t) for t in self.score_thresholds):
      raise ValueError("StanceConfig.score_thresholds must be a tuple of finite numbers, got "
                       f"{self.score_thresholds!r}")
    if self.image_embeds and not self.use_image:
      raise ValueError("StanceConfig.image_embeds needs use_image")
    if self.image_embeds and self.embed_dim <= 0:
      raise ValueError("StanceConfig.image_embeds needs embed_dim")
    if self.score_thresholds and not self.image_score:
      raise ValueError("StanceConfig.score_thresholds needs image_score")
    if self.image_query == "words" and not self.use_image:
      raise ValueError("StanceConfig.image_query='words' needs use_image")
    if self.item_pool not in ITEM_POOLS:
      raise ValueError(f"unknown item_pool {self.item_pool!r}; expected one of {ITEM_POOLS}")
    if self.image_read not in IMAGE_READ_MODES:
      raise ValueError(f"unknown image_read {self.image_read!r}; expected one of "
                       f"{IMAGE_READ_MODES}")
    if self.match_pool not in image_reads.MATCH_POOLS:
      raise ValueError(f"unknown match_pool {self.match_pool!r}; expected one of "
                       f"{image_reads.MATCH_POOLS}")
    if self.image_read == "match" and self.match_pool == "flat" and self.patches <= 0:
      raise ValueError("match_pool='flat' needs StanceConfig.patches")
    for name in ("pair_dim", "match_heads"):
      if getattr(self, name) <= 0:
        raise ValueError(f"StanceConfig.{name} must be positive, got {getattr(self, name)}")

  @property
  def num_modalities(self) -> int:
    return int(self.use_text) + int(self.use_image)


def _check(name: str, x: jax.Array, ndim: int | Sequence[int], last: int | None = None,
           lead: tuple[int, ...] = ()):
  """x has one of `ndim` dims, feature size `last` and leading dims `lead`."""
  ndims = (ndim,) if isinstance(ndim, int) else tuple(ndim)
  if x.ndim not in ndims:
    raise ValueError(f"{name} must have {' or '.join(map(str, ndims))} dims, got shape "
                     f"{tuple(x.shape)}")
  if last is not None and x.shape[-1] != last:
    raise ValueError(f"{name} has feature size {x.shape[-1]}, the config says {last}")
  if tuple(x.shape[:len(lead)]) != tuple(lead):
    raise ValueError(f"{name} has shape {tuple(x.shape)}; its leading dims must be {lead}")


@jax.custom_vjp
def _times(a: jax.Array, x: jax.Array, x_t: jax.Array) -> jax.Array:
  """a [..., M, K] @ x [..., K, N] (float32), given `x_t`, x's materialised transpose: the
  gradient of `a` is then g @ x_t, a product whose left operand contracts its last axis,
  which XLA:CPU runs on its fast dots (as autodiff writes it, contracting x's last axis,
  it took ~3x as long). x's own gradient (a tuned vision block's patches; for frozen
  evidence nothing reads it and XLA drops it) is a^T g."""
  return jnp.matmul(a, x, preferred_element_type=jnp.float32)


def _times_forward(a, x, x_t):
  return _times(a, x, x_t), (a, x_t)


def _times_backward(residuals, g):
  a, x_t = residuals
  g = g.astype(x_t.dtype)
  return jnp.matmul(g, x_t), jnp.matmul(a.swapaxes(-1, -2), g), None


_times.defvjp(_times_forward, _times_backward)


class StanceDetector(nnx.Module):
  """Claim tokens x evidence tokens -> 3 logits (see the module docstring).

  Parameters: `text_attention`, `image_attention` (layers.Attention, query size text_dim,
  key/value size text_dim / image_dim), `fuse` (2 text_dim -> hidden, shared by both
  modalities), `classifier` (num_modalities * hidden -> classes) and, with both modalities
  and missing_modality="reference", `classifier_single` (hidden -> classes). With
  image_read "pairs" or "match", `image_read` (image_reads.py) replaces `image_attention`.
  """

  def __init__(self, config: StanceConfig, *, dtype: Dtype = None, param_dtype=jnp.float32,
               rngs: nnx.Rngs):
    self.config = config
    kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    attn = dict(dropout_rate=config.attention_dropout, **kw)
    self.text_attention = (layers.Attention(config.text_dim, config.heads,
                                            kv_features=config.text_dim, **attn)
                           if config.use_text and config.text_attention == "learned"
                           else None)
    # The cosine alignment's temperature, learned in log space (stays positive).
    self.text_log_scale = (nnx.Param(jnp.full((), np.log(COSINE_INITIAL_SCALE), param_dtype))
                           if config.use_text and config.text_attention == "cosine" else None)
    self.image_attention = (layers.Attention(config.text_dim, config.heads,
                                             kv_features=config.image_dim, **attn)
                            if config.use_image and config.image_read == "attention"
                            else None)
    read = dict(slope=config.leaky_relu_slope, **kw)
    # The image read beyond the paper, if any.
    self.image_read = (
        image_reads.PairRead(config.text_dim, config.image_dim, config.hidden,
                             config.pair_dim, **read)
        if config.use_image and config.image_read == "pairs" else
        image_reads.MatchRead(config.text_dim, config.image_dim, config.hidden,
                              config.pair_dim, config.match_heads, config.match_pool,
                              config.patches, **read)
        if config.use_image and config.image_read == "match" else None)
    self.fuse = layers.Dense(2 * config.text_dim, config.hidden, ("embed", "mlp"), **kw)
    self.word_embedding = (
        layers.Embed(config.word_buckets, config.text_dim, axes=(None, "embed"), **kw)
        if config.image_query == "words" else None)
    self.match_fuse = (layers.Dense(3 * config.text_dim, config.hidden, ("embed", "mlp"), **kw)
                       if config.token_match else None)
    self.phrase_fuse = (layers.Dense(3 * config.text_dim, config.hidden, ("embed", "mlp"), **kw)
                        if config.phrase_match else None)
    self.score_fuse = (layers.Dense(max(len(config.score_thresholds), 1), config.hidden,
                                    (None, "mlp"), **kw)
                       if config.image_score else None)
    self.embed_fuse = (layers.Dense(3 * config.embed_dim, config.hidden, (None, "mlp"), **kw)
                       if config.image_embeds else None)
    self.context_fuse = (layers.Dense(config.text_dim, config.hidden, ("embed", "mlp"), **kw)
                         if config.item_context else None)
    self.item_gate = (layers.Dense(config.hidden, 1, ("mlp", None), **kw)
                      if config.item_gate else None)
    self.image_gate = (layers.Dense(config.hidden, 1, ("mlp", None), **kw)
                       if config.image_gate else None)
    self.classifier = layers.Dense(config.num_modalities * config.hidden, config.num_classes,
                                   ("mlp", "classes"), **kw)
    self.classifier_single = (
        layers.Dense(config.hidden, config.num_classes, ("mlp", "classes"), **kw)
        if config.num_modalities == 2 and config.missing_modality == "reference" else None)
    self.dropout = nnx.Dropout(config.dropout, rngs=rngs)

  def _attend(self, attn: layers.Attention, claim: jax.Array, evidence: jax.Array,
              keys: jax.Array, deterministic: bool) -> jax.Array:
    """Learned cross-attention (the reference): m [B, N, Lc, Dt].

    claim [B, Lc, Dt], evidence [B, N, L, E], keys [B, N, L] bool (attended tokens).

    The reference's function, with the key and value projections moved to the claim's
    side: q.(W_k x + b_k) = (W_k q).x + q.b_k, and q.b_k is the same for every key of a
    query, which the softmax ignores; sum_k p_k (W_v x_k + b_v) = W_v (sum_k p_k x_k) +
    b_v sum_k p_k. So the evidence's B*N*L tokens are never projected: the claim's B*Lc
    queries are mapped into the evidence's space once (shared by its N items), and each
    item's attention-weighted tokens are projected at Lc rows instead of L. At the paper's
    sizes that is about a third fewer forward FLOPs in the attention (BENCHMARKS.md); the
    result equals the projected form up to float rounding (tests/test_verification_model.py
    compares with the reference's PyTorch module).
    """
    b, n, length, e = evidence.shape
    lc, heads = claim.shape[1], attn.num_heads
    q = attn.query(claim)  # [B, Lc, H, D]
    dtype = q.dtype
    x = evidence.astype(dtype)  # [B, N, L, E]
    x_t = matmul.materialised_swap(x)  # [B, N, E, L]
    wk, wv = (w[...].astype(dtype) for w in (attn.key.kernel, attn.value.kernel))  # [E, H, D]
    # Per head, as 2-D products whose weight gradients take XLA:CPU's fast dots (matmul.py).
    q_e = jnp.stack([matmul.matmul_t(q[:, :, h].reshape(b * lc, -1), wk[:, h])
                     for h in range(heads)], axis=1)  # [B*Lc, H, E]
    q_e = q_e.reshape(b, 1, lc * heads, e) * attn.head_dim ** -0.5
    q_e = jnp.broadcast_to(q_e, (b, n, lc * heads, e))
    logits = _times(q_e, x_t, x).astype(jnp.float32)  # [B, N, Lc*H, L]
    logits = jnp.where(keys[:, :, None], logits, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(logits, axis=-1)
    dropout = not deterministic and attn.dropout_rate > 0
    if dropout:
      keep = jax.random.bernoulli(attn.rngs.dropout(), 1.0 - attn.dropout_rate, probs.shape)
      probs = jnp.where(keep, probs / (1.0 - attn.dropout_rate), 0.0)
    mixed = _times(probs.astype(dtype), x, x_t).astype(dtype).reshape(b, n, lc, heads, e)
    y = jnp.stack([matmul.contract(mixed[:, :, :, h], wv[:, h], 1)
                   for h in range(heads)], axis=3)  # [B, N, Lc, H, D]
    if attn.value.bias is not None:
      bias = attn.value.bias[...].astype(dtype)
      if dropout:  # The kept probabilities no longer sum to 1.
        bias = probs.sum(-1).reshape(b, n, lc, heads, 1).astype(dtype) * bias
      y = y + bias
    return attn.out(y)  # [B, N, Lc, Dt]

  def _align(self, claim: jax.Array, evidence: jax.Array, keys: jax.Array) -> jax.Array:
    """Cosine alignment: m [B, N, Lc, Dt], a softmax(scale * cos)-weighted mix of the
    evidence tokens' frozen states (no projections; one learned temperature).

    The learned projections of the reference start random and, on a few thousand claims,
    never line a claim's value ("321 kilometres") up with the evidence's ("481
    kilometres"); frozen encoder states already do (same word: cosine ~0.9), so here m - c
    is ~0 where the evidence repeats a claim token and large where it states another value.
    """
    scale = jnp.exp(self.text_log_scale[...].astype(jnp.float32))
    scores = scale * jnp.einsum("bqd,bnkd->bnqk", l2_normalize(claim), l2_normalize(evidence))
    scores = jnp.where(keys[:, :, None, :], scores, -1e9)
    weights = jax.nn.softmax(scores, axis=-1)
    m = jnp.einsum("bnqk,bnkd->bnqd", weights, evidence.astype(jnp.float32))
    return m.astype(self.fuse.dtype or jnp.float32)  # The module's compute dtype.

  def _context(self, claim: jax.Array, claim_mask: jax.Array, evidence: jax.Array,
               keys: jax.Array) -> jax.Array:
    """Each item's context [B, N, Dt]: the mean over its tokens of their states times
    1 - (the token's best cosine to a real claim token), floored at 0; what the item says
    beyond repeating the claim. An item all of whose tokens the claim repeats gets 0 (a
    mean, not a weighted average: that would blow rounding-level weights up).
    """
    cos = jnp.einsum("bqd,bnkd->bnqk", l2_normalize(claim), l2_normalize(evidence))
    cos = jnp.where(claim_mask[:, None, :, None], cos, -1.0)
    weights = jnp.where(keys, jax.nn.relu(1.0 - cos.max(axis=2)), 0.0)  # [B, N, L]
    tokens = keys.sum(-1, keepdims=True)
    context = jnp.einsum("bnk,bnkd->bnd", weights / jnp.maximum(tokens, 1),
                         evidence.astype(jnp.float32))
    return context.astype(self.fuse.dtype or jnp.float32)

  @staticmethod
  def _match_term(fuse: layers.Dense, bits: jax.Array, c: jax.Array, present: jax.Array
                  ) -> jax.Array:
    """fuse([bits * c ; any * c ; c - any * c]) [B, N, Lc, hidden] for per-item bits
    [B, N, Lc] over claim tokens c [B, 1, Lc, Dt]; "any": the bit in any present item."""
    bits = jnp.where(present[..., None], bits.astype(c.dtype), 0)  # [B, N, Lc]
    anywhere = bits.max(1, keepdims=True)[..., None] * c  # [B, 1, Lc, Dt]
    anywhere = jnp.broadcast_to(anywhere, bits.shape + c.shape[-1:])
    return fuse(jnp.concatenate([bits[..., None] * c, anywhere, c - anywhere], axis=-1))

  def _stance(self, attn: layers.Attention | None, claim: jax.Array, claim_mask: jax.Array,
              evidence: jax.Array, key_mask: jax.Array, present: jax.Array,
              deterministic: bool, read: nnx.Module | None = None,
              match: jax.Array | None = None, phrase: jax.Array | None = None,
              score: jax.Array | None = None,
              embeds: tuple[jax.Array, jax.Array] | None = None, context: bool = False,
              gate: nnx.Module | None = None
              ) -> tuple[jax.Array, jax.Array, jax.Array | None]:
    """One modality's stance vector [B, hidden], whether it has any item [B], and the item
    gate's logits [B, N] (None without `gate`).

    claim [B, Lc, Dt], claim_mask [B, Lc] bool, evidence [B, N, L, E], key_mask [B, N, L]
    bool, present [B, N] bool. attn None: the cosine alignment (text only); `read` (an
    image_reads module): that read instead of attention + fusion; `match` [B, N, Lc]: the
    token-match bits (text only, with config.token_match); `phrase` [B, N, Lc]: the
    phrase-match bits (text only, with config.phrase_match); `score` [B, N]: the claim-item
    CLIP cosines (images only, with config.image_score); `embeds`: the items' and the claim's
    CLIP embeddings [B, N, E], [B, E] (images only, with config.image_embeds); `context`:
    add the items' context (`_context`; text only, with config.item_context); `gate`: scale
    each item by sigmoid(gate(item)) before pooling (config.item_gate, config.image_gate).
    """
    # Absent items attend to all their keys (padding): no softmax row is fully masked, so
    # nothing is NaN; their outputs are dropped below.
    keys = key_mask | ~present[..., None]
    if read is not None:
      h = read(claim, claim_mask, evidence, keys)  # [B, N, hidden], pooled over the claim.
    else:
      if attn is None:
        m = self._align(claim, evidence, keys)
      else:
        m = self._attend(attn, claim, evidence, keys, deterministic)
      c = claim[:, None].astype(m.dtype)  # [B, 1, Lc, Dt]
      h = self.fuse(jnp.concatenate([m - c, m * c], axis=-1))  # [B, N, Lc, hidden]
      if match is not None:
        h = h + self._match_term(self.match_fuse, match, c, present)
      if phrase is not None:
        h = h + self._match_term(self.phrase_fuse, phrase, c, present)
      if context:
        h = h + self.context_fuse(self._context(claim, claim_mask, evidence, keys))[:, :, None]
      h = jax.nn.leaky_relu(h, self.config.leaky_relu_slope)
      # Max over the real claim tokens (the reference fills padding with -10000).
      h = jnp.where(claim_mask[:, None, :, None], h, jnp.finfo(h.dtype).min)
      h = h.max(axis=2)  # [B, N, hidden]
    if score is not None:
      s = score_features(score.astype(h.dtype), self.config.score_thresholds)
      h = h + jax.nn.leaky_relu(self.score_fuse(s), self.config.leaky_relu_slope)
    if embeds is not None:
      h = h + jax.nn.leaky_relu(self.embed_fuse(embed_features(*embeds).astype(h.dtype)),
                                self.config.leaky_relu_slope)
    h = jnp.where(claim_mask.any(-1)[:, None, None], h, 0).astype(jnp.float32)
    gate_logits = None
    if gate is not None:
      gate_logits = gate(h)[..., 0].astype(jnp.float32)  # [B, N]
      h = h * jax.nn.sigmoid(gate_logits)[..., None]
    # Mean or max over the present items; 0 when there are none.
    count = present.sum(-1)  # [B]
    if self.config.item_pool == "max":
      stance = jnp.where(present[..., None], h, jnp.finfo(jnp.float32).min).max(1)
      stance = jnp.where((count > 0)[:, None], stance, 0.0)
    else:
      h = jnp.where(present[..., None], h, 0.0)
      stance = h.sum(1) / jnp.maximum(count, 1)[:, None].astype(jnp.float32)
    return layers.constrain(stance, ("batch", "mlp")), count > 0, gate_logits

  def __call__(self, claim: jax.Array, claim_mask: jax.Array,
               text: jax.Array | None = None, text_mask: jax.Array | None = None,
               image: jax.Array | None = None, image_mask: jax.Array | None = None,
               text_match: jax.Array | None = None, claim_ids: jax.Array | None = None,
               image_score: jax.Array | None = None,
               text_phrase_match: jax.Array | None = None,
               image_embed: jax.Array | None = None, claim_embed: jax.Array | None = None, *,
               deterministic: bool = True, return_item_gates: bool = False):
    """Logits [B, num_classes] (float32); with `return_item_gates`, (logits, gates): the
    item gates' logits by modality, "text" [B, Nt] with config.item_gate and "image"
    [B, Ni] with config.image_gate (an empty dict without either).

    Args:
      claim: [B, Lc, text_dim] claim token states; claim_mask: [B, Lc] (bool or 0/1).
      text: [B, Nt, Lt, text_dim] text-evidence token states; text_mask: [B, Nt, Lt]. An
        item is present iff any of its tokens is. Needed iff config.use_text.
      image: [B, Ni, P, image_dim] patch states; image_mask: [B, Ni] (item presence, every
        patch attended) or [B, Ni, P] (present iff any patch is). Needed iff use_image.
      text_match: [B, Nt, Lc] 0/1, whether claim token q's id occurs in text item n. Needed
        iff token_match.
      text_phrase_match: [B, Nt, Lc] 0/1, whether claim token q and a neighbour of it in the
        claim occur side by side in text item n. Needed iff phrase_match.
      image_embed: [B, Ni, E] CLIP's unit image embeddings; claim_embed: [B, E] its unit
        claim embedding. Needed iff config.image_embeds.
      claim_ids: [B, Lc] int, the claim's token ids. Needed iff image_query="words".
      image_score: [B, Ni] float, the cosine of CLIP's claim and image embeddings. Needed
        iff config.image_score.
      deterministic: False turns dropout on (needs a "dropout" rng stream).
      return_item_gates: also return the item gates' logits (an auxiliary loss reads them).
    """
    cfg = self.config
    # Every shape is checked before any compute, so a bad batch fails fast and clearly.
    _check("claim", claim, 3, cfg.text_dim)
    _check("claim_mask", claim_mask, 2, lead=claim.shape[:2])
    if cfg.use_text:
      if text is None or text_mask is None:
        raise ValueError("use_text=True needs text and text_mask")
      _check("text", text, 4, cfg.text_dim, lead=claim.shape[:1])
      _check("text_mask", text_mask, 3, lead=text.shape[:3])
    if cfg.token_match:
      if text_match is None:
        raise ValueError("token_match=True needs text_match")
      _check("text_match", text_match, 3, lead=(*text.shape[:2], claim.shape[1]))
    if cfg.phrase_match:
      if text_phrase_match is None:
        raise ValueError("phrase_match=True needs text_phrase_match")
      _check("text_phrase_match", text_phrase_match, 3,
             lead=(*text.shape[:2], claim.shape[1]))
    if cfg.use_image:
      if image is None or image_mask is None:
        raise ValueError("use_image=True needs image and image_mask")
      _check("image", image, 4, cfg.image_dim, lead=claim.shape[:1])
      _check("image_mask", image_mask, (2, 3), lead=image.shape[:image_mask.ndim])
    if cfg.image_query == "words":
      if claim_ids is None:
        raise ValueError("image_query='words' needs claim_ids")
      _check("claim_ids", claim_ids, 2, lead=claim.shape[:2])
    if cfg.image_score:
      if image_score is None:
        raise ValueError("image_score=True needs image_score")
      _check("image_score", image_score, 2, lead=image.shape[:2])
    if cfg.image_embeds:
      if image_embed is None or claim_embed is None:
        raise ValueError("image_embeds=True needs image_embed and claim_embed")
      _check("image_embed", image_embed, 3, cfg.embed_dim, lead=image.shape[:2])
      _check("claim_embed", claim_embed, 2, cfg.embed_dim, lead=image.shape[:1])
    claim_mask = claim_mask.astype(bool)
    stances, presents, gates = [], [], {}
    if cfg.use_text:
      text_mask = text_mask.astype(bool)
      s, p, gates["text"] = self._stance(
          self.text_attention, claim, claim_mask, text, text_mask, text_mask.any(-1),
          deterministic, match=text_match if cfg.token_match else None,
          phrase=text_phrase_match if cfg.phrase_match else None,
          context=cfg.item_context, gate=self.item_gate)
      stances.append(s)
      presents.append(p)
    if cfg.use_image:
      image_mask = image_mask.astype(bool)
      if image_mask.ndim == 2:
        present, keys = image_mask, jnp.ones(image.shape[:3], bool)
      else:
        present, keys = image_mask.any(-1), image_mask
      query = claim
      if self.word_embedding is not None:
        query = self.word_embedding(jnp.maximum(claim_ids, 0) % cfg.word_buckets)
      s, p, gates["image"] = self._stance(
          self.image_attention, query, claim_mask, image, keys, present, deterministic,
          read=self.image_read, score=image_score if cfg.image_score else None,
          embeds=(image_embed, claim_embed) if cfg.image_embeds else None,
          gate=self.image_gate)
      stances.append(s)
      presents.append(p)

    def classify(layer: layers.Dense, x: jax.Array) -> jax.Array:
      return layer(self.dropout(x, deterministic=deterministic)).astype(jnp.float32)

    logits = classify(self.classifier, jnp.concatenate(stances, axis=-1))
    if self.classifier_single is not None:
      (s_text, s_image), (p_text, p_image) = stances, presents
      single = classify(self.classifier_single,
                        jnp.where(p_text[:, None], s_text, s_image))
      logits = jnp.where((p_text & p_image)[:, None], logits, single)
    logits = layers.constrain(logits, ("batch", "classes"))  # [B, C]
    if not return_item_gates:
      return logits
    return logits, {k: g for k, g in gates.items() if g is not None}


def embed_features(image_embed: jax.Array, claim_embed: jax.Array) -> jax.Array:
  """What `embed_fuse` reads of unit embeddings [B, N, E] and [B, E]: [B, N, 3E], the
  product and both embeddings, scaled so that each is ~unit per component (a unit vector's
  components are ~1/sqrt(E); the product's sum is the cosine)."""
  e = image_embed.shape[-1]
  image = image_embed.astype(jnp.float32)
  claim = jnp.broadcast_to(claim_embed.astype(jnp.float32)[:, None], image.shape)
  return jnp.concatenate([e * image * claim, e ** 0.5 * image, e ** 0.5 * claim], axis=-1)


def score_features(score: jax.Array, thresholds: Sequence[float] = ()) -> jax.Array:
  """What `score_fuse` reads of claim-image cosines [...]: [..., 1] the cosine itself, or
  [..., K] one soft step per threshold (StanceConfig.score_thresholds); scaled as CLIP's
  logits, so the unit-scale layer sees ~[-10, 10]."""
  if not thresholds:
    return SCORE_SCALE * score[..., None]
  steps = jnp.asarray(thresholds, score.dtype)
  return SCORE_SCALE * jax.nn.sigmoid(SCORE_SHARPNESS * (score[..., None] - steps))


def class_weights(counts: Sequence[int] | np.ndarray, p: float = 2.0) -> np.ndarray:
  """w_c = C n_c^-p / sum_j n_j^-p from per-class training counts (float32, sums to C).

  The reference's get_loss_weight_fun1 (verification/util/data_util.py) with C classes.

  Raises:
    ValueError: counts not a non-empty 1-D sequence, or a class with no examples (its
      weight would be infinite).
  """
  n = np.asarray(counts, dtype=np.float64)
  if n.ndim != 1 or n.size == 0:
    raise ValueError(f"class counts must be a non-empty 1-D sequence, got shape {n.shape}")
  bad = [i for i, c in enumerate(n) if not np.isfinite(c) or c <= 0]
  if bad:
    raise ValueError(f"class counts must be positive; class {bad[0]} has {n[bad[0]]}")
  w = n ** -float(p)
  return (n.size * w / w.sum()).astype(np.float32)


def weighted_cross_entropy(logits: jax.Array, labels: jax.Array, weights: jax.Array,
                           mask: jax.Array | None = None) -> jax.Array:
  """torch F.cross_entropy(logits, labels, weight=weights): sum w_y nll / sum w_y.

  Args:
    logits: [B, C]; labels: [B] int; weights: [C].
    mask: optional [B] (bool or 0/1): claims to count (padding rows of a fixed-shape batch
      are 0). A batch with no weight at all gives 0, not NaN.
  """
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  labels = labels.astype(jnp.int32)
  nll = -jnp.take_along_axis(logp, labels[:, None], axis=-1)[:, 0]  # [B]
  w = jnp.asarray(weights, jnp.float32)[labels]
  if mask is not None:
    w = w * mask.astype(jnp.float32)
  total = w.sum()
  return jnp.where(total > 0, (w * nll).sum() / jnp.where(total > 0, total, 1.0), 0.0)


def item_relevance_loss(gate_logits: jax.Array, relevant: jax.Array, present: jax.Array
                        ) -> jax.Array:
  """Binary cross-entropy of the item gate's logits [B, N] against relevance [B, N] (0/1),
  the mean over the present items (bool [B, N]); 0 when none is present."""
  x, y = gate_logits.astype(jnp.float32), relevant.astype(jnp.float32)
  # -[y log s(x) + (1 - y) log(1 - s(x))] = y softplus(-x) + (1 - y) softplus(x), stably.
  per_item = y * jax.nn.softplus(-x) + (1.0 - y) * jax.nn.softplus(x)
  count = present.astype(jnp.float32).sum()
  return jnp.where(present, per_item, 0.0).sum() / jnp.maximum(count, 1.0)


class ClaimOnlyClassifier(nnx.Module):
  """The "no evidence" row: the claim's token states alone -> 3 logits.

  The reference's claim-only setting (verification/util/sentiment.py, the pooled
  SentimentDetectionLayer5): max over the claim tokens -> Linear(512 -> 64) -> ReLU ->
  Dropout(0.3) -> Linear(64 -> 3). Here the max is over the real (masked) tokens.
  """

  HIDDEN = 64
  DROPOUT = 0.3

  def __init__(self, text_dim: int, num_classes: int = 3, *, dtype: Dtype = None,
               param_dtype=jnp.float32, rngs: nnx.Rngs):
    kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.hidden = layers.Dense(text_dim, self.HIDDEN, ("embed", "mlp"), **kw)
    self.classifier = layers.Dense(self.HIDDEN, num_classes, ("mlp", "classes"), **kw)
    self.dropout = nnx.Dropout(self.DROPOUT, rngs=rngs)

  def __call__(self, claim: jax.Array, claim_mask: jax.Array, *,
               deterministic: bool = True, **unused_evidence) -> jax.Array:
    del unused_evidence  # Same call as StanceDetector; evidence is ignored by design.
    _check("claim", claim, 3)
    mask = claim_mask.astype(bool)[..., None]
    pooled = jnp.where(mask, claim, jnp.finfo(claim.dtype).min).max(axis=1)
    pooled = jnp.where(mask.any(1), pooled, 0)  # [B, Dt]; a claim with no tokens: 0.
    h = self.dropout(jax.nn.relu(self.hidden(pooled)), deterministic=deterministic)
    return layers.constrain(self.classifier(h).astype(jnp.float32), ("batch", "classes"))
