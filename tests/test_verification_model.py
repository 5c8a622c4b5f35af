"""The stance-detection model against a PyTorch re-statement of the reference, its loss, and
the verification baselines.

`TorchReference` (benchmarks/torch_stance.py's `TorchStance`, shared with the training
benchmark) restates VT-NLP/Mocheg's BertMultiwayMatch2 (verification/util/stance_detect.py).
Its `forward` runs it the way the reference does: one claim per call, the claim repeated over
that claim's evidence items, and the image branch skipped for a claim with no image. Its
`batched` is the benchmark's masked batch version, checked here against ours too.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
import torch.nn.functional as F
from flax import nnx

from benchmarks.torch_stance import TorchStance as TorchReference
from benchmarks.torch_stance import to_torch
from mocheg_jax.models import clip
from mocheg_jax.verification import baselines, features, stance, vision_top
from mocheg_jax.verification.stance import (StanceConfig, StanceDetector, class_weights,
                                            weighted_cross_entropy)

# The paper's sizes (CLIP ViT-B/32), used by the main parity test, and small ones that keep
# the other tests fast on CPU.
PAPER = dict(text_dim=512, image_dim=768, hidden=512)
SMALL = dict(text_dim=32, image_dim=48, hidden=24)
PAPER_PATCHES, SMALL_PATCHES = 49, 9

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _randomize(model: nnx.Module, seed: int, scale: float = 0.05) -> None:
  """Random weights and biases (the init has zero biases, which would hide bias bugs)."""
  state = nnx.state(model, nnx.Param)
  leaves, treedef = jax.tree.flatten(state)
  rng = np.random.default_rng(seed)
  new = [jnp.asarray(rng.normal(0, scale, np.shape(x)), jnp.float32) for x in leaves]
  nnx.update(model, jax.tree.unflatten(treedef, new))


def _t(x) -> torch.Tensor:
  return torch.from_numpy(np.array(x, np.float32))


# Per claim: (claim length, text item lengths, number of images). Claim 1 has no image,
# claim 2 no text evidence.
CLAIMS = [(7, (5, 9, 3), 2), (4, (6,), 0), (9, (), 1), (3, (8, 2), 3)]


def make_claims(seed: int = 0, dims: dict = SMALL, patches: int = SMALL_PATCHES) -> list[dict]:
  """Per-claim arrays as the reference sees them: the claim and its text items padded to
  one per-claim length L (one tokenizer call), images [n, patches, image_dim]."""
  rng = np.random.default_rng(seed)
  dt, dv = dims["text_dim"], dims["image_dim"]
  out = []
  for lc, text_lens, n_img in CLAIMS:
    length = max((lc, *text_lens))
    claim_mask = np.arange(length) < lc
    text_mask = np.stack([np.arange(length) < t for t in text_lens]) if text_lens else \
        np.zeros((0, length), bool)
    out.append(dict(
        claim=rng.normal(size=(length, dt)).astype(np.float32), claim_mask=claim_mask,
        text=rng.normal(size=(len(text_lens), length, dt)).astype(np.float32),
        text_mask=text_mask,
        image=rng.normal(size=(n_img, patches, dv)).astype(np.float32)))
  return out


def make_batch(claims: list[dict], *, items: tuple[int, int] | None = None,
               tokens: int | None = None, seed: int = 1) -> dict:
  """Pads the claims into one batch; padding holds large random values (masked out)."""
  rng = np.random.default_rng(seed)
  nt = max(1, max(len(c["text"]) for c in claims))
  ni = max(1, max(len(c["image"]) for c in claims))
  if items is not None:
    nt, ni = max(nt, items[0]), max(ni, items[1])
  length = max(c["claim"].shape[0] for c in claims)
  length = max(length, tokens or 0)
  b = len(claims)
  dt = claims[0]["claim"].shape[-1]
  patches, dv = claims[0]["image"].shape[1:]
  batch = dict(claim=rng.normal(0, 50, (b, length, dt)), claim_mask=np.zeros((b, length), bool),
               text=rng.normal(0, 50, (b, nt, length, dt)),
               text_mask=np.zeros((b, nt, length), bool),
               image=rng.normal(0, 50, (b, ni, patches, dv)), image_mask=np.zeros((b, ni), bool))
  for i, c in enumerate(claims):
    lc, n, m = c["claim"].shape[0], len(c["text"]), len(c["image"])
    batch["claim"][i, :lc] = np.where(c["claim_mask"][:, None], c["claim"],
                                      batch["claim"][i, :lc])
    batch["claim_mask"][i, :lc] = c["claim_mask"]
    batch["text"][i, :n, :lc] = np.where(c["text_mask"][..., None], c["text"],
                                         batch["text"][i, :n, :lc])
    batch["text_mask"][i, :n, :lc] = c["text_mask"]
    batch["image"][i, :m] = c["image"]
    batch["image_mask"][i, :m] = True
  return {k: jnp.asarray(v, jnp.float32 if v.dtype != bool else bool) for k, v in batch.items()}


@nnx.jit
def _forward(model: StanceDetector, batch: dict) -> jax.Array:
  return model(**batch)


def run(model: StanceDetector, batch: dict) -> np.ndarray:
  return np.asarray(_forward(model, batch))


def _grads(model: StanceDetector, batch: dict) -> nnx.State:
  """Gradients of a class-weighted loss on a 4-claim batch (fixed labels and weights)."""

  def loss(m):
    return weighted_cross_entropy(m(**batch), jnp.array([0, 1, 2, 1]),
                                  jnp.asarray(class_weights([5, 3, 2])))

  return nnx.jit(nnx.grad(loss))(model)


def reference_logits(ref: TorchReference, c: dict, use_text: bool | None = None):
  """The reference's logits for one claim (use_text overrides the module's switch)."""
  saved = ref.use_text
  if use_text is not None:
    ref.use_text = use_text
  image = _t(c["image"]) if len(c["image"]) else None  # has_image
  try:
    with torch.no_grad():
      out = ref(_t(c["claim"])[None], torch.from_numpy(c["claim_mask"])[None], _t(c["text"]),
                torch.from_numpy(c["text_mask"]), image)
  finally:
    ref.use_text = saved
  return out.numpy()[0]


def build(seed: int = 0, dims: dict = SMALL, **overrides) -> StanceDetector:
  model = StanceDetector(StanceConfig(**dims, **overrides), rngs=nnx.Rngs(seed))
  _randomize(model, seed)
  return model


@pytest.mark.parametrize("heads,dims,patches", [(1, PAPER, PAPER_PATCHES),
                                                 (2, SMALL, SMALL_PATCHES)])
def test_batched_logits_match_reference_per_claim(heads, dims, patches):
  model = build(heads=heads, dims=dims)
  ref = to_torch(model)
  claims = make_claims(0, dims, patches)
  ours = run(model, make_batch(claims))
  assert ours.shape == (4, 3) and np.isfinite(ours).all()
  for i in (0, 1, 3):  # Claim 1 has no image: the reference's classifier_text path.
    np.testing.assert_allclose(ours[i], reference_logits(ref, claims[i]), atol=1e-5, rtol=1e-5)
  # Claim 2 has no text item: the reference's mean over zero items is NaN ...
  assert np.isnan(reference_logits(ref, claims[2])).all()
  # ... we define it by the reference's one-modality rule: classifier_text(image stance).
  np.testing.assert_allclose(ours[2], reference_logits(ref, claims[2], use_text=False),
                             atol=1e-5, rtol=1e-5)


def test_benchmark_batched_torch_matches_ours_with_gradients():
  """The training benchmark's batched torch side computes our function, padding included."""
  model = build(13)
  ref = to_torch(model)
  batch = make_batch(make_claims(13), items=(4, 3), tokens=12, seed=3)
  batch["text_mask"] = batch["text_mask"].at[3].set(False)  # claim 3: images only ...
  batch["image_mask"] = batch["image_mask"].at[3].set(False)  # ... and then nothing at all
  labels, weights = np.array([2, 0, 1, 1]), class_weights([5, 3, 2])
  tb = {k: torch.from_numpy(np.array(v)) for k, v in batch.items()}
  logits = ref.batched(tb["claim"], tb["claim_mask"], tb["text"], tb["text_mask"],
                       tb["image"], tb["image_mask"])
  loss = F.cross_entropy(logits, torch.from_numpy(labels), weight=torch.from_numpy(weights))
  loss.backward()

  def our_loss(m):
    out = m(**batch)
    return weighted_cross_entropy(out, jnp.asarray(labels), jnp.asarray(weights)), out

  (ours_loss, ours), grads = nnx.jit(nnx.value_and_grad(our_loss, has_aux=True))(model)
  np.testing.assert_allclose(logits.detach().numpy(), np.asarray(ours), atol=1e-5, rtol=1e-5)
  assert abs(loss.item() - float(ours_loss)) < 1e-5
  # Gradients of the shared fusion layer and of the classifiers (torch weight = kernel.T).
  for ours_dense, linear in ((grads.fuse, ref.linear_fuse_p), (grads.classifier, ref.classifier),
                             (grads.classifier_single, ref.classifier_text)):
    np.testing.assert_allclose(linear.weight.grad.numpy().T, np.asarray(ours_dense.kernel[...]),
                               atol=1e-5, rtol=1e-4)
  # The batch really holds each path: both modalities, text only, image only, neither.
  assert np.abs(np.asarray(grads.classifier_single.bias[...])).max() > 1e-4
  # The attentions' projections, which ours applies on the claim's side (stance._attend):
  # the same gradients as the reference's projected keys and values. The key bias has none
  # (the softmax ignores it), in the reference up to rounding.
  mha = ref.txt_multihead_attn
  d = mha.embed_dim
  for attention, torch_attention, weights in (
      (grads.text_attention, mha, dict(zip(("query", "key", "value"),
                                           mha.in_proj_weight.grad.split(d)))),
      (grads.image_attention, ref.img_multihead_attn,
       {n: getattr(ref.img_multihead_attn, f"{n[0]}_proj_weight").grad
        for n in ("query", "key", "value")})):
    biases = dict(zip(("query", "key", "value"), torch_attention.in_proj_bias.grad.split(d)))
    for name in ("query", "key", "value"):
      kernel = np.asarray(getattr(attention, name).kernel[...])
      np.testing.assert_allclose(weights[name].numpy().T, kernel.reshape(kernel.shape[0], -1),
                                 atol=1e-5, rtol=1e-4, err_msg=name)
      np.testing.assert_allclose(biases[name].numpy(),
                                 np.asarray(getattr(attention, name).bias[...]).reshape(-1),
                                 atol=1e-5, rtol=1e-4, err_msg=name)
    out = np.asarray(attention.out.kernel[...])
    np.testing.assert_allclose(torch_attention.out_proj.weight.grad.numpy().T,
                               out.reshape(-1, out.shape[-1]), atol=1e-5, rtol=1e-4)
    assert np.abs(np.asarray(attention.key.kernel[...])).max() > 1e-6  # Not all zero.


