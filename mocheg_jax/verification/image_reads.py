"""Image reads of the stance model beyond the paper (`StanceConfig.image_read`).

The reference reads an image with learned cross-attention (claim-token queries over the
patch states), then the fusion [m - c ; m * c] it shares with the text branch. On the small
synthetic world that branch does not generalise on the claims whose fact only pictures show:
it fits the training ones (80-100 %) and scores ~50 % on held-out ones (binary chance). The
reads here replace attention + fusion for images; each returns one vector per image item,
[B, N, hidden], already pooled over the claim's tokens (the stance model then averages the
items). Measured on the small world they do not do clearly better (so the reference
stays the default); see `MatchRead` for the numbers and what was learned.

Inputs of both: claim [B, Lc, Dt] token states, claim_mask [B, Lc] bool, patches
[B, N, P, E] patch states, keys [B, N, P] bool (patches to read; never all False for an
item: the stance model lets absent items read all their padding and drops them after).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from mocheg_jax.models import layers

Dtype = Any

MATCH_POOLS = ("patches", "image", "flat")
INITIAL_SCALE = 10.0  # Cosine temperature at init, as the cosine text alignment.


def _masked_mean(x: jax.Array, keep: jax.Array, axis: int) -> jax.Array:
  """Mean of x over `axis` where keep (broadcast) is True; 0 where nothing is kept."""
  total = jnp.where(keep, x, 0).sum(axis)
  count = jnp.maximum(keep.sum(axis), 1).astype(x.dtype)
  return total / count


def _unit(x: jax.Array) -> jax.Array:
  """x / |x| with a finite gradient at 0 (padding patches project to 0 at init, and the
  gradient of max(|x|, eps) there is 0/0)."""
  return x * jax.lax.rsqrt(jnp.sum(x * x, -1, keepdims=True) + 1e-12)


class PairRead(nnx.Module):
  """Every claim token x patch pair compared before any pooling ("pairs").

  u[t, p] = a(claim token t) * b(patch p) per channel (pair_dim channels); max and mean
  over the patches -> Dense -> hidden, plus a Dense of the claim token itself (to tell
  value words from the rest), leaky ReLU, max over the real claim tokens (as the
  reference's gen_max). Why: a fact only pictures show sits in a few patches (a ferry's
  hull), and the learned attention starts uniform, so its read is close to the mean patch;
  here each channel can fire on one patch and the max keeps it. Costs B N Lc P pair_dim
  multiplies per step (on the small world a step takes about as long as the reference's).
  Measured (image-only, small world, 2 seeds): held-out image-fact accuracy 55 / 48 %
  against the reference's 47 / 58 / 51 / 53 / 50 % (5 seeds); train image facts 88-100 %.
  """

  def __init__(self, text_dim: int, image_dim: int, hidden: int, pair_dim: int, *,
               slope: float, dtype: Dtype = None, param_dtype=jnp.float32, rngs: nnx.Rngs):
    kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.slope = slope
    self.claim = layers.Dense(text_dim, pair_dim, ("embed", "mlp"), **kw)
    self.patch = layers.Dense(image_dim, pair_dim, ("embed", "mlp"), **kw)
    self.fuse = layers.Dense(2 * pair_dim, hidden, ("embed", "mlp"), **kw)
    self.token = layers.Dense(text_dim, hidden, ("embed", "mlp"), **kw)

  def __call__(self, claim: jax.Array, claim_mask: jax.Array, patches: jax.Array,
               keys: jax.Array) -> jax.Array:
    a = self.claim(claim)  # [B, Lc, r]
    b = self.patch(patches).astype(a.dtype)  # [B, N, P, r]
    u = a[:, None, :, None, :] * b[:, :, None, :, :]  # [B, N, Lc, P, r]
    k = keys[:, :, None, :, None]
    top = jnp.where(k, u, jnp.finfo(u.dtype).min).max(axis=3)
    h = self.fuse(jnp.concatenate([top, _masked_mean(u, k, 3)], axis=-1))
    h = jax.nn.leaky_relu(h + self.token(claim)[:, None], self.slope)  # [B, N, Lc, hidden]
    h = jnp.where(claim_mask[:, None, :, None], h, jnp.finfo(h.dtype).min)
    return h.max(axis=2)  # [B, N, hidden]


class MatchRead(nnx.Module):
  """Only match scores of claim tokens against the image reach the classifier ("match").

  Per head: a softmax over the real claim tokens (a gate on each token's own state) picks
  which tokens to check, and the head's score is the gated sum of the tokens' match with
  the image; the heads' scores -> Dense -> hidden -> leaky ReLU. `pool` says what a token
  is matched with:
  * "patches": every patch, cosine in a learned space (temperature learned); the best and
    the mean over patches (two scores per head);
  * "image": the elementwise max and mean of the patch states (one vector), dot product;
  * "flat": the patch states concatenated in place (position-aware: a count is a layout of
    objects), dot product; needs the patch count.
  Why: the reference lets each claim token's own state reach the classifier, and a few
  hundred image-fact claims are then learned by heart through the entity names. Measured
  on the small world (held-out val + test, 88 image-fact claims, chance ~50 %): image-only,
  "patches" 51 / 55 / 51 / 55 / 49 % over 5 seeds against the reference's 47 / 58 / 51 /
  53 / 50 %; text + image 49 / 57 / 56 % against 49 / 59 / 52 % (3 seeds; test macro F1
  68.3 against 66.8 on average, within the seed spread). "image" and "flat" (2 seeds, also
  narrower or weight-decayed variants) do no better. Every one still fits the training
  image facts (75-100 %). On the 22 colour claims "patches" gets 70 % against 63 % (5-seed
  means). A logistic regression trained on the same training claims but GIVEN the claim's
  value word as a one-hot reaches 91 % (colour, max-pooled patches) and 73 % (counts,
  flattened patches) on these claims (its regulariser picked on them: an upper bound): the
  patch states hold the facts; the contextual claim states let the model memorise the
  claims instead of learning to read the value word.
  """

  def __init__(self, text_dim: int, image_dim: int, hidden: int, dim: int, heads: int,
               pool: str, patches: int = 0, *, slope: float, dtype: Dtype = None,
               param_dtype=jnp.float32, rngs: nnx.Rngs):
    if pool not in MATCH_POOLS:
      raise ValueError(f"unknown match pool {pool!r}; expected one of {MATCH_POOLS}")
    if pool == "flat" and patches <= 0:
      raise ValueError("match pool 'flat' needs the number of patches")
    kw = dict(dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.pool, self.patches, self.slope = pool, patches, slope
    self.claim = layers.Dense(text_dim, (heads, dim), ("embed", "heads", "kv"), **kw)
    patch_in = {"patches": (image_dim,), "image": (2 * image_dim,),
                "flat": (patches, image_dim)}[pool]
    self.patch = layers.Dense(patch_in, (heads, dim),
                              (None,) * (len(patch_in) - 1) + ("embed", "heads", "kv"), **kw)
    self.gate = layers.Dense(text_dim, heads, ("embed", "heads"), **kw)
    # The cosine temperature, learned in log space (stays positive).
    self.log_scale = (nnx.Param(jnp.full((), np.log(INITIAL_SCALE), param_dtype))
                      if pool == "patches" else None)
    scores = 2 if pool == "patches" else 1  # Per head: best and mean, or one.
    self.fuse = layers.Dense((heads, scores), hidden, (None, None, "mlp"), **kw)

  def _scores(self, claim: jax.Array, patches: jax.Array, keys: jax.Array) -> jax.Array:
    """Per claim token and head, its match with each item: [B, N, Lc, H, scores]."""
    f32 = jnp.float32
    if self.pool == "patches":
      a = _unit(self.claim(claim).astype(f32))  # [B, Lc, H, r]
      b = _unit(self.patch(patches).astype(f32))  # [B, N, P, H, r]
      scale = jnp.exp(self.log_scale[...].astype(f32))
      sim = scale * jnp.einsum("bthr,bnphr->bnthp", a, b)  # [B, N, Lc, H, P]
      k = keys[:, :, None, None, :]
      top = jnp.where(k, sim, jnp.finfo(f32).min).max(-1)  # Every item reads a patch.
      return jnp.stack([top, _masked_mean(sim, k, 4)], axis=-1)
    k = keys[..., None]
    if self.pool == "image":
      image = jnp.concatenate([jnp.where(k, patches, jnp.finfo(patches.dtype).min).max(2),
                               _masked_mean(patches, k, 2)], axis=-1)  # [B, N, 2E]
    else:
      if patches.shape[2] != self.patches:
        raise ValueError(f"match pool 'flat' was built for {self.patches} patches, got "
                         f"{patches.shape[2]}")
      image = jnp.where(k, patches, 0)  # [B, N, P, E]
    a = self.claim(claim).astype(f32)  # [B, Lc, H, r]
    b = self.patch(image).astype(f32)  # [B, N, H, r]
    return (jnp.einsum("bthr,bnhr->bnth", a, b) / np.sqrt(a.shape[-1]))[..., None]

  def __call__(self, claim: jax.Array, claim_mask: jax.Array, patches: jax.Array,
               keys: jax.Array) -> jax.Array:
    scores = self._scores(claim, patches, keys)  # [B, N, Lc, H, S]
    gate = self.gate(claim).astype(jnp.float32)  # [B, Lc, H]
    gate = jax.nn.softmax(jnp.where(claim_mask[..., None], gate, -1e9), axis=1)
    f = (gate[:, None, :, :, None] * scores).sum(2)  # [B, N, H, S]
    h = self.fuse(f.astype(self.fuse.dtype or jnp.float32))
    return jax.nn.leaky_relu(h, self.slope)  # [B, N, hidden]