def test_single_modality_configs_match_reference():
  claims = make_claims(3)
  batch = make_batch(claims)
  text_only = build(1, use_image=False)
  assert text_only.classifier.kernel.shape == (SMALL["hidden"], 3)
  assert text_only.image_attention is None and text_only.classifier_single is None
  ours = run(text_only, {k: batch[k] for k in ("claim", "claim_mask", "text", "text_mask")})
  ref = to_torch(text_only)
  for i in (0, 1, 3):
    np.testing.assert_allclose(ours[i], reference_logits(ref, claims[i]), atol=1e-5, rtol=1e-5)
  # No text item and no other modality: stance 0, so the logits are the classifier bias.
  np.testing.assert_allclose(ours[2], np.asarray(text_only.classifier.bias[...]), atol=1e-6)

  image_only = build(2, use_text=False)
  assert image_only.classifier.kernel.shape == (SMALL["hidden"], 3)
  ours = run(image_only, {k: batch[k] for k in ("claim", "claim_mask", "image", "image_mask")})
  ref = to_torch(image_only)
  for i in (0, 2, 3):
    np.testing.assert_allclose(ours[i], reference_logits(ref, claims[i]), atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(ours[1], np.asarray(image_only.classifier.bias[...]), atol=1e-6)


def _cosine_text_logits(model: StanceDetector, c: dict) -> np.ndarray:
  """The cosine-alignment text-only model for one claim, in plain numpy float64."""
  p = lambda x: np.asarray(x[...], np.float64)
  claim, evidence = c["claim"][c["claim_mask"]].astype(np.float64), c["text"]
  unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)
  scale = np.exp(p(model.text_log_scale))
  stances = []
  for item, mask in zip(evidence, c["text_mask"]):
    keys = item[mask].astype(np.float64)
    scores = scale * unit(claim) @ unit(keys).T
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    m = (weights / weights.sum(-1, keepdims=True)) @ keys
    h = np.concatenate([m - claim, m * claim], -1) @ p(model.fuse.kernel) + p(model.fuse.bias)
    stances.append(np.where(h > 0, h, 0.01 * h).max(0))
  stance = np.mean(stances, 0)
  return stance @ p(model.classifier.kernel) + p(model.classifier.bias)


def test_cosine_text_attention_matches_numpy_and_ignores_padding():
  claims = make_claims(12)
  model = build(12, use_image=False, text_attention="cosine")
  assert model.text_attention is None
  model.text_log_scale[...] = jnp.log(7.0)
  keys = ("claim", "claim_mask", "text", "text_mask")
  tight = run(model, {k: v for k, v in make_batch(claims, seed=1).items() if k in keys})
  padded = run(model, {k: v for k, v in make_batch(claims, items=(5, 1), tokens=14,
                                                     seed=2).items() if k in keys})
  np.testing.assert_allclose(padded, tight, atol=2e-5, rtol=1e-5)
  for i in (0, 1, 3):
    np.testing.assert_allclose(tight[i], _cosine_text_logits(model, claims[i]), atol=1e-4,
                               rtol=1e-4)
  # Another scale changes the logits: the temperature is live.
  model.text_log_scale[...] = jnp.log(0.5)
  assert np.abs(run(model, {k: v for k, v in make_batch(claims, seed=1).items()
                            if k in keys}) - tight).max() > 1e-4


def test_cosine_alignment_returns_the_repeated_claim_token():
  # Evidence that repeats each claim token (among other tokens) gives m = c at a sharp
  # temperature, whatever the vectors' norms: what the learned projections fail to find.
  model = build(13, use_image=False, text_attention="cosine")
  model.text_log_scale[...] = jnp.log(200.0)
  rng = np.random.default_rng(13)
  claim = rng.normal(size=(2, 6, SMALL["text_dim"]))
  others = rng.normal(size=(2, 1, 5, SMALL["text_dim"]))
  evidence = np.concatenate([others, claim[:, None, ::-1]], axis=2)  # [B, 1, 11, D]
  keys = np.ones(evidence.shape[:3], bool)
  m = model._align(jnp.asarray(claim, jnp.float32), jnp.asarray(evidence, jnp.float32),
                   jnp.asarray(keys))
  np.testing.assert_allclose(np.asarray(m)[:, 0], claim, atol=1e-3)
  # Without the copies, m is something else.
  m = model._align(jnp.asarray(claim, jnp.float32), jnp.asarray(others, jnp.float32),
                   jnp.asarray(keys[:, :, :5]))
  assert np.abs(np.asarray(m)[:, 0] - claim).max() > 0.5


def test_cosine_text_attention_with_images_has_finite_gradients():
  model = build(14, text_attention="cosine")
  batch = make_batch(make_claims(14))
  batch["text_mask"] = batch["text_mask"].at[0].set(False)

  grads = _grads(model, batch)
  assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads))
  assert abs(float(grads.text_log_scale[...])) > 0  # The temperature learns.


def _with_match_bits(batch: dict, field: str, seed: int) -> dict:
  """Adds random match bits as `field`, set on padding (absent items, padded claim tokens)
  too."""
  b, nt = batch["text"].shape[:2]
  bits = np.random.default_rng(seed).random((b, nt, batch["claim"].shape[1])) < 0.5
  return dict(batch, **{field: jnp.asarray(bits, jnp.float32)})


@pytest.mark.parametrize("option,field,layer", [
    ("token_match", "text_match", "match_fuse"),
    ("phrase_match", "text_phrase_match", "phrase_fuse")])
def test_match_bits_add_a_layer_that_reads_only_real_bits(option, field, layer):
  claims = make_claims(15)
  plain = build(15, use_image=False, text_attention="cosine")
  model = build(16, use_image=False, text_attention="cosine", **{option: True})
  nnx.update(model, nnx.state(plain, nnx.Param))  # Shared layers equal, the new one its own.
  keys = ("claim", "claim_mask", "text", "text_mask")
  batch = _with_match_bits({k: v for k, v in make_batch(claims, seed=1).items()
                            if k in keys}, field, 15)
  with_bits = run(model, batch)
  # With the new layer at zero the model is the plain one: the bits are its only new input.
  zeroed = nnx.clone(model)
  nnx.update(getattr(zeroed, layer),
             jax.tree.map(jnp.zeros_like, nnx.state(getattr(zeroed, layer), nnx.Param)))
  np.testing.assert_allclose(run(zeroed, batch), run(plain, {k: batch[k] for k in keys}),
                             atol=1e-5, rtol=1e-5)
  assert np.abs(run(zeroed, batch) - with_bits).max() > 1e-3
  # Flipping real bits changes the logits; bits on padding (absent items, padded claim
  # tokens) do not.
  real = batch["text_mask"].any(-1)[:, :, None] & batch["claim_mask"][:, None, :]
  flipped = jnp.where(real, 1 - batch[field], batch[field])
  assert np.abs(run(model, dict(batch, **{field: flipped})) - with_bits).max() > 1e-3
  padded = make_batch(claims, items=(5, 1), tokens=14, seed=2)
  padded = _with_match_bits({k: v for k, v in padded.items() if k in keys}, field, 16)
  b, nt, lc = batch[field].shape
  padded[field] = padded[field].at[:, :nt, :lc].set(batch[field])
  np.testing.assert_allclose(run(model, padded), with_bits, atol=2e-5, rtol=1e-5)

  grads = _grads(model, batch)
  assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads))
  assert np.abs(np.asarray(getattr(grads, layer).kernel[...])).max() > 0
  with pytest.raises(ValueError, match=f"{option}=True needs {field}"):
    model(**{k: batch[k] for k in keys})
  with pytest.raises(ValueError, match=f"{option} needs use_text"):
    StanceConfig(**SMALL, use_text=False, **{option: True})


def test_token_and_phrase_bits_each_reach_the_model_through_their_own_layer():
  claims = make_claims(18)
  model = build(18, use_image=False, text_attention="cosine", token_match=True,
                phrase_match=True)
  keys = ("claim", "claim_mask", "text", "text_mask")
  batch = _with_match_bits({k: v for k, v in make_batch(claims, seed=4).items()
                            if k in keys}, "text_match", 18)
  batch = _with_match_bits(batch, "text_phrase_match", 19)
  swapped = dict(batch, text_match=batch["text_phrase_match"],
                 text_phrase_match=batch["text_match"])
  assert np.abs(run(model, swapped) - run(model, batch)).max() > 1e-3


def test_max_item_pool_takes_the_elementwise_max_over_present_items():
  claims = make_claims(17)
  model = build(17, use_image=False, text_attention="cosine", item_pool="max")
  batch = make_batch(claims, items=(4, 1), seed=3)
  claim, claim_mask = batch["claim"], batch["claim_mask"].astype(bool)
  text, text_mask = batch["text"], batch["text_mask"].astype(bool)
  present = text_mask.any(-1)
  assert (present.sum(-1) > 1).any() and not present.all()  # Several, and absent, items.

  def stance(items):
    return np.asarray(model._stance(None, claim, claim_mask, text, text_mask, items, True)[0])

  pooled = stance(present)
  per_item = np.stack([stance(present & (jnp.arange(present.shape[1]) == j))
                       for j in range(present.shape[1])], 1)  # [B, N, hidden]
  want = np.where(np.asarray(present)[..., None], per_item, -np.inf).max(1)
  want[~np.asarray(present).any(1)] = 0.0  # A claim without items: a zero stance.
  np.testing.assert_allclose(pooled, want, atol=1e-5, rtol=1e-5)
  mean = build(17, use_image=False, text_attention="cosine")
  assert np.abs(run(mean, {k: batch[k] for k in ("claim", "claim_mask", "text", "text_mask")})
                - run(model, {k: batch[k] for k in ("claim", "claim_mask", "text",
                                                    "text_mask")})).max() > 1e-3
  none = stance(jnp.zeros_like(present))  # No items: a zero stance, not -inf.
  assert (none == 0).all()
  with pytest.raises(ValueError, match="unknown item_pool"):
    StanceConfig(**SMALL, item_pool="sum")


def test_word_queries_read_the_claim_ids_not_its_states():
  claims = make_claims(18)
  model = build(18, use_text=False, image_query="words", word_buckets=64)
  batch = {k: v for k, v in make_batch(claims, seed=4).items()
           if k in ("claim", "claim_mask", "image", "image_mask")}
  b, lc = batch["claim_mask"].shape
  ids = np.random.default_rng(18).integers(0, 1000, (b, lc))
  ids = np.where(np.asarray(batch["claim_mask"]), ids, -1)  # Padding: -1, as the store's.
  batch["claim_ids"] = jnp.asarray(ids, jnp.int32)
  logits = run(model, batch)
  # The image branch is queried by the ids' rows: other claim states change nothing, other
  # ids (of real tokens) do, padding ids do not.
  noise = jnp.asarray(np.random.default_rng(19).normal(size=batch["claim"].shape), jnp.float32)
  np.testing.assert_allclose(run(model, dict(batch, claim=noise)), logits, atol=1e-6)
  real = np.asarray(batch["claim_mask"], bool)
  other = jnp.asarray(np.where(real, ids + 1, ids), jnp.int32)
  assert np.abs(run(model, dict(batch, claim_ids=other)) - logits).max() > 1e-3
  padded = jnp.asarray(np.where(real, ids, 7), jnp.int32)
  np.testing.assert_allclose(run(model, dict(batch, claim_ids=padded)), logits, atol=1e-6)

  grads = np.asarray(_grads(model, batch).word_embedding.embedding[...])
  used = np.unique(ids[real] % 64)
  assert np.abs(grads[used]).max() > 0
  assert not np.delete(grads, used, axis=0).any()  # Rows of no claim token: untouched.
  with pytest.raises(ValueError, match="image_query='words' needs claim_ids"):
    model(**{k: v for k, v in batch.items() if k != "claim_ids"})
  with pytest.raises(ValueError, match="needs use_image"):
    StanceConfig(**SMALL, use_image=False, image_query="words")


@pytest.mark.parametrize("thresholds", [(), (0.0, 0.5)])
def test_image_score_reaches_each_present_item_through_its_own_layer(thresholds):
  claims = make_claims(21)
  plain = build(21, item_pool="max")
  model = build(22, image_score=True, item_pool="max", score_thresholds=thresholds)
  assert model.score_fuse.kernel.shape == (max(len(thresholds), 1), SMALL["hidden"])
  nnx.update(model, nnx.state(plain, nnx.Param))  # Shared layers equal, score_fuse its own.
  batch = make_batch(claims, seed=5)
  scores = np.random.default_rng(21).uniform(-0.5, 0.5, batch["image_mask"].shape)
  batch["image_score"] = jnp.asarray(scores, jnp.float32)
  logits = run(model, batch)
  present = np.asarray(batch["image_mask"], bool)
  moved = jnp.asarray(np.where(present, scores + 0.3, scores), jnp.float32)
  assert np.abs(run(model, dict(batch, image_score=moved)) - logits).max() > 1e-3
  absent = jnp.asarray(np.where(present, scores, 9.0), jnp.float32)  # Padding items: ignored.
  np.testing.assert_allclose(run(model, dict(batch, image_score=absent)), logits, atol=1e-6)
  # With score_fuse at zero the model is the plain one: the score is its only new input.
  zeroed = nnx.clone(model)
  nnx.update(zeroed.score_fuse,
             jax.tree.map(jnp.zeros_like, nnx.state(zeroed.score_fuse, nnx.Param)))
  without = {k: v for k, v in batch.items() if k != "image_score"}
  np.testing.assert_allclose(run(zeroed, batch), run(plain, without), atol=1e-5, rtol=1e-5)
  assert np.abs(run(zeroed, batch) - logits).max() > 1e-3

  grads = _grads(model, batch)
  assert np.abs(np.asarray(grads.score_fuse.kernel[...])).max() > 0
  with pytest.raises(ValueError, match="image_score=True needs image_score"):
    model(**without)
  with pytest.raises(ValueError, match="image_score has shape"):
    model(**dict(batch, image_score=batch["image_score"][:, :1]))
  with pytest.raises(ValueError, match="image_score needs use_image"):
    StanceConfig(**SMALL, use_image=False, image_score=True)


def _unit(x: np.ndarray) -> np.ndarray:
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def test_image_embeds_reach_each_present_item_through_their_own_layer():
  claims = make_claims(23)
  plain = build(23, item_pool="max")
  model = build(24, item_pool="max", image_embeds=True, embed_dim=8)
  assert model.embed_fuse.kernel.shape == (3 * 8, SMALL["hidden"])
  nnx.update(model, nnx.state(plain, nnx.Param))  # Shared layers equal, embed_fuse its own.
  batch = make_batch(claims, seed=6)
  rng = np.random.default_rng(23)
  b, ni = batch["image_mask"].shape
  images = _unit(rng.normal(size=(b, ni, 8)))
  batch.update(image_embed=jnp.asarray(images, jnp.float32),
               claim_embed=jnp.asarray(_unit(rng.normal(size=(b, 8))), jnp.float32))
  logits = run(model, batch)
  present = np.asarray(batch["image_mask"], bool)
  other = _unit(rng.normal(size=images.shape))
  moved = jnp.asarray(np.where(present[..., None], other, images), jnp.float32)
  assert np.abs(run(model, dict(batch, image_embed=moved)) - logits).max() > 1e-3
  absent = jnp.asarray(np.where(present[..., None], images, other), jnp.float32)
  np.testing.assert_allclose(run(model, dict(batch, image_embed=absent)), logits, atol=1e-6)
  # With embed_fuse at zero the model is the plain one: the embeddings are its only new input.
  zeroed = nnx.clone(model)
  nnx.update(zeroed.embed_fuse,
             jax.tree.map(jnp.zeros_like, nnx.state(zeroed.embed_fuse, nnx.Param)))
  without = {k: v for k, v in batch.items() if k not in ("image_embed", "claim_embed")}
  np.testing.assert_allclose(run(zeroed, batch), run(plain, without), atol=1e-5, rtol=1e-5)

  assert np.abs(np.asarray(_grads(model, batch).embed_fuse.kernel[...])).max() > 0
  with pytest.raises(ValueError, match="image_embeds=True needs image_embed and claim_embed"):
    model(**without)
  with pytest.raises(ValueError, match="claim_embed has feature size 4"):
    model(**dict(batch, claim_embed=batch["claim_embed"][:, :4]))
  with pytest.raises(ValueError, match="image_embeds needs use_image"):
    StanceConfig(**SMALL, use_image=False, image_embeds=True, embed_dim=8)
  with pytest.raises(ValueError, match="image_embeds needs embed_dim"):
    StanceConfig(**SMALL, image_embeds=True)


def test_embed_features_are_the_product_and_both_embeddings_at_unit_scale():
  rng = np.random.default_rng(0)
  image, claim = _unit(rng.normal(size=(2, 3, 16))), _unit(rng.normal(size=(2, 16)))
  got = np.asarray(stance.embed_features(jnp.asarray(image), jnp.asarray(claim)))
  assert got.shape == (2, 3, 48)
  product = got[..., :16] / 16  # Its sum over E is the cosine.
  np.testing.assert_allclose(product.sum(-1), np.einsum("bne,be->bn", image, claim),
                             rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(got[..., 16:32], 4 * image, rtol=1e-6)
  np.testing.assert_allclose(got[..., 32:], np.broadcast_to(4 * claim[:, None], (2, 3, 16)),
                             rtol=1e-6)


def test_score_thresholds_give_one_soft_step_per_threshold():
  cos = jnp.array([-1.0, 0.0, 0.5, 0.9, 0.95, 1.0])
  np.testing.assert_allclose(stance.score_features(cos), 10.0 * cos[:, None], rtol=1e-6)
  steps = np.asarray(stance.score_features(cos, (0.0, 0.9)))
  assert steps.shape == (6, 2)
  expected = 10.0 / (1.0 + np.exp(-20.0 * (np.asarray(cos)[:, None] - np.array([0.0, 0.9]))))
  np.testing.assert_allclose(steps, expected, rtol=1e-5, atol=1e-6)
  assert steps[3, 1] == pytest.approx(5.0)  # Halfway at its threshold,
  assert steps[0, 0] < 1e-6 and steps[-1, 0] > 10.0 - 1e-6  # flat far from it.
  with pytest.raises(ValueError, match="score_thresholds needs image_score"):
    StanceConfig(**SMALL, score_thresholds=(0.9,))
  for bad in ([0.9], (0.9, float("nan")), ("0.9",)):
    with pytest.raises(ValueError, match="score_thresholds must be a tuple of finite"):
      StanceConfig(**SMALL, image_score=True, score_thresholds=bad)


def test_score_thresholds_let_the_model_learn_a_cosine_cut_off():
  """The rule image-fact claims follow (CLIP's claim-image cosine above ~0.9: the picture
  shows the claimed value) from the image score alone, patches pure noise: with soft steps
  the verifier's optimizer (Adam, lr 1e-3) learns it in 150 steps."""
  rng = np.random.default_rng(0)
  dims = dict(text_dim=8, image_dim=8, hidden=16)

  def draw(n):
    cos = np.where(rng.random(n) < 0.5, rng.uniform(0.92, 1.0, n), rng.uniform(0.2, 0.85, n))
    batch = dict(claim=jnp.asarray(rng.normal(size=(n, 3, 8)), jnp.float32),
                 claim_mask=jnp.ones((n, 3), bool),
                 image=jnp.asarray(rng.normal(size=(n, 1, 2, 8)), jnp.float32),
                 image_mask=jnp.ones((n, 1), bool),
                 image_score=jnp.asarray(cos[:, None], jnp.float32))
    return batch, jnp.asarray(cos > 0.9, jnp.int32)  # 1 supported, 0 refuted.

  model = StanceDetector(StanceConfig(**dims, use_text=False, image_score=True,
                                      score_thresholds=(0.0, 0.5, 0.7, 0.8, 0.9, 0.95)),
                         rngs=nnx.Rngs(0))
  optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)

  @nnx.jit
  def step(model, optimizer, batch, labels):
    def loss(m):
      return optax.softmax_cross_entropy_with_integer_labels(m(**batch), labels).mean()
    optimizer.update(model, nnx.grad(loss)(model))

  for _ in range(150):
    step(model, optimizer, *draw(64))
  batch, labels = draw(1000)  # Fresh claims and pictures.
  accuracy = float((model(**batch).argmax(-1) == labels).mean())
  assert accuracy > 0.95, accuracy


def test_item_context_is_what_an_item_says_beyond_the_claim():
  claims = make_claims(23)
  plain = build(23, use_image=False, text_attention="cosine", item_pool="max")
  model = build(24, use_image=False, text_attention="cosine", item_pool="max",
                item_context=True)
  nnx.update(model, nnx.state(plain, nnx.Param))  # Shared layers equal, context_fuse its own.
  keys = ("claim", "claim_mask", "text", "text_mask")
  batch = {k: v for k, v in make_batch(claims, items=(3, 1), seed=6).items() if k in keys}
  claim, claim_mask = batch["claim"], batch["claim_mask"].astype(bool)
  text, text_mask = batch["text"], batch["text_mask"].astype(bool)
  context = np.asarray(model._context(claim, claim_mask, text, text_mask))
  # By direct computation: weights 1 - the best cosine to a real claim token, floored; a
  # mean over the item's tokens.
  c = np.asarray(claim) / np.linalg.norm(np.asarray(claim), axis=-1, keepdims=True)
  e = np.asarray(text) / np.linalg.norm(np.asarray(text), axis=-1, keepdims=True)
  cos = np.einsum("bqd,bnkd->bnqk", c, e)
  cos = np.where(np.asarray(claim_mask)[:, None, :, None], cos, -1.0)
  w = np.where(np.asarray(text_mask), np.maximum(1 - cos.max(2), 0), 0)
  want = np.einsum("bnk,bnkd->bnd", w, np.asarray(text)) / np.maximum(
      np.asarray(text_mask).sum(-1, keepdims=True), 1)
  np.testing.assert_allclose(context, want, atol=1e-5, rtol=1e-4)
  # An item that only repeats the claim's tokens says nothing beyond it: context 0.
  lc = claim.shape[1]
  echo = text.at[:, 0, :lc].set(claim).at[:, 0, lc:].set(0.0)
  echo_mask = text_mask.at[:, 0, :].set(False).at[:, 0, :lc].set(claim_mask)
  np.testing.assert_allclose(np.asarray(model._context(claim, claim_mask, echo, echo_mask))
                             [np.asarray(claim_mask).any(-1), 0], 0.0, atol=1e-6)
  # With context_fuse at zero the model is the plain one; otherwise the context counts.
  zeroed = nnx.clone(model)
  nnx.update(zeroed.context_fuse,
             jax.tree.map(jnp.zeros_like, nnx.state(zeroed.context_fuse, nnx.Param)))
  np.testing.assert_allclose(run(zeroed, batch), run(plain, batch), atol=1e-5, rtol=1e-5)
  assert np.abs(run(model, batch) - run(plain, batch)).max() > 1e-3

  grads = _grads(model, batch)
  assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads))
  assert np.abs(np.asarray(grads.context_fuse.kernel[...])).max() > 0
  with pytest.raises(ValueError, match="item_context needs use_text"):
    StanceConfig(**SMALL, use_text=False, item_context=True)


# Per gated modality: the model's switches, its gate layer, the batch fields it reads.
GATES = {"text": (dict(use_image=False, text_attention="cosine", item_gate=True),
                  "item_gate", ("text", "text_mask")),
         "image": (dict(use_text=False, image_gate=True), "image_gate",
                   ("image", "image_mask"))}


@pytest.mark.parametrize("modality", sorted(GATES))
def test_item_gate_scales_each_item_and_returns_its_logits(modality):
  switches, layer, (items, mask) = GATES[modality]
  claims = make_claims(25)
  plain_switches = {k: v for k, v in switches.items() if not k.endswith("_gate")}
  plain = build(25, item_pool="max", **plain_switches)
  model = build(26, item_pool="max", **switches)
  nnx.update(model, nnx.state(plain, nnx.Param))  # Shared layers equal, the gate its own.
  batch = {k: v for k, v in make_batch(claims, items=(3, 3), seed=8).items()
           if k in ("claim", "claim_mask", items, mask)}
  # Jitted: the image branch run op by op takes half a minute on a busy 2-core machine.
  with_gates = nnx.jit(lambda m, b: m(**b, return_item_gates=True))
  logits, gates = with_gates(model, batch)
  assert set(gates) == {modality}
  gates = gates[modality]
  assert gates.shape == batch[items].shape[:2]
  np.testing.assert_allclose(logits, run(model, batch), atol=1e-6)  # Same logits either way.
  assert with_gates(plain, batch)[1] == {}

  def gate_bias(value: float) -> nnx.Module:
    out = nnx.clone(model)
    gate = getattr(out, layer)
    nnx.update(gate, jax.tree.map(jnp.zeros_like, nnx.state(gate, nnx.Param)))
    gate.bias[...] = jnp.full_like(gate.bias[...], value)
    return out
  # A gate wide open is the plain model; a closed one leaves its branch nothing.
  np.testing.assert_allclose(run(gate_bias(40.0), batch), run(plain, batch), atol=1e-5,
                             rtol=1e-5)
  closed = gate_bias(-40.0)
  nothing = {**batch, mask: jnp.zeros_like(batch[mask])}
  np.testing.assert_allclose(run(closed, batch), run(closed, nothing), atol=1e-5)

  # The auxiliary loss: binary cross-entropy over the present items only.
  present = np.asarray(batch[mask])
  present = present.any(-1) if present.ndim == 3 else present
  relevant = (np.random.default_rng(3).random(present.shape) < 0.5).astype(np.float32)
  got = stance.item_relevance_loss(gates, jnp.asarray(relevant), jnp.asarray(present))
  want = F.binary_cross_entropy_with_logits(_t(np.asarray(gates)[present]),
                                            _t(relevant[present]))
  np.testing.assert_allclose(float(got), want.item(), rtol=1e-5)
  assert float(stance.item_relevance_loss(gates, jnp.asarray(relevant),
                                          jnp.zeros_like(jnp.asarray(present)))) == 0.0

  def total(m):
    logits, g = m(**batch, return_item_gates=True)
    return logits.sum() + stance.item_relevance_loss(g[modality], jnp.asarray(relevant),
                                                     jnp.asarray(present))
  grads = nnx.jit(nnx.grad(total))(model)
  assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads))
  assert np.abs(np.asarray(getattr(grads, layer).kernel[...])).max() > 0
  other = "image" if items == "text" else "text"
  with pytest.raises(ValueError, match=f"{layer} needs use_{items}"):
    StanceConfig(**SMALL, **{**switches, f"use_{items}": False, f"use_{other}": True})


def test_both_gates_return_their_logits_by_modality():
  model = build(27, text_attention="cosine", item_gate=True, image_gate=True)
  batch = make_batch(make_claims(27), items=(3, 2))
  logits, gates = model(**batch, return_item_gates=True)
  np.testing.assert_allclose(logits, run(model, batch), atol=1e-6)
  assert {k: g.shape for k, g in gates.items()} == {"text": batch["text"].shape[:2],
                                                    "image": batch["image"].shape[:2]}


def test_zeros_mode_uses_one_classifier_with_zero_stances():
  claims = make_claims(4)
  model = build(5, missing_modality="zeros")
  assert model.classifier_single is None
  ours = run(model, make_batch(claims))
  ref = to_torch(model)
  zeros = torch.zeros(1, SMALL["hidden"])
  with torch.no_grad():
    for i, c in enumerate(claims):
      ref_stances = ref.stances(_t(c["claim"])[None], torch.from_numpy(c["claim_mask"])[None],
                                _t(c["text"]), torch.from_numpy(c["text_mask"]),
                                _t(c["image"]) if len(c["image"]) else None)
      if i == 1:
        ref_stances = [ref_stances[0], zeros]  # no image
      elif i == 2:
        ref_stances = [zeros, ref_stances[1]]  # no text (its NaN replaced by 0)
      expected = ref.classifier(torch.cat(ref_stances, -1)).numpy()[0]
      np.testing.assert_allclose(ours[i], expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("item_pool", ["mean", "max"])
def test_padding_does_not_change_logits(item_pool):
  model = build(6, item_pool=item_pool)
  claims = make_claims(6)
  tight = run(model, make_batch(claims, seed=1))
  padded = run(model, make_batch(claims, items=(6, 5), tokens=15, seed=2))
  np.testing.assert_allclose(padded, tight, atol=2e-5, rtol=1e-5)
  # The padding really is garbage that matters if unmasked.
  batch = make_batch(claims, items=(6, 5), tokens=15, seed=2)
  batch["text_mask"] = jnp.ones_like(batch["text_mask"])
  assert np.abs(run(model, batch) - tight).max() > 1e-3


def test_image_mask_per_patch_equals_per_item_and_masks_patches():
  model = build(7)
  batch = make_batch(make_claims(7))
  per_item = run(model, batch)
  patch_mask = jnp.broadcast_to(batch["image_mask"][..., None], batch["image"].shape[:3])
  np.testing.assert_allclose(run(model, {**batch, "image_mask": patch_mask}), per_item,
                             atol=1e-6)
  # Masking patches 5.. equals cutting them off.
  cut = {**batch, "image": batch["image"][:, :, :5],
         "image_mask": patch_mask[:, :, :5]}
  masked = {**batch, "image_mask": patch_mask & (jnp.arange(SMALL_PATCHES) < 5)}
  np.testing.assert_allclose(run(model, masked), run(model, cut), atol=2e-5, rtol=1e-5)
  assert np.abs(run(model, cut) - per_item).max() > 1e-4


def test_no_evidence_at_all_is_finite_with_finite_gradients():
  model = build(8)
  batch = make_batch(make_claims(8))
  batch["text_mask"] = batch["text_mask"].at[0].set(False)
  batch["image_mask"] = batch["image_mask"].at[0].set(False)
  logits = run(model, batch)
  assert np.isfinite(logits).all()
  # Neither modality: classifier_single(0) = its bias.
  np.testing.assert_allclose(logits[0], np.asarray(model.classifier_single.bias[...]),
                             atol=1e-6)
  weights = jnp.asarray(class_weights([5, 3, 2]))
  labels = jnp.array([0, 1, 2, 1])

  def loss(m):
    return weighted_cross_entropy(m(**batch), labels, weights)

  grads = nnx.jit(nnx.grad(loss))(model)
  leaves = jax.tree.leaves(grads)
  assert leaves and all(np.isfinite(np.asarray(g)).all() for g in leaves)


@pytest.mark.parametrize("read,pool", [("pairs", "patches"), ("match", "patches"),
                                       ("match", "image"), ("match", "flat")])
def test_image_reads_shapes_masks_and_gradients(read, pool):
  """The non-reference image reads: [B, 3] logits; padded items, tokens and masked patches
  change nothing; a claim with no image gets no image stance; gradients are finite, also
  with all-zero padding patches (a norm's gradient at 0 would be 0/0)."""
  model = build(12, image_read=read, match_pool=pool, pair_dim=8, match_heads=3,
                patches=SMALL_PATCHES)
  assert model.image_attention is None
  claims = make_claims(12)
  batch = make_batch(claims, seed=1)
  tight = run(model, batch)
  assert tight.shape == (len(CLAIMS), 3) and np.isfinite(tight).all()
  padded = make_batch(claims, items=(5, 6), tokens=14, seed=2)
  np.testing.assert_allclose(run(model, padded), tight, atol=2e-5, rtol=1e-5)
  # Claim 1 has no image: only its text counts (classifier_single of the text stance), so
  # garbage in its image slots or another claim's image changes nothing.
  other = {**batch, "image": batch["image"].at[1].set(batch["image"][0])}
  np.testing.assert_allclose(run(model, other)[1], tight[1], atol=1e-6)
  text_only = build(12, use_image=False)
  nnx.update(text_only, {k: v for k, v in nnx.state(model, nnx.Param).items()
                         if k in ("text_log_scale", "text_attention", "fuse")})
  nnx.update(text_only.classifier, nnx.state(model.classifier_single, nnx.Param))
  np.testing.assert_allclose(run(text_only, {k: v for k, v in batch.items()
                                              if not k.startswith("image")})[1],
                             tight[1], atol=1e-5)
  # Masked patches are ignored: garbage there changes nothing, unmasking it does.
  patch_mask = jnp.broadcast_to(batch["image_mask"][..., None], batch["image"].shape[:3])
  masked = {**batch, "image_mask": patch_mask & (jnp.arange(SMALL_PATCHES) < 5)}
  garbage = {**masked, "image": masked["image"].at[:, :, 5:].set(100.0)}
  np.testing.assert_allclose(run(model, garbage), run(model, masked), atol=2e-5, rtol=1e-5)
  assert np.abs(run(model, masked) - tight).max() > 1e-4
  # The image read matters: other patches, other logits for the claims with images.
  moved = run(model, {**batch, "image": batch["image"][:, :, ::-1] * 2.0 + 1.0})
  assert np.abs(moved - tight)[[0, 2, 3]].max() > 1e-4
  zero_pad = {**padded, "image": jnp.where(padded["image_mask"][..., None, None],
                                           padded["image"], 0.0)}

  def loss(m):
    return weighted_cross_entropy(m(**zero_pad), jnp.array([0, 1, 2, 1]),
                                  jnp.asarray(class_weights([5, 3, 2])))

  grads = nnx.jit(nnx.grad(loss))(model)
  leaves = jax.tree.leaves(grads)
  assert leaves and all(np.isfinite(np.asarray(g)).all() for g in leaves)
  read_grads = jax.tree.leaves(nnx.state(grads, nnx.Param)["image_read"])
  assert read_grads and all(np.abs(np.asarray(g)).max() > 0 for g in read_grads)


def test_task_builds_the_configured_image_read_with_the_store_patch_count():
  from mocheg_jax.verification import image_reads
  from mocheg_jax.verification import task as verify_task
  v = verify_task.verify_config()
  assert v.image_read == "attention"  # The reference stays the default.
  manifest = features.StoreManifest(fingerprint={}, dtype="float32", max_text_len=8,
                                    text_dim=SMALL["text_dim"], image_dim=SMALL["image_dim"],
                                    patches=SMALL_PATCHES)
  v.image_read, v.match_pool = "match", "flat"
  model = verify_task.build_model(v, manifest, 0)
  assert isinstance(model.image_read, image_reads.MatchRead)
  assert model.image_read.patch.kernel.shape[:2] == (SMALL_PATCHES, SMALL["image_dim"])


def test_dropout_is_active_only_when_not_deterministic():
  model = StanceDetector(StanceConfig(**SMALL, dropout=0.5, attention_dropout=0.2),
                         rngs=nnx.Rngs(params=0, dropout=1))
  _randomize(model, 9)
  batch = make_batch(make_claims(9))
  train = nnx.jit(lambda m, b: m(**b, deterministic=False))
  a, b = np.asarray(train(model, batch)), np.asarray(train(model, batch))  # rng state advances
  assert np.abs(a - b).max() > 1e-4
  np.testing.assert_array_equal(run(model, batch), run(model, batch))


def test_jit_traces_once_for_two_batches_of_one_shape():
  model = build(10)
  graphdef, state = nnx.split(model)

  @jax.jit
  @chex.assert_max_traces(n=1)
  def forward(state, batch):
    return nnx.merge(graphdef, state)(**batch)

  chex.clear_trace_counter()
  first = forward(state, make_batch(make_claims(10), seed=1))
  second = forward(state, make_batch(make_claims(11), seed=2))
  assert first.shape == second.shape == (4, 3)
  assert np.abs(np.asarray(first) - np.asarray(second)).max() > 1e-4
  np.testing.assert_allclose(np.asarray(second), run(model, make_batch(make_claims(11), seed=2)),
                             atol=1e-5)


def test_bad_shapes_are_clear_errors():
  model = build(11)
  batch = make_batch(make_claims(0))
  with pytest.raises(ValueError, match="image has feature size 32, the config says 48"):
    model(**{**batch, "image": batch["image"][..., :32]})
  with pytest.raises(ValueError, match="leading dims must be"):
    model(**{**batch, "text_mask": batch["text_mask"][:, :, :-1]})
  with pytest.raises(ValueError, match="needs text"):
    model(batch["claim"], batch["claim_mask"], image=batch["image"],
          image_mask=batch["image_mask"])
  with pytest.raises(ValueError, match="use_text or use_image"):
    StanceConfig(use_text=False, use_image=False)
  with pytest.raises(ValueError, match="missing_modality"):
    StanceConfig(missing_modality="drop")
  with pytest.raises(ValueError, match="text_attention"):
    StanceConfig(text_attention="dot")
  with pytest.raises(ValueError, match="image_read"):
    StanceConfig(image_read="bilinear")
  with pytest.raises(ValueError, match="match_pool"):
    StanceConfig(image_read="match", match_pool="mean")
  with pytest.raises(ValueError, match="needs StanceConfig.patches"):
    StanceConfig(image_read="match", match_pool="flat")


# ---- loss -----------------------------------------------------------------------------------


def test_weighted_cross_entropy_matches_torch():
  rng = np.random.default_rng(0)
  logits = rng.normal(0, 3, (16, 3)).astype(np.float32)
  labels = rng.integers(0, 3, 16)
  weights = class_weights([4542, 3826, 3301])
  expected = F.cross_entropy(torch.from_numpy(logits), torch.from_numpy(labels),
                             weight=torch.from_numpy(weights)).item()
  ours = float(weighted_cross_entropy(jnp.asarray(logits), jnp.asarray(labels),
                                      jnp.asarray(weights)))
  assert abs(ours - expected) < 1e-6
  unweighted = F.cross_entropy(torch.from_numpy(logits), torch.from_numpy(labels)).item()
  assert abs(ours - unweighted) > 1e-4  # the weights matter on this batch
  # A mask drops rows exactly as leaving them out.
  keep = np.arange(16) % 3 != 0
  expected = F.cross_entropy(torch.from_numpy(logits[keep]), torch.from_numpy(labels[keep]),
                             weight=torch.from_numpy(weights)).item()
  ours = float(weighted_cross_entropy(jnp.asarray(logits), jnp.asarray(labels),
                                      jnp.asarray(weights), mask=jnp.asarray(keep)))
  assert abs(ours - expected) < 1e-6
  assert float(weighted_cross_entropy(jnp.asarray(logits), jnp.asarray(labels),
                                      jnp.asarray(weights), mask=jnp.zeros(16, bool))) == 0.0


def test_class_weights_formula():
  counts = np.array([4542, 3826, 3301], np.float64)
  for p in (2.0, 1.0, 3.0):
    w = class_weights(counts, p)
    expected = 3 * counts ** -p / (counts ** -p).sum()
    np.testing.assert_allclose(w, expected, rtol=1e-6)
    assert w.dtype == np.float32 and abs(w.sum() - 3) < 1e-5
  w = class_weights(counts)  # p = 2 by default: the rarest class weighs most
  assert w[2] > w[1] > w[0]
  np.testing.assert_allclose(w, 3 * counts ** -2.0 / (counts ** -2.0).sum(), rtol=1e-6)
  with pytest.raises(ValueError, match="class 1 has 0"):
    class_weights([3, 0, 2])


# ---- baselines ------------------------------------------------------------------------------


def test_majority():
  assert baselines.majority([0, 1, 1, 2, 1, 0]) == 1
  assert baselines.majority(np.array([2, 2, 0, 0, 1])) == 0  # tie: smallest id
  with pytest.raises(ValueError):
    baselines.majority([])


def test_average_similarity_scores():
  rng = np.random.default_rng(0)
  claim = rng.normal(size=(3, 8))
  evidence = rng.normal(size=(3, 4, 8))
  mask = np.array([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], bool)
  scores = baselines.average_similarity_scores(claim, evidence, mask)

  def cos(a, b):
    return a @ b / np.linalg.norm(a) / np.linalg.norm(b)

  assert scores[0] == pytest.approx((cos(claim[0], evidence[0, 0])
                                     + cos(claim[0], evidence[0, 1])) / 2)
  assert scores[1] == pytest.approx(np.mean([cos(claim[1], e) for e in evidence[1]]))
  assert scores[2] == 0.0
  assert baselines.average_similarity_scores(claim, evidence, mask, empty_score=-2.0)[2] == -2


def test_thresholds_recover_a_known_rule():
  rng = np.random.default_rng(0)
  scores = rng.uniform(-1, 1, 300)
  labels = baselines.predict_thresholds(scores, -0.2, 0.35)
  assert set(labels.tolist()) == {0, 1, 2}
  for metric in baselines.METRICS:
    lo, hi = baselines.fit_thresholds(scores, labels, metric=metric)
    assert scores[scores < -0.2].max() < lo <= scores[scores >= -0.2].min()
    assert scores[scores < 0.35].max() < hi <= scores[scores >= 0.35].min()
    np.testing.assert_array_equal(baselines.predict_thresholds(scores, lo, hi), labels)
  # Another band order, and an empty middle band.
  order = (1, 2, 0)
  labels = baselines.predict_thresholds(scores, 0.1, 0.1, order)
  lo, hi = baselines.fit_thresholds(scores, labels, order=order)
  np.testing.assert_array_equal(baselines.predict_thresholds(scores, lo, hi, order), labels)


def test_threshold_search_is_the_brute_force_optimum():
  rng = np.random.default_rng(1)
  scores = np.round(rng.normal(size=60), 1)  # ties included
  labels = rng.integers(0, 3, 60)
  cands = np.concatenate([[scores.min() - 1], np.unique(scores), [scores.max() + 1]])
  best = max(np.mean(baselines.predict_thresholds(scores, a, b) == labels)
             for a in cands for b in cands if a <= b)
  lo, hi = baselines.fit_thresholds(scores, labels)
  assert np.mean(baselines.predict_thresholds(scores, lo, hi) == labels) == pytest.approx(best)
  # Thinned candidates still give valid thresholds.
  lo, hi = baselines.fit_thresholds(scores, labels, max_candidates=5)
  assert lo <= hi
  with pytest.raises(ValueError, match="order"):
    baselines.fit_thresholds(scores, labels, order=(0, 0, 1))


def test_sharded_parameters_and_batch_give_the_same_logits():
  from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

  from mocheg_jax.parallel import rules as rules_lib
  from mocheg_jax.train.state import ModelSpec

  assert jax.device_count() == 8
  mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"), axis_types=(AxisType.Auto,) * 3)
  model = build(12, heads=2)
  batch = make_batch(make_claims(12))
  expected = run(model, batch)
  spec = ModelSpec.of(lambda: StanceDetector(model.config, rngs=nnx.Rngs(0)))
  shardings = spec.param_shardings(mesh, rules_lib.DEFAULT_RULES)
  # Tensor parallelism really splits the fusion layer and the attention heads.
  assert shardings["fuse"]["kernel"].spec == P("fsdp", "tensor")
  assert shardings["image_attention"]["key"]["kernel"].spec == P("fsdp", "tensor", None)
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  params = jax.device_put(nnx.to_pure_dict(params), shardings)
  batch = {k: jax.device_put(v, NamedSharding(mesh, P(("data", "fsdp"))))
           for k, v in batch.items()}

  @jax.jit
  def forward(params, batch):
    state = nnx.state(model, nnx.Param)
    nnx.replace_by_pure_dict(state, params)
    return nnx.merge(graphdef, state, rest)(**batch)

  with jax.set_mesh(mesh), nnx.logical_axis_rules(rules_lib.DEFAULT_RULES):
    sharded = forward(params, batch)
  np.testing.assert_allclose(np.asarray(sharded), expected, atol=1e-5, rtol=1e-5)


def _small_clip(layers: int = 3) -> clip.CLIPModel:
  config = clip.CLIPConfig(
      text=clip.CLIPTextConfig(vocab_size=50, hidden_size=32, intermediate_size=40,
                               num_attention_heads=4, num_hidden_layers=1,
                               max_position_embeddings=16, eos_token_id=3),
      vision=clip.CLIPVisionConfig(hidden_size=48, intermediate_size=64,
                                   num_attention_heads=4, num_hidden_layers=layers,
                                   image_size=24, patch_size=8),
      projection_dim=16)
  return clip.CLIPModel(config, rngs=nnx.Rngs(3))


@pytest.mark.parametrize("tuned", [1, 3])
def test_tuned_vision_blocks_start_as_the_frozen_tower(tuned):
  """Cached tokens after L - k blocks + the k tuned blocks (initialised from the CLIP) give
  the frozen path's patch states, so tuning starts exactly where the frozen model is."""
  frozen = _small_clip()
  pixels = jax.random.normal(jax.random.key(0), (2, 24, 24, 3))
  graphdef, state = nnx.split(frozen)
  _, cached_image = features._state_forwards(graphdef, "float32", 3 - tuned)
  tokens = cached_image(state, pixels)
  assert tokens.shape == (2, 1 + 9, 48)  # The class token travels with the patches.
  config = StanceConfig(text_dim=32, image_dim=48, hidden=24)
  model = vision_top.TunedVisionStance(config, frozen.config.vision, tuned, rngs=nnx.Rngs(1))
  params = nnx.state(model, nnx.Param)
  nnx.replace_by_pure_dict(params, _merged(nnx.to_pure_dict(params),
                                           vision_top.initial_params(frozen, tuned)))
  nnx.update(model, params)

  @nnx.jit  # One compiled program: op-by-op eager CLIP on 8 fake devices takes minutes.
  def forward(model, frozen, tokens, pixels):
    patches = frozen.image_features(pixels).patches
    claim = jax.random.normal(jax.random.key(2), (1, 5, 32))
    common = dict(text=jnp.ones((1, 1, 4, 32)), text_mask=jnp.ones((1, 1, 4)),
                  image_mask=jnp.ones((1, 2)))
    # The stance detector reads the tuned tokens: logits for [B=1, Ni=2] items.
    return (model.vision_top(tokens), patches,
            model(claim, jnp.ones((1, 5)), image=tokens[None], **common),
            model.stance(claim, jnp.ones((1, 5)), image=patches[None], **common))

  tuned_patches, patches, logits, reference = forward(model, frozen, tokens, pixels)
  chex.assert_trees_all_close(tuned_patches, patches, atol=1e-5, rtol=1e-5)
  chex.assert_trees_all_close(logits, reference, atol=1e-5)


def _merged(base: dict, update: dict) -> dict:
  out = dict(base)
  for key, value in update.items():
    out[key] = _merged(base[key], value) if isinstance(value, dict) else value
  return out


def test_tuned_vision_blocks_reject_bad_settings():
  frozen = _small_clip(layers=2)
  config = StanceConfig(text_dim=32, image_dim=48, hidden=24)
  with pytest.raises(ValueError, match=r"tune_vision_layers must be in \[1, 2\]"):
    vision_top.TunedVisionStance(config, frozen.config.vision, 3, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="needs use_image"):
    vision_top.TunedVisionStance(StanceConfig(text_dim=32, image_dim=48, use_image=False),
                                 frozen.config.vision, 1, rngs=nnx.Rngs(0))
